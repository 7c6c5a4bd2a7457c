# cython: language_level=3
"""Horseshoe-prior EP, the Gaussian part: marginals and cavities of one task's site configuration.

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning* (NIPS 2013).

Sites are in natural form per feature (eq 1): ``pi_w = 1/η̃``, ``h_w = m̃/η̃``, ``pi_u = 1/ν̃``,
``pi_v = 1/ξ̃``. :func:`marginals` computes, with the GIL released, the marginal means and
variances of ``q(w)`` (eqs 2-3), the marginal variances of ``q(u)`` and ``q(v)`` (eqs 5-13)
and the cavities of eq (14), written without the cancellation of ``1/V_jj - π_j``; it
reports a configuration whose posterior or cavities are improper instead. The factors of
its last call stay in the :class:`MarginalsWork` for the evidence and gradients (eqs 27-50,
horseshoe_ep.pyx) and for prediction.

w-marginals: the split Woodbury form
------------------------------------
Eq (3) needs ``Π⁻¹``; it loses ``log10(data precision / π_j)`` digits for a feature whose
site precision ``π_j`` is small next to its data precision ``‖x_j‖²/σ²`` (the relevant
features, whose sites are flat or negative), and fails for ``π_j ≤ 0``. The features are
therefore split into ``S = {j : π_j < SPLIT ‖x_j‖²/σ²}`` (typically the few relevant ones,
``k = |S|``, capped at ``n``, :func:`split_set` below) and ``B`` (the rest, ``π_j > 0``);
eq (3) is applied to ``B`` only,

    M_B = σ²I + X_B Π_B⁻¹ X_Bᵀ = L Lᵀ,    A_B⁻¹ = Π_B⁻¹ - Π_B⁻¹ X_Bᵀ M_B⁻¹ X_B Π_B⁻¹,

and ``S`` is treated exactly through the Schur complement ``Q = Π_S + X_Sᵀ M_B⁻¹ X_S`` (k x k):

    V_SS = Q⁻¹,   V_BB = A_B⁻¹ + G Q⁻¹ Gᵀ,   V_SB = -Q⁻¹Gᵀ,   G = Π_B⁻¹ W_Bᵀ W_S,   W = L⁻¹X.

``V_w ≻ 0`` iff ``Q ≻ 0`` (``Π_B ≻ 0``), so negative site precisions are handled exactly;
the relative rounding of the ``B`` variances is at most ``ε/SPLIT`` (while ``S`` is not
capped). Cost ``O(n²d + k²d + k³)``, memory ``O((n + k)d)``: no ``d x d`` (or ``k x d``
with ``k > n``) array is formed. When ``d ≤ n`` the ``d x d`` precision ``Π + XᵀX/σ²`` is
factorised directly (the dense form).

u- and v-marginals
------------------
``q(u) ∝ N(u | 0, ρ²C) Π_j exp(-π_j u_j²/2)`` with ``C = diag(a) + U Uᵀ`` (eqs 5, 31, 43):
``g = 1 + ρ²·a·π``, ``G = ρ²·a/g`` (eqs 8-9), ``L = ρ·U/g`` (eqs 12-13),
``M = I + ρ²·Uᵀdiag(π/g)U``, ``V = G + L M⁻¹ Lᵀ`` (eqs 10-11), in ``O(m²d)``; likewise
``q(v)`` with ``γ²``.

Reductions
----------
The column sums of squares (``diag(WᵀW)``, ``diag(TᵀT)``, ``diag(V XᵀX)``) are accumulated
in a fixed order: over the rows of a row-major array one row after the other; along a
contiguous column in two interleaved partial sums over blocks of eight
(:func:`_interleaved_dot`). Every matrix product, factorisation and triangular solve is
one call of scipy's BLAS/LAPACK (``scipy.linalg.cython_blas``/``cython_lapack``).
"""
import numpy as np

from libc.math cimport sqrt, isfinite
from libc.string cimport memcpy, memset
from scipy.linalg.cython_blas cimport dgemm, dgemv, dsyrk, dtrsm
from scipy.linalg.cython_lapack cimport dpotrf, dpotrs, dtrtrs
from fastep._epcore._blas cimport blas_int

#: Features whose site precision is below SPLIT times their data precision ‖x_j‖²/σ² go to S
#: (at most n of them, see split_set) ...
SPLIT = 1e-4
#: ... except those below HARD_SPLIT times it, which always do.
HARD_SPLIT = 1e-10
cdef double _SPLIT = SPLIT
cdef double _HARD_SPLIT = HARD_SPLIT


# --------------------------------------------------------------------------------------
# BLAS/LAPACK in column-major terms (alpha = 1, beta = 0 throughout)
# --------------------------------------------------------------------------------------
cdef inline void _gemm(char ta, char tb, int m, int n, int k, const double* a, int lda,
                       const double* b, int ldb, double* c, int ldc) noexcept nogil:
    """``C = op(A) op(B)``, C m x n."""
    cdef blas_int m_ = m, n_ = n, k_ = k, lda_ = lda, ldb_ = ldb, ldc_ = ldc
    cdef double one = 1.0, zero = 0.0
    memset(c, 0, <size_t>ldc * n * sizeof(double))
    dgemm(&ta, &tb, &m_, &n_, &k_, &one, <double*>a, &lda_, <double*>b, &ldb_, &zero, c, &ldc_)


cdef inline void _gemv(char trans, int m, int n, const double* a, int lda, const double* x,
                       double* y) noexcept nogil:
    """``y = op(A) x`` for A m x n."""
    cdef blas_int m_ = m, n_ = n, lda_ = lda, one_i = 1
    cdef double one = 1.0, zero = 0.0
    memset(y, 0, <size_t>(n if trans == b'T' else m) * sizeof(double))
    dgemv(&trans, &m_, &n_, &one, <double*>a, &lda_, <double*>x, &one_i, &zero, y, &one_i)


cdef inline void _syrk_lower(char trans, int n, int k, const double* a, int lda, double* c) noexcept nogil:
    """Lower triangle of ``C = op(A) op(A)ᵀ`` (n x n, leading dimension n; C = A Aᵀ for 'N')."""
    cdef blas_int n_ = n, k_ = k, lda_ = lda
    cdef double one = 1.0, zero = 0.0
    cdef char uplo = b'L'
    memset(c, 0, <size_t>n * n * sizeof(double))
    dsyrk(&uplo, &trans, &n_, &k_, &one, <double*>a, &lda_, &zero, c, &n_)


cdef inline void _mirror_lower(int n, double* c) noexcept nogil:
    """Copy the lower triangle of column-major C (n x n) onto its upper triangle."""
    cdef int i, j
    for j in range(n):
        for i in range(j + 1, n):
            c[j + <Py_ssize_t>i * n] = c[i + <Py_ssize_t>j * n]


cdef inline int _cholesky(int n, double* a) noexcept nogil:
    """Lower Cholesky factor in place of column-major A (n x n), its upper triangle zeroed;
    LAPACK's info (0 on success)."""
    cdef blas_int n_ = n, info = 0
    cdef char uplo = b'L'
    cdef int i, j
    dpotrf(&uplo, &n_, a, &n_, &info)
    if info != 0:
        return <int>info
    for j in range(n):
        for i in range(j):
            a[i + <Py_ssize_t>j * n] = 0.0
    return 0


cdef inline void _cho_solve(int n, const double* l, double* b) noexcept nogil:
    """``b ← (L Lᵀ)⁻¹ b`` for one right-hand side."""
    cdef blas_int n_ = n, one = 1, info = 0
    cdef char uplo = b'L'
    dpotrs(&uplo, &n_, &one, <double*>l, &n_, b, &n_, &info)


cdef inline int _solve_lower(int n, int nrhs, const double* l, double* b) noexcept nogil:
    """``B ← L⁻¹B`` for column-major B (n x nrhs); LAPACK's info (> 0: a zero pivot)."""
    cdef blas_int n_ = n, nrhs_ = nrhs, info = 0
    cdef char uplo = b'L', trans = b'N', diag = b'N'
    dtrtrs(&uplo, &trans, &diag, &n_, &nrhs_, <double*>l, &n_, b, &n_, &info)
    return <int>info


cdef inline void _identity(int n, double* a) noexcept nogil:
    cdef int i
    memset(a, 0, <size_t>n * n * sizeof(double))
    for i in range(n):
        a[i + <Py_ssize_t>i * n] = 1.0


cdef inline double _interleaved_dot(const double* a, const double* b, Py_ssize_t count) noexcept nogil:
    """``Σ a_i b_i`` along a contiguous column: two partial sums (even and odd entries), each
    block of eight added from its last pair to its first, then the two sums added."""
    cdef double acc0 = 0.0, acc1 = 0.0, t0, t1
    cdef Py_ssize_t i = 0
    while count - i >= 8:
        t0 = a[i + 6] * b[i + 6] + acc0
        t1 = a[i + 7] * b[i + 7] + acc1
        t0 = a[i + 4] * b[i + 4] + t0
        t1 = a[i + 5] * b[i + 5] + t1
        t0 = a[i + 2] * b[i + 2] + t0
        t1 = a[i + 3] * b[i + 3] + t1
        acc0 = a[i] * b[i] + t0
        acc1 = a[i + 1] * b[i + 1] + t1
        i += 8
    while i < count:
        acc0 = a[i] * b[i] + acc0
        if i + 1 < count:
            acc1 = a[i + 1] * b[i + 1] + acc1
        else:
            acc1 = acc1 + 0.0
        i += 2
    return 0.0 + (acc0 + acc1)


# --------------------------------------------------------------------------------------
# the buffers
# --------------------------------------------------------------------------------------
cdef class MarginalsWork:
    """One task's data and prior loadings with the buffers of :func:`marginals`.

    Parameters
    ----------
    X : ndarray (n, d), C-contiguous float64
    y : ndarray (n,), float64
    a : ndarray (d,)
        The diagonal part ``δ²D`` of the correlation matrix ``C = diag(a) + UUᵀ``.
    U : ndarray (d, m), C-contiguous
        Its loadings ``ΔP``.

    The products EP reuses are formed once: ``‖x_j‖²``, ``Xᵀy`` and, when ``d ≤ n``, ``XᵀX``.
    The arrays are kept by reference (read only).
    """

    def __init__(self, X, y, a, U):
        cdef const double[:, ::1] xv = X
        cdef const double[::1] yv = y
        cdef const double[::1] av = a
        cdef const double[:, ::1] uv = U
        cdef int n = xv.shape[0], d = xv.shape[1], m = uv.shape[1]
        self.n, self.d, self.m = n, d, m
        self.dense = d <= n
        self.k = 0
        self.buffers = {"X": X, "y": y, "a": a, "U": U}
        self.X = &xv[0, 0]
        self.y = &yv[0]
        self.a = &av[0]
        self.U = &uv[0, 0] if m > 0 else NULL
        col_sq = np.einsum("ij,ij->j", X, X)
        self.buffers["col_sq"] = col_sq
        self.col_sq = self._pointer("col_sq")
        # Xᵀy, and XᵀX (lower triangle, mirrored) in the dense form
        self.Xty = self._buffer("Xty", d)
        _gemv(b'N', d, n, self.X, d, self.y, <double*>self.Xty)
        if self.dense:
            self.XtX = self._buffer("XtX", d * d)
            if n == 1 or d == 1:
                _syrk_lower(b'T', d, n, self.X, n, <double*>self.XtX)
            else:
                _syrk_lower(b'N', d, n, self.X, d, <double*>self.XtX)
            _mirror_lower(d, <double*>self.XtX)
        self.ratio = self._buffer("ratio", d)
        self.in_s = <unsigned char*>self._buffer("in_s", d, np.uint8)
        self.S = <int*>self._buffer("S", d, np.intc)
        self.inv_pi_b = self._buffer("inv_pi_b", d)
        self.m_b = self._buffer("m_b", d)
        self.w_sq = self._buffer("w_sq", d)
        self.e = self._buffer("e", d)
        self.wb = self._buffer("wb", d)
        self.dvec = self._buffer("dvec", d)
        self.vxtx = self._buffer("vxtx", d)
        self.L = self._buffer("L", min(n, d) ** 2)
        self.xw = self._buffer("xw", n * d)
        self.V = self._buffer("V", d * d if self.dense else 0)
        self.alpha = self._buffer("alpha", n)
        self.beta = self._buffer("beta", n)
        self.xvec = self._buffer("xvec", n)
        self.k_capacity = 0
        if not self.dense:
            self.ensure_capacity(min(n, 8))
        self.u.g, self.v.g = self._buffer("u.g", d), self._buffer("v.g", d)
        self.u.G, self.v.G = self._buffer("u.G", d), self._buffer("v.G", d)
        self.u.Lm, self.v.Lm = self._buffer("u.Lm", d * m), self._buffer("v.Lm", d * m)
        self.u.A, self.v.A = self._buffer("u.A", d * m), self._buffer("v.A", d * m)
        self.u.Mg, self.v.Mg = self._buffer("u.Mg", m * m), self._buffer("v.Mg", m * m)
        self.u.R, self.v.R = self._buffer("u.R", m * m), self._buffer("v.R", m * m)
        self.u.T, self.v.T = self._buffer("u.T", d * m), self._buffer("v.T", d * m)

    cdef double* _pointer(self, str name):
        return <double*><size_t>self.buffers[name].ctypes.data

    cdef double* _buffer(self, str name, Py_ssize_t size, dtype=np.float64):
        # every buffer is written before it is read (the BLAS outputs are zeroed by the wrappers)
        self.buffers[name] = np.empty(max(size, 1), dtype=dtype)
        return self._pointer(name)

    cdef int ensure_capacity(self, int k) except -1:
        """Room for a split set of ``k`` features (grown by doubling)."""
        cdef int cap
        if k <= self.k_capacity:
            return 0
        cap = max(k, min(2 * self.k_capacity, self.d))
        self.WS = self._buffer("WS", <Py_ssize_t>self.n * cap)
        self.Q = self._buffer("Q", <Py_ssize_t>cap * cap)
        self.mu_s = self._buffer("mu_s", cap)
        self.G = self._buffer("G", <Py_ssize_t>self.d * cap)
        self.T = self._buffer("T", <Py_ssize_t>self.d * cap)
        self.LQinv = self._buffer("LQinv", <Py_ssize_t>cap * cap)
        self.k_capacity = cap
        return 0

    def _array(self, name, shape, order="C"):
        size = int(np.prod(shape))
        return self.buffers[name][:size].reshape(shape, order=order)

    def factors(self):
        """The arrays of the last :func:`marginals` call (views of the buffers), a dict.

        Split form (``d > n``): ``in_s`` (bool, d), ``S`` (the k indices of S), ``inv_pi_b``,
        ``m_b``, ``L`` (n x n, F order), ``WS`` (n x k, C order), ``LQ`` (k x k, F order),
        ``beta`` (n), ``mu_s`` (k). Dense form (``d <= n``): ``L`` (d x d, F order), ``V``
        (d x d), ``vxtx`` (d). Both: ``u`` and ``v``, dicts with ``g``, ``G`` and ``R`` (m x m,
        F order) and ``T`` (m x d, F order).
        """
        cdef int n = self.n, d = self.d, k = self.k, m = self.m
        out = {}
        if self.dense:
            out["L"] = self._array("L", (d, d), "F")
            out["V"] = self._array("V", (d, d))
            out["vxtx"] = self._array("vxtx", (d,))
        else:
            out["in_s"] = self._array("in_s", (d,)).astype(bool)
            out["S"] = np.flatnonzero(out["in_s"])
            out["inv_pi_b"] = self._array("inv_pi_b", (d,))
            out["m_b"] = self._array("m_b", (d,))
            out["L"] = self._array("L", (n, n), "F")
            out["beta"] = self._array("beta", (n,))
            out["WS"] = self._array("WS", (n, k))
            out["LQ"] = self._array("Q", (k, k), "F")
            out["mu_s"] = self._array("mu_s", (k,))
        for part in ("u", "v"):
            out[part] = {"g": self._array(part + ".g", (d,)), "G": self._array(part + ".G", (d,)),
                         "R": self._array(part + ".R", (m, m), "F"), "T": self._array(part + ".T", (m, d), "F")}
        return out


# --------------------------------------------------------------------------------------
# w-marginals (eqs 2-3, 14)
# --------------------------------------------------------------------------------------
cdef int _split_set(MarginalsWork w, double sigma2, const double* pi) noexcept nogil:
    """The features treated exactly through the Schur complement (``S``, module docstring);
    returns ``k = |S|`` (``in_s`` and ``S`` set), or -1 when more than ``n`` site precisions
    are ``<= 0`` (then ``Π + XᵀX/σ²`` is not positive definite: those coordinates span more
    dimensions than the data can lift).

    ``S`` holds the features whose ratio ``r_j = π_j σ²/‖x_j‖²`` (site over data precision)
    is below ``SPLIT``, but at most ``n``: the cost is ``O(n²d + nkd + k²d + k³)`` and the
    memory ``O((n + k)d)``, so ``k = |S| <= n`` keeps one iteration ``O(n²d)``. When more
    features qualify (a transient of EP at large d: 4262 of d = 10 000 at n = 100, all
    with ``r >= 3e-7``, against k <= 10 at convergence), ``S`` takes every feature with
    ``r_j < HARD_SPLIT`` and then the smallest ratios up to ``n``; the others stay in ``B``,
    whose variances then lose about ``log10(SPLIT/r_j)`` more digits than the ``ε/SPLIT``
    bound.
    """
    cdef int n = w.n, d = w.d, j, k = 0, n_forced = 0, n_nonpositive = 0
    for j in range(d):
        w.ratio[j] = pi[j] * (sigma2 / w.col_sq[j])
        w.in_s[j] = w.ratio[j] < _SPLIT
        k += w.in_s[j]
    if k > n:
        for j in range(d):
            n_forced += w.ratio[j] < _HARD_SPLIT
            n_nonpositive += pi[j] <= 0.0
        if n_nonpositive > n:
            return -1
        if n_forced >= n:
            for j in range(d):
                w.in_s[j] = w.ratio[j] < _HARD_SPLIT
        else:
            with gil:
                _cap_split_set(w, n - n_forced)
    k = 0
    for j in range(d):
        if w.in_s[j]:
            w.S[k] = j
            k += 1
    return k


cdef void _cap_split_set(MarginalsWork w, int n_free):
    """S = the features below HARD_SPLIT and the ``n_free`` smallest ratios among the others."""
    cdef int d = w.d
    ratio = np.asarray(<double[:d]>w.ratio).copy()
    in_s = np.asarray(<unsigned char[:d]>w.in_s)
    forced = ratio < _HARD_SPLIT
    rest = np.flatnonzero(in_s.astype(bool) & ~forced)
    keep = rest[np.argpartition(ratio[rest], n_free - 1)[:n_free]]
    forced[keep] = True
    in_s[:] = forced


cdef int _w_split(MarginalsWork w, double sigma2, const double* pi, const double* h,
                  const Marginals* out) noexcept nogil:
    """Split Woodbury form (module docstring) for ``d > n``."""
    cdef int n = w.n, d = w.d, k, i, j, c, info
    cdef double* L = w.L
    cdef double* xw = w.xw
    cdef double* WS
    cdef double* LQ
    cdef double* T
    cdef double* mu_s
    k = _split_set(w, sigma2, pi)
    if k < 0:
        return MARGINALS_IMPROPER
    if k > w.k_capacity:
        with gil:
            w.ensure_capacity(k)
    w.k = k
    for j in range(d):
        w.inv_pi_b[j] = 0.0 if w.in_s[j] else 1.0 / pi[j]                      # Π_B⁻¹ (0 on S)
        w.dvec[j] = sqrt(w.inv_pi_b[j])
    # M_B = σ²I + X_B Π_B⁻¹ X_Bᵀ = Z Zᵀ + σ²I with Z = X Π_B^{-1/2}, one syrk
    for i in range(n):
        for j in range(d):
            xw[<Py_ssize_t>i * d + j] = w.X[<Py_ssize_t>i * d + j] * w.dvec[j]
    _syrk_lower(b'T', n, d, xw, d, L)
    for i in range(n):
        L[i + <Py_ssize_t>i * n] += sigma2
    for j in range(n):
        for i in range(j, n):
            L[i + <Py_ssize_t>j * n] = L[i + <Py_ssize_t>j * n] + 0.0
    if _cholesky(n, L) != 0:
        return MARGINALS_IMPROPER
    # W = L⁻¹X: X's row-major memory is Xᵀ column-major, so solve Wᵀ Lᵀ = Xᵀ from the right
    memcpy(xw, w.X, <size_t>n * d * sizeof(double))
    cdef blas_int m_ = d, n_ = n
    cdef double one = 1.0
    cdef char side = b'R', uplo = b'L', trans = b'T', diag = b'N'
    dtrsm(&side, &uplo, &trans, &diag, &m_, &n_, &one, L, &n_, xw, &m_)
    memset(w.w_sq, 0, <size_t>d * sizeof(double))
    for i in range(n):
        for j in range(d):
            w.w_sq[j] = xw[<Py_ssize_t>i * d + j] * xw[<Py_ssize_t>i * d + j] + w.w_sq[j]
    for j in range(d):
        w.m_b[j] = h[j] * w.inv_pi_b[j]                                        # prior means of B
    _gemv(b'T', d, n, w.X, d, w.m_b, w.xvec)
    for i in range(n):
        w.alpha[i] = w.y[i] - w.xvec[i]
    if _solve_lower(n, 1, L, w.alpha) != 0:
        return MARGINALS_SINGULAR
    for j in range(d):
        out.var[j] = w.inv_pi_b[j] * (1.0 - w.w_sq[j] * w.inv_pi_b[j])        # diag A_B⁻¹ (0 on S)
    if k:
        WS, LQ, T, mu_s = w.WS, w.Q, w.T, w.mu_s
        for i in range(n):
            for c in range(k):
                WS[<Py_ssize_t>i * k + c] = xw[<Py_ssize_t>i * d + w.S[c]]
        # Q = Π_S + W_SᵀW_S
        if k == 1:
            _syrk_lower(b'T', 1, n, WS, n, LQ)
        else:
            _syrk_lower(b'N', k, n, WS, k, LQ)
        _mirror_lower(k, LQ)
        for c in range(k):
            LQ[c + <Py_ssize_t>c * k] += pi[w.S[c]]
        if _cholesky(k, LQ) != 0:
            return MARGINALS_IMPROPER
        _gemv(b'N', k, n, WS, k, w.alpha, mu_s)                                 # W_Sᵀα
        for c in range(k):
            mu_s[c] = h[w.S[c]] + mu_s[c]
        _cho_solve(k, LQ, mu_s)
        if k == 1:
            _gemv(b'N', n, 1, WS, n, mu_s, w.xvec)
        else:
            _gemv(b'T', k, n, WS, k, mu_s, w.xvec)
        for i in range(n):
            w.beta[i] = w.alpha[i] - w.xvec[i]
        # the V_BB correction diag(G Q⁻¹ Gᵀ), G = Π_B⁻¹ W_Bᵀ W_S, from T = L_Q⁻¹ W_Sᵀ W
        if k == 1:
            _gemm(b'N', b'N', d, 1, n, xw, d, WS, n, w.G, d)
        else:
            _gemm(b'N', b'T', d, k, n, xw, d, WS, k, w.G, d)
        for c in range(k):
            for j in range(d):
                T[c + <Py_ssize_t>j * k] = w.G[j + <Py_ssize_t>c * d]
        if _solve_lower(k, d, LQ, T) != 0:
            return MARGINALS_SINGULAR
        for j in range(d):
            w.e[j] = w.w_sq[j] - _interleaved_dot(T + <Py_ssize_t>j * k, T + <Py_ssize_t>j * k, k)
            out.var[j] = w.inv_pi_b[j] * (1.0 - w.e[j] * w.inv_pi_b[j])
        _identity(k, w.LQinv)
        if _solve_lower(k, k, LQ, w.LQinv) != 0:
            return MARGINALS_SINGULAR
        for c in range(k):
            out.var[w.S[c]] = _interleaved_dot(w.LQinv + <Py_ssize_t>c * k, w.LQinv + <Py_ssize_t>c * k, k)
    else:
        memcpy(w.beta, w.alpha, <size_t>n * sizeof(double))
        memcpy(w.e, w.w_sq, <size_t>d * sizeof(double))
    _gemv(b'N', d, n, xw, d, w.beta, w.wb)                                     # Wᵀβ
    # cavities (eq 14) for B without the cancellation of 1/V_jj - π_j: with
    # V_jj = (1 - e_j/π_j)/π_j, the cavity precision is e_j/(1 - e_j/π_j) and the cavity
    # mean m_B,j + (Wᵀβ)_j/e_j
    for j in range(d):
        out.mean[j] = w.m_b[j] + w.wb[j] * w.inv_pi_b[j]
        out.cav_prec[j] = w.e[j] / (1.0 - w.e[j] * w.inv_pi_b[j])
        out.cav_mean[j] = w.m_b[j] + w.wb[j] / w.e[j]
    for c in range(k):
        j = w.S[c]
        out.mean[j] = w.mu_s[c]
        out.cav_prec[j] = 1.0 / out.var[j] - pi[j]
        out.cav_mean[j] = (w.mu_s[c] / out.var[j] - h[j]) / out.cav_prec[j]
    return MARGINALS_OK


cdef int _w_dense(MarginalsWork w, double sigma2, const double* pi, const double* h,
                  const Marginals* out) noexcept nogil:
    """The dense form for ``d ≤ n``: ``V_w⁻¹ = Π + XᵀX/σ²`` factorised directly."""
    cdef int d = w.d, i, j
    cdef double* L = w.L
    cdef double* V = w.V
    cdef double* linv = w.xw
    for j in range(d):
        for i in range(j, d):
            L[i + <Py_ssize_t>j * d] = w.XtX[<Py_ssize_t>i * d + j] / sigma2
        L[j + <Py_ssize_t>j * d] += pi[j]
    if _cholesky(d, L) != 0:
        return MARGINALS_IMPROPER
    for j in range(d):
        out.mean[j] = h[j] + w.Xty[j] / sigma2
    _cho_solve(d, L, out.mean)
    _identity(d, linv)
    if _solve_lower(d, d, L, linv) != 0:
        return MARGINALS_SINGULAR
    _syrk_lower(b'T', d, d, linv, d, V)                                        # V = L⁻ᵀL⁻¹
    _mirror_lower(d, V)
    for j in range(d):
        out.var[j] = V[j + <Py_ssize_t>j * d]
        w.vxtx[j] = _interleaved_dot(V + <Py_ssize_t>j * d, w.XtX + <Py_ssize_t>j * d, d)
        w.e[j] = w.vxtx[j] / sigma2
    # cavities (eq 14) without forming 1/V_jj - π_j: 1 - π_j V_jj = (V XᵀX)_jj/σ² =: e_j,
    # cavity precision e_j/V_jj, cavity mean (μ_j - V_jj h_j)/e_j
    memcpy(linv, V, <size_t>d * d * sizeof(double))                           # V with a zero diagonal
    for j in range(d):
        linv[j + <Py_ssize_t>j * d] = 0.0
    if d == 1:
        _gemv(b'N', 1, 1, V, 1, w.Xty, w.wb)
        _gemv(b'N', 1, 1, linv, 1, h, w.dvec)
    else:
        _gemv(b'T', d, d, V, d, w.Xty, w.wb)
        _gemv(b'T', d, d, linv, d, h, w.dvec)
    for j in range(d):
        out.cav_prec[j] = w.e[j] / out.var[j]
        out.cav_mean[j] = (w.wb[j] / sigma2 + w.dvec[j]) / w.e[j]
    return MARGINALS_OK


# --------------------------------------------------------------------------------------
# u- and v-marginals (eqs 5-13, 29-31)
# --------------------------------------------------------------------------------------
cdef int _latent(MarginalsWork w, LatentWork* lw, double scale2, const double* pi, double* var,
                 double* cav_var) noexcept nogil:
    """Marginal variances of ``q(u) ∝ N(u | 0, scale2·C) Π_j exp(-π_j u_j²/2)`` and the cavity
    variances (eq 14) in O(m²d); improper unless every ``g_j > 0`` and ``M ≻ 0`` (together
    equivalent to ``V ≻ 0``)."""
    cdef int d = w.d, m = w.m, j, i, c
    cdef double root, sj, cj
    for j in range(d):
        lw.g[j] = 1.0 + scale2 * w.a[j] * pi[j]
        if not lw.g[j] > 0.0:
            return MARGINALS_IMPROPER
    for j in range(d):
        lw.G[j] = scale2 * w.a[j] / lw.g[j]
    if m == 0:
        for j in range(d):
            var[j] = lw.G[j]
            cav_var[j] = scale2 * w.a[j]                    # the cavity is the prior marginal
        return MARGINALS_OK
    root = sqrt(scale2)
    for j in range(d):
        for c in range(m):
            lw.Lm[<Py_ssize_t>j * m + c] = (root / lw.g[j]) * w.U[<Py_ssize_t>j * m + c]
            lw.A[<Py_ssize_t>j * m + c] = w.U[<Py_ssize_t>j * m + c] * (scale2 * pi[j] / lw.g[j])
    # M = I + Aᵀ U (the transpose of the product Uᵀ A)
    if m == 1:
        _gemm(b'N', b'N', 1, 1, d, w.U, 1, lw.A, d, lw.Mg, 1)
    else:
        _gemm(b'N', b'T', m, m, d, w.U, m, lw.A, m, lw.Mg, m)
    for j in range(m):
        for i in range(j, m):
            lw.R[i + j * m] = lw.Mg[j + i * m]
        lw.R[j + j * m] += 1.0
    if _cholesky(m, lw.R) != 0:
        return MARGINALS_IMPROPER
    memcpy(lw.T, lw.Lm, <size_t>d * m * sizeof(double))
    if _solve_lower(m, d, lw.R, lw.T) != 0:                # R⁻¹Lᵀ (m, d)
        return MARGINALS_SINGULAR
    # cavity (eq 14) without 1/V_jj - π_j: u_j = ρ(√a_j z_j + U_j ζ) with ζ ~ N(0, I_m) and the
    # other sites acting on ζ only, so ν_j = scale2 (a_j + U_j M_{-j}⁻¹ U_jᵀ) with
    # M_{-j} = M - c_j U_jᵀU_j, c_j = scale2 π_j/g_j: by Sherman-Morrison
    # U_j M_{-j}⁻¹ U_jᵀ = s_j/(1 - c_j s_j), s_j = U_j M⁻¹ U_jᵀ, and 1 - c_j s_j >= 1/(1 + ‖P_j‖²/D_j).
    for j in range(d):
        sj = _interleaved_dot(lw.T + <Py_ssize_t>j * m, lw.T + <Py_ssize_t>j * m, m)
        var[j] = lw.G[j] + sj
        sj = sj * lw.g[j] * lw.g[j] / scale2
        cj = scale2 * pi[j] / lw.g[j]
        cav_var[j] = scale2 * (w.a[j] + sj / (1.0 - cj * sj))
    return MARGINALS_OK


# --------------------------------------------------------------------------------------
# all marginals
# --------------------------------------------------------------------------------------
cdef int marginals(MarginalsWork work, double sigma2, double rho2, double gamma2, const Sites* sites,
                   const Marginals* out) noexcept nogil:
    """Every marginal and cavity of a site configuration (GIL released).

    Returns MARGINALS_OK, or MARGINALS_IMPROPER when ``V_w``, ``V_u`` or ``V_v`` is not
    positive definite or a marginal variance or cavity (eq 14) is not positive and finite
    (then ``out`` holds partial values).
    """
    cdef int d = work.d, j, st
    if work.dense:
        st = _w_dense(work, sigma2, sites.pi_w, sites.h_w, out)
    else:
        st = _w_split(work, sigma2, sites.pi_w, sites.h_w, out)
    if st != MARGINALS_OK:
        return st
    st = _latent(work, &work.u, rho2, sites.pi_u, out.var_u, out.cav_var_u)
    if st != MARGINALS_OK:
        return st
    st = _latent(work, &work.v, gamma2, sites.pi_v, out.var_v, out.cav_var_v)
    if st != MARGINALS_OK:
        return st
    for j in range(d):
        if not (out.var[j] > 0.0 and out.var_u[j] > 0.0 and out.var_v[j] > 0.0
                and out.cav_prec[j] > 0.0 and isfinite(out.cav_prec[j]) and isfinite(out.cav_mean[j])
                and out.cav_var_u[j] > 0.0 and isfinite(out.cav_var_u[j])
                and out.cav_var_v[j] > 0.0 and isfinite(out.cav_var_v[j]) and isfinite(out.mean[j])):
            return MARGINALS_IMPROPER
    for j in range(d):
        out.cav_var[j] = 1.0 / out.cav_prec[j]
    return MARGINALS_OK
