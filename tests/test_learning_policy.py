"""The GP estimators' learning policy: the MAP-II objective, its search coordinates and stopping rule.

- the hyperprior (fastep.hyperpriors) and the search coordinates (fastep._search.space.SearchSpace):
  densities, round trips and gradients against finite differences;
- the returned point is stationary for the documented objective (finite differences at it), on a
  separable and on an overlapping data set;
- on separable data the search ends after a bounded number of evaluations at a finite variance,
  with predictions close to a search run to L-BFGS-B's default tolerance;
- hyperprior=None is plain type-II ML: the published optimum of the dense-GP toy;
- the result is the same for every n_jobs and with restarts; no point is evaluated twice;
- the sparse GP, the regressors and the Student-t models learn by the same policy.
"""
import numpy as np
import pytest
from scipy.optimize import minimize

from fastep import (GaussianProcessClassifier, GaussianProcessRegressor, SparseGPClassifier, SparseGPRegressor)
from fastep._dense import problem as _dense
from fastep._search.space import GAIN_TOL, SearchSpace
from fastep.hyperpriors import DEFAULT_SCALE, LogNormal, check_hyperprior
from fastep.kernels import RBF, Bias, RBFARD
from fastep.likelihoods import Gaussian, Probit


def dense_gp_toy(n, seed=0):
    """The dense-GP toy of the benchmarks and the peers: overlapping classes."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def separable_toy(n=80, seed=1):
    """Two classes with a margin: the type-II ML evidence rises without bound along the variance."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(4 * n, 2))
    score = X[:, 0] + 0.5 * X[:, 1]
    keep = np.flatnonzero(np.abs(score) > 0.4)[:n]
    return X[keep], (score[keep] > 0).astype(int)


# ---- the hyperprior and the search coordinates --------------------------------------------------

def test_lognormal_density_and_gradient():
    prior = LogNormal(scale=1.5)
    u, centre = np.array([0.3, -2.0, 4.0]), np.array([0.0, -1.0, 1.0])
    value, grad = prior.log_density(u, centre)
    expected = np.sum(-0.5 * ((u - centre) / 1.5) ** 2 - np.log(1.5 * np.sqrt(2 * np.pi)))
    assert value == pytest.approx(expected, rel=1e-14)
    step = 1e-6
    for k in range(3):
        e = np.zeros(3)
        e[k] = step
        fd = (prior.log_density(u + e, centre)[0] - prior.log_density(u - e, centre)[0]) / (2 * step)
        assert grad[k] == pytest.approx(fd, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("bad, error", [("flat", ValueError), (2.0, TypeError), (LogNormal(0.0), ValueError),
                                        (LogNormal(np.inf), ValueError), (LogNormal("1"), TypeError)])
def test_bad_hyperprior_is_rejected_before_any_work(bad, error):
    X, y = dense_gp_toy(40)
    with pytest.raises(error, match="hyperprior|LogNormal"):
        GaussianProcessClassifier(hyperprior=bad).fit(X, y)
    assert check_hyperprior("auto") == LogNormal(DEFAULT_SCALE)
    assert check_hyperprior(None) is None


def test_search_space_round_trip_and_gradient():
    kernel = RBF(2.0, 0.5) + RBFARD(np.array([0.3, 0.7]), variance=1.5, inverse_width=1.0,
                                    transforms={"variance": "log"})
    theta0 = kernel.theta
    likelihood_parameters = Probit().parameters()[:1] + Gaussian().parameters()    # bias, log_noise
    space = SearchSpace(kernel, likelihood_parameters, 2, np.concatenate([theta0, [0.1, -1.0], [3.0, 4.0]]),
                        np.vstack([kernel.bounds, [[-10, 10], [-30, 20]], [[-np.inf, np.inf]] * 2]))
    # softplus entries move on the log scale; log-transformed and likelihood log_* entries are unchanged
    # kernel: RBF variance, width (softplus); ARD variance (log), width (softplus), two scales (sigmoid)
    assert space.softplus.tolist() == [True, True, False, True, False, False, False, False, False, False]
    assert space.log_scale.tolist() == [True, True, True, True, False, False, False, True, False, False]
    theta = np.concatenate([kernel.theta, [0.1, -1.0], [3.0, 4.0]])
    u = space.to_search(theta)
    assert u[0] == pytest.approx(np.log(2.0), rel=1e-12) and u[1] == pytest.approx(np.log(0.5), rel=1e-12)
    np.testing.assert_allclose(space.from_search(u), theta, rtol=1e-12, atol=1e-12)
    # ∂f/∂u from ∂f/∂θ, checked on f(θ) = Σ c_k θ_k by differences in u
    c = np.linspace(-1.0, 2.0, theta.size)
    grad_u = space.gradient_to_search(theta, c)
    for k in range(theta.size):
        e = np.zeros(theta.size)
        e[k] = 1e-6
        fd = (c @ space.from_search(u + e) - c @ space.from_search(u - e)) / 2e-6
        assert grad_u[k] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    # the kernel's log coordinates are unbounded (L-BFGS-B then takes a first step of length 1, not the
    # whole gradient); the likelihood's keep their bounds
    assert space.unbounded.tolist() == [True, True, True, True, False, False, False, False, False, False]
    assert np.all(np.isinf(space.bounds[space.unbounded])) and np.all(np.isfinite(space.bounds[7]))


# ---- the objective at the returned point ------------------------------------------------------

def _objective_in_log_coordinates(model, log_values, names):
    """The fitted model's documented objective at kernel parameters exp(log_values) (EP from zero sites)."""
    kernel = model.kernel_.clone_with_theta(model.kernel_.theta)
    kernel.set_params(**{name: float(np.exp(value)) for name, value in zip(names, log_values)})
    return model.log_hyperposterior(kernel.theta)


def _log_parameters(model, names):
    params = model.kernel_.get_params()
    return np.log([params[name] for name in names])


@pytest.mark.parametrize("data", ["separable", "overlapping"])
def test_returned_point_is_stationary_for_the_documented_objective(data):
    X, y = separable_toy() if data == "separable" else dense_gp_toy(150)
    model = GaussianProcessClassifier(tol=1e-8).fit(X, y)
    names = ["variance", "inverse_width"]
    u = _log_parameters(model, names)
    grad = _gradient_at(model, u, names)
    # the analytic gradient of the objective agrees with the differences (chain rule θ -> log x)
    value, grad_theta = model.log_hyperposterior(model.kernel_.theta, eval_gradient=True)
    assert value == pytest.approx(model.log_hyperposterior_value_, abs=1e-6)
    grad_u = SearchSpace(model.kernel_, [], 0, model.kernel_.theta, model.kernel_.bounds).gradient_to_search(
        model.kernel_.theta, grad_theta)
    np.testing.assert_allclose(grad_u, grad, rtol=1e-3, atol=1e-4)
    # stationary: a Newton step on the (finite-difference) Hessian would gain less than the search's
    # own tolerance per training point
    hessian = np.empty((2, 2))
    step = 1e-2
    for k in range(2):
        e = np.zeros(2)
        e[k] = step
        hessian[:, k] = (_gradient_at(model, u + e, names) - _gradient_at(model, u - e, names)) / (2 * step)
    hessian = 0.5 * (hessian + hessian.T)
    assert np.all(np.linalg.eigvalsh(hessian) < 0)
    newton_gain = -0.5 * grad @ np.linalg.solve(hessian, grad)
    assert newton_gain < 10 * GAIN_TOL * X.shape[0]


def _gradient_at(model, u, names, step=1e-4):
    grad = np.empty(u.size)
    for k in range(u.size):
        e = np.zeros(u.size)
        e[k] = step
        grad[k] = (_objective_in_log_coordinates(model, u + e, names)
                   - _objective_in_log_coordinates(model, u - e, names)) / (2 * step)
    return grad


def test_separable_data_end_at_a_finite_variance_close_to_a_full_search():
    X, y = separable_toy()
    model = GaussianProcessClassifier().fit(X, y)
    variance = model.kernel_.get_params()["variance"]
    assert model.n_evaluations_ <= 30
    assert 1.0 < variance < 1e3
    # the same objective run to L-BFGS-B's default tolerance, from the returned point
    result = minimize(lambda t: tuple(-np.asarray(v) for v in model.log_hyperposterior(t, eval_gradient=True)),
                      model.kernel_.theta, jac=True, method="L-BFGS-B", bounds=model.kernel_.bounds)
    assert -result.fun >= model.log_hyperposterior_value_ - 1e-6
    assert -result.fun - model.log_hyperposterior_value_ < 10 * GAIN_TOL * X.shape[0]
    full = GaussianProcessClassifier(model.kernel_.clone_with_theta(result.x), optimizer=None).fit(X, y)
    grid = np.random.default_rng(3).normal(size=(400, 2)) * 1.5
    assert np.max(np.abs(full.predict_proba(grid) - model.predict_proba(grid))) < 0.02
    # type-II ML alone walks the ridge: a larger variance, for a higher evidence
    ml = GaussianProcessClassifier(hyperprior=None).fit(X, y)
    assert ml.kernel_.get_params()["variance"] > variance
    assert ml.log_marginal_likelihood_value_ > model.log_marginal_likelihood_value_


def test_without_the_prior_learning_is_type_ii_ml_of_the_dense_gp_toy():
    X, y = dense_gp_toy(200)
    for kernel in (RBF(1.0, 1.0, transforms={"variance": "log", "inverse_width": "log"}), RBF(1.0, 1.0)):
        clf = GaussianProcessClassifier(kernel, tol=1e-9, hyperprior=None).fit(X, y)
        assert abs(clf.log_marginal_likelihood_value_ - (-47.6334)) < 1e-3
        assert abs(clf.kernel_.lengthscale - 1.787) < 0.01
        assert abs(clf.kernel_.get_params()["variance"] - 33.24) < 0.2
        assert clf.log_hyperposterior_value_ == clf.log_marginal_likelihood_value_


def test_the_prior_reports_evidence_and_objective_apart():
    X, y = dense_gp_toy(200)
    clf = GaussianProcessClassifier(RBF(1.0, 1.0), tol=1e-9).fit(X, y)
    theta = clf.kernel_.theta
    prior = LogNormal(DEFAULT_SCALE).log_density(np.log([clf.kernel_.get_params()["variance"],
                                                         clf.kernel_.get_params()["inverse_width"]]),
                                                 np.zeros(2))[0]
    assert clf.log_hyperposterior_value_ == pytest.approx(clf.log_marginal_likelihood_value_ + prior, abs=1e-9)
    assert clf.log_marginal_likelihood(theta) == pytest.approx(clf.log_marginal_likelihood_value_, abs=1e-5)
    assert clf.log_hyperposterior(theta) == pytest.approx(clf.log_hyperposterior_value_, abs=1e-5)


# ---- the same result however it is run --------------------------------------------------------

def test_same_optimum_for_every_n_jobs_and_with_restarts():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(90, 3))
    y = np.argmax(X @ rng.normal(size=(3, 3)) + 0.3 * rng.normal(size=(90, 3)), axis=1)
    fits = [GaussianProcessClassifier(n_jobs=n_jobs, tol=1e-8).fit(X, y) for n_jobs in (None, 1, 2)]
    for other in fits[1:]:
        for a, b in zip(fits[0].kernel_, other.kernel_):
            np.testing.assert_allclose(a.theta, b.theta, rtol=1e-6)
    # restarts reach the same maximum of the (unimodal here) objective as the single start
    restarted = GaussianProcessClassifier(n_restarts_optimizer=3, random_state=0, tol=1e-8).fit(X, y)
    assert restarted.log_hyperposterior_value_ >= fits[0].log_hyperposterior_value_ - 10 * GAIN_TOL * 90 * 3
    np.testing.assert_allclose(restarted.predict_proba(X), fits[0].predict_proba(X), atol=0.02)


def test_no_point_is_evaluated_twice(monkeypatch):
    seen = []
    original = _dense.DenseGPProblem.evaluate

    def evaluate(problem, params, **kwargs):
        if kwargs.get("gradient"):
            seen.append(params[0].theta.tobytes())
        return original(problem, params, **kwargs)

    monkeypatch.setattr(_dense.DenseGPProblem, "evaluate", evaluate)
    X, y = separable_toy()
    model = GaussianProcessClassifier(n_restarts_optimizer=1).fit(X, y)
    assert len(seen) == len(set(seen)) == model.n_evaluations_


# ---- every GP estimator learns the same way -----------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda **kw: SparseGPClassifier(n_inducing=15, random_state=0, **kw),
    lambda **kw: GaussianProcessClassifier(multi_class="multinomial", **kw),
])
def test_classifiers_share_the_policy(make):
    X, y = separable_toy(60)
    model = make().fit(X, y)
    ml = make(hyperprior=None).fit(X, y)
    assert model.log_hyperposterior_value_ < model.log_marginal_likelihood_value_
    assert ml.log_hyperposterior_value_ == ml.log_marginal_likelihood_value_
    assert ml.kernel_.get_params()["variance"] > model.kernel_.get_params()["variance"]
    assert np.mean(model.predict(X) == y) == 1.0


@pytest.mark.parametrize("make", [
    lambda **kw: GaussianProcessRegressor(**kw),
    lambda **kw: GaussianProcessRegressor(likelihood="student_t", **kw),
    lambda **kw: SparseGPRegressor(n_inducing=15, random_state=0, **kw),
])
def test_regressors_share_the_policy(make):
    rng = np.random.default_rng(5)
    X = rng.uniform(-3, 3, size=(60, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    model = make().fit(X, y)
    ml = make(hyperprior=None).fit(X, y)
    assert ml.log_hyperposterior_value_ == ml.log_marginal_likelihood_value_
    assert model.log_hyperposterior_value_ < model.log_marginal_likelihood_value_ + 1e-9
    # the evidence has a finite maximum here: the prior moves the fit little
    grid = np.linspace(-3, 3, 50)[:, None]
    assert np.max(np.abs(model.predict(grid) - ml.predict(grid))) < 0.1
    assert np.sqrt(np.mean((model.predict(grid) - np.sin(grid[:, 0])) ** 2)) < 0.15
