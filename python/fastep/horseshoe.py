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

Inference is parallel EP with damping (supplement §1; engine in
:mod:`fastep._horseshoe_parallel_ep`, per-feature quadratures compiled in
:mod:`fastep._epcore.horseshoe`), the evidence is eq (27) and the hyperparameters
(``σ_t²``, ``ρ²``, ``P``) maximise it with L-BFGS-B using the exact gradients of eqs
(33)-(50). ``γ²`` is held fixed: the prior of ``w`` depends on ``ρ`` and ``γ`` only through
``ρ/γ``, and so does the EP evidence (its gradient satisfies
``ρ² ∂/∂ρ² + γ² ∂/∂γ² = 0`` at every fixed point), so learning both would only move along a
flat ridge.

Numerical policies (details in :func:`fastep._horseshoe_parallel_ep.run_task_ep`): negative
u- and v-site precisions are accepted; negative w-site precisions are kept ``>= -0.1/η_j``
(``negative_precision='clip'``, ``η_j`` the cavity variance) or left free (``'allow'``);
a damped step that would make the posterior or a cavity improper is halved, and if that
fails the site-precision decreases are held back for that iteration; after 25 such
iterations in a row EP stops as 'stuck'. The damping ``ε_k = max(0.5 · 0.99^k, floor)``
starts with the floor at ``min_damping`` (0.3) and halves it when the residual stalls.
EP that stops before ``tol`` (status 'max_iter' or 'stuck') raises a
:class:`fastep.ConvergenceWarning`, as does type-II ML that ends where EP fails to
converge; results are never NaN (a non-finite result raises).
"""
import numbers
import warnings

import numpy as np

from . import _horseshoe_parallel_ep as _eng
from . import _validation as v
from ._linalg import gram, inner, matmul
from ._base import BaseEstimator, RegressorMixin, check_is_fitted
from ._optimize import maximize_log_likelihood
from .exceptions import ConvergenceWarning

__all__ = ["HorseshoeRegression", "MultiTaskHorseshoeRegression"]

#: Features per task below which the compiled site step runs on one OpenMP thread.
_SINGLE_OMP_THREAD_BELOW = 4096
#: Type-II ML moves log σ² and log ρ² by at most this much per L-BFGS-B round, rounds of _ROUND_ITER.
_TRUST_LOG = 2.0
#: Trust box (±) of the P coordinates in the rounds after an EP failure, before halving.
_TRUST_P = 1.0
_ROUND_ITER = 15
#: During type-II ML an EP run stopped by max_iter is still used if its residual is below this.
_ACCEPT_RESIDUAL = 1e-5


class _HorseshoeBase(BaseEstimator):
    """Shared machinery: validation, EP over tasks, type-II ML, fitted attributes."""

    # ------------------------------------------------------------------ validation
    def _check_options(self, n_tasks, d):
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
        if self.sigma2 is None:
            sigma2 = None
        elif np.ndim(self.sigma2) == 0:
            sigma2 = np.full(n_tasks, v.check_positive(self.sigma2, "sigma2"))
        else:
            sigma2 = v.as_float_vector(self.sigma2, "sigma2", length=n_tasks)
            if np.any(sigma2 <= 0):
                raise ValueError("sigma2 must be > 0 for every task")
        rho2 = None if self.rho2 is None else v.check_positive(self.rho2, "rho2")
        gamma2 = v.check_positive(self.gamma2, "gamma2")
        if np.ndim(self.D) == 0:
            D = np.full(d, v.check_positive(self.D, "D"))
        else:
            D = v.as_float_vector(self.D, "D", length=d)
            if np.any(D <= 0):
                raise ValueError("D must be > 0 for every feature")
        v.check_positive(self.P_init_scale, "P_init_scale")
        v.check_in_range(self.sigma2_floor, "sigma2_floor", 0.0, 1.0, low_inclusive=False)
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
        v.check_int(self.max_iter, "max_iter", minimum=1)
        v.check_int(self.max_opt_iter, "max_opt_iter", minimum=1)
        return {"m": m, "sigma2": sigma2, "rho2": rho2, "gamma2": gamma2, "D": D, "P0": P0}

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
            if X.shape[0] < 2:
                raise ValueError(f"Xs[{t}] has n_samples = {X.shape[0]}; horseshoe regression needs at least 2 "
                                 "samples (the noise variance is learnt from the residuals)")
            out_X.append(X)
            out_y.append(y)
        return out_X, out_y

    # ------------------------------------------------------------------ EP over tasks
    def _ep_options(self):
        return {"negative_precision": self.negative_precision,
                "damping": float(self.damping), "damping_decay": float(self.damping_decay),
                "min_damping": float(self.min_damping), "tol": float(self.tol), "max_iter": int(self.max_iter)}

    def _run_all(self, tasks, sigma2, rho2, gamma2, cf, sites_list, *, warm, iterations=None):
        """EP for every task; sites updated in place.

        A warm start (from the sites of the previous hyperparameters) that is invalid or does
        not converge is retried from the cold start. ``iterations`` (one count per task), if
        given, is increased by the EP iterations run.
        """
        results = []
        for t, task in enumerate(tasks):
            threads = 1 if task.d < _SINGLE_OMP_THREAD_BELOW else None
            res = None
            if warm:
                saved = {k: a.copy() for k, a in sites_list[t].items()}
                try:
                    res = _eng.run_task_ep(task, sigma2[t], rho2, gamma2, cf, sites_list[t],
                                           n_threads=threads, **self._ep_options())
                except ValueError:
                    res = None
                if res is not None and iterations is not None:
                    iterations[t] += res["n_iter"]
                if res is not None and not res["converged"]:
                    sites_list[t] = saved
                    res = None
            if res is None:
                sites_list[t] = _eng.initial_sites(task.d, rho2, gamma2)
                try:
                    res = _eng.run_task_ep(task, sigma2[t], rho2, gamma2, cf, sites_list[t],
                                           n_threads=threads, **self._ep_options())
                except ValueError:   # hyperparameters so extreme that even the cold start is improper
                    return None
                if iterations is not None:
                    iterations[t] += res["n_iter"]
            results.append(res)
        return results

    def _maximize(self, objective, theta0, bounds, n_log):
        """L-BFGS-B in rounds, each confined to a trust box around the round's start.

        The box is ±_TRUST_LOG in the first ``n_log`` (log-variance) coordinates; the other
        coordinates (``P``) are free until an EP evaluation fails. A single unconstrained run
        took steps of 5 in log σ² (to σ² = 0.02 from 1.3) where EP needs > 1000 iterations.
        A failed evaluation (EP not converged: the objective is ``-inf``) makes L-BFGS-B's
        line search shrink the step to almost nothing and then stop on its relative-reduction
        test, far from a stationary point (seen with learnt ``P``: steps into strongly
        correlated ``C``, where EP gets 'stuck'), and it can even return the failed point. So
        every round continues from the best point evaluated so far, and a round with a failed
        evaluation never ends the search: the next round has its box halved in every
        coordinate (``P`` included, from ±_TRUST_P); a round without failures doubles it
        again (up to the initial size). The search ends when a round's solution is inside
        its box without failures or optimiser warnings, when the budget of ``max_opt_iter``
        iterations is spent, or when the box has been halved below 1/64 of its size, which
        warns that EP does not converge around the point reached.
        """
        theta = np.asarray(theta0, dtype=float)
        budget = int(self.max_opt_iter)
        n_evals = 0
        shrink = 1.0
        n_failed_rounds = 0
        failures = [0]
        best = {"value": -np.inf, "theta": theta.copy()}

        def counted(th):
            value, grad = objective(th)
            if not np.isfinite(value):
                failures[0] += 1
            elif value > best["value"]:
                best["value"], best["theta"] = value, np.array(th, dtype=float)
            return value, grad

        while budget > 0:
            radius = np.full(theta.size, _TRUST_LOG * shrink)
            radius[n_log:] = np.inf if shrink == 1.0 else _TRUST_P * shrink
            box = bounds.copy()
            box[:, 0] = np.maximum(bounds[:, 0], theta - radius)
            box[:, 1] = np.minimum(bounds[:, 1], theta + radius)
            rounds = min(budget, _ROUND_ITER)
            failures[0] = 0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConvergenceWarning)
                # no trust-region fallback inside a round: the rounds are trust boxes already, and a
                # round without progress is handled below (the behaviour before that fallback existed)
                new, value, evals = maximize_log_likelihood(counted, theta, box, maxiter=rounds,
                                                             stall_fallback=False, check_gradient=False)
            n_evals += evals
            budget -= min(rounds, max(evals, 1))         # iterations <= evaluations
            if not np.isfinite(value) or value < best["value"]:
                # L-BFGS-B can end on a failed line-search point: continue from the best one seen
                new = best["theta"].copy()
            at_edge = np.any((np.abs(new - box[:, 0]) < 1e-8) & (box[:, 0] > bounds[:, 0])
                             | (np.abs(new - box[:, 1]) < 1e-8) & (box[:, 1] < bounds[:, 1]))
            theta = new
            if failures[0]:
                n_failed_rounds += 1
                shrink *= 0.5
                if shrink < 1.0 / 64:
                    warnings.warn(
                        f"type-II ML stopped: EP did not converge near the point reached ({n_failed_rounds} "
                        "optimiser rounds had evaluations where EP failed; the hyperparameters are the best "
                        "point found)", ConvergenceWarning, stacklevel=4)
                    return theta, n_evals
                continue
            shrink = min(1.0, 2.0 * shrink)
            if not at_edge and not caught:
                return theta, n_evals
        warnings.warn(f"L-BFGS-B used its budget of max_opt_iter={self.max_opt_iter} iterations before converging",
                      ConvergenceWarning, stacklevel=4)
        return theta, n_evals

    def _initial_rho2(self, tasks, sigma2, gamma2, cf):
        """Best ``ρ²`` on a coarse grid (the evidence is multi-scale in ``ρ²``; L-BFGS-B starts there).

        Grid: ``ρ² = γ² · 10^-k · Var(y)/mean_j Var(x_j)``, ``k = 0, ..., 8``, the EP evidence
        with the initial ``σ²`` and ``P``; points where EP does not converge are skipped.
        """
        y_var = np.mean([max(float(np.var(t.y)), 1e-12) for t in tasks])
        x_var = np.mean([max(float(np.mean(t.col_sq)) / max(t.n, 1), 1e-12) for t in tasks])
        best, best_value = None, -np.inf
        for k in range(9):
            rho2 = gamma2 * 10.0 ** (-k) * y_var / x_var
            sites = [_eng.initial_sites(t.d, rho2, gamma2) for t in tasks]
            res = self._run_all(tasks, sigma2, rho2, gamma2, cf, sites, warm=False)
            if res is not None and all(r["converged"] for r in res):
                value = sum(r["log_z"] for r in res)
                if self.verbose:
                    print(f"[horseshoe] grid rho2 {rho2:.3g}: log evidence {value:.6f}")
                if value > best_value:
                    best, best_value = rho2, value
        return best if best is not None else gamma2 * y_var / x_var

    def _fit_tasks(self, Xs, ys):
        Xs, ys = self._check_tasks(Xs, ys)
        T, d = len(Xs), Xs[0].shape[1]
        opts = self._check_options(T, d)
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
        sigma2 = opts["sigma2"] if opts["sigma2"] is not None else 0.1 * y_scale
        gamma2, D, m = opts["gamma2"], opts["D"], opts["m"]
        P = opts["P0"].copy()
        n_evals = 0
        ep_iterations = np.zeros(T, dtype=int)
        if opts["rho2"] is not None:
            rho2 = opts["rho2"]
        elif self.learn_hyperparameters:
            rho2 = self._initial_rho2(tasks, sigma2, gamma2, _eng.CorrelationFactors(P, D))
        else:
            rho2 = 0.1
        sites_list = [_eng.initial_sites(d, rho2, gamma2) for _ in tasks]
        if self.learn_hyperparameters:
            learn_P = m > 0
            theta0 = np.concatenate([np.log(sigma2), [np.log(rho2)], P.ravel() if learn_P else []])
            # σ_t² within [sigma2_floor, 100]·Var(y_t); ρ² and P unbounded (so L-BFGS-B starts
            # with a unit-length step: with every variable boxed it takes the raw gradient).
            bounds = np.full((theta0.size, 2), np.inf) * np.array([-1.0, 1.0])
            bounds[:T, 0] = np.log(float(self.sigma2_floor) * y_scale)
            bounds[:T, 1] = np.log(100.0 * y_scale)
            theta0[:T] = np.clip(theta0[:T], bounds[:T, 0], bounds[:T, 1])
            scale = 1.0 / sum(t.n for t in tasks)      # mean log evidence per sample
            state = {"warm": False}

            def objective(theta):
                s2 = np.exp(theta[:T])
                r2 = float(np.exp(theta[T]))
                P_ = theta[T + 1:].reshape(d, m) if learn_P else P
                cf_ = _eng.CorrelationFactors(P_, D)
                res = self._run_all(tasks, s2, r2, gamma2, cf_, sites_list, warm=state["warm"],
                                    iterations=ep_iterations)
                state["warm"] = True
                # An EP run that stopped early has no trustworthy evidence: report the point
                # as unusable so that the line search backs off.
                if res is None or not all(r["converged"] or (r["status"] == "max_iter" and
                                                             r["residual"] < _ACCEPT_RESIDUAL)
                                              for r in res):
                    if self.verbose:
                        print(f"[horseshoe] EP failed at sigma2 {np.round(s2, 5)}, rho2 {r2:.5g}")
                    state["warm"] = False
                    return -np.inf, np.zeros_like(theta)
                value = sum(r["log_z"] for r in res)
                grad = np.empty_like(theta)
                grad[:T] = [r["state"]["w"]["grad_sigma2"] * s for r, s in zip(res, s2)]
                grad[T] = r2 * sum(r["state"]["u"]["grad_scale2"] for r in res)
                if learn_P:
                    grad[T + 1:] = sum(r["state"]["u"]["grad_P"] + r["state"]["v"]["grad_P"]
                                       for r in res).ravel()
                if self.verbose:
                    print(f"[horseshoe] log evidence {value:.6f}, sigma2 {np.round(s2, 5)}, rho2 {r2:.5g}")
                if not (np.isfinite(value) and np.all(np.isfinite(grad))):
                    return -np.inf, np.zeros_like(theta)
                if value > state.get("best_value", -np.inf):
                    state["best_value"], state["best_theta"] = value, theta.copy()
                    state["best_sites"] = [{k: a.copy() for k, a in st.items()} for st in sites_list]
                return value * scale, grad * scale

            theta, n_evals = self._maximize(objective, theta0, bounds, T + 1)
            if "best_theta" in state and np.array_equal(theta, state["best_theta"]):
                # warm-start the final EP from this point's own sites: EP's fixed point can
                # depend on the start when C is strongly correlated (a cold start may get stuck)
                sites_list[:] = state["best_sites"]
            sigma2 = np.exp(theta[:T])
            rho2 = float(np.exp(theta[T]))
            if learn_P:
                P = theta[T + 1:].reshape(d, m).copy()
        cf = _eng.CorrelationFactors(P, D)
        results = self._run_all(tasks, sigma2, rho2, gamma2, cf, sites_list, warm=n_evals > 0,
                                iterations=ep_iterations)
        if results is None:
            raise ValueError(f"EP cannot start at sigma2={sigma2}, rho2={rho2}, gamma2={gamma2}: the cold-start "
                             "posterior or a cavity is improper (extreme hyperparameters?)")
        for t, r in enumerate(results):
            if r["status"] == "stuck":
                warnings.warn(
                    f"EP for task {t} stopped (stuck) after {r['n_iter']} iterations with scaled site residual "
                    f"{r['residual']:.3g} > tol={self.tol:g}: for more than 25 iterations every step towards "
                    "the targets made a cavity improper and site-precision decreases were held back "
                    "(typically when C correlates features strongly); the last proper state is returned",
                    ConvergenceWarning, stacklevel=3)
            elif not r["converged"]:
                warnings.warn(
                    f"EP for task {t} stopped ({r['status']}) after {r['n_iter']} iterations with scaled site "
                    f"residual {r['residual']:.3g} > tol={self.tol:g}; increase max_iter, lower min_damping "
                    "or check the data", ConvergenceWarning, stacklevel=3)
        coef = np.array([r["state"]["w"]["mean"] for r in results])
        coef_var = np.array([r["state"]["w"]["var"] for r in results])
        inclusion = np.array([r["site"][6] for r in results])
        log_z = np.array([r["log_z"] for r in results])
        if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(coef_var)) and np.all(np.isfinite(log_z))
                and np.all(np.isfinite(inclusion))):
            raise FloatingPointError("EP produced a non-finite posterior or evidence; this is a bug, please report it")
        # Everything computed: only now set fitted attributes (no half-fitted state on error).
        self._tasks = tasks
        self._factors = [r["state"]["w"]["factors"] for r in results]
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
        self.n_iter_ = ep_iterations
        self.converged_ = bool(all(r["converged"] for r in results))
        self.n_evaluations_ = int(n_evals)
        self.n_features_in_ = d
        self.n_tasks_ = T
        return self

    # ------------------------------------------------------------------ shared outputs
    @property
    def correlation_(self):
        """The learnt ``C = ΔDΔ + ΔPPᵀΔ`` (``d x d``, formed on request; ``diag C = 1``)."""
        check_is_fitted(self, "P_")
        cf = _eng.CorrelationFactors(self.P_, self.D_)
        C = gram(cf.U)
        C[np.diag_indices_from(C)] += cf.a
        return C

    def _predict_task(self, X, t, return_std):
        X = v.check_n_features(X, self.n_features_in_, estimator=self)
        mean = matmul(X, self._coef[t]) + self._intercept[t]
        if not return_std:
            return mean
        var = _eng.predictive_variance(self._tasks[t], self._factors[t], X - self._x_means[t])
        return mean, np.sqrt(var + self._sigma2[t])


_PARAMETERS_DOC = """    n_components : int, default 2
        Columns ``m`` of ``P`` (``m < d``). Ignored when ``learn_dependencies=False``.
    learn_dependencies : bool, default True
        False fixes ``P = 0`` (then ``C = I`` whatever ``D``): independent horseshoes.
    learn_hyperparameters : bool, default True
        Learn ``σ_t²``, ``ρ²`` (and ``P`` when learning dependencies) by type-II maximum
        likelihood; False keeps the given/initial values (``P`` stays at ``P_init`` or its
        random start).
    sigma2 : float or array (n_tasks,), optional
        Noise variances (initial values when learning); default ``0.1 · Var(y_t)``.
    rho2 : float, optional
        ``ρ²`` (initial value when learning). Default: when learning, the best of a coarse
        grid ``γ² 10^-k Var(y)/Var(x)``, ``k = 0..8`` (the evidence varies over many decades
        of ``ρ²``); otherwise 0.1.
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
    sigma2_floor : float, default 1e-3
        When learning, ``σ_t² >= sigma2_floor · Var(y_t)`` (and ``<= 100 Var(y_t)``). With
        ``n < d`` the evidence stays finite as ``σ² → 0`` (the noiseless prior predictive is
        a proper density) and type-II ML can drive the noise to zero; the floor caps the
        fitted R² at ``1 - sigma2_floor``.
    negative_precision : {'clip', 'allow'}, default 'clip'
        Policy for negative w-site precisions (eq 22): 'clip' keeps them ``>= -0.1/η_j``
        (``η_j`` the cavity variance) with the mean matched, 'allow' leaves them unbounded
        (exact EP, but it diverged on ambiguous problems; see
        :func:`fastep._horseshoe_parallel_ep.run_task_ep`). Where a site is clipped the evidence
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
    max_iter : int, default 1000
        EP iterations per task and hyperparameter setting.
    max_opt_iter : int, default 100
        L-BFGS-B iterations.
    verbose : bool, default False
        Print the evidence at every optimiser evaluation.
"""


class MultiTaskHorseshoeRegression(_HorseshoeBase):
    __doc__ = """Multi-task sparse linear regression with horseshoe priors and learnt selection dependencies.

    Every task ``t`` has its own coefficients ``w_t`` (its own relevant features and
    values), noise ``σ_t²`` and auxiliary ``u_t, v_t``; all tasks share the correlation
    matrix ``C = ΔDΔ + ΔPPᵀΔ`` of ``u`` and ``v`` (so of which features are selected
    together) and the scales ``ρ², γ²``. EP (supplement §1) approximates each task's
    posterior; ``σ_t²``, ``ρ²`` and ``P`` maximise the summed EP evidence (eq 27) by
    L-BFGS-B with the exact gradients of eqs (33)-(50) (``P``'s gradient summed over tasks).

    Parameters
    ----------
%PARAMETERS%    Attributes
    ----------
    coef_, coef_var_ : ndarray (n_tasks, d)
        Posterior means and variances of the coefficients.
    inclusion_ : ndarray (n_tasks, d)
        Posterior relevance of each feature, ``E[λ²/(λ² + η)]`` under the tilted distribution
        of its factor (``1 -`` the shrinkage factor; ``E[w_j] = inclusion_j · m_j`` with ``m_j``
        the cavity mean, eq 16).
    intercept_, sigma2_ : ndarray (n_tasks,)
    rho2_, gamma2_ : float
    P_ : ndarray (d, m); D_ : ndarray (d,)
    correlation_ : ndarray (d, d)
        The shared ``C`` (formed on access).
    log_evidence_ : float
        Sum over tasks of eq (27) at the fitted hyperparameters; per task in ``log_evidence_per_task_``.
    n_iter_ : ndarray (n_tasks,)
        EP iterations run for each task over the whole fit (every evaluation of the evidence).
    converged_ : bool; n_evaluations_ : int
    sites_ : list of dict
        The EP sites of every task (natural parameters ``pi_w, h_w, pi_u, pi_v``).

    References
    ----------
    Hernández-Lobato, D. and Hernández-Lobato, J. M. *Learning Feature Selection
    Dependencies in Multi-task Learning*, NIPS 2013, and its supplementary material (EP
    updates eqs 2-26, evidence eq 27, gradients eqs 33-50).
    Carvalho, C. M., Polson, N. G. and Scott, J. G. *The horseshoe estimator for sparse
    signals*, Biometrika 97 (2010).

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import MultiTaskHorseshoeRegression
    >>> rng = np.random.default_rng(0)
    >>> w = np.zeros(30)
    >>> w[:3] = (2.0, -1.5, 1.0)
    >>> Xs = [rng.normal(size=(40, 30)) for _ in range(2)]
    >>> ys = [X @ w + 0.3 * rng.normal(size=40) for X in Xs]
    >>> model = MultiTaskHorseshoeRegression(n_components=2, max_opt_iter=20, random_state=0).fit(Xs, ys)
    >>> model.coef_.shape
    (2, 30)
    >>> sorted(np.argsort(-model.inclusion_[0])[:3].tolist())
    [0, 1, 2]
    """.replace("%PARAMETERS%", _PARAMETERS_DOC)

    def __init__(self, n_components=2, *, learn_dependencies=True, learn_hyperparameters=True, sigma2=None,
                 rho2=None, gamma2=1.0, D=1.0, P_init=None, P_init_scale=0.1, random_state=None,
                 fit_intercept=True, sigma2_floor=1e-3, negative_precision="clip", damping=0.5,
                 damping_decay=0.99, min_damping=0.3, tol=1e-8, max_iter=1000, max_opt_iter=100,
                 verbose=False):
        self.n_components = n_components
        self.learn_dependencies = learn_dependencies
        self.learn_hyperparameters = learn_hyperparameters
        self.sigma2 = sigma2
        self.rho2 = rho2
        self.gamma2 = gamma2
        self.D = D
        self.P_init = P_init
        self.P_init_scale = P_init_scale
        self.random_state = random_state
        self.fit_intercept = fit_intercept
        self.sigma2_floor = sigma2_floor
        self.negative_precision = negative_precision
        self.damping = damping
        self.damping_decay = damping_decay
        self.min_damping = min_damping
        self.tol = tol
        self.max_iter = max_iter
        self.max_opt_iter = max_opt_iter
        self.verbose = verbose

    def fit(self, Xs, ys):
        """Fit all tasks: ``Xs`` a list of ``(n_t, d)`` arrays, ``ys`` a list of ``(n_t,)`` arrays; returns self."""
        return self._fit_tasks(Xs, ys)

    @property
    def coef_(self):
        check_is_fitted(self, "_coef")
        return self._coef

    @property
    def coef_var_(self):
        check_is_fitted(self, "_coef")
        return self._coef_var

    @property
    def inclusion_(self):
        check_is_fitted(self, "_coef")
        return self._inclusion

    @property
    def intercept_(self):
        check_is_fitted(self, "_coef")
        return self._intercept

    @property
    def sigma2_(self):
        check_is_fitted(self, "_coef")
        return self._sigma2

    @property
    def log_evidence_(self):
        check_is_fitted(self, "_coef")
        return float(np.sum(self._log_z))

    @property
    def log_evidence_per_task_(self):
        check_is_fitted(self, "_coef")
        return self._log_z

    def predict(self, X, task=None, return_std=False):
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
    __doc__ = """Sparse linear regression with a horseshoe prior on every coefficient, fitted by EP.

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
    intercept_, sigma2_, rho2_, gamma2_, log_evidence_ : float
    P_, D_, correlation_, converged_, n_evaluations_, sites_ (dict)
        As in the multi-task class, for the one task.
    n_iter_ : int
        EP iterations run over the whole fit.

    References
    ----------
    Hernández-Lobato, D. and Hernández-Lobato, J. M. *Learning Feature Selection
    Dependencies in Multi-task Learning*, NIPS 2013, and its supplementary material (EP
    updates eqs 2-26, evidence eq 27, gradients eqs 33-50).
    Carvalho, C. M., Polson, N. G. and Scott, J. G. *The horseshoe estimator for sparse
    signals*, Biometrika 97 (2010).

    Examples
    --------
    >>> import numpy as np
    >>> from fastep import HorseshoeRegression
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(50, 40))
    >>> w = np.zeros(40)
    >>> w[[3, 17]] = (2.0, -1.5)
    >>> y = X @ w + 0.3 * rng.normal(size=50)
    >>> model = HorseshoeRegression(max_opt_iter=20).fit(X, y)
    >>> sorted(np.argsort(-model.inclusion_)[:2].tolist())
    [3, 17]
    >>> bool(model.score(X, y) > 0.9)
    True
    """.replace("%PARAMETERS%", _PARAMETERS_DOC.replace("n_components : int, default 2",
                                                            "n_components : int, default 0"))

    def __init__(self, n_components=0, *, learn_dependencies=True, learn_hyperparameters=True, sigma2=None,
                 rho2=None, gamma2=1.0, D=1.0, P_init=None, P_init_scale=0.1, random_state=None,
                 fit_intercept=True, sigma2_floor=1e-3, negative_precision="clip", damping=0.5,
                 damping_decay=0.99, min_damping=0.3, tol=1e-8, max_iter=1000, max_opt_iter=100,
                 verbose=False):
        self.n_components = n_components
        self.learn_dependencies = learn_dependencies
        self.learn_hyperparameters = learn_hyperparameters
        self.sigma2 = sigma2
        self.rho2 = rho2
        self.gamma2 = gamma2
        self.D = D
        self.P_init = P_init
        self.P_init_scale = P_init_scale
        self.random_state = random_state
        self.fit_intercept = fit_intercept
        self.sigma2_floor = sigma2_floor
        self.negative_precision = negative_precision
        self.damping = damping
        self.damping_decay = damping_decay
        self.min_damping = min_damping
        self.tol = tol
        self.max_iter = max_iter
        self.max_opt_iter = max_opt_iter
        self.verbose = verbose

    def fit(self, X, y):
        """Fit on ``X`` (n, d) and ``y`` (n,); returns self."""
        if self.sigma2 is not None and np.ndim(self.sigma2) != 0:
            raise ValueError(f"sigma2 must be a positive float for HorseshoeRegression, got shape {np.shape(self.sigma2)}")
        X, y = v.check_X_y(X, y, y_numeric=True)
        self._fit_tasks([X], [y])
        self.n_iter_ = int(self.n_iter_[0])
        self.sites_ = self.sites_[0]
        return self

    @property
    def coef_(self):
        check_is_fitted(self, "_coef")
        return self._coef[0]

    @property
    def coef_var_(self):
        check_is_fitted(self, "_coef")
        return self._coef_var[0]

    @property
    def inclusion_(self):
        check_is_fitted(self, "_coef")
        return self._inclusion[0]

    @property
    def intercept_(self):
        check_is_fitted(self, "_coef")
        return float(self._intercept[0])

    @property
    def sigma2_(self):
        check_is_fitted(self, "_coef")
        return float(self._sigma2[0])

    @property
    def log_evidence_(self):
        check_is_fitted(self, "_coef")
        return float(self._log_z[0])

    def predict(self, X, return_std=False):
        """Predictive mean (and standard deviation of ``y``, including the noise, if ``return_std``)."""
        check_is_fitted(self, "_coef")
        return self._predict_task(X, 0, return_std)
