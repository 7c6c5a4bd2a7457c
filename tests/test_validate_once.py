"""Inputs are validated once, at the public entry.

The estimators' inner loops (every optimiser step) call the kernels' implementation methods and
build the engines with ``validate=False``; these must give bit for bit what the public kernel
methods and the validated engines give, and the validated engines keep rejecting bad input for
direct callers.
"""
import warnings

import numpy as np
import pytest

import fastep
from engine_helpers import dense_ep, linear_ep as linear_engine, sparse_ep as sparse_engine
from fastep._epcore import gp_ep, linear_ep, sparse_ep, student_t_ep
from fastep.kernels import MLP, RBF, RBFARD, Bias, Kernel, KernelColumns, Linear, LinearARD, MLPARD, White
from fastep.likelihoods import Probit, StudentT


def _kernels(d):
    return {
        "RBF": RBF(1.3, 0.7),
        "RBFARD": RBFARD(np.linspace(0.2, 0.9, d), variance=0.8),
        "Linear": Linear(0.5),
        "LinearARD": LinearARD(np.linspace(0.3, 0.8, d)),
        "MLP": MLP(1.1, 0.9, 0.4),
        "MLPARD": MLPARD(np.linspace(0.3, 0.8, d)),
        "sum": RBF(1.0, 0.5) + Linear(0.2) + Bias(0.3) + White(0.1),
        "product": RBF(1.0, 0.5) * (Linear(0.2) + Bias(0.5)),
    }


@pytest.mark.parametrize("name", list(_kernels(3)))
def test_kernel_implementation_methods_equal_the_public_methods(name):
    # what the estimators call on inputs they validated once (the implementation methods)
    # gives bit for bit what the public, validating methods give
    rng = np.random.default_rng(7)
    d = 3
    kernel = _kernels(d)[name]
    X = rng.normal(size=(30, d))
    Z = rng.normal(size=(6, d))
    W = rng.normal(size=(6, 30))
    slots = list(range(kernel.n_theta))
    assert np.array_equal(kernel._K(X, None), kernel(X))
    assert np.array_equal(kernel._K(X, Z), kernel(X, Z))
    assert np.array_equal(kernel._diag(X), kernel.diag(X))
    K, dK = kernel(X, eval_gradient=True)
    dK2 = np.empty_like(dK)
    K2 = kernel._value_and_gradient(X, dK2)
    assert np.array_equal(K, K2) and np.array_equal(dK, dK2)
    for a, b in zip(kernel.gradient_iter(X), kernel._grads(X, slots), strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(kernel.cross_gradient_iter(Z, X), kernel._cross_grads(Z, X, slots), strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(kernel.diag_gradient(X), np.column_stack(list(kernel._diag_grads(X, slots))))
    assert np.array_equal(kernel.input_gradient(Z, X, W), kernel._input_grad(Z, X, W))
    cols, cols2 = kernel.columns(X), KernelColumns(kernel, X, None)
    for j in (0, 11, 29):
        assert np.array_equal(cols(j), cols2(j))


def test_public_kernel_methods_still_reject_bad_input():
    kernel = RBF()
    with pytest.raises(ValueError, match="X"):
        kernel(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="Y"):
        kernel(np.ones((2, 2)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="X"):
        kernel.diag(np.ones(3))
    with pytest.raises(ValueError, match="columns"):
        RBFARD([0.5, 0.5]).diag_gradient(np.ones((4, 3)))


def _dense_run(validate, K, y, spec, tau, nu, buf, mean, *, post_var=None, cavity_mean=None,
               cavity_var=None, **options):
    """One run of the dense engine; ``validate=False`` is the estimators' path (checked arrays)."""
    engine = dense_ep(K, y, spec, validate=validate, **options)
    return engine.run(tau, nu, buf, mean, post_var=post_var, cavity_mean=cavity_mean,
                      cavity_var=cavity_var)


def _sparse_run(validate, Vt, d, y, spec, tau, nu, R, w, *, g_mean=None, g_var=None, **options):
    engine = sparse_engine(Vt, d, y, spec, validate=validate, **options)
    return engine.run(tau, nu, R, w, g_mean=g_mean, g_var=g_var)


def _gp_problem(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    K = RBF(1.0, 1.0)(X) + 1e-6 * np.eye(n)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return K, y


@pytest.mark.parametrize("schedule", [gp_ep.SCHEDULE_SEQUENTIAL, gp_ep.SCHEDULE_PARALLEL, gp_ep.SCHEDULE_BLOCKED])
def test_gp_ep_unvalidated_state_is_bitwise_the_validated_one(schedule):
    K, y = _gp_problem(60, 1)
    spec = Probit().site_spec()
    outs = []
    for validate in (True, False):
        tau, nu = np.zeros(60), np.zeros(60)
        buf, mean, var, cm, cv = np.empty((60, 60)), np.empty(60), np.empty(60), np.empty(60), np.empty(60)
        info = _dense_run(validate, K, y, spec, tau, nu, buf, mean, schedule=schedule, tol=1e-10, max_sweeps=50,
                          damping=0.7 if schedule == gp_ep.SCHEDULE_PARALLEL else 1.0,
                          output=gp_ep.OUTPUT_FACTOR, post_var=var, cavity_mean=cm, cavity_var=cv)
        outs.append((info, tau, nu, buf, mean, var, cm, cv))
    (info_a, *arrays_a), (info_b, *arrays_b) = outs
    assert info_a == info_b
    for a, b in zip(arrays_a, arrays_b):
        assert np.array_equal(a, b)


def test_gp_ep_validated_state_still_rejects_bad_input():
    K, y = _gp_problem(5, 2)
    K[0, 1] += 1e-3
    with pytest.raises(ValueError, match="symmetric"):
        gp_ep.DenseEP(K, y, Probit().site_spec())
    K, y = _gp_problem(5, 2)
    with pytest.raises(ValueError, match="damping"):
        gp_ep.DenseEPOptions(damping=0.0)
    engine = gp_ep.DenseEP(K, y, Probit().site_spec())
    with pytest.raises(ValueError, match="site_precision must be >= 0"):
        engine.run(-np.ones(5), np.zeros(5), np.empty((5, 5)), np.empty(5))


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
@pytest.mark.parametrize("schedule", [sparse_ep.SPARSE_SEQUENTIAL, sparse_ep.SPARSE_PARALLEL])
def test_sparse_ep_unvalidated_state_is_bitwise_the_validated_one(approximation, schedule):
    rng = np.random.default_rng(3)
    X, Z = rng.normal(size=(80, 2)), rng.normal(size=(7, 2))
    kernel = RBF(1.0, 0.8)
    Kmm, Knm, kdiag = kernel(Z), kernel(X, Z), kernel.diag(X)
    y = np.where(X[:, 1] > 0, 1.0, -1.0)
    proj_a = sparse_ep.sparse_projection(Kmm, Knm, kdiag, approximation=approximation, jitter=1e-6)
    proj_b = sparse_ep.sparse_projection(Kmm, Knm.copy(), kdiag, approximation=approximation, jitter=1e-6,
                                         overwrite_knm=True)
    for a, b in zip(proj_a, proj_b):
        assert np.array_equal(a, b)
    _, Vt, d = proj_a
    spec = Probit(slope=2.0).site_spec()
    outs = []
    for validate in (True, False):
        tau, nu, R, w, gm, gv = np.zeros(80), np.zeros(80), np.empty((7, 7)), np.empty(7), np.empty(80), np.empty(80)
        info = _sparse_run(validate, Vt, d, y, spec, tau, nu, R, w, power=0.5, schedule=schedule, tol=1e-9,
                           max_sweeps=40, damping=0.5 if schedule == sparse_ep.SPARSE_PARALLEL else 1.0,
                           g_mean=gm, g_var=gv)
        outs.append((info, tau, nu, R, w, gm, gv))
    (info_a, *arrays_a), (info_b, *arrays_b) = outs
    assert info_a == info_b
    for a, b in zip(arrays_a, arrays_b):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="approximation"):
        sparse_ep.sparse_projection(Kmm, Knm, kdiag, approximation="vfe")
    Knm_bad = Knm.copy()
    Knm_bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="Knm must be finite"):
        sparse_ep.sparse_projection(Kmm, Knm_bad, kdiag, overwrite_knm=True)
    assert np.isnan(Knm_bad[3, 2]) and np.array_equal(np.delete(Knm_bad.ravel(), 3 * 7 + 2),
                                                      np.delete(Knm.ravel(), 3 * 7 + 2))   # not overwritten
    with pytest.raises(ValueError, match="tol"):
        sparse_ep.SparseEPOptions(tol=0.0)


def _robust_problem(n, seed):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(x) + 0.1 * rng.normal(size=n)
    y[::7] += 4.0
    return x, y


def _same_runs(outs):
    (info_a, *arrays_a), *rest = outs
    for info_b, *arrays_b in rest:
        assert info_a == info_b
        for a, b in zip(arrays_a, arrays_b, strict=True):
            assert np.array_equal(a, b)


def test_student_t_engines_unvalidated_and_reused_are_bitwise_the_validated_ones():
    # the estimators' path (validate=False) and a second run of the same engine equal a
    # validated engine bit for bit; the dense run also with its optional outputs left out
    x, y = _robust_problem(40, 5)
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(40)
    options = student_t_ep.StudentTEPOptions(power=0.5, damping=0.7, tol=1e-8, max_sweeps=60, max_halvings=6)
    engine = student_t_ep.DenseStudentTEP(K, y, 3.0, 0.1, options, validate=False)
    outs = []
    for run in ("validated", "engine", "engine"):
        tau, nu, mean, var, cm, cv, cov = (np.zeros(40), np.zeros(40), *np.empty((4, 40)), np.empty((40, 40)))
        on = student_t_ep.DenseStudentTEP(K, y, 3.0, 0.1, options) if run == "validated" else engine
        info = on.run(tau, nu, mean, var, cavity_mean=cm, cavity_var=cv, post_cov=cov)
        outs.append((info, tau, nu, mean, var, cm, cv, cov))
    tau, nu, mean, var = np.zeros(40), np.zeros(40), np.empty(40), np.empty(40)
    outs.append((engine.run(tau, nu, mean, var), tau, nu, mean, var, *outs[0][5:]))
    _same_runs(outs)
    assert np.any(outs[0][1] < 0) and outs[0][0].converged

    Z = np.linspace(-3, 3, 9)
    kernel = RBF(1.0, 1.0)
    _, Vt, d = sparse_ep.sparse_projection(kernel(Z[:, None]), kernel(x[:, None], Z[:, None]), np.ones(40),
                                           jitter=1e-8)
    spec = StudentT(dof=4.0, scale=0.1).site_spec()
    engine = student_t_ep.SparseStudentTEP(Vt, d, y, spec, options, validate=False)
    outs = []
    for run in ("validated", "engine", "engine"):
        tau, nu, R, w, gm, gv = np.zeros(40), np.zeros(40), np.empty((9, 9)), np.empty(9), np.empty(40), np.empty(40)
        on = student_t_ep.SparseStudentTEP(Vt, d, y, spec, options) if run == "validated" else engine
        info = on.run(tau, nu, R, w, g_mean=gm, g_var=gv)
        outs.append((info, tau, nu, R, w, gm, gv))
    _same_runs(outs)
    with pytest.raises(ValueError, match="damping"):
        student_t_ep.StudentTEPOptions(damping=0.0)
    with pytest.raises(ValueError, match="dof"):
        student_t_ep.DenseStudentTEP(K, y, -1.0, 0.1)


def test_linear_ep_unvalidated_state_is_bitwise_the_validated_one():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(120, 5))
    y = np.where(X @ rng.normal(size=5) > 0, 1.0, -1.0)
    m0, V0 = np.zeros(5), np.eye(5)
    spec = Probit().site_spec()
    outs = []
    for validate in (True, False):
        engine = linear_engine(X, y, m0, V0, spec, tol=1e-10, max_sweeps=50, validate=validate)
        tau, nu, mean, cov = np.zeros(120), np.zeros(120), np.empty(5), np.empty((5, 5))
        info = engine.run(tau, nu, mean, cov)
        outs.append((info, engine.log_evidence(tau, nu, mean, cov), tau, nu, mean, cov))
    (info_a, *arrays_a), (info_b, *arrays_b) = outs
    assert info_a == info_b
    for a, b in zip(arrays_a, arrays_b):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="finite"):
        X_bad = X.copy()
        X_bad[3, 1] = np.inf
        linear_ep.LinearEP(X_bad, y, m0, V0, spec).run(np.zeros(120), np.zeros(120), np.empty(5), np.empty((5, 5)))


#: The engine classes the estimators build, by module.
_ENGINES = ((gp_ep, "DenseEP"), (sparse_ep, "SparseEP"), (linear_ep, "LinearEP"),
            (student_t_ep, "DenseStudentTEP"), (student_t_ep, "SparseStudentTEP"))


def _count_validations(monkeypatch):
    """Count the kernel's input checks and the validated engine builds (``validate=True``)."""
    calls = {"kernel": 0, "validated engines": 0}
    original = Kernel._validate_X

    def counting(self, X, name):
        calls["kernel"] += 1
        return original(self, X, name)

    monkeypatch.setattr(Kernel, "_validate_X", counting)
    for module, name in _ENGINES:
        engine_class = getattr(module, name)

        def build(*args, _cls=engine_class, validate=True, **kwargs):
            calls["validated engines"] += bool(validate)
            return _cls(*args, validate=validate, **kwargs)

        monkeypatch.setattr(module, name, build)
    return calls


@pytest.mark.parametrize("make", [
    lambda: fastep.GaussianProcessClassifier(RBF()),
    lambda: fastep.GaussianProcessRegressor(RBF()),
    lambda: fastep.SparseGPClassifier(n_inducing=8),
    lambda: fastep.SparseGPRegressor(n_inducing=8),
    lambda: fastep.IVMClassifier(active_set_size=20, n_iterations=3),
], ids=["GPC", "GPR", "SGPC", "SGPR", "IVM"])
def test_a_fit_validates_X_once_however_many_optimiser_steps(make, monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 2))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=80) > 0, 1, 0)
    est = make()
    if isinstance(est, fastep.GaussianProcessRegressor | fastep.SparseGPRegressor):
        y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=80)
    calls = _count_validations(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        est.fit(X, y)
    # type-II ML evaluated the objective many times; X was checked by the kernel once, at
    # the estimator's entry (its shape against the kernel's number of features)
    assert calls["kernel"] == 1, calls
    assert calls["validated engines"] == 0, calls
    assert est.predict(X[:5]).shape == (5,)         # checked against n_features_in_ instead
    assert calls["kernel"] == 1, calls
