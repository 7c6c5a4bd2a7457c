# cython: language_level=3
"""Horseshoe-prior EP, the per-feature work: tilted moments by one-dimensional quadrature,
vectorised over features, and the site step of all features at once.

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning* (NIPS 2013).

:func:`tilted_moments` is the Python entry to the quadrature; ``site_targets`` (cdef, see
horseshoe.pxd) is the engine's site step (:class:`fastep._epcore.horseshoe_ep.HorseshoeEP`):
from the cavities (eq 14), marginals and current sites (a ``SiteState``) it writes the
undamped site targets (eqs 22-25), the site normalisers (eq 26), the scaled residuals and the
relevances of all features (a ``SiteTargets``), over OpenMP threads, with the GIL released.

The factor ``g_j(w, u, v) = N(w | 0, u²/v²)`` times the cavity
``N(w | m, η) N(u | 0, ν) N(v | 0, ξ)`` (eq 14) has, with ``a = ν/ξ`` (``u/v`` is then Cauchy
with scale ``√a``), the normaliser (eq 15)

    s = ∫_0^∞ N(m | 0, λ² + η) C⁺(λ | 0, √a) dλ,

and given ``λ`` the tilted ``w`` is Gaussian with mean ``r m`` and variance ``r η``,
``r = λ²/(λ² + η)`` (eqs 16-17). Eqs (18)-(21) reduce to ``E[u²] = 2ν(1 - t)`` and
``E[v²] = 2ξ t`` with ``t = E[a/(a + λ²)]`` (so one quadrature serves both, as the
supplement notes; ``1 - t = E[λ²/(a + λ²)]`` is summed separately to avoid cancellation).

Quadrature
----------
The integrand is smooth in ``s = log λ``: it grows like ``e^{s}`` to the left of
``min(√a, √η)``, decays like ``e^{-2s}`` to the right of ``max(√a, √η, |m|)``, and has its
mass (one or two modes: a "spike" near ``λ ≈ √a`` and a "slab" near ``λ ≈ |m|``) in between.
It is analytic in a strip about the real ``s`` axis whose half-width is about π/4 where
``exp(-m²/(2(λ² + η)))`` varies (large ``m²/η``), and wider elsewhere; the trapezoidal rule
converges geometrically for such functions. We use it on ``t`` with

    s = t + e^{t - B} - e^{A - t},   ds/dt = 1 + e^{t - B} + e^{A - t},

where ``[A, B] = [min(½log a, ½log η) - 4, max(½log a, ½log η, log|m|) + 3]`` is the core
(where the map is close to the identity) and the map compresses the two tails
double-exponentially, so that ``t ∈ [A - 4.5, B + 4.5]`` covers everything to below
``e^{-80}``. The step is ``h = 0.13 + 0.12/(1 + m²/(4η))``: the sharp slab mode of large
``m²/η`` gets the fine step, a continuous function of the cavity so that the quadrature
error (≲ 3e-14 relative in every output against the reference twin's wide fine rule on
random and adversarial cavities, see tests/test_horseshoe_moments.py) varies smoothly
with the parameters (finite-difference gradient checks need that). The integrand is
scaled by its value at the best of the candidate peaks ``½log a``, ``½log η`` and
``log|m| - ½log 2`` (no overflow or underflow of the sum), and the variance of ``r`` is
accumulated about ``r`` at that point (no cancellation). Typically 80-200 nodes; the
node count grows with the spread ``B - A``.
"""
import numpy as np
from cython.parallel cimport prange
from libc.math cimport log, exp, sqrt, fabs, ceil, isfinite, NAN

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int fastep_hs_max_threads(void) { return omp_get_max_threads(); }
    static int fastep_hs_openmp(void) { return 1; }
    #else
    static int fastep_hs_max_threads(void) { return 1; }
    static int fastep_hs_openmp(void) { return 0; }
    #endif
    #define HS_LOG_SQRT_2PI 0.91893853320467274178
    #define HS_LOG_2_OVER_PI (-0.45158270528945486473)
    #define HS_HALF_LOG_2 0.34657359027997265471
    """
    int fastep_hs_max_threads() noexcept nogil
    int fastep_hs_openmp() noexcept nogil
    double HS_LOG_SQRT_2PI
    double HS_LOG_2_OVER_PI
    double HS_HALF_LOG_2

OPENMP = bool(fastep_hs_openmp())

# Quadrature constants (module docstring).
cdef double CORE_LEFT = 4.0
cdef double CORE_RIGHT = 3.0
cdef double TAIL = 4.5
cdef int REFRESH = 32       # recompute the geometric tail factors exactly every REFRESH nodes
cdef Py_ssize_t CHUNK = 256 # features per OpenMP work item


cdef inline double _hc_part(double z) noexcept nogil:
    """``λ̂/(1 + λ̂²) = 1/(2 cosh z)`` for ``λ̂ = e^z`` (overflow-free)."""
    cdef double ez = exp(-fabs(z))
    return ez / (1.0 + ez * ez)


cdef inline double _log_g(double s, double m2h, double eta, double hla) noexcept nogil:
    """log of the integrand in ``s`` up to the constant ``-½log 2π + log(2/π)``."""
    cdef double q = exp(2.0 * s) + eta
    return -0.5 * log(q) - m2h / q + log(_hc_part(s - hla))


cdef int _tilted_core(double m, double eta, double log_a, double* res) noexcept nogil:
    """The quadrature for scaled inputs: res = (log s, E[r], Var[r], t, 1 - t), r = λ²/(λ² + η)."""
    cdef double hla, hle, m2h, A, B, lm, h, g_ref, g, s_ref, s_try
    cdef double q_ref, iq_ref, hc_ref, x0, r0, a, t0, tk, el, er, el_step, er_step
    cdef double s, wk, z, ez, ez2, inv1, hc, t_fac, omt_fac, x, q, iq, expo, f, dr
    cdef double S0 = 0.0, S1 = 0.0, S2 = 0.0, St = 0.0, Somt = 0.0, mean_dr, var_r, er_r
    cdef int k, n_nodes
    cdef bint a_ok
    hla = 0.5 * log_a
    hle = 0.5 * log(eta)
    m2h = 0.5 * m * m
    A = (hla if hla < hle else hle) - CORE_LEFT
    B = hla if hla > hle else hle
    # reference point: the best of the candidate peaks
    s_ref = hla
    g_ref = _log_g(hla, m2h, eta, hla)
    g = _log_g(hle, m2h, eta, hla)
    if g > g_ref:
        g_ref = g
        s_ref = hle
    if m != 0.0:
        lm = log(fabs(m))
        if lm > B:
            B = lm
        s_try = lm - HS_HALF_LOG_2
        g = _log_g(s_try, m2h, eta, hla)
        if g > g_ref:
            g_ref = g
            s_ref = s_try
    B = B + CORE_RIGHT
    h = 0.13 + 0.12 / (1.0 + 0.5 * m2h / eta)
    x0 = exp(2.0 * s_ref)
    q_ref = x0 + eta
    iq_ref = 1.0 / q_ref
    hc_ref = _hc_part(s_ref - hla)
    r0 = x0 * iq_ref
    a_ok = fabs(log_a) < 600.0
    a = exp(log_a) if a_ok else 0.0
    t0 = A - TAIL
    n_nodes = <int>ceil((B - A + 2.0 * TAIL) / h) + 1
    el_step = exp(-h)
    er_step = exp(h)
    el = 0.0
    er = 0.0
    for k in range(n_nodes):
        tk = t0 + k * h
        if k % REFRESH == 0:
            el = exp(A - tk)
            er = exp(tk - B)
        else:
            el = el * el_step
            er = er * er_step
        s = tk + er - el
        wk = h * (1.0 + er + el)
        z = s - hla
        ez = exp(-fabs(z))
        ez2 = ez * ez
        inv1 = 1.0 / (1.0 + ez2)
        hc = ez * inv1
        if z <= 0.0:            # λ̂ = e^z <= 1
            t_fac = inv1         # a/(a + λ²) = 1/(1 + λ̂²)
            omt_fac = ez2 * inv1
        else:
            t_fac = ez2 * inv1
            omt_fac = inv1
        if a_ok and fabs(z) < 300.0:   # λ² = a λ̂² without another exp (ez2 representable)
            x = a * ez2 if z <= 0.0 else a / ez2
        else:
            x = exp(2.0 * s)
        q = x + eta
        iq = 1.0 / q
        expo = m2h * (iq_ref - iq)
        if expo > 700.0:
            expo = 700.0
        f = exp(expo) * sqrt(q_ref * iq) * (hc / hc_ref) * wk
        if not (f > 0.0):
            continue
        dr = ((x - x0) * iq_ref) * (eta * iq)  # r - r0 = η(x - x0)/(q q_ref), no cancellation or overflow
        S0 += f
        S1 += f * dr
        S2 += f * dr * dr
        St += f * t_fac
        Somt += f * omt_fac
    if not (S0 > 0.0 and isfinite(S0)):
        return HS_ZERO_MASS
    mean_dr = S1 / S0
    var_r = S2 / S0 - mean_dr * mean_dr
    if var_r < 0.0:
        var_r = 0.0
    res[0] = log(S0) + g_ref - HS_LOG_SQRT_2PI + HS_LOG_2_OVER_PI
    res[1] = r0 + mean_dr
    res[2] = var_r
    res[3] = St / S0
    res[4] = Somt / S0
    return HS_OK


cdef int tilted_moments_one(double m, double eta, double nu, double xi,
                            TiltedMoments* out) noexcept nogil:
    """Moments of ``g_j q^{\\j}`` (eqs 15-21) by the mapped trapezoidal rule (module docstring).

    The problem is scale-equivariant (``w → cw`` maps ``m, √η, √a`` to ``c·`` themselves,
    ``s`` to ``s/c``, the moments of ``w`` by ``c, c²`` and leaves ``t``, ``r`` unchanged), so
    it is solved for ``c = e^{-k}``, ``k`` the midpoint of the log-scales, which keeps every
    ``λ²`` on the grid representable; cavities whose scales ``√η, √a, |m|`` span more than
    ``e^{250}`` are rejected (``HS_BAD_CAVITY``).
    """
    cdef double log_a, hla, hle, hi, lo, k, c, res[5]
    cdef int st
    out.log_s = NAN; out.mean = NAN; out.var = NAN; out.eu2 = NAN; out.ev2 = NAN; out.t = NAN; out.r = NAN
    if not (isfinite(m) and isfinite(eta) and eta > 0.0 and isfinite(nu) and nu > 0.0
            and isfinite(xi) and xi > 0.0):
        return HS_BAD_CAVITY
    log_a = log(nu) - log(xi)
    hla = 0.5 * log_a
    hle = 0.5 * log(eta)
    lo = hla if hla < hle else hle
    hi = hla if hla > hle else hle
    if m != 0.0 and log(fabs(m)) > hi:
        hi = log(fabs(m))
    if hi - lo > 500.0:
        return HS_BAD_CAVITY
    k = 0.0
    if hi > 200.0 or lo < -200.0:
        k = 0.5 * (hi + lo)
    c = exp(-k)
    st = _tilted_core(m * c, eta * c * c, log_a - 2.0 * k, res)
    if st != HS_OK:
        return st
    out.log_s = res[0] - k
    out.r = res[1]
    out.mean = m * res[1]
    out.var = eta * res[1] + m * m * res[2]
    out.t = res[3]
    out.eu2 = 2.0 * nu * res[4]
    out.ev2 = 2.0 * xi * res[3]
    return HS_OK


def max_threads():
    """Threads the array functions may use (the OpenMP maximum; 1 without OpenMP)."""
    return fastep_hs_max_threads()


cdef inline const double[::1] _vec(object value, Py_ssize_t n, str name):
    arr = np.ascontiguousarray(value, dtype=np.float64)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-D array of length {n}, got shape {arr.shape}")
    return arr


cdef inline double[::1] _out(object value, Py_ssize_t n, str name):
    if value is None:
        return np.empty(n)
    if not (isinstance(value, np.ndarray) and value.dtype == np.float64 and value.ndim == 1
            and value.shape[0] == n and value.flags.c_contiguous and value.flags.writeable):
        raise ValueError(f"{name} must be a writeable C-contiguous float64 array of length {n}")
    return value


def tilted_moments(m, eta, nu, xi, *, n_threads=None):
    """Tilted moments for every feature at once (eqs 15-21), GIL released.

    Parameters
    ----------
    m, eta : array_like (d,)
        Cavity mean and variance of ``w_j`` (eq 14).
    nu, xi : array_like (d,)
        Cavity variances of ``u_j`` and ``v_j`` (eq 14).
    n_threads : int, optional
        OpenMP threads (default :func:`max_threads`); results do not depend on it.

    Returns
    -------
    log_s, mean, var, eu2, ev2, t : ndarray (d,)
        ``log s_j`` (eq 15), ``E[w_j]`` (eq 16), ``Var[w_j]`` (eqs 16-17), ``E[u_j²]``,
        ``E[v_j²]`` (eqs 18-21) and ``t_j = E[a/(a + λ²)]``.

    Raises
    ------
    ValueError
        If a cavity variance is not positive and finite or a mean is not finite
        (naming the first such feature).
    """
    m_arr = np.atleast_1d(np.asarray(m, dtype=np.float64)).ravel()
    cdef Py_ssize_t n = m_arr.shape[0]
    cdef const double[::1] mv = _vec(m_arr, n, "m")
    cdef const double[::1] ev = _vec(np.broadcast_to(np.asarray(eta, dtype=np.float64).ravel(), (n,)), n, "eta")
    cdef const double[::1] nv = _vec(np.broadcast_to(np.asarray(nu, dtype=np.float64).ravel(), (n,)), n, "nu")
    cdef const double[::1] xv = _vec(np.broadcast_to(np.asarray(xi, dtype=np.float64).ravel(), (n,)), n, "xi")
    out = np.empty((6, n))
    cdef double[:, ::1] o = out
    cdef int[::1] status = np.zeros(n, dtype=np.intc)
    cdef Py_ssize_t j, c, n_chunks = (n + CHUNK - 1) // CHUNK, start, end
    cdef int nt = fastep_hs_max_threads() if n_threads is None else max(1, int(n_threads))
    cdef TiltedMoments tm
    if nt > n_chunks:
        nt = <int>n_chunks if n_chunks > 0 else 1
    with nogil:
        if nt <= 1:
            for j in range(n):
                status[j] = tilted_moments_one(mv[j], ev[j], nv[j], xv[j], &tm)
                o[0, j] = tm.log_s; o[1, j] = tm.mean; o[2, j] = tm.var
                o[3, j] = tm.eu2; o[4, j] = tm.ev2; o[5, j] = tm.t
        else:
            for c in prange(n_chunks, schedule='dynamic', num_threads=nt):
                _moments_range(mv, ev, nv, xv, o, status, c * CHUNK, min((c + 1) * CHUNK, n))
    bad = np.flatnonzero(np.asarray(status))
    if bad.size:
        j = bad[0]
        raise ValueError(
            f"invalid cavity for feature {j}: m={m_arr[j]!r}, eta={ev[j]!r}, nu={nv[j]!r}, xi={xv[j]!r} "
            "(variances must be finite and > 0, the mean finite, and the scales √eta, √(nu/xi), |m| "
            "within a factor e^250 of each other)")
    return tuple(out)


cdef void _moments_range(const double[::1] mv, const double[::1] ev, const double[::1] nv, const double[::1] xv,
                         double[:, ::1] o, int[::1] status, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    cdef TiltedMoments tm
    cdef Py_ssize_t j
    for j in range(start, end):
        status[j] = tilted_moments_one(mv[j], ev[j], nv[j], xv[j], &tm)
        o[0, j] = tm.log_s; o[1, j] = tm.mean; o[2, j] = tm.var
        o[3, j] = tm.eu2; o[4, j] = tm.ev2; o[5, j] = tm.t


cdef void _site_range(const SiteState* s, const SiteTargets* out, Py_ssize_t start, Py_ssize_t end,
                      double w_floor) noexcept nogil:
    cdef TiltedMoments tm
    cdef Py_ssize_t j
    cdef double eta, mc, nu, xi, tpw, thw, tpu, tpv, res, r
    cdef int st
    for j in range(start, end):
        mc = s.cavity_mean[j]
        eta = s.cavity_var[j]
        nu = s.cavity_var_u[j]
        xi = s.cavity_var_v[j]
        st = tilted_moments_one(mc, eta, nu, xi, &tm)
        if st == HS_OK and not (s.var[j] > 0.0 and s.var_u[j] > 0.0 and s.var_v[j] > 0.0
                                and isfinite(s.mean[j])):
            st = HS_BAD_CAVITY
        out.status[j] = st
        if st != HS_OK:
            out.pi_w[j] = NAN; out.h_w[j] = NAN; out.pi_u[j] = NAN; out.pi_v[j] = NAN
            out.log_z[j] = NAN; out.residual[j] = NAN; out.relevance[j] = NAN
            continue
        tpw = 1.0 / tm.var - 1.0 / eta                 # eq (22)
        thw = tm.mean / tm.var - mc / eta              # eq (23)
        if tpw * eta < w_floor:
            # the w-site precision is kept >= w_floor/η (a bounded negative or a flat site),
            # with the marginal mean still matching E[w]
            tpw = w_floor / eta
            thw = tm.mean * (1.0 + w_floor) / eta - mc / eta
            out.status[j] = -1
        tpu = 1.0 / tm.eu2 - 1.0 / nu                  # eq (24)
        tpv = 1.0 / tm.ev2 - 1.0 / xi                  # eq (25)
        out.pi_w[j] = tpw
        out.h_w[j] = thw
        out.pi_u[j] = tpu
        out.pi_v[j] = tpv
        # log Z̃'_j (eq 26 for the current sites, without the m̃²/η̃ term)
        out.log_z[j] = (tm.log_s - 0.5 * log(s.var[j] / eta) - 0.5 * s.mean[j] * s.mean[j] / s.var[j]
                        + 0.5 * mc * mc / eta - 0.5 * log(s.var_u[j] / nu) - 0.5 * log(s.var_v[j] / xi))
        # residual: site changes relative to cavity + |site| precision (the marginal's scale)
        r = 1.0 / eta + fabs(s.pi_w[j])
        res = fabs(tpw - s.pi_w[j]) / r
        r = fabs(thw - s.h_w[j]) / sqrt(r)
        if r > res:
            res = r
        r = fabs(tpu - s.pi_u[j]) / (1.0 / nu + fabs(s.pi_u[j]))
        if r > res:
            res = r
        r = fabs(tpv - s.pi_v[j]) / (1.0 / xi + fabs(s.pi_v[j]))
        if r > res:
            res = r
        out.residual[j] = res
        out.relevance[j] = tm.r


cdef int site_targets(const SiteState* state, const SiteTargets* out, Py_ssize_t d, double w_floor,
                      int n_threads, int* n_clipped) noexcept nogil:
    """Tilted moments (eqs 15-21), undamped site targets (eqs 22-25) and site normalisers
    (eq 26) of all ``d`` features, over ``n_threads`` OpenMP threads (0: :func:`max_threads`;
    results do not depend on it).

    ``w_floor`` is the negative-precision policy of the w-sites (``-inf``: none): a target
    ``1/η̃_j < w_floor/η_j`` (``η_j`` the cavity variance) is raised to ``w_floor/η_j``, with
    ``m̃_j/η̃_j`` set so that the marginal mean still matches ``E[w_j]``. The u- and v-sites
    always keep their targets (eqs 18-21 make one of them negative for almost every feature).

    Returns the number of features with an improper cavity or marginal (their outputs are
    NaN, their ``status`` positive); ``n_clipped`` receives the number of w-site targets raised
    to the floor (``status`` -1).
    """
    cdef Py_ssize_t c, j, n_chunks = (d + CHUNK - 1) // CHUNK
    cdef int nt = fastep_hs_max_threads() if n_threads <= 0 else n_threads
    cdef int n_bad = 0
    n_clipped[0] = 0
    if d == 0:
        return 0
    if nt > n_chunks:
        nt = <int>n_chunks
    if nt <= 1:
        _site_range(state, out, 0, d, w_floor)
    else:
        for c in prange(n_chunks, schedule='dynamic', num_threads=nt):
            _site_range(state, out, c * CHUNK, min((c + 1) * CHUNK, d), w_floor)
    for j in range(d):
        if out.status[j] > 0:
            n_bad += 1
        elif out.status[j] < 0:
            n_clipped[0] += 1
    return n_bad
