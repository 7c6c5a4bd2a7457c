# cython: language_level=3
"""Likelihood site kernels (placeholder: Gaussian only until the real kernels land)."""
import numpy as np
from libc.math cimport log


cdef int site_moments(const SiteModel* model, double y, double cavity_mean, double cavity_var,
                      double* log_z, double* alpha, double* beta) noexcept nogil:
    # Placeholder (Gaussian only) so the build works before the real kernels land.
    cdef double s = cavity_var + model.params[0]
    alpha[0] = (y - cavity_mean) / s
    beta[0] = 1.0 / s
    log_z[0] = -0.5 * log(2 * 3.141592653589793 * s) - 0.5 * (y - cavity_mean) ** 2 / s
    return SITE_OK


cdef class SiteSpec:
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


cdef const double* _ptr(arr):
    """Data pointer of a float64 C-contiguous array (NULL when empty)."""
    cdef const double[::1] view
    if arr.shape[0] == 0:
        return NULL
    view = arr
    return &view[0]
