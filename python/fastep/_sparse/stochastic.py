"""Minibatch EP for the sparse GP and minibatch learning of its hyperparameters.

The full-batch sparse EP of :mod:`fastep._sparse.problem` keeps one site per training point
and learns the hyperparameters from the exact evidence gradient, which costs EP over all n
points per evaluation.  This module updates the sites from minibatches and interleaves
stochastic steps of the evidence gradient with those updates, so that learning costs a few
passes over the data at any n.

Sites
-----
As in full-batch sparse EP, the site of point i acts on the projection ``g_i = v_iᵀ w`` of the
whitened inducing values ``w = L⁻¹ u ~ N(0, I)`` (``v_i = L⁻¹ k_m(x_i)``), and the posterior
is ``q(w) = N(A⁻¹ b, A⁻¹)`` with ``A = I + Λ`` (module :mod:`fastep.sparse`, "Model").  Two
ways of keeping the sites:

``'tied'`` (stochastic EP; Li, Hernández-Lobato and Turner, *Stochastic Expectation
Propagation*, NeurIPS 2015, Algorithm 1 and its minibatch form, Section 3)
    Every point shares one average site ``f̄(w) = exp(-½ wᵀ(Λ/n)w + (b/n)ᵀw)``, so that
    ``q ∝ N(0, I) f̄ⁿ``; only ``Λ`` (m x m) and ``b`` (m) are stored: memory O(m²) at any n.
    For a minibatch B, every point sees the same cavity ``q/f̄^α``:
    ``A∖ = I + (1 - α/n) Λ``, ``b∖ = (1 - α/n) b``.  Its marginal on g_i, ``N(μ_i, s_i)``, and
    the FITC variance ``d_i`` give the tilted moments of ``∫ t_i(f)^α N(f; μ_i, s_i + d_i) df``
    (``a_i = ∂ log Z_i/∂μ_i``, ``β_i = -∂² log Z_i/∂μ_i²``) and the point's new site
    ``τ_i = β_i / (α(1 - s_i β_i))``, ``ν_i = (a_i + β_i μ_i) / (α(1 - s_i β_i))`` (the same
    update as one site of full-batch EP, with the same policy for negative precisions).
    Their average replaces a fraction ε of the tied site (the paper's damped update
    ``f̄ ← f̄^(1-ε) f̃_B^ε``, with ``f̃_B`` the geometric mean of the minibatch's sites)::

        Λ ← (1 - ε) Λ + ε (n/|B|) Σ_{i∈B} τ_i v_i v_iᵀ,    b ← (1 - ε) b + ε (n/|B|) Σ_{i∈B} ν_i v_i.

    ``ε = |B| / window``: the tied site averages the sites of about the last ``window`` points
    (all n when ``window >= n``, which is the paper's ``ε = |B|/n``).
``'per-point'``
    Each point keeps its own scalar site ``(τ_i, ν_i)`` (O(n) memory, the state of full-batch
    EP): a minibatch runs the damped parallel EP update of its points against the posterior
    of all sites and adds the change of their natural parameters to ``Λ`` and ``b``.  With
    one minibatch of all the data this is the parallel schedule of full-batch EP, and its
    fixed point is full-batch EP's.  While the hyperparameters move, the projections of the
    sites not in the minibatch are those of the hyperparameters at which they were last
    added; every pass starts by recomputing ``Λ`` and ``b`` from all sites at the current
    hyperparameters.

Sites and hyperparameter steps
------------------------------
A hyperparameter step changes ``K_mm`` and so the whitening ``w = L⁻¹ u``.  The sites keep their
value as functions of the inducing values u (they summarise what the data say about f at Z,
which a change of the kernel's variance or length-scales does not change): with
``M = L_old⁻¹ L_new``, ``Λ ← Mᵀ Λ M`` and ``b ← Mᵀ b`` (O(m³) per step, well conditioned
because M is close to the identity for a small step).  Held in w instead, a step that doubles
the kernel's variance would halve every site's precision on f.

Stochastic evidence gradient
----------------------------
The exact gradient of the EP log marginal likelihood at the EP fixed point
(:mod:`fastep._sparse.problem`, "Evidence gradient") is a sum over points once its two global
sums are written through the posterior: with ``a = ν - τ ∘ E[g]``,
``Σ_j U_j a_j = L⁻ᵀ μ_w`` and ``Σ_j U_j τ_j v_jᵀ A⁻¹ = L⁻ᵀ (I - A⁻¹)`` (``U_j = L⁻ᵀ v_j``,
``μ_w = A⁻¹ b``).  Every other term is a sum over points i of quantities of the point's
cavity: ``a_i = (∂ log Z_i/∂μ_i)/α`` and ``c_i = (a_i α)² - β_i)/(2α)`` (FITC; 0 for DTC) and
its site τ_i.  The minibatch's share times ``n/|B|`` is then an unbiased estimate of the
gradient at the given sites: summed over a partition of the data into minibatches it is the
full gradient (Hernández-Lobato and Hernández-Lobato, *Scalable Gaussian Process
Classification via Expectation Propagation*, AISTATS 2016, Section 3: the gradient of the EP
evidence at fixed sites is a sum over the data).  The hyperparameters (the search coordinates
of :class:`fastep._gp.hyperparameters.Hyperparameters`: logs of the positive parameters) take Adam steps
(Kingma and Ba 2015) on the estimate plus the hyperprior's gradient.

Stopping rule
-------------
Before a minibatch updates the sites, its points' EP predictive ``log ∫ t_i(f) N(f; μ_i, s_i +
d_i) df`` at their cavities (a leave-one-out predictive of the current model) is recorded,
and every ``window`` points their mean log loss and its standard error.  Learning stops when
the mean over the last ``patience`` windows is not lower than the mean over the ``patience``
windows before them by more than the standard error of that difference (the model's own
noise level: the loss no longer falls faster than its noise), or after ``max_epochs``
passes.  The model of the best window is returned.  The windows of the warm-up (site updates
before the first hyperparameter step) do not count.

Data sources and warm starts
----------------------------
The rows come from a :class:`RowSource`: an in-core array, a ``numpy.memmap`` or a dask array
(:class:`fastep._sparse.distributed.DriverRows`), read in chunks of ``CHUNK_ROWS`` rows in a
seeded random order, each chunk once per pass. The schedule is sequential (each minibatch's
update needs the previous one's site), so the three give the same fit for one seed. A fit can
continue from a previous one (:func:`fit_minibatch`'s ``start``): its parameters, Z and tied
site, rescaled to the new n.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular

from .._epcore import sparse_ep as _engine
from .._epcore.power_ep import power_moments_array
from .._gp.fit_options import KeepsSparseFitOptions
from .._linalg import inner, matmul
from .blocks import SparsePredictor, gradient_from_sums, gradient_second_sums

#: Factor on Adam's step in the second stage of a default minibatch fit, where the inducing
#: inputs are learnt too (``learn_inducing='auto'``): the stage starts near the learnt kernel.
SECOND_STAGE_STEP = 1.0 / 3.0

#: Rows read from the data source at a time (a memmap or a dask array is read chunk by chunk).
CHUNK_ROWS = 1 << 16

SITE_MODES = ("tied", "per-point")
#: ``learning='auto'`` learns from minibatches from this many training rows on.
MINIBATCH_MIN_ROWS = 50_000
#: Inputs up to which a minibatch fit's default kernel learns one relevance per input (ARD): each
#: relevance costs a batch x m derivative per step, and images' pixels are not inputs to set aside one by one.
MINIBATCH_ARD_MAX_FEATURES = 32
#: The estimators' defaults of ``batch_size``, ``learning_rate`` and ``max_epochs``.
MINIBATCH_BATCH_SIZE = 512
MINIBATCH_LEARNING_RATE = 0.03
MINIBATCH_MAX_EPOCHS = 20

#: Points of a window of the minibatch stopping rule: at least this many, 50 per inducing input and
#: n / 20 up to ``MINIBATCH_MAX_WINDOW`` (a larger window sees a slow descent of the loss above its noise).
MINIBATCH_WINDOW = 20_000
MINIBATCH_MAX_WINDOW = 100_000
#: Points a tied site averages over (``ε = batch_size / window``): at least this many, and 20 per inducing input.
MINIBATCH_SITE_WINDOW = 5_000
#: Windows per block of the minibatch stopping rule (the last block against the one before it).
MINIBATCH_PATIENCE = 6


def minibatch_windows(n, m):
    """``(window, site_window)`` of a minibatch fit on n rows with m inducing inputs: the
    stopping rule's window and the points a tied site averages over (both at most n)."""
    window = max(MINIBATCH_WINDOW, 50 * m, min(n // 20, MINIBATCH_MAX_WINDOW))
    return min(n, window), min(n, max(MINIBATCH_SITE_WINDOW, 20 * m))


class RowSource:
    """Rows of ``(X, y)`` read a chunk at a time: an in-core array, a ``numpy.memmap`` or any
    array that supports row slicing (a dask array through
    :class:`fastep._sparse.distributed.DriverRows`, which computes each chunk on the cluster
    while the previous one is used).

    ``y`` is held in memory (n floats); ``X`` is read ``chunk_rows`` rows at a time, each
    chunk once per pass.
    """

    def __init__(self, X, y, chunk_rows=CHUNK_ROWS):
        self.X = X
        self.y = np.ascontiguousarray(y, dtype=np.float64)
        self.n = int(X.shape[0])
        self.chunk_rows = int(chunk_rows)
        self.chunks = [(s, min(s + self.chunk_rows, self.n)) for s in range(0, self.n, self.chunk_rows)]

    def read(self, start, stop):
        """Rows ``start:stop`` as float64 arrays."""
        return np.ascontiguousarray(self.X[start:stop], dtype=np.float64), self.y[start:stop]

    def prefetch(self, start, stop):
        """Start reading rows ``start:stop`` (a source on a cluster computes them meanwhile)."""
        prefetch = getattr(self.X, "prefetch", None)
        if prefetch is not None:
            prefetch(start, stop)


def epoch_batches(source, batch_size, rng):
    """One pass over ``source`` in minibatches: ``(X_B, y_B, index_B)``, chunks in a random order
    and rows in a random order within each chunk (deterministic for ``rng``'s state)."""
    order_of_chunks = rng.permutation(len(source.chunks))
    for k, c in enumerate(order_of_chunks):
        start, stop = source.chunks[c]
        if k + 1 < order_of_chunks.size:
            source.prefetch(*source.chunks[order_of_chunks[k + 1]])
        X, y = source.read(start, stop)
        order = rng.permutation(stop - start)
        for s in range(0, order.shape[0], batch_size):
            rows = np.sort(order[s:s + batch_size])
            yield X[rows], y[rows], start + rows


class Adam:
    """Adam steps (Kingma and Ba, *Adam: A Method for Stochastic Optimization*, ICLR 2015,
    Algorithm 1) that *ascend* the objective."""

    def __init__(self, size, learning_rate, beta1=0.9, beta2=0.999, eps=1e-8):
        self.learning_rate = float(learning_rate)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.first = np.zeros(size)
        self.second = np.zeros(size)
        self.t = 0

    def step(self, gradient):
        self.t += 1
        self.first = self.beta1 * self.first + (1.0 - self.beta1) * gradient
        self.second = self.beta2 * self.second + (1.0 - self.beta2) * gradient * gradient
        first = self.first / (1.0 - self.beta1 ** self.t)
        second = self.second / (1.0 - self.beta2 ** self.t)
        return self.learning_rate * first / (np.sqrt(second) + self.eps)


class MinibatchState(KeepsSparseFitOptions):
    """What the states of minibatch EP share: a snapshot of their sites and factors, and its restore.

    A subclass sets its sites to zero in :meth:`_zero_sites` (``precision_sum``,
    ``natural_mean_sum`` and, with ``'per-point'`` sites, the arrays named in
    :attr:`per_point_sites`), factorises ``K_mm`` into ``chol_mm`` in ``refactor`` and drops
    what it derived from the sites in :meth:`_forget`. The parameters are those of
    :class:`MinibatchSparseEP`.
    """

    #: The per-point site arrays (``sites='per-point'`` only).
    per_point_sites = ("site_precision", "site_natural_mean")

    def __init__(self, kernel, likelihood, Z, n, options, sites="tied", window=None):
        if sites not in SITE_MODES:
            raise ValueError(f"sites must be one of {SITE_MODES}, got {sites!r}")
        self.kernel, self.likelihood = kernel, likelihood
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        self.n = int(n)
        self.options = options
        self.sites = sites
        self.window = self.n if window is None else int(window)
        self._zero_sites()
        self.refactor()

    def _state_names(self):
        extra = self.per_point_sites if self.sites == "per-point" else ()
        return ("precision_sum", "natural_mean_sum", "chol_mm") + extra

    def _forget(self):
        """Drop the posterior derived from the sites (they changed)."""
        self._posterior = None

    def snapshot(self):
        """The sites' and factors' state (m-sized, or n-sized per-point sites), for :meth:`restore`."""
        return [getattr(self, name).copy() for name in self._state_names()]

    def restore(self, state):
        """Go back to a :meth:`snapshot` (the kernel and Z must be those it was taken at)."""
        for name, value in zip(self._state_names(), state):
            setattr(self, name, value.copy())
        self._forget()


class MinibatchSparseEP(MinibatchState):
    """The state of minibatch sparse EP: the inducing inputs, the hyperparameters and the sites
    (module docstring).

    Parameters
    ----------
    kernel, likelihood : the model (``likelihood.site_spec()`` gives the site kernel)
    Z : ndarray (m, n_features)
    n : int
        Number of training points.
    options : dict
        ``power``, ``approximation``, ``jitter``, ``n_quadrature``, ``negative_precision``
        (the full-batch engine's options).
    sites : {'tied', 'per-point'}
    window : int
        Points the tied site averages over (``ε = |B| / window``); for ``'per-point'`` the
        damping of a minibatch's update is ``min(1, |B| / window)``.
    """

    def _zero_sites(self):
        m = self.Z.shape[0]
        self.precision_sum = np.zeros((m, m))      # Λ
        self.natural_mean_sum = np.zeros(m)        # b
        if self.sites == "per-point":
            self.site_precision = np.zeros(self.n)
            self.site_natural_mean = np.zeros(self.n)

    # -- factors ---------------------------------------------------------------------------
    def refactor(self, keep_sites_in_u=False):
        """``L = chol(K_mm + jitter I)`` at the current kernel and inducing inputs.

        ``keep_sites_in_u``: the sites keep their value as functions of ``u = L w`` (module
        docstring, "Sites and hyperparameter steps"): with ``M = L_old⁻¹ L_new``,
        ``Λ ← Mᵀ Λ M`` and ``b ← Mᵀ b``."""
        Kmm = np.ascontiguousarray(self.kernel._K(self.Z, None), dtype=np.float64)
        old = getattr(self, "chol_mm", None)
        self.chol_mm, _, _ = _engine.sparse_projection(Kmm, np.empty((0, self.Z.shape[0])), np.empty(0),
                                                       approximation=self.options.approximation,
                                                       jitter=self.options.jitter, overwrite_knm=True)
        if keep_sites_in_u and old is not None:
            M = solve_triangular(old, self.chol_mm, lower=True)
            P = matmul(M.T, matmul(self.precision_sum, M))
            self.precision_sum = 0.5 * (P + P.T)
            self.natural_mean_sum = matmul(M.T, self.natural_mean_sum)
        self._posterior = None

    def project(self, X):
        """``(Vt, d)`` of the rows X: ``Vt = K(X, Z) L⁻ᵀ`` and the FITC diagonal (zeros for DTC)."""
        Knm = self.kernel._K(X, self.Z)
        Vt = np.ascontiguousarray(solve_triangular(self.chol_mm, Knm.T, lower=True).T)
        if self.options.approximation == "fitc":
            d = np.maximum(self.kernel._diag(X) - np.einsum("ij,ij->i", Vt, Vt), 0.0)
        else:
            d = np.zeros(X.shape[0])
        if not (np.all(np.isfinite(Vt)) and np.all(np.isfinite(d))):
            raise ValueError(f"the kernel {self.kernel!r} produced non-finite values")
        return Vt, d

    @staticmethod
    def _factor(precision, natural_mean):
        """``(R, A⁻¹ b)`` with ``Rᵀ R = I + precision`` (R upper triangular)."""
        A = np.eye(natural_mean.shape[0]) + 0.5 * (precision + precision.T)
        try:
            R = cholesky(A, lower=False, check_finite=True)
        except (np.linalg.LinAlgError, ValueError):
            raise np.linalg.LinAlgError("the minibatch EP posterior is not positive definite "
                                        "(non-finite projections or sites)") from None
        return np.ascontiguousarray(R), cho_solve((R, False), natural_mean)

    def posterior(self):
        """``(R, μ_w)`` of ``q(w)``: ``Rᵀ R = A = I + Λ``, ``μ_w = A⁻¹ b`` (cached)."""
        if self._posterior is None:
            self._posterior = self._factor(self.precision_sum, self.natural_mean_sum)
        return self._posterior

    def cavity(self):
        """``(R∖, μ∖)`` of the tied cavity ``q / f̄^α`` (module docstring)."""
        keep = 1.0 - self.options.power / self.n
        return self._factor(keep * self.precision_sum, keep * self.natural_mean_sum)

    # -- one minibatch ---------------------------------------------------------------------
    def _cavity_marginals(self, Vt, index):
        """Cavity ``N(μ_i, s_i)`` of g_i for the rows ``Vt`` (tied: the shared cavity;
        per-point: the posterior without α of the point's own site)."""
        power = self.options.power
        if self.sites == "tied":
            R, w = self.cavity()
            mean = matmul(Vt, w)
            P = solve_triangular(R, Vt.T, trans="T")
            return mean, np.einsum("ij,ij->j", P, P)
        R, w = self.posterior()
        g_mean = matmul(Vt, w)
        P = solve_triangular(R, Vt.T, trans="T")
        g_var = np.einsum("ij,ij->j", P, P)
        tau, nu = self.site_precision[index], self.site_natural_mean[index]
        var = g_var / (1.0 - power * tau * g_var)
        return g_mean + var * power * (tau * g_mean - nu), var

    def update(self, X, y, index, *, step=None, gradient=False, learn_likelihood=False, learn_inducing=False):
        """Update the sites from the minibatch ``(X, y)`` (rows ``index`` of the data).

        ``step``: the fraction ε of the tied site replaced (tied) or the damping (per-point);
        default ``min(1, |B| / window)``.  Returns a dict with ``log_predictive`` (the points'
        log predictive densities at their cavities, before the update), ``n_failed`` and, with
        ``gradient``, ``gradient``: the estimate ``n/|B|`` times the minibatch's share of the
        evidence gradient at the sites before the update (kernel θ, likelihood θ if
        ``learn_likelihood``, Z if ``learn_inducing``; :func:`gradient_from_sums`'s order).
        """
        opts = self.options
        power, size = opts.power, X.shape[0]
        eps = min(1.0, size / self.window) if step is None else float(step)
        Vt, d = self.project(X)
        spec = self.likelihood.site_spec()
        mean, var = self._cavity_marginals(Vt, index)
        bad = ~(var > 0) | ~np.isfinite(mean)
        var_f = np.where(bad, 1.0, var + d)
        mean = np.where(bad, 0.0, mean)
        log_z, alpha, beta = power_moments_array(spec, y, mean, var_f, power=power,
                                                 n_quadrature=opts.n_quadrature)
        log_pred = log_z if power == 1.0 else power_moments_array(spec, y, mean, var_f, power=1.0)[0]
        out = {"log_predictive": log_pred[~bad]}
        if gradient:
            out["gradient"] = self._gradient_estimate(X, y, Vt, d, mean, var, var_f, alpha, beta, bad,
                                                      learn_likelihood, learn_inducing)
        # the new sites (full-batch EP's update, module docstring), negative precisions by policy
        one_minus = 1.0 - var * beta
        failed = bad | ~(one_minus > 0) | ~np.isfinite(beta) | ~np.isfinite(alpha)
        one_minus = np.where(failed, 1.0, one_minus)
        tau = beta / (power * one_minus)
        nu = (alpha + beta * mean) / (power * one_minus)
        negative = ~failed & (tau < 0)
        if opts.negative_precision == _engine.NEGATIVE_SKIP:
            failed |= negative
        else:
            tau = np.where(negative, 0.0, tau)
            nu = np.where(negative, alpha / power, nu)
        out["n_failed"] = int(np.count_nonzero(failed))
        if self.sites == "tied":
            used = ~failed
            Vu = Vt[used]
            scale = eps * self.n / size
            self.precision_sum *= 1.0 - eps
            self.precision_sum += scale * matmul(Vu.T * tau[used], Vu)
            self.natural_mean_sum *= 1.0 - eps
            self.natural_mean_sum += scale * matmul(Vu.T, nu[used])
        else:
            old_tau, old_nu = self.site_precision[index], self.site_natural_mean[index]
            new_tau = np.where(failed, old_tau, old_tau + eps * (tau - old_tau))
            new_nu = np.where(failed, old_nu, old_nu + eps * (nu - old_nu))
            clipped = new_tau < 0
            new_tau = np.where(clipped, 0.0, new_tau)
            d_tau, d_nu = new_tau - old_tau, new_nu - old_nu
            self.precision_sum += matmul(Vt.T * d_tau, Vt)
            self.natural_mean_sum += matmul(Vt.T, d_nu)
            self.site_precision[index], self.site_natural_mean[index] = new_tau, new_nu
            out["max_change"] = float(max(np.max(np.abs(d_tau) / np.maximum(1.0, np.abs(new_tau)), initial=0.0),
                                          np.max(np.abs(d_nu) / np.maximum(1.0, np.abs(new_nu)), initial=0.0)))
        self.precision_sum = 0.5 * (self.precision_sum + self.precision_sum.T)
        self._posterior = None
        return out

    def _gradient_estimate(self, X, y, Vt, d, mean, var, var_f, alpha, beta, bad, learn_likelihood,
                           learn_inducing):
        """``n/|B|`` times the minibatch's share of the evidence gradient (module docstring)."""
        opts = self.options
        power = opts.power
        good = ~bad
        X, y, Vt = X[good], y[good], Vt[good]
        mean, var, var_f, alpha, beta = mean[good], var[good], var_f[good], alpha[good], beta[good]
        one_minus = np.maximum(1.0 - var * beta, np.finfo(float).tiny)
        tau = beta / (power * one_minus)
        a = alpha / power
        c = ((alpha * alpha - beta) / (2.0 * power) if opts.approximation == "fitc"
             else np.zeros_like(a))
        R, w = self.posterior()
        L = self.chol_mm
        m = w.shape[0]
        Ua = solve_triangular(L, w, lower=True, trans="T")                  # Σ U_j a_j = L⁻ᵀ μ_w
        A_inv = cho_solve((R, False), np.eye(m))
        PA = solve_triangular(L, np.eye(m) - A_inv, lower=True, trans="T")   # L⁻ᵀ (I - A⁻¹)
        scale = self.n / max(X.shape[0] + int(np.count_nonzero(bad)), 1)
        g_kernel, Gmm, g_z = gradient_second_sums(self.kernel, self.Z, X, L, Vt, tau, a, c, Ua, PA,
                                                  learn_inducing)
        lik = (scale * self.likelihood.power_ep_theta_gradient(y, mean, var_f, alpha, beta, power)
               if learn_likelihood else 0.0)
        return gradient_from_sums(self.kernel, self.Z, scale * g_kernel, scale * Gmm,
                                  None if g_z is None else scale * g_z, lik, learn_likelihood, learn_inducing)

    # -- whole passes ------------------------------------------------------------------------
    def rebuild(self, source):
        """Per-point sites: recompute ``Λ`` and ``b`` from all sites at the current
        hyperparameters (one pass over ``source``)."""
        m = self.Z.shape[0]
        P, b = np.zeros((m, m)), np.zeros(m)
        for start, stop in source.chunks:
            X, _ = source.read(start, stop)
            Vt, _ = self.project(X)
            P += matmul(Vt.T * self.site_precision[start:stop], Vt)
            b += matmul(Vt.T, self.site_natural_mean[start:stop])
        self.precision_sum, self.natural_mean_sum = 0.5 * (P + P.T), b
        self._posterior = None

    def predictor(self):
        """The latent predictive of the current state (:class:`SparsePredictor`)."""
        R, w = self.posterior()
        return SparsePredictor(self.kernel, self.likelihood, self.Z, self.chol_mm, R, w)


class StoppingRule:
    """The model-based stopping rule of minibatch learning (module docstring, "Stopping rule").

    Window means of the log loss are compared in blocks of ``patience`` windows: learning
    stops when the last block's mean is not below the block before it by more than the
    standard error of their difference (from the windows' own standard errors), that is when
    the loss no longer falls faster than its noise.  Comparing blocks rather than single
    windows lets a slow, steady descent (an improvement per window below a window's noise)
    continue.

    Parameters
    ----------
    window : int
        Points per window of log losses.
    patience : int
        Windows per block.
    """

    def __init__(self, window, patience):
        self.window, self.patience = int(window), int(patience)
        self._losses = []
        self._count = 0
        self.best = np.inf
        self.history = []          # (points seen, window mean log loss, its standard error)
        self.improved = False      # whether the last window was the best so far

    def add(self, log_predictive, seen):
        """Record a minibatch's log predictive densities; returns the finished window's
        ``(mean, standard error)`` or None."""
        self._losses.append(-np.asarray(log_predictive, dtype=float))
        self._count += len(log_predictive)
        if self._count < self.window:
            return None
        losses = np.concatenate(self._losses)
        self._losses, self._count = [], 0
        mean = float(np.mean(losses))
        se = float(np.std(losses) / np.sqrt(max(losses.size, 1)))
        self.history.append((int(seen), mean, se))
        self.improved = mean < self.best
        self.best = min(self.best, mean)
        return mean, se

    @property
    def done(self):
        p = self.patience
        if len(self.history) < 2 * p:
            return False
        recent, before = self.history[-p:], self.history[-2 * p:-p]
        drop = np.mean([h[1] for h in before]) - np.mean([h[1] for h in recent])
        se = np.sqrt(sum(h[2] ** 2 for h in recent + before)) / p
        return drop <= se


def learn_minibatch(state, hyper, source, *, batch_size, learning_rate, window, patience, max_epochs,
                    learn, rng, progress=None, warmup=None):
    """Minibatch EP with interleaved stochastic evidence-gradient steps (module docstring).

    Parameters
    ----------
    state : MinibatchSparseEP
        Updated in place (its kernel, likelihood and Z follow the hyperparameters).
    hyper : fastep._gp.hyperparameters.Hyperparameters
        θ's packing, its search coordinates and the hyperprior; ``hyper.unpack`` gives the
        kernel, the likelihood and Z (when learnt) of a θ.
    source : RowSource
    batch_size, learning_rate, window, patience, max_epochs
        Minibatch size, Adam's step in the search coordinates, the stopping rule's window and
        patience, and the cap on passes.
    learn : bool
        False: sites only (fixed hyperparameters), stopped by the same rule.
    rng : numpy.random.Generator
    progress : fastep.progress.Progress or None
        Receives a ``"minibatch"`` record per window (``log_evidence``: n times the window's
        mean log predictive density, ``change``: its standard error times n).
    warmup : int or None
        Points of site updates before the first hyperparameter step (default ``window``).

    When learning, the model of the best window (lowest mean log loss) is the one returned.

    Returns
    -------
    dict
        ``n_epochs`` (passes begun), ``n_steps`` (hyperparameter steps), ``n_points`` (points
        processed), ``stopped`` ('converged', 'max_epochs' or 'callback'), ``history`` (the
        stopping rule's windows).
    """
    space = hyper.space
    learn_likelihood, learn_inducing = hyper.learn_likelihood, hyper.extra is not None
    u = space.to_search(hyper.pack(state.kernel, state.likelihood, state.Z if learn_inducing else None))
    adam = Adam(u.size, learning_rate)
    rule = StoppingRule(window, patience)
    warmup = window if warmup is None else int(warmup)
    seen, steps, stopped, epoch = 0, 0, "max_epochs", 0
    best = None
    for epoch in range(1, max_epochs + 1):
        if state.sites == "per-point" and epoch > 1 and learn:
            state.rebuild(source)
        for X, y, index in epoch_batches(source, batch_size, rng):
            step_now = learn and seen >= warmup
            out = state.update(X, y, index, gradient=step_now, learn_likelihood=learn_likelihood,
                               learn_inducing=learn_inducing)
            seen += X.shape[0]
            if step_now:
                theta = space.from_search(u)
                _, prior_grad = hyper.log_prior(theta, eval_gradient=True)
                grad_u = space.gradient_to_search(theta, out["gradient"] + prior_grad)
                if np.all(np.isfinite(grad_u)):
                    u_new = u + adam.step(grad_u)
                    if space.in_range(u_new):
                        u = u_new
                        kernel, likelihood, Z = hyper.unpack(space.from_search(u))
                        state.kernel, state.likelihood = kernel, likelihood
                        if learn_inducing:
                            state.Z = Z
                        state.refactor(keep_sites_in_u=True)
                        steps += 1
            if learn and not step_now:
                continue                    # the warm-up's windows do not count
            finished = rule.add(out["log_predictive"], seen)
            if finished is not None and learn and rule.improved:
                best = (u.copy(), state.snapshot())
            if finished is not None:
                if progress is not None and not progress.report("minibatch", len(rule.history),
                                                                -state.n * finished[0], state.n * finished[1]):
                    stopped = "callback"
                    break
                if rule.done:
                    stopped = "converged"
                    break
        if stopped != "max_epochs":
            break
    if best is not None and not np.array_equal(best[0], u):
        # the model of the best window (a later window's loss was not lower)
        u = best[0]
        kernel, likelihood, Z = hyper.unpack(space.from_search(u))
        state.kernel, state.likelihood = kernel, likelihood
        if learn_inducing:
            state.Z = Z
        state.restore(best[1])
    return {"n_epochs": epoch, "n_steps": steps, "n_points": seen, "stopped": stopped, "history": rule.history}


#: Points of the final pass of site updates at the learnt hyperparameters (all n when fewer).
POLISH_ROWS = 100_000


def polish_sites(state, source, batch_size, rng, rows=POLISH_ROWS):
    """Site updates at fixed hyperparameters over ``min(n, rows)`` points, the tied site
    becoming the running average of their sites, the learnt site counting as ``window`` points
    (``ε = |B| / (window + points so far)``): the learnt model's sites averaged over many more
    points than the learning window holds.  Per-point sites take one damped pass instead.
    Returns the mean log predictive density of the points visited."""
    seen, total = 0, 0.0
    rows = min(state.n, int(rows))
    for X, y, index in epoch_batches(source, batch_size, rng):
        size = X.shape[0]
        step = size / (state.window + seen + size) if state.sites == "tied" else None
        out = state.update(X, y, index, step=step)
        seen += size
        total += float(np.sum(out["log_predictive"]))
        if seen >= rows:
            break
    return total / max(seen, 1)


def settle_sites(state, source, batch_size, rng, rows):
    """Site updates at fixed hyperparameters over ``min(n, rows)`` points, each replacing the
    default fraction ``ε = |B| / window`` of the tied site: from zero sites (a new active set or
    inducing inputs), the tied site keeps ``(1 - ε)^(rows / |B|) ≈ exp(-rows / window)`` of its
    start, so that :func:`polish_sites` then averages settled sites."""
    seen = 0
    rows = min(state.n, int(rows))
    for X, y, index in epoch_batches(source, batch_size, rng):
        state.update(X, y, index)
        seen += X.shape[0]
        if seen >= rows:
            break


#: Site windows of plain updates before the polish pass of a fit at fixed parameters from zero
#: sites (:func:`fit_minibatch`'s ``settle``): the zero start keeps about e⁻⁵ of its weight.
SETTLE_WINDOWS = 5

#: Rows of the seeded sample on which a minibatch fit's evidence is estimated.
EVIDENCE_SAMPLE_ROWS = 20_000


def sampled_rows(source, n, rng, rows):
    """``(index, X, y)`` chunk by chunk for a seeded sample of ``rows`` of the ``n`` rows of
    ``source`` (all of them when ``n <= rows``), ``index`` the rows' positions, in order."""
    index = np.arange(n) if n <= rows else np.sort(rng.choice(n, size=rows, replace=False))
    for start, stop in source.chunks:
        pick = index[(index >= start) & (index < stop)]
        if pick.size == 0:
            continue
        X, y = source.read(start, stop)
        yield pick, X[pick - start], y[pick - start]


def _log_normaliser(R, w):
    """``Φ = -log|R| + ½ wᵀ A w`` of ``N(w; A⁻¹b, A⁻¹)`` in natural form (without the 2π term),
    with ``A = Rᵀ R`` and ``w = A⁻¹ b``."""
    Rw = matmul(R, w)
    return float(-np.sum(np.log(np.diag(R))) + 0.5 * inner(Rw, Rw))


def log_evidence_estimate(state, source, rng, rows=EVIDENCE_SAMPLE_ROWS):
    """``(estimate, standard error)`` of the EP log marginal likelihood of ``state``'s sites.

    ``log Z = Φ(q) - Φ(p) + Σ_i (1/α) [log Z_i + Φ(q∖i) - Φ(q)]`` (Minka's EP energy at the
    sites; ``Φ(p) = 0`` for ``w ~ N(0, I)``): the sum over points is estimated from a seeded
    sample of ``rows`` rows (all of them when n is smaller; the standard error is then 0).
    Tied sites share one cavity, so ``Φ(q∖i) - Φ(q)`` is one m-dimensional term; per-point
    sites give the one-dimensional ``Ψ(cavity) - Ψ(marginal)`` of full-batch EP.
    """
    power = state.options.power
    n = state.n
    R, w = state.posterior()
    total = _log_normaliser(R, w)
    terms = []
    for pick, X, y in sampled_rows(source, n, rng, rows):
        Vt, d = state.project(X)
        mean, var = state._cavity_marginals(Vt, pick)
        log_z, _, _ = power_moments_array(state.likelihood.site_spec(), y, mean, var + d, power=power,
                                          n_quadrature=state.options.n_quadrature)
        if state.sites == "per-point":
            P = solve_triangular(R, Vt.T, trans="T")
            g_var = np.einsum("ij,ij->j", P, P)
            g_mean = matmul(Vt, w)
            psi_cavity = 0.5 * np.log(var) + 0.5 * mean * mean / var
            psi_marginal = 0.5 * np.log(g_var) + 0.5 * g_mean * g_mean / g_var
            log_z = log_z + psi_cavity - psi_marginal
        terms.append(log_z / power)
    terms = np.concatenate(terms)
    if not np.all(np.isfinite(terms)):
        raise np.linalg.LinAlgError("the EP log marginal likelihood of the minibatch fit is not finite "
                                    "(an improper cavity); increase jitter or check the kernel")
    scale = n / terms.size
    estimate = total + scale * float(np.sum(terms))
    if state.sites == "tied":
        Rc, wc = state.cavity()
        estimate += n / power * (_log_normaliser(Rc, wc) - total)
    se = 0.0 if terms.size == n else float(n * np.std(terms) / np.sqrt(terms.size))
    return estimate, se


class MinibatchInfo:
    """How a minibatch fit ended (the fields the estimators summarise, as for an EP run)."""

    def __init__(self, result):
        self.n_sweeps = int(result["n_epochs"])
        self.converged = result["stopped"] == "converged"
        self.stopped = result["stopped"]
        self.n_steps = int(result["n_steps"])
        self.n_points = int(result["n_points"])


class MinibatchSparseFit(KeepsSparseFitOptions):
    """One fitted sparse problem learnt from minibatches: what the sparse estimators keep of a
    fit (kernel, likelihood, Z, the evidence, the predictor, the sites)."""

    algorithm = "minibatch sparse EP"

    def __init__(self, state, hyperparameters, result, log_ml, log_ml_se, options, n_points):
        self.kernel, self.likelihood, self.Z = state.kernel, state.likelihood, state.Z
        self.hyperparameters = hyperparameters
        self.predictor = state.predictor()
        self.log_ml = float(log_ml)
        self.log_ml_se = float(log_ml_se)
        theta = hyperparameters.pack(state.kernel, state.likelihood,
                                     state.Z if hyperparameters.extra is not None else None)
        self.log_objective = self.log_ml + float(hyperparameters.log_prior(theta))
        self.n_evaluations = int(result["n_steps"])
        self.history = [tuple(h) for h in result["history"]]
        self.info = MinibatchInfo(result)
        self.options = options
        self.n_points = int(n_points)
        self.sites_mode = state.sites
        if state.sites == "per-point":
            self.site_precision, self.site_natural_mean = state.site_precision, state.site_natural_mean
            self.tied_site = None
        else:
            self.site_precision = self.site_natural_mean = None
            #: ``(Λ, b)`` of the tied site in the whitened coordinates of the fitted K_mm (a warm start's)
            self.tied_site = (state.precision_sum.copy(), state.natural_mean_sum.copy())
        self.growth = None

    def latent(self, Xs):
        return self.predictor.latent(Xs)

    def log_ml_at(self, hyperparameters, theta, eval_gradient):
        """The evidence at another θ needs EP over the training data, which a minibatch fit does not keep."""
        raise NotImplementedError(
            f"{getattr(self, 'estimator_name', 'the estimator')}.log_marginal_likelihood(theta) evaluates EP over "
            "the training data, which a fit learnt from minibatches does not keep; refit with "
            "learning='full-batch' for the evidence at other hyperparameters (log_marginal_likelihood() "
            "without theta gives the fitted estimate)")


def _state_class(options):
    """The minibatch state of the model of ``options``: the binary (or regression) sparse GP's,
    or the joint multiclass model's (``options.multinomial``)."""
    if options.multinomial:
        from .multinomial_minibatch import MinibatchMultinomialSparseEP
        return MinibatchMultinomialSparseEP
    return MinibatchSparseEP


def fit_minibatch(kernel, likelihood, Z, source, options, hyperparameters, *, learn, start=None, settle=False):
    """Learn one sparse problem from minibatches (:func:`learn_minibatch`) and estimate its
    evidence; returns a :class:`MinibatchSparseFit`.

    ``options``: the fit's :class:`~fastep._gp.fit_options.SparseFitOptions`, with
    ``site_window`` (the points a tied site averages), ``window`` and ``patience`` (the
    stopping rule) set.

    ``start``: a previous :class:`MinibatchSparseFit` with tied sites to continue from (a warm
    start): its kernel, likelihood and Z, and its tied site scaled from its n to this source's
    (the site stands for the average point), without the warm-up window.

    ``settle`` (with ``learn=False`` and tied sites): instead of the stopping rule's windows,
    ``SETTLE_WINDOWS`` site windows of plain updates (:func:`settle_sites`) before the polish
    pass: the sites at fixed parameters, for their evidence.
    """
    rng = np.random.default_rng(options.seed)
    warmup = None
    if start is not None and start.tied_site is not None and options.sites == "tied":
        kernel, likelihood, Z = start.kernel, start.likelihood, start.Z
    else:
        start = None
    state = _state_class(options)(kernel, likelihood, Z, source.n, options, sites=options.sites,
                                  window=options.site_window)
    if start is not None:
        scale = source.n / start.n_points
        state.precision_sum = scale * start.tied_site[0]
        state.natural_mean_sum = scale * start.tied_site[1]
        warmup = 0
    settle = bool(settle) and not learn and state.sites == "tied"
    result = learn_minibatch(state, hyperparameters, source, batch_size=options.batch_size,
                             learning_rate=options.learning_rate, window=options.window,
                             patience=options.patience, max_epochs=0 if settle else options.max_epochs,
                             learn=learn, rng=rng, progress=options.progress, warmup=warmup)
    if settle:
        settle_sites(state, source, options.batch_size, rng, SETTLE_WINDOWS * state.window)
    polish_sites(state, source, options.batch_size, rng)
    estimate = getattr(state, "log_evidence_estimate", None)
    if estimate is not None:
        log_ml, se = estimate(source, np.random.default_rng(options.seed), EVIDENCE_SAMPLE_ROWS)
    else:
        log_ml, se = log_evidence_estimate(state, source, np.random.default_rng(options.seed))
    return MinibatchSparseFit(state, hyperparameters, result, log_ml, se, options, source.n)
