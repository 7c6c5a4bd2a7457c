# cython: language_level=3
"""Nested EP for the multinomial probit likelihood: the site kernel and the engine of multiclass GP EP.

Riihimäki, Jylänki & Vehtari, "Nested expectation propagation for Gaussian process
classification with a multinomial probit likelihood" (JMLR 14, 2013), §3 (the inner EP of one
site) and §4 (the outer EP over all sites).

Likelihood of class ``k`` for the c latent values ``f`` at one input (eq. 5):

    p(y = k | f) = ∫ N(u; 0, 1) Π_{j≠k} Φ(u + f_k - f_j) du,

i.e. a product of c - 1 probit factors ``Φ(w_jᵀ z)`` of the augmented vector ``z = (f, u)``,
``w_j = e_k - e_j + e_u``, under the prior ``N(u; 0, 1)``. The tilted distribution of an outer
EP site, ``N(f; cavity) p(y | f)``, is approximated by an *inner* EP over those factors in the
c + 1 dimensions of z: each factor gets a 1-D Gaussian site ``exp(-α̃_j x²/2 + β̃_j x)`` in
``x = w_jᵀ z`` (the probit site of :mod:`fastep._epcore.sites`, slope 1, y = +1), updated by
rank-1 steps of the (c+1)×(c+1) inner posterior. Integrating u out of the inner sites gives the
outer site on f (eqs 13-15 of the paper):

    T̃ = D - D 1 1ᵀ D / (1ᵀ D 1),   D = diag(π),   π_j = α̃_j (j ≠ k),  π_k = 1,
    ν̃ = π (Σ_j β̃_j) / (1ᵀ π) - β̃           (β̃_k = 0),

so the outer site is determined by the 2(c - 1) inner site parameters, which persist between
outer iterations: every outer update runs ``n_inner_sweeps`` inner sweeps warm-started from
them (the paper's nested scheme; one sweep suffices for convergence of the outer iteration).

The tilted normaliser is the inner EP's evidence,

    log Ẑ = log ∫ N(z; z₀, Q₀) Π_j t̃_j(w_jᵀ z) dz
            + Σ_j [log Ẑ_j + Ψ(1/v_j - α̃_j, m_j/v_j - β̃_j) - Ψ(1/v_j, m_j/v_j)],

``Q₀ = blkdiag(cavity covariance, 1)``, ``(m_j, v_j)`` the inner marginal of x_j,
``Ψ(τ, ν) = ½ log 2π - ½ log τ + ν²/(2τ)``. For c = 2 the inner EP is exact (one probit factor).

The outer iteration (§4) is parallel EP: every site is updated from one posterior by one damped
inner sweep, then the posterior of the new outer sites is formed, with its cavities and the
evidence. How the posterior is formed depends on the prior (the dense GP's eqs 16-20 in
:mod:`fastep._dense.multiclass`), so :class:`MultinomialEP` takes it as a callable and runs
everything else: the site kernel over all sites (without the GIL), the adaptive damping, and the
convergence test, callback, interrupt polling and site restore of the shared sweep driver
(:class:`~fastep._epcore._common.SweepDriver`).

Python API: :class:`InnerEP` (the site kernel over a set of sites, with its constants),
:func:`outer_sites` (eqs 13-15), :class:`MultinomialEP` (the engine: the outer iteration;
:meth:`MultinomialEP.run` returns a :class:`MultinomialResult`), :func:`nested_log_probabilities`
(class probabilities of Gaussian latent predictives by inner EP run to convergence). The
plain-numpy twin is :mod:`fastep.reference.multiclass_ep`.
"""
import numpy as np

from libc.math cimport sqrt, log, fabs, isfinite, INFINITY, NAN
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from fastep._epcore._blas cimport potrf, potri, symmetrize, UPPER, LOWER, NO_TRANS, TRANS, LEFT, RIGHT
from fastep._epcore.sites cimport SiteModel, site_moments, SITE_OK, LIK_PROBIT
from fastep._epcore._common cimport SweepDriver, SweepResult

cdef double _LOG_2PI = 1.8378770664093454836

cdef enum NestedStatus:
    NESTED_OK = 0
    NESTED_IMPROPER_CAVITY = 1      # the cavity precision is not positive definite (site unchanged)
    NESTED_FAILED = 2               # the inner EP failed (site unchanged)

globals().update(NESTED_OK=int(NESTED_OK), NESTED_IMPROPER_CAVITY=int(NESTED_IMPROPER_CAVITY),
                 NESTED_FAILED=int(NESTED_FAILED))

#: Factor on the damping after an outer iteration whose largest site change grew (adaptive damping).
DAMPING_SHRINK = 0.7
#: Smallest damping of adaptive damping.
MIN_DAMPING = 0.25
cdef double _DAMPING_SHRINK = DAMPING_SHRINK
cdef double _MIN_DAMPING = MIN_DAMPING


cdef int _inner_posterior(int c, int label, const double* cav_prec, const double* cav_lin,
                          const double* alpha_s, const double* beta_s, double* cov, double* mean,
                          double* lin, double* log_det_cov) noexcept nogil:
    """Inner posterior ``N(z; mean, cov)`` of the inner sites: precision blkdiag(Λ, 1) + Σ α̃_j w_j w_jᵀ.

    ``lin`` receives the precision-times-mean vector. Returns 0 or potrf's info.
    """
    cdef int dim = c + 1, u = c, i, j, info
    cdef double a, s
    for i in range(dim):
        for j in range(dim):
            cov[i * dim + j] = 0.0
    for i in range(c):
        for j in range(c):
            cov[i * dim + j] = cav_prec[i * c + j]
        lin[i] = cav_lin[i]
    cov[u * dim + u] = 1.0
    lin[u] = 0.0
    for j in range(c):
        if j == label:
            continue
        a = alpha_s[j]
        cov[label * dim + label] += a
        cov[j * dim + j] += a
        cov[u * dim + u] += a
        cov[label * dim + j] -= a
        cov[j * dim + label] -= a
        cov[label * dim + u] += a
        cov[u * dim + label] += a
        cov[j * dim + u] -= a
        cov[u * dim + j] -= a
        lin[label] += beta_s[j]
        lin[j] -= beta_s[j]
        lin[u] += beta_s[j]
    info = potrf(LOWER, dim, cov, dim)
    if info != 0:
        return info
    log_det_cov[0] = 0.0
    for i in range(dim):
        log_det_cov[0] -= 2.0 * log(cov[i * dim + i])
    info = potri(LOWER, dim, cov, dim)
    if info != 0:
        return info
    symmetrize(LOWER, dim, cov, dim)
    for i in range(dim):
        s = 0.0
        for j in range(dim):
            s += cov[i * dim + j] * lin[j]
        mean[i] = s
    return 0


cdef inline void _projection(int dim, int label, int j, const double* cov, const double* mean,
                             double* v, double* m) noexcept nogil:
    """``v = w_jᵀ cov w_j`` and ``m = w_jᵀ mean`` for ``w_j = e_label - e_j + e_u``."""
    cdef int u = dim - 1
    v[0] = (cov[label * dim + label] + cov[j * dim + j] + cov[u * dim + u]
            - 2.0 * cov[label * dim + j] + 2.0 * cov[label * dim + u] - 2.0 * cov[j * dim + u])
    m[0] = mean[label] - mean[j] + mean[u]


cdef int nested_site(const NestedSiteOptions* opts, int label, const double* cav_prec,
                     const double* cav_lin, double* alpha_s, double* beta_s, double* log_z,
                     double* work) noexcept nogil:
    """Inner EP for one outer site (module docstring), from the stored inner sites.

    ``cav_prec`` (c×c) and ``cav_lin`` (c) are the cavity's natural parameters; ``alpha_s``,
    ``beta_s`` (c; entry ``label`` unused, kept 0) the inner sites, updated in place (damped by
    ``opts.damping``) over at most ``opts.n_inner_sweeps`` sweeps, stopping early once the
    largest change of a sweep is below ``opts.tol``. ``log_z`` receives the inner evidence at the
    final sites. ``work`` holds ``nested_work_size(c)`` doubles. Returns a NESTED_* status.
    """
    cdef int c = opts.n_classes, max_sweeps = opts.n_inner_sweeps
    cdef double tol = opts.tol, damping = opts.damping
    cdef int dim = c + 1, i, j, l, sweep
    cdef double* cov = work
    cdef double* mean = work + dim * dim
    cdef double* lin = mean + dim
    cdef double* col = lin + dim
    cdef double* chol = col + dim                 # c×c
    cdef double log_det_cov = 0.0, log_det_prec_c = 0.0, quad_c = 0.0
    cdef double v, m, tau_c, nu_c, v_c, m_c, lz, a, b, one_minus, tau_t, nu_t, tau_new, nu_new
    cdef double d_tau, d_nu, denom, coef, shift, change, max_change, total
    cdef double probit_params[2]
    cdef SiteModel probit
    probit_params[0] = 1.0
    probit_params[1] = 0.0
    probit.code = LIK_PROBIT
    probit.params = probit_params
    probit.n_params = 2
    probit.gh_nodes = NULL
    probit.gh_log_weights = NULL
    probit.n_nodes = 0
    # the cavity must be proper: Cholesky of Λ, and log|Λ|, ηᵀΛ⁻¹η for the evidence
    for i in range(c * c):
        chol[i] = cav_prec[i]
    if potrf(LOWER, c, chol, c) != 0:
        return NESTED_IMPROPER_CAVITY
    for i in range(c):
        log_det_prec_c += 2.0 * log(chol[i * c + i])
    for i in range(c):                            # forward solve L x = η into col
        total = cav_lin[i]
        for j in range(i):
            total -= chol[i * c + j] * col[j]
        col[i] = total / chol[i * c + i]
    for i in range(c):
        quad_c += col[i] * col[i]
    if _inner_posterior(c, label, cav_prec, cav_lin, alpha_s, beta_s, cov, mean, lin, &log_det_cov) != 0:
        return NESTED_FAILED
    for sweep in range(max_sweeps):
        max_change = 0.0
        for j in range(c):
            if j == label:
                continue
            _projection(dim, label, j, cov, mean, &v, &m)
            tau_c = 1.0 / v - alpha_s[j]
            if not (tau_c > 0.0 and isfinite(tau_c)):
                return NESTED_FAILED
            v_c = 1.0 / tau_c
            m_c = v_c * (m / v - beta_s[j])
            if site_moments(&probit, 1.0, m_c, v_c, &lz, &a, &b) != SITE_OK:
                return NESTED_FAILED
            one_minus = 1.0 - v_c * b
            if not one_minus > 0.0:
                return NESTED_FAILED
            tau_t = b / one_minus
            nu_t = (a + b * m_c) / one_minus
            tau_new = alpha_s[j] + damping * (tau_t - alpha_s[j])
            nu_new = beta_s[j] + damping * (nu_t - beta_s[j])
            d_tau = tau_new - alpha_s[j]
            d_nu = nu_new - beta_s[j]
            change = fabs(d_tau) / (fabs(alpha_s[j]) if fabs(alpha_s[j]) > 1.0 else 1.0)
            if change > max_change:
                max_change = change
            change = fabs(d_nu) / (fabs(beta_s[j]) if fabs(beta_s[j]) > 1.0 else 1.0)
            if change > max_change:
                max_change = change
            alpha_s[j] = tau_new
            beta_s[j] = nu_new
            # rank-1 update of the inner posterior along w_j
            denom = 1.0 + d_tau * v
            for i in range(dim):
                col[i] = cov[i * dim + label] - cov[i * dim + j] + cov[i * dim + c]
            coef = d_tau / denom
            shift = (d_nu - d_tau * m) / denom
            for i in range(dim):
                mean[i] += shift * col[i]
                for l in range(dim):
                    cov[i * dim + l] -= coef * col[i] * col[l]
        if max_change < tol:
            break
    # evidence from a fresh posterior of the final inner sites
    if _inner_posterior(c, label, cav_prec, cav_lin, alpha_s, beta_s, cov, mean, lin, &log_det_cov) != 0:
        return NESTED_FAILED
    total = 0.5 * log_det_cov + 0.5 * log_det_prec_c - 0.5 * quad_c
    for i in range(dim):
        total += 0.5 * mean[i] * lin[i]
    for j in range(c):
        if j == label:
            continue
        _projection(dim, label, j, cov, mean, &v, &m)
        tau_c = 1.0 / v - alpha_s[j]
        nu_c = m / v - beta_s[j]
        if not tau_c > 0.0:
            return NESTED_FAILED
        if site_moments(&probit, 1.0, nu_c / tau_c, 1.0 / tau_c, &lz, &a, &b) != SITE_OK:
            return NESTED_FAILED
        total += lz - 0.5 * log(tau_c * v) + 0.5 * nu_c * nu_c / tau_c - 0.5 * m * m / v
    log_z[0] = total
    if not isfinite(total):
        return NESTED_FAILED
    return NESTED_OK


cdef int _update_sites(const NestedSiteOptions* opts, Py_ssize_t n, const int* labels, const double* cav_prec,
                       const double* cav_lin, double* alpha, double* beta, double* log_z, int* status,
                       double* work) noexcept nogil:
    """:func:`nested_site` at the n sites (rows of the C-contiguous arrays); a site whose inner EP
    fails keeps its inner sites and gets ``log_z`` NaN. ``work`` holds
    ``nested_work_size(c) + 2 c`` doubles. Returns the number of failed sites."""
    cdef Py_ssize_t c = opts.n_classes, i, j
    cdef int n_failed = 0
    cdef double* saved_alpha = work + nested_work_size(c)
    cdef double* saved_beta = saved_alpha + c
    for i in range(n):
        for j in range(c):
            saved_alpha[j] = alpha[i * c + j]
            saved_beta[j] = beta[i * c + j]
        status[i] = nested_site(opts, labels[i], cav_prec + i * c * c, cav_lin + i * c, alpha + i * c,
                                beta + i * c, log_z + i, work)
        if status[i] != NESTED_OK:
            for j in range(c):
                alpha[i * c + j] = saved_alpha[j]
                beta[i * c + j] = saved_beta[j]
            log_z[i] = NAN
            n_failed += 1
    return n_failed


cdef double _largest_change(Py_ssize_t count, const double* old, const double* new) noexcept nogil:
    """``max_k |new_k - old_k| / max(1, |old_k|)`` over ``count`` entries; NaN if one is NaN."""
    cdef Py_ssize_t k
    cdef double scale, change, largest = 0.0
    for k in range(count):
        scale = fabs(old[k])
        change = fabs(new[k] - old[k]) / (scale if scale > 1.0 else 1.0)
        if change != change:
            return change
        if change > largest:
            largest = change
    return largest


cdef double* _work_buffer(int c) except NULL:
    cdef double* work = <double*>malloc((nested_work_size(c) + 2 * c) * sizeof(double))
    if work == NULL:
        raise MemoryError()
    return work


def _check_sites(labels, cavity_precision, cavity_natural_mean, inner_precision, inner_natural_mean):
    n, c = cavity_natural_mean.shape
    if c < 2:
        raise ValueError(f"the multinomial probit needs >= 2 classes, got {c}")
    if cavity_precision.shape != (n, c, c):
        raise ValueError(f"cavity_precision must have shape {(n, c, c)}, got {cavity_precision.shape}")
    for name, arr in (("inner_precision", inner_precision), ("inner_natural_mean", inner_natural_mean)):
        if arr.shape != (n, c):
            raise ValueError(f"{name} must have shape {(n, c)}, got {arr.shape}")
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape {(n,)}, got {labels.shape}")
    if np.any((labels < 0) | (labels >= c)):
        raise ValueError(f"labels must be in 0..{c - 1}")
    return n, c


cdef class InnerEP:
    """The site kernel of nested EP: inner EP at a set of outer sites, from their cavities.

    Holds the constants of one kind of update (inner sweeps, damping, tolerance); :meth:`update`
    runs the inner EP of Riihimäki, Jylänki & Vehtari, "Nested expectation propagation for
    Gaussian process classification with a multinomial probit likelihood" (2013), §3, at every
    site given (module docstring), without the GIL. The outer iteration of :class:`MultinomialEP`,
    the joint sparse model and its minibatch learner all update their sites with it.

    Parameters
    ----------
    n_inner_sweeps : int >= 0, default 1
        Inner sweeps per site (at most, with ``tol`` > 0); 0 only evaluates the tilted
        normalisers ``log Ẑ`` at the given inner sites.
    damping : float in (0, 1], default 1
        Fraction of every inner site change applied.
    tol : float >= 0, default 0
        Stop a site's inner sweeps once the largest relative change of a sweep is below it.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore.multiclass_ep import InnerEP
    >>> labels = np.array([0, 2], dtype=np.int32)
    >>> cavity_precision = np.stack([np.eye(3), 2.0 * np.eye(3)])
    >>> cavity_natural_mean = np.zeros((2, 3))
    >>> alpha, beta = np.zeros((2, 3)), np.zeros((2, 3))
    >>> log_z, status = InnerEP(n_inner_sweeps=20, tol=1e-10).update(
    ...     labels, cavity_precision, cavity_natural_mean, alpha, beta)
    >>> bool(abs(np.exp(log_z[0]) - 1 / 3) < 0.01), status.tolist()
    (True, [0, 0])
    """

    def __init__(self, *, int n_inner_sweeps=1, double damping=1.0, double tol=0.0):
        if n_inner_sweeps < 0 or not (0.0 < damping <= 1.0) or not tol >= 0:
            raise ValueError("n_inner_sweeps must be >= 0, damping in (0, 1] and tol >= 0")
        self.options.n_classes = 0
        self.options.n_inner_sweeps = n_inner_sweeps
        self.options.damping = damping
        self.options.tol = tol

    @property
    def n_inner_sweeps(self):
        """Inner sweeps per site (at most)."""
        return self.options.n_inner_sweeps

    @property
    def damping(self):
        """Fraction of every inner site change applied."""
        return self.options.damping

    @property
    def tol(self):
        """Threshold of a site's early stop."""
        return self.options.tol

    def __repr__(self):
        return (f"InnerEP(n_inner_sweeps={self.options.n_inner_sweeps}, damping={self.options.damping!r}, "
                f"tol={self.options.tol!r})")

    def update(self, const int[::1] labels, const double[:, :, ::1] cavity_precision,
               const double[:, ::1] cavity_natural_mean, double[:, ::1] inner_precision,
               double[:, ::1] inner_natural_mean):
        """Inner EP at every site from its cavity; the inner sites are updated in place.

        Parameters
        ----------
        labels : int32 ndarray (n,)
            Class of every site, 0..c-1.
        cavity_precision : ndarray (n, c, c)
            Cavity precision matrices (must be positive definite where the site is updated).
        cavity_natural_mean : ndarray (n, c)
            Cavity precision-times-mean vectors.
        inner_precision, inner_natural_mean : ndarray (n, c)
            The inner sites ``α̃``, ``β̃`` (column ``labels[i]`` unused, 0), updated in place; a
            site whose inner EP fails keeps its values.

        Returns
        -------
        log_z : ndarray (n,)
            The tilted normalisers ``log Ẑ`` (NaN where the site failed).
        status : int32 ndarray (n,)
            NESTED_OK, NESTED_IMPROPER_CAVITY (site left unchanged) or NESTED_FAILED (likewise).
        """
        n, c = _check_sites(np.asarray(labels), np.asarray(cavity_precision), np.asarray(cavity_natural_mean),
                            np.asarray(inner_precision), np.asarray(inner_natural_mean))
        log_z = np.full(n, np.nan)
        status = np.zeros(n, dtype=np.int32)
        if n == 0:
            return log_z, status
        cdef double[::1] lz = log_z
        cdef int[::1] st = status
        cdef NestedSiteOptions opts = self.options
        opts.n_classes = c
        cdef double* work = _work_buffer(opts.n_classes)
        try:
            with nogil:
                _update_sites(&opts, lz.shape[0], &labels[0], &cavity_precision[0, 0, 0],
                              &cavity_natural_mean[0, 0], &inner_precision[0, 0], &inner_natural_mean[0, 0],
                              &lz[0], &st[0], work)
        finally:
            free(work)
        return log_z, status


def outer_sites(labels, inner_precision, inner_natural_mean):
    """The outer sites ``(π, ν̃)`` of inner sites (eqs 13-15 of the paper; module docstring).

    Parameters
    ----------
    labels : int ndarray (n,)
        Class of every site, 0..c-1.
    inner_precision, inner_natural_mean : ndarray (n, c)
        The inner sites ``α̃``, ``β̃`` (column ``labels[i]`` unused, 0).

    Returns
    -------
    pi : ndarray (n, c)
        ``π``: ``α̃`` with 1 in the label's column; the outer site precision is
        ``T̃_i = diag(π_i) - π_i π_iᵀ / (1ᵀ π_i)``.
    nu : ndarray (n, c)
        ``ν̃ = π (Σ_j β̃_j) / (1ᵀ π) - β̃``.
    """
    pi = np.array(inner_precision, dtype=np.float64)
    pi[np.arange(labels.size), labels] = 1.0
    total = inner_natural_mean.sum(axis=1)
    nu = pi * (total / pi.sum(axis=1))[:, None] - inner_natural_mean
    return pi, nu


cdef class MultinomialResult(SweepResult):
    """What one run of :class:`MultinomialEP` reports: the fields of
    :class:`~fastep._epcore._common.SweepResult` (``n_sweeps`` counts outer iterations;
    ``n_failed`` the sites whose inner EP or evidence term failed in the last one) and the outer
    sites of the returned inner sites.

    Parameters
    ----------
    result : SweepResult, optional
        The SweepResult fields (the sweep driver's result of the run).
    outer_precision, outer_natural_mean : ndarray (n, c), optional
        The outer sites.
    final_damping : float, optional
        The damping of the last outer iteration.

    Attributes
    ----------
    outer_precision : ndarray (n, c)
        ``π`` of the returned sites (:func:`outer_sites`).
    outer_natural_mean : ndarray (n, c)
        ``ν̃`` of the returned sites.
    final_damping : float
        The damping of the last outer iteration (below the engine's ``damping`` after adaptive
        damping shrank it).

    Equality and :meth:`as_dict` cover the SweepResult fields and ``final_damping``.
    """
    _EXTRA = ("outer_precision", "outer_natural_mean", "final_damping")

    def __init__(self, SweepResult result=None, outer_precision=None, outer_natural_mean=None,
                 double final_damping=NAN):
        self.copy_common(SweepResult() if result is None else result)
        self.outer_precision = outer_precision
        self.outer_natural_mean = outer_natural_mean
        self.final_damping = final_damping

    def replace(self, **changes):
        """A copy with the given fields changed (as :func:`dataclasses.replace`)."""
        extra = {name: changes.pop(name) if name in changes else getattr(self, name) for name in self._EXTRA}
        return MultinomialResult(self.common().replace(**changes), **extra)

    def as_dict(self):
        """The SweepResult fields and ``final_damping`` as a plain dict (for logging and JSON)."""
        out = self.common().as_dict()
        out["final_damping"] = self.final_damping
        return out

    def __eq__(self, other):
        if isinstance(other, MultinomialResult) and not (
                self.final_damping == other.final_damping
                or (self.final_damping != self.final_damping and other.final_damping != other.final_damping)):
            return False
        return SweepResult.__eq__(self, other)

    def __reduce__(self):
        return (MultinomialResult, (self.common(), self.outer_precision, self.outer_natural_mean,
                                 self.final_damping))

    def __repr__(self):
        return (f"MultinomialResult(n_sweeps={self.n_sweeps}, converged={bool(self.converged)}, "
                f"log_z={self.log_z!r}, max_change={self.max_change!r}, final_damping={self.final_damping!r})")


cdef class MultinomialEP:
    """Nested EP's outer iteration for the multinomial probit (Riihimäki, Jylänki & Vehtari,
    "Nested expectation propagation for Gaussian process classification with a multinomial
    probit likelihood", 2013, §4): damped parallel EP over all outer sites.

    Built once from validated inputs; :meth:`run` iterates from given inner sites, updating them
    in place, and returns a :class:`MultinomialResult`. Every iteration updates all sites from one
    posterior by one damped inner sweep each (:class:`InnerEP`, without the GIL), forms the
    posterior of the new outer sites (:func:`outer_sites`) by ``posterior_of``, and evaluates
    the EP evidence there; the shared :class:`~fastep._epcore._common.SweepDriver` tests
    convergence, calls the callback and polls for interrupts.

    Parameters
    ----------
    posterior_of : callable
        ``posterior_of(pi, nu)`` returns the posterior of the outer sites ``(π, ν̃)`` (each
        (n, c)): an object with the cavities ``cavity_precision`` (n, c, c) and
        ``cavity_natural_mean`` (n, c) (C-contiguous float64) and a method
        ``log_evidence(log_tilted)`` that returns ``(log Z, number of failed sites)`` given the
        sites' tilted normalisers (n; NaN where the inner EP failed). It may raise
        :class:`numpy.linalg.LinAlgError`. :func:`fastep._dense.multiclass.dense_posterior_of`
        is the dense GP's (eqs 16-20).
    labels : int32 ndarray (n,), C-contiguous
        Class of every site, 0..c-1.
    n_classes : int >= 2
        c.
    damping : float in (0, 1], default 1
        Fraction of every inner site change applied per outer iteration (the first one's, with
        ``adaptive_damping``).
    adaptive_damping : bool, default False
        Shrink the damping during the run: whenever an iteration's largest relative site change
        exceeds the previous iteration's (the parallel updates overshoot), the fraction is
        multiplied by ``DAMPING_SHRINK``, down to ``MIN_DAMPING``. A run starts at ``damping``
        again. The fixed point does not depend on the damping; a large first fraction saves
        iterations where the updates do not overshoot, the shrinking ends the oscillation where
        they do.
    tol : float >= 0, default 1e-8
        Convergence threshold on the relative site change and the change of log Z.
    max_sweeps : int >= 0, default 100
        Outer iterations at most (0 only evaluates the posterior and log Z of the sites).
    validate : bool, default True
        Check the inputs here and the inner sites at every :meth:`run` (ValueError or TypeError
        naming the argument). ``False`` is the one path for callers that checked them already
        (the estimator, at every optimiser step).

    Attributes
    ----------
    posterior : object or None
        What ``posterior_of`` returned for the sites of the last :meth:`run`.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore.multiclass_ep import MultinomialEP
    >>> from fastep._dense.multiclass import dense_posterior_of
    >>> X = np.linspace(-2, 2, 12)[:, None]
    >>> K = np.exp(-0.5 * (X - X.T) ** 2) + 1e-8 * np.eye(12)
    >>> labels = np.repeat(np.arange(3, dtype=np.int32), 4)
    >>> engine = MultinomialEP(dense_posterior_of(K), labels, 3, damping=0.8, tol=1e-8)
    >>> alpha, beta = np.zeros((12, 3)), np.zeros((12, 3))
    >>> result = engine.run(alpha, beta)
    >>> result.converged, result.outer_precision.shape
    (True, (12, 3))
    """

    def __init__(self, posterior_of, labels, n_classes, *, double damping=1.0, bint adaptive_damping=False,
                 double tol=1e-8, int max_sweeps=100, bint validate=True):
        if validate:
            if not callable(posterior_of):
                raise TypeError("posterior_of must be callable: (pi, nu) -> posterior")
            if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
                raise ValueError(f"n_classes must be an integer >= 2, got {n_classes!r}")
            if not (isinstance(labels, np.ndarray) and labels.dtype == np.int32 and labels.ndim == 1
                    and labels.flags.c_contiguous and labels.shape[0] > 0):
                raise TypeError("labels must be a non-empty C-contiguous int32 ndarray of shape (n,)")
            if np.any((labels < 0) | (labels >= n_classes)):
                raise ValueError(f"labels must be in 0..{n_classes - 1}")
            if not 0.0 < damping <= 1.0:
                raise ValueError(f"damping must be in (0, 1], got {damping!r}")
            if not tol >= 0.0:
                raise ValueError(f"tol must be >= 0, got {tol!r}")
            if max_sweeps < 0:
                raise ValueError(f"max_sweeps must be an integer >= 0, got {max_sweeps!r}")
        self.posterior_of = posterior_of
        self.labels = labels
        self.n = labels.shape[0]
        self.n_classes = n_classes
        self.damping = damping
        self.adaptive_damping = adaptive_damping
        self.tol = tol
        self.max_sweeps = max_sweeps
        self.validate = validate
        self.posterior = None

    def _check_run(self, inner_precision, inner_natural_mean):
        shape = (self.n, self.n_classes)
        for name, arr in (("inner_precision", inner_precision), ("inner_natural_mean", inner_natural_mean)):
            if not (isinstance(arr, np.ndarray) and arr.dtype == np.float64 and arr.flags.c_contiguous
                    and arr.flags.writeable and arr.shape == shape):
                raise TypeError(f"{name} must be a writeable C-contiguous float64 ndarray of shape {shape}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} must be finite")
        if np.shares_memory(inner_precision, inner_natural_mean):
            raise ValueError("inner_precision and inner_natural_mean must not share memory")

    cdef _cavities(self, post):
        """The posterior's cavity arrays, checked against (n, c)."""
        cdef const double[:, :, ::1] prec = post.cavity_precision
        cdef const double[:, ::1] lin = post.cavity_natural_mean
        cdef int n = self.n, c = self.n_classes
        if not (prec.shape[0] == n and prec.shape[1] == c and prec.shape[2] == c
                and lin.shape[0] == n and lin.shape[1] == c):
            raise ValueError(f"posterior_of returned cavities of shapes {np.shape(post.cavity_precision)} and "
                             f"{np.shape(post.cavity_natural_mean)}; expected {(n, c, c)} and {(n, c)}")
        return prec, lin

    cdef tuple _evidence(self, post, double[:, ::1] alpha, double[:, ::1] beta, double[:, ::1] scratch_alpha,
                         double[:, ::1] scratch_beta, int[::1] status, double* work):
        """``(log Z, number of failed sites)`` at the posterior ``post`` of the current inner sites:
        the tilted normalisers by :func:`nested_site` without sweeps, then ``post.log_evidence``."""
        cdef const double[:, :, ::1] cav_prec
        cdef const double[:, ::1] cav_lin
        cav_prec, cav_lin = self._cavities(post)
        cdef const int[::1] labels = self.labels
        cdef NestedSiteOptions opts
        opts.n_classes = self.n_classes
        opts.n_inner_sweeps = 0
        opts.damping = 1.0
        opts.tol = 0.0
        log_tilted = np.empty(self.n)
        cdef double[::1] lz = log_tilted
        cdef Py_ssize_t n = self.n, size = <Py_ssize_t>self.n * self.n_classes
        with nogil:
            memcpy(&scratch_alpha[0, 0], &alpha[0, 0], size * sizeof(double))
            memcpy(&scratch_beta[0, 0], &beta[0, 0], size * sizeof(double))
            _update_sites(&opts, n, &labels[0], &cav_prec[0, 0, 0], &cav_lin[0, 0], &scratch_alpha[0, 0],
                          &scratch_beta[0, 0], &lz[0], &status[0], work)
        log_z, n_failed = post.log_evidence(log_tilted)
        return float(log_z), int(n_failed)

    def run(self, inner_precision, inner_natural_mean, *, sweep_callback=None):
        """Outer EP iterations from the given inner sites, to convergence or ``max_sweeps``.

        Parameters
        ----------
        inner_precision, inner_natural_mean : ndarray (n, c), float64, C-contiguous, in/out
            The inner sites ``α̃``, ``β̃`` (column ``labels[i]`` unused, 0; zeros: a cold start),
            updated in place.
        sweep_callback : callable, optional
            ``sweep_callback(sweep, max_change, log_z)`` after every iteration (with the GIL);
            returning ``False`` stops the iterations (``stopped`` is True). An exception it
            raises is re-raised after the inner sites are restored to their input values.

        Returns
        -------
        MultinomialResult
            ``log_z`` the outer EP evidence of the returned sites; the engine's ``posterior``
            holds their posterior afterwards.

        Raises
        ------
        ValueError, TypeError
            (``validate=True``) inner sites of the wrong shape, type or not finite.
        numpy.linalg.LinAlgError
            ``posterior_of`` fails, or the final log Z is not finite. The inner sites are
            restored to their input values (as on Ctrl-C).
        """
        if self.validate:
            self._check_run(inner_precision, inner_natural_mean)
        cdef double[:, ::1] alpha = inner_precision
        cdef double[:, ::1] beta = inner_natural_mean
        cdef int n = self.n, c = self.n_classes, sweep = 0, n_site_failed
        cdef Py_ssize_t size = <Py_ssize_t>n * c
        cdef const int[::1] labels = self.labels
        cdef const double[:, :, ::1] cav_prec
        cdef const double[:, ::1] cav_lin
        cdef double[:, ::1] old_alpha = np.empty((n, c))
        cdef double[:, ::1] old_beta = np.empty((n, c))
        cdef double[::1] log_z_sites = np.empty(n)
        cdef int[::1] status = np.empty(n, dtype=np.intc)
        cdef NestedSiteOptions opts
        cdef double damping = self.damping, previous_change = INFINITY, max_change, new_log_z, change_b
        cdef bint adaptive = self.adaptive_damping
        opts.n_classes = c
        opts.n_inner_sweeps = 1
        opts.tol = 0.0
        # an outer iteration costs about 4 c n³ flops (the dense posterior): n sites share it
        cdef SweepDriver driver = SweepDriver(self.tol, self.max_sweeps, sweep_callback, 4.0 * c * n * n)
        driver.keep(inner_precision, inner_natural_mean)
        cdef double* work = _work_buffer(c)
        try:
            pi, nu = outer_sites(self.labels, inner_precision, inner_natural_mean)
            post = self.posterior_of(pi, nu)
            log_z, n_failed = self._evidence(post, alpha, beta, old_alpha, old_beta, status, work)
            driver.set_log_z(log_z)
            while sweep < driver.max_sweeps:
                sweep += 1
                cav_prec, cav_lin = self._cavities(post)
                opts.damping = damping
                with nogil:
                    memcpy(&old_alpha[0, 0], &alpha[0, 0], size * sizeof(double))
                    memcpy(&old_beta[0, 0], &beta[0, 0], size * sizeof(double))
                    n_site_failed = _update_sites(&opts, n, &labels[0], &cav_prec[0, 0, 0], &cav_lin[0, 0],
                                                  &alpha[0, 0], &beta[0, 0], &log_z_sites[0], &status[0], work)
                    max_change = _largest_change(size, &old_alpha[0, 0], &alpha[0, 0])
                    change_b = _largest_change(size, &old_beta[0, 0], &beta[0, 0])
                    if change_b > max_change:
                        max_change = change_b
                    if adaptive and max_change > previous_change:
                        damping = damping * _DAMPING_SHRINK
                        if not damping > _MIN_DAMPING:
                            damping = _MIN_DAMPING
                    previous_change = max_change
                if driver.interrupted():
                    break               # Ctrl-C: the sites are restored and the exception raised below
                pi, nu = outer_sites(self.labels, inner_precision, inner_natural_mean)
                post = self.posterior_of(pi, nu)
                new_log_z, n_failed = self._evidence(post, alpha, beta, old_alpha, old_beta, status, work)
                if driver.end_sweep(sweep, max_change, new_log_z, n_failed + n_site_failed):
                    break
        except BaseException:
            driver.restore()
            raise
        finally:
            free(work)
        driver.raise_pending()
        self.posterior = post
        if not isfinite(driver.log_z):
            driver.restore()
            raise np.linalg.LinAlgError("nested EP's log marginal likelihood is not finite; increase jitter "
                                        "or add a White kernel term")
        return MultinomialResult(driver.result(), pi, nu, damping)


def nested_log_probabilities(const double[:, ::1] mean, const double[:, :, ::1] cov, *,
                             int max_sweeps=50, double tol=1e-8):
    """``log p(y = k)`` for latent ``f ~ N(mean_i, cov_i)`` and every class k, by inner EP.

    ``p(y = k) = ∫ N(f; mean, cov) p(y = k | f) df`` is the inner EP evidence from zero inner
    sites, run to ``tol`` (at most ``max_sweeps`` sweeps); the returned log probabilities are
    not normalised (their exponentials sum to 1 up to the EP approximation; exactly for c = 2).

    Returns
    -------
    ndarray (n, c)
        NaN where a covariance is not positive definite or the inner EP failed.
    """
    mean_arr = np.asarray(mean)
    cov_arr = np.asarray(cov)
    n, c = mean_arr.shape
    if cov_arr.shape != (n, c, c):
        raise ValueError(f"cov must have shape {(n, c, c)}, got {cov_arr.shape}")
    precision = np.empty_like(cov_arr)
    natural = np.empty_like(mean_arr)
    ok = np.ones(n, dtype=bool)
    for i in range(n):
        try:
            chol = np.linalg.cholesky(cov_arr[i])
        except np.linalg.LinAlgError:
            ok[i] = False
            precision[i] = np.eye(c)
            natural[i] = 0.0
            continue
        inv_chol = np.linalg.inv(chol)
        precision[i] = inv_chol.T @ inv_chol
        natural[i] = precision[i] @ mean_arr[i]
    out = np.empty((n, c))
    alpha = np.zeros((n, c))
    beta = np.zeros((n, c))
    inner_ep = InnerEP(n_inner_sweeps=max_sweeps, damping=1.0, tol=tol)
    for k in range(c):
        alpha[:] = 0.0
        beta[:] = 0.0
        log_z, status = inner_ep.update(np.full(n, k, dtype=np.int32), precision, natural, alpha, beta)
        out[:, k] = log_z
    out[~ok] = np.nan
    return out
