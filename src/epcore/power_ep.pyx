# cython: language_level=3
"""Power EP for one site: the likelihood raised to a power α ∈ (0, 1] at a Gaussian cavity.

Used by the sparse engines (:mod:`fastep._epcore.sparse_ep`, :mod:`fastep._epcore.student_t_ep`):
the site acts on ``g_i`` and the likelihood on ``f_i = g_i + ε_i``, ``ε_i ~ N(0, d_i)``.
Equations: Minka, "Power EP" (2004); Bui, Yan & Turner, "A unifying framework for Gaussian
process pseudo-point approximations using power expectation propagation" (JMLR 2017).

One site (``power_site_step``, power α ∈ (0, 1])
------------------------------------------------
From ``s = Var[g_i]`` and ``h = E[g_i]``: cavity variance ``v_c = s / (1 - α τ_i s)`` and mean
``m_c = h + v_c α (τ_i h - ν_i)`` (eqs 78-79 with α τ_i, α ν_i); the site kernel of the
likelihood raised to the power α at the cavity of f, ``N(m_c, v_c + d_i)``, gives
``(log Z_i, a, b)`` (``power_site_moments``); the new site is

    τ* = b / (α (1 - v_c b)),      ν* = (a + b m_c) / (α (1 - v_c b))      (eqs 81-83, / α),

then damping in natural parameters and the negative-precision policy of _common
(``NEGATIVE_CLIP``: τ* < 0 becomes 0 with ν* = a/α; ``NEGATIVE_SKIP``; ``NEGATIVE_ALLOW`` is
rejected: τ >= 0 keeps A >= I, so every downdate below is well posed). Student-t sites, whose
precisions must be allowed to go negative, have their own parallel schedule with step halving,
the sparse engine of :mod:`fastep._epcore.student_t_ep` (fractional EP; A is then built with a subtracting ``syrk`` for the
negative sites and its Cholesky factorisation is the check that the posterior is proper).  A site with an improper
cavity, a failing kernel or ``1 - v_c b <= 0`` is left unchanged and counted as failed.

Powered moments (``power_site_moments``)
---------------------------------------
``Z = ∫ p(y | f)^α N(f; m, v) df``.  α = 1: the site kernel itself.  Gaussian likelihood:
closed form, ``N(y; f, σ²)^α = (2πσ²)^((1-α)/2) α^(-1/2) N(y; f, σ²/α)``.  Otherwise
Gauss-Hermite quadrature centred on ``N(m_b, v_b)``, the cavity times the α-th power of the
power-1 EP site (from the site kernel at the cavity; 0 if that site has negative precision),
which follows the tilted density when the cavity is wide:

    Z = Σ_k w_k exp(α ℓ(f_k)) N(f_k; m, v) / N(f_k; m_b, v_b),   f_k = m_b + sqrt(2 v_b) t_k,

with ``ℓ, ℓ', -ℓ''`` from the site kernel at zero cavity variance (the pointwise
log-likelihood), and, differentiating under the integral,
``a = α E_p[ℓ']``, ``b = α E_p[-ℓ''] - α² Var_p[ℓ']`` (p: the normalised quadrature weights).
This needs a likelihood with a pointwise log density: probit/ordinal with finite slope,
logistic, Gaussian.  The step likelihood (and infinite slopes) are rejected for α < 1.
Accuracy (probit, against adaptive scipy quadrature and a 2·10⁶-point grid): relative error
< 1e-5 at 64 nodes (~1e-7 typical at 32) for cavity variances up to ~10; it degrades when a
wide cavity sits on the wrong side of the decision boundary (variance 100, mean 5, y = -1:
~1e-2 at 32 nodes, ~5e-3 at 64), where the tilted density is a half-Gaussian with a kink
that a Gaussian rule resolves poorly.  Raise ``n_quadrature`` (<= 256) for such problems.


Python API
----------
:class:`PowerQuadrature` (the rule a compiled loop reads, built once per run),
``power_moments_array`` (the powered site kernel over arrays, for gradients and tests).
"""
import numpy as np

from libc.math cimport sqrt, log, log1p, exp, fabs, isfinite, INFINITY, NAN
from fastep._epcore.sites cimport (
    SiteModel, SiteSpec, site_moments, LIK_GAUSSIAN, LIK_ORDINAL, LIK_STUDENT_T, GH_MAX_NODES, SITE_OK,
    SITE_BAD_PARAMS,
)
from fastep._epcore.student_t_sites cimport student_t_moments, student_t_log_norm
from fastep._epcore._common cimport (
    SiteUpdateOptions, damped_site_update, NEGATIVE_CLIP, NEGATIVE_SKIP, STEP_APPLIED, STEP_CLIPPED, STEP_SKIPPED, STEP_FAILED,
)

cdef double _LOG_2PI = 1.8378770664093454836

#: Default number of Gauss-Hermite nodes of the powered site moments (α < 1).
DEFAULT_N_QUADRATURE = 32


# --------------------------------------------------------------------------- #
# powered site moments and the site step
# --------------------------------------------------------------------------- #

cdef int power_site_moments(const SiteModel* model, const PowerRule* rule, double y, double mean,
                            double var, double* log_z, double* alpha, double* beta) noexcept nogil:
    """log Z, a = ∂ log Z/∂mean, b = -∂² log Z/∂mean² of ``Z = ∫ p(y|f)^α N(f; mean, var) df``.

    Module docstring ("Powered moments").  Returns the site kernel's status (SITE_OK = 0 on
    success, with finite outputs).
    """
    cdef double power = rule.power
    cdef SiteModel local
    cdef double noise, lz1, a1, b1, one_minus, site_tau, site_nu, prec_b, var_b, mean_b, sd_b
    cdef double f, l, d1, d2, lw_max, total, p, e1, e2, e11, half_log_ratio
    cdef double lw[GH_MAX_NODES]
    cdef double g1[GH_MAX_NODES]
    cdef double g2[GH_MAX_NODES]
    cdef int k, status, n_nodes = rule.n_nodes
    if model.code == LIK_STUDENT_T:
        # the powered Student-t site by its own panel quadrature (any α; the tilted density
        # may be bimodal, which a Gauss-Hermite rule centred on one site would miss)
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        if not (var >= 0.0 and isfinite(var) and isfinite(mean)):
            return SITE_BAD_PARAMS
        status = student_t_moments(model.params[0], model.params[1], power,
                                   student_t_log_norm(model.params[0], model.params[1]), y, mean, var,
                                   log_z, alpha, beta, &e1, &e2)
        if status == SITE_OK and not (isfinite(log_z[0]) and isfinite(alpha[0]) and isfinite(beta[0])):
            return 5    # SITE_OVERFLOW
        return status
    if power == 1.0:
        return site_moments(model, y, mean, var, log_z, alpha, beta)
    if model.code == LIK_GAUSSIAN:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        noise = model.params[0]
        local = model[0]
        noise = noise / power
        local.params = &noise
        status = site_moments(&local, y, mean, var, log_z, alpha, beta)
        if status == SITE_OK:
            log_z[0] += 0.5 * (1.0 - power) * (_LOG_2PI + log(model.params[0])) - 0.5 * log(power)
        return status
    if n_nodes < 1 or n_nodes > GH_MAX_NODES or rule.nodes == NULL or rule.log_weights == NULL:
        return SITE_BAD_PARAMS
    # quadrature base: the cavity times the α-th power of the power-1 site
    status = site_moments(model, y, mean, var, &lz1, &a1, &b1)
    if status != SITE_OK:
        return status
    one_minus = 1.0 - var * b1
    if b1 > 0.0 and one_minus > 0.0:
        site_tau = b1 / one_minus
        site_nu = (a1 + b1 * mean) / one_minus
    else:
        site_tau = 0.0
        site_nu = a1
    prec_b = 1.0 / var + power * site_tau
    var_b = 1.0 / prec_b
    mean_b = (mean / var + power * site_nu) * var_b
    sd_b = sqrt(2.0 * var_b)
    half_log_ratio = 0.5 * log(var_b / var)
    lw_max = -INFINITY
    for k in range(n_nodes):
        f = mean_b + sd_b * rule.nodes[k]
        status = site_moments(model, y, f, 0.0, &l, &d1, &d2)
        if status != SITE_OK:
            return status
        # log w_k + α ℓ(f_k) + log N(f_k; mean, var) - log N(f_k; mean_b, var_b)
        lw[k] = (rule.log_weights[k] + power * l - 0.5 * (f - mean) * (f - mean) / var
                 + rule.nodes[k] * rule.nodes[k] + half_log_ratio)
        g1[k] = d1
        g2[k] = d2
        if lw[k] > lw_max:
            lw_max = lw[k]
    if not isfinite(lw_max):
        return 3    # SITE_ZERO_MASS
    total = 0.0
    for k in range(n_nodes):
        lw[k] = exp(lw[k] - lw_max)
        total += lw[k]
    e1 = 0.0
    e2 = 0.0
    for k in range(n_nodes):
        p = lw[k] / total
        lw[k] = p
        e1 += p * g1[k]
        e2 += p * g2[k]
    e11 = 0.0
    for k in range(n_nodes):
        e11 += lw[k] * (g1[k] - e1) * (g1[k] - e1)
    log_z[0] = lw_max + log(total)
    alpha[0] = power * e1
    beta[0] = power * e2 - power * power * e11
    if not (isfinite(log_z[0]) and isfinite(alpha[0]) and isfinite(beta[0])):
        return 5    # SITE_OVERFLOW
    return SITE_OK


cdef int power_site_step(const SiteModel* model, const PowerRule* rule, double y, double g_mean,
                         double g_var, double d, double* site_precision_i,
                         double* site_natural_mean_i, const SiteUpdateOptions* opts) noexcept nogil:
    """One power-EP site update from the marginal ``N(g_i; g_mean, g_var)`` (module docstring).

    Writes the new site unless the result is STEP_SKIPPED / STEP_FAILED; returns a
    linear_ep ``SiteStepResult``.  The update of the posterior it implies,
    ``1 + Δτ g_var``, is checked to be > 0 (else STEP_SKIPPED).
    """
    cdef double power = rule.power
    cdef double tau_old = site_precision_i[0], nu_old = site_natural_mean_i[0]
    cdef double denom, v_c, m_c, log_z = 0.0, a = 0.0, b = 0.0, one_minus
    cdef double tau_t, nu_t, tau_new, nu_new
    cdef int result = STEP_APPLIED
    if not (g_var >= 0.0 and isfinite(g_var) and isfinite(g_mean)):      # 0: f_i independent of u
        return STEP_FAILED
    denom = 1.0 - power * tau_old * g_var
    if not denom > 0.0:
        return STEP_FAILED
    v_c = g_var / denom                                                   # eq 79
    m_c = g_mean + v_c * power * (tau_old * g_mean - nu_old)             # eq 78
    if not (isfinite(v_c) and isfinite(m_c)):
        return STEP_FAILED
    if power_site_moments(model, rule, y, m_c, v_c + d, &log_z, &a, &b) != 0:
        return STEP_FAILED
    one_minus = 1.0 - v_c * b
    if not one_minus > 0.0:
        return STEP_FAILED
    tau_t = b / (power * one_minus)                                       # eqs 81-83, / α
    nu_t = (a + b * m_c) / (power * one_minus)
    if tau_t < 0.0:
        if opts.negative_precision == NEGATIVE_SKIP:
            return STEP_SKIPPED
        tau_t = 0.0
        nu_t = a / power
        result = STEP_CLIPPED
    result = damped_site_update(opts, tau_old, nu_old, tau_t, nu_t, result, &tau_new, &nu_new)
    if result == STEP_SKIPPED:
        return STEP_SKIPPED
    if not 1.0 + (tau_new - tau_old) * g_var > 0.0:
        return STEP_SKIPPED
    site_precision_i[0] = tau_new
    site_natural_mean_i[0] = nu_new
    return result


_RULES = {}


def _gauss_hermite(int n_nodes):
    """Physicists' Gauss-Hermite nodes and log(w_k/sqrt(pi)) (cached)."""
    rule = _RULES.get(n_nodes)
    if rule is None:
        nodes, weights = np.polynomial.hermite.hermgauss(n_nodes)
        rule = (np.ascontiguousarray(nodes), np.ascontiguousarray(np.log(weights) - 0.5 * np.log(np.pi)))
        _RULES[n_nodes] = rule
    return rule


def _check_power_range(double power, int n_quadrature):
    """power in (0, 1], n_quadrature in [1, GH_MAX_NODES] (the engines' options)."""
    if not (power > 0.0 and power <= 1.0):
        raise ValueError(f"power must be in (0, 1]; got {power}")
    if not (1 <= n_quadrature <= GH_MAX_NODES):
        raise ValueError(f"n_quadrature must be in [1, {GH_MAX_NODES}]; got {n_quadrature}")


def _check_power(double power, SiteSpec spec, int n_quadrature):
    """power in (0, 1]; for power < 1 a likelihood with a pointwise log density."""
    cdef double log_z, alpha, beta
    cdef int status
    _check_power_range(power, n_quadrature)
    if power < 1.0 and spec.code != LIK_GAUSSIAN:
        # the quadrature evaluates the likelihood pointwise: zero cavity variance must work
        status = site_moments(&spec.model, 0.0 if spec.code == LIK_ORDINAL else 1.0, 0.0, 0.0, &log_z,
                              &alpha, &beta)
        if status != SITE_OK:
            raise ValueError("power < 1 needs a likelihood with a pointwise log density (probit or "
                             "ordinal with a finite slope, logistic, Gaussian); the step likelihood "
                             "and infinite slopes support power = 1 only")




cdef class PowerQuadrature:
    """The power α and its Gauss-Hermite rule, as the compiled loops read them (``rule``).

    Parameters
    ----------
    power : float in (0, 1]
    n_quadrature : int in [1, GH_MAX_NODES]
        Nodes of the quadrature used for α < 1 with non-Gaussian likelihoods.
    """

    def __cinit__(self, double power, int n_quadrature=DEFAULT_N_QUADRATURE):
        self.nodes, self.log_weights = _gauss_hermite(n_quadrature)
        cdef const double[::1] nodes_v = self.nodes
        cdef const double[::1] lw_v = self.log_weights
        self.rule.power = power
        self.rule.nodes = &nodes_v[0]
        self.rule.log_weights = &lw_v[0]
        self.rule.n_nodes = n_quadrature


def power_moments_array(SiteSpec spec not None, y, mean, var, *, double power=1.0,
                        int n_quadrature=DEFAULT_N_QUADRATURE):
    """``(log_z, alpha, beta)`` of ``∫ p(y_i|f)^α N(f; mean_i, var_i) df`` for arrays (module docstring).

    Raises ValueError naming the first site whose kernel fails.
    """
    cdef const double[::1] yv = np.ascontiguousarray(y, dtype=np.float64)
    cdef const double[::1] mv = np.ascontiguousarray(mean, dtype=np.float64)
    cdef const double[::1] vv = np.ascontiguousarray(var, dtype=np.float64)
    cdef Py_ssize_t n = yv.shape[0], i, bad = -1
    if mv.shape[0] != n or vv.shape[0] != n:
        raise ValueError("y, mean and var must have the same length")
    _check_power(power, spec, n_quadrature)
    cdef PowerQuadrature quadrature = PowerQuadrature(power, n_quadrature)
    log_z = np.empty(n)
    alpha = np.empty(n)
    beta = np.empty(n)
    cdef double[::1] lz = log_z
    cdef double[::1] al = alpha
    cdef double[::1] be = beta
    cdef int status = 0
    with nogil:
        for i in range(n):
            status = power_site_moments(&spec.model, &quadrature.rule, yv[i], mv[i], vv[i], &lz[i], &al[i], &be[i])
            if status != 0:
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"site {bad}: the site kernel failed (status {status}) at y = {yv[bad]!r}, "
                         f"mean = {mv[bad]!r}, var = {vv[bad]!r}")
    return log_z, alpha, beta


