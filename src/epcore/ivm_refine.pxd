# cython: language_level=3
"""Refinement on a fixed-size IVM active set (see ivm_refine.pyx): EP deletion-inclusion
sweeps and exchange moves (Seeger's notes §2.1, §2.3) on the arrays of an ``IVMState``
(``IVMArrays``, ivm.pxd).

The drivers below hold the GIL (they call ``column_fn`` for kernel rows, allocate their
O(k n) work arrays and raise); their loops over sites and points run without it.  They
are the bodies of the ``IVMState`` methods of the same names, whose docstrings describe
the arguments; ``RefineResult`` and ``ExchangeResult`` are the reports they return.
"""
from fastep._epcore.sites cimport SiteModel
from fastep._epcore.ivm cimport IVMArrays


cdef class _Report:
    pass


cdef class RefineResult(_Report):
    cdef readonly int n_sweeps
    cdef readonly bint converged
    cdef readonly double max_change
    cdef readonly long n_updates
    cdef readonly long n_skipped
    cdef readonly long n_rejected


cdef class ExchangeResult(_Report):
    cdef readonly tuple moves
    cdef readonly bint converged
    cdef readonly double best_gain


cdef class KernelRows:
    cdef object column_fn      # the column_fn the rows were fetched with
    cdef object rows           # (d_max, n) float64: K[active[r], :] in row r
    cdef object index          # (d_max,) intc: the point whose row each slot holds (-1: none)
    cdef int* index_ptr
    cdef double* fetch(self, const IVMArrays* s, column_fn) except NULL


cdef object fetch_column(column_fn, int point, int n, bint check_finite)

cdef refactorize(IVMArrays* s, KernelRows rows, column_fn)

cdef RefineResult refine_sweeps(IVMArrays* s, const SiteModel* model, const double* y, double sigma2,
                                KernelRows rows, column_fn, n_sweeps, tol, refactor_every)

cdef tuple exchange_gains(IVMArrays* s, const SiteModel* model, const double* y, double sigma2,
                          KernelRows rows, column_fn)

cdef ExchangeResult exchange_moves(IVMArrays* s, const SiteModel* model, const double* y, double sigma2,
                                   KernelRows rows, double* chosen, column_fn, mode, tol, max_moves, seed,
                                   refactor_every)
