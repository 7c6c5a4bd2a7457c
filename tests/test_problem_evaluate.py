"""Each family's ``evaluate``: a warm-started EP run that fails is retried from zero sites, and
the result is the cold start's."""
import numpy as np
import pytest

from fastep._dense.problem import DenseEPState, DenseGPProblem
from fastep._gp.problem import WARM_START_FAILURES
from fastep._sparse.problem import SparseEPState, _BinarySparseEP
from fastep.gp import GaussianProcessClassifier
from fastep.kernels import RBF
from fastep.likelihoods import Probit
from fastep.sparse import SparseGPClassifier


def _data(n=40):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] - 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def _dense_problem():
    X, y = _data()
    options = GaussianProcessClassifier(optimizer=None)._fit_options()
    return DenseGPProblem(RBF(1.0, 0.5), Probit(), X, y, options, False), (RBF(1.0, 0.5), Probit(), None)


def _sparse_problem():
    X, y = _data()
    Z = np.ascontiguousarray(X[::5])
    options = SparseGPClassifier(optimizer=None)._fit_options()
    return (_BinarySparseEP(RBF(1.0, 0.5), Probit(), Z, X, y, options, False, False),
            (RBF(1.0, 0.5), Probit(), None))


def _record_runs(problem, fail):
    """Make the problem's warm-started runs fail as ``fail`` says ('raise': a failure of
    WARM_START_FAILURES; 'site': a run that ends with a failed site); returns the list of the
    ``warm`` flags of its runs."""
    run = problem._ep
    starts = []

    def recorded(*args, **kwargs):
        warm = args[3] if len(args) > 3 else kwargs["warm"]
        starts.append(warm)
        if warm and fail == "raise":
            raise WARM_START_FAILURES[0]("improper cavity")
        state = run(*args, **kwargs)
        if warm and fail == "site":
            state = state._replace(info=state.info.replace(n_failed=1))
        return state

    problem._ep = recorded
    return starts


@pytest.mark.parametrize("make, state_type", [(_dense_problem, DenseEPState), (_sparse_problem, SparseEPState)])
@pytest.mark.parametrize("fail", ["raise", "site"])
def test_a_failed_warm_start_is_retried_cold(make, state_type, fail):
    cold, params = make()
    log_z, grad, info = cold.evaluate(params, gradient=True, warm=False)
    problem, _ = make()
    problem.evaluate(params, gradient=False, warm=False)        # sites to start warm from
    starts = _record_runs(problem, fail)
    warm_log_z, warm_grad, warm_info = problem.evaluate(params, gradient=True, warm=True)
    assert starts == [True, False]
    assert warm_info.n_failed == 0
    assert warm_log_z == log_z
    np.testing.assert_array_equal(warm_grad, grad)
    np.testing.assert_array_equal(problem.site_precision, cold.site_precision)
    assert state_type._fields[:2] == ("site_precision", "site_natural_mean")


@pytest.mark.parametrize("make", [_dense_problem, _sparse_problem])
def test_a_successful_warm_start_runs_once(make):
    problem, params = make()
    problem.evaluate(params, gradient=False, warm=False)
    starts = _record_runs(problem, None)
    problem.evaluate(params, gradient=False, warm=True)
    assert starts == [True]
    problem.restore_sites((np.zeros_like(problem.site_precision), np.zeros_like(problem.site_natural_mean)))
    problem.evaluate(params, gradient=False, warm=True)        # no sites to start warm from
    assert starts == [True, False]


def test_a_cold_run_that_fails_raises():
    problem, params = _dense_problem()
    starts = _record_runs(problem, "raise")
    problem.evaluate(params, gradient=False, warm=False)
    assert starts == [False]
    problem._ep = lambda *args, **kwargs: (_ for _ in ()).throw(np.linalg.LinAlgError("cold failure"))
    with pytest.raises(np.linalg.LinAlgError, match="cold failure"):
        problem.evaluate(params, gradient=False, warm=True)


@pytest.mark.parametrize("estimator, problem_class", [(GaussianProcessClassifier, DenseGPProblem),
                                                      (SparseGPClassifier, _BinarySparseEP)])
def test_engine_options_are_built_once_per_options_object(monkeypatch, estimator, problem_class):
    """A learning fit builds (and checks) its engine's options once for the search and once for
    the final run when that runs to another tolerance, not once per EP run; a fitted model saves
    and copies without them."""
    built = []
    original = problem_class._new_engine_options

    def counting(options):
        built.append(options.tol)
        return original(options)

    monkeypatch.setattr(problem_class, "_new_engine_options", staticmethod(counting))
    X, y = _data()
    model = estimator(RBF(1.0, 0.5)).fit(X, y)
    problem = model._problems[0]
    assert model.n_evaluations_ >= 3
    assert len(built) == len(set(built)) <= 2           # one per options object, never rebuilt
    assert built[-1] == problem.options.tol
    assert "_engine_options_for" in vars(problem)
    assert "_engine_options_for" not in problem.__getstate__()
