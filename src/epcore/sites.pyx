# cython: language_level=3
"""Site moments: the one-site dispatch the engines call, the array loops, the Python API.

For a site with likelihood ``t(f)`` and Gaussian cavity ``N(f; mu, s2)``,
``site_moments`` (one site, ``nogil``) and ``site_moments_array`` (many sites)
return (Minka eqs 6, 17-19; Lawrence-Seeger-Herbrich IVM eqs 14-16 with
``g = alpha`` and ``nu = beta``)::

    log_z = log Z,   Z = ∫ t(f) N(f; mu, s2) df
    alpha = d log Z / d mu
    beta  = -d² log Z / d mu²

so that the tilted mean is ``mu + s2*alpha`` and the tilted variance
``s2 - s2**2 * beta``. The kernels and their numerical policy are in
``_site_kernels.pxd`` (probit, step, logistic, Gaussian, ordinal; inline) and
:mod:`fastep._epcore.student_t_sites` (Student-t, by quadrature).

Speed
-----
``site_moments`` dispatches on the likelihood code;
``site_moments_array`` validates the likelihood once, precomputes its constants
(``_Prepared``) and picks one loop per likelihood; the array is split into
chunks of ``_CHUNK`` sites spread over OpenMP threads when the module is built
with OpenMP. Probit, step, MacKay-logistic and Gaussian sites run in blocks of
``_BLOCK`` sites, one stage at a time (checks and standardised arguments,
the Gaussian tail G, the libm calls and outputs), which lets independent sites
overlap in the CPU. Both entry points call the same per-likelihood stages in
the same order of operations, so a site's results are bitwise the same
whichever entry point, blocking, chunking or thread count computed them.
"""
import os

import numpy as np

from cython.parallel cimport prange
from libc.math cimport exp, sqrt, fabs, isfinite
from fastep._epcore._site_kernels cimport (
    LegendreRule, N_LEGENDRE, _PI_OVER_8, _valid_cavity, _valid_binary, _inv_slope2, _gauss_tail_at,
    _cdf_terms_g, _probit_out, _probit_core, _ordinal_core, _step_out, _step_core, _mackay_out,
    _logistic_mackay_core, _logistic_gh_core, _gaussian_log_z, _gaussian_core,
)
from fastep._epcore.site_model cimport check_site, finish_site
from fastep._epcore.student_t_sites cimport student_t_moments, student_t_log_norm

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int fastep_sites_max_threads(void) { return omp_get_max_threads(); }
    static int fastep_sites_openmp(void) { return 1; }
    #else
    static int fastep_sites_max_threads(void) { return 1; }
    static int fastep_sites_openmp(void) { return 0; }
    #endif
    """
    int fastep_sites_max_threads() noexcept nogil
    int fastep_sites_openmp() noexcept nogil

# The 10-point Gauss-Legendre rule of the ordinal kernel (filled at import from numpy).
cdef LegendreRule _legendre


def _init_legendre():
    nodes, weights = np.polynomial.legendre.leggauss(N_LEGENDRE)
    for k in range(N_LEGENDRE):
        _legendre.nodes[k] = nodes[k]
        _legendre.weights[k] = weights[k]


_init_legendre()


# ----------------------------------------------------------------------------
# One site: dispatch on the likelihood code
# ----------------------------------------------------------------------------

cdef inline int _student_t_core(const double* params, double y, double mu, double s2,
                                double* log_z, double* alpha, double* beta) noexcept nogil:
    """Student-t site (params [dof, scale]) at power 1, by ``student_t_sites.student_t_moments``."""
    cdef double e1, e2
    return student_t_moments(params[0], params[1], 1.0, student_t_log_norm(params[0], params[1]),
                             y, mu, s2, log_z, alpha, beta, &e1, &e2)


cdef inline void _fill_gh_weights(const double* log_weights, int n, double* weights) noexcept nogil:
    cdef int k
    for k in range(n):
        weights[k] = exp(log_weights[k])


cdef int site_moments(const SiteModel* model, double y, double cavity_mean, double cavity_var,
                      double* log_z, double* alpha, double* beta) noexcept nogil:
    """log Z, alpha = d log Z/d mu, beta = -d² log Z/d mu² for one site (see module docstring).

    Returns SITE_OK or an error status; on error the outputs are unspecified.
    The cavity must have finite mean and finite variance >= 0 (> 0 for the
    step likelihood and for probit/ordinal with infinite slope). On SITE_OK all
    three outputs are finite.
    """
    cdef int status
    cdef double weights[GH_MAX_NODES]
    status = check_site(y, cavity_mean, cavity_var)
    if status != SITE_OK:
        return status
    if model.code == LIK_PROBIT:
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        status = _probit_core(_inv_slope2(model.params[0]), model.params[1], y, cavity_mean,
                              cavity_var, log_z, alpha, beta)
    elif model.code == LIK_STEP:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        status = _step_core(model.params[0], y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_LOGISTIC_MACKAY:
        status = _logistic_mackay_core(y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_LOGISTIC_GH:
        if model.n_nodes < 1 or model.n_nodes > GH_MAX_NODES or model.gh_nodes == NULL \
                or model.gh_log_weights == NULL:
            return SITE_BAD_PARAMS
        _fill_gh_weights(model.gh_log_weights, model.n_nodes, weights)
        status = _logistic_gh_core(model.gh_nodes, model.gh_log_weights, weights, model.n_nodes,
                                   y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_GAUSSIAN:
        if model.n_params != 1:
            return SITE_BAD_PARAMS
        status = _gaussian_core(model.params[0], y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_ORDINAL:
        if model.n_params < 2:
            return SITE_BAD_PARAMS
        status = _ordinal_core(&_legendre, _inv_slope2(model.params[0]), model.params, model.n_params,
                               NULL, y, cavity_mean, cavity_var, log_z, alpha, beta)
    elif model.code == LIK_STUDENT_T:
        if model.n_params != 2:
            return SITE_BAD_PARAMS
        status = _student_t_core(model.params, y, cavity_mean, cavity_var, log_z, alpha, beta)
    else:
        return SITE_BAD_PARAMS
    return finish_site(status, log_z, alpha, beta)


# ----------------------------------------------------------------------------
# Array loops: constants prepared once per call, one tight loop per likelihood
# ----------------------------------------------------------------------------

cdef enum:
    # Sites per work item of the parallel loop (also the minimum per thread).
    _CHUNK = 8192
    # Sites per block of the staged loops: each stage runs over the block before
    # the next starts, so independent sites overlap in the CPU instead of one
    # site's long dependency chain (scale -> G -> log/exp -> outputs) stalling it.
    _BLOCK = 64

cdef struct _Prepared:
    int code
    const double* params
    int n_params
    double inv_slope2               # probit, ordinal
    const double* thresholds        # ordinal: theta_0 .. theta_{C-2}
    const double* gh_nodes
    const double* gh_log_weights
    const double* gh_weights        # exp(gh_log_weights)
    int n_nodes


cdef inline int _site_one(const _Prepared* p, double y, double mu, double s2,
                          double* log_z, double* alpha, double* beta) noexcept nogil:
    """One site with prepared constants; the same kernels as ``site_moments``."""
    cdef int status = check_site(y, mu, s2)
    if status != SITE_OK:
        return status
    if p.code == LIK_PROBIT:
        status = _probit_core(p.inv_slope2, p.params[1], y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_STEP:
        status = _step_core(p.params[0], y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_LOGISTIC_MACKAY:
        status = _logistic_mackay_core(y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_LOGISTIC_GH:
        status = _logistic_gh_core(p.gh_nodes, p.gh_log_weights, p.gh_weights, p.n_nodes,
                                   y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_GAUSSIAN:
        status = _gaussian_core(p.params[0], y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_ORDINAL:
        status = _ordinal_core(&_legendre, p.inv_slope2, p.params, p.n_params, p.thresholds,
                               y, mu, s2, log_z, alpha, beta)
    elif p.code == LIK_STUDENT_T:
        status = _student_t_core(p.params, y, mu, s2, log_z, alpha, beta)
    else:
        return SITE_BAD_PARAMS
    return finish_site(status, log_z, alpha, beta)


cdef Py_ssize_t _run_sites(const _Prepared* p, const double* y, const double* mu, const double* s2,
                           double* log_z, double* alpha, double* beta,
                           Py_ssize_t start, Py_ssize_t end, int* status) noexcept nogil:
    """Site by site (ordinal, Gauss-Hermite, and blocks that contain an invalid site)."""
    cdef Py_ssize_t i
    cdef int st
    for i in range(start, end):
        st = _site_one(p, y[i], mu[i], s2[i], &log_z[i], &alpha[i], &beta[i])
        if st != SITE_OK:
            status[0] = st
            return i
    return -1


cdef Py_ssize_t _run_staged(const _Prepared* p, const double* y, const double* mu, const double* s2,
                            double* log_z, double* alpha, double* beta,
                            Py_ssize_t start, Py_ssize_t end, int* status) noexcept nogil:
    """Probit, step, MacKay logistic and Gaussian sites in blocks of ``_BLOCK``, stage by stage.

    Stage 1 checks every site of the block and computes its standardised
    argument; if any site of the block is invalid, the block is redone by
    ``_run_sites`` (which reports the first failure in order). The stages are
    the same inline functions the single-site kernels call, in the same order
    of operations, so results are bitwise those of ``site_moments``.
    """
    cdef Py_ssize_t b0, i, j, k, m
    cdef int st = SITE_OK
    cdef bint ok
    cdef Py_ssize_t order[_BLOCK + 1]   # stage-3 visiting order (see below)
    cdef int code = p.code
    cdef double inv_slope2 = p.inv_slope2
    cdef double param0 = p.params[0] if p.n_params > 0 else 0.0
    cdef double param1 = p.params[1] if p.n_params > 1 else 0.0
    cdef double scale[_BLOCK]      # probit c, step sd, MacKay kappa, Gaussian v
    cdef double arg[_BLOCK]        # probit/step/MacKay z
    cdef double aux[_BLOCK]        # G(|z|), or MacKay exp(-|z|)
    cdef double log_cdf[_BLOCK]
    cdef double hazard[_BLOCK]
    cdef double hazard_plus_z[_BLOCK]
    b0 = start
    while b0 < end:
        m = end - b0
        if m > _BLOCK:
            m = _BLOCK
        # Stage 1: check the whole block (no early exit), then the standardised
        # arguments in a branch-free loop the compiler can vectorise. The
        # expressions are those of _probit_z, _step_z, _mackay_z, _gaussian_pre
        # for valid sites.
        ok = True
        if code == LIK_PROBIT:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_binary(y[i], mu[i], s2[i]) & (s2[i] + inv_slope2 > 0.0)
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = 1.0 / sqrt(s2[i] + inv_slope2)
                    arg[j] = y[i] * (scale[j] * (mu[i] + param1))
        elif code == LIK_STEP:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_binary(y[i], mu[i], s2[i]) & (s2[i] > 0.0)
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = sqrt(s2[i])
                    arg[j] = y[i] * mu[i] / scale[j]
        elif code == LIK_LOGISTIC_MACKAY:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_binary(y[i], mu[i], s2[i])
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = 1.0 / sqrt(1.0 + _PI_OVER_8 * s2[i])
                    arg[j] = y[i] * scale[j] * mu[i]
        else:
            for j in range(m):
                i = b0 + j
                ok = ok & _valid_cavity(mu[i], s2[i]) & isfinite(y[i])
            if ok:
                for j in range(m):
                    i = b0 + j
                    scale[j] = s2[i] + param0
                    arg[j] = (y[i] - mu[i]) / scale[j]
                    aux[j] = 1.0 / scale[j]
                for j in range(m):
                    i = b0 + j
                    alpha[i] = arg[j]
                    beta[i] = aux[j]
        if not ok:
            # Some site of the block is invalid: redo it site by site to report the first failure.
            i = _run_sites(p, y, mu, s2, log_z, alpha, beta, b0, b0 + m, status)
            if i >= 0:
                return i
            b0 += m
            continue
        # Stages 2-3: special functions, then the outputs. Stage 3 visits the
        # sites with z <= 0 first, then those with z > 0 (``order``, built
        # without branches), so that the kernels' branch on the sign of z is
        # predictable instead of a coin toss per site.
        if code != LIK_GAUSSIAN:
            k = 0
            for j in range(m):
                order[k] = j
                k += arg[j] <= 0.0
            for j in range(m):
                order[k] = j
                k += arg[j] > 0.0
        if code == LIK_PROBIT:
            for j in range(m):
                aux[j] = _gauss_tail_at(arg[j])
            for k in range(m):
                j = order[k]
                _cdf_terms_g(arg[j], aux[j], &log_cdf[j], &hazard[j], &hazard_plus_z[j],
                             NULL, NULL, True, False)
            for j in range(m):
                i = b0 + j
                _probit_out(y[i], scale[j], arg[j], log_cdf[j], hazard[j], hazard_plus_z[j],
                            &log_z[i], &alpha[i], &beta[i])
        elif code == LIK_STEP:
            for j in range(m):
                aux[j] = _gauss_tail_at(arg[j])
            for k in range(m):
                j = order[k]
                i = b0 + j
                _step_out(param0, y[i], scale[j], arg[j], aux[j], &log_z[i], &alpha[i], &beta[i])
        elif code == LIK_LOGISTIC_MACKAY:
            for j in range(m):
                aux[j] = exp(-fabs(arg[j]))
            for k in range(m):
                j = order[k]
                i = b0 + j
                _mackay_out(y[i], scale[j], arg[j], aux[j], &log_z[i], &alpha[i], &beta[i])
        else:
            for j in range(m):
                i = b0 + j
                log_z[i] = _gaussian_log_z(y[i], mu[i], scale[j], arg[j])
        for j in range(m):
            i = b0 + j
            st = finish_site(SITE_OK, &log_z[i], &alpha[i], &beta[i])
            if st != SITE_OK:
                status[0] = st
                return i
        b0 += m
    return -1


cdef Py_ssize_t _run_range(const _Prepared* p, const double* y, const double* mu, const double* s2,
                           double* log_z, double* alpha, double* beta,
                           Py_ssize_t start, Py_ssize_t end, int* status) noexcept nogil:
    """Sites start..end-1; returns the first failing index (its status in ``status``) or -1."""
    if p.code == LIK_PROBIT or p.code == LIK_STEP or p.code == LIK_LOGISTIC_MACKAY \
            or p.code == LIK_GAUSSIAN:
        return _run_staged(p, y, mu, s2, log_z, alpha, beta, start, end, status)
    return _run_sites(p, y, mu, s2, log_z, alpha, beta, start, end, status)


# ----------------------------------------------------------------------------
# Python-level API
# ----------------------------------------------------------------------------

LIKELIHOOD_CODES = {
    'probit': LIK_PROBIT,
    'step': LIK_STEP,
    'logistic_mackay': LIK_LOGISTIC_MACKAY,
    'logistic_gh': LIK_LOGISTIC_GH,
    'gaussian': LIK_GAUSSIAN,
    'ordinal': LIK_ORDINAL,
    'student_t': LIK_STUDENT_T,
}
LIKELIHOOD_NAMES = {code: name for name, code in LIKELIHOOD_CODES.items()}

STATUS_MESSAGES = {
    SITE_OK: "ok",
    SITE_BAD_CAVITY: ("cavity mean must be finite and cavity variance finite and >= 0 "
                      "(> 0 for the step likelihood and for an infinite probit slope)"),
    SITE_BAD_LABEL: "target outside the likelihood's support",
    SITE_ZERO_MASS: "site mass Z underflows even in log space (cavity mean too far in the tail)",
    SITE_BAD_PARAMS: "inconsistent likelihood parameters",
    SITE_OVERFLOW: "alpha or beta overflows float64 (cavity variance too small)",
}

# Site status codes, exported for Python callers.
OK = SITE_OK
BAD_CAVITY = SITE_BAD_CAVITY
BAD_LABEL = SITE_BAD_LABEL
ZERO_MASS = SITE_ZERO_MASS
BAD_PARAMS = SITE_BAD_PARAMS
OVERFLOW = SITE_OVERFLOW
MAX_GH_NODES = GH_MAX_NODES


def status_message(int status):
    """Human-readable explanation of a site status code."""
    return STATUS_MESSAGES.get(status, f"unknown site status {status}")


def _check_params(int code, params, gh_nodes, gh_log_weights):
    """Validate parameter arrays for a likelihood code; raise ValueError naming the problem."""
    n = params.shape[0]
    if code == LIK_PROBIT:
        if n != 2:
            raise ValueError(f"probit likelihood needs params [slope, bias], got {n} values")
        if not params[0] > 0:
            raise ValueError(f"probit slope must be > 0 (may be +inf), got {params[0]!r}")
        if not np.isfinite(params[1]):
            raise ValueError(f"probit bias must be finite, got {params[1]!r}")
    elif code == LIK_STEP:
        if n != 1:
            raise ValueError(f"step likelihood needs params [flip_noise], got {n} values")
        if not (0.0 <= params[0] < 0.5):
            raise ValueError(f"step flip_noise must be in [0, 0.5), got {params[0]!r}")
    elif code == LIK_LOGISTIC_MACKAY:
        if n != 0:
            raise ValueError(f"MacKay logistic likelihood takes no params, got {n} values")
    elif code == LIK_LOGISTIC_GH:
        if n != 0:
            raise ValueError(f"Gauss-Hermite logistic likelihood takes no params, got {n} values")
        m = gh_nodes.shape[0]
        if not 1 <= m <= GH_MAX_NODES:
            raise ValueError(
                f"Gauss-Hermite logistic likelihood needs 1..{GH_MAX_NODES} gh_nodes, got {m}")
        if not (np.all(np.isfinite(gh_nodes)) and np.all(np.isfinite(gh_log_weights))):
            raise ValueError("gh_nodes and gh_log_weights must be finite")
    elif code == LIK_GAUSSIAN:
        if n != 1:
            raise ValueError(f"Gaussian likelihood needs params [noise_variance], got {n} values")
        if not (params[0] > 0 and np.isfinite(params[0])):
            raise ValueError(f"Gaussian noise_variance must be finite and > 0, got {params[0]!r}")
    elif code == LIK_ORDINAL:
        if n < 2:
            raise ValueError(
                f"ordinal likelihood needs params [slope, bias, width_1..width_(C-2)] with C >= 2, "
                f"got {n} values")
        if not params[0] > 0:
            raise ValueError(f"ordinal slope must be > 0 (may be +inf), got {params[0]!r}")
        if not np.isfinite(params[1]):
            raise ValueError(f"ordinal bias must be finite, got {params[1]!r}")
        widths = params[2:]
        if not np.all((widths > 0) & np.isfinite(widths)):
            raise ValueError(f"ordinal widths must be finite and > 0, got {widths!r}")
    elif code == LIK_STUDENT_T:
        if n != 2:
            raise ValueError(f"Student-t likelihood needs params [dof, scale], got {n} values")
        if not (params[0] > 0 and np.isfinite(params[0])):
            raise ValueError(f"Student-t dof must be finite and > 0, got {params[0]!r}")
        if not (params[1] > 0 and np.isfinite(params[1])):
            raise ValueError(f"Student-t scale must be finite and > 0, got {params[1]!r}")
        if not np.isfinite(params[0] * params[1] * params[1]) or not params[0] * params[1] * params[1] > 0:
            raise ValueError(f"Student-t dof * scale**2 must be finite and > 0, got {params[0]!r} and {params[1]!r}")
    else:
        raise ValueError(f"unknown likelihood code {code!r}; expected one of "
                         f"{sorted(LIKELIHOOD_NAMES)}")
    if code != LIK_LOGISTIC_GH and gh_nodes.shape[0] != 0:
        raise ValueError("gh_nodes are only used by the Gauss-Hermite logistic likelihood")


cdef class SiteSpec:
    """A likelihood as the compiled core sees it: a code and parameter arrays it owns.

    Parameters
    ----------
    code : int
        One of the ``LIK_*`` codes (see ``LIKELIHOOD_CODES``).
    params : array_like of float
        Likelihood parameters in the layout documented in ``sites.pxd``.
    gh_nodes, gh_log_weights : array_like of float, optional
        Gauss-Hermite nodes ``t_k`` (physicists' convention) and
        ``log(w_k / sqrt(pi))``; only for ``LIK_LOGISTIC_GH``.

    The parameters are validated (ValueError naming the offending value) and
    copied into read-only arrays; ``spec.model`` points into them and stays valid
    as long as the SiteSpec lives.
    """
    def __cinit__(self, int code, params, gh_nodes=None, gh_log_weights=None):
        self.code = code
        self.params = np.array(params, dtype=np.float64, order='C', copy=True).reshape(-1)
        self.gh_nodes = np.array(
            gh_nodes if gh_nodes is not None else (), dtype=np.float64, order='C', copy=True).reshape(-1)
        self.gh_log_weights = np.array(
            gh_log_weights if gh_log_weights is not None else (), dtype=np.float64, order='C',
            copy=True).reshape(-1)
        if self.gh_nodes.shape[0] != self.gh_log_weights.shape[0]:
            raise ValueError("gh_nodes and gh_log_weights must have the same length")
        _check_params(code, self.params, self.gh_nodes, self.gh_log_weights)
        # Keep private copies read-only so the pointers below stay valid and unchanged.
        self.params.setflags(write=False)
        self.gh_nodes.setflags(write=False)
        self.gh_log_weights.setflags(write=False)
        self.model.code = code
        self.model.n_params = self.params.shape[0]
        self.model.n_nodes = self.gh_nodes.shape[0]
        self.model.params = _ptr(self.params)
        self.model.gh_nodes = _ptr(self.gh_nodes)
        self.model.gh_log_weights = _ptr(self.gh_log_weights)

    def __reduce__(self):
        return (SiteSpec, (self.code, self.params, self.gh_nodes, self.gh_log_weights))

    def __repr__(self):
        name = LIKELIHOOD_NAMES.get(self.code, str(self.code))
        extra = f", n_nodes={self.gh_nodes.shape[0]}" if self.code == LIK_LOGISTIC_GH else ""
        return f"SiteSpec({name}, params={self.params.tolist()}{extra})"


cdef const double* _ptr(arr):
    """Data pointer of a float64 C-contiguous array (NULL when empty)."""
    cdef const double[::1] view
    if arr.shape[0] == 0:
        return NULL
    view = arr
    return &view[0]



def _as_input(name, values):
    if type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1 \
            and values.flags.c_contiguous:
        return values     # the common case: nothing to convert
    arr = np.asarray(values)
    if arr.dtype.kind not in 'biuf':
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def _as_output(name, out, n):
    if out is None:
        return np.empty(n, dtype=np.float64)
    if not isinstance(out, np.ndarray) or out.dtype != np.float64 or out.ndim != 1 \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous 1-D float64 array")
    if out.shape[0] != n:
        raise ValueError(f"{name} has length {out.shape[0]}, expected {n}")
    return out


cdef bint _model_ok(const SiteModel* model) noexcept nogil:
    """The structural checks ``site_moments`` makes per site (SiteSpec guarantees them)."""
    if model.code == LIK_PROBIT:
        return model.n_params == 2
    if model.code == LIK_STEP or model.code == LIK_GAUSSIAN:
        return model.n_params == 1
    if model.code == LIK_LOGISTIC_MACKAY:
        return True
    if model.code == LIK_LOGISTIC_GH:
        return 1 <= model.n_nodes <= GH_MAX_NODES and model.gh_nodes != NULL \
            and model.gh_log_weights != NULL
    if model.code == LIK_ORDINAL:
        return model.n_params >= 2
    if model.code == LIK_STUDENT_T:
        return model.n_params == 2
    return False


OPENMP = bool(fastep_sites_openmp())

# GNU libgomp does not survive fork(): a child forked after the parent ran a
# parallel region deadlocks in its next one. Forked children therefore run the
# array loops on one thread (they never enter a parallel region).
cdef bint _parallel_allowed = True


def _disable_parallel_after_fork():
    global _parallel_allowed
    _parallel_allowed = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_parallel_after_fork)


def max_threads():
    """Threads ``site_moments_array`` may use: the OpenMP maximum (``OMP_NUM_THREADS``,
    ``threadpoolctl.threadpool_limits(n, "openmp")``); 1 when built without OpenMP
    and in a process forked from one that imported this module."""
    return fastep_sites_max_threads() if _parallel_allowed else 1


def site_moments_array(SiteSpec spec not None, y, cavity_mean, cavity_var, log_z=None, alpha=None, beta=None):
    """Site moments for many sites at once (GIL released over the loop).

    Parameters
    ----------
    spec : SiteSpec
        The likelihood.
    y, cavity_mean, cavity_var : array_like, shape (n,)
        Site targets (encoded as in ``sites.pxd``: ±1 for binary likelihoods,
        0..C-1 for ordinal, reals for Gaussian), cavity means and variances.
        No broadcasting: all three must be 1-D of the same length.
    log_z, alpha, beta : ndarray, shape (n,), optional
        Output arrays (float64, C-contiguous, writeable) to fill in place.

    Returns
    -------
    log_z, alpha, beta : ndarray, shape (n,)
        ``log Z``, ``d log Z/d mu`` and ``-d² log Z/d mu²`` per site.

    Raises
    ------
    ValueError
        If the lengths differ, or if any site fails; the message names the
        first failing site, its inputs and the reason. Outputs are then only
        partially filled.

    Notes
    -----
    Arrays of more than 8192 sites are split into chunks of 8192 that
    run on up to ``max_threads()`` OpenMP threads (when built with OpenMP).
    Every site is computed by the same code whatever the chunking, so results
    are bitwise identical for any thread count, and identical to
    ``site_moments`` called site by site. Processes forked after import run on
    one thread (GNU libgomp deadlocks in a forked child otherwise).
    """
    y_arr = _as_input("y", y)
    mean_arr = _as_input("cavity_mean", cavity_mean)
    var_arr = _as_input("cavity_var", cavity_var)
    cdef Py_ssize_t n = y_arr.shape[0]
    if mean_arr.shape[0] != n or var_arr.shape[0] != n:
        raise ValueError(f"y, cavity_mean and cavity_var must have the same length, got "
                         f"{n}, {mean_arr.shape[0]} and {var_arr.shape[0]}")
    log_z = _as_output("log_z", log_z, n)
    alpha = _as_output("alpha", alpha, n)
    beta = _as_output("beta", beta, n)
    if n == 0:
        return log_z, alpha, beta
    cdef const double[::1] y_view = y_arr
    cdef const double[::1] mean_view = mean_arr
    cdef const double[::1] var_view = var_arr
    cdef double[::1] log_z_view = log_z
    cdef double[::1] alpha_view = alpha
    cdef double[::1] beta_view = beta
    cdef const double* y_ptr = &y_view[0]
    cdef const double* mean_ptr = &mean_view[0]
    cdef const double* var_ptr = &var_view[0]
    cdef double* log_z_ptr = &log_z_view[0]
    cdef double* alpha_ptr = &alpha_view[0]
    cdef double* beta_ptr = &beta_view[0]

    # Constants of the likelihood, once per call.
    cdef const SiteModel* model = &spec.model
    cdef _Prepared prep
    cdef double[::1] thresholds_view, weights_view
    cdef Py_ssize_t k
    prep.code = model.code if _model_ok(model) else -1
    prep.params = model.params
    prep.n_params = model.n_params
    prep.inv_slope2 = 0.0
    prep.thresholds = NULL
    prep.gh_nodes = model.gh_nodes
    prep.gh_log_weights = model.gh_log_weights
    prep.gh_weights = NULL
    prep.n_nodes = model.n_nodes
    if prep.code == LIK_PROBIT or prep.code == LIK_ORDINAL:
        prep.inv_slope2 = _inv_slope2(model.params[0])
    if prep.code == LIK_ORDINAL:
        thresholds = np.empty(model.n_params - 1)
        thresholds_view = thresholds
        thresholds_view[0] = model.params[1]
        for k in range(1, model.n_params - 1):      # summed left to right, as _ordinal_core does
            thresholds_view[k] = thresholds_view[k - 1] + model.params[1 + k]
        prep.thresholds = &thresholds_view[0]
    if prep.code == LIK_LOGISTIC_GH:
        weights = np.empty(model.n_nodes)
        weights_view = weights
        _fill_gh_weights(model.gh_log_weights, model.n_nodes, &weights_view[0])
        prep.gh_weights = &weights_view[0]

    cdef Py_ssize_t failed = -1, n_chunks = (n + _CHUNK - 1) // _CHUNK, j, start, end
    cdef int status = SITE_OK
    cdef int n_threads = fastep_sites_max_threads() if _parallel_allowed else 1
    cdef Py_ssize_t[::1] chunk_failed
    cdef int[::1] chunk_status
    cdef Py_ssize_t* chunk_failed_ptr
    cdef int* chunk_status_ptr
    if n_chunks < 2 or n_threads < 2:
        with nogil:
            failed = _run_range(&prep, y_ptr, mean_ptr, var_ptr, log_z_ptr, alpha_ptr, beta_ptr,
                                0, n, &status)
    else:
        if n_threads > n_chunks:
            n_threads = <int>n_chunks
        chunk_failed = np.empty(n_chunks, dtype=np.intp)
        chunk_status = np.zeros(n_chunks, dtype=np.intc)
        chunk_failed_ptr = &chunk_failed[0]
        chunk_status_ptr = &chunk_status[0]
        with nogil:
            for j in prange(n_chunks, schedule='dynamic', num_threads=n_threads):
                start = j * _CHUNK
                end = start + _CHUNK
                if end > n:
                    end = n
                chunk_failed_ptr[j] = _run_range(&prep, y_ptr, mean_ptr, var_ptr, log_z_ptr,
                                                 alpha_ptr, beta_ptr, start, end, &chunk_status_ptr[j])
        # Chunks are in site order: the first chunk that failed holds the first failing site.
        for j in range(n_chunks):
            if chunk_failed[j] >= 0:
                failed = chunk_failed[j]
                status = chunk_status[j]
                break
    if failed >= 0:
        raise ValueError(
            f"site {failed} failed ({LIKELIHOOD_NAMES.get(spec.code, spec.code)} likelihood, "
            f"y={float(y_arr[failed])!r}, cavity_mean={float(mean_arr[failed])!r}, "
            f"cavity_var={float(var_arr[failed])!r}): {status_message(status)}")
    return log_z, alpha, beta


def _site_moments_per_site(SiteSpec spec not None, y, cavity_mean, cavity_var):
    """``site_moments`` (the engines' one-site entry point) called site by site, for tests.

    Returns ``(status, log_z, alpha, beta)`` with one int status per site; the
    outputs of failed sites are unspecified. Unlike ``site_moments_array`` it
    does not stop at the first failure.
    """
    y_arr = _as_input("y", y)
    mean_arr = _as_input("cavity_mean", cavity_mean)
    var_arr = _as_input("cavity_var", cavity_var)
    cdef Py_ssize_t n = y_arr.shape[0], i
    if mean_arr.shape[0] != n or var_arr.shape[0] != n:
        raise ValueError("y, cavity_mean and cavity_var must have the same length")
    status = np.zeros(n, dtype=np.intc)
    log_z = np.full(n, np.nan)
    alpha = np.full(n, np.nan)
    beta = np.full(n, np.nan)
    cdef const double[::1] y_view = y_arr
    cdef const double[::1] mean_view = mean_arr
    cdef const double[::1] var_view = var_arr
    cdef int[::1] status_view = status
    cdef double[::1] log_z_view = log_z
    cdef double[::1] alpha_view = alpha
    cdef double[::1] beta_view = beta
    with nogil:
        for i in range(n):
            status_view[i] = site_moments(&spec.model, y_view[i], mean_view[i], var_view[i],
                                          &log_z_view[i], &alpha_view[i], &beta_view[i])
    return status, log_z, alpha, beta
