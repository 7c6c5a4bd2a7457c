# cython: language_level=3
"""Power EP for one site (see power_ep.pyx): the quadrature rule, the powered moments and the site step."""
from fastep._epcore.sites cimport SiteModel
from fastep._epcore._common cimport SiteUpdateOptions


cdef struct PowerRule:
    double power                 # α in (0, 1]
    const double* nodes          # Gauss-Hermite nodes t_k for ∫ g(t) exp(-t²) dt (used when α < 1)
    const double* log_weights    # log(w_k / sqrt(pi))
    int n_nodes


cdef int power_site_moments(const SiteModel* model, const PowerRule* rule, double y, double mean,
                            double var, double* log_z, double* alpha, double* beta) noexcept nogil

cdef int power_site_step(const SiteModel* model, const PowerRule* rule, double y, double g_mean,
                         double g_var, double d, double* site_precision_i,
                         double* site_natural_mean_i, const SiteUpdateOptions* opts) noexcept nogil


cdef class PowerQuadrature:
    cdef readonly object nodes
    cdef readonly object log_weights
    cdef PowerRule rule
