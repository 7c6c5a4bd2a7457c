"""The IVM keeps the kernel columns' parameter-free products between the selections of Algorithm 2."""
import numpy as np
import pytest

import fastep._ivm.problem as ivm_problem
import fastep.ivm as fivm
from fastep import IVMClassifier
from fastep.kernels import MLP, RBF, RBFARD, Bias, Linear, White


def _data(n=160, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = np.where(np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1, -1)
    return X, y


def _uncached(problem):
    return problem.kernel.columns(problem.X)


@pytest.mark.parametrize("kernel", [RBF(1.0, 0.3) + Linear(0.2) + White(0.1) + Bias(0.1),
                                    MLP(1.0, 0.5, 1.0) + Linear(0.2) + White(0.1) + Bias(0.1)],
                         ids=["rbf", "mlp"])
def test_algorithm2_is_bitwise_unchanged_by_the_cache(kernel, monkeypatch):
    X, y = _data()
    kwargs = dict(active_set_size=30, n_iterations=2, learn_likelihood=True, max_optimizer_iter=15)
    cached = IVMClassifier(kernel, **kwargs).fit(X, y)
    monkeypatch.setattr(ivm_problem._IVMProblem, "_columns", _uncached)
    plain = IVMClassifier(kernel, **kwargs).fit(X, y)
    np.testing.assert_array_equal(cached.active_set_, plain.active_set_)
    np.testing.assert_array_equal(cached.site_mean_, plain.site_mean_)
    np.testing.assert_array_equal(cached.site_precision_, plain.site_precision_)
    np.testing.assert_array_equal(cached.kernel_.theta, plain.kernel_.theta)
    assert cached.log_likelihood_ == plain.log_likelihood_


def test_cache_is_reused_bounded_and_dropped(monkeypatch):
    X, y = _data()
    seen = []
    select = ivm_problem._IVMProblem.select

    def spy(problem, *args):
        out = select(problem, *args)
        seen.append((problem.product_cache.hits, problem.product_cache.misses, problem.product_cache.n_stored))
        return out

    monkeypatch.setattr(ivm_problem._IVMProblem, "select", spy)
    model = IVMClassifier(RBF(1.0, 0.3) + Linear(0.2) + White(0.1), active_set_size=20, n_iterations=2,
                          learn_likelihood=True, max_optimizer_iter=10, kernel_objective="active_set").fit(X, y)
    assert len(seen) == 5                              # 2 x (kernel, noise) + the final selection
    hits, misses, stored = seen[-1]
    assert hits + misses == 5 * 20
    assert hits > misses                               # reselection mostly finds the same points
    assert stored <= 2 * 20
    assert model._problems[0].product_cache is None    # finalize drops the O(d n) state


def test_ard_kernel_still_matches_uncached_selection(monkeypatch):
    # RBFARD computes its own scaled product; the cache then serves the Linear term only,
    # through the centred product (equal to rounding, so compare the fitted models loosely).
    X, y = _data(120, 3)
    kernel = RBFARD([0.5, 0.5], ard_groups=[0, 0, 1, 1, 1], inverse_width=0.5) + Linear(0.2) + White(0.1)
    kwargs = dict(active_set_size=25, optimizer=None)
    cached = IVMClassifier(kernel, **kwargs).fit(X, y)
    monkeypatch.setattr(ivm_problem._IVMProblem, "_columns", _uncached)
    plain = IVMClassifier(kernel, **kwargs).fit(X, y)
    np.testing.assert_array_equal(cached.active_set_, plain.active_set_)
    np.testing.assert_allclose(cached.site_mean_, plain.site_mean_, rtol=1e-10, atol=1e-12)


def test_one_vs_rest_prediction_includes_the_learnt_bias():
    # With learn_likelihood each binary problem learns its own probit bias; predict must rank
    # the classes by μ* + b (what each binary classifier thresholds), not by μ* alone.
    rng = np.random.default_rng(7)
    centres = np.array([[0.0, 0.0], [2.5, 0.0], [0.0, 2.5]])
    labels = rng.integers(0, 3, size=240)
    X = centres[labels] + rng.normal(size=(240, 2))
    model = IVMClassifier(RBF(1.0, 0.5) + Bias(0.5), active_set_size=30, n_iterations=1,
                          learn_likelihood=True, max_optimizer_iter=20).fit(X[:180], labels[:180])
    biases = np.array([lik.bias for lik in model.likelihood_])
    assert np.ptp(biases) > 0                          # the classes learnt different biases
    mean, _ = model.predict_latent(X[180:])
    np.testing.assert_array_equal(model.decision_function(X[180:]), mean + biases)
    np.testing.assert_array_equal(model.predict(X[180:]), np.argmax(mean + biases, axis=1))


def test_a_single_selection_keeps_no_products(monkeypatch):
    # optimizer=None and select_active_set select once: the cache would only add O(d n)
    # memory beside M (at N = 1e6, d = 500 it would double the 4 GB budget)
    X, y = _data()

    def forbidden(*args, **kwargs):
        raise AssertionError("a ColumnProductCache was built for a single selection")

    monkeypatch.setattr(ivm_problem, "ColumnProductCache", forbidden)
    model = IVMClassifier(RBF(1.0, 0.3) + White(0.1), active_set_size=20, optimizer=None).fit(X, y)
    active = fivm.select_active_set(X, np.where(y > 0, 1.0, -1.0), RBF(1.0, 0.3) + White(0.1),
                                    fivm.Probit(), 20)
    np.testing.assert_array_equal(model.active_set_, active)
