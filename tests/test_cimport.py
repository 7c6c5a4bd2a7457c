"""The installed .pxd files let downstream Cython code cimport the compiled kernels."""
import os
import subprocess
import sys
import textwrap

import Cython  # noqa: F401  (part of the test extras: the downstream compiler)

import fastep


def test_get_include_holds_the_pxd_files():
    include = fastep.get_include()
    for name in ("__init__.pxd", "_blas.pxd", "sites.pxd", "linear_ep.pxd", "rank_k_ep.pxd"):
        assert os.path.isfile(os.path.join(include, "fastep", "_epcore", name)), name


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


def test_downstream_cython_can_cimport_the_student_t_engines(tmp_path):
    package_root = fastep.get_include()
    src = tmp_path / "downstream_student_t.pyx"
    src.write_text(textwrap.dedent("""
        # cython: language_level=3
        from fastep._epcore.student_t_ep cimport (DenseStudentTEP, SparseStudentTEP, FractionalStep,
                                                  fractional_ep_sweeps, robust_factor)

        def options(DenseStudentTEP dense, SparseStudentTEP sparse):
            return dense.n, dense.power, dense.max_halvings, sparse.m, sparse.damping
    """))
    res = subprocess.run(
        [sys.executable, "-m", "cython", "-3", "-I", package_root, str(src), "-o", str(tmp_path / "out.c")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "out.c").stat().st_size > 0
