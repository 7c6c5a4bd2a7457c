"""Function forms of the engine classes, for tests that call one run or one evidence at a time.

Each helper builds the engine from the problem and the options (validated: the checks a direct
caller gets) and calls its one method; the arguments are those of the class followed by those
of the method, in that order. ``**options`` are the fields of the engine's options class and
the engine's own keywords (``validate``, ``output``, ``seed``), split by :func:`engine_options`.
"""
import numpy as np

from fastep._epcore.gp_ep import DenseEP, DenseEPOptions
from fastep._epcore.horseshoe_ep import HorseshoeDamping, HorseshoeEP, HorseshoeOptions, HorseshoePrior
from fastep._epcore.linear_ep import LinearEP, LinearEPOptions
from fastep._epcore.rank_k_ep import RankKEP, RankKEPOptions
from fastep._epcore.sparse_ep import SparseEP, SparseEPOptions
from fastep._epcore.student_t_ep import DenseStudentTEP, SparseStudentTEP, StudentTEPOptions
from fastep._student_t.double_loop import DenseDoubleLoopEP, SparseDoubleLoopEP


def engine_options(options_class, keywords):
    """``(options, engine_keywords)``: the options class built from the keywords it has, and the
    rest (the engine's own keywords)."""
    fields = {name: keywords[name] for name in options_class._FIELDS if name in keywords}
    rest = {name: value for name, value in keywords.items() if name not in fields}
    return options_class(**fields), rest


def dense_ep(K, y, spec, **options):
    """``DenseEP(K, y, spec, DenseEPOptions(...), ...)`` from loose keywords."""
    options, rest = engine_options(DenseEPOptions, options)
    return DenseEP(K, y, spec, options, **rest)


def sparse_ep(Vt, d, y, spec, **options):
    """``SparseEP(Vt, d, y, spec, SparseEPOptions(...), ...)`` from loose keywords."""
    options, rest = engine_options(SparseEPOptions, options)
    return SparseEP(Vt, d, y, spec, options, **rest)


def linear_ep(X, y, prior_mean, prior_cov, spec, **options):
    """``LinearEP(X, y, prior_mean, prior_cov, spec, LinearEPOptions(...), ...)`` from loose keywords."""
    options, rest = engine_options(LinearEPOptions, options)
    return LinearEP(X, y, prior_mean, prior_cov, spec, options, **rest)


def run_gp_ep(K, y, spec, site_precision, site_natural_mean, post_cov, post_mean, *, post_var=None,
              cavity_mean=None, cavity_var=None, sweep_callback=None, **options):
    """``DenseEP(K, y, spec, DenseEPOptions(...), ...).run(...)``."""
    return dense_ep(K, y, spec, **options).run(site_precision, site_natural_mean, post_cov, post_mean,
                                               post_var=post_var, cavity_mean=cavity_mean, cavity_var=cavity_var,
                                              sweep_callback=sweep_callback)


def run_sparse_ep(Vt, d, y, spec, site_precision, site_natural_mean, post_factor, post_w_mean, *,
                  g_mean=None, g_var=None, sweep_callback=None, **options):
    """``SparseEP(Vt, d, y, spec, SparseEPOptions(...), ...).run(...)``."""
    return sparse_ep(Vt, d, y, spec, **options).run(site_precision, site_natural_mean, post_factor, post_w_mean,
                                                    g_mean=g_mean, g_var=g_var, sweep_callback=sweep_callback)


def run_linear_ep(X, y, prior_mean, prior_cov, spec, site_precision, site_natural_mean, post_mean, post_cov, *,
                  sweep_callback=None, **options):
    """``LinearEP(X, y, prior_mean, prior_cov, spec, LinearEPOptions(...), ...).run(...)``."""
    return linear_ep(X, y, prior_mean, prior_cov, spec, **options).run(
        site_precision, site_natural_mean, post_mean, post_cov, sweep_callback=sweep_callback)


def linear_log_evidence(X, y, prior_mean, prior_cov, spec, site_precision, site_natural_mean, post_mean, post_cov):
    """``LinearEP(X, y, prior_mean, prior_cov, spec).log_evidence(...)``."""
    return LinearEP(X, y, prior_mean, prior_cov, spec).log_evidence(site_precision, site_natural_mean, post_mean,
                                                                    post_cov)


def run_rank_k_ep(X, y, prior_mean, prior_cov, likelihood, site_precision, site_natural_mean, post_mean, post_cov,
                  *, sweep_callback=None, **options):
    """``RankKEP(X, ..., RankKEPOptions(...), state=(...)).run(...)`` on the caller's arrays, updated
    in place."""
    options, rest = engine_options(RankKEPOptions, options)
    state = RankKEP(X, y, prior_mean, prior_cov, likelihood, options,
                    state=(site_precision, site_natural_mean, post_mean, post_cov), **rest)
    return state.run(sweep_callback=sweep_callback)


def rank_k_log_evidence(X, y, prior_mean, prior_cov, likelihood, site_precision, site_natural_mean):
    """``RankKEP(...).log_evidence()`` of copies of the given sites (left unchanged)."""
    return RankKEP(X, y, prior_mean, prior_cov, likelihood,
                   state=(np.array(site_precision, dtype=np.float64),
                          np.array(site_natural_mean, dtype=np.float64))).log_evidence()


def run_student_t_dense(K, y, dof, scale, power, site_precision, site_natural_mean, post_mean, post_var,
                        cavity_mean, cavity_var, *, post_cov=None, sweep_callback=None, **options):
    """``DenseStudentTEP(K, y, dof, scale, StudentTEPOptions(power=power, ...), ...).run(...)``."""
    options, rest = engine_options(StudentTEPOptions, dict(options, power=power))
    return DenseStudentTEP(K, y, dof, scale, options, **rest).run(
        site_precision, site_natural_mean, post_mean, post_var, cavity_mean=cavity_mean, cavity_var=cavity_var,
        post_cov=post_cov, sweep_callback=sweep_callback)


def run_student_t_sparse(Vt, d, y, spec, site_precision, site_natural_mean, post_factor, post_w_mean, g_mean,
                         g_var, *, sweep_callback=None, **options):
    """``SparseStudentTEP(Vt, d, y, spec, StudentTEPOptions(...), ...).run(...)``."""
    options, rest = engine_options(StudentTEPOptions, options)
    return SparseStudentTEP(Vt, d, y, spec, options, **rest).run(
        site_precision, site_natural_mean, post_factor, post_w_mean, g_mean=g_mean, g_var=g_var,
        sweep_callback=sweep_callback)


def run_double_loop_ep(K, y, dof, scale, power, site_precision, site_natural_mean, post_mean, post_var,
                       cavity_mean, cavity_var, *, post_cov=None, sweep_callback=None, **options):
    """``DenseDoubleLoopEP(K, y, dof, scale, power=power, **options).run(...)``."""
    return DenseDoubleLoopEP(K, y, dof, scale, power=power, **options).run(
        site_precision, site_natural_mean, post_mean, post_var, cavity_mean=cavity_mean, cavity_var=cavity_var,
        post_cov=post_cov, sweep_callback=sweep_callback)


def run_sparse_double_loop_ep(Vt, d, y, dof, scale, power, site_precision, site_natural_mean, post_factor,
                              post_w_mean, g_mean, g_var, *, sweep_callback=None, **options):
    """``SparseDoubleLoopEP(Vt, d, y, dof, scale, power=power, **options).run(...)``."""
    return SparseDoubleLoopEP(Vt, d, y, dof, scale, power=power, **options).run(
        site_precision, site_natural_mean, post_factor, post_w_mean, g_mean=g_mean, g_var=g_var,
        sweep_callback=sweep_callback)


def dense_incremental_sweep(K, y, spec, site_precision, site_natural_mean, post_cov, post_mean, **options):
    """``DenseEP(K, y, spec, DenseEPOptions(...), ...).incremental_sweep(...)``."""
    return dense_ep(K, y, spec, **options).incremental_sweep(site_precision, site_natural_mean, post_cov, post_mean)


def sparse_incremental_sweep(Vt, d, y, spec, site_precision, site_natural_mean, post_factor, post_w_mean,
                             **options):
    """``SparseEP(Vt, d, y, spec, SparseEPOptions(...), ...).incremental_sweep(...)``."""
    return sparse_ep(Vt, d, y, spec, **options).incremental_sweep(site_precision, site_natural_mean, post_factor,
                                                                 post_w_mean)


def horseshoe_options(**options):
    """``HorseshoeOptions`` from loose keywords, those of ``HorseshoeDamping`` among them."""
    schedule, rest = engine_options(HorseshoeDamping, options)
    return HorseshoeOptions(damping_schedule=schedule, **rest)


def run_horseshoe_ep(X, y, sigma2, rho2, gamma2, P, D, *, sites=None, **options):
    """One horseshoe EP run from ``sites`` (default the cold start) with the options (those of
    :func:`horseshoe_options`): ``(result, sites)``, the :class:`HorseshoeResult` and its returned
    sites as a dict."""
    engine = HorseshoeEP(X, y, sigma2, HorseshoePrior(rho2, gamma2, P, D), horseshoe_options(**options), sites)
    result = engine.run()
    return result, result.sites


def horseshoe_state(X, y, sigma2, rho2, gamma2, P, D, **sites):
    """The marginals, cavities, evidence pieces, gradients and prediction factors at the given sites
    (a run with ``max_sweeps=0``); unspecified site arrays are those of the cold start. Raises
    ``ValueError`` if the sites give an improper posterior or cavity."""
    d = np.shape(X)[1]
    start = {"pi_w": np.full(d, gamma2 / rho2), "h_w": np.zeros(d), "pi_u": np.zeros(d), "pi_v": np.zeros(d)}
    start.update(sites)
    return run_horseshoe_ep(X, y, sigma2, rho2, gamma2, P, D, sites=start, max_sweeps=0)[0]
