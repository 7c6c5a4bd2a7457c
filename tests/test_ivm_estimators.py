"""IVM estimators: Algorithm 2 objectives and gradients, prediction, one-vs-rest, ordinal, bad input."""

import numpy as np
import pytest
from scipy.linalg import cho_solve, cholesky
from scipy.special import ndtr

from fastep import IVMClassifier, IVMOrdinalRegressor, IVMRegressor
from fastep._epcore import ivm as engine
from fastep._ivm.problem import _IVMProblem
from fastep.kernels import RBF, RBFARD, Bias, Linear, White
from fastep.likelihoods import Gaussian, OrderedCategorical, Probit
from fastep.reference import ivm as ref
from support import shared_data


def _toy(n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2))
    f = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 3
    return X, f, rng


def _fd(fun, theta, h=1e-6):
    out = []
    for e in np.eye(theta.shape[0]):
        out.append((fun(theta + h * e)[0] - fun(theta - h * e)[0]) / (2 * h))
    return np.array(out)


def test_eq32_gradient_matches_finite_differences():
    X, f, rng = _toy(120, 1)
    y = np.where(f + 0.2 * rng.normal(size=120) > 0.3, 1.0, -1.0)
    kernel = RBFARD([0.7, 0.4], variance=1.5, inverse_width=2.0) + Linear(0.3) + Bias(0.2) + White(0.05)
    problem = _IVMProblem(X, y, kernel, Probit(slope=2.0, bias=0.1), 30, engine.CRITERION_ENTROPY, 0)
    problem.select()
    theta = kernel.theta
    value, grad = problem.kernel_objective(theta)
    assert value == pytest.approx(ref.log_likelihood(kernel(X[problem.active]), problem.site_mean,
                                                     problem.site_precision), rel=1e-12)
    np.testing.assert_allclose(grad, _fd(problem.kernel_objective, theta), rtol=1e-5, atol=1e-6)


def test_regressor_eq32_with_noise_and_bias_is_the_active_set_evidence_and_its_gradient():
    X, f, rng = _toy(100, 13)
    y = f + 0.1 * rng.normal(size=100) + 1.0
    kernel = RBF(1.2, 0.8) + Linear(0.3)
    problem = _IVMProblem(X, y, kernel, Gaussian(0.05), 30, engine.CRITERION_ENTROPY, 0, offset=0.9,
                          joint_noise=True)
    problem.select()
    theta, bounds = problem.kernel_theta()
    assert theta.shape == (kernel.n_theta + 2,) and bounds.shape == (kernel.n_theta + 2, 2)
    value, grad = problem.kernel_objective(theta)
    idx = problem.active
    K_I = kernel(X[idx])
    c = cholesky(K_I + 0.05 * np.eye(30), lower=True)
    r = y[idx] - 0.9
    exact = -0.5 * r @ cho_solve((c, True), r) - np.sum(np.log(np.diag(c))) - 15 * np.log(2 * np.pi)
    assert value == pytest.approx(exact, rel=1e-11)
    np.testing.assert_allclose(grad, _fd(problem.kernel_objective, theta), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["probit", "gaussian", "ordinal"])
def test_eq34_gradient_matches_finite_differences(kind):
    X, f, rng = _toy(100, 2)
    kernel = RBF(1.0, 1.0) + White(0.1)
    offset, learn_offset = 0.0, False
    if kind == "probit":
        y = np.where(f > 0.3, 1.0, -1.0)
        lik = Probit(slope=1.5, bias=-0.2)
    elif kind == "gaussian":
        y = f + 0.1 * rng.normal(size=100) + 1.0
        lik = Gaussian(0.2)
        offset, learn_offset = 0.8, True
    else:
        y = np.digitize(f, [-0.4, 0.3, 0.9]).astype(float)
        lik = OrderedCategorical(4, slope=2.0, bias=-0.5, widths=[0.6, 0.9])
    problem = _IVMProblem(X, y, kernel, lik, 25, engine.CRITERION_ENTROPY, 0, offset=offset)
    problem.select()
    theta = lik.theta
    if learn_offset:
        theta = np.append(theta, offset)
    _, grad = problem.noise_objective(theta, learn_offset)
    np.testing.assert_allclose(grad, _fd(lambda t: problem.noise_objective(t, learn_offset), theta),
                               rtol=1e-5, atol=1e-6)


def _selected_probit_problem():
    """A probit IVM problem after one selection, and eq 32 at its starting kernel."""
    X, f, rng = _toy(150, 3)
    y = np.where(f + 0.3 * rng.normal(size=150) > 0.3, 1.0, -1.0)
    kernel = RBF(1.0, 1.0) + Bias(0.1)
    problem = _IVMProblem(X, y, kernel, Probit(), 40, engine.CRITERION_ENTROPY, 0)
    problem.select()
    start, _ = problem.kernel_objective(kernel.theta)
    return X, y, kernel, problem, start


def test_kernel_step_of_algorithm_2_does_not_lower_eq32():
    X, y, kernel, problem, start = _selected_probit_problem()
    from fastep._search.optimize import maximize_log_likelihood
    theta, best, _ = maximize_log_likelihood(problem.kernel_objective, kernel.theta, kernel.bounds, maxiter=50)
    assert best >= start
    assert best > start + 1e-3          # the starting kernel is not already optimal here


def test_scg_reaches_the_optimum_of_a_quadratic_and_of_rosenbrock():
    from scipy.optimize import rosen, rosen_der
    from fastep._search.optimize import maximize_log_likelihood_scg
    rng = np.random.default_rng(0)
    A = rng.normal(size=(8, 8))
    A = A @ A.T + 0.5 * np.eye(8)
    b = rng.normal(size=8)
    wide = np.tile([-np.inf, np.inf], (8, 1))
    theta, value, n = maximize_log_likelihood_scg(lambda t: (-0.5 * t @ A @ t + b @ t, b - A @ t), np.zeros(8),
                                                  wide, maxiter=200, xtol=1e-12, ftol=1e-15)
    np.testing.assert_allclose(theta, np.linalg.solve(A, b), rtol=1e-7, atol=1e-9)
    assert value == pytest.approx(0.5 * b @ np.linalg.solve(A, b), rel=1e-12)
    theta, value, n = maximize_log_likelihood_scg(lambda t: (-rosen(t), -rosen_der(t)), np.array([-1.2, 1.0]),
                                                  wide[:2], maxiter=500, xtol=1e-10, ftol=1e-14)
    np.testing.assert_allclose(theta, [1.0, 1.0], atol=1e-6)
    assert n <= 2 * 500 + 1
    # bounds: evaluations are clipped into them and so is the result
    theta, _, _ = maximize_log_likelihood_scg(lambda t: (-np.sum((t - 3.0) ** 2), -2.0 * (t - 3.0)),
                                              np.zeros(2), np.array([[-1.0, 1.0], [-1.0, 2.0]]), maxiter=50)
    np.testing.assert_allclose(theta, [1.0, 2.0])


@pytest.mark.slow
def test_scg_kernel_step_of_algorithm_2_does_not_lower_eq32():
    X, y, kernel, problem, start = _selected_probit_problem()
    from fastep._search.optimize import maximize_log_likelihood, maximize_log_likelihood_scg
    theta, best, _ = maximize_log_likelihood_scg(problem.kernel_objective, kernel.theta, kernel.bounds, maxiter=200,
                                                 xtol=1e-8, ftol=1e-10)
    assert best > start + 1e-3 and best == pytest.approx(problem.kernel_objective(theta)[0], rel=1e-12)
    _, best_lbfgs, _ = maximize_log_likelihood(problem.kernel_objective, kernel.theta, kernel.bounds, maxiter=200)
    assert best == pytest.approx(best_lbfgs, abs=1e-5)          # the same optimum of eq 32
    model = IVMClassifier(RBF(1.0, 1.0) + Bias(0.1), active_set_size=40, n_iterations=2, optimizer="SCG",
                          max_optimizer_iter=30, kernel_objective="active_set").fit(X, y)
    assert model.kernel_.get_params()["k0__inverse_width"] != 1.0
    assert model.score(X, y) > 0.8


def test_classifier_learns_the_toy_problem_and_predicts_by_the_active_set():
    from fastep.datasets import make_ivm_toy_classification
    X, y, f = make_ivm_toy_classification(600, random_state=0)
    model = IVMClassifier(RBF(1.0, 1.0), active_set_size=80, n_iterations=2, max_optimizer_iter=40)
    model.fit(X[:400], y[:400])
    assert model.active_set_.shape == (80,) and len(set(model.active_set_.tolist())) == 80
    assert model.site_mean_.shape == (80,) and np.all(model.site_precision_ > 0)
    assert model.score(X[400:], y[400:]) > 0.9
    assert len(model.history_) == 2 and {"iteration", "log_likelihood", "n_active", "elapsed"} <= set(model.history_[0])
    # prediction through the active set equals the dense GP-given-sites formulas
    p = model._problems[0]
    k = model.kernel_
    XI = X[:400][model.active_set_]
    mean, var = model.predict_latent(X[400:])
    m_ref, v_ref = ref.predict_latent(k(XI), k(X[400:], XI), k.diag(X[400:]), model.site_mean_,
                                      model.site_precision_)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(var, np.maximum(v_ref, 0), rtol=1e-8, atol=1e-10)
    prob = model.predict_proba(X[400:])[:, 1]
    np.testing.assert_allclose(prob, ndtr((mean + 0.0) / np.sqrt(1.0 + var)), rtol=1e-12, atol=1e-14)
    assert model.log_likelihood_ == pytest.approx(p.log_lik)
    # the fitted state at the training points: the latent mean there is the ADF posterior mean
    state_problem = _IVMProblem(X[:400], p.y, k, p.likelihood, 80, engine.CRITERION_ENTROPY, 0)
    state = state_problem.select()
    np.testing.assert_array_equal(state.active, model.active_set_)
    np.testing.assert_allclose(model.predict_latent(X[:400])[0], state.post_mean, rtol=1e-8, atol=1e-9)


def test_probit_bias_and_slope_enter_predictions():
    X, f, rng = _toy(200, 4)
    y = np.where(f > 0.5, 1.0, -1.0)
    lik = Probit(slope=3.0, bias=0.25)
    model = IVMClassifier(RBF(1.0, 1.0) + White(0.01), lik, active_set_size=40, optimizer=None).fit(X, y)
    mean, var = model.predict_latent(X[:20])
    expected = ndtr((mean + 0.25) / np.sqrt(1.0 / 9.0 + var))
    np.testing.assert_allclose(model.predict_proba(X[:20])[:, 1], expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(model.predict(X[:20]) == 1.0, mean + 0.25 > 0)


def test_learning_the_probit_bias_by_eq34():
    X, f, rng = _toy(200, 5)
    y = np.where(f + 0.2 * rng.normal(size=200) > 0.8, 1.0, -1.0)     # unbalanced classes
    model = IVMClassifier(RBF(1.0, 1.0), Probit(bias=0.0), learn_likelihood=True, active_set_size=40,
                          n_iterations=1, max_optimizer_iter=30, kernel_objective="active_set").fit(X, y)
    assert model.likelihood_.bias != 0.0
    assert [h["stage"] for h in model.history_] == ["kernel", "noise"]


def test_eq34_increases_without_bound_in_the_probit_slope_when_every_point_is_classified():
    # Each log Z_n = log Φ(λ y (μ + b) / sqrt(1 + λ² ς)) increases with λ when y (μ + b) > 0, so
    # eq 34 has no finite maximiser in the slope then (why a learnt slope keeps growing on USPS);
    # with a misclassified point it has one.
    rng = np.random.default_rng(7)
    X = rng.uniform(-2, 2, size=(300, 2))
    X = X[np.abs(X[:, 0]) > 0.4][:120]                       # separable with a margin
    y = np.where(X[:, 0] > 0, 1.0, -1.0)

    def eq34_along_the_slope(labels):
        problem = _IVMProblem(X, labels, RBF(4.0, 0.5), Probit(slope=1.0, bias=0.0), 30, engine.CRITERION_ENTROPY, 0)
        problem.select()
        mean, _ = problem.cavity_marginals()
        values = [problem.noise_objective(np.array([0.0, t]), False)[0] for t in (0.0, 2.0, 4.0, 8.0, 16.0)]
        return mean, np.array(values)

    mean, values = eq34_along_the_slope(y)
    assert np.all(y * mean > 0)                              # the premise: every point on its side
    assert np.all(np.diff(values) > 0)
    y_flip = y.copy()
    y_flip[rng.choice(y.shape[0], 6, replace=False)] *= -1   # label noise
    mean, values = eq34_along_the_slope(y_flip)
    assert np.any(y_flip * mean < 0)
    assert values[-1] < values.max()


@pytest.mark.data
@pytest.mark.parametrize("white, slope", [(5e-4, 112.0), (2.5e-8, 7400.0)])
def test_selection_state_at_usps_scale_equals_the_dense_posterior_given_the_sites(white, slope):
    # Parameters of the kind Algorithm 2 reaches on USPS: a near-step probit and almost no
    # White noise, on 256-dimensional inputs. The engine's mu and diag(Sigma) at every training
    # point, and the test latents, must equal the dense formulas from the d sites.
    with np.load(shared_data("usps.npz")) as data:
        X = 2.0 * data["X_train"][:1500] - 1.0
        y = np.where(data["y_train"][:1500] == 3, 1.0, -1.0)
        Xt = 2.0 * data["X_test"][:300] - 1.0
    kernel = RBF(1.2, 0.0092) + Linear(1e-5) + White(white) + Bias(1.0)
    problem = _IVMProblem(X, y, kernel, Probit(slope=slope, bias=-0.9), 300, engine.CRITERION_ENTROPY, 0)
    problem.select()
    idx = problem.active
    C = kernel(X[idx]) + np.diag(1.0 / problem.site_precision)
    K_nI = kernel(X, X[idx])
    K_nI[idx, np.arange(idx.shape[0])] += white          # K(X, X)[:, I] carries White on its diagonal entries
    mean = K_nI @ np.linalg.solve(C, problem.site_mean)
    var = kernel.diag(X) - np.einsum("ij,ji->i", K_nI, np.linalg.solve(C, K_nI.T))
    np.testing.assert_allclose(problem.state.post_mean, mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(problem.state.post_var, var, rtol=1e-9, atol=1e-12)
    problem.finalize()
    m_t, v_t = problem.latent(Xt)
    K_tI = kernel(Xt, X[idx])
    np.testing.assert_allclose(m_t, K_tI @ np.linalg.solve(C, problem.site_mean), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(v_t, kernel.diag(Xt) - np.einsum("ij,ji->i", K_tI, np.linalg.solve(C, K_tI.T)),
                               rtol=1e-9, atol=1e-12)


def test_regressor_with_all_points_is_exact_gp_regression():
    X, f, rng = _toy(60, 6)
    y = f + 0.1 * rng.normal(size=60) + 2.0
    kernel = RBF(1.3, 0.8) + Linear(0.2)
    model = IVMRegressor(kernel, noise_variance=0.05, active_set_size=60, optimizer=None).fit(X, y)
    assert model.bias_ == pytest.approx(np.mean(y))
    Xs = rng.uniform(-2, 2, size=(25, 2))
    K = kernel(X)
    c = cholesky(K + 0.05 * np.eye(60), lower=True)
    Ks = kernel(Xs, X)
    mean = Ks @ cho_solve((c, True), y - model.bias_) + model.bias_
    var = kernel.diag(Xs) - np.einsum("ij,ji->i", Ks, cho_solve((c, True), Ks.T))
    m, s = model.predict(Xs, return_std=True)
    np.testing.assert_allclose(m, mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(s, np.sqrt(var + 0.05), rtol=1e-8)
    log_ml = (-0.5 * (y - model.bias_) @ cho_solve((c, True), y - model.bias_)
              - np.sum(np.log(np.diag(c))) - 30 * np.log(2 * np.pi))
    assert model.log_likelihood_ == pytest.approx(log_ml, rel=1e-10)


def test_regressor_learns_noise_and_bias():
    X, f, rng = _toy(250, 7)
    y = f + 0.1 * rng.normal(size=250) + 3.0
    model = IVMRegressor(RBF(1.0, 1.0), noise_variance=0.5, active_set_size=60, n_iterations=2,
                         max_optimizer_iter=40).fit(X[:200], y[:200])
    assert 1e-3 < model.noise_variance_ < 0.05          # generated with 0.01
    assert model.score(X[200:], y[200:]) > 0.9


def test_multiclass_one_vs_rest_by_largest_latent_mean():
    X, f, rng = _toy(240, 8)
    labels = np.array(["a", "b", "c"])[np.digitize(X[:, 0], [-0.7, 0.6])]
    model = IVMClassifier(RBF(1.0, 1.0), active_set_size=30, n_iterations=1, max_optimizer_iter=20)
    model.fit(X[:180], labels[:180])
    assert model.active_set_.shape == (3, 30) and model.site_mean_.shape == (3, 30)
    assert isinstance(model.kernel_, list) and len(model.kernel_) == 3
    mean, var = model.predict_latent(X[180:])
    assert mean.shape == (60, 3) and var.shape == (60, 3)
    np.testing.assert_array_equal(model.predict(X[180:]), model.classes_[np.argmax(mean, axis=1)])
    proba = model.predict_proba(X[180:])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert model.score(X[180:], labels[180:]) > 0.85


def test_ordinal_regressor():
    # The paper's first ordinal toy (§4.1.3): categories are Gaussian blobs 3 units apart along one axis.
    rng = np.random.default_rng(9)
    labels = rng.integers(0, 4, size=260)
    X = rng.normal(size=(260, 2))
    X[:, 1] += 3.0 * labels
    labels = labels * 10                                                 # 0, 10, 20, 30
    kernel = RBF(1.0, 1.0) + Linear(1.0) + Bias(1.0)
    model = IVMOrdinalRegressor(kernel, active_set_size=50, n_iterations=2, max_optimizer_iter=30)
    model.fit(X[:200], labels[:200])
    np.testing.assert_array_equal(model.classes_, [0, 10, 20, 30])
    proba = model.predict_proba(X[200:])
    assert proba.shape == (60, 4)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(model.predict(X[200:]), model.classes_[np.argmax(proba, axis=1)])
    assert model.score(X[200:], labels[200:]) > 0.8
    assert not np.allclose(model.likelihood_.widths, [1.0, 1.0])       # widths were learnt (eq 34)


def _ordinal_blobs(n_categories, seed, n=260):
    """The paper's first ordinal toy (§4.1.3) with labels 0..C-1, and the Bayes rule's test accuracy.

    Isotropic unit Gaussian blobs 3 units apart along the second axis, equally likely; the
    Bayes rule takes the nearest centre along that axis. The last 60 points are the test set.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_categories, size=n)
    X = rng.normal(size=(n, 2))
    X[:, 1] += 3.0 * labels
    bayes = np.clip(np.rint(X[200:, 1] / 3.0), 0, n_categories - 1)
    return X, labels, float(np.mean(bayes == labels[200:]))


def _toy_ordinal_model(n_iterations=2, likelihood=None, kernel_objective="full_data"):
    return IVMOrdinalRegressor(RBF(1.0, 1.0) + Linear(1.0) + Bias(1.0), likelihood, active_set_size=50,
                               n_iterations=n_iterations, max_optimizer_iter=30, kernel_objective=kernel_objective)


@pytest.mark.parametrize("n_categories", [3, 4])
@pytest.mark.parametrize("seed", [0, 1] + [pytest.param(seed, marks=pytest.mark.slow) for seed in range(2, 8)])
def test_ordinal_regressor_on_the_paper_toy_is_within_ten_points_of_the_bayes_rule(n_categories, seed):
    # With plain L-BFGS-B on eq 34 the bias and widths stayed at their start in about half
    # of these fits (accuracy down to 0.65 against a Bayes rule at 0.93).
    X, labels, bayes = _ordinal_blobs(n_categories, seed)
    model = _toy_ordinal_model().fit(X[:200], labels[:200])
    assert model.score(X[200:], labels[200:]) >= bayes - 0.1


@pytest.mark.parametrize("seed", range(6))
def test_algorithm2_noise_step_reaches_the_maximiser_of_eq34_on_the_ordinal_toy(seed):
    # eq 34 is concave in (bias, widths) with a finite maximiser here; the learnt likelihood of
    # one round must be stationary for the eq-34 problem of that round (the selection at the
    # learnt kernel and the starting likelihood), starting from a gradient of order N.
    X, labels, _ = _ordinal_blobs(4, seed)
    start = OrderedCategorical(4, slope=1.0, bias=-1.0)
    model = _toy_ordinal_model(n_iterations=1, likelihood=start, kernel_objective="active_set").fit(X[:200],
                                                                                                 labels[:200])
    problem = _IVMProblem(X[:200], labels[:200].astype(float), model.kernel_, start, 50,
                          engine.CRITERION_ENTROPY, 0)
    problem.select()
    value0, grad0 = problem.noise_objective(start.theta, False)
    value, grad = problem.noise_objective(model.likelihood_.theta, False)
    assert np.max(np.abs(grad0)) > 5.0
    assert value > value0 + 1.0
    assert np.max(np.abs(grad)) < 1e-2


def test_trust_region_maximiser_confines_the_first_trial_and_grows_to_a_distant_maximiser():
    from fastep._search.optimize import maximize_log_likelihood_trust_region
    # A sum of N = 1000 quadratic terms with finite bounds: the gradient at the start is
    # about 6e4, and plain L-BFGS-B would try the whole of it as its first step.
    centre = np.array([30.0, -25.0])
    points = []

    def objective(t):
        points.append(t.copy())
        r = t - centre
        return -500.0 * float(r @ r), -1000.0 * r

    bounds = np.array([[-100.0, 100.0], [-100.0, 100.0]])
    theta, value, n = maximize_log_likelihood_trust_region(objective, np.zeros(2), bounds, radius=1.0,
                                                           maxiter=200)
    assert np.max(np.abs(points[1] - points[0])) <= 1.0 + 1e-12
    np.testing.assert_allclose(theta, centre, atol=1e-6)
    assert value == objective(theta)[0] and n == len(points) - 1


def test_trust_region_maximiser_without_a_finite_maximiser_stops_at_the_bound_and_never_loses_ground():
    from fastep._search.optimize import maximize_log_likelihood_trust_region
    bounds = np.array([[-50.0, 50.0], [-1.0, 1.0]])
    theta, value, _ = maximize_log_likelihood_trust_region(lambda t: (float(t[0]), np.array([1.0, 0.0])),
                                                           np.zeros(2), bounds, maxiter=100)
    assert theta[0] == 50.0 and value == 50.0
    # only the start is finite: it is returned with its value
    start = np.array([0.3, -0.2])
    theta, value, _ = maximize_log_likelihood_trust_region(
        lambda t: (-1.0, np.ones(2)) if np.array_equal(t, start) else (-np.inf, np.zeros(2)),
        start, bounds, maxiter=20)
    np.testing.assert_array_equal(theta, start)
    assert value == -1.0
    with pytest.raises(ValueError, match="not finite at the starting point"):
        maximize_log_likelihood_trust_region(lambda t: (np.nan, np.zeros(2)), start, bounds)


def test_random_criterion_is_seeded_and_differs_from_greedy():
    X, f, _ = _toy(120, 11)
    y = np.where(f > 0.3, 1, 0)

    def fit(**kw):
        return IVMClassifier(RBF(), active_set_size=20, optimizer=None, **kw).fit(X, y).active_set_

    np.testing.assert_array_equal(fit(criterion="random", random_state=3), fit(criterion="random", random_state=3))
    assert not np.array_equal(fit(criterion="random", random_state=3), fit(criterion="random", random_state=4))
    assert not np.array_equal(fit(), fit(criterion="random", random_state=3))
    assert not np.array_equal(fit(), fit(criterion="info_gain"))


def test_get_params_and_repr():
    model = IVMClassifier(RBF(), active_set_size=5, criterion="info_gain")
    params = model.get_params()
    assert params["active_set_size"] == 5 and params["criterion"] == "info_gain"
    assert "info_gain" in repr(model)
    model.set_params(active_set_size=7)
    assert model.active_set_size == 7
    assert set(IVMRegressor().get_params()) >= {"noise_variance", "bias", "learn_noise", "active_set_size"}


def test_bad_input_names_the_argument_and_keeps_the_fitted_state():
    X, f, _ = _toy(40, 12)
    y = np.where(f > 0.3, 1, 0)
    model = IVMClassifier(RBF(), active_set_size=5, optimizer=None).fit(X, y)
    before = model.active_set_.copy()
    bad = [
        (dict(active_set_size=41), ValueError, "active_set_size"),
        (dict(active_set_size=0), ValueError, "active_set_size"),
        (dict(active_set_size=True), TypeError, "active_set_size"),
        (dict(criterion="largest"), ValueError, "criterion"),
        (dict(kernel="rbf"), TypeError, "kernel"),
        (dict(likelihood=Gaussian()), TypeError, "likelihood"),
        (dict(n_iterations=-1), ValueError, "n_iterations"),
        (dict(optimizer="sgd"), ValueError, "optimizer"),
        (dict(optimizer="scg"), ValueError, "optimizer"),
        (dict(random_state=-2), ValueError, "random_state"),
        (dict(verbose="yes"), TypeError, "verbose"),
        (dict(verbose=3), ValueError, "verbose"),
    ]
    for params, exc, word in bad:
        with pytest.raises(exc, match=word):
            IVMClassifier(RBF(), active_set_size=5, optimizer=None).set_params(**params).fit(X, y)
        with pytest.raises(exc, match=word):
            model.set_params(**params).fit(X, y)
        model.set_params(kernel=RBF(), likelihood=None, active_set_size=5, criterion="entropy", n_iterations=4,
                         optimizer=None, random_state=None, verbose=False)
        np.testing.assert_array_equal(model.active_set_, before)
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="X"):
        model.fit(Xn, y)
    with pytest.raises(ValueError, match="samples"):
        model.fit(X, y[:-1])
    with pytest.raises(ValueError, match="one class"):
        model.fit(X, np.ones(40))
    # a kernel whose diagonal is not positive (a zero input row under a linear kernel)
    Xz = X.copy()
    Xz[5] = 0.0
    with pytest.raises(ValueError, match="kernel"):
        model.set_params(kernel=Linear()).fit(Xz, y)
    np.testing.assert_array_equal(model.active_set_, before)
    model.set_params(kernel=RBF())
    with pytest.raises(ValueError, match="features"):
        model.predict(np.ones((3, 5)))
    with pytest.raises(ValueError, match="active_set_size"):
        IVMRegressor(active_set_size=41).fit(X, f)
    with pytest.raises(ValueError, match="noise_variance"):
        IVMRegressor(noise_variance=-1.0).fit(X, f)
    with pytest.raises(ValueError, match="one"):
        IVMOrdinalRegressor().fit(X, np.zeros(40))
    with pytest.raises(ValueError, match="n_categories"):
        IVMOrdinalRegressor(likelihood=OrderedCategorical(3)).fit(X, y)
    from fastep.exceptions import NotFittedError
    with pytest.raises(NotFittedError):
        IVMRegressor().predict(X)


def test_shared_budget_splits_one_active_set_budget_over_the_classes():
    rng = np.random.default_rng(21)
    X = rng.normal(size=(240, 2))
    y = np.argmax(np.column_stack([X[:, 0], -X[:, 0], X[:, 1]]) + 0.3 * rng.normal(size=(240, 3)), axis=1)
    shared = IVMClassifier(active_set_size=30, n_iterations=1, multi_class="shared_budget").fit(X, y)
    per_class = IVMClassifier(active_set_size=30, n_iterations=1).fit(X, y)
    assert shared.active_set_.shape == (3, 10)
    assert per_class.active_set_.shape == (3, 30)
    assert shared.score(X, y) > 0.8
    np.testing.assert_allclose(shared.predict_proba(X).sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="multi_class"):
        IVMClassifier(multi_class="joint").fit(X, y)
