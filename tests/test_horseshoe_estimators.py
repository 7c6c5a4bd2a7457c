"""fastep.HorseshoeRegression and fastep.MultiTaskHorseshoeRegression: behaviour, task consistency, bad input."""
import warnings

import numpy as np
import pytest

import fastep
from fastep import ConvergenceWarning, HorseshoeRegression, MultiTaskHorseshoeRegression
from fastep._horseshoe.search import maximize_in_trust_boxes
from fastep.exceptions import NotFittedError


def sparse_task(n, d, seed, coef=(3.0, -2.0, 1.5), noise=0.3, shift=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[: len(coef)] = coef
    return X, X @ w + noise * rng.normal(size=n) + shift, w


FIXED = dict(learn_hyperparameters=False, noise_variance=0.1, rho2=0.05, tol=1e-10)


def test_single_task_recovers_sparse_coefficients_and_predicts():
    X, y, w = sparse_task(40, 60, seed=0, shift=2.0)
    model = HorseshoeRegression(max_optimizer_iter=30).fit(X, y)
    assert model.converged_ and np.isfinite(model.log_marginal_likelihood_value_)
    assert model.coef_.shape == model.coef_var_.shape == model.inclusion_.shape == (60,)
    np.testing.assert_allclose(model.coef_[:3], w[:3], atol=0.3)
    assert np.max(np.abs(model.coef_[3:])) < 0.2
    assert np.all(model.inclusion_[:3] > 0.9) and np.median(model.inclusion_[3:]) < 0.3
    assert np.all(model.coef_var_ > 0)
    assert abs(model.intercept_ - 2.0) < 0.3
    Xt, yt, _ = sparse_task(200, 60, seed=1, shift=2.0)
    mean, std = model.predict(Xt, return_std=True)
    assert mean.shape == std.shape == (200,)
    assert np.all(std >= np.sqrt(model.noise_variance_))
    assert np.sqrt(np.mean((mean - yt) ** 2)) < 0.6
    np.testing.assert_allclose(model.predict(Xt), mean)
    # predictive variance = x V xᵀ + σ², with V_jj the reported coefficient variances
    e = np.zeros((1, 60))
    e[0, 5] = 1.0
    _, s = model.predict(e + model._x_means[0], return_std=True)
    np.testing.assert_allclose(s[0] ** 2, model.coef_var_[5] + model.noise_variance_, rtol=1e-8)


@pytest.mark.slow
def test_multitask_with_one_task_equals_single_task():
    X, y, _ = sparse_task(30, 40, seed=2)
    options = dict(max_optimizer_iter=10, n_components=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)      # the optimiser budget is small on purpose
        single = HorseshoeRegression(**options).fit(X, y)
        multi = MultiTaskHorseshoeRegression(**options).fit([X], [y])
    np.testing.assert_array_equal(multi.coef_[0], single.coef_)
    np.testing.assert_array_equal(multi.coef_var_[0], single.coef_var_)
    np.testing.assert_array_equal(multi.P_, single.P_)
    assert multi.log_marginal_likelihood_value_ == single.log_marginal_likelihood_value_
    assert multi.noise_variance_[0] == single.noise_variance_ and multi.rho2_ == single.rho2_


@pytest.mark.slow
def test_fixed_hyperparameters_multitask_equals_tasks_one_by_one():
    """Given σ², ρ², γ², P the tasks' posteriors are independent: tasks of different sizes
    fitted together equal each fitted alone."""
    d, m = 30, 2
    P = 0.5 * np.random.default_rng(9).normal(size=(d, m))
    tasks = [sparse_task(n, d, seed=10 + n) for n in (12, 25, 40)]
    multi = MultiTaskHorseshoeRegression(n_components=m, P_init=P, **FIXED).fit(
        [t[0] for t in tasks], [t[1] for t in tasks])
    for k, (X, y, _) in enumerate(tasks):
        alone = HorseshoeRegression(n_components=m, P_init=P, **FIXED).fit(X, y)
        np.testing.assert_allclose(multi.coef_[k], alone.coef_, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(multi.coef_var_[k], alone.coef_var_, rtol=1e-12)
        assert abs(multi.log_marginal_likelihood_per_task_[k] - alone.log_marginal_likelihood_value_) < 1e-10
    assert abs(multi.log_marginal_likelihood_value_ - multi.log_marginal_likelihood_per_task_.sum()) < 1e-12
    np.testing.assert_array_equal(multi.P_, P)
    C = multi.correlation_
    np.testing.assert_allclose(np.diag(C), 1.0, rtol=1e-14)
    assert np.all(np.linalg.eigvalsh(C) > 0)
    preds = multi.predict([t[0][:3] for t in tasks])
    assert [p.shape for p in preds] == [(3,)] * 3
    np.testing.assert_allclose(multi.predict(tasks[1][0][:3], task=1), preds[1])


@pytest.mark.slow                  # minutes: two learnt multi-task fits
def test_learnt_dependencies_and_independent_horseshoe():
    """learn_dependencies=False fixes P = 0 (C = I); learning P raises the evidence and makes
    the features of a group that is relevant in several tasks dependent (|C_ij| large: λ_j
    depends on |u_j|/|v_j|, so the sign of C_ij does not matter)."""
    d = 24
    groups = np.arange(d) % 4                      # feature j belongs to group j mod 4
    rng = np.random.default_rng(5)
    Xs, ys = [], []
    for t in range(4):                             # group 3 relevant in tasks 0, 1, 2; group 1 in task 3
        w = np.where(groups == (3 if t < 3 else 1), 2 * rng.normal(size=d), 0.0)
        X = rng.normal(size=(20, d))
        Xs.append(X)
        ys.append(X @ w + 0.3 * rng.normal(size=20))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        indep = MultiTaskHorseshoeRegression(learn_dependencies=False, max_optimizer_iter=15).fit(Xs, ys)
        dep = MultiTaskHorseshoeRegression(n_components=2, random_state=1, max_optimizer_iter=40).fit(Xs, ys)
    assert indep.P_.shape == (d, 0)
    np.testing.assert_allclose(indep.correlation_, np.eye(d), atol=1e-15)
    assert dep.P_.shape == (d, 2)
    assert dep.log_marginal_likelihood_value_ > indep.log_marginal_likelihood_value_ + 5
    A = np.abs(dep.correlation_)
    block = groups == 3
    within = A[np.ix_(block, block)][~np.eye(block.sum(), dtype=bool)].mean()
    between = A[groups[:, None] != groups[None, :]].mean()
    assert within > 0.5 and within > 3 * between


def test_stuck_ep_warns_and_returns_finite_results():
    """P_init correlating the features strongly (|C_ij| up to ~0.99), fixed hyperparameters:
    EP stops as 'stuck' (see test_horseshoe_ep); the estimator warns and returns finite values."""
    rng = np.random.default_rng(16)
    X = rng.normal(size=(10, 20))
    w = np.zeros(20)
    w[:3] = [2.0, -1.5, 1.0]
    y = X @ w + 0.4 * rng.normal(size=10)
    P = 3.0 * rng.normal(size=(20, 2))
    D = rng.uniform(0.5, 1.5, 20)
    model = HorseshoeRegression(n_components=2, P_init=P, D=D, learn_hyperparameters=False, noise_variance=0.1,
                                rho2=0.05, fit_intercept=False)
    with pytest.warns(ConvergenceWarning, match=r"EP for task 0 stopped \(stuck\)"):
        model.fit(X, y)
    assert not model.converged_
    for a in (model.coef_, model.coef_var_, model.inclusion_, model.predict(X, return_std=True)[1]):
        assert np.all(np.isfinite(a))
    assert np.all(model.coef_var_ > 0) and np.isfinite(model.log_marginal_likelihood_value_)


def test_type2_ml_rounds_continue_after_failed_evaluations():
    """maximize_in_trust_boxes on a quadratic whose evaluation fails (-inf, as when EP does not converge)
    beyond θ_1 = c: a failed line-search point must not end the search (L-BFGS-B alone
    stopped there on its relative-reduction test, silently); an optimum inside the failing
    region ends at its edge with a ConvergenceWarning."""
    target = np.array([1.0, 2.0, -1.0])
    A = np.diag([1.36, 6.25, 0.022])
    bounds = np.array([[-10.0, 10.0], [-np.inf, np.inf], [-np.inf, np.inf]])
    start = np.array([6.5, -3.8, 8.5])

    def objective(c, failures):
        def f(theta):
            if theta[1] > c:
                failures.append(theta)
                return -np.inf, np.zeros_like(theta)
            r = theta - target
            return -0.5 * r @ A @ r, -(A @ r)
        return f

    failures = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        theta = maximize_in_trust_boxes(objective(2.06, failures), start, bounds, 1, 100)
    assert failures and np.allclose(theta, target, atol=1e-5)
    failures = []
    with pytest.warns(ConvergenceWarning, match="type-II ML stopped: EP did not converge"):
        theta = maximize_in_trust_boxes(objective(1.5, failures), start, bounds, 1, 100)
    f = objective(1.5, [])
    assert 1.0 < theta[1] <= 1.5 and f(theta)[0] > f(start)[0]


def test_convergence_warning_and_params():
    X, y, _ = sparse_task(20, 30, seed=3)
    with pytest.warns(ConvergenceWarning, match="EP for task 0 stopped"):
        model = HorseshoeRegression(learn_hyperparameters=False, noise_variance=0.1, rho2=0.1, max_sweeps=2).fit(X, y)
    assert not model.converged_ and np.all(np.isfinite(model.coef_))
    params = model.get_params()
    assert params["max_sweeps"] == 2 and params["n_components"] == 0
    model.set_params(max_sweeps=50)
    assert "max_sweeps=50" in repr(model)
    with pytest.raises(NotFittedError):
        HorseshoeRegression().predict(X)
    assert fastep.HorseshoeRegression is HorseshoeRegression


BAD_SINGLE = [
    (dict(), lambda X, y: (X[:, :0], y), ValueError, "X"),
    (dict(), lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 7, np.nan, X), y), ValueError, "X"),
    (dict(), lambda X, y: (X, y[:-1]), ValueError, "inconsistent"),
    (dict(), lambda X, y: (X, np.where(np.arange(y.size) == 3, np.inf, y)), ValueError, "y"),
    (dict(), lambda X, y: (X, "abc"), (TypeError, ValueError), "y"),
    (dict(noise_variance=-1.0), None, ValueError, "noise_variance"),
    (dict(rho2=0.0), None, ValueError, "rho2"),
    (dict(gamma2=-2.0), None, ValueError, "gamma2"),
    (dict(D=-1.0), None, ValueError, "D"),
    (dict(n_components=12), None, ValueError, "n_components"),
    (dict(n_components=2, P_init=np.zeros((5, 2))), None, ValueError, "P_init"),
    (dict(n_components=1.5), None, TypeError, "n_components"),
    (dict(damping=0.0), None, ValueError, "damping"),
    (dict(negative_precision="skip"), None, ValueError, "negative_precision"),
    (dict(fit_intercept="yes"), None, TypeError, "fit_intercept"),
]


@pytest.mark.parametrize("params,mutate,error,match", BAD_SINGLE)
def test_bad_input_raises_and_changes_no_state(params, mutate, error, match):
    X, y, _ = sparse_task(10, 12, seed=4)
    model = HorseshoeRegression(**FIXED).fit(X, y)
    before = (model.coef_.copy(), model.log_marginal_likelihood_value_, model.get_params())
    model.set_params(**params)
    Xb, yb = (X, y) if mutate is None else mutate(X, y)
    with pytest.raises(error, match=match):
        model.fit(Xb, yb)
    np.testing.assert_array_equal(model.coef_, before[0])
    assert model.log_marginal_likelihood_value_ == before[1]


def test_multitask_bad_input():
    X1, y1, _ = sparse_task(10, 12, seed=5)
    X2, y2, _ = sparse_task(14, 12, seed=6)
    model = MultiTaskHorseshoeRegression(n_components=2, random_state=0, **FIXED).fit([X1, X2], [y1, y2])
    coef = model.coef_.copy()
    cases = [
        (([X1, X2[:, :11]], [y1, y2]), ValueError, r"Xs\[1\] has 11 features"),
        (([X1, X2], [y1, y2[:-2]]), ValueError, r"ys\[1\]"),
        (([X1, X2], [y1]), ValueError, "same number of tasks"),
        ((X1, [y1]), TypeError, "Xs must be a list"),
        (([X1], y1), TypeError, "ys must be a list"),
        (([], []), ValueError, "at least one task"),
        (([X1, np.full_like(X2, np.nan)], [y1, y2]), ValueError, r"Xs\[1\]"),
        (([X1, X2], [y1, np.where(np.arange(14) == 0, np.nan, y2)]), ValueError, r"ys\[1\]"),
        (([X1, np.column_stack([X2[:, :-1], np.ones(14)])], [y1, y2]), ValueError, "constant"),
    ]
    for (Xs, ys), error, match in cases:
        with pytest.raises(error, match=match):
            model.fit(Xs, ys)
    with pytest.raises(ValueError, match="noise_variance"):
        model.set_params(noise_variance=[0.1, -0.1]).fit([X1, X2], [y1, y2])
    with pytest.raises(ValueError, match="noise_variance"):
        model.set_params(noise_variance=[0.1, 0.1, 0.1]).fit([X1, X2], [y1, y2])
    np.testing.assert_array_equal(model.coef_, coef)
    model.set_params(noise_variance=0.1)
    with pytest.raises(ValueError, match="task"):
        model.predict(X1)
    with pytest.raises(ValueError, match="task"):
        model.predict(X1, task=2)
    with pytest.raises(ValueError, match="features"):
        model.predict(X1[:, :5], task=0)


def _sparse_recovery_problem(seed, n=100, d=1000, relevant=20):
    """n = 100, d = 1000, 20 coefficients of 2, noise sd 0.5 (true σ² = 0.25)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w = np.zeros(d)
    w[:relevant] = 2.0
    return X, X @ w + 0.5 * rng.standard_normal(n), w


@pytest.mark.slow
def test_type2_ml_start_finds_the_sparse_evidence_peak():
    """On this draw L-BFGS-B started at σ² = 0.1 Var(y) stays where the signal is explained as
    noise (log evidence about -360, coefficient error 0.9). The default fit must end at least as
    high as every point of a grid over σ² (the truth and 0.1 Var(y)) x ρ² (decades, each σ²
    walked from weak shrinkage with warm starts), with a coefficient error within 1.5x of EP at
    the true σ² and its best ρ², and without warnings."""
    from fastep._epcore.horseshoe_ep import HorseshoeDamping, HorseshoeEP, HorseshoeOptions, HorseshoePrior, initial_sites
    X, y, w = _sparse_recovery_problem(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = HorseshoeRegression().fit(X, y)
    Xc, yc = X - X.mean(0), y - y.mean()
    schedule = HorseshoeDamping(damping=0.5, damping_decay=0.99, min_damping=0.3)
    options = HorseshoeOptions(negative_precision="clip", damping_schedule=schedule,
                               tol=1e-8, max_sweeps=1000, n_threads=1)
    grid = {}
    for sigma2 in (0.25, 0.1 * np.var(y)):
        sites = initial_sites(1000, 1e-2, 1.0)
        for k in range(2, 7):
            prior = HorseshoePrior(10.0 ** -k, 1.0, np.zeros((1000, 0)), np.ones(1000))
            result = HorseshoeEP(Xc, yc, sigma2, prior, options, sites).run()
            sites = result.sites
            assert result.converged
            grid[sigma2, k] = (result.log_z, np.linalg.norm(result.mean - w))
    best_grid = max(value for value, _ in grid.values())
    error_at_truth = max((v for (s2, _), v in grid.items() if s2 == 0.25), key=lambda v: v[0])[1]
    assert model.log_marginal_likelihood_value_ >= best_grid
    assert np.linalg.norm(model.coef_ - w) <= 1.5 * error_at_truth
    assert model.noise_variance_ < 0.01 * np.var(y)


@pytest.mark.slow
def test_type2_ml_never_evaluates_a_point_twice(monkeypatch):
    """Every EP evaluation of the search is at a new (σ², ρ², P, tol); repeats come from memory."""
    from fastep._horseshoe.search import EvidenceSearch
    seen = []
    real = EvidenceSearch.run_ep

    def recording(self, sigma2, rho2, P, starts, **kwargs):
        seen.append((tuple(np.asarray(sigma2).tolist()), rho2, P.tobytes(), kwargs.get("tol")))
        return real(self, sigma2, rho2, P, starts, **kwargs)

    monkeypatch.setattr(EvidenceSearch, "run_ep", recording)
    X, y, _ = sparse_task(30, 40, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = MultiTaskHorseshoeRegression(n_components=2, random_state=0, max_optimizer_iter=20).fit([X, X[::-1]],
                                                                                                   [y, y[::-1]])
    assert len(seen) == model.n_evaluations_ + 1 > 11     # the evaluations and the final EP
    assert len(set(seen)) == len(seen)


RENAMED_PARAMETERS = [("sigma2", "noise_variance", 0.1), ("sigma2_floor", "noise_variance_floor", 0.01),
                      ("max_iter", "max_sweeps", 300), ("max_opt_iter", "max_optimizer_iter", 2)]


@pytest.mark.parametrize("old,new,value", RENAMED_PARAMETERS)
def test_deprecated_parameter_warns_and_fits_as_its_new_name(old, new, value):
    X, y, _ = sparse_task(15, 8, seed=21)
    options = dict(rho2=0.1, tol=1e-8, max_optimizer_iter=2)
    if new == "max_optimizer_iter":
        del options["max_optimizer_iter"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)       # two optimiser iterations, on purpose
        warnings.simplefilter("error", FutureWarning)
        current = HorseshoeRegression(**options, **{new: value}).fit(X, y)
        model = HorseshoeRegression(**options, **{old: value})
        assert model.get_params()[old] == value and current.get_params()[old] == "deprecated"
        assert model.get_params()[new] != value
        with pytest.warns(FutureWarning, match=f"{old} is deprecated.*use {new}") as caught:
            model.fit(X, y)
        multi = MultiTaskHorseshoeRegression(n_components=0, **options, **{old: value})
        with pytest.warns(FutureWarning, match=f"{old} is deprecated.*use {new}") as caught_multi:
            multi.fit([X], [y])
    future = [w.filename for w in caught.list + caught_multi.list if issubclass(w.category, FutureWarning)]
    assert future == [__file__, __file__]                                # at the line that calls fit
    np.testing.assert_array_equal(multi.coef_[0], current.coef_)
    np.testing.assert_array_equal(model.coef_, current.coef_)
    assert model.log_marginal_likelihood_value_ == current.log_marginal_likelihood_value_
    with pytest.raises(ValueError, match=f"give {new} only"), pytest.warns(FutureWarning):
        HorseshoeRegression(**options, **{old: value, new: value}).fit(X, y)


def test_deprecated_fitted_attributes_warn_and_equal_their_new_names():
    X, y, _ = sparse_task(12, 8, seed=22)
    single = HorseshoeRegression(**FIXED).fit(X, y)
    multi = MultiTaskHorseshoeRegression(n_components=0, **FIXED).fit([X, X[::-1]], [y, y[::-1]])
    pairs = [(single, "n_iter_", "n_sweeps_"), (single, "sigma2_", "noise_variance_"),
             (single, "log_evidence_", "log_marginal_likelihood_value_"),
             (multi, "n_iter_", "n_sweeps_"), (multi, "sigma2_", "noise_variance_"),
             (multi, "log_evidence_", "log_marginal_likelihood_value_"),
             (multi, "log_evidence_per_task_", "log_marginal_likelihood_per_task_")]
    for model, old, new in pairs:
        with pytest.warns(FutureWarning, match=f"{old} is deprecated.*use {new}"):
            value = getattr(model, old)
        np.testing.assert_array_equal(value, getattr(model, new))
        assert old in type(model)._renamed_attributes
    assert isinstance(single.n_sweeps_, int) and single.n_sweeps_ > 0
