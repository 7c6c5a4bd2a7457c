# cython: language_level=3
"""Horseshoe-prior EP, the Gaussian part: the marginals of ``q(w)``, ``q(u)``, ``q(v)`` and the
cavities of eq (14) from the sites (see horseshoe_marginals.pyx).

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning*.
"""

# The sites of one task in natural form (eq 1), d entries each.
cdef struct Sites:
    double* pi_w          # 1/η̃_j
    double* h_w           # m̃_j/η̃_j
    double* pi_u          # 1/ν̃_j
    double* pi_v          # 1/ξ̃_j

# The marginals and cavities of one site configuration, d entries each.
cdef struct Marginals:
    double* mean          # E_q[w_j] (eq 2)
    double* var           # Var_q[w_j]
    double* cav_prec      # 1/η_j, the cavity precision of w_j (eq 14)
    double* cav_mean      # m_j, the cavity mean of w_j
    double* cav_var       # η_j = 1/cav_prec
    double* var_u         # Var_q[u_j] (eqs 5-13)
    double* cav_var_u     # ν_j
    double* var_v         # Var_q[v_j]
    double* cav_var_v     # ξ_j

cpdef enum MarginalsStatus:
    MARGINALS_OK = 0
    MARGINALS_IMPROPER = 1     # V_w, V_u or V_v not positive definite, or an improper cavity
    MARGINALS_SINGULAR = 2     # a triangular solve met an exactly zero pivot (cannot follow a successful Cholesky)

# Scratch and factors of the u- or v-marginals (eqs 5-13): d x m loadings.
cdef struct LatentWork:
    double* g             # 1 + scale²·a_j·π_j (eqs 8-9)
    double* G             # scale²·a_j/g_j
    double* Lm            # √scale²·U/g (d x m, C order)
    double* A             # U·diag(scale²·π/g) (d x m, C order)
    double* Mg            # (Uᵀ A), m x m, column-major (M is its transpose)
    double* R             # Cholesky factor of M = I + scale²·Uᵀdiag(π/g)U (m x m, column-major)
    double* T             # R⁻¹Lᵀ (m x d, column-major)


cdef class MarginalsWork:
    """Buffers and last factors of :func:`marginals` for one task (horseshoe_marginals.pyx)."""
    cdef readonly int n
    cdef readonly int d
    cdef readonly int m
    cdef readonly bint dense
    cdef readonly int k                 # |S| of the last split-form w-marginals
    cdef int k_capacity
    cdef dict buffers                   # the numpy arrays behind every pointer below, by name
    # the problem
    cdef const double* X                # (n, d), C order
    cdef const double* y
    cdef const double* col_sq           # ‖x_j‖²
    cdef const double* Xty
    cdef const double* XtX              # (d, d) when d <= n
    cdef const double* a                # the prior's diag part, a = δ²D
    cdef const double* U                # the prior's loadings ΔP (d x m, C order)
    # the w-marginals
    cdef double* ratio                  # π_j σ²/‖x_j‖²
    cdef unsigned char* in_s            # feature j in S
    cdef int* S                         # the indices of S, ascending
    cdef double* inv_pi_b               # Π_B⁻¹ (0 on S)
    cdef double* m_b                    # Π_B⁻¹h (the prior means of B)
    cdef double* w_sq                   # diag(WᵀW)
    cdef double* e                      # diag(WᵀW) - diag(TᵀT) (split), diag(V XᵀX)/σ² (dense)
    cdef double* wb                     # Wᵀβ (split); V Xᵀy (dense)
    cdef double* dvec                   # Π_B^{-1/2} (split); V_off h (dense)
    cdef double* L                      # Cholesky of M_B (n x n) or of V_w⁻¹ (d x d), column-major
    cdef double* xw                     # X Π_B^{-1/2}, then W = L⁻¹X (n x d, C order); dense: L⁻¹, then V_off
    cdef double* V                      # V_w (d x d, dense form)
    cdef double* vxtx                   # diag(V XᵀX)
    cdef double* alpha                  # L⁻¹(y - X m_B)
    cdef double* beta                   # α - W_S μ_S
    cdef double* xvec                   # X m_B, then W_S μ_S
    cdef double* WS                     # W[:, S] (n x k, C order)
    cdef double* Q                      # Q = Π_S + W_SᵀW_S, then its Cholesky factor (k x k, column-major)
    cdef double* mu_s                   # μ_S
    cdef double* G                      # (W_SᵀW)ᵀ (d x k, column-major)
    cdef double* T                      # L_Q⁻¹W_SᵀW (k x d, column-major)
    cdef double* LQinv                  # L_Q⁻¹ (k x k, column-major)
    cdef LatentWork u
    cdef LatentWork v

    cdef double* _pointer(self, str name)
    cdef double* _buffer(self, str name, Py_ssize_t size, dtype=*)
    cdef int ensure_capacity(self, int k) except -1


cdef int marginals(MarginalsWork work, double sigma2, double rho2, double gamma2, const Sites* sites,
                   const Marginals* out) noexcept nogil
