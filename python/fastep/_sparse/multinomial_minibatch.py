"""Minibatch EP for the joint multiclass sparse GP: the state that :func:`fastep._sparse.stochastic.learn_minibatch`
drives for ``SparseGPClassifier(multi_class='multinomial')``.

The learner, its stopping rule, Adam, the polish pass and the row sources are those of the
binary model (:mod:`fastep._sparse.stochastic`); only the site step differs: the c latent values
of a point share one cavity ``N(m_i, C_i)`` on g (c x c), nested EP (Riihimäki, Jylänki and
Vehtari, JMLR 2013, §3) gives the point's outer site, and its action on g,
``P_i = diag(κ_i) - κ_i κ_iᵀ / (1ᵀκ_i)`` and ``h_i`` (:mod:`fastep._sparse.multinomial`,
"Sites"), enters the posterior over the c m whitened inducing values as
``Σ_i P_i ⊗ b_i b_iᵀ`` and ``Σ_i h_i ⊗ b_i``.

``'tied'`` (stochastic EP; Li, Hernández-Lobato and Turner, NeurIPS 2015)
    One tied site ``(Λ, b)`` (c m x c m, c m) stands for n copies of the average site; every
    minibatch point sees the cavity ``A∖ = I + (1 - 1/n) Λ``, ``b∖ = (1 - 1/n) b``, its outer
    site comes from inner EP run from zero inner sites to convergence (``INNER_SWEEPS`` at most),
    and ``Λ ← (1 - ε) Λ + ε (n/|B|) Σ_B P_i ⊗ b_i b_iᵀ`` (likewise b), ``ε = |B| / window``.
    Memory O(c² m²) at any n.
``'per-point'``
    Every point keeps nested EP's inner sites (O(n c)); a minibatch runs the damped parallel
    update of its points (one inner sweep, warm) against the posterior of all sites and adds the
    change of their ``P ⊗ b bᵀ`` and ``h ⊗ b`` to ``Λ`` and ``b``.  With one minibatch of all the
    data every update is one outer iteration of full-batch EP
    (:class:`fastep._sparse.multinomial.MultinomialSparseEP`).

Sites across hyperparameter steps are held fixed as functions of u (``Λ ← (I ⊗ M)ᵀ Λ (I ⊗ M)``,
``b ← (I ⊗ M)ᵀ b``, ``M = L_old⁻¹ L_new``), as for the binary model.

The evidence gradient estimate is ``n/|B|`` times the minibatch's share of the exact gradient
(:mod:`fastep._sparse.multinomial`, "Evidence gradient"), its global sums written through the
posterior; a point's terms come from its cavity and its new site:
``a = (I + P C)⁻¹ (h - P m)`` (= ∂ log Ẑ/∂m) and, for FITC, ``c = ½ (|a|² - tr(P (I + C P)⁻¹))``.
"""
import numpy as np
from scipy.linalg import solve_triangular

from .._epcore import multiclass_ep as _nested
from .._dense.multiclass import _outer_sites
from .._linalg import batched_solve, matmul
from .blocks import gradient_from_sums
from .multinomial import (MultinomialSparsePosterior, MultinomialSparsePredictor, adjoint_block, adjoint_shares,
                          cavities_from_marginals, effective_sites, f_cavities, outer_site_precisions,
                          site_log_normalisers, site_sums)
from .stochastic import MinibatchSparseEP, MinibatchState, sampled_rows

__all__ = ["MinibatchMultinomialSparseEP", "INNER_SWEEPS"]

#: Inner sweeps at most (to a relative change of ``INNER_TOL``) of a tied-site point's nested EP,
#: which starts from zero inner sites.
INNER_SWEEPS = 20
INNER_TOL = 1e-6


def _cavity_gradient_terms(C, mean, P, h, fitc):
    """``a = (I + P C)⁻¹ (h - P m)`` and ``c = ½ (|a|² - tr(P (I + C P)⁻¹))`` (module docstring)."""
    c = P.shape[1]
    r = h - np.einsum("iab,ib->ia", P, mean)
    a = batched_solve(np.eye(c) + np.einsum("iab,ibc->iac", P, C), r)[0]
    if not fitc:
        return a, np.zeros(a.shape[0])
    M = np.eye(c) + np.einsum("iab,ibc->iac", C, P)
    trace = np.trace(batched_solve(np.transpose(M, (0, 2, 1)), P)[0], axis1=1, axis2=2)
    return a, 0.5 * (np.sum(a * a, axis=1) - trace)


class MinibatchMultinomialSparseEP(MinibatchState):
    """The state of minibatch EP for the joint multiclass sparse GP (module docstring); the
    interface of :class:`fastep._sparse.stochastic.MinibatchSparseEP`.

    Parameters
    ----------
    kernel : Kernel
    likelihood : None
        (the multinomial probit has no parameters)
    Z : ndarray (m, n_features)
    n : int
        Number of training points.
    options : dict
        ``approximation``, ``jitter`` and ``n_classes``.
    sites : {'tied', 'per-point'}
    window : int
        Points the tied site averages over (``ε = |B| / window``); per-point: the damping of a
        minibatch's update is ``min(1, |B| / window)``.
    """

    per_point_sites = ("inner_precision", "inner_natural_mean")

    def __init__(self, kernel, likelihood, Z, n, options, sites="tied", window=None):
        self.n_classes = int(options.n_classes)
        super().__init__(kernel, None, Z, n, options, sites, window)

    def _zero_sites(self):
        cm = self.n_classes * self.Z.shape[0]
        self.precision_sum = np.zeros((cm, cm))
        self.natural_mean_sum = np.zeros(cm)
        if self.sites == "per-point":
            self.inner_precision = np.zeros((self.n, self.n_classes))
            self.inner_natural_mean = np.zeros((self.n, self.n_classes))

    # -- the estimators' view of per-point sites --------------------------------------------------
    @property
    def site_precision(self):
        return self.inner_precision.T if self.sites == "per-point" else None

    @property
    def site_natural_mean(self):
        return self.inner_natural_mean.T if self.sites == "per-point" else None

    def _forget(self):
        self._posterior = self._cavity = None

    # -- factors -------------------------------------------------------------------------------
    def refactor(self, keep_sites_in_u=False):
        """``L = chol(K_mm + jitter I)``; with ``keep_sites_in_u`` the sites keep their value as
        functions of u (module docstring)."""
        from .._epcore import sparse_ep as _engine
        m = self.Z.shape[0]
        Kmm = np.ascontiguousarray(self.kernel._K(self.Z, None), dtype=np.float64)
        old = getattr(self, "chol_mm", None)
        self.chol_mm, _, _ = _engine.sparse_projection(Kmm, np.empty((0, m)), np.empty(0),
                                                        approximation=self.options.approximation,
                                                        jitter=self.options.jitter, overwrite_knm=True)
        if keep_sites_in_u and old is not None:
            M = solve_triangular(old, self.chol_mm, lower=True)
            c = self.n_classes
            # (I ⊗ M)ᵀ Λ (I ⊗ M): every m-column block times M, then every m-row block (by symmetry)
            P = matmul(self.precision_sum.reshape(c * m * c, m), M).reshape(c * m, c * m)
            P = matmul(P.T.reshape(c * m * c, m), M).reshape(c * m, c * m)
            self.precision_sum = 0.5 * (P + P.T)
            self.natural_mean_sum = matmul(self.natural_mean_sum.reshape(c, m), M).ravel()
        self._forget()

    #: ``(Vt, d)`` of the rows X, as for the binary model (the same kernel, Z and K_mm factor)
    project = MinibatchSparseEP.project

    def posterior(self):
        """The posterior ``q(v)`` of ``A = I + Λ`` (:class:`MultinomialSparsePosterior`, cached)."""
        if self._posterior is None:
            self._posterior = MultinomialSparsePosterior(self.precision_sum, self.natural_mean_sum, self.n_classes)
        return self._posterior

    def cavity(self):
        """The tied cavity ``A∖ = I + (1 - 1/n) Λ`` (cached)."""
        if self._cavity is None:
            keep = 1.0 - 1.0 / self.n
            self._cavity = MultinomialSparsePosterior(keep * self.precision_sum, keep * self.natural_mean_sum,
                                                      self.n_classes)
        return self._cavity

    # -- one minibatch ---------------------------------------------------------------------------
    def _sites_of(self, labels, index, d):
        """``(κ, h)`` of the stored per-point sites of the rows ``index`` (classes ``labels``)."""
        pi, nu = _outer_sites(labels, self.inner_precision[index], self.inner_natural_mean[index])
        return effective_sites(pi, nu, d)

    def update(self, X, y, index, *, step=None, gradient=False, learn_likelihood=False, learn_inducing=False):
        """Update the sites from the minibatch ``(X, y)`` (rows ``index``); returns a dict with
        ``log_predictive`` (the points' tilted normalisers: their log predictive densities at
        their cavities), ``n_failed`` and, with ``gradient``, ``gradient`` (kernel θ, then Z if
        ``learn_inducing``) before the update."""
        size = X.shape[0]
        labels = np.ascontiguousarray(y, dtype=np.int32)
        eps = min(1.0, size / self.window) if step is None else float(step)
        Vt, d = self.project(X)
        fitc = self.options.approximation == "fitc"
        c = self.n_classes
        if self.sites == "tied":
            mean, S = self.cavity().marginals(Vt)
            C, m_c = S, mean
            alpha, beta = np.zeros((size, c)), np.zeros((size, c))
            cav_prec, cav_lin, proper = f_cavities(C, m_c, d)
            log_z, status = _nested.InnerEP(n_inner_sweeps=INNER_SWEEPS, tol=INNER_TOL).update(
                labels, cav_prec, cav_lin, alpha, beta)
        else:
            post = self.posterior()
            mean, S = post.marginals(Vt)
            kappa_old, h_old = self._sites_of(labels, index, d)
            P_old = outer_site_precisions(kappa_old)
            C, m_c = cavities_from_marginals(S, mean, P_old, h_old)
            cav_prec, cav_lin, proper = f_cavities(C, m_c, d)
            alpha, beta = self.inner_precision[index], self.inner_natural_mean[index]
            old_alpha, old_beta = alpha.copy(), beta.copy()
            log_z, status = _nested.InnerEP(n_inner_sweeps=1, damping=eps).update(labels, cav_prec, cav_lin,
                                                                                 alpha, beta)
        failed = ~proper | (status != 0) | ~np.isfinite(log_z)
        out = {"log_predictive": log_z[~failed], "n_failed": int(np.count_nonzero(failed))}
        pi, nu = _outer_sites(labels, alpha, beta)
        kappa, h = effective_sites(pi, nu, d)
        if gradient:
            if self.sites == "tied":
                P = outer_site_precisions(kappa)
                a, c_terms = _cavity_gradient_terms(C, m_c, P, h, fitc)
                use = ~failed
            else:
                a, c_terms = _cavity_gradient_terms(C, m_c, P_old, h_old, fitc)
                P, use = P_old, proper
            out["gradient"] = self._gradient_estimate(X[use], Vt[use], P[use], a[use], c_terms[use], size,
                                                      learn_inducing)
        if self.sites == "tied":
            used = ~failed
            precision, natural = site_sums(Vt[used], kappa[used], h[used])
            scale = eps * self.n / size
            self.precision_sum *= 1.0 - eps
            self.precision_sum += scale * precision
            self.natural_mean_sum *= 1.0 - eps
            self.natural_mean_sum += scale * natural
        else:
            new_p, new_n = site_sums(Vt, kappa, h)
            old_p, old_n = site_sums(Vt, kappa_old, h_old)
            self.precision_sum += new_p - old_p
            self.natural_mean_sum += new_n - old_n
            self.inner_precision[index], self.inner_natural_mean[index] = alpha, beta
            out["max_change"] = float(max(
                np.max(np.abs(alpha - old_alpha) / np.maximum(1.0, np.abs(old_alpha)), initial=0.0),
                np.max(np.abs(beta - old_beta) / np.maximum(1.0, np.abs(old_beta)), initial=0.0)))
        self.precision_sum = 0.5 * (self.precision_sum + self.precision_sum.T)
        self._forget()
        return out

    def _gradient_estimate(self, X, Vt, P, a, c_terms, size, learn_inducing):
        """``n/|B|`` times the minibatch's share of the evidence gradient (module docstring). Its
        global sums are taken at the posterior of all sites; with tied sites at the tied cavity,
        whose factorisation the step has already (it differs from the posterior by 1/n of the tied
        site, below the estimate's minibatch noise)."""
        post = self.cavity() if self.sites == "tied" else self.posterior()
        H = post.gradient_rows(Vt, P)
        G = adjoint_block(self.chol_mm, Vt, post.mean_w, a, H, c_terms)
        g_kernel, Gmm, g_z = adjoint_shares(self.kernel, self.Z, X, self.chol_mm, Vt, G, c_terms, learn_inducing)
        scale = self.n / max(size, 1)
        return gradient_from_sums(self.kernel, self.Z, scale * g_kernel, scale * Gmm,
                                  None if g_z is None else scale * g_z, None, False, learn_inducing)

    # -- whole passes -------------------------------------------------------------------------------
    def rebuild(self, source):
        """Per-point sites: recompute ``Λ`` and ``b`` from all sites at the current hyperparameters."""
        cm = self.precision_sum.shape[0]
        P, b = np.zeros((cm, cm)), np.zeros(cm)
        for start, stop in source.chunks:
            X, y = source.read(start, stop)
            Vt, d = self.project(X)
            kappa, h = self._sites_of(np.ascontiguousarray(y, dtype=np.int32), slice(start, stop), d)
            p_sum, n_sum = site_sums(Vt, kappa, h)
            P += p_sum
            b += n_sum
        self.precision_sum, self.natural_mean_sum = 0.5 * (P + P.T), b
        self._forget()

    def predictor(self):
        post = self.posterior()
        return MultinomialSparsePredictor(self.kernel, self.Z, self.chol_mm, post.mean_w, post.cov_w)

    def log_evidence_estimate(self, source, rng, rows):
        """``(estimate, standard error)`` of the EP log marginal likelihood of the sites (Minka's
        energy; the sum over points from a seeded sample of ``rows`` rows, all when n is smaller)."""
        n = self.n
        post = self.posterior()
        total = -0.5 * post.log_det + 0.5 * post.quad
        terms = []
        for pick, X, y in sampled_rows(source, n, rng, rows):
            labels = np.ascontiguousarray(y, dtype=np.int32)
            Vt, d = self.project(X)
            if self.sites == "tied":
                mean, C = self.cavity().marginals(Vt)
                cav_prec, cav_lin, proper = f_cavities(C, mean, d)
                alpha, beta = np.zeros((pick.size, self.n_classes)), np.zeros((pick.size, self.n_classes))
                log_z, _ = _nested.InnerEP(n_inner_sweeps=INNER_SWEEPS, tol=INNER_TOL).update(
                    labels, cav_prec, cav_lin, alpha, beta)
                log_z = np.where(proper, log_z, np.nan)
            else:
                mean, S = post.marginals(Vt)
                kappa, h = self._sites_of(labels, pick, d)
                P = outer_site_precisions(kappa)
                C, m_c = cavities_from_marginals(S, mean, P, h)
                cav_prec, cav_lin, proper = f_cavities(C, m_c, d)
                log_z, _ = _nested.InnerEP(n_inner_sweeps=0).update(labels, cav_prec, cav_lin,
                                                                    self.inner_precision[pick].copy(),
                                                                    self.inner_natural_mean[pick].copy())
                log_z = np.where(proper, log_z - site_log_normalisers(C, m_c, P, h), np.nan)
            terms.append(log_z)
        terms = np.concatenate(terms)
        if not np.all(np.isfinite(terms)):
            raise np.linalg.LinAlgError("the EP log marginal likelihood of the minibatch fit is not finite "
                                        "(an improper cavity); increase jitter or check the kernel")
        estimate = total + n / terms.size * float(np.sum(terms))
        if self.sites == "tied":
            cav = self.cavity()
            estimate += n * ((-0.5 * cav.log_det + 0.5 * cav.quad) - total)
        se = 0.0 if terms.size == n else float(n * np.std(terms) / np.sqrt(terms.size))
        return estimate, se
