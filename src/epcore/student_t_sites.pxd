# cython: language_level=3
"""Student-t site kernel (see student_t_sites.pyx): moments of the powered site by quadrature."""

# log of the Student-t normaliser Γ((ν+1)/2) / (Γ(ν/2) sqrt(νπ) σ).
cdef double student_t_log_norm(double dof, double scale) noexcept nogil

# Student-t site raised to ``power`` (fractional EP), with the tilted means of log(1 + u) and
# u/(1 + u), u = (f - y)²/(ν σ²), for the gradients in ν and σ; log_norm from student_t_log_norm.
# Returns a SiteStatus (site_model.pxd).
cdef int student_t_moments(double dof, double scale, double power, double log_norm, double y,
                           double mu, double s2, double* log_z, double* alpha, double* beta,
                           double* mean_log1p_u, double* mean_u_ratio) noexcept nogil
