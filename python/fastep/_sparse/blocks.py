"""Sparse EP quantities that are sums over row blocks of the data, computed one block at a time.

The projections, the evidence gradient and the predictive of :mod:`fastep.sparse` only ever
need one block of training rows at a time plus an m x m (or m x n_features) global state.
This module holds those per-block computations, so that the in-core estimator (blocks of one
array, for bounded temporaries) and the distributed one (:mod:`fastep._sparse.distributed`,
blocks on Dask workers) run the same code.  Equations in :mod:`fastep.sparse` ("Evidence
gradient", "Prediction").
"""
import numpy as np
from scipy.linalg import cholesky, solve_triangular

from .._epcore import sparse_ep as _engine
from .._epcore.power_ep import power_moments_array
from .._linalg import inner, matmul
from .._prediction import BatchedPredictor

#: Elements of the n x m temporaries computed per block (K(X, Z), the gradient's G).
BLOCK_ELEMENTS = 1 << 21
#: Test points per batch of the latent predictive.
PREDICT_BATCH = 4096


def block_rows(m):
    """Rows per block so that a rows x m temporary has about ``BLOCK_ELEMENTS`` entries."""
    return max(1, BLOCK_ELEMENTS // max(m, 1))


def project_rows(kernel, X, Z, Kmm, options):
    """``(L, Vt, d)`` of the rows ``X``: ``L = chol(K_mm + jitter I)``, ``Vt = K(X, Z) L⁻ᵀ``
    and the FITC diagonal ``d = diag K(X, X) - |v_i|²`` (zeros for DTC).

    ``K(X, Z)`` is filled block by block into one n x m buffer that the engine turns into
    ``Vt`` in place.  Raises ``ValueError`` if the kernel produces non-finite values and
    ``numpy.linalg.LinAlgError`` if ``K_mm + jitter I`` is not positive definite.
    """
    n, m = X.shape[0], Z.shape[0]
    Knm = np.empty((n, m))
    rows = block_rows(m)
    for s in range(0, n, rows):
        Knm[s:s + rows] = kernel._K(X[s:s + rows], Z)
    kdiag = np.ascontiguousarray(kernel._diag(X), dtype=np.float64)
    for name, arr in (("K(Z, Z)", Kmm), ("K(X, Z)", Knm), ("diag K(X, X)", kdiag)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"the kernel {kernel!r} produced non-finite values in {name}")
    return _engine.sparse_projection(Kmm, Knm, kdiag, approximation=options.approximation,
                                     jitter=options.jitter, overwrite_knm=True)


def posterior_from_sums(precision_sum, natural_mean_sum):
    """``(R, μ_w, ½ log|A|, bᵀA⁻¹b)`` from the sites' sums ``Σ τ_i v_i v_iᵀ`` (upper triangle)
    and ``b = Σ ν_i v_i``, with ``A = I + Σ τ_i v_i v_iᵀ = Rᵀ R`` (R upper triangular).

    The driver's step of the distributed parallel schedule (the reduce).  Raises
    ``numpy.linalg.LinAlgError`` if A is not numerically positive definite.
    """
    m = natural_mean_sum.shape[0]
    A = np.triu(precision_sum) + np.eye(m)
    A = A + np.triu(A, 1).T
    try:
        R = np.ascontiguousarray(cholesky(A, lower=False, check_finite=True))
    except (np.linalg.LinAlgError, ValueError):
        raise np.linalg.LinAlgError(
            "Cholesky factorisation of A = I + Vt^T diag(tau) Vt failed: non-finite projections or "
            "sites") from None
    beta = solve_triangular(R, natural_mean_sum, trans="T")
    w_mean = solve_triangular(R, beta)
    return R, w_mean, float(np.sum(np.log(np.diag(R)))), float(inner(beta, beta))


def cavity_moments(likelihood, y, d, tau, nu, g_mean, g_var, options):
    """Cavities ``N(m_c, v_c + d)`` of f at the sites and the powered site kernel there:
    ``(m_c, var_f, a, b)`` (:mod:`fastep._epcore.sparse_ep`, "One site")."""
    power = options.power
    v_c = g_var / (1.0 - power * tau * g_var)
    m_c = g_mean + v_c * power * (tau * g_mean - nu)
    var_f = v_c + d
    _, a, b = power_moments_array(likelihood.site_spec(), y, m_c, var_f, power=power,
                                          n_quadrature=options.n_quadrature)
    return m_c, var_f, a, b


def _u_block(L, Vt):
    """``U = K_mm⁻¹ K_m,block = L⁻ᵀ V_block`` (m x rows)."""
    return solve_triangular(L, Vt.T, lower=True, trans="T")


def gradient_first_sums(L, Vt, d, y, tau, nu, g_mean, g_var, likelihood, options, learn_likelihood):
    """First pass of the evidence gradient over one block of sites.

    Returns ``(P, Ua, likelihood_grad, a, c)``: the block's shares of ``P = U T Vᵀ`` (m x m)
    and ``U a`` (m), of the likelihood-parameter gradient (0 unless ``learn_likelihood``), and
    the block's ``a = ν - τ ∘ E[g]`` and ``c = (1/α) ∂ log Z_i/∂v_i`` (zeros for DTC) that the
    second pass needs.
    """
    power = options.power
    m_c, var_f, az, bz = cavity_moments(likelihood, y, d, tau, nu, g_mean, g_var, options)
    a = nu - tau * g_mean
    # (1/α) ∂ log Z_i/∂v_i = (a² - b)/(2α): ∂Z/∂v = ½ ∂²Z/∂m² for a Gaussian convolution
    c = (az * az - bz) / (2.0 * power) if options.approximation == "fitc" else np.zeros_like(a)
    U = _u_block(L, Vt)
    P = matmul(U * tau, Vt)
    Ua = matmul(U, a)
    lik = likelihood.power_ep_theta_gradient(y, m_c, var_f, az, bz, power) if learn_likelihood else 0.0
    return P, Ua, lik, a, c


def times_inverse_a(P, R):
    """``P A⁻¹`` with ``A = Rᵀ R`` (R upper triangular)."""
    return solve_triangular(R, solve_triangular(R, P.T, trans="T")).T


def gradient_second_sums(kernel, Z, X, L, Vt, tau, a, c, Ua, PA, learn_inducing):
    """Second pass over one block: ``G = ½ (U a) aᵀ - U diag(½ τ + c) + ½ (U T Vᵀ) A⁻¹ V T``
    for the block's columns, and its shares of ``2 ⟨G, ∂K_mn⟩ + ⟨c, ∂ diag K⟩`` (per kernel
    parameter), of ``G Uᵀ`` (m x m) and of the inducing-input gradient
    ``input_gradient(Z, X, 2G)`` (None unless ``learn_inducing``)."""
    U = _u_block(L, Vt)
    G = 0.5 * np.outer(Ua, a)
    G -= U * (0.5 * tau + c)
    G += 0.5 * matmul(PA, Vt.T) * tau
    Gmm = matmul(G, U.T)
    g_kernel = np.zeros(kernel.n_theta)
    if kernel.n_theta:
        g_kernel = 2.0 * kernel._weighted_grads(Z, X, G)
        g_kernel += matmul(c, np.column_stack(list(kernel._diag_grads(X, list(range(kernel.n_theta))))))
    g_z = kernel._input_grad(Z, X, 2.0 * G) if learn_inducing else None
    return g_kernel, Gmm, g_z


def gradient_from_sums(kernel, Z, g_kernel, Gmm, g_z, likelihood_grad, learn_likelihood, learn_inducing):
    """The evidence gradient (kernel θ, likelihood θ, Z) from the blocks' summed shares: the
    K_mm terms ``-⟨G Uᵀ, ∂K_mm⟩`` and ``-input_gradient(Z, Z, 2 G Uᵀ)`` are added here."""
    Gmm = 0.5 * (Gmm + Gmm.T)
    g_kernel = np.array(g_kernel, dtype=float)
    if kernel.n_theta:
        g_kernel -= kernel._weighted_grads(Z, None, Gmm)
    grads = [g_kernel]
    if learn_likelihood:
        grads.append(np.atleast_1d(likelihood_grad))
    if learn_inducing:
        grads.append((g_z - kernel._input_grad(Z, Z, 2.0 * Gmm)).ravel())
    return np.concatenate(grads)


class SparsePredictor(BatchedPredictor):
    """The latent predictive of a fitted sparse GP: ``q(f* | y) = ∫ p(f* | u) q(u | y) du``.

    Holds only m-sized state (kernel, Z, the Cholesky factor L of K_mm, the posterior factor R
    and ``K_mm⁻¹ E[u]``), so it is cheap to send to the workers that predict on a chunked
    array.  ``E f* = k_m(x*)ᵀ K_mm⁻¹ E[u]``, ``Var f* = k(x*, x*) - |L⁻¹ k_m(x*)|² +
    |R⁻ᵀ L⁻¹ k_m(x*)|²`` (:mod:`fastep.sparse`, "Prediction").
    """

    batch_size = PREDICT_BATCH

    def __init__(self, kernel, likelihood, Z, chol_mm, factor, w_mean):
        self.kernel = kernel
        self.likelihood = likelihood
        self.Z = Z
        self.chol_mm = chol_mm
        self.factor = factor
        self.w_mean = w_mean
        self.weights = solve_triangular(chol_mm, w_mean, lower=True, trans="T")   # K_mm⁻¹ E[u]

    def _latent_batch(self, Xs):
        Kms = self.kernel._K(self.Z, Xs)                                # (m, batch)
        Pm = solve_triangular(self.chol_mm, Kms, lower=True)    # L⁻¹ k_m(x*)
        Pq = solve_triangular(self.factor, Pm, trans="T")       # R⁻ᵀ L⁻¹ k_m(x*)
        return (matmul(self.weights, Kms),
                self.kernel._diag(Xs) - np.einsum("ij,ij->j", Pm, Pm) + np.einsum("ij,ij->j", Pq, Pq))
