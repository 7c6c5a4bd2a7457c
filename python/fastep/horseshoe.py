"""Sparse linear regression with the horseshoe prior fitted by EP, single- and multi-task, with
learnt feature-selection dependencies.

Model (Hernández-Lobato & Hernández-Lobato, *Learning Feature Selection Dependencies in
Multi-task Learning*, NIPS 2013; equation numbers refer to its supplementary material).
Task ``t`` has data
``X_t`` (``n_t x d``), ``y_t = X_t w_t + ε``, ``ε ~ N(0, σ_t² I)``, and each coefficient
the prior ``N(w_tj | 0, u_tj²/v_tj²)`` with ``u_t ~ N(0, ρ² C)``, ``v_t ~ N(0, γ² C)``;
``|u_tj/v_tj|`` is half-Cauchy with scale ``ρ/γ``, so each ``w_tj`` has a horseshoe prior.
The correlation matrix ``C = Δ D Δ + Δ P Pᵀ Δ`` (``D`` diagonal, ``P`` ``d x m``, ``Δ``
diagonal with ``diag C = 1``) is shared by all tasks: features with correlated ``u`` and
``v`` tend to be relevant or irrelevant together, and ``P`` is learnt from all tasks.

Inference is parallel EP with damping (supplement §1; the compiled engine
:class:`fastep._epcore.horseshoe_ep.HorseshoeEP`), the evidence is eq (27) and the hyperparameters
(``σ_t²``, ``ρ²``, ``P``) maximise it with L-BFGS-B using the exact gradients of eqs
(33)-(50), started from the best point of a coarse search over ``(σ², ρ²)`` (parameter
``rho2``; :mod:`fastep._horseshoe.search`), every EP evaluation warm-started from the
sites of the nearest point evaluated before and none repeated. ``γ²`` is held fixed: the prior of ``w`` depends on ``ρ`` and ``γ`` only through
``ρ/γ``, and so does the EP evidence (its gradient satisfies
``ρ² ∂/∂ρ² + γ² ∂/∂γ² = 0`` at every fixed point), so learning both would only move along a
flat ridge.

Numerical policies (details in :class:`fastep._epcore.horseshoe_ep.HorseshoeEP`): negative
u- and v-site precisions are accepted; negative w-site precisions are kept ``>= -0.1/η_j``
(``negative_precision='clip'``, ``η_j`` the cavity variance) or left free (``'allow'``);
a damped step that would make the posterior or a cavity improper is halved, and if that
fails the site-precision decreases are held back for that iteration; after 25 such
iterations in a row EP stops as 'stuck'. The damping ``ε_k = max(0.5 · 0.99^k, floor)``
starts with the floor at ``min_damping`` (0.3) and halves it when the residual stalls.
EP that stops before ``tol`` (status 'max_sweeps' or 'stuck') raises a
:class:`fastep.ConvergenceWarning`, as does type-II ML that ends where EP fails to
converge; results are never NaN (a non-finite result raises).
"""
from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING, overload

import numpy as np

from ._epcore.horseshoe_ep import HorseshoeDamping, HorseshoeOptions, HorseshoePrior
from ._horseshoe import parallel_ep as _eng
from . import _validation as v
from ._linalg import gram, inner, matmul
from ._base import (EXAMPLES_DOC, BaseEstimator, RegressorMixin, check_is_fitted, deprecated_alias, fill_doc,
                    records_feature_names, renamed_parameter)
from ._horseshoe.fit_options import HorseshoeFitOptions
from ._horseshoe.search import EvidenceSearch
from .exceptions import ConvergenceWarning
from .progress import CALLBACK_DOC, StopRequested

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Literal

    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._typing import Callback, MeanStd

__all__ = ["HorseshoeRegression", "MultiTaskHorseshoeRegression"]



def _noise_fractions(floor: float) -> list[float]:
    """``σ²/Var(y)`` tried by the coarse start: ``10^-1, 10^-2, ...`` down to ``floor``."""
    fractions = [10.0 ** -k for k in range(1, 17) if 10.0 ** -k >= floor * (1 - 1e-12)]
    return fractions or [floor]


def _fitted(name: str, *, first_task: bool = False, scalar: bool = False) -> Any:
    """A read-only fitted attribute: the per-task array ``self.<name>`` (its first task's entry
    with ``first_task``, as a float with ``scalar``); ``NotFittedError`` before ``fit``. The class
    annotates the attribute with its type."""
    def get(self):
        check_is_fitted(self, "_coef")
        value = getattr(self, name)
        if first_task:
            value = value[0]
        return float(value) if scalar else value
    return property(get)


class _HorseshoeBase(BaseEstimator):
    """Shared machinery: validation, EP over tasks, type-II ML, fitted attributes."""

    n_components: int
    learn_dependencies: bool
    learn_hyperparameters: bool
    rho2: float | None
    gamma2: float
    D: float | ArrayLike
    P_init: ArrayLike | None
    P_init_scale: float
    random_state: int | np.random.Generator | None
    fit_intercept: bool
    noise_variance_floor: float
    negative_precision: Literal["clip", "allow"]
    damping: float
    damping_decay: float
    min_damping: float
    tol: float
    max_sweeps: int
    max_optimizer_iter: int
    sigma2: float | ArrayLike | None | Literal["deprecated"]
    sigma2_floor: float | Literal["deprecated"]
    max_iter: int | Literal["deprecated"]
    max_opt_iter: int | Literal["deprecated"]
    rho2_: float
    gamma2_: float
    P_: NDArray[np.float64]
    D_: NDArray[np.float64]
    converged_: bool
    n_evaluations_: int
    n_features_in_: int
    n_tasks_: int

    _renamed_parameters = {"sigma2": "noise_variance", "sigma2_floor": "noise_variance_floor",
                           "max_iter": "max_sweeps", "max_opt_iter": "max_optimizer_iter"}
    _renamed_attributes = {"n_iter_": "n_sweeps_", "sigma2_": "noise_variance_",
                           "log_evidence_": "log_marginal_likelihood_value_",
                           "log_evidence_per_task_": "log_marginal_likelihood_per_task_"}
    n_iter_ = deprecated_alias("n_iter_", "n_sweeps_")
    sigma2_ = deprecated_alias("sigma2_", "noise_variance_")
    log_evidence_ = deprecated_alias("log_evidence_", "log_marginal_likelihood_value_")

    # ------------------------------------------------------------------ validation
    def _renamed_options(self, stacklevel):
        """``{new name: (value, name given)}`` of the renamed parameters; a deprecated name warns
        with ``stacklevel`` counted from here, as :func:`warnings.warn` counts it."""
        out = {}
        for old, new in self._renamed_parameters.items():
            out[new] = renamed_parameter(self, old, new, stacklevel=stacklevel)
        return out

    def _check_options(self, n_tasks, d, renamed, single_task=False):
        """The fit's :class:`~fastep._horseshoe.fit_options.HorseshoeFitOptions` for ``n_tasks``
        tasks on d features, from the parameters (checked; ``renamed``: the values and names of
        the parameters given under a current or a deprecated name)."""
        m = v.check_int(self.n_components, "n_components", minimum=0)
        if m >= d:
            raise ValueError(f"n_components must be < n_features = {d} (C = ΔDΔ + ΔPPᵀΔ needs m < d), got {m}")
        if not isinstance(self.learn_dependencies, (bool, np.bool_)):
            raise TypeError(f"learn_dependencies must be a bool, got {type(self.learn_dependencies).__name__}")
        if not isinstance(self.learn_hyperparameters, (bool, np.bool_)):
            raise TypeError(
                f"learn_hyperparameters must be a bool, got {type(self.learn_hyperparameters).__name__}")
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be a bool, got {type(self.fit_intercept).__name__}")
        if not self.learn_dependencies:
            m = 0
        noise_variance, name = renamed["noise_variance"]
        if noise_variance is None:
            sigma2 = None
        elif np.ndim(noise_variance) == 0:
            sigma2 = np.full(n_tasks, v.check_positive(noise_variance, name))
        elif single_task:
            raise ValueError(f"{name} must be a positive float for HorseshoeRegression, got shape "
                             f"{np.shape(noise_variance)}")
        else:
            sigma2 = v.as_float_vector(noise_variance, name, length=n_tasks)
            if np.any(sigma2 <= 0):
                raise ValueError(f"{name} must be > 0 for every task")
        rho2 = None if self.rho2 is None else v.check_positive(self.rho2, "rho2")
        gamma2 = v.check_positive(self.gamma2, "gamma2")
        if np.ndim(self.D) == 0:
            D = np.full(d, v.check_positive(self.D, "D"))
        else:
            D = v.as_float_vector(self.D, "D", length=d)
            if np.any(D <= 0):
                raise ValueError("D must be > 0 for every feature")
        v.check_positive(self.P_init_scale, "P_init_scale")
        v.check_in_range(renamed["noise_variance_floor"][0], renamed["noise_variance_floor"][1], 0.0, 1.0,
                         low_inclusive=False)
        if self.P_init is not None and m > 0:
            P0 = v.as_float_matrix(self.P_init, "P_init")
            if P0.shape != (d, m):
                raise ValueError(f"P_init must have shape (n_features, n_components) = ({d}, {m}), got {P0.shape}")
        elif m > 0:
            rng = np.random.default_rng(self.random_state)
            P0 = float(self.P_init_scale) * rng.standard_normal((d, m))
        else:
            P0 = np.zeros((d, 0))
        v.check_choice(self.negative_precision, "negative_precision", {"clip", "allow"})
        v.check_in_range(self.damping, "damping", 0.0, 1.0, low_inclusive=False)
        v.check_in_range(self.damping_decay, "damping_decay", 0.0, 1.0, low_inclusive=False)
        v.check_in_range(self.min_damping, "min_damping", 0.0, 1.0)
        v.check_positive(self.tol, "tol")
        v.check_int(*renamed["max_sweeps"], minimum=1)
        v.check_int(*renamed["max_optimizer_iter"], minimum=1)
        return HorseshoeFitOptions(m=m, noise_variance=sigma2, rho2=rho2, gamma2=gamma2, D=D, P0=P0,
                                   noise_variance_floor=renamed["noise_variance_floor"][0],
                                   max_sweeps=renamed["max_sweeps"][0],
                                   max_optimizer_iter=renamed["max_optimizer_iter"][0])

    def _check_tasks(self, Xs, ys):
        if isinstance(Xs, np.ndarray) or not isinstance(Xs, (list, tuple)):
            raise TypeError(f"Xs must be a list of 2-D arrays (one per task), got {type(Xs).__name__}")
        if isinstance(ys, np.ndarray) or not isinstance(ys, (list, tuple)):
            raise TypeError(f"ys must be a list of 1-D arrays (one per task), got {type(ys).__name__}")
        if len(Xs) == 0:
            raise ValueError("Xs must hold at least one task")
        if len(Xs) != len(ys):
            raise ValueError(f"Xs and ys must have the same number of tasks, got {len(Xs)} and {len(ys)}")
        out_X, out_y = [], []
        for t, (X, y) in enumerate(zip(Xs, ys)):
            X = v.as_float_matrix(X, f"Xs[{t}]")
            if out_X and X.shape[1] != out_X[0].shape[1]:
                raise ValueError(f"Xs[{t}] has {X.shape[1]} features but Xs[0] has {out_X[0].shape[1]}; "
                                 "all tasks must share the features")
            if y is None:
                raise TypeError(f"ys[{t}] must be an array of targets, got None")
            y = np.asarray(y)
            if y.ndim == 2 and y.shape[1] == 1:
                y = y[:, 0]
            y = v.as_float_vector(y, f"ys[{t}]")
            if y.shape[0] != X.shape[0]:
                raise ValueError(f"Xs[{t}] has {X.shape[0]} rows but ys[{t}] has {y.shape[0]} entries")
            if X.shape[0] < 2:
                raise ValueError(f"Xs[{t}] has n_samples = {X.shape[0]}; horseshoe regression needs at least 2 "
                                 "samples (the noise variance is learnt from the residuals)")
            out_X.append(X)
            out_y.append(y)
        return out_X, out_y

    # ------------------------------------------------------------------ EP over tasks
    def _ep_options(self, max_sweeps):
        schedule = HorseshoeDamping(damping=float(self.damping), damping_decay=float(self.damping_decay),
                                    min_damping=float(self.min_damping))
        return HorseshoeOptions(damping_schedule=schedule, negative_precision=self.negative_precision,
                                tol=float(self.tol), max_sweeps=int(max_sweeps))

    def _fit_tasks(self, Xs, ys, single_task=False):
        renamed = self._renamed_options(stacklevel=5 if single_task else 4)     # fit's caller
        Xs, ys = self._check_tasks(Xs, ys)
        T, d = len(Xs), Xs[0].shape[1]
        opts = self._check_options(T, d, renamed, single_task)
        progress = self._new_progress()
        # centring (intercepts are estimated as ȳ_t - x̄_tᵀ E[w_t])
        if self.fit_intercept:
            x_means = [X.mean(axis=0) for X in Xs]
            y_means = [float(y.mean()) for y in ys]
        else:
            x_means = [np.zeros(d) for _ in Xs]
            y_means = [0.0 for _ in Xs]
        tasks = [_eng.Task(X - xm, y - ym) for X, y, xm, ym in zip(Xs, ys, x_means, y_means)]
        y_scale = np.array([max(float(np.var(t.y)), 1e-12) if t.n > 1 else 1.0 for t in tasks])
        for t, task in enumerate(tasks):
            if np.any(task.col_sq == 0):
                j = int(np.flatnonzero(task.col_sq == 0)[0])
                raise ValueError(f"Xs[{t}] column {j} is constant{' after centring' if self.fit_intercept else ''}: "
                                 "its coefficient is not identified by the data; remove the column")
        gamma2, D, m = opts.gamma2, opts.D, opts.m
        P = opts.P0.copy()
        sigma2 = opts.noise_variance if opts.noise_variance is not None else 0.1 * y_scale
        rho2 = opts.rho2 if opts.rho2 is not None else 0.1
        starts = [None] * T
        n_evals = 0
        search = EvidenceSearch(tasks, gamma2, D, P, m > 0, self._ep_options(opts.max_sweeps),
                                opts.max_optimizer_iter, progress=progress)
        if self.learn_hyperparameters:
            # σ_t² within [noise_variance_floor, 100]·Var(y_t); ρ² and P unbounded (so L-BFGS-B starts
            # with a unit-length step: with every variable boxed it takes the raw gradient).
            bounds = np.full((T + 1 + (d * m if m > 0 else 0), 2), np.inf) * np.array([-1.0, 1.0])
            bounds[:T, 0] = np.log(float(opts.noise_variance_floor) * y_scale)
            bounds[:T, 1] = np.log(100.0 * y_scale)
            if opts.noise_variance is not None:
                candidates = [np.clip(sigma2, np.exp(bounds[:T, 0]), np.exp(bounds[:T, 1]))]
            else:
                candidates = [f * y_scale for f in _noise_fractions(float(opts.noise_variance_floor))]
            x_var = np.mean([max(float(np.mean(t.col_sq)) / t.n, 1e-300) for t in tasks])
            rho2_top = gamma2 * float(np.mean(y_scale)) / x_var * min(1.0, 10.0 / d)
            try:
                start = search.coarse_start(candidates, rho2_top=rho2_top, rho2_fixed=opts.rho2)
                theta0 = search.pack(candidates[0], rho2) if start is None else start["theta"]
                best = search.maximize(theta0, bounds, scale=1.0 / sum(t.n for t in tasks))
                if best is None:    # no evaluation at the full tolerance was accepted: the coarse start's best
                    best = start
            except StopRequested:
                best = search.best_so_far()
            if best is not None:
                sigma2, rho2, P = search.unpack(best["theta"])
                P = P.copy()
                starts = best["sites"]
            n_evals = search.n_evaluations
        out = search.run_ep(sigma2, rho2, P, starts)
        ep_iterations = search.ep_iterations
        results, sites_list = (None, None) if out is None else out
        if results is None:
            raise ValueError(f"EP cannot start at noise_variance={sigma2}, rho2={rho2}, gamma2={gamma2}: the "
                             "cold-start posterior or a cavity is improper (extreme hyperparameters?)")
        for t, r in enumerate(results):
            if r.status == "stuck":
                warnings.warn(
                    f"EP for task {t} stopped (stuck) after {r.n_sweeps} sweeps with scaled site residual "
                    f"{r.residual:.3g} > tol={self.tol:g}: for more than 25 iterations every step towards "
                    "the targets made a cavity improper and site-precision decreases were held back "
                    "(typically when C correlates features strongly); the last proper state is returned",
                    ConvergenceWarning, stacklevel=3)
            elif not r.converged:
                warnings.warn(
                    f"EP for task {t} stopped ({r.status}) after {r.n_sweeps} sweeps with scaled site "
                    f"residual {r.residual:.3g} > tol={self.tol:g}; increase max_sweeps, lower min_damping "
                    "or check the data", ConvergenceWarning, stacklevel=3)
        coef = np.array([r.mean for r in results])
        coef_var = np.array([r.var for r in results])
        inclusion = np.array([r.relevance for r in results])
        log_z = np.array([r.log_z for r in results])
        if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(coef_var)) and np.all(np.isfinite(log_z))
                and np.all(np.isfinite(inclusion))):
            raise FloatingPointError("EP produced a non-finite posterior or evidence; this is a bug, please report it")
        # Everything computed: only now set fitted attributes (no half-fitted state on error).
        self._tasks = tasks
        self._factors = [r.factors for r in results]
        self.sites_ = [{k: s.copy() for k, s in st.items()} for st in sites_list]
        self._coef = coef
        self._coef_var = coef_var
        self._inclusion = inclusion
        self._intercept = np.array([ym - inner(xm, c) for xm, ym, c in zip(x_means, y_means, coef)])
        self._x_means = x_means
        self._sigma2 = np.asarray(sigma2, dtype=float).copy()
        self.rho2_ = float(rho2)
        self.gamma2_ = float(gamma2)
        self.P_ = P
        self.D_ = D
        self._log_z = log_z
        self.n_sweeps_ = ep_iterations
        self.converged_ = bool(all(r.converged for r in results))
        self.n_evaluations_ = int(n_evals)
        self.n_features_in_ = d
        self.n_tasks_ = T
        progress.report("done", int(np.max(ep_iterations)) if T else 0, float(np.sum(log_z)))
        self._warn_if_stopped(progress, stacklevel=4)
        return self

    # ------------------------------------------------------------------ shared outputs
    @property
    def correlation_(self) -> NDArray[np.float64]:
        """The learnt ``C = ΔDΔ + ΔPPᵀΔ`` (``d x d``, formed on request; ``diag C = 1``)."""
        check_is_fitted(self, "P_")
        prior = HorseshoePrior(self.rho2_, self.gamma2_, self.P_, self.D_)
        C = gram(prior.U)
        C[np.diag_indices_from(C)] += prior.a
        return C

    def _predict_task(self, X, t, return_std):
        X = v.check_n_features(X, self.n_features_in_, estimator=self)
        mean = matmul(X, self._coef[t]) + self._intercept[t]
        if not return_std:
            return mean
        var = _eng.predictive_variance(self._tasks[t], self._factors[t], X - self._x_means[t])
        return mean, np.sqrt(var + self._sigma2[t])


_PARAMETERS_DOC = """n_components : int, default %N_COMPONENTS%
        Columns ``m`` of ``P`` (``m < d``). Ignored when ``learn_dependencies=False``.
    learn_dependencies : bool, default True
        False fixes ``P = 0`` (then ``C = I`` whatever ``D``): independent horseshoes.
    learn_hyperparameters : bool, default True
        Learn ``σ_t²``, ``ρ²`` (and ``P`` when learning dependencies) by type-II maximum
        likelihood; False keeps the given/initial values (``P`` stays at ``P_init`` or its
        random start).
    noise_variance : float or array (n_tasks,), optional
        Noise variances ``σ_t²`` (the start when learning). Default: when learning, the start is
        found by a coarse search (below); otherwise ``0.1 · Var(y_t)``.
    rho2 : float, optional
        ``ρ²`` (the start when learning). Default: when learning, found by the coarse
        search; otherwise 0.1.

        The coarse search (type-II ML's start): the evidence has a region where the data are
        explained as noise (large ``σ²``) and one where a few features explain them (small
        ``σ²`` and ``ρ²``), and gradient ascent stays in the region it starts in. So each
        ``σ_t² = f · Var(y_t)``, ``f = 10^-1, 10^-2, ...`` down to ``noise_variance_floor``, is
        paired with ``ρ² = γ² Var(y)/Var(x) · min(1, 10/d) · 10^-k`` walked from weak to strong
        shrinkage (``k = 0, 1, ...``, each EP warm-started from the previous decade, until the
        evidence stops rising), and L-BFGS-B starts from the best pair. A given ``noise_variance``
        or ``rho2`` is kept fixed in this search.
    gamma2 : float, default 1.0
        ``γ²``, held fixed (the evidence depends on ``ρ²/γ²`` only; module docstring).
    D : float or array (d,), default 1.0
        The diagonal of ``D`` (idiosyncratic part of ``C`` before normalisation), fixed.
    P_init : array (d, m), optional
        Starting (or, without learning, fixed) ``P``; default ``P_init_scale · N(0, 1)``
        drawn from ``random_state``.
    P_init_scale : float, default 0.1
        Scale of the random start of ``P`` (small: ``P = 0`` is a saddle of the evidence).
    random_state : int or numpy.random.Generator, optional
        Seed of the random start of ``P``.
    fit_intercept : bool, default True
        Centre each task's ``X`` and ``y``; ``intercept_[t] = ȳ_t - x̄_tᵀ coef_[t]``.
    noise_variance_floor : float, default 1e-3
        When learning, ``σ_t² >= noise_variance_floor · Var(y_t)`` (and ``<= 100 Var(y_t)``). With
        ``n < d`` the evidence stays finite as ``σ² → 0`` (the noiseless prior predictive is
        a proper density) and type-II ML can drive the noise to zero; the floor caps the
        fitted R² at ``1 - noise_variance_floor``.
    negative_precision : {'clip', 'allow'}, default 'clip'
        Policy for negative w-site precisions (eq 22): 'clip' keeps them ``>= -0.1/η_j``
        (``η_j`` the cavity variance) with the mean matched, 'allow' leaves them unbounded
        (exact EP, but it can diverge when many features are ambiguous; see
        :class:`fastep._epcore.horseshoe_ep.HorseshoeEP`). Where a site is clipped the evidence
        gradient is approximate (that site is not at an EP fixed point).
    damping, damping_decay, min_damping : float, default 0.5, 0.99, 0.3
        EP step ``ε_k = max(damping · damping_decay^k, floor)`` at iteration ``k``
        (the supplement: 0.5, reduced by 1% per iteration), the floor starting at
        ``min_damping``. The floor keeps EP moving (the unfloored schedule sums to 50 and can
        stall before ``tol``); when 50 iterations at the scheduled step lower the residual by
        less than half, the floor is halved (down to 0.02), which damps the slow oscillations
        a strongly correlated ``C`` can cause.
    tol : float, default 1e-8
        EP stops when the largest scaled site residual is below ``tol``.
    max_sweeps : int, default 1000
        EP sweeps (parallel iterations) per task and hyperparameter setting.
    max_optimizer_iter : int, default 100
        L-BFGS-B iterations.
    %CALLBACK%
    sigma2, sigma2_floor, max_iter, max_opt_iter : deprecated
        The former names of ``noise_variance``, ``noise_variance_floor``, ``max_sweeps`` and
        ``max_optimizer_iter``: they still work, with a ``FutureWarning``, and will be removed
        in the next release."""

_REFERENCES_DOC = """References
    ----------
    Hernández-Lobato, D. and Hernández-Lobato, J. M. *Learning Feature Selection
    Dependencies in Multi-task Learning*, NIPS 2013, and its supplementary material (EP
    updates eqs 2-26, evidence eq 27, gradients eqs 33-50).
    Carvalho, C. M., Polson, N. G. and Scott, J. G. *The horseshoe estimator for sparse
    signals*, Biometrika 97 (2010).
"""


class MultiTaskHorseshoeRegression(_HorseshoeBase):
    __doc__ = fill_doc("""Multi-task sparse linear regression with horseshoe priors and learnt selection dependencies.

    Every task ``t`` has its own coefficients ``w_t`` (its own relevant features and
    values), noise ``σ_t²`` and auxiliary ``u_t, v_t``; all tasks share the correlation
    matrix ``C = ΔDΔ + ΔPPᵀΔ`` of ``u`` and ``v`` (so of which features are selected
    together) and the scales ``ρ², γ²``. EP (supplement §1) approximates each task's
    posterior; ``σ_t²``, ``ρ²`` and ``P`` maximise the summed EP evidence (eq 27) by
    L-BFGS-B with the exact gradients of eqs (33)-(50) (``P``'s gradient summed over tasks).

    Parameters
    ----------
    %PARAMETERS%

    Attributes
    ----------
    coef_, coef_var_ : ndarray (n_tasks, d)
        Posterior means and variances of the coefficients.
    inclusion_ : ndarray (n_tasks, d)
        Posterior relevance of each feature, ``E[λ²/(λ² + η)]`` under the tilted distribution
        of its factor (``1 -`` the shrinkage factor; ``E[w_j] = inclusion_j · m_j`` with ``m_j``
        the cavity mean, eq 16).
    intercept_, noise_variance_ : ndarray (n_tasks,)
    rho2_, gamma2_ : float
    P_ : ndarray (d, m)
        The learnt loadings of the selection dependencies ``C = ΔDΔ + ΔPPᵀΔ``.
    D_ : ndarray (d,)
        The diagonal ``D`` (fixed).
    correlation_ : ndarray (d, d)
        The shared ``C`` (formed on access).
    log_marginal_likelihood_value_ : float
        Sum over tasks of the EP log marginal likelihood, eq (27), at the fitted hyperparameters;
        per task in ``log_marginal_likelihood_per_task_``.
    log_marginal_likelihood_per_task_ : ndarray (n_tasks,)
    n_sweeps_ : ndarray (n_tasks,)
        EP sweeps run for each task over the whole fit (every evaluation of the evidence).
    converged_ : bool
    n_evaluations_ : int
        EP evaluations of the evidence by type-II ML (coarse search and L-BFGS-B; 0 without learning).
    sites_ : list of dict
        The EP sites of every task (natural parameters ``pi_w, h_w, pi_u, pi_v``).
    sigma2_, log_evidence_, log_evidence_per_task_, n_iter_
        Deprecated aliases of ``noise_variance_``, ``log_marginal_likelihood_value_``,
        ``log_marginal_likelihood_per_task_`` and ``n_sweeps_`` (removed in the next release).

    %REFERENCES%

    %EXAMPLES%
    >>> w = np.zeros(30)
    >>> w[:3] = (2.0, -1.5, 1.0)
    >>> Xs = [rng.normal(size=(40, 30)) for _ in range(2)]
    >>> ys = [X @ w + 0.3 * rng.normal(size=40) for X in Xs]
    >>> model = MultiTaskHorseshoeRegression(n_components=2, max_optimizer_iter=20, random_state=0).fit(Xs, ys)
    >>> model.coef_.shape
    (2, 30)
    >>> sorted(np.argsort(-model.inclusion_[0])[:3].tolist())
    [0, 1, 2]
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="MultiTaskHorseshoeRegression", PARAMETERS=_PARAMETERS_DOC,
        N_COMPONENTS="2", CALLBACK=CALLBACK_DOC,
        REFERENCES=_REFERENCES_DOC)

    noise_variance: float | ArrayLike | None
    n_sweeps_: NDArray[np.int_]
    sites_: list[dict[str, NDArray[np.float64]]]

    def __init__(self, n_components: int = 2, *, learn_dependencies: bool = True, learn_hyperparameters: bool = True,
                 noise_variance: float | ArrayLike | None = None, rho2: float | None = None, gamma2: float = 1.0,
                 D: float | ArrayLike = 1.0, P_init: ArrayLike | None = None, P_init_scale: float = 0.1,
                 random_state: int | np.random.Generator | None = None, fit_intercept: bool = True,
                 noise_variance_floor: float = 1e-3, negative_precision: Literal["clip", "allow"] = "clip",
                 damping: float = 0.5, damping_decay: float = 0.99, min_damping: float = 0.3, tol: float = 1e-8,
                 max_sweeps: int = 1000, max_optimizer_iter: int = 100, verbose: int = 0, callback: Callback = None,
                 sigma2: float | ArrayLike | None | Literal["deprecated"] = "deprecated",
                 sigma2_floor: float | Literal["deprecated"] = "deprecated",
                 max_iter: int | Literal["deprecated"] = "deprecated",
                 max_opt_iter: int | Literal["deprecated"] = "deprecated") -> None:
        self._set_init_params(locals())

    def fit(self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]) -> Self:
        """Fit all tasks: ``Xs`` a list of ``(n_t, d)`` arrays, ``ys`` a list of ``(n_t,)`` arrays; returns self."""
        return self._fit_tasks(Xs, ys)

    coef_: NDArray[np.float64] = _fitted("_coef")
    coef_var_: NDArray[np.float64] = _fitted("_coef_var")
    inclusion_: NDArray[np.float64] = _fitted("_inclusion")
    intercept_: NDArray[np.float64] = _fitted("_intercept")
    noise_variance_: NDArray[np.float64] = _fitted("_sigma2")
    log_marginal_likelihood_per_task_: NDArray[np.float64] = _fitted("_log_z")
    log_evidence_per_task_ = deprecated_alias("log_evidence_per_task_", "log_marginal_likelihood_per_task_")

    @property
    def log_marginal_likelihood_value_(self) -> float:
        """The sum over tasks of the EP log marginal likelihood at the fitted hyperparameters."""
        check_is_fitted(self, "_coef")
        return float(np.sum(self._log_z))

    @overload
    def predict(self, X: Sequence[ArrayLike], task: None = None, return_std: Literal[False] = False
                ) -> list[NDArray[np.float64]]: ...
    @overload
    def predict(self, X: Sequence[ArrayLike], task: None = None, *, return_std: Literal[True]) -> list[MeanStd]: ...
    @overload
    def predict(self, X: ArrayLike, task: int, return_std: Literal[False] = False) -> NDArray[np.float64]: ...
    @overload
    def predict(self, X: ArrayLike, task: int, return_std: Literal[True]) -> MeanStd: ...
    def predict(self, X: Any, task: int | None = None, return_std: bool = False) -> Any:
        """Predictive mean (and standard deviation of ``y``, including the noise, if ``return_std``).

        ``X`` a list of arrays (one per task) returns a list; a single array needs ``task``.
        """
        check_is_fitted(self, "_coef")
        if isinstance(X, (list, tuple)):
            if task is not None:
                raise ValueError("task must be None when X is a list with one array per task")
            if len(X) != self.n_tasks_:
                raise ValueError(f"X must hold {self.n_tasks_} arrays (one per task), got {len(X)}")
            return [self._predict_task(Xt, t, return_std) for t, Xt in enumerate(X)]
        if task is None:
            raise ValueError("task must be given (an index in [0, n_tasks)) when X is a single array")
        if isinstance(task, bool) or not isinstance(task, numbers.Integral) or not 0 <= task < self.n_tasks_:
            raise ValueError(f"task must be an integer in [0, {self.n_tasks_}), got {task!r}")
        return self._predict_task(X, int(task), return_std)


class HorseshoeRegression(RegressorMixin, _HorseshoeBase):
    __doc__ = fill_doc("""Sparse linear regression with a horseshoe prior on every coefficient, fitted by EP.

    The single-task case of :class:`MultiTaskHorseshoeRegression` (same model, inference and
    hyperparameter learning). By default ``n_components=0``: independent horseshoes,
    ``w_j | λ_j ~ N(0, (ρ/γ)² λ_j²)``, ``λ_j ~ C⁺(0, 1)``; ``n_components > 0`` learns
    selection dependencies from the one task.

    Parameters
    ----------
    %PARAMETERS%

    Attributes
    ----------
    coef_, coef_var_, inclusion_ : ndarray (d,)
        Posterior means, variances and relevance (see the multi-task class).
    intercept_, noise_variance_, rho2_, gamma2_ : float
    log_marginal_likelihood_value_ : float
        The EP log marginal likelihood, eq (27), at the fitted hyperparameters.
    P_, D_, correlation_, converged_, n_evaluations_, sites_ (dict)
        As in the multi-task class, for the one task.
    n_sweeps_ : int
        EP sweeps run over the whole fit.
    sigma2_, log_evidence_, n_iter_
        Deprecated aliases of ``noise_variance_``, ``log_marginal_likelihood_value_`` and
        ``n_sweeps_`` (removed in the next release).

    %REFERENCES%

    %EXAMPLES%
    >>> X = rng.normal(size=(50, 40))
    >>> w = np.zeros(40)
    >>> w[[3, 17]] = (2.0, -1.5)
    >>> y = X @ w + 0.3 * rng.normal(size=50)
    >>> model = HorseshoeRegression(max_optimizer_iter=20).fit(X, y)
    >>> sorted(np.argsort(-model.inclusion_)[:2].tolist())
    [3, 17]
    >>> bool(model.score(X, y) > 0.9)
    True
    """, EXAMPLES=EXAMPLES_DOC, ESTIMATOR="HorseshoeRegression", PARAMETERS=_PARAMETERS_DOC,
        N_COMPONENTS="0", CALLBACK=CALLBACK_DOC,
        REFERENCES=_REFERENCES_DOC)

    noise_variance: float | None
    n_sweeps_: int
    sites_: dict[str, NDArray[np.float64]]

    def __init__(self, n_components: int = 0, *, learn_dependencies: bool = True, learn_hyperparameters: bool = True,
                 noise_variance: float | None = None, rho2: float | None = None, gamma2: float = 1.0,
                 D: float | ArrayLike = 1.0, P_init: ArrayLike | None = None, P_init_scale: float = 0.1,
                 random_state: int | np.random.Generator | None = None, fit_intercept: bool = True,
                 noise_variance_floor: float = 1e-3, negative_precision: Literal["clip", "allow"] = "clip",
                 damping: float = 0.5, damping_decay: float = 0.99, min_damping: float = 0.3, tol: float = 1e-8,
                 max_sweeps: int = 1000, max_optimizer_iter: int = 100, verbose: int = 0, callback: Callback = None,
                 sigma2: float | ArrayLike | None | Literal["deprecated"] = "deprecated",
                 sigma2_floor: float | Literal["deprecated"] = "deprecated",
                 max_iter: int | Literal["deprecated"] = "deprecated",
                 max_opt_iter: int | Literal["deprecated"] = "deprecated") -> None:
        self._set_init_params(locals())

    @records_feature_names
    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit on ``X`` (n, d) and ``y`` (n,); returns self."""
        X, y = v.check_X_y(X, y, y_numeric=True)
        self._fit_tasks([X], [y], single_task=True)
        self.n_sweeps_ = int(self.n_sweeps_[0])  # type: ignore[index]  # per task until here
        self.sites_ = self.sites_[0]  # type: ignore[index, assignment]
        return self

    coef_: NDArray[np.float64] = _fitted("_coef", first_task=True)
    coef_var_: NDArray[np.float64] = _fitted("_coef_var", first_task=True)
    inclusion_: NDArray[np.float64] = _fitted("_inclusion", first_task=True)
    intercept_: float = _fitted("_intercept", first_task=True, scalar=True)
    noise_variance_: float = _fitted("_sigma2", first_task=True, scalar=True)
    log_marginal_likelihood_value_: float = _fitted("_log_z", first_task=True, scalar=True)

    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        check_is_fitted(self, "_coef")
        return self._predict_task(X, 0, return_std)
