"""Fits change no process-wide state: concurrent fits equal serial ones bit for bit, and the BLAS
thread counts another thread sees stay as they were while a fit runs."""
import ast
import pathlib
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import fastep
from support import ESTIMATORS as REGISTRY
from fastep.kernels import RBF


def _classification(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] + 0.5 * np.sin(3 * X[:, 1]) + 0.3 * rng.normal(size=n) > 0, 1, 0)
    return X, y


def _regression(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=n)


def _sparse_regression(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[:3] = (3.0, -2.0, 1.5)
    return X, X @ w + 0.3 * rng.normal(size=n)


def _rank_k(n, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2, d))
    return X, np.einsum("ikd,d->ik", X, rng.normal(size=d)) + 0.1 * rng.normal(size=(n, 2))


def _multitask(n, d, seed):
    tasks = [_sparse_regression(n, d, seed + t) for t in range(2)]
    return [X for X, _ in tasks], [y for _, y in tasks]


# Sizes at which OpenBLAS runs some of each fit's calls on several threads (n x n and d x d
# matrices of a few hundred), so that a thread count changed by another fit would show.
CASES = {
    "GaussianProcessClassifier": (lambda: fastep.GaussianProcessClassifier(RBF()), _classification, (300, 4)),
    "GaussianProcessClassifier-3": (lambda: fastep.GaussianProcessClassifier(RBF(), optimizer=None),
                                    lambda n, d, s: (_classification(n, d, s)[0],
                                                     np.digitize(_classification(n, d, s)[0][:, 0], [-0.5, 0.5])),
                                    (250, 3)),
    "GaussianProcessRegressor": (lambda: fastep.GaussianProcessRegressor(RBF()), _regression, (200, 3)),
    "SparseGPClassifier": (lambda: fastep.SparseGPClassifier(n_inducing=15), _classification, (400, 3)),
    "SparseGPRegressor": (lambda: fastep.SparseGPRegressor(n_inducing=15), _regression, (400, 3)),
    "IVMClassifier": (lambda: fastep.IVMClassifier(active_set_size=150, n_iterations=2), _classification, (1500, 4)),
    "IVMRegressor": (lambda: fastep.IVMRegressor(active_set_size=150, n_iterations=2), _regression, (1500, 4)),
    "IVMOrdinalRegressor": (lambda: fastep.IVMOrdinalRegressor(active_set_size=100, n_iterations=1),
                            lambda n, d, s: (_regression(n, d, s)[0],
                                             np.digitize(_regression(n, d, s)[1], [-0.5, 0.5])),
                            (800, 3)),
    "LinearEPClassifier": (lambda: fastep.LinearEPClassifier(), _classification, (2000, 300)),
    "LinearEPRegressor": (lambda: fastep.LinearEPRegressor(), _regression, (2000, 300)),
    "LinearEPRankK": (lambda: fastep.LinearEPRankK(), _rank_k, (1000, 200)),
    "HorseshoeRegression": (lambda: fastep.HorseshoeRegression(max_optimizer_iter=5), _sparse_regression, (150, 300)),
    "MultiTaskHorseshoeRegression": (lambda: fastep.MultiTaskHorseshoeRegression(max_optimizer_iter=3, n_components=2,
                                                                               random_state=0),
                                     _multitask, (100, 200)),
}


# The longest fits are in the slow tier; the default tier keeps, for each check, a case of every
# compiled engine family (dense, sparse, IVM selection, weight space, rank-k).
_SLOW_CASES = {"HorseshoeRegression", "MultiTaskHorseshoeRegression", "IVMRegressor", "IVMOrdinalRegressor",
               "LinearEPClassifier"}
# four fits in three threads at once: the dense GP's learning fits are the longest of them
_SLOW_CONCURRENT = _SLOW_CASES | {"GaussianProcessClassifier", "GaussianProcessClassifier-3", "IVMClassifier"}
# the fits watched by a second thread: the IVM classifier and the linear regressor at these sizes
_SLOW_COUNTS = _SLOW_CASES | {"IVMClassifier", "LinearEPRegressor"}


def _case_params(slow):
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in CASES]


def test_every_registered_estimator_has_a_threading_case():
    assert {case.split("-")[0] for case in CASES} == set(REGISTRY)


def _fit(name, seed=0):
    make, data, (n, d) = CASES[name]
    X, y = data(n, d, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        return make().fit(X, y), X


def _outputs(model, X):
    """Every fitted array and every prediction, as bytes (bitwise comparison)."""
    out = {}
    for key, value in sorted(vars(model).items()):
        if key == "history_":                   # IVM progress records carry wall-clock times
            value = [{k: v for k, v in entry.items() if k != "elapsed"} for entry in value]
        if key.endswith("_") and not key.startswith("_"):
            out[key] = repr(value) if not isinstance(value, np.ndarray) else value.tobytes()
    if isinstance(model, fastep.LinearEPRankK):
        return out
    if isinstance(X, list):                     # multi-task: one prediction per task
        out["predict"] = np.concatenate(model.predict([Xt[:50] for Xt in X])).tobytes()
        return out
    for method in ("predict", "predict_proba", "decision_function"):
        if hasattr(model, method):
            out[method] = np.asarray(getattr(model, method)(X[:50])).tobytes()
    return out


@pytest.mark.parametrize("name", _case_params(_SLOW_CONCURRENT))
def test_concurrent_fits_are_bitwise_identical_to_a_serial_fit(name):
    serial = _outputs(*_fit(name))
    with ThreadPoolExecutor(max_workers=3) as pool:
        concurrent = list(pool.map(lambda _: _outputs(*_fit(name)), range(3)))
    for result in concurrent:
        assert result.keys() == serial.keys()
        for key in serial:
            assert result[key] == serial[key], f"{name}: {key} differs between a concurrent and a serial fit"


def _blas_threads():
    return {info["filepath"]: info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}


@pytest.mark.parametrize("name", _case_params(_SLOW_COUNTS))
def test_a_fit_leaves_the_thread_counts_other_threads_see_unchanged(name):
    before = _blas_threads()
    assert before, "no BLAS library found by threadpoolctl"
    seen = []
    worker = threading.Thread(target=_fit, args=(name,))
    worker.start()
    A = np.random.default_rng(0).normal(size=(200, 200))
    while worker.is_alive():
        seen.append(_blas_threads())
        A @ A                                   # the host application's own numpy work
        time.sleep(0.002)
    worker.join()
    seen.append(_blas_threads())
    assert len(seen) >= 2
    for snapshot in seen:
        assert snapshot == before


# -- the source follows the policy -----------------------------------------------------------
_PACKAGE = pathlib.Path(fastep.__file__).parent
# generating the demo data set is not a fit: it may use numpy's BLAS
_NOT_A_FIT = {"datasets.py"}


def _package_sources():
    return sorted(p for p in _PACKAGE.rglob("*.py") if "reference" not in p.parts and p.name not in _NOT_A_FIT)


def _blas_outside_linalg(tree):
    """Line numbers of numpy BLAS/LAPACK use: ``@``, ``np.dot``, ``np.linalg.<function>``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            value = node.func.value
            if node.func.attr in ("dot", "matmul", "inner", "tensordot") and isinstance(value, ast.Name) \
                    and value.id in ("np", "numpy"):
                lines.append(node.lineno)
            if isinstance(value, ast.Attribute) and value.attr == "linalg" and isinstance(value.value, ast.Name) \
                    and value.value.id in ("np", "numpy") and node.func.attr != "LinAlgError":
                lines.append(node.lineno)
    return lines


def test_the_package_computes_products_on_one_blas_library():
    """Every product and factorisation of a fit goes through fastep._linalg (scipy's BLAS, the one
    the compiled core links): numpy's own OpenBLAS pool never wakes during a fit."""
    offenders = {}
    for path in _package_sources():
        if path.name == "_linalg.py":
            continue
        lines = _blas_outside_linalg(ast.parse(path.read_text(), filename=str(path)))
        if lines:
            offenders[str(path.relative_to(_PACKAGE))] = lines
    assert not offenders, f"numpy BLAS calls outside fastep._linalg: {offenders}"


def test_the_scan_finds_what_it_looks_for():
    tree = ast.parse("import numpy as np\na = b @ c\nd = np.dot(a, b)\ne = np.linalg.solve(a, b)\n"
                     "ok = np.linalg.LinAlgError\n")
    assert _blas_outside_linalg(tree) == [2, 3, 4]


# fastep.batch.fit_many(n_jobs=k) fixes one BLAS thread per pool worker for the duration of the
# call, at the caller's request (documented there); no other module touches a thread count.
_SETS_THREADS_ON_REQUEST = {"batch.py"}


def test_no_module_changes_thread_counts():
    offenders = []
    for path in _package_sources():
        if path.name in _SETS_THREADS_ON_REQUEST:
            continue
        text = path.read_text()
        for needle in ("threadpool_limits", "ThreadpoolController", "set_num_threads", "omp_set_num_threads"):
            if needle in text:
                offenders.append(f"{path.relative_to(_PACKAGE)}: {needle}")
    assert not offenders, offenders
