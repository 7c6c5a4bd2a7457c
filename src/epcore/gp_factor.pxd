# cython: language_level=3
"""Dense GP EP: the factorisation of B = I + S^½ K S^½ and the evidence (see gp_factor.pyx)."""
from fastep._epcore.sites cimport SiteModel


cdef int gp_refactor(const double* K, int n, const double* site_precision,
                     const double* site_natural_mean, double* post_cov, double* post_mean,
                     double* post_diag, double* work, double* sqrt_prec,
                     double* log_chol_diag_sum, bint form_cov) noexcept nogil

cdef int gp_refactor_marginals(const double* K, int n, const double* site_precision,
                               const double* site_natural_mean, double* post_cov,
                               double* post_mean, double* post_diag, double* work,
                               double* sqrt_prec, double* log_chol_diag_sum,
                               double* inv_diag) noexcept nogil

cdef void gp_covariance_from_factor(const double* K, int n, const double* site_precision,
                                    double* post_cov, double* work, double* sqrt_prec) noexcept nogil

cdef int gp_factor_only(const double* K, int n, const double* site_precision, double* post_cov,
                        double* sqrt_prec) noexcept nogil

cdef void gp_form_covariance(const double* K, int n, const double* V, double* post_cov) noexcept nogil

cdef double gp_log_z(const SiteModel* model, const double* y, int n,
                     const double* site_precision, const double* site_natural_mean,
                     const double* post_diag, const double* post_mean,
                     double log_chol_diag_sum, int* bad_site) noexcept nogil

cdef bint gp_needs_stable_log_z(int n, const double* site_precision,
                                const double* post_diag) noexcept nogil

cdef double gp_log_z_stable(const SiteModel* model, const double* y, int n, const double* K,
                            const double* site_precision, const double* site_natural_mean,
                            const double* post_diag, double* work, double* vec,
                            double* cavity_mean, double* cavity_var, int* bad_site) noexcept nogil

cdef double gp_log_z_stable_factored(const SiteModel* model, const double* y, int n,
                                     const double* K, const double* site_precision,
                                     const double* site_natural_mean, const double* post_diag,
                                     const double* chol, const double* inv_diag, double* work,
                                     double* vec, double* cavity_mean, double* cavity_var,
                                     int* bad_site) noexcept nogil
