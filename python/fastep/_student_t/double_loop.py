"""Double-loop (convergent) fractional EP for GP regression with Student-t sites.

The fallback of :class:`fastep._epcore.student_t_ep.DenseStudentTEP` when damped parallel
fractional EP stalls (no step keeps the posterior and the cavities proper) or does not
converge. It maximises the same fractional EP energy by the double-loop scheme of Heskes &
Zoeter ("Expectation propagation for approximate inference in dynamic Bayesian networks",
UAI 2002, §4), which Jylänki, Vanhatalo & Vehtari ("Robust Gaussian process regression with a
Student-t likelihood", JMLR 2011, §4.2) use for the Student-t model when parallel EP fails.

Notation: ``φ(f) = (-f²/2, f)``; natural parameters ``(precision, precision × mean)``. The
sites ``s_i``, the cavities ``a_i`` and the marginal parameters ``θ_i`` are tied by
``a_i = θ_i - η s_i`` (η the fractional power). With
``Φ(s) = log ∫ N(f; 0, K) Π_i exp(s_i·φ(f_i)) df = -½ log|I + K T| + ½ νᵀΣν`` and the tilted
log-partition ``g_i(a) = log ∫ exp(a·φ(f)) t(y_i | f)^η df`` the fractional EP energy (the
paper's eq 14) is

    G(θ) = min_a J(a; θ) - (1/η) Σ_i Ψ(θ_i),     J(a; θ) = Φ((θ - a)/η) + (1/η) Σ_i g_i(a_i),

``Ψ`` the log normaliser of a 1-D Gaussian. J is convex in ``a`` (Φ and every ``g_i`` are
log-partition functions), and its stationarity is moment matching, ``E_q[φ(f_i)] =
E_tilted_i[φ]``; G is stationary exactly where, in addition, ``θ_i`` are the marginals of q:
the fixed points of fractional EP.

* Inner loop: minimise ``J(·; θ)`` over the cavities by Newton's method. Gradient
  ``(E_tilted[φ] - E_q[φ])/η``; Hessian ``Cov_q[φ]/η² + (1/η) blockdiag(Cov_tilted_i[φ])``
  (the first from Σ and μ: ``Cov(f_i, f_j) = Σ_ij``, ``Cov(-f_i²/2, f_j) = -μ_i Σ_ij``,
  ``Cov(f_i²/2, f_j²/2) = ½ Σ_ij² + μ_i μ_j Σ_ij``; the 2×2 tilted blocks by central
  differences of the tilted moments). A projected Newton method: cavity precisions at their
  bound (below) that J's gradient pushes further down are held, the others take the Newton
  step, and the step is halved (Armijo) until J decreases with q proper.
* Outer loop: ``θ ← `` the marginals of the inner solution's q. Linearising the convex
  ``min_a J`` at the current θ gives a concave lower bound of G that touches it there and
  is maximised by that θ, so G never decreases (up to the inner loop's tolerance).

Sparse models (:class:`SparseDoubleLoopEP`): the sites act on the projections
``g = Vt w``, ``w ~ N(0, I_m)``, and the likelihood on ``f_i = g_i + ε_i``, ``ε_i ~ N(0, d_i)``
(FITC; ``d = 0`` for DTC), so ``Φ(s) = -½ log|A| + ½ bᵀA⁻¹b`` with ``A = I + Vtᵀ T Vt`` and
``b = Vtᵀ ν``, and ``g_i`` is the log-partition of the likelihood convolved with
``N(0, d_i)`` (the tilted moments of ``g_i`` from the site kernel at cavity variance
``1/a_τ + d_i``). The prior covariance ``Q = Vt Vtᵀ`` has rank m, so the Newton system is
never formed: it is solved by conjugate gradients preconditioned with its 2×2 diagonal
blocks, whose products with ``Cov_q[φ]`` use ``Σ = Bᵀ B`` with ``B = R⁻ᵀ Vtᵀ`` (m × n):
``Σ x = Bᵀ(B x)`` and ``diag(Σ diag(x) Σ)_i = b_iᵀ (B diag(x) Bᵀ) b_i``, O(nm²) time and
O(nm) memory. The Newton steps are truncated (forcing term ``min(0.1, λ)``, λ the
preconditioned gradient norm), so the inner loop still converges superlinearly.

Cavity bounds: a cavity precision stays at or above ``1/(cavity_variance_limit · K_ii)`` (a
cavity at most that many times wider than the prior; ``Q_ii`` for the sparse models). With
heavy-tailed sites the inner problem's infimum can otherwise lie at a flat cavity, where Newton
steps shrink to nothing.
The number of cavities that end at their bound is reported (``n_limited``); there the result
is the constrained optimum, not a fixed point.

Stopping: the marginals of q moved by less than ``tol`` in an outer iteration (means relative
to the standard deviation, variances relative) and the energy changed by less than ``tol``
relative. Marginals rather than sites: a site that is tiny beside its marginal (an outlier's)
sits in a flat direction of J, and its value is determined only loosely while the
approximation it gives is not.
"""
import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular

from .._epcore import student_t_ep as _engine
from .._epcore import sparse_ep as _sparse_engine
from .._epcore._common import SweepDriver, SweepResult
from .._epcore.student_t_sites import student_t_moments_array
from .._linalg import inner, matmul

__all__ = ["DenseDoubleLoopEP", "SparseDoubleLoopEP"]

_LOG_2PI = float(np.log(2.0 * np.pi))
#: A cavity precision this close to its bound (relative) is held there while J's gradient
#: pushes it down (the projected Newton method's active set).
ACTIVE_GAP = 1e-3
#: Relative step of the central differences for the tilted covariance blocks.
FD_STEP = 1e-4
#: Armijo sufficient-decrease constant and the largest number of step halvings.
ARMIJO = 1e-4
MAX_HALVINGS = 40
#: An inner minimisation stops when the tilted and marginal moments agree to this (relative to
#: the marginal standard deviation and variance), or when the Newton decrement is below 1e-12 |J|.
INNER_TOL = 1e-9
#: Conjugate-gradient iterations per Newton step of the sparse models (a truncated step is
#: still a descent direction).
MAX_CG = 500


def _log_normaliser(precision, natural_mean):
    """``Ψ(τ, ν) = ½ log 2π - ½ log τ + ν²/(2τ)``."""
    return 0.5 * _LOG_2PI - 0.5 * np.log(precision) + 0.5 * natural_mean * natural_mean / precision


class _Tilted:
    """Tilted moments ``E[φ]`` of ``exp(a·φ(g)) ∫ t(y_i | g + ε)^η N(ε; 0, d_i) dε`` and their
    log-partition (``d = None``: no ε, the dense model)."""

    def __init__(self, y, dof, scale, power, extra_var=None):
        self.y, self.dof, self.scale, self.power = y, dof, scale, power
        self.extra_var = extra_var

    def moments(self, a_tau, a_nu):
        """``(g, mean, var)`` per site, or None if a site's moments fail or are not finite."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # checked below
            var_c = 1.0 / a_tau
            mean_c = a_nu * var_c
            var_f = var_c if self.extra_var is None else var_c + self.extra_var
            try:
                log_z, alpha, beta, _, _ = student_t_moments_array(self.dof, self.scale, self.power,
                                                                   self.y, mean_c, var_f)
            except ValueError:
                return None
            mean = mean_c + var_c * alpha
            var = var_c * (1.0 - var_c * beta)
            g = log_z + _log_normaliser(a_tau, a_nu)
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(mean)) and np.all(var > 0)):
            return None
        return g, mean, var

    def covariance(self, a_tau, a_nu, mean, var):
        """The 2×2 blocks ``Cov_tilted[φ] = ∂E_tilted[φ]/∂a`` by central differences.

        Where a difference fails or gives a block that is not positive definite, the block
        of the Gaussian with the tilted mean and variance is used instead.
        """
        gauss = (0.5 * var * var + mean * mean * var, -mean * var, var.copy())
        h_tau = FD_STEP * a_tau
        h_nu = FD_STEP * np.sqrt(a_tau)
        points = [self.moments(a_tau + h_tau, a_nu), self.moments(a_tau - h_tau, a_nu),
                  self.moments(a_tau, a_nu + h_nu), self.moments(a_tau, a_nu - h_nu)]
        if any(p is None for p in points):
            return gauss
        with np.errstate(over="ignore", invalid="ignore"):     # non-finite blocks are replaced below
            return self._difference_blocks(points, h_tau, h_nu, gauss)

    @staticmethod
    def _difference_blocks(points, h_tau, h_nu, gauss):
        """Central differences of ``E[φ] = (-(v + m²)/2, m)`` in ``a_τ`` and ``a_ν``, symmetrised."""
        (_, m1, v1), (_, m2, v2), (_, m3, v3), (_, m4, v4) = points
        d_tau_tau = (-0.5 * (v1 + m1 * m1) + 0.5 * (v2 + m2 * m2)) / (2.0 * h_tau)
        d_nu_tau = (m1 - m2) / (2.0 * h_tau)
        d_tau_nu = (-0.5 * (v3 + m3 * m3) + 0.5 * (v4 + m4 * m4)) / (2.0 * h_nu)
        d_nu_nu = (m3 - m4) / (2.0 * h_nu)
        off = 0.5 * (d_nu_tau + d_tau_nu)
        good = ((d_tau_tau > 0) & (d_nu_nu > 0) & (d_tau_tau * d_nu_nu - off * off > 0) & np.isfinite(off)
                & np.isfinite(d_tau_tau) & np.isfinite(d_nu_nu))
        return (np.where(good, d_tau_tau, gauss[0]), np.where(good, off, gauss[1]),
                np.where(good, d_nu_nu, gauss[2]))


def _moment_mismatch(point, sites=slice(None)):
    """Largest ``|m̂ - μ_i|/sqrt(Σ_ii)`` or ``|v̂ - Σ_ii|/Σ_ii`` between tilted and marginal moments."""
    var = point["post_var"][sites]
    return float(max(np.max(np.abs(point["tilted_mean"][sites] - point["post_mean"][sites]) / np.sqrt(var),
                            initial=0.0),
                     np.max(np.abs(point["tilted_var"][sites] - var) / var, initial=0.0)))


class _DenseGaussian:
    """q from the GP prior ``N(0, K)`` and sites of any sign; Newton systems by Cholesky."""

    def __init__(self, K):
        self.K_chol = _engine.kernel_cholesky(K)
        self.prior_var = np.diagonal(K).copy()

    def posterior(self, s_tau, s_nu, want_cov, post_cov=None):
        """``(Φ(s), E[f], Var[f], Σ or None)``, or None if q is improper."""
        n = s_tau.shape[0]
        cov = post_cov if post_cov is not None else (np.empty((n, n)) if want_cov else None)
        post_mean, post_var = np.empty(n), np.empty(n)
        factor = _engine.site_posterior(self.K_chol, s_tau, s_nu, post_mean, post_var, cov)
        if factor is None:
            return None
        log_det, quad = factor
        return -0.5 * log_det + 0.5 * quad, post_mean, post_var, cov

    @staticmethod
    def newton_direction(point, grad, active, blocks, power):
        """Solve the Newton system of the free coordinates (module docstring); None if it fails."""
        S, mu = point["cov"], point["post_mean"]
        n = mu.shape[0]
        free = np.concatenate([~active, np.ones(n, dtype=bool)])
        H = np.empty((2 * n, 2 * n))
        scale = 1.0 / (power * power)
        H[:n, :n] = (0.5 * S + mu[:, None] * mu[None, :]) * S * scale
        H[:n, n:] = -(mu[:, None] * S) * scale
        H[n:, :n] = H[:n, n:].T
        H[n:, n:] = S * scale
        c_tt, c_tn, c_nn = blocks
        idx = np.arange(n)
        H[idx, idx] += c_tt / power
        H[idx, idx + n] += c_tn / power
        H[idx + n, idx] += c_tn / power
        H[idx + n, idx + n] += c_nn / power
        H = H[np.ix_(free, free)]
        m = H.shape[0]
        diag = np.abs(np.diagonal(H)).copy()
        shift = 0.0
        for _ in range(20):
            try:
                factor = cho_factor(H, lower=True, check_finite=False)
                break
            except np.linalg.LinAlgError:         # rounding in a nearly singular Cov_q
                shift = 1e-12 if shift == 0.0 else shift * 100.0
                H[np.arange(m), np.arange(m)] += shift * diag
        else:
            return None
        direction = np.zeros(2 * n)
        direction[free] = -cho_solve(factor, grad[free], check_finite=False)
        return direction


class _SparseGaussian:
    """q from the sparse prior ``g = Vt w``, ``w ~ N(0, I_m)``, and sites of any sign; Newton
    systems by preconditioned conjugate gradients on ``Σ = Bᵀ B`` (module docstring)."""

    def __init__(self, Vt):
        self.Vt = Vt
        self.prior_var = np.einsum("ij,ij->i", Vt, Vt)

    def posterior(self, s_tau, s_nu, want_cov, factor_out=None):
        """``(Φ(s), E[g], Var[g], B or None)``, or None if q is improper. ``factor_out``:
        optional ``(R, μ_w)`` arrays that receive the factor and the weight mean."""
        n, m = self.Vt.shape
        R, w_mean = factor_out if factor_out is not None else (np.empty((m, m)), np.empty(m))
        post_mean, post_var = np.empty(n), np.empty(n)
        factor = _sparse_engine.site_posterior(self.Vt, s_tau, s_nu, R, w_mean, post_mean, post_var)
        if factor is None:
            return None
        half_log_det, quad = factor
        B = None
        if want_cov:
            B = solve_triangular(R, self.Vt.T, trans="T", lower=False, check_finite=False)   # R⁻ᵀ Vtᵀ
        return -half_log_det + 0.5 * quad, post_mean, post_var, B

    @staticmethod
    def newton_direction(point, grad, active, blocks, power):
        """Truncated Newton direction by block-Jacobi preconditioned conjugate gradients."""
        B, mu, var = point["cov"], point["post_mean"], point["post_var"]
        n = mu.shape[0]
        scale = 1.0 / (power * power)
        c_tt, c_tn, c_nn = blocks
        d_tt, d_tn, d_nn = c_tt / power, c_tn / power, c_nn / power
        free_tau = ~active

        def hessian_times(x):
            x_tau, x_nu = x[:n], x[n:]
            diff = matmul(matmul(B, mu * x_tau) - matmul(B, x_nu), B)          # Σ(μ∘x_τ - x_ν)
            M = matmul(B * x_tau, B.T)
            diag_quad = np.einsum("ki,ki->i", matmul(M, B), B)                  # diag(Σ X_τ Σ)
            out_tau = scale * (0.5 * diag_quad + mu * diff) + d_tt * x_tau + d_tn * x_nu
            out_nu = -scale * diff + d_tn * x_tau + d_nn * x_nu
            out_tau[active] = 0.0
            return np.concatenate([out_tau, out_nu])

        p_tt = np.where(free_tau, scale * (0.5 * var * var + mu * mu * var) + d_tt, 1.0)
        p_tn = np.where(free_tau, -scale * mu * var + d_tn, 0.0)
        p_nn = scale * var + d_nn
        det = p_tt * p_nn - p_tn * p_tn
        if not np.all(det > 0):
            return None

        def precondition(r):
            r_tau, r_nu = r[:n], r[n:]
            return np.concatenate([(p_nn * r_tau - p_tn * r_nu) / det, (p_tt * r_nu - p_tn * r_tau) / det])

        rhs = -grad.copy()
        rhs[:n][active] = 0.0
        z = precondition(rhs)
        rz = inner(rhs, z)
        if not (rz > 0 and np.isfinite(rz)):
            return None
        forcing = min(0.1, np.sqrt(np.sqrt(rz)))
        target = forcing * forcing * rz
        x = np.zeros(2 * n)
        r, p = rhs, z
        for _ in range(MAX_CG):
            Hp = hessian_times(p)
            curvature = inner(p, Hp)
            if not (curvature > 0 and np.isfinite(curvature)):
                break                      # rounding: keep the last iterate (a descent direction)
            step = rz / curvature
            x = x + step * p
            r = r - step * Hp
            z = precondition(r)
            rz_new = inner(r, z)
            if rz_new <= target:
                break
            p = z + (rz_new / rz) * p
            rz = rz_new
        if not np.any(x):
            return None
        return x


class _Inner:
    """``J(·; θ)`` of one outer iteration: values, Newton steps, the minimisation."""

    def __init__(self, gaussian, tilted, power, theta_tau, theta_nu, bound):
        self.gaussian, self.tilted, self.power = gaussian, tilted, power
        self.theta_tau, self.theta_nu, self.bound = theta_tau, theta_nu, bound

    def sites(self, a_tau, a_nu):
        """The sites ``(θ - a)/η`` of the cavities ``a``."""
        return (self.theta_tau - a_tau) / self.power, (self.theta_nu - a_nu) / self.power

    def evaluate(self, a_tau, a_nu, want_cov):
        """J and what its derivatives need, or None outside the domain."""
        if not np.all(a_tau >= self.bound):
            return None
        s_tau, s_nu = self.sites(a_tau, a_nu)
        post = self.gaussian.posterior(s_tau, s_nu, want_cov)
        if post is None:
            return None
        phi, post_mean, post_var, cov = post
        if not np.all(post_var > 0):
            return None
        tilted = self.tilted.moments(a_tau, a_nu)
        if tilted is None:
            return None
        g, mean_t, var_t = tilted
        value = phi + np.sum(g) / self.power
        if not np.isfinite(value):
            return None
        return {"value": value, "a": (a_tau, a_nu), "cov": cov, "post_mean": post_mean,
                "post_var": post_var, "tilted_mean": mean_t, "tilted_var": var_t}

    def newton_step(self, point):
        """Projected Newton step at an evaluated point: ``(direction, gradient, active)``.

        Cavity precisions within ``ACTIVE_GAP`` (relative) of their bound whose gradient
        pushes them further down are held (``active``); the step solves the Newton system of
        the others. Returns ``(None, gradient, active)`` if that system cannot be solved.
        """
        eta = self.power
        a_tau, a_nu = point["a"]
        mu = point["post_mean"]
        mean_t, var_t = point["tilted_mean"], point["tilted_var"]
        n = mu.shape[0]
        grad = np.concatenate([(-0.5 * (var_t + mean_t * mean_t) + 0.5 * (point["post_var"] + mu * mu)) / eta,
                               (mean_t - mu) / eta])
        active = (a_tau - self.bound <= ACTIVE_GAP * self.bound) & (grad[:n] > 0)
        blocks = self.tilted.covariance(a_tau, a_nu, mean_t, var_t)
        direction = self.gaussian.newton_direction(point, grad, active, blocks, eta)
        if direction is None or not np.all(np.isfinite(direction)):
            return None, grad, active
        return direction, grad, active

    def minimise(self, point, max_newton):
        """Projected damped Newton from an evaluated point; ``(point, n_newton, converged)``."""
        n = point["post_mean"].shape[0]
        for it in range(max_newton):
            direction, grad, active = self.newton_step(point)
            if direction is None:
                return point, it, False
            decrement = -inner(grad, direction)
            if decrement < 1e-15 * max(1.0, abs(point["value"])) or _moment_mismatch(point, ~active) < INNER_TOL:
                return point, it, True
            a_tau, a_nu = point["a"]
            step = 1.0
            for _ in range(MAX_HALVINGS):
                trial_tau = np.maximum(a_tau + step * direction[:n], self.bound)
                trial_nu = a_nu + step * direction[n:]
                trial = self.evaluate(trial_tau, trial_nu, want_cov=True)
                if trial is not None:
                    predicted = inner(grad[:n], trial_tau - a_tau) + inner(grad[n:], trial_nu - a_nu)
                    if predicted < 0 and trial["value"] <= point["value"] + ARMIJO * predicted:
                        break
                step *= 0.5
            else:
                return point, it + 1, False
            point = trial
        return point, max_newton, False


def _proper_start(problem, s_tau, s_nu):
    """An evaluated feasible point: the cavities of the sites ``λ s`` for the largest λ in
    1, ½, ¼, ... (λ = 0 is the prior, always proper), or None."""
    lam = 1.0
    while True:
        point = problem.evaluate(problem.theta_tau - problem.power * lam * s_tau,
                               problem.theta_nu - problem.power * lam * s_nu, want_cov=True)
        if point is not None or lam == 0.0:
            return point
        lam = lam * 0.5 if lam > 1e-6 else 0.0


def _check_problem(y, n, dof, scale, power, tol, max_outer, max_newton, cavity_variance_limit):
    """Checks of the targets and options shared by the dense and the sparse double loop."""
    if np.shape(y) != (n,):
        raise ValueError(f"y must have shape ({n},), got {np.shape(y)}")
    if not np.all(np.isfinite(y)):
        raise ValueError("y must be finite")
    if not (dof > 0 and np.isfinite(dof) and scale > 0 and np.isfinite(scale)):
        raise ValueError(f"dof and scale must be finite and > 0, got {dof!r} and {scale!r}")
    if not (0.0 < power <= 1.0):
        raise ValueError(f"power must be in (0, 1], got {power!r}")
    if not (tol > 0 and max_outer >= 1 and max_newton >= 1 and cavity_variance_limit > 1):
        raise ValueError("tol must be > 0, max_outer and max_newton >= 1, cavity_variance_limit > 1")


def _check_run(n, sites, outputs):
    """The start sites (finite) and the output arrays of one run must have shape (n,)."""
    for name, arg in sites + outputs:
        if np.shape(arg) != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {np.shape(arg)}")
    if not all(np.all(np.isfinite(arg)) for _, arg in sites):
        raise ValueError("the start sites must be finite")


def _empty_result():
    return _engine.StudentTEPResult(SweepResult(converged=True, max_change=0.0, log_z=0.0, log_z_change=0.0,
                                                diagnostics={"n_newton": 0, "n_limited": 0, "inner_failures": 0,
                                                             "energy": []}))


class DenseDoubleLoopEP:
    """Double-loop fractional EP (module docstring) for GP regression with Student-t sites,
    bound to one kernel matrix, its targets and the likelihood's ν and σ.

    The convergent fallback of :class:`fastep._epcore.student_t_ep.DenseStudentTEP`, with its
    arguments and outputs. Built once (checks the inputs and options, factorises K);
    :meth:`run` iterates from given sites and returns a
    :class:`~fastep._epcore.student_t_ep.StudentTEPResult`.

    Parameters
    ----------
    K : ndarray (n, n)
        Prior covariance, positive definite.
    y : ndarray (n,)
        Finite targets.
    dof, scale : float > 0
        Student-t ν and σ.
    power : float in (0, 1]
        The fraction η.
    tol : float > 0
        Convergence threshold (module docstring, "Stopping").
    max_outer : int >= 1
        Outer iterations.
    max_newton : int >= 1
        Newton steps per inner minimisation.
    cavity_variance_limit : float > 1
        A cavity's variance stays below this multiple of the prior variance ``K_ii``.

    Raises
    ------
    ValueError
        Bad shapes, non-finite targets or invalid options.
    numpy.linalg.LinAlgError
        K is not positive definite.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._student_t.double_loop import DenseDoubleLoopEP
    >>> x = np.linspace(0, 1, 8)
    >>> K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.3 ** 2) + 1e-6 * np.eye(8)
    >>> y = np.sin(3 * x); y[2] = 4.0
    >>> tau, nu, post_mean, post_var = np.zeros(8), np.zeros(8), np.empty(8), np.empty(8)
    >>> info = DenseDoubleLoopEP(K, y, 4.0, 0.1).run(tau, nu, post_mean, post_var)
    >>> info.converged
    True
    """

    def __init__(self, K, y, dof, scale, *, power=0.5, tol=1e-4, max_outer=200, max_newton=50,
                 cavity_variance_limit=100.0):
        K = np.ascontiguousarray(K, dtype=np.float64)
        y = np.ascontiguousarray(y, dtype=np.float64)
        n = K.shape[0]
        if K.ndim != 2 or K.shape[1] != n:
            raise ValueError(f"K must be a square matrix, got shape {K.shape}")
        _check_problem(y, n, dof, scale, power, tol, max_outer, max_newton, cavity_variance_limit)
        self.n, self.power, self.tol = n, float(power), tol
        self.max_outer, self.max_newton, self.cavity_variance_limit = max_outer, max_newton, cavity_variance_limit
        self.tilted = _Tilted(y, float(dof), float(scale), float(power))
        self.gaussian = None
        if n > 0:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                self.gaussian = _DenseGaussian(K)

    def run(self, site_precision, site_natural_mean, post_mean, post_var, *, cavity_mean=None,
            cavity_var=None, post_cov=None, sweep_callback=None):
        """Iterate from the given sites, which must give a proper posterior (zeros: the prior).

        Parameters
        ----------
        site_precision, site_natural_mean : ndarray (n,), in/out
            Start sites; updated in place to the final sites.
        post_mean, post_var : ndarray (n,), out
            The posterior marginals of the final sites.
        cavity_mean, cavity_var : ndarray (n,), out, optional
            The final fractional cavities (cavity variance -1 where a cavity is improper).
        post_cov : ndarray (n, n), out, optional
            The posterior covariance of the final sites.
        sweep_callback : callable, optional
            ``callback(outer, max_change, log_z)`` after every outer iteration; returning
            False stops the run.

        Returns
        -------
        StudentTEPResult
            As :meth:`fastep._epcore.student_t_ep.DenseStudentTEP.run` (``n_sweeps`` counts
            outer iterations, ``n_halvings`` is 0; ``stuck``: an inner minimisation could not
            start); its
            ``diagnostics`` dict holds ``n_newton``, ``n_limited`` (cavities at their
            variance bound), ``inner_failures`` (inner loops that stopped before their
            tolerance) and ``energy`` (G after every outer iteration).

        Raises
        ------
        ValueError
            Bad shapes or non-finite start sites.
        numpy.linalg.LinAlgError
            The start sites give an improper posterior.
        """
        n = self.n
        if cavity_mean is None:
            cavity_mean = np.empty(n)
        if cavity_var is None:
            cavity_var = np.empty(n)
        _check_run(n, (("site_precision", site_precision), ("site_natural_mean", site_natural_mean)),
                   (("post_mean", post_mean), ("post_var", post_var), ("cavity_mean", cavity_mean),
                    ("cavity_var", cavity_var)))
        if n == 0:
            return _empty_result()
        gaussian, tilted, power = self.gaussian, self.tilted, self.power
        # extreme inputs overflow in the Gaussian normalisers: the energy is then not finite, which
        # the result reports (log_z) and the callers check
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            gaussian.posterior(np.zeros(n), np.zeros(n), False, post_cov=post_cov)    # checks post_cov
            info, point = _double_loop(gaussian, tilted, power, site_precision, site_natural_mean, self.tol,
                                       self.max_outer, self.max_newton, self.cavity_variance_limit,
                                       sweep_callback)
            post = gaussian.posterior(site_precision, site_natural_mean, True, post_cov=post_cov)
            log_z, n_failed = _final_energy(post, tilted, power, site_precision, site_natural_mean,
                                            post_mean, post_var, cavity_mean, cavity_var)
        return info.replace(log_z=log_z, n_failed=n_failed, converged=bool(info.converged and n_failed == 0))


class SparseDoubleLoopEP:
    """Double-loop fractional EP on the sparse (FITC / DTC) representation (module docstring).

    The convergent fallback of :class:`fastep._epcore.student_t_ep.SparseStudentTEP`, with
    its representation: sites on the projections ``g = Vt w``, ``w ~ N(0, I_m)``, the
    Student-t likelihood on ``f_i = g_i + ε_i``, ``ε_i ~ N(0, d_i)``. Memory O(nm). Built
    once (checks the inputs and options); :meth:`run` iterates from given sites.

    Parameters
    ----------
    Vt : ndarray (n, m)
        Projections (rows ``v_i``), from :func:`fastep._epcore.sparse_ep.sparse_projection`.
    d : ndarray (n,)
        FITC's ``K_ii - Q_ii`` (zeros for DTC).
    y, dof, scale, power, tol, max_outer, max_newton
        As :class:`DenseDoubleLoopEP`.
    cavity_variance_limit : float > 1
        A cavity's variance stays below this multiple of the prior variance ``Q_ii``.

    Raises
    ------
    ValueError
        Bad shapes, non-finite inputs, a negative ``d`` or invalid options.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._student_t.double_loop import SparseDoubleLoopEP
    >>> from fastep._epcore.sparse_ep import sparse_projection
    >>> x, z = np.linspace(0, 1, 12), np.linspace(0, 1, 4)
    >>> k = lambda a, b: np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / 0.3 ** 2)
    >>> _, Vt, d = sparse_projection(k(z, z), k(x, z), np.ones(12), jitter=1e-8)
    >>> y = np.sin(3 * x); y[2] = 4.0
    >>> tau, nu, R, w = np.zeros(12), np.zeros(12), np.empty((4, 4)), np.empty(4)
    >>> info = SparseDoubleLoopEP(Vt, d, y, 4.0, 0.1).run(tau, nu, R, w)
    >>> info.converged
    True
    """

    def __init__(self, Vt, d, y, dof, scale, *, power=0.5, tol=1e-4, max_outer=200, max_newton=50,
                 cavity_variance_limit=100.0):
        Vt = np.ascontiguousarray(Vt, dtype=np.float64)
        d = np.ascontiguousarray(d, dtype=np.float64)
        y = np.ascontiguousarray(y, dtype=np.float64)
        if Vt.ndim != 2:
            raise ValueError(f"Vt must be a matrix, got shape {Vt.shape}")
        n, m = Vt.shape
        if np.shape(d) != (n,):
            raise ValueError(f"d must have shape ({n},), got {np.shape(d)}")
        _check_problem(y, n, dof, scale, power, tol, max_outer, max_newton, cavity_variance_limit)
        if not (np.all(np.isfinite(Vt)) and np.all(np.isfinite(d)) and np.all(d >= 0)):
            raise ValueError("Vt and d must be finite and d >= 0")
        self.n, self.m, self.power, self.tol = n, m, float(power), tol
        self.max_outer, self.max_newton, self.cavity_variance_limit = max_outer, max_newton, cavity_variance_limit
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self.gaussian = _SparseGaussian(Vt)
        self.tilted = _Tilted(y, float(dof), float(scale), float(power), extra_var=d)

    def run(self, site_precision, site_natural_mean, post_factor, post_w_mean, *, g_mean=None, g_var=None,
            sweep_callback=None):
        """Iterate from the given sites (any sign, proper posterior; zeros: the prior).

        Parameters
        ----------
        site_precision, site_natural_mean : ndarray (n,), in/out
            Start sites; updated in place to the final sites.
        post_factor, post_w_mean : ndarray (m, m), (m,), out
            The upper-triangular factor R of ``A = I + Vtᵀ T Vt`` and ``μ_w``.
        g_mean, g_var : ndarray (n,), out, optional
            E[g] and Var[g] of the final posterior.
        sweep_callback : callable, optional
            As :meth:`DenseDoubleLoopEP.run`.

        Returns
        -------
        StudentTEPResult
            As :meth:`DenseDoubleLoopEP.run`; ``log_z`` is the fractional EP energy that
            :func:`fastep._epcore.sparse_ep.log_marginal_likelihood` gives the final sites.

        Raises
        ------
        ValueError
            Bad shapes or non-finite start sites.
        numpy.linalg.LinAlgError
            The start sites give an improper posterior.
        """
        n, m = self.n, self.m
        if g_mean is None:
            g_mean = np.empty(n)
        if g_var is None:
            g_var = np.empty(n)
        _check_run(n, (("site_precision", site_precision), ("site_natural_mean", site_natural_mean)),
                   (("g_mean", g_mean), ("g_var", g_var)))
        if np.shape(post_factor) != (m, m) or np.shape(post_w_mean) != (m,):
            raise ValueError(f"post_factor and post_w_mean must have shapes ({m}, {m}) and ({m},)")
        if n == 0:
            post_factor[:] = np.eye(m)
            post_w_mean[:] = 0.0
            return _empty_result()
        gaussian, tilted, power = self.gaussian, self.tilted, self.power
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):    # as DenseDoubleLoopEP.run
            info, point = _double_loop(gaussian, tilted, power, site_precision, site_natural_mean, self.tol,
                                       self.max_outer, self.max_newton, self.cavity_variance_limit,
                                       sweep_callback)
            factor = (np.empty((m, m)), np.empty(m))
            post = gaussian.posterior(site_precision, site_natural_mean, False, factor_out=factor)
            cavity_mean, cavity_var = np.empty(n), np.empty(n)
            log_z, n_failed = _final_energy(post, tilted, power, site_precision, site_natural_mean,
                                            g_mean, g_var, cavity_mean, cavity_var)
            post_factor[:], post_w_mean[:] = factor
        return info.replace(log_z=log_z, n_failed=n_failed, converged=bool(info.converged and n_failed == 0))


def _double_loop(gaussian, tilted, power, site_precision, site_natural_mean, tol, max_outer, max_newton,
                 cavity_variance_limit, sweep_callback):
    """The outer loop on validated inputs: ``(info, last inner point)``; the final sites are
    written to ``site_precision`` / ``site_natural_mean``."""
    s_tau = np.array(site_precision, dtype=np.float64)
    s_nu = np.array(site_natural_mean, dtype=np.float64)
    post = gaussian.posterior(s_tau, s_nu, False)
    if post is None or not np.all(post[2] > 0):
        raise np.linalg.LinAlgError("the start sites give an improper posterior; start from zero sites")
    _, post_mean, post_var, _ = post
    theta_tau, theta_nu = 1.0 / post_var, post_mean / post_var
    prior_bound = 1.0 / (cavity_variance_limit * gaussian.prior_var)
    energy, n_newton, inner_failures = [], 0, 0
    driver = SweepDriver(tol, max_outer, sweep_callback)
    stuck = False
    point = None
    bound = np.minimum(prior_bound, 0.5 * theta_tau)
    outer = 0
    while outer < driver.max_sweeps:
        outer += 1
        bound = np.minimum(prior_bound, 0.5 * theta_tau)
        problem = _Inner(gaussian, tilted, power, theta_tau, theta_nu, bound)
        start = None
        if point is not None:
            start = problem.evaluate(*point["a"], want_cov=True)
        if start is None:
            start = _proper_start(problem, s_tau, s_nu)
        if start is None:
            stuck = True
            break
        point, steps, ok = problem.minimise(start, max_newton)
        n_newton += steps
        inner_failures += not ok
        new_tau, new_nu = problem.sites(*point["a"])
        G = float(point["value"] - np.sum(_log_normaliser(theta_tau, theta_nu)) / power)
        old_mean, old_var = theta_nu / theta_tau, 1.0 / theta_tau
        max_change = float(max(np.max(np.abs(point["post_mean"] - old_mean) / np.sqrt(old_var), initial=0.0),
                               np.max(np.abs(point["post_var"] - old_var) / old_var, initial=0.0)))
        energy.append(G)
        s_tau, s_nu = new_tau, new_nu
        theta_tau = 1.0 / point["post_var"]
        theta_nu = point["post_mean"] / point["post_var"]
        if driver.end_sweep(outer, max_change, G):
            break
    site_precision[:] = s_tau
    site_natural_mean[:] = s_nu
    n_limited = 0 if point is None else int(np.sum(point["a"][0] - bound <= ACTIVE_GAP * bound))
    info = _engine.StudentTEPResult(driver.result(diagnostics={"n_newton": n_newton, "n_limited": n_limited,
                                                               "inner_failures": inner_failures,
                                                               "energy": energy}), stuck=stuck)
    return info.replace(n_sweeps=outer), point


def _final_energy(post, tilted, power, s_tau, s_nu, post_mean, post_var, cavity_mean, cavity_var):
    """Write the posterior marginals and fractional cavities of the final sites (from their
    posterior ``post``); return ``(fractional EP energy, number of improper cavities)``."""
    if post is None:                # not reached: the final sites come from a proper posterior
        return float("nan"), len(s_tau)
    phi, mean, var, _ = post
    post_mean[:] = mean
    post_var[:] = var
    tau_c = 1.0 / post_var - power * s_tau
    nu_c = post_mean / post_var - power * s_nu
    proper = tau_c > 0
    cavity_var[:] = -1.0
    cavity_mean[:] = 0.0
    cavity_var[proper] = 1.0 / tau_c[proper]
    cavity_mean[proper] = nu_c[proper] / tau_c[proper]
    n_failed = int(np.sum(~proper))
    if n_failed:
        return float("nan"), n_failed
    moments = tilted.moments(tau_c, nu_c)
    if moments is None:
        return float("nan"), len(s_tau)
    terms = moments[0] - _log_normaliser(1.0 / post_var, post_mean / post_var)
    return float(phi + np.sum(terms) / power), 0
