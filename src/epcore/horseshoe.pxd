# cython: language_level=3
"""Horseshoe-prior EP: tilted moments by quadrature over λ and the parallel site step (see horseshoe.pyx).

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
