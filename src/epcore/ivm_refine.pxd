# cython: language_level=3
"""Refinement on a fixed-size IVM active set (see ivm_refine.pyx): EP deletion-inclusion
sweeps and exchange moves (Seeger's notes §2.1, §2.3) on the arrays of an ``IVMEP``
(``IVMArrays``, ivm.pxd), the engine's options (``IVMOptions``) and what a run reports
(``RefineResult``, ``ExchangeResult``, ``IVMResult``).

The drivers below hold the GIL (they call ``column_fn`` for kernel rows, allocate their
O(k n) work arrays and raise); their loops over sites and points run without it.  They
are the bodies of the ``IVMEP`` methods ``refactorize``, ``refine``, ``exchange_gains``,
``exchange`` and of the refinement stages of ``run``.
"""
from fastep._epcore._common cimport SweepResult
from fastep._epcore.ivm cimport IVMArrays, IVMTargets


cdef class IVMOptions:
    cdef readonly int d                    # active set size (capacity of the state, target of run)
    cdef readonly int criterion            # IVMCriterion
    cdef readonly unsigned long long seed  # random criterion and random exchange search
    cdef readonly int refine_sweeps        # 0: no EP sweeps
    cdef readonly double refine_tol
    cdef readonly object exchange          # None, 'greedy' or 'random'
    cdef readonly double exchange_tol
    cdef readonly object max_exchanges     # None (k) or int >= 0


cdef class RefineResult(SweepResult):
    cdef readonly long n_updates
    cdef readonly long n_rejected


cdef class ExchangeResult:
    cdef readonly tuple moves
    cdef readonly bint converged
    cdef readonly double best_gain


cdef class IVMResult(SweepResult):
    cdef readonly int n_active
    cdef readonly RefineResult ep
    cdef readonly ExchangeResult exchange
    cdef readonly RefineResult ep_after_exchange
    cdef readonly bint refined             # some refinement stage was asked for


cdef class KernelRows:
    cdef object column_fn      # the column_fn the rows were fetched with
    cdef object rows           # (d_max, n) float64: K[active[r], :] in row r
    cdef object index          # (d_max,) intc: the point whose row each slot holds (-1: none)
    cdef int* index_ptr
    cdef double* fetch(self, const IVMArrays* s, column_fn) except NULL


# The validated settings of one call of the drivers below.
cdef struct RefineSettings:
    int n_sweeps             # at most this many sweeps (>= 0)
    double tol               # skip threshold of a site (>= 0)
    int refactor_every       # Σ[I, I] and μ_I rebuilt after this many sweeps (>= 1)

cdef struct ExchangeSettings:
    bint greedy              # greedy search (else seeded random)
    double tol               # minimum gain of a move (>= 0)
    int max_moves            # >= 0
    unsigned long long seed  # of the random search
    int refactor_every       # Σ[I, :], ς and μ rebuilt after this many moves (>= 1)


cdef object fetch_column(column_fn, int point, int n, bint check_finite)

# The arguments of IVMEP.refine / IVMEP.exchange checked (ValueError naming the argument).
cdef RefineSettings check_refine_settings(n_sweeps, tol, refactor_every) except *
cdef ExchangeSettings check_exchange_settings(int k, mode, tol, max_moves, seed, refactor_every) except *

cdef int check_column_fn(column_fn) except -1

# eq 32 of the active set from its factor L (``s.L``); ``t``: k doubles of scratch.
cdef double active_log_z(const IVMArrays* s, double* t) noexcept nogil

cdef refactorize(IVMArrays* s, KernelRows rows, column_fn)

cdef RefineResult refine_sweeps(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn,
                                const RefineSettings* settings, callback)

cdef tuple exchange_gains(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn)

cdef ExchangeResult exchange_moves(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn,
                                   const ExchangeSettings* settings)

cdef IVMResult refine_stages(IVMArrays* s, const IVMTargets* t, KernelRows rows, column_fn,
                             IVMOptions options, callback)
