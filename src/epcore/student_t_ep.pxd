# cython: language_level=3
"""Dense fractional EP with Student-t sites (negative site precisions allowed): nogil blocks."""

cdef int robust_factor(const double* K_chol, int n, const double* site_precision,
                       const double* site_natural_mean, double* a_work, double* x_work, double* tmp,
                       double* post_mean, double* post_var, double* log_det, double* quad) noexcept nogil

cdef int robust_targets(const double* y, int n, double dof, double scale, double power,
                        const double* site_precision, const double* site_natural_mean,
                        const double* post_mean, const double* post_var,
                        double* cavity_mean, double* cavity_var, double* site_log_z,
                        double* target_precision, double* target_natural_mean,
                        double* sum_terms) noexcept nogil
