# cython: language_level=3
"""Nested EP site kernel of the multinomial probit likelihood (inner EP in c + 1 dimensions)."""

cdef int nested_site(int c, int label, const double* cav_prec, const double* cav_lin,
                     double* alpha_s, double* beta_s, int max_sweeps, double tol, double damping,
                     double* log_z, double* work) noexcept nogil
