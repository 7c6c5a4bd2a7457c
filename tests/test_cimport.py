"""The installed .pxd files let downstream Cython code cimport the compiled kernels."""
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import Cython  # noqa: F401  (part of the test extras: the downstream compiler)
import numpy as np
import pytest

import fastep
from fastep import Probit


def test_get_include_holds_the_pxd_files():
    include = fastep.get_include()
    for name in ("__init__.pxd", "_blas.pxd", "sites.pxd", "linear_ep.pxd", "rank_k_ep.pxd"):
        assert os.path.isfile(os.path.join(include, "fastep", "_epcore", name)), name


@pytest.mark.downstream
def test_downstream_cython_can_cimport_the_kernels(tmp_path):
    # site-packages for a normal install, the meson build folder's include/ for an editable one
    package_root = fastep.get_include()
    src = tmp_path / "downstream.pyx"
    src.write_text(textwrap.dedent("""
        # cython: language_level=3
        from fastep._epcore._blas cimport syr, symv, potrf
        from fastep._epcore.sites cimport SiteModel, SiteSpec, site_moments, LIK_PROBIT, SITE_OK

        def probit_log_z(SiteSpec spec, double y, double mean, double var):
            cdef double log_z, alpha, beta
            cdef int status
            with nogil:
                status = site_moments(&spec.model, y, mean, var, &log_z, &alpha, &beta)
            return status, log_z
    """))
    res = subprocess.run(
        [sys.executable, "-m", "cython", "-3", "-I", package_root, str(src), "-o", str(tmp_path / "out.c")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "out.c").stat().st_size > 0


@pytest.mark.downstream
def test_downstream_cython_can_cimport_the_ivm_engine(tmp_path):
    # ivm_refine.pxd cimports ivm.pxd: both must be installed beside each other
    package_root = fastep.get_include()
    for name in ("ivm.pxd", "ivm_refine.pxd"):
        assert os.path.isfile(os.path.join(package_root, "fastep", "_epcore", name)), name
    src = tmp_path / "downstream_ivm.pyx"
    src.write_text(textwrap.dedent("""
        # cython: language_level=3
        from fastep._epcore.ivm cimport IVMArrays, ivm_include, IVM_OK
        from fastep._epcore.ivm_refine cimport KernelRows, refactorize

        def active_count(int k):
            cdef IVMArrays a
            a.k = k
            return a.k, IVM_OK
    """))
    res = subprocess.run(
        [sys.executable, "-m", "cython", "-3", "-I", package_root, str(src), "-o", str(tmp_path / "out.c")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.downstream
def test_downstream_cython_can_cimport_the_student_t_engines(tmp_path):
    package_root = fastep.get_include()
    src = tmp_path / "downstream_student_t.pyx"
    src.write_text(textwrap.dedent("""
        # cython: language_level=3
        from fastep._epcore.student_t_ep cimport (DenseStudentTEP, SparseStudentTEP, StudentTEPResult,
                                                  FractionalStep, fractional_ep_sweeps, robust_factor)

        def options(DenseStudentTEP dense, SparseStudentTEP sparse):
            return dense.n, dense.power, dense.max_halvings, sparse.m, sparse.sweep.damping

        def halvings(StudentTEPResult result):
            return result.n_sweeps, result.n_halvings, result.stuck
    """))
    res = subprocess.run(
        [sys.executable, "-m", "cython", "-3", "-I", package_root, str(src), "-o", str(tmp_path / "out.c")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "out.c").stat().st_size > 0


# --- the engine state classes, cimported, typed and run ---------------------------------------
# One downstream module for the engine states declared in gp_ep.pxd, sparse_ep.pxd,
# linear_ep.pxd, ivm.pxd and multiclass_ep.pxd: typed variables read the declared fields (through the object
# layout the .pxd promises) and call the engines; IVMEP's cdef methods go through the
# vtable declared in ivm.pxd. Built once per module (cython, then the C compiler).
_ENGINE_STATES_PYX = """
    # cython: language_level=3
    from fastep._epcore.gp_ep cimport DenseEP, DenseEPResult
    from fastep._epcore.sparse_ep cimport SparseEP, SparseEPResult
    from fastep._epcore.linear_ep cimport LinearEP
    from fastep._epcore.ivm cimport IVMEP, IVMArrays
    from fastep._epcore.ivm_refine cimport fetch_column
    from fastep._epcore.sites cimport SiteSpec
    from fastep._epcore._common cimport SweepResult
    from fastep._epcore.multiclass_ep cimport (MultinomialEP, MultinomialResult, InnerEP, NestedSiteOptions,
                                               nested_site, nested_work_size)
    from libc.stdlib cimport malloc, free

    def dense_run(obj, tau, nu, post_cov, post_mean):
        cdef DenseEP engine = obj
        cdef SiteSpec spec = engine.spec
        fields = (engine.n, engine.sweep.schedule, engine.sweep.order, engine.sweep.damping, engine.sweep.tol,
                  engine.sweep.max_sweeps, engine.sweep.negative_precision, engine.block_size,
                  engine.refactor_every, engine.output, engine.validate, spec, engine.K, engine.y)
        cdef DenseEPResult result = engine.run(tau, nu, post_cov, post_mean)
        cdef SweepResult base = result
        return fields, result, (base.n_sweeps, result.block_size)

    def sparse_run(obj, tau, nu, post_factor, post_w_mean):
        cdef SparseEP engine = obj
        fields = (engine.n, engine.m, engine.power, engine.n_quadrature, engine.sweep.schedule,
                  engine.sweep.order, engine.sweep.damping, engine.sweep.tol, engine.sweep.max_sweeps,
                  engine.sweep.negative_precision, engine.validate, engine.spec, engine.Vt, engine.d,
                  engine.y, engine.quadrature is not None)
        cdef SparseEPResult result = engine.run(tau, nu, post_factor, post_w_mean)
        return fields, result, (result.n_sweeps, result.n_rebuilds)

    def linear_run(obj, tau, nu, post_mean, post_cov):
        cdef LinearEP engine = obj
        fields = (engine.update_form, engine.sweep.damping, engine.sweep.tol, engine.sweep.max_sweeps,
                  engine.refresh_every, engine.sweep.negative_precision, engine.algorithm,
                  engine.block_size, engine.validate, engine.spec, engine.X, engine.y,
                  engine.prior_mean, engine.prior_cov)
        result = engine.run(tau, nu, post_mean, post_cov)
        return fields, result, engine.log_evidence(tau, nu, post_mean, post_cov)

    def nested_run(obj, alpha, beta):
        cdef MultinomialEP engine = obj
        fields = (engine.n, engine.n_classes, engine.damping, engine.adaptive_damping, engine.tol,
                  engine.max_sweeps, engine.validate, engine.labels, engine.posterior_of)
        cdef MultinomialResult result = engine.run(alpha, beta)
        cdef SweepResult base = result
        return fields, result, (base.n_sweeps, base.log_z, result.final_damping), engine.posterior

    def nested_one_site(InnerEP inner, int n_classes, int label, double[:, ::1] cav_prec, double[::1] cav_lin,
                        double[::1] alpha, double[::1] beta):
        # nested_site through the options struct that InnerEP holds
        cdef NestedSiteOptions opts = inner.options
        cdef double log_z = 0.0
        cdef int status
        cdef double* work = <double*>malloc(nested_work_size(n_classes) * sizeof(double))
        opts.n_classes = n_classes
        with nogil:
            status = nested_site(&opts, label, &cav_prec[0, 0], &cav_lin[0], &alpha[0], &beta[0], &log_z, work)
        free(work)
        return status, log_z

    def ivm_select(obj, int n_points, column_fn):
        # IVMEP.select step by step through the cdef methods declared in ivm.pxd
        cdef IVMEP state = obj
        cdef IVMArrays* a = &state.a
        cdef int step, best
        chosen = []
        for step in range(n_points):
            best = state._score_all()
            state._include(best, fetch_column(column_fn, best, a.n, False), True)
            chosen.append(best)
        state._fill_scores()
        fields = (a.n, a.d_max, a.k, state.sigma2, state.criterion, state.n_deferred,
                  state.spec, state.post_var, state.post_mean, state.site_mean,
                  state.site_precision, state.is_active, state.diag_k, state.y)
        return fields, chosen
"""


@pytest.fixture(scope="module")
def engine_states_c(tmp_path_factory):
    """The downstream module cythonized against the installed .pxd files: its C file."""
    tmp_path = tmp_path_factory.mktemp("engine_states")
    src = tmp_path / "downstream_engines.pyx"
    src.write_text(textwrap.dedent(_ENGINE_STATES_PYX))
    res = subprocess.run(
        [sys.executable, "-m", "cython", "-3", "-I", fastep.get_include(), str(src),
         "-o", str(tmp_path / "downstream_engines.c")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return tmp_path / "downstream_engines.c"


@pytest.fixture(scope="module")
def engine_states(engine_states_c):
    """The downstream module compiled and imported (skipped without a C compiler)."""
    ldshared = sysconfig.get_config_var("LDSHARED")
    if sys.platform == "win32" or not ldshared or shutil.which(shlex.split(ldshared)[0]) is None:
        pytest.skip("no C compiler to build the downstream extension with")
    out = engine_states_c.with_name("downstream_engines" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = (shlex.split(ldshared) + shlex.split(sysconfig.get_config_var("CCSHARED") or "")
           + ["-O1", "-I", sysconfig.get_paths()["include"], str(engine_states_c), "-o", str(out)])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, " ".join(cmd) + "\n" + res.stdout + res.stderr
    spec = importlib.util.spec_from_file_location("downstream_engines", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rbf(a, b):
    return np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2)


@pytest.mark.downstream
def test_downstream_cython_can_cimport_the_engine_states(engine_states_c):
    assert engine_states_c.stat().st_size > 0


@pytest.mark.downstream
def test_cimported_dense_ep_runs_as_from_python(engine_states):
    from fastep._epcore import gp_ep
    x = np.linspace(-2, 2, 12)
    K = _rbf(x, x) + 1e-8 * np.eye(12)
    y = np.sign(x)
    spec = Probit().site_spec()
    engine = gp_ep.DenseEP(K, y, spec, gp_ep.DenseEPOptions(tol=1e-10))
    tau, nu, cov, mean = np.zeros(12), np.zeros(12), np.empty((12, 12)), np.empty(12)
    expected = engine.run(tau, nu, cov, mean)
    tau2, nu2, cov2, mean2 = np.zeros(12), np.zeros(12), np.empty((12, 12)), np.empty(12)
    fields, result, typed = engine_states.dense_run(engine, tau2, nu2, cov2, mean2)
    options = engine.options
    assert fields == (12, options.schedule, options.order, 1.0, 1e-10, options.max_sweeps,
                      options.negative_precision, engine.block_size, engine.refactor_every,
                      engine.output, True, spec, engine.K, engine.y)
    assert fields[-2] is K and fields[-3] is spec
    assert result == expected and result.converged
    assert typed == (expected.n_sweeps, expected.block_size) and expected.block_size == engine.block_size
    for got, want in ((tau2, tau), (nu2, nu), (cov2, cov), (mean2, mean)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.downstream
def test_cimported_sparse_ep_runs_as_from_python(engine_states):
    from fastep._epcore import sparse_ep
    x, z = np.linspace(-2, 2, 20), np.linspace(-2, 2, 4)
    _, Vt, d = sparse_ep.sparse_projection(_rbf(z, z), _rbf(x, z), np.ones(20), jitter=1e-8)
    y = np.sign(x)
    spec = Probit().site_spec()
    engine = sparse_ep.SparseEP(Vt, d, y, spec, sparse_ep.SparseEPOptions(power=0.5, tol=1e-10))
    expected_arrays = np.zeros(20), np.zeros(20), np.empty((4, 4)), np.empty(4)
    expected = engine.run(*expected_arrays)
    arrays = np.zeros(20), np.zeros(20), np.empty((4, 4)), np.empty(4)
    fields, result, typed = engine_states.sparse_run(engine, *arrays)
    options = engine.options
    assert fields == (20, 4, 0.5, engine.n_quadrature, options.schedule, options.order, 1.0, 1e-10,
                      options.max_sweeps, options.negative_precision, True, spec, engine.Vt,
                      engine.d, engine.y, True)
    assert result == expected and result.converged and typed == (expected.n_sweeps, expected.n_rebuilds)
    for got, want in zip(arrays, expected_arrays):
        np.testing.assert_array_equal(got, want)


@pytest.mark.downstream
def test_cimported_linear_ep_runs_as_from_python(engine_states):
    from fastep._epcore import linear_ep
    rng = np.random.default_rng(0)
    X = rng.standard_normal((15, 3))
    y = np.sign(X @ np.array([1.0, -0.5, 0.25]) + 0.3 * rng.standard_normal(15))
    spec = Probit().site_spec()
    engine = linear_ep.LinearEP(X, y, np.zeros(3), np.eye(3), spec,
                                linear_ep.LinearEPOptions(tol=1e-10, refresh_every=2))
    expected_arrays = np.zeros(15), np.zeros(15), np.empty(3), np.empty((3, 3))
    expected = engine.run(*expected_arrays)
    expected_evidence = engine.log_evidence(*expected_arrays)
    arrays = np.zeros(15), np.zeros(15), np.empty(3), np.empty((3, 3))
    fields, result, evidence = engine_states.linear_run(engine, *arrays)
    assert fields == (engine.update_form, 1.0, 1e-10, engine.options.max_sweeps, 2,
                      engine.options.negative_precision, engine.algorithm, engine.block_size, True, spec,
                      engine.X, engine.y, engine.prior_mean, engine.prior_cov)
    assert result == expected and result.converged
    assert evidence == expected_evidence
    for got, want in zip(arrays, expected_arrays):
        np.testing.assert_array_equal(got, want)


@pytest.mark.downstream
@pytest.mark.parametrize("criterion", ["entropy", "info_gain"])
def test_cimported_ivm_state_selects_as_from_python(engine_states, criterion):
    from fastep._epcore import ivm
    x = np.linspace(-3, 3, 15)
    K = _rbf(x, x)
    y = np.sign(np.sin(x) + 0.1)
    spec = Probit().site_spec()

    def column(j):
        return K[:, j].copy()

    def state():
        return ivm.IVMEP(y, spec, np.diag(K).copy(), ivm.IVMOptions(5, criterion=criterion),
                            sigma2=0.01)

    expected, typed = state(), state()
    chosen_expected = expected.select(4, column)
    fields, chosen = engine_states.ivm_select(typed, 4, column)
    np.testing.assert_array_equal(chosen, chosen_expected)
    assert fields[:7] == (15, 5, 4, 0.01, ivm.CRITERIA[criterion], expected.n_deferred, spec)
    for got, name in zip(fields[7:], ("post_var", "post_mean", "site_mean", "site_precision",
                                      "is_active", "diag_k", "y")):
        np.testing.assert_array_equal(got, getattr(expected, name))
    for name in ("active", "chosen_score", "score_values", "M", "L"):
        np.testing.assert_array_equal(getattr(typed, name), getattr(expected, name))


@pytest.mark.downstream
def test_cimported_nested_ep_runs_as_from_python(engine_states):
    from fastep._dense.multiclass import dense_posterior_of
    from fastep._epcore import multiclass_ep
    x = np.linspace(-2, 2, 12)
    K = _rbf(x, x) + 1e-8 * np.eye(12)
    labels = np.repeat(np.arange(3, dtype=np.int32), 4)
    posterior_of = dense_posterior_of(K)
    engine = multiclass_ep.MultinomialEP(posterior_of, labels, 3, damping=0.7, tol=1e-9)
    alpha, beta = np.zeros((12, 3)), np.zeros((12, 3))
    expected = engine.run(alpha, beta)
    alpha2, beta2 = np.zeros((12, 3)), np.zeros((12, 3))
    fields, result, typed, posterior = engine_states.nested_run(engine, alpha2, beta2)
    assert fields == (12, 3, 0.7, False, 1e-9, engine.max_sweeps, True, labels, posterior_of)
    assert fields[-2] is labels and fields[-1] is posterior_of and posterior is engine.posterior
    assert result == expected and result.converged
    assert typed == (expected.n_sweeps, expected.log_z, 0.7)
    np.testing.assert_array_equal(alpha2, alpha)
    np.testing.assert_array_equal(beta2, beta)
    # one site through the cimported nested_site and the options struct InnerEP holds
    inner = multiclass_ep.InnerEP(n_inner_sweeps=5, damping=0.8)
    prec = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 1.5]])
    lin = np.array([0.4, -0.2, 0.1])
    a, b = np.zeros(3), np.zeros(3)
    status, log_z = engine_states.nested_one_site(inner, 3, 1, prec, lin, a, b)
    a_py, b_py = np.zeros((1, 3)), np.zeros((1, 3))
    log_z_py, status_py = inner.update(np.array([1], dtype=np.int32), prec[None], lin[None], a_py, b_py)
    assert status == status_py[0] == multiclass_ep.NESTED_OK and log_z == log_z_py[0]
    np.testing.assert_array_equal(a, a_py[0])
    np.testing.assert_array_equal(b, b_py[0])
