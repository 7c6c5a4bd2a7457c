"""Weight-space rank-1 EP engine (fastep._epcore.linear_ep) against closed forms and its reference twin."""
import numpy as np
import pytest
from scipy import stats

from engine_helpers import linear_log_evidence, run_linear_ep
from fastep._epcore import linear_ep as engine
from fastep._epcore.sites import SiteSpec
from fastep.reference import linear_ep as ref

LIK_GAUSSIAN = 4
FORMS = {"moment": engine.UPDATE_MOMENT, "natural": engine.UPDATE_NATURAL}
POLICIES = {"clip": engine.NEGATIVE_CLIP, "skip": engine.NEGATIVE_SKIP, "allow": engine.NEGATIVE_ALLOW}
ALGORITHMS = {"rank1": engine.ALGORITHM_RANK1, "blocked": engine.ALGORITHM_BLOCKED}


def gaussian_moments(noise_var):
    """Reference site moments of a Gaussian likelihood N(y; f, noise_var)."""
    def moments(y, cavity_mean, cavity_var):
        s = cavity_var + noise_var
        resid = y - cavity_mean
        return -0.5 * np.log(2 * np.pi * s) - 0.5 * resid ** 2 / s, resid / s, 1.0 / s
    return moments


def make_problem(n, d, seed, noise_var=0.5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    y = X @ rng.standard_normal(d) + np.sqrt(noise_var) * rng.standard_normal(n)
    prior_mean = 0.3 * rng.standard_normal(d)
    A = rng.standard_normal((d, d))
    prior_cov = A @ A.T / d + 0.5 * np.eye(d)
    return X, y, prior_mean, prior_cov


def run(X, y, prior_mean, prior_cov, spec, tau0=None, nu0=None, **options):
    n, d = X.shape
    tau = np.zeros(n) if tau0 is None else np.array(tau0, dtype=float)
    nu = np.zeros(n) if nu0 is None else np.array(nu0, dtype=float)
    post_mean, post_cov = np.empty(d), np.empty((d, d))
    info = run_linear_ep(X, y, prior_mean, prior_cov, spec, tau, nu, post_mean, post_cov,
                         **options)
    return tau, nu, post_mean, post_cov, info


def rel_err(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b)))


def conjugate_posterior(X, y, prior_mean, prior_cov, noise_var):
    n = X.shape[0]
    prior_precision = np.linalg.inv(prior_cov)
    post_cov = np.linalg.inv(prior_precision + X.T @ X / noise_var)
    post_mean = post_cov @ (prior_precision @ prior_mean + X.T @ y / noise_var)
    evidence = stats.multivariate_normal(X @ prior_mean, X @ prior_cov @ X.T
                                         + noise_var * np.eye(n)).logpdf(y)
    return post_mean, post_cov, evidence


def test_module_constants():
    assert (engine.UPDATE_MOMENT, engine.UPDATE_NATURAL) == (0, 1)
    assert (engine.NEGATIVE_CLIP, engine.NEGATIVE_SKIP, engine.NEGATIVE_ALLOW) == (0, 1, 2)
    assert all(type(v) is int for v in list(FORMS.values()) + list(POLICIES.values()))


# --------------------------------------------------------------------------- #
# Gaussian likelihood: EP is exact
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n, d", [(50, 3), (60, 40), (30, 80)])
def test_gaussian_likelihood_equals_conjugate_regression(n, d, algorithm, form):
    noise_var = 0.4
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=n + d, noise_var=noise_var)
    spec = SiteSpec(LIK_GAUSSIAN, [noise_var])
    tau, nu, post_mean, post_cov, info = run(X, y, prior_mean, prior_cov, spec,
                                             update_form=FORMS[form], algorithm=ALGORITHMS[algorithm])
    exact_mean, exact_cov, exact_evidence = conjugate_posterior(X, y, prior_mean, prior_cov, noise_var)
    assert info.converged and info.n_skipped == 0 and info.n_clipped == 0
    np.testing.assert_allclose(tau, 1 / noise_var, rtol=1e-12)
    np.testing.assert_allclose(nu, y / noise_var, rtol=1e-10, atol=1e-12)
    assert rel_err(post_cov, exact_cov) < 1e-10
    assert rel_err(post_mean, exact_mean) < 1e-10
    np.testing.assert_array_equal(post_cov, post_cov.T)
    evidence = linear_log_evidence(X, y, prior_mean, prior_cov, spec, tau, nu, post_mean, post_cov)
    assert abs(evidence - exact_evidence) < 1e-10 * max(1.0, abs(exact_evidence))


def test_reference_gaussian_equals_conjugate_regression():
    noise_var = 0.7
    X, y, prior_mean, prior_cov = make_problem(25, 6, seed=3, noise_var=noise_var)
    moments = gaussian_moments(noise_var)
    exact_mean, exact_cov, exact_evidence = conjugate_posterior(X, y, prior_mean, prior_cov, noise_var)
    for form in FORMS:
        out = ref.run_linear_ep(X, y, prior_mean, prior_cov, moments, update_form=form)
        assert out["converged"]
        assert rel_err(out["post_cov"], exact_cov) < 1e-10
        assert rel_err(out["post_mean"], exact_mean) < 1e-10
        for value in (ref.log_evidence(X, y, prior_mean, prior_cov, moments, out["site_precision"],
                                       out["site_natural_mean"]),
                      ref.log_evidence_literal(X, y, prior_mean, prior_cov, moments,
                                               out["site_precision"], out["site_natural_mean"]),
                      ref.log_evidence_literal(X, y, prior_mean, prior_cov, moments,
                                               out["site_precision"], out["site_natural_mean"],
                                               site_scale="moments")):
            assert abs(value - exact_evidence) < 1e-10 * abs(exact_evidence)


# --------------------------------------------------------------------------- #
# compiled vs reference
# --------------------------------------------------------------------------- #

def compare_with_reference(X, y, prior_mean, prior_cov, noise_var, tau0, nu0, form, damping,
                           max_sweeps, tol, refresh_every, policy, algorithm, block_size=0,
                           rtol=1e-9):
    spec = SiteSpec(LIK_GAUSSIAN, [noise_var])
    tau, nu, post_mean, post_cov, info = run(
        X, y, prior_mean, prior_cov, spec, tau0, nu0, update_form=FORMS[form], damping=damping,
        tol=tol, max_sweeps=max_sweeps, refresh_every=refresh_every,
        negative_precision=POLICIES[policy], algorithm=ALGORITHMS[algorithm], block_size=block_size)
    out = ref.run_linear_ep(X, y, prior_mean, prior_cov, gaussian_moments(noise_var), tau0, nu0,
                            update_form=form, damping=damping, tol=tol, max_sweeps=max_sweeps,
                            refresh_every=refresh_every, negative_precision=policy)
    assert rel_err(tau, out["site_precision"]) < rtol
    assert rel_err(nu, out["site_natural_mean"]) < rtol
    assert rel_err(post_mean, out["post_mean"]) < rtol
    assert rel_err(post_cov, out["post_cov"]) < rtol
    for key in ("n_sweeps", "converged", "n_skipped", "n_clipped", "n_failed"):
        assert getattr(info, key) == out[key], key
    return tau, nu, post_mean, post_cov, info


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("damping, max_sweeps, refresh_every", [(1.0, 3, 1), (0.3, 4, 2), (0.6, 3, 0)])
def test_compiled_matches_reference(form, algorithm, damping, max_sweeps, refresh_every):
    rng = np.random.default_rng(11)
    n, d = 23, 5
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=5)
    tau0 = rng.uniform(0.0, 2.0, n)          # warm start away from the fixed point
    nu0 = rng.standard_normal(n)
    compare_with_reference(X, y, prior_mean, prior_cov, 0.5, tau0, nu0, form, damping,
                           max_sweeps, 0.0, refresh_every, "clip", algorithm, block_size=4)


@pytest.mark.parametrize("block_size", [1, 3, 7, 64])
def test_blocked_matches_rank1_with_mixed_sign_updates(block_size):
    n, d = 40, 35
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=7)
    rng = np.random.default_rng(2)
    tau0 = rng.uniform(-0.3, 3.0, n)     # some sites lose precision, some gain: both syrk signs
    nu0 = rng.standard_normal(n)
    spec = SiteSpec(LIK_GAUSSIAN, [0.5])
    options = dict(damping=0.5, max_sweeps=3, tol=0.0, refresh_every=0,
                   negative_precision=engine.NEGATIVE_ALLOW)
    a = run(X, y, prior_mean, prior_cov, spec, tau0, nu0, algorithm=engine.ALGORITHM_RANK1, **options)
    b = run(X, y, prior_mean, prior_cov, spec, tau0, nu0, algorithm=engine.ALGORITHM_BLOCKED,
            block_size=block_size, **options)
    for left, right in zip(a[:4], b[:4]):
        assert rel_err(left, right) < 1e-12
    assert {k: v for k, v in a[4].as_dict().items() if k not in ("max_change", "log_z")} == \
        {k: v for k, v in b[4].as_dict().items() if k not in ("max_change", "log_z")}
    assert a[4].max_change == pytest.approx(b[4].max_change, rel=1e-10)


# --------------------------------------------------------------------------- #
# invariant, refresh, fixed point, warm start
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_invariant_holds_after_many_rank1_updates(algorithm):
    n, d, sweeps = 100, 20, 100          # 10^4 non-trivial rank-1 updates (slow damping)
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=13)
    spec = SiteSpec(LIK_GAUSSIAN, [0.3])
    options = dict(damping=0.05, tol=0.0, max_sweeps=sweeps, algorithm=ALGORITHMS[algorithm])
    tau, nu, drift_mean, drift_cov, info = run(X, y, prior_mean, prior_cov, spec,
                                               refresh_every=sweeps + 1, **options)
    assert info.n_sweeps == sweeps and not info.converged
    assert info.max_change > 1e-4    # the last sweep still moved the sites
    fresh_mean, fresh_cov = np.empty(d), np.empty((d, d))
    engine.refresh_posterior(X, prior_mean, prior_cov, tau, nu, fresh_mean, fresh_cov)
    assert rel_err(drift_cov, fresh_cov) < 1e-9
    assert rel_err(drift_mean, fresh_mean) < 1e-9
    # refreshing every sweep changes the results by <~ 1e-10
    tau_r, nu_r, mean_r, cov_r, _ = run(X, y, prior_mean, prior_cov, spec, refresh_every=1, **options)
    for a, b in ((tau_r, tau), (nu_r, nu), (mean_r, fresh_mean), (cov_r, fresh_cov)):
        assert rel_err(a, b) < 1e-10


def test_refresh_posterior_matches_invariant():
    n, d = 30, 8
    X, _, prior_mean, prior_cov = make_problem(n, d, seed=17)
    rng = np.random.default_rng(0)
    tau = rng.uniform(-0.05, 2.0, n)
    nu = rng.standard_normal(n)
    post_mean, post_cov = np.empty(d), np.empty((d, d))
    engine.refresh_posterior(X, prior_mean, prior_cov, tau, nu, post_mean, post_cov)
    exp_mean, exp_cov = ref.posterior_from_sites(X, prior_mean, prior_cov, tau, nu)
    assert rel_err(post_cov, exp_cov) < 1e-12
    assert rel_err(post_mean, exp_mean) < 1e-12
    np.testing.assert_array_equal(post_cov, post_cov.T)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_update_forms_share_fixed_point_and_warm_start_converges_in_one_sweep(algorithm):
    n, d = 40, 6
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=19)
    spec = SiteSpec(LIK_GAUSSIAN, [0.2])
    results = {form: run(X, y, prior_mean, prior_cov, spec, update_form=code, damping=0.7,
                         tol=1e-13, algorithm=ALGORITHMS[algorithm]) for form, code in FORMS.items()}
    for a, b in zip(results["moment"][:4], results["natural"][:4]):
        assert rel_err(a, b) < 1e-11
    tau, nu = results["natural"][:2]
    for code in FORMS.values():
        warm = run(X, y, prior_mean, prior_cov, spec, tau, nu, update_form=code, tol=1e-10,
                   algorithm=ALGORITHMS[algorithm])
        assert warm[4].converged and warm[4].n_sweeps == 1


def test_max_sweeps_zero_only_computes_posterior():
    X, y, prior_mean, prior_cov = make_problem(10, 3, seed=23)
    spec = SiteSpec(LIK_GAUSSIAN, [1.0])
    tau, nu, post_mean, post_cov, info = run(X, y, prior_mean, prior_cov, spec, max_sweeps=0)
    assert info.n_sweeps == 0 and not info.converged and info.max_change == np.inf
    assert rel_err(post_cov, prior_cov) < 1e-13 and rel_err(post_mean, prior_mean) < 1e-13
    assert not tau.any() and not nu.any()


def test_no_sites_gives_prior():
    _, _, prior_mean, prior_cov = make_problem(1, 4, seed=29)
    X = np.empty((0, 4))
    spec = SiteSpec(LIK_GAUSSIAN, [1.0])
    tau, nu, post_mean, post_cov, info = run(X, np.empty(0), prior_mean, prior_cov, spec)
    assert info.converged and info.n_sweeps == 1
    assert rel_err(post_cov, prior_cov) < 1e-13 and rel_err(post_mean, prior_mean) < 1e-13
    evidence = linear_log_evidence(X, np.empty(0), prior_mean, prior_cov, spec, tau, nu, post_mean,
                                   post_cov)
    assert abs(evidence) < 1e-12


def test_nonconvergence_is_reported():
    X, y, prior_mean, prior_cov = make_problem(20, 4, seed=31)
    spec = SiteSpec(LIK_GAUSSIAN, [0.5])
    *_, info = run(X, y, prior_mean, prior_cov, spec, damping=0.1, max_sweeps=3, tol=1e-10)
    assert not info.converged and info.n_sweeps == 3 and info.max_change > 1e-10


# --------------------------------------------------------------------------- #
# evidence
# --------------------------------------------------------------------------- #

def test_evidence_regrouped_equals_literal_eqs_48_49():
    n, d, noise_var = 30, 5, 0.6
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=37, noise_var=noise_var)
    spec = SiteSpec(LIK_GAUSSIAN, [noise_var])
    moments = gaussian_moments(noise_var)
    # a state that is NOT a fixed point, all tau > 0 (eq 15 scaling applies)
    rng = np.random.default_rng(5)
    tau = rng.uniform(0.1, 3.0, n)
    nu = rng.standard_normal(n)
    post_mean, post_cov = np.empty(d), np.empty((d, d))
    engine.refresh_posterior(X, prior_mean, prior_cov, tau, nu, post_mean, post_cov)
    compiled = linear_log_evidence(X, y, prior_mean, prior_cov, spec, tau, nu, post_mean, post_cov)
    literal = ref.log_evidence_literal(X, y, prior_mean, prior_cov, moments, tau, nu)
    regrouped = ref.log_evidence(X, y, prior_mean, prior_cov, moments, tau, nu)
    assert abs(compiled - literal) < 1e-10 * abs(literal)
    assert abs(regrouped - literal) < 1e-10 * abs(literal)
    # at the fixed point eq 33 (s_i from alpha, beta) agrees as well
    tau, nu, post_mean, post_cov, info = run(X, y, prior_mean, prior_cov, spec, tol=1e-12)
    compiled = linear_log_evidence(X, y, prior_mean, prior_cov, spec, tau, nu, post_mean, post_cov)
    literal33 = ref.log_evidence_literal(X, y, prior_mean, prior_cov, moments, tau, nu,
                                         site_scale="moments")
    assert abs(compiled - literal33) < 1e-10 * abs(literal33)


def test_evidence_with_zero_and_negative_site_precisions():
    n, d = 20, 4
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=41)
    spec = SiteSpec(LIK_GAUSSIAN, [0.5])
    rng = np.random.default_rng(8)
    tau = rng.uniform(0.0, 2.0, n)
    tau[::3] = 0.0
    tau[1] = -0.05
    nu = rng.standard_normal(n)
    post_mean, post_cov = np.empty(d), np.empty((d, d))
    engine.refresh_posterior(X, prior_mean, prior_cov, tau, nu, post_mean, post_cov)
    compiled = linear_log_evidence(X, y, prior_mean, prior_cov, spec, tau, nu, post_mean, post_cov)
    expected = ref.log_evidence(X, y, prior_mean, prior_cov, gaussian_moments(0.5), tau, nu)
    assert np.isfinite(compiled)
    assert abs(compiled - expected) < 1e-10 * abs(expected)


# --------------------------------------------------------------------------- #
# negative-precision policies and failures
# --------------------------------------------------------------------------- #

def negative_warm_start(n, seed):
    rng = np.random.default_rng(seed)
    tau0 = rng.uniform(0.5, 2.0, n)
    tau0[::4] = -0.4                    # valid: the posterior precision stays PD
    nu0 = rng.standard_normal(n)
    return tau0, nu0


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("policy", POLICIES)
def test_negative_precision_policies(policy, form):
    n, d = 24, 4
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=43)
    tau0, nu0 = negative_warm_start(n, seed=1)
    negative = tau0 < 0
    # damping 0.2 from -0.4 towards 1/0.5 = 2: damped value -0.4 + 0.2 * 2.4 = +0.08;
    # damping 0.1 keeps it negative (-0.16), so the policies differ.
    tau, nu, post_mean, post_cov, info = compare_with_reference(
        X, y, prior_mean, prior_cov, 0.5, tau0, nu0, form, 0.1, 1, 0.0, 1, policy, "rank1")
    if policy == "clip":
        assert np.all(tau >= 0) and info.n_clipped == negative.sum()
        np.testing.assert_array_equal(tau[negative], 0.0)
    elif policy == "skip":
        assert info.n_skipped == negative.sum() and info.n_failed == 0
        np.testing.assert_array_equal(tau[negative], tau0[negative])
        np.testing.assert_array_equal(nu[negative], nu0[negative])
    else:
        assert info.n_skipped == 0 and np.all(tau[negative] < 0)
    assert np.all(np.linalg.eigvalsh(post_cov) > 0)
    # every cavity is proper: 1 - tau_i x_i^T V x_i > 0
    s = np.einsum("ij,jk,ik->i", X, post_cov, X)
    assert np.all(1.0 - tau * s > 0)


def test_allow_keeps_posterior_positive_definite_over_sweeps():
    n, d = 30, 6
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=47)
    tau0, nu0 = negative_warm_start(n, seed=2)
    for algorithm in ALGORITHMS.values():
        tau, nu, post_mean, post_cov, info = run(
            X, y, prior_mean, prior_cov, SiteSpec(LIK_GAUSSIAN, [0.5]), tau0, nu0, damping=0.05,
            max_sweeps=3, tol=0.0, refresh_every=0, negative_precision=engine.NEGATIVE_ALLOW,
            algorithm=algorithm, block_size=4)
        assert np.any(tau < 0)
        assert np.all(np.linalg.eigvalsh(post_cov) > 0)


def test_improper_cavity_is_skipped_and_counted():
    # two sites on the same direction: tau = (5, -4.5) gives V^-1 = 1.5 > 0 but the first
    # site's cavity precision 1.5 - 5 < 0 (improper).
    X = np.ones((2, 1))
    y = np.array([0.3, -0.2])
    prior_mean, prior_cov = np.zeros(1), np.eye(1)
    tau0, nu0 = np.array([5.0, -4.5]), np.array([0.1, 0.2])
    for form in FORMS:
        tau, nu, post_mean, post_cov, info = compare_with_reference(
            X, y, prior_mean, prior_cov, 1.0, tau0, nu0, form, 1.0, 1, 0.0, 1, "allow", "rank1")
        assert info.n_failed == 1 and info.n_skipped == 1 and not info.converged
        assert tau[0] == 5.0 and tau[1] == 1.0
    # with more sweeps the state recovers and converges
    *_, info = run(X, y, prior_mean, prior_cov, SiteSpec(LIK_GAUSSIAN, [1.0]), tau0, nu0)
    assert info.converged and info.n_failed == 1
    # log_evidence refuses an invalid state
    post_mean, post_cov = np.empty(1), np.empty((1, 1))
    engine.refresh_posterior(X, prior_mean, prior_cov, tau0, nu0, post_mean, post_cov)
    with pytest.raises(ValueError, match="improper cavity"):
        linear_log_evidence(X, y, prior_mean, prior_cov, SiteSpec(LIK_GAUSSIAN, [1.0]), tau0, nu0,
                            post_mean, post_cov)


# --------------------------------------------------------------------------- #
# errors
# --------------------------------------------------------------------------- #

def args(n=6, d=3):
    X, y, prior_mean, prior_cov = make_problem(n, d, seed=53)
    return dict(X=X, y=y, prior_mean=prior_mean, prior_cov=prior_cov,
                spec=SiteSpec(LIK_GAUSSIAN, [1.0]), site_precision=np.zeros(n),
                site_natural_mean=np.zeros(n), post_mean=np.empty(d), post_cov=np.empty((d, d)))


def call(**kw):
    a = args()
    a.update(kw)
    options = {k: a.pop(k) for k in list(a) if k not in (
        "X", "y", "prior_mean", "prior_cov", "spec", "site_precision", "site_natural_mean",
        "post_mean", "post_cov")}
    return run_linear_ep(a["X"], a["y"], a["prior_mean"], a["prior_cov"], a["spec"],
                         a["site_precision"], a["site_natural_mean"], a["post_mean"],
                         a["post_cov"], **options)


def test_non_pd_prior_raises_linalgerror():
    bad = np.diag([1.0, -1.0, 1.0])
    with pytest.raises(np.linalg.LinAlgError, match="prior_cov"):
        call(prior_cov=bad)
    a = args()
    with pytest.raises(np.linalg.LinAlgError, match="prior_cov"):
        engine.refresh_posterior(a["X"], a["prior_mean"], bad, a["site_precision"],
                                 a["site_natural_mean"], a["post_mean"], a["post_cov"])
    with pytest.raises(np.linalg.LinAlgError, match="prior_cov"):
        linear_log_evidence(a["X"], a["y"], a["prior_mean"], bad, a["spec"], a["site_precision"],
                            a["site_natural_mean"], a["post_mean"], a["post_cov"])


def test_non_pd_posterior_precision_raises_linalgerror():
    with pytest.raises(np.linalg.LinAlgError, match="posterior precision"):
        call(site_precision=np.full(6, -100.0))


@pytest.mark.parametrize("name, value", [
    ("y", np.zeros(5)), ("prior_mean", np.zeros(4)), ("prior_cov", np.eye(4)),
    ("site_precision", np.zeros(7)), ("site_natural_mean", np.zeros(5)),
    ("post_mean", np.empty(2)), ("post_cov", np.empty((3, 4))),
])
def test_shape_mismatch_names_the_argument(name, value):
    with pytest.raises(ValueError, match=name):
        call(**{name: value})


@pytest.mark.parametrize("name", ["X", "y", "prior_mean", "prior_cov", "site_precision"])
def test_non_finite_input_names_the_argument(name):
    value = args()[name].copy()
    value.flat[0] = np.nan
    with pytest.raises(ValueError, match=name):
        call(**{name: value})


@pytest.mark.parametrize("option, value", [
    ("update_form", 2), ("damping", 0.0), ("damping", 1.5), ("tol", -1.0), ("max_sweeps", -1),
    ("negative_precision", 3), ("algorithm", 5), ("block_size", -2),
])
def test_bad_options_raise_valueerror(option, value):
    with pytest.raises(ValueError, match=option):
        call(**{option: value})


def test_outputs_must_not_alias_inputs():
    a = args()
    with pytest.raises(ValueError, match="post_cov"):
        call(post_cov=a["prior_cov"], prior_cov=a["prior_cov"])
    tau = np.zeros(6)
    with pytest.raises(ValueError, match="site_precision"):
        call(site_precision=tau, site_natural_mean=tau)


# --------------------------------------------------------------------------- #
# non-Gaussian likelihoods (real site kernels) against the reference engine
# --------------------------------------------------------------------------- #

from functools import partial  # noqa: E402

from fastep import likelihoods  # noqa: E402
from fastep.reference import sites as ref_sites  # noqa: E402

LIKELIHOODS = {
    "probit": (likelihoods.Probit(slope=2.0, bias=0.1), partial(ref_sites.probit_moments, slope=2.0, bias=0.1)),
    "probit_hard": (likelihoods.Probit(slope=np.inf), partial(ref_sites.probit_moments, slope=np.inf)),
    "step": (likelihoods.Step(flip_noise=0.05), partial(ref_sites.step_moments, flip_noise=0.05)),
    "logistic_mackay": (likelihoods.Logistic(), ref_sites.logistic_mackay_moments),
    "logistic_gh": (likelihoods.Logistic(method="gauss-hermite", n_nodes=24),
                    partial(ref_sites.logistic_gh_moments, n_nodes=24)),
    "ordinal": (likelihoods.OrderedCategorical(4, slope=1.5, bias=-0.5, widths=[0.8, 1.2]),
                partial(ref_sites.ordinal_moments, slope=1.5, bias=-0.5, widths=[0.8, 1.2])),
}


def classification_problem(name, n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    latent = X @ (2.0 * rng.standard_normal(d)) + 0.3 * rng.standard_normal(n)
    if name == "ordinal":
        y = np.digitize(latent, [-0.5, 0.3, 1.5]).astype(float)
    else:
        y = np.where(latent > 0, 1.0, -1.0)
        y[rng.choice(n, n // 10, replace=False)] *= -1      # a few mislabelled points
    prior_mean = 0.1 * rng.standard_normal(d)
    A = rng.standard_normal((d, d))
    prior_cov = A @ A.T / d + 0.5 * np.eye(d)
    return X, y, prior_mean, prior_cov


def compare_likelihood(name, n, d, form, damping, max_sweeps, tol, algorithm, seed=0, rtol=1e-8):
    lik, moments = LIKELIHOODS[name]
    X, y, prior_mean, prior_cov = classification_problem(name, n, d, seed)
    spec = lik.site_spec()
    tau, nu, post_mean, post_cov, info = run(
        X, y, prior_mean, prior_cov, spec, update_form=FORMS[form], damping=damping, tol=tol,
        max_sweeps=max_sweeps, algorithm=ALGORITHMS[algorithm], block_size=8)
    out = ref.run_linear_ep(X, y, prior_mean, prior_cov, moments, update_form=form,
                            damping=damping, tol=tol, max_sweeps=max_sweeps)
    assert rel_err(tau, out["site_precision"]) < rtol
    assert rel_err(nu, out["site_natural_mean"]) < rtol
    assert rel_err(post_mean, out["post_mean"]) < rtol
    assert rel_err(post_cov, out["post_cov"]) < rtol
    for key in ("n_sweeps", "converged", "n_skipped", "n_clipped", "n_failed"):
        assert getattr(info, key) == out[key], key
    return X, y, prior_mean, prior_cov, spec, moments, tau, nu, post_mean, post_cov, info


@pytest.mark.parametrize("name", LIKELIHOODS)
@pytest.mark.parametrize("form", FORMS)
def test_likelihoods_trajectory_matches_reference(name, form):
    # a few sweeps, not converged: the whole trajectory must agree
    compare_likelihood(name, 30, 4, form, damping=0.8, max_sweeps=3, tol=0.0, algorithm="rank1")


@pytest.mark.parametrize("name", LIKELIHOODS)
def test_likelihoods_converged_state_and_evidence_match_reference(name):
    (X, y, prior_mean, prior_cov, spec, moments, tau, nu, post_mean, post_cov,
     info) = compare_likelihood(name, 40, 33, "natural", damping=1.0, max_sweeps=100, tol=1e-10,
                                algorithm="blocked")
    assert info.converged
    evidence = linear_log_evidence(X, y, prior_mean, prior_cov, spec, tau, nu, post_mean, post_cov)
    assert abs(evidence - ref.log_evidence(X, y, prior_mean, prior_cov, moments, tau, nu)) \
        < 1e-9 * abs(evidence)
    if np.all(tau > 0):       # log-concave sites: literal eqs 48-49 with eq 33 at the fixed point
        literal = ref.log_evidence_literal(X, y, prior_mean, prior_cov, moments, tau, nu,
                                           site_scale="moments")
        assert abs(evidence - literal) < 1e-7 * abs(literal)


@pytest.mark.parametrize("name", ["probit", "logistic_gh", "ordinal"])
def test_likelihoods_update_forms_and_algorithms_share_the_fixed_point(name):
    lik, _ = LIKELIHOODS[name]
    X, y, prior_mean, prior_cov = classification_problem(name, 60, 40, seed=3)
    spec = lik.site_spec()
    results = [run(X, y, prior_mean, prior_cov, spec, update_form=code, tol=1e-12,
                   algorithm=alg, damping=damping)
               for code in FORMS.values() for alg in ALGORITHMS.values() for damping in (1.0, 0.7)]
    for other in results[1:]:
        assert other[4].converged
        for a, b in zip(results[0][:4], other[:4]):
            assert rel_err(a, b) < 1e-9
    tau, nu = results[0][:2]
    warm = run(X, y, prior_mean, prior_cov, spec, tau, nu, tol=1e-9)
    assert warm[4].converged and warm[4].n_sweeps == 1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_probit_invariant_after_many_rank1_updates(algorithm):
    lik, _ = LIKELIHOODS["probit"]
    X, y, prior_mean, prior_cov = classification_problem("probit", 200, 30, seed=5)
    spec = lik.site_spec()
    options = dict(damping=0.1, tol=0.0, max_sweeps=50, algorithm=ALGORITHMS[algorithm])
    tau, nu, drift_mean, drift_cov, info = run(X, y, prior_mean, prior_cov, spec,
                                               refresh_every=0, **options)
    fresh_mean, fresh_cov = np.empty(30), np.empty((30, 30))
    engine.refresh_posterior(X, prior_mean, prior_cov, tau, nu, fresh_mean, fresh_cov)
    assert rel_err(drift_cov, fresh_cov) < 1e-9 and rel_err(drift_mean, fresh_mean) < 1e-9
    refreshed = run(X, y, prior_mean, prior_cov, spec, refresh_every=1, **options)
    for a, b in zip(refreshed[:4], (tau, nu, fresh_mean, fresh_cov)):
        assert rel_err(a, b) < 1e-10
