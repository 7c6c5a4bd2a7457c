# cython: language_level=3
"""Weight-space Gaussian EP with rank-1 sites (Minka, "EP: a quick reference", §1.1).

Model
-----
Prior ``N(w; m0, V0)`` on ``w in R^d`` and ``n`` factors ``t_i(w) = f_i(x_i^T w)``
(``x_i`` = row ``i`` of ``X``).  Each factor is approximated by a rank-1 Gaussian
site ``exp(-tau_i f^2 / 2 + nu_i f)`` in ``f = x_i^T w`` (eqs 20-22) with natural
parameters

* ``site_precision[i]    = tau_i = 1 / v_i``,
* ``site_natural_mean[i] = nu_i  = m_i / v_i``,

both 0 for "no information yet", so warm starts and fresh starts are the same code.
The posterior ``q(w) = N(m, V)`` satisfies the invariant (eqs 46-47)

    V^-1 = V0^-1 + X^T diag(tau) X,        m = V (V0^-1 m0 + X^T nu).

One site update (sequential sweeps over i = 0..n-1)
--------------------------------------------------
With ``u = V x_i``, ``s = x_i^T V x_i`` and ``h = x_i^T m``:

* cavity (eqs 25, 29): ``lambda = s / (1 - tau_i s)``,
  ``h_cav = h + lambda (tau_i h - nu_i)``; the cavity is improper when
  ``1 - tau_i s <= 0`` and the site is then left unchanged (counted as failed);
* moments: ``site_moments(y_i, h_cav, lambda) -> (log Z_i, alpha, beta)``;
* target site (eqs 39-41): ``tau* = beta / (1 - lambda beta)``,
  ``nu* = alpha (1 + tau* lambda) + tau* h_cav = (alpha + beta h_cav) / (1 - lambda beta)``;
  ``1 - lambda beta <= 0`` (tilted variance not positive) counts as a failure;
* negative-precision policy (applied to the target, see below);
* damping ``omega`` in natural parameters: ``tau_new = tau_i + omega (tau* - tau_i)``,
  same for ``nu``;
* posterior update, one of two algebraically equivalent forms
  (``update_form``):

  - ``UPDATE_MOMENT`` (eqs 34, 36, 38): ``d = 1 / (1 - tau_i s)``,
    ``m += u d (tau_i h - nu_i + alpha)``, ``V += u d (tau_i - beta d) u^T``.
    Written with ``1/v_i = tau_i`` so that ``tau_i = 0`` needs no special case.
    The moment form describes the undamped update only; with ``damping != 1``
    the change is applied with eqs 44-45 (natural form) instead.
  - ``UPDATE_NATURAL`` (eqs 42-45): ``c = 1 + s dtau``,
    ``V -= u (dtau / c) u^T``, ``m += u (dnu - h dtau) / c``.

  ``c <= 0`` would make V indefinite; such an update is skipped (any policy).

Negative-precision policy (``negative_precision``)
-------------------------------------------------
* ``NEGATIVE_CLIP`` (default): ``tau* := 0`` and ``nu* := alpha`` (the same formula
  at ``tau* = 0``).  The site becomes a pure linear tilt that keeps the tilted
  MEAN matched while the marginal variance stays the cavity's.  After damping,
  a damped precision that is still negative (possible only when the starting
  site precision was negative, e.g. a warm start) is set to 0 as well.
  Clipped updates are counted in ``n_clipped``.
* ``NEGATIVE_SKIP``: a site whose new precision would be negative is left
  unchanged (counted in ``n_skipped``).
* ``NEGATIVE_ALLOW``: negative precisions are accepted unless V would lose
  positive definiteness (``1 + s dtau <= 0``) or the site's cavity is improper
  (``1 - tau_i s <= 0``); those sites are skipped.  Note that for a valid
  moment-matched target ``1 + lambda tau* = 1 / (1 - lambda beta) > 0``, so in
  exact arithmetic the PD guard only triggers through rounding.

A site whose kernel returns a status != 0 or non-finite moments, or whose cavity
is improper, is left unchanged and counted in both ``n_failed`` and ``n_skipped``.

Convergence
-----------
A sweep's change is ``max_i |dtau_i| / max(1, |tau_i|)`` and
``max_i |dnu_i| / max(1, |nu_i|)`` (absolute below 1, relative above, with the new
values in the denominators).  The run has converged when both are ``< tol`` and
no site failed during that sweep.

Algorithms
----------
``ALGORITHM_RANK1`` (default for ``d < 32``): per site one ``symv``
(``u = V x_i``), one ``syr`` and one ``axpy`` on the lower triangle -- the plain
BLAS-2 path, kept as cross-check; for ``d < 32`` the same operations are plain
loops (BLAS call overhead dominates there).

``ALGORITHM_BLOCKED`` (default for ``d >= 32``): the rank-1 updates of a block of
``b`` consecutive sites are delayed.  At the start of a block ``G = X_blk V``
(one BLAS-3 ``symm``).  For site ``t`` of the block
``V x_t = G_t + sum_{r<t} a_r u_r (u_r^T x_t)`` (two small ``gemv`` against the
stored ``sqrt|a_r| u_r``), and at the end of the block the accumulated
``sum_r a_r u_r u_r^T`` is added with two ``syrk`` (positive and negative
coefficients).  Same arithmetic up to rounding (timings against the bare ``dsyr``
yardstick in the project's ``benchmarks/README.md``).

Refresh
-------
Every ``refresh_every`` sweeps (and after the last sweep) V and m are recomputed
from the sites through the invariant (eqs 46-47) by a Cholesky factorisation of
``V0^-1 + X^T diag(tau) X`` (``syrk`` on rows scaled by ``sqrt|tau_i|``, negative
precisions subtracted), which removes the drift of the rank-1 updates.
``refresh_every <= 0`` or ``> max_sweeps`` disables refreshing after sweeps.

All sweeps and refreshes run with the GIL released; sequential small BLAS-2
calls are usually fastest with a single BLAS thread.
"""
import numpy as np

from libc.math cimport sqrt, log, fabs, isfinite, INFINITY, NAN
from fastep._epcore._blas cimport (
    UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT,
    ddot, daxpy, dscal, dcopy, symv, gemv, gemv_t, syr, syrk, trsv, potrf, potri,
    symmetrize, symm_right,
)
from fastep._epcore.sites cimport SiteModel, SiteSpec, site_moments
from fastep._epcore._common cimport interrupt_requested, SweepDriver, EngineOptions, SweepSettings
from fastep._epcore._common import site_update_constants as _site_update_constants
from fastep._epcore._common import _check_no_aliasing

# Row blocks of the refresh / evidence BLAS-3 passes: at least 256 rows and about 2**17
# doubles (fewer, larger syrk/symm calls for small d), at most n rows.
cdef int _scratch_rows(int n, int d):
    cdef int rows = 131072 // d
    if rows < 256:
        rows = 256
    if rows > n:
        rows = n
    return rows if rows > 0 else 1

# Module-level integer constants (UPDATE_MOMENT, ..., ALGORITHM_BLOCKED) for Python callers;
# Cython exposes the cpdef enums of linear_ep.pxd only as classes.
globals().update(_site_update_constants())
for _member in SweepAlgorithm:
    globals()[_member.name] = int(_member)
del _member


# --------------------------------------------------------------------------- #
# nogil building blocks
# --------------------------------------------------------------------------- #

cdef enum:
    # Below this dimension site_update uses plain loops instead of BLAS-2 calls: the call
    # overhead (and OpenBLAS threading) dominates the O(d^2) work for tiny matrices.
    _SMALL_D = 32


cdef inline double _small_dot(int d, const double* a, const double* b) noexcept nogil:
    cdef int k
    cdef double acc = 0.0
    for k in range(d):
        acc += a[k] * b[k]
    return acc


cdef inline void _small_symv_lower(int d, const double* a, const double* x, double* out) noexcept nogil:
    """out = A x with only the lower triangle of row-major A referenced."""
    cdef int j, k
    cdef double acc, xj, ajk
    cdef const double* row
    for j in range(d):
        out[j] = 0.0
    for j in range(d):
        row = a + <Py_ssize_t>j * d
        xj = x[j]
        acc = 0.0
        for k in range(j):
            ajk = row[k]
            acc += ajk * x[k]
            out[k] += ajk * xj
        out[j] += acc + row[j] * xj


cdef inline void _small_syr_lower(int d, double alpha, const double* u, double* a) noexcept nogil:
    """A += alpha u u^T on the lower triangle of row-major A."""
    cdef int j, k
    cdef double auj
    cdef double* row
    for j in range(d):
        row = a + <Py_ssize_t>j * d
        auj = alpha * u[j]
        for k in range(j + 1):
            row[k] += auj * u[k]


cdef int site_update(const SiteModel* model, double y, const double* x, int d,
                     double* post_cov, double* post_mean, double* work,
                     double* site_precision_i, double* site_natural_mean_i,
                     const SiteUpdateOptions* opts) noexcept nogil:
    """One full rank-1 site update on (lower triangle of) ``post_cov`` and ``post_mean``.

    ``work`` (d doubles) receives ``V x`` before the update.  Returns a ``SiteStepResult``.
    BLAS symv/syr/axpy for ``d >= 32``, plain loops below (call overhead dominates there).
    """
    cdef double xVx, xm, cov_coef = 0.0, mean_coef = 0.0
    cdef int result
    cdef int k
    if d < _SMALL_D:
        _small_symv_lower(d, post_cov, x, work)
        xVx = _small_dot(d, work, x)
        xm = _small_dot(d, post_mean, x)
    else:
        symv(LOWER, d, 1.0, post_cov, d, x, 0.0, work)
        xVx = ddot(d, work, 1, x, 1)
        xm = ddot(d, post_mean, 1, x, 1)
    result = site_step(model, y, xVx, xm, site_precision_i, site_natural_mean_i, opts,
                       &cov_coef, &mean_coef)
    if result == STEP_APPLIED or result == STEP_CLIPPED:
        if d < _SMALL_D:
            if cov_coef != 0.0:
                _small_syr_lower(d, cov_coef, work, post_cov)
            for k in range(d):
                post_mean[k] += mean_coef * work[k]
        else:
            if cov_coef != 0.0:
                syr(LOWER, d, cov_coef, work, post_cov, d)
            if mean_coef != 0.0:
                daxpy(d, mean_coef, work, 1, post_mean, 1)
    return result


cdef void sweep_rank1(const SiteModel* model, const double* X, const double* y, int n, int d,
                      double* site_precision, double* site_natural_mean,
                      double* post_cov, double* post_mean, double* work,
                      const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil:
    """One sequential sweep with a symv + syr per site (lower triangle of post_cov kept)."""
    cdef int i, result
    cdef double tau_old, nu_old
    sweep_stats_reset(stats)
    for i in range(n):
        if interrupt_requested(stats):
            return
        tau_old = site_precision[i]
        nu_old = site_natural_mean[i]
        result = site_update(model, y[i], X + <Py_ssize_t>i * d, d, post_cov, post_mean, work,
                             &site_precision[i], &site_natural_mean[i], opts)
        sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])


cdef void sweep_blocked(const SiteModel* model, const double* X, const double* y, int n, int d,
                        double* site_precision, double* site_natural_mean,
                        double* post_cov, double* post_mean, int block_size,
                        double* cross, double* scaled, double* small,
                        const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil:
    """One sequential sweep with the rank-1 covariance updates delayed over blocks of sites.

    Exactly the same sequence of site updates as ``sweep_rank1`` (up to rounding).
    Workspaces: ``cross`` and ``scaled`` hold ``block_size x d`` doubles, ``small``
    ``block_size``.  ``scaled`` stores ``sqrt(a_r) u_r`` for positive coefficients
    from the top and ``sqrt(-a_r) u_r`` for negative ones from the bottom, so that
    ``V_current = V_block_start + S_pos^T S_pos - S_neg^T S_neg``.
    """
    cdef int b0 = 0, kk, t, i, n_pos, n_neg, result
    cdef double* u
    cdef double* neg_rows
    cdef const double* x
    cdef double xVx, xm, cov_coef, mean_coef, tau_old, nu_old
    sweep_stats_reset(stats)
    while b0 < n:
        kk = block_size if n - b0 > block_size else n - b0
        # rows of X_blk V = (V x_i)^T for the whole block (BLAS-3)
        symm_right(LOWER, kk, d, 1.0, post_cov, d, X + <Py_ssize_t>b0 * d, d, 0.0, cross, d)
        n_pos = 0
        n_neg = 0
        for t in range(kk):
            if interrupt_requested(stats):
                return
            i = b0 + t
            x = X + <Py_ssize_t>i * d
            u = cross + <Py_ssize_t>t * d
            if n_pos > 0:
                gemv(n_pos, d, 1.0, scaled, d, x, 0.0, small)
                gemv_t(n_pos, d, 1.0, scaled, d, small, 1.0, u)
            if n_neg > 0:
                neg_rows = scaled + <Py_ssize_t>(block_size - n_neg) * d
                gemv(n_neg, d, 1.0, neg_rows, d, x, 0.0, small)
                gemv_t(n_neg, d, -1.0, neg_rows, d, small, 1.0, u)
            xVx = ddot(d, u, 1, x, 1)
            xm = ddot(d, post_mean, 1, x, 1)
            tau_old = site_precision[i]
            nu_old = site_natural_mean[i]
            cov_coef = 0.0
            mean_coef = 0.0
            result = site_step(model, y[i], xVx, xm, &site_precision[i], &site_natural_mean[i],
                               opts, &cov_coef, &mean_coef)
            sweep_stats_record(stats, result, tau_old, nu_old, site_precision[i], site_natural_mean[i])
            if result == STEP_APPLIED or result == STEP_CLIPPED:
                if mean_coef != 0.0:
                    daxpy(d, mean_coef, u, 1, post_mean, 1)
                if cov_coef > 0.0:
                    dcopy(d, u, 1, scaled + <Py_ssize_t>n_pos * d, 1)
                    dscal(d, sqrt(cov_coef), scaled + <Py_ssize_t>n_pos * d, 1)
                    n_pos += 1
                elif cov_coef < 0.0:
                    n_neg += 1
                    neg_rows = scaled + <Py_ssize_t>(block_size - n_neg) * d
                    dcopy(d, u, 1, neg_rows, 1)
                    dscal(d, sqrt(-cov_coef), neg_rows, 1)
        if n_pos > 0:
            syrk(LOWER, d, n_pos, 1.0, scaled, d, 1.0, post_cov, d)
        if n_neg > 0:
            syrk(LOWER, d, n_neg, -1.0, scaled + <Py_ssize_t>(block_size - n_neg) * d, d,
                 1.0, post_cov, d)
        b0 += kk


cdef int posterior_precision_cholesky(const double* X, int n, int d, const double* site_precision,
                                      const double* prior_precision, double* chol,
                                      double* scratch, int scratch_rows) noexcept nogil:
    """Lower Cholesky factor of ``V0^-1 + X^T diag(tau) X`` (eq 46) into ``chol``.

    ``prior_precision``: d x d, lower triangle referenced.  ``scratch``:
    ``scratch_rows x d``.  Rows are scaled by ``sqrt|tau_i|`` and accumulated with
    ``syrk`` (+1 for positive, -1 for negative precisions).  Returns potrf's info.
    """
    cdef int i, sign, count
    cdef double tau, alpha
    dcopy(d * d, prior_precision, 1, chol, 1)
    for sign in range(2):
        count = 0
        alpha = 1.0 if sign == 0 else -1.0
        for i in range(n):
            tau = site_precision[i]
            if (sign == 0 and tau > 0.0) or (sign == 1 and tau < 0.0):
                dcopy(d, X + <Py_ssize_t>i * d, 1, scratch + <Py_ssize_t>count * d, 1)
                dscal(d, sqrt(fabs(tau)), scratch + <Py_ssize_t>count * d, 1)
                count += 1
                if count == scratch_rows:
                    syrk(LOWER, d, count, alpha, scratch, d, 1.0, chol, d)
                    count = 0
        if count > 0:
            syrk(LOWER, d, count, alpha, scratch, d, 1.0, chol, d)
    return potrf(LOWER, d, chol, d)


cdef int refresh_lower(const double* X, int n, int d, const double* site_precision,
                       const double* site_natural_mean, const double* prior_precision,
                       const double* prior_precision_mean, double* post_cov, double* post_mean,
                       double* scratch, int scratch_rows) noexcept nogil:
    """Recompute V (lower triangle) and m from the sites, eqs 46-47.

    ``prior_precision_mean = V0^-1 m0``.  Returns 0, or the order of the leading
    minor of ``V0^-1 + X^T diag(tau) X`` that is not positive definite.
    """
    cdef int info = posterior_precision_cholesky(X, n, d, site_precision, prior_precision,
                                                 post_cov, scratch, scratch_rows)
    if info != 0:
        return info
    dcopy(d, prior_precision_mean, 1, post_mean, 1)
    gemv_t(n, d, 1.0, X, d, site_natural_mean, 1.0, post_mean)      # V0^-1 m0 + X^T nu
    trsv(LOWER, NO_TRANS, d, post_cov, d, post_mean)
    trsv(LOWER, TRANS, d, post_cov, d, post_mean)                      # eq 47
    return potri(LOWER, d, post_cov, d)                               # eq 46


cdef int _prior_factor(const double* prior_cov, const double* prior_mean, int d,
                       double* prior_precision, double* prior_precision_mean,
                       double* log_det_prior, double* prior_quad) noexcept nogil:
    """V0^-1 (full, symmetric), V0^-1 m0, log|V0| and m0^T V0^-1 m0.  Returns potrf's info."""
    cdef int j, info
    cdef double acc = 0.0
    dcopy(d * d, prior_cov, 1, prior_precision, 1)
    info = potrf(LOWER, d, prior_precision, d)
    if info != 0:
        return info
    for j in range(d):
        acc += log(prior_precision[<Py_ssize_t>j * d + j])
    log_det_prior[0] = 2.0 * acc
    dcopy(d, prior_mean, 1, prior_precision_mean, 1)
    trsv(LOWER, NO_TRANS, d, prior_precision, d, prior_precision_mean)
    prior_quad[0] = ddot(d, prior_precision_mean, 1, prior_precision_mean, 1)
    info = potri(LOWER, d, prior_precision, d)
    if info != 0:
        return info
    symmetrize(LOWER, d, prior_precision, d)
    symv(LOWER, d, 1.0, prior_precision, d, prior_mean, 0.0, prior_precision_mean)
    return 0


cdef int _prior_and_refresh(const double* prior_cov, const double* prior_mean, int d,
                            const double* X, int n, const double* site_precision,
                            const double* site_natural_mean, double* prior_precision,
                            double* prior_precision_mean, double* post_cov, double* post_mean,
                            double* scratch, int scratch_rows, int* prior_info) noexcept nogil:
    """The prior's factors (``_prior_factor``), then the posterior from the sites
    (``refresh_lower``, eqs 46-47). Writes potrf's info for V0 to ``prior_info`` (nothing
    else is done if it is not 0) and returns ``refresh_lower``'s info."""
    cdef double log_det_prior = 0.0, prior_quad = 0.0
    prior_info[0] = _prior_factor(prior_cov, prior_mean, d, prior_precision, prior_precision_mean,
                                  &log_det_prior, &prior_quad)
    if prior_info[0] != 0:
        return 0
    return refresh_lower(X, n, d, site_precision, site_natural_mean, prior_precision,
                         prior_precision_mean, post_cov, post_mean, scratch, scratch_rows)


# --------------------------------------------------------------------------- #
# Python API
# --------------------------------------------------------------------------- #

def _check_finite(name, arr):
    a = np.asarray(arr)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite (contains NaN or inf)")


def _check_inputs(X, prior_mean, prior_cov, site_precision, site_natural_mean, post_mean,
                  post_cov, y=None):
    n, d = X.shape[0], X.shape[1]
    if d < 1:
        raise ValueError(f"X must have at least one column; got shape ({n}, {d})")
    if y is not None and y.shape[0] != n:
        raise ValueError(f"y must have length n = X.shape[0] = {n}; got {y.shape[0]}")
    if prior_mean.shape[0] != d:
        raise ValueError(f"prior_mean must have length d = X.shape[1] = {d}; got {prior_mean.shape[0]}")
    if prior_cov.shape[0] != d or prior_cov.shape[1] != d:
        raise ValueError(f"prior_cov must have shape ({d}, {d}); got "
                         f"({prior_cov.shape[0]}, {prior_cov.shape[1]})")
    if site_precision.shape[0] != n:
        raise ValueError(f"site_precision must have length n = {n}; got {site_precision.shape[0]}")
    if site_natural_mean.shape[0] != n:
        raise ValueError(f"site_natural_mean must have length n = {n}; got "
                         f"{site_natural_mean.shape[0]}")
    if post_mean.shape[0] != d:
        raise ValueError(f"post_mean must have length d = {d}; got {post_mean.shape[0]}")
    if post_cov.shape[0] != d or post_cov.shape[1] != d:
        raise ValueError(f"post_cov must have shape ({d}, {d}); got "
                         f"({post_cov.shape[0]}, {post_cov.shape[1]})")
    _check_finite("X", X)
    if y is not None:
        _check_finite("y", y)
    _check_finite("prior_mean", prior_mean)
    _check_finite("prior_cov", prior_cov)
    _check_finite("site_precision", site_precision)
    _check_finite("site_natural_mean", site_natural_mean)
    inputs = {"X": X, "prior_mean": prior_mean, "prior_cov": prior_cov}
    if y is not None:
        inputs["y"] = y
    outputs = {"site_precision": site_precision, "site_natural_mean": site_natural_mean,
               "post_mean": post_mean, "post_cov": post_cov}
    _check_no_aliasing(inputs, outputs)
    return n, d


def _prior_error(int info):
    return np.linalg.LinAlgError(
        f"prior_cov is not positive definite (leading minor of order {info} of its Cholesky "
        f"factorisation is not positive)")


def _precision_error(int info, where):
    return np.linalg.LinAlgError(
        f"posterior precision V0^-1 + X^T diag(site_precision) X is not positive definite "
        f"{where} (leading minor of order {info} of its Cholesky factorisation is not positive)")


def refresh_posterior(const double[:, ::1] X, const double[::1] prior_mean,
                      const double[:, ::1] prior_cov, const double[::1] site_precision,
                      const double[::1] site_natural_mean, double[::1] post_mean,
                      double[:, ::1] post_cov):
    """Recompute the posterior from the sites through the EP invariant.

    ``post_cov = (V0^-1 + X^T diag(tau) X)^-1`` (eq 46) and
    ``post_mean = post_cov (V0^-1 m0 + X^T nu)`` (eq 47), by Cholesky
    factorisations (BLAS-3).  ``post_cov`` is returned full and symmetric.

    Raises
    ------
    numpy.linalg.LinAlgError
        If ``prior_cov`` or the posterior precision is not positive definite.
    ValueError
        On shape mismatches, non-finite input or output arrays aliasing inputs.
    """
    cdef int n, d, info = 0, prior_info = 0
    n, d = _check_inputs(X, prior_mean, prior_cov, site_precision, site_natural_mean,
                         post_mean, post_cov)
    cdef double[:, ::1] prior_precision = np.empty((d, d))
    cdef double[::1] prior_precision_mean = np.empty(d)
    cdef int scratch_rows = _scratch_rows(n, d)
    cdef double[:, ::1] scratch = np.empty((scratch_rows, d))
    cdef const double* x_ptr = &X[0, 0] if n > 0 else NULL
    cdef const double* tau_ptr = &site_precision[0] if n > 0 else NULL
    cdef const double* nu_ptr = &site_natural_mean[0] if n > 0 else NULL
    with nogil:
        info = _prior_and_refresh(&prior_cov[0, 0], &prior_mean[0], d, x_ptr, n, tau_ptr, nu_ptr,
                                  &prior_precision[0, 0], &prior_precision_mean[0], &post_cov[0, 0],
                                  &post_mean[0], &scratch[0, 0], scratch_rows, &prior_info)
        if prior_info == 0 and info == 0:
            symmetrize(LOWER, d, &post_cov[0, 0], d)
    if prior_info != 0:
        raise _prior_error(prior_info)
    if info != 0:
        raise _precision_error(info, "in refresh_posterior")


def _auto_block_size(int d):
    if d < 128:
        return 16
    if d < 512:
        return 32
    return 64


cdef class LinearEPOptions(EngineOptions):
    """Options of the weight-space rank-1 engine (:class:`LinearEP`), checked once here
    (read-only).

    Parameters
    ----------
    update_form : {UPDATE_MOMENT, UPDATE_NATURAL}
        eqs 34-38 or eqs 39-45 (see module docstring); same fixed point.
    damping : float in (0, 1]
        Step in natural parameters (``1`` = no damping).
    tol : float >= 0
        Convergence threshold on the per-sweep relative site change.
    max_sweeps : int >= 0
        Maximum number of sweeps.
    refresh_every : int
        Recompute V, m from the sites every this many sweeps and after the last
        one; ``<= 0`` or ``> max_sweeps`` disables refreshing after sweeps.
    negative_precision : {NEGATIVE_CLIP, NEGATIVE_SKIP, NEGATIVE_ALLOW}
        Policy for negative site precisions (module docstring).
    algorithm : {ALGORITHM_AUTO, ALGORITHM_RANK1, ALGORITHM_BLOCKED}
        Per-site symv + syr, or delayed updates flushed as BLAS-3 (auto: blocked
        when ``d >= 32``).
    block_size : int >= 0
        Sites per block for ALGORITHM_BLOCKED (0 = automatic).

    Raises
    ------
    ValueError
        A field out of range (the message names it).
    """
    _FIELDS = ("update_form", "damping", "tol", "max_sweeps", "refresh_every", "negative_precision",
               "algorithm", "block_size")

    def __init__(self, *, int update_form=UPDATE_NATURAL, double damping=1.0, double tol=1e-8,
                 int max_sweeps=200, int refresh_every=1, int negative_precision=NEGATIVE_CLIP,
                 int algorithm=ALGORITHM_AUTO, int block_size=0):
        if update_form != UPDATE_MOMENT and update_form != UPDATE_NATURAL:
            raise ValueError(f"update_form must be UPDATE_MOMENT (0) or UPDATE_NATURAL (1); got {update_form}")
        self.set_sweep(damping, tol, max_sweeps, 0, False)
        self.set_negative_precision(negative_precision, None)
        if algorithm not in (ALGORITHM_AUTO, ALGORITHM_RANK1, ALGORITHM_BLOCKED):
            raise ValueError("algorithm must be ALGORITHM_AUTO (0), ALGORITHM_RANK1 (1) or "
                             f"ALGORITHM_BLOCKED (2); got {algorithm}")
        if block_size < 0:
            raise ValueError(f"block_size must be >= 0; got {block_size}")
        self.update_form, self.refresh_every = update_form, refresh_every
        self.algorithm, self.block_size = algorithm, block_size


_DEFAULT_OPTIONS = LinearEPOptions()


cdef class LinearEP:
    """Sequential rank-1 EP for a linear-Gaussian-prior model (Minka, *EP: a quick reference*,
    §1.1), bound to one design, its targets, prior and likelihood.

    Built once from validated inputs; :meth:`run` sweeps from given sites and returns a
    :class:`~fastep._epcore._common.SweepResult`; :meth:`log_evidence` gives the EP
    evidence of given sites (eqs 48-49).

    Parameters
    ----------
    X : (n, d) float64, C-contiguous
        Rows ``x_i`` of the factors ``t_i(w) = f_i(x_i^T w)``.
    y : (n,) float64
        Targets / labels handed to the site kernel.
    prior_mean, prior_cov : (d,), (d, d) float64
        Prior ``N(m0, V0)``; ``V0`` must be positive definite.
    spec : SiteSpec
        Likelihood (code and parameters) for ``site_moments``.
    options : LinearEPOptions, optional
        Update form, damping, convergence test, refresh and algorithm (default:
        ``LinearEPOptions()``).
    validate : bool, default True
        Check the inputs here and the site and output arrays at every call
        (ValueError naming the argument). ``False`` is the one path for callers that
        validated them already (the estimators).
    """

    def __init__(self, X, y, prior_mean, prior_cov, SiteSpec spec not None,
                 LinearEPOptions options=None, *, bint validate=True):
        if options is None:
            options = _DEFAULT_OPTIONS
        cdef int algorithm = options.algorithm, block_size = options.block_size
        cdef int n = X.shape[0], d = X.shape[1]
        if algorithm == ALGORITHM_AUTO:
            algorithm = ALGORITHM_RANK1 if d < 32 else ALGORITHM_BLOCKED
        if block_size == 0:
            block_size = _auto_block_size(d)
        if n > 0 and block_size > n:
            block_size = n
        if block_size < 1:
            block_size = 1
        self.X, self.y, self.prior_mean, self.prior_cov, self.spec = X, y, prior_mean, prior_cov, spec
        self.options = options
        self.sweep, self.update_form, self.refresh_every = options.sweep, options.update_form, options.refresh_every
        self.algorithm, self.block_size = algorithm, block_size
        self.validate = validate

    def run(self, double[::1] site_precision, double[::1] site_natural_mean, double[::1] post_mean,
            double[:, ::1] post_cov, *, object sweep_callback=None):
        """Sweep from the given sites to convergence (or ``max_sweeps``).

        Parameters
        ----------
        site_precision, site_natural_mean : (n,) float64, in/out
            Sites ``tau_i = 1/v_i`` and ``nu_i = m_i/v_i``. Zeros for a cold start; any
            valid state for a warm start. Updated in place.
        post_mean, post_cov : (d,), (d, d) float64, out
            Posterior mean and covariance; computed from the sites at the start (eqs
            46-47) and full symmetric on return.
        sweep_callback : callable, optional
            ``sweep_callback(sweep, max_change, nan)`` after every sweep that did not
            converge (with the GIL, between sweeps); returning ``False`` stops the sweeps
            (the posterior is refreshed from the current sites; ``stopped`` is True), an
            exception it raises is re-raised.

        Returns
        -------
        SweepResult
            ``log_z`` is NaN (:meth:`log_evidence` computes it); ``n_skipped`` includes the
            failed updates; ``diagnostics`` holds ``n_skipped_last_sweep``,
            ``n_clipped_last_sweep`` and ``n_failed_last_sweep``.

        Raises
        ------
        numpy.linalg.LinAlgError
            ``prior_cov`` or the posterior precision (at the start or at a refresh) is not
            positive definite.
        ValueError
            (``validate=True``) bad shapes, non-finite input, aliasing outputs.
        """
        if self.validate:
            _check_inputs(self.X, self.prior_mean, self.prior_cov, site_precision, site_natural_mean,
                          post_mean, post_cov, y=self.y)
        cdef const double[:, ::1] X = self.X
        cdef const double[::1] y = self.y
        cdef const double[::1] prior_mean = self.prior_mean
        cdef const double[:, ::1] prior_cov = self.prior_cov
        cdef int n = X.shape[0], d = X.shape[1]
        cdef int algorithm = self.algorithm, block_size = self.block_size, max_sweeps = self.sweep.max_sweeps
        cdef int refresh_every = self.refresh_every
        cdef SiteUpdateOptions opts
        opts.update_form = self.update_form
        opts.damping = self.sweep.damping
        opts.negative_precision = self.sweep.negative_precision
        cdef bint refreshing = refresh_every > 0 and refresh_every <= max_sweeps

        cdef double[:, ::1] prior_precision = np.empty((d, d))
        cdef double[::1] prior_precision_mean = np.empty(d)
        cdef int scratch_rows = _scratch_rows(n, d)
        cdef double[:, ::1] scratch = np.empty((scratch_rows, d))
        cdef int block_rows = block_size if algorithm == ALGORITHM_BLOCKED else 1
        cdef double[:, ::1] cross = np.empty((block_rows, d))
        cdef double[:, ::1] scaled = np.empty((block_rows, d))
        cdef double[::1] small = np.empty(block_rows)
        cdef const double* x_ptr = &X[0, 0] if n > 0 else NULL
        cdef const double* y_ptr = &y[0] if n > 0 else NULL
        cdef double* tau_ptr = &site_precision[0] if n > 0 else NULL
        cdef double* nu_ptr = &site_natural_mean[0] if n > 0 else NULL
        cdef const SiteModel* model = &self.spec.model
        cdef SweepDriver driver = SweepDriver(self.sweep.tol, max_sweeps, sweep_callback, 2.0 * d * d)
        cdef SweepStats* stats = driver.begin_sweep()
        cdef int prior_info = 0, info = 0, failed_sweep = -1, sweep = 0
        cdef bint refreshed_last = True

        with nogil:
            info = _prior_and_refresh(&prior_cov[0, 0], &prior_mean[0], d, x_ptr, n, tau_ptr, nu_ptr,
                                      &prior_precision[0, 0], &prior_precision_mean[0], &post_cov[0, 0],
                                      &post_mean[0], &scratch[0, 0], scratch_rows, &prior_info)
            if prior_info == 0:
                if info == 0:
                    for sweep in range(1, max_sweeps + 1):
                        if algorithm == ALGORITHM_BLOCKED:
                            sweep_blocked(model, x_ptr, y_ptr, n, d, tau_ptr, nu_ptr, &post_cov[0, 0],
                                          &post_mean[0], block_size, &cross[0, 0], &scaled[0, 0],
                                          &small[0], &opts, stats)
                        else:
                            sweep_rank1(model, x_ptr, y_ptr, n, d, tau_ptr, nu_ptr, &post_cov[0, 0],
                                        &post_mean[0], &cross[0, 0], &opts, stats)
                        if driver.interrupted():
                            break               # Ctrl-C: re-raised below
                        driver.record_sweep(sweep)
                        driver.test_sites()
                        refreshed_last = False
                        if not driver.converged:
                            driver.notify(sweep)
                        if refreshing and (sweep % refresh_every == 0 or driver.converged or driver.stopped
                                           or sweep == max_sweeps):
                            info = refresh_lower(x_ptr, n, d, tau_ptr, nu_ptr, &prior_precision[0, 0],
                                                 &prior_precision_mean[0], &post_cov[0, 0],
                                                 &post_mean[0], &scratch[0, 0], scratch_rows)
                            refreshed_last = True
                            if info != 0:
                                failed_sweep = sweep
                                break
                        if driver.converged or driver.stopped:
                            break
                if info == 0:
                    symmetrize(LOWER, d, &post_cov[0, 0], d)
        driver.raise_pending()
        if prior_info != 0:
            raise _prior_error(prior_info)
        if info != 0:
            where = "for the initial sites" if failed_sweep < 0 else f"after sweep {failed_sweep}"
            raise _precision_error(info, where)
        return driver.result(has_log_z=False, diagnostics={"n_skipped_last_sweep": int(stats.n_skipped),
                                          "n_clipped_last_sweep": int(stats.n_clipped),
                                          "n_failed_last_sweep": int(stats.n_failed)})

    def log_evidence(self, const double[::1] site_precision, const double[::1] site_natural_mean,
                     const double[::1] post_mean, const double[:, ::1] post_cov):
        """EP approximation of the log marginal likelihood of the given sites, eqs 48-49 regrouped.

        With each site's cavity ``(h_i, lambda_i)`` at the given state (eqs 25, 29) and
        ``log Z_i`` from the site kernel, the sites are scaled so that
        ``∫ t~_i(f) N(f; h_i, lambda_i) df = Z_i``; integrating the prior times all sites
        gives

            log Z_EP = 1/2 log(|V| / |V0|) + 1/2 (m^T V^-1 m - m0^T V0^-1 m0)
                       + sum_i [ log Z_i + 1/2 log(1 + lambda_i tau_i)
                                 - 1/2 (2 h_i nu_i + lambda_i nu_i^2 - h_i^2 tau_i) / (1 + lambda_i tau_i) ]

        which equals eqs 48-49 (with ``s_i`` from eqs 32/33 at convergence, eq 15 in
        general) when every ``tau_i > 0`` and stays finite for ``tau_i = 0``. ``|V|`` and
        ``m^T V^-1 m = b^T (V^-1)^-1 b`` with ``b = V0^-1 m0 + X^T nu`` come from a Cholesky
        factorisation of ``V^-1`` (eq 46) built from the sites; the cavities use
        ``post_mean``/``post_cov``, which must be the posterior of these sites (as left by
        :meth:`run` or :func:`refresh_posterior`). The ``n`` cavity variances
        ``diag(X V X^T)`` are computed blockwise with ``symm``.

        Parameters
        ----------
        site_precision, site_natural_mean : (n,) float64
            The sites.
        post_mean, post_cov : (d,), (d, d) float64
            Their posterior.

        Returns
        -------
        float

        Raises
        ------
        numpy.linalg.LinAlgError
            ``prior_cov`` or the posterior precision is not positive definite.
        ValueError
            (``validate=True``) bad shapes or non-finite input; always: a site with an
            improper cavity or for which the site kernel fails (the sites are then not a
            valid EP state), or a non-finite result.
        """
        if self.validate:
            _check_inputs(self.X, self.prior_mean, self.prior_cov, site_precision, site_natural_mean,
                          post_mean, post_cov, y=self.y)
        cdef const double[:, ::1] X = self.X
        cdef const double[::1] y = self.y
        cdef const double[::1] prior_mean = self.prior_mean
        cdef const double[:, ::1] prior_cov = self.prior_cov
        cdef SiteSpec spec = self.spec
        cdef int n = X.shape[0], d = X.shape[1]
        cdef double[:, ::1] prior_precision = np.empty((d, d))
        cdef double[::1] prior_precision_mean = np.empty(d)
        cdef double[:, ::1] chol = np.empty((d, d))
        cdef double[::1] rhs = np.empty(d)
        cdef int scratch_rows = _scratch_rows(n, d)
        cdef double[:, ::1] scratch = np.empty((scratch_rows, d))
        cdef const double* x_ptr = &X[0, 0] if n > 0 else NULL
        cdef const double* tau_ptr = &site_precision[0] if n > 0 else NULL
        cdef const double* nu_ptr = &site_natural_mean[0] if n > 0 else NULL
        cdef const SiteModel* model = &spec.model
        cdef int prior_info = 0, info = 0, bad_site = -1, bad_kind = 0, j, b0, kk, t, i
        cdef double log_det_prior = 0.0, prior_quad = 0.0, log_det_post = 0.0, post_quad
        cdef double total = 0.0, s, h, tau, nu, denom, lam, h_cav, one_plus, log_z, alpha, beta

        with nogil:
            prior_info = _prior_factor(&prior_cov[0, 0], &prior_mean[0], d, &prior_precision[0, 0],
                                       &prior_precision_mean[0], &log_det_prior, &prior_quad)
            if prior_info == 0:
                info = posterior_precision_cholesky(x_ptr, n, d, tau_ptr, &prior_precision[0, 0],
                                                    &chol[0, 0], &scratch[0, 0], scratch_rows)
            if prior_info == 0 and info == 0:
                for j in range(d):
                    log_det_post -= 2.0 * log(chol[j, j])                 # log|V| = -log|V^-1|
                dcopy(d, &prior_precision_mean[0], 1, &rhs[0], 1)
                gemv_t(n, d, 1.0, x_ptr, d, nu_ptr, 1.0, &rhs[0])      # V^-1 m (eq 47)
                trsv(LOWER, NO_TRANS, d, &chol[0, 0], d, &rhs[0])
                post_quad = ddot(d, &rhs[0], 1, &rhs[0], 1)            # m^T V^-1 m
                total = 0.5 * (log_det_post - log_det_prior) + 0.5 * (post_quad - prior_quad)
                b0 = 0
                while b0 < n and bad_site < 0:
                    kk = scratch_rows if n - b0 > scratch_rows else n - b0
                    symm_right(LOWER, kk, d, 1.0, &post_cov[0, 0], d, x_ptr + <Py_ssize_t>b0 * d, d,
                               0.0, &scratch[0, 0], d)
                    for t in range(kk):
                        i = b0 + t
                        s = ddot(d, &scratch[t, 0], 1, x_ptr + <Py_ssize_t>i * d, 1)
                        h = ddot(d, &post_mean[0], 1, x_ptr + <Py_ssize_t>i * d, 1)
                        tau = tau_ptr[i]
                        nu = nu_ptr[i]
                        denom = 1.0 - tau * s
                        if not (denom > 0.0 and s >= 0.0):
                            bad_site = i
                            bad_kind = 1
                            break
                        lam = s / denom                                   # eq 25
                        h_cav = h + lam * (tau * h - nu)                  # eq 29
                        if site_moments(model, y[i], h_cav, lam, &log_z, &alpha, &beta) != 0 \
                                or not isfinite(log_z):
                            bad_site = i
                            bad_kind = 2
                            break
                        one_plus = 1.0 + lam * tau
                        total += (log_z + 0.5 * log(one_plus)
                                  - 0.5 * (2.0 * h_cav * nu + lam * nu * nu - h_cav * h_cav * tau) / one_plus)
                    b0 += kk
        if prior_info != 0:
            raise _prior_error(prior_info)
        if info != 0:
            raise _precision_error(info, "in log_evidence")
        if bad_site >= 0:
            if bad_kind == 1:
                raise ValueError(f"site {bad_site} has an improper cavity "
                                 f"(1 - site_precision[i] x_i^T V x_i <= 0); not a valid EP state")
            raise ValueError(f"site kernel failed for site {bad_site} at its cavity; log evidence undefined")
        if not isfinite(total):
            raise ValueError("log evidence is not finite")
        return float(total)
