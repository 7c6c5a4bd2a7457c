# cython: language_level=3
"""Horseshoe-prior EP, the per-feature work: tilted moments by quadrature over λ and the site
targets of the parallel site step (see horseshoe.pyx).

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning*.
"""

cdef struct TiltedMoments:
    double log_s    # log s_j, eq (15)
    double mean     # E[w_j], eq (16)
    double var      # Var[w_j], eqs (16)-(17)
    double eu2      # E[u_j²], eqs (18), (20)
    double ev2      # E[v_j²], eqs (19), (21)
    double t        # E[a/(a + λ²)] under the tilted λ, a = ν/ξ: E[u²] = 2ν(1 - t), E[v²] = 2ξt
    double r        # E[λ²/(λ² + η)]: E[w] = r m; the posterior relevance (1 - shrinkage) of feature j

cdef enum HorseshoeStatus:
    HS_OK = 0
    HS_BAD_CAVITY = 1    # a cavity variance not > 0 / not finite, or a non-finite cavity mean
    HS_ZERO_MASS = 2     # the quadrature sum vanished (cannot happen for valid finite input)

# One feature: the moments of g_j q^{\j} for the cavity N(w|m, η) N(u|0, ν) N(v|0, ξ).
cdef int tilted_moments_one(double m, double eta, double nu, double xi,
                            TiltedMoments* out) noexcept nogil


# The site step of all features at once (eqs 14-26): what it reads ...
cdef struct SiteState:
    const double* cavity_mean      # m_j: cavity mean of w_j (eq 14)
    const double* cavity_var       # η_j: cavity variance of w_j
    const double* cavity_var_u     # ν_j: cavity variance of u_j
    const double* cavity_var_v     # ξ_j: cavity variance of v_j
    const double* mean             # E_q[w_j]
    const double* var              # Var_q[w_j]
    const double* var_u            # Var_q[u_j]
    const double* var_v            # Var_q[v_j]
    const double* pi_w             # current sites, natural form: 1/η̃_j
    const double* h_w              # m̃_j/η̃_j
    const double* pi_u             # 1/ν̃_j
    const double* pi_v             # 1/ξ̃_j

# ... and what it writes (d entries each).
cdef struct SiteTargets:
    double* pi_w                   # undamped targets (eqs 22-25)
    double* h_w
    double* pi_u
    double* pi_v
    double* log_z                  # log Z̃'_j: eq (26) for the current sites, without the m̃²/η̃ term
    double* residual               # scaled change target - current (the convergence measure)
    double* relevance              # E[λ²/(λ² + η)] under the tilted distribution (E[w_j] = r_j m_j)
    int* status                    # 0 ok, > 0 improper cavity or marginal (outputs NaN), -1 w-target clipped

cdef int site_targets(const SiteState* state, const SiteTargets* out, Py_ssize_t d, double w_floor,
                      int n_threads, int* n_clipped) noexcept nogil
