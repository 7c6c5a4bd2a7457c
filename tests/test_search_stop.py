"""The hyperparameter search ends where the model stops changing, also when the EP evidence is noisy.

- ``maximize_log_likelihood(scale=s)``: L-BFGS-B's first trial step has length s, and the
  optimum is the same as with the default scale;
- :class:`fastep._search.space.Search` on an objective whose gradient carries an error of the
  size of an unconverged EP run's (the multinomial search near its optimum): the search ends a
  few evaluations after its last gain of ``GAIN_TOL`` per point, at its best point; with the
  rules that end it switched off, the same search spends many more evaluations;
- the multinomial GP classifier's search starts where a search on a third of the points ends
  (``n_coarse_evaluations``), deterministically; the search on all points ends when an
  accepted step no longer moves the training class probabilities (``PREDICTION_TOL``), with
  predictions close to those at the stationary point the search reaches without that rule.
"""
import numpy as np
import pytest

from fastep import GaussianProcessClassifier
from fastep._gp.hyperparameters import Hyperparameters
from fastep.exceptions import ConvergenceWarning
from fastep._search import space as search_space
from fastep._search.optimize import maximize_log_likelihood
from fastep.kernels import RBF
from fastep.progress import quiet


def test_the_first_step_has_the_length_of_the_scale():
    optimum = np.array([0.3, -0.2])
    points = []

    def objective(u):
        points.append(np.array(u, dtype=float))
        d = u - optimum
        return -0.5 * float(d @ d) - 0.1 * float(d[0] ** 4), -(d + np.array([0.4 * d[0] ** 3, 0.0]))

    bounds = np.array([[-np.inf, np.inf]] * 2)
    for scale in (1.0, 0.25):
        points.clear()
        theta, value, _ = maximize_log_likelihood(objective, np.zeros(2), bounds, scale=scale)
        assert np.linalg.norm(points[1] - points[0]) == pytest.approx(scale, rel=1e-9)
        np.testing.assert_allclose(theta, optimum, atol=1e-4)
        assert value == pytest.approx(0.0, abs=1e-8)


class _NoisyProblem:
    """A stand-in for an EP problem: a concave evidence in the RBF kernel's log parameters whose
    gradient carries a deterministic error of up to ``noise`` per coordinate (as an EP run
    stopped at a site tolerance gives), on ``n`` points."""

    def __init__(self, n, noise, optimum):
        self.n_points = n
        self.noise = noise
        self.optimum = np.asarray(optimum, dtype=float)
        self.rng = np.random.default_rng(0)
        self.count = 0

    def evaluate(self, params, *, gradient, warm):
        self.count += 1
        u = np.log([params[0].get_params()["variance"], params[0].get_params()["inverse_width"]])
        d = u - self.optimum
        value = -0.5 * self.n_points * 0.01 * float(d @ d)
        grad_u = -self.n_points * 0.01 * d + self.noise * self.rng.uniform(-1, 1, size=2)
        # the RBF's default coordinates are softplus: ∂/∂θ = ∂/∂u · σ(θ) / softplus(θ)
        theta = params[0].theta
        grad_theta = grad_u * (1.0 / (1.0 + np.exp(-theta))) / np.logaddexp(0.0, theta)
        return value, grad_theta, None

    def sites(self):
        return None


def _noisy_search(noise):
    kernel = RBF(1.0, 1.0)
    hyper = Hyperparameters(kernel, None, False, hyperprior=None)
    problem = _NoisyProblem(600, noise, optimum=[2.0, -1.0])
    search = search_space.Search(problem, hyper, warm=True, progress=quiet())
    u, value, _ = maximize_log_likelihood(search, hyper.space.u_start, hyper.space.bounds, stop_rule=search,
                                          check_gradient=False)
    return problem, u, value


def test_a_noisy_evidence_ends_the_search_at_its_best_point(monkeypatch):
    problem, u, value = _noisy_search(noise=0.3)
    tolerance = search_space.GAIN_TOL * problem.n_points
    assert value >= -10 * tolerance                      # within the search's tolerance of the maximum (0)
    assert np.max(np.abs(u - [2.0, -1.0])) < 0.1
    ended_after = problem.count
    assert ended_after <= 30
    # the rules that ended it: without them the same search runs on
    monkeypatch.setattr(search_space, "PATIENCE", 10 ** 9)
    with pytest.warns(ConvergenceWarning):           # L-BFGS-B's line search fails on the noise
        longer, _, _ = _noisy_search(noise=0.3)
    assert longer.count > ended_after + 10


def _three_blobs(n_per_class, seed):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [2.5, 0.0], [1.2, 2.2]])
    X = np.concatenate([c + rng.normal(size=(n_per_class, 2)) for c in centres])
    y = np.repeat(np.arange(3), n_per_class)
    order = rng.permutation(y.size)
    return X[order], y[order]


@pytest.mark.slow
def test_the_multinomial_search_starts_where_a_search_on_a_subset_ends(monkeypatch):
    X, y = _three_blobs(110, seed=5)                     # 330 points: above the coarse stage's threshold
    X_test, _ = _three_blobs(100, seed=6)
    model = GaussianProcessClassifier(multi_class="multinomial").fit(X, y)
    (problem,) = model._problems
    assert problem.n_coarse_evaluations > 0
    assert model.n_evaluations_ > 0
    again = GaussianProcessClassifier(multi_class="multinomial").fit(X, y)
    np.testing.assert_array_equal(again.kernel_.theta, model.kernel_.theta)
    assert again.log_hyperposterior_value_ == model.log_hyperposterior_value_
    # the refinement stop: without it the search on all points runs on to a stationary point
    # of the full objective, and the predictions there differ by less than PREDICTION_TOL
    tolerance = search_space.PREDICTION_TOL
    monkeypatch.setattr(search_space, "PREDICTION_TOL", 0.0)
    stationary = GaussianProcessClassifier(multi_class="multinomial").fit(X, y)
    assert stationary.n_evaluations_ > model.n_evaluations_
    assert stationary.log_hyperposterior_value_ >= model.log_hyperposterior_value_ - 1e-6
    for points in (X, X_test):
        difference = np.abs(model.predict_proba(points) - stationary.predict_proba(points))
        assert difference.max() < tolerance
    # the full objective is stationary there to the search's tolerance: a Newton step on a
    # finite-difference Hessian of its analytic gradient (in log coordinates) gains little
    theta = stationary.kernel_.theta
    space = search_space.SearchSpace(stationary.kernel_, [], 0, theta, stationary.kernel_.bounds)

    def grad_u(u):
        t = space.from_search(u)
        return space.gradient_to_search(t, stationary.log_hyperposterior(t, eval_gradient=True)[1])

    u = space.to_search(theta)
    g = grad_u(u)
    step = 2e-2
    hessian = np.column_stack([(grad_u(u + step * e) - grad_u(u - step * e)) / (2 * step) for e in np.eye(2)])
    hessian = 0.5 * (hessian + hessian.T)
    assert np.all(np.linalg.eigvalsh(hessian) < 0)
    newton_gain = -0.5 * g @ np.linalg.solve(hessian, g)
    assert newton_gain < 10 * search_space.GAIN_TOL * X.shape[0]
