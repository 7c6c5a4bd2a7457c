# cython: language_level=3
from libc.math cimport log, sqrt, INFINITY

cdef int site_moments(const SiteModel* model, double y, double cavity_mean, double cavity_var,
                      double* log_z, double* alpha, double* beta) noexcept nogil:
    # Placeholder (Gaussian only) so the build works before the real kernels land.
    cdef double s = cavity_var + model.params[0]
    alpha[0] = (y - cavity_mean) / s
    beta[0] = 1.0 / s
    log_z[0] = -0.5 * log(2 * 3.141592653589793 * s) - 0.5 * (y - cavity_mean) ** 2 / s
    return SITE_OK
