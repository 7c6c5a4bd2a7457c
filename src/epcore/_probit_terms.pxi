# Gaussian-tail and probit terms shared by the site kernels (_site_kernels.pxd, cimported by
# sites.pyx) and, through _ivm_moments.pxi, ivm.pyx and ivm_refine.pyx (the fused scoring pass
# and the exchange scoring, which need g and ν but not log Z).
#
# Included (textually), so that there is one copy of these operations and the inline fast
# path of the IVM gives bitwise the site kernel's alpha and beta (tested in
# tests/test_ivm_scoring.py).  Not installed: no shipped .pxd includes it.

from libc.math cimport exp, isfinite

include "_gauss_tail_table.pxi"

cdef extern from *:
    """
    #define FASTEP_LOG_SQRT_2PI 0.91893853320467274178
    """
    const double _LOG_SQRT_2PI "FASTEP_LOG_SQRT_2PI"   # log(sqrt(2*pi))


cdef inline double _gauss_tail_poly(double x) noexcept nogil:
    """G(x) = N(x)/Phi(-x) - x for 0 <= x < 8 from the table of ``_gauss_tail_table.pxi``.

    One table row lookup and a Horner evaluation of its degree-9 polynomial in
    ``x - x0_i`` (no division, no branch on the interval); error < 1 ulp against mpmath.
    """
    cdef int i = <int>(x * _GT_INV_WIDTH), j
    cdef const double* coef = fastep_gauss_tail_coef + i * (_GT_DEGREE + 1)
    cdef double s = x - (i * _GT_WIDTH + 0.5 * _GT_WIDTH)
    cdef double p = coef[_GT_DEGREE]
    for j in range(_GT_DEGREE - 1, -1, -1):
        p = coef[j] + s * p
    return p


cdef inline double _normal_pdf(double z) noexcept nogil:
    """N(z; 0, 1) = exp(-z²/2 - log sqrt(2 pi))."""
    return exp(-0.5 * z * z - _LOG_SQRT_2PI)


cdef inline double _upper_tail_poly(double z, double g, double n) noexcept nogil:
    """Phi(-z) = N(z)/(z + G(z)) for 0 < z < 8, given g = G(z) and n = N(z) (a sum of
    positive terms in the denominator: no cancellation)."""
    return n / (z + g)


cdef inline void _hazard_terms(double z, double g, double n, double phi, double* hazard,
                               double* hazard_plus_z) noexcept nogil:
    """The hazard r = N(z)/Phi(z) and r + z without cancellation.

    * z <= 0: g = G(-z), r = -z + G(-z) (a sum of positive terms) and r + z = G(-z);
    * z > 0: n = N(z) and phi = Phi(z) (>= 1/2), r = n/phi and r + z (positive terms).

    ``g`` is not read for z > 0, ``n`` and ``phi`` not for z <= 0.
    """
    if z <= 0.0:
        hazard[0] = -z + g
        hazard_plus_z[0] = g
    else:
        hazard[0] = n / phi
        hazard_plus_z[0] = hazard[0] + z


cdef inline double _clamp(double v, double lower, double upper) noexcept nogil:
    if v < lower:
        return lower
    if v > upper:
        return upper
    return v


cdef inline void _probit_alpha_beta(double y, double c, double hazard, double hazard_plus_z,
                                    double* alpha, double* beta) noexcept nogil:
    """Probit alpha = y c r and beta = c² r (r + z) (IVM eqs 20-21, Minka eqs 59-60), r (r + z)
    clamped into its range [0, 1] against rounding; for a hazard r >= 1e-280 (z <~ 37)."""
    alpha[0] = y * c * hazard
    beta[0] = c * c * _clamp(hazard * hazard_plus_z, 0.0, 1.0)


cdef inline bint _probit_g_nu(double y, double c, double z, double g, double n,
                              double* alpha, double* beta) noexcept nogil:
    """Probit g = alpha, ν = beta (no log Z) for |z| < 8 with c = 1/sqrt(slope⁻² + s2) and
    z = y c (mu + bias), given g = G(|z|) and, for z > 0, n = N(z).

    The same operations as the site kernel (``_site_kernels._probit_core``: ``_cdf_terms_g`` and
    ``_probit_out``), so bitwise its alpha and beta there.  False if they are not finite
    (the site kernel then fails too).
    """
    cdef double hazard, hazard_plus_z, phi = 1.0
    if z > 0.0:
        phi = 1.0 - _upper_tail_poly(z, g, n)
    _hazard_terms(z, g, n, phi, &hazard, &hazard_plus_z)
    _probit_alpha_beta(y, c, hazard, hazard_plus_z, alpha, beta)
    return isfinite(alpha[0]) and isfinite(beta[0])
