# cython: language_level=3
"""Machinery shared by the EP engines (see _common.pyx): the rank-1 site step with its options,
negative-precision policies and sweep statistics, and the seeded random order of sites."""
from libc.math cimport fabs
from cpython.ref cimport PyObject
from fastep._epcore.sites cimport SiteModel


cpdef enum UpdateForm:
    UPDATE_MOMENT = 0        # (v_i, m_i) form, Minka eqs 34, 36, 38
    UPDATE_NATURAL = 1       # natural-parameter form, Minka eqs 39-45

cpdef enum NegativePrecisionPolicy:
    NEGATIVE_CLIP = 0        # clip a negative site precision to 0, keep the tilted mean matched
    NEGATIVE_SKIP = 1        # leave the site unchanged
    NEGATIVE_ALLOW = 2       # accept it unless V or the site's cavity would become improper

cdef enum SiteStepResult:
    STEP_APPLIED = 0         # site moved to the (damped) moment-matched value
    STEP_CLIPPED = 1         # applied with its precision clipped at 0 (NEGATIVE_CLIP)
    STEP_SKIPPED = 2         # left unchanged by the negative-precision policy / PD guard
    STEP_FAILED = 3          # left unchanged: improper cavity, kernel status != 0 or non-finite moments

cdef struct SiteUpdateOptions:
    int update_form          # UpdateForm
    double damping           # in (0, 1]
    int negative_precision   # NegativePrecisionPolicy

# Ctrl-C inside a compiled loop: the loops poll Python's signal handlers (with the GIL, every
# ``every`` sites) and, if a handler raised, hold the exception here and stop; the engine
# restores its state and re-raises it (see _common.pyx, "interrupts").
cdef struct InterruptCheck:
    int every                        # sites between two polls (>= 1)
    int countdown
    int pending                      # a signal handler raised; the exception is held below
    PyObject* exc_type
    PyObject* exc_value
    PyObject* exc_tb

cdef struct SweepStats:
    double max_change_precision      # max_i |Δτ_i| / max(1, |τ_i new|)
    double max_change_natural_mean   # max_i |Δν_i| / max(1, |ν_i new|)
    int n_skipped                    # STEP_SKIPPED + STEP_FAILED
    int n_clipped
    int n_failed
    InterruptCheck* interrupt        # NULL: no polling (set by the engine, kept by sweep_stats_reset)


# Sweep bookkeeping shared by the rank-1 engines (linear_ep, gp_ep).
cdef inline void sweep_stats_reset(SweepStats* stats) noexcept nogil:
    stats.max_change_precision = 0.0
    stats.max_change_natural_mean = 0.0
    stats.n_skipped = 0
    stats.n_clipped = 0
    stats.n_failed = 0


cdef inline void sweep_stats_record(SweepStats* stats, int result, double tau_old, double nu_old,
                                    double tau_new, double nu_new) noexcept nogil:
    cdef double change, scale
    if result == STEP_CLIPPED:
        stats.n_clipped += 1
    elif result == STEP_SKIPPED:
        stats.n_skipped += 1
        return
    elif result == STEP_FAILED:
        stats.n_skipped += 1
        stats.n_failed += 1
        return
    scale = fabs(tau_new)
    change = fabs(tau_new - tau_old) / (scale if scale > 1.0 else 1.0)
    if change > stats.max_change_precision:
        stats.max_change_precision = change
    scale = fabs(nu_new)
    change = fabs(nu_new - nu_old) / (scale if scale > 1.0 else 1.0)
    if change > stats.max_change_natural_mean:
        stats.max_change_natural_mean = change


cdef int site_step(const SiteModel* model, double y, double xVx, double xm,
                   double* site_precision_i, double* site_natural_mean_i,
                   const SiteUpdateOptions* opts, double* cov_coef, double* mean_coef) noexcept nogil


# --- random order ----------------------------------------------------------------------
cdef unsigned long long splitmix64_next(unsigned long long* state) noexcept nogil

cdef void random_permutation(int n, int* perm, unsigned long long* state) noexcept nogil


# Per-sweep progress hook (called with the GIL between sweeps, never inside one).
cdef bint sweep_callback_stops(object callback, int sweep, double max_change, double log_z,
                               list errors) noexcept


# Interrupt polling (_common.pyx).
cdef void interrupt_init(InterruptCheck* check, SweepStats* stats, double site_cost) noexcept nogil
cdef bint interrupt_poll(InterruptCheck* check) noexcept nogil
cdef int interrupt_reraise(InterruptCheck* check) except -1


cdef inline bint interrupt_requested(SweepStats* stats) noexcept nogil:
    """Called once per site: True once a signal handler has raised (polls every ``every`` sites)."""
    cdef InterruptCheck* check = stats.interrupt
    if check == NULL:
        return False
    if check.pending:
        return True
    check.countdown -= 1
    if check.countdown > 0:
        return False
    check.countdown = check.every
    return interrupt_poll(check)


cdef inline double max_relative_site_change(int n, const double* tau_old, const double* nu_old,
                                            const double* tau_new, const double* nu_new) noexcept nogil:
    """Largest ``|new - old| / max(|old|, 1)`` over both site parameters of n sites (the
    convergence measure of the parallel schedules that step all sites at once)."""
    cdef int i
    cdef double change, scale, largest = 0.0
    for i in range(n):
        scale = fabs(tau_old[i])
        change = fabs(tau_new[i] - tau_old[i]) / (scale if scale > 1.0 else 1.0)
        if change > largest:
            largest = change
        scale = fabs(nu_old[i])
        change = fabs(nu_new[i] - nu_old[i]) / (scale if scale > 1.0 else 1.0)
        if change > largest:
            largest = change
    return largest


# --- the engines' options: one frozen object per engine family, validated once ----------------
# The options classes (EngineOptions and its subclasses in the engine modules) hold the settings
# every family shares in this struct (and their own as typed read-only fields); an engine copies
# it at construction, so nothing is validated or converted per run.
cdef struct SweepSettings:
    double damping           # in (0, 1]
    double tol               # convergence threshold
    int max_sweeps
    int negative_precision   # NegativePrecisionPolicy
    int schedule             # the family's schedule enum (0 where a family has one schedule)
    int order                # site order (0: fixed; where a family has one)

cdef class FrozenOptions:
    """Base of the engines' frozen options objects (see _common.pyx)."""
    pass


cdef class EngineOptions(FrozenOptions):
    """Base of the options of the engines sharing the sweep settings (see _common.pyx)."""
    cdef SweepSettings sweep
    cdef int set_sweep(self, double damping, double tol, int max_sweeps, int min_sweeps,
                       bint tol_positive) except -1
    cdef int set_negative_precision(self, int policy, str no_allow) except -1


# --- one EP run: the sweep driver and its result --------------------------------------------------------
cdef class SweepResult:
    """What every EP run reports (see _common.pyx); an engine family with more to report
    returns a subclass (DenseEPResult, SparseEPResult, StudentTEPResult, ...)."""
    cdef readonly int n_sweeps
    cdef readonly bint converged
    cdef readonly double max_change
    cdef readonly double log_z
    cdef readonly double log_z_change
    cdef readonly long n_skipped
    cdef readonly long n_clipped
    cdef readonly long n_failed
    cdef readonly bint stopped
    cdef readonly dict diagnostics
    cdef void copy_common(self, SweepResult source) noexcept


cdef class SweepDriver:
    """Bookkeeping of one EP run, shared by every engine (see _common.pyx)."""
    cdef readonly double tol
    cdef readonly int max_sweeps
    cdef readonly int n_sweeps
    cdef readonly long n_skipped
    cdef readonly long n_clipped
    cdef readonly long n_failed
    cdef readonly int n_failed_last
    cdef readonly double max_change
    cdef readonly double log_z
    cdef readonly double log_z_change
    cdef readonly bint converged
    cdef readonly bint stopped
    cdef SweepStats stats
    cdef InterruptCheck interrupt
    cdef object callback
    cdef list errors
    cdef list saved

    cdef SweepStats* begin_sweep(self) noexcept nogil
    cdef bint interrupted(self) noexcept nogil
    cdef void record_sweep(self, int sweep) noexcept nogil
    cdef void record_change(self, int sweep, double max_change, int n_failed) noexcept nogil
    cdef bint test(self, double new_log_z, double reference_log_z) noexcept nogil
    cdef bint test_sites(self) noexcept nogil
    cdef bint test_unchanged(self, long n_changed) noexcept nogil
    cdef bint notify(self, int sweep) noexcept nogil


cdef inline SiteUpdateOptions natural_update_options(double damping, int negative_precision) noexcept nogil:
    """Options of a natural-form site update (the GP and sparse engines)."""
    cdef SiteUpdateOptions opts
    opts.update_form = UPDATE_NATURAL
    opts.damping = damping
    opts.negative_precision = negative_precision
    return opts


cdef inline int damped_site_update(const SiteUpdateOptions* opts, double tau_old, double nu_old,
                                   double tau_target, double nu_target, int result,
                                   double* tau_new, double* nu_new) noexcept nogil:
    """Damped step from the old site to the moment-matched target, in natural parameters.

    ``τ_new = τ_old + δ (τ* - τ_old)``, ``ν_new = ν_old + δ (ν* - ν_old)`` (δ = 1: the target
    itself). A damped precision below 0 follows ``opts.negative_precision``: NEGATIVE_CLIP sets
    it to 0 and returns STEP_CLIPPED, NEGATIVE_SKIP returns STEP_SKIPPED (nothing written is to be
    used), NEGATIVE_ALLOW keeps it. Otherwise returns ``result`` (the status of the target).
    """
    if opts.damping == 1.0:
        tau_new[0] = tau_target
        nu_new[0] = nu_target
        return result
    tau_new[0] = tau_old + opts.damping * (tau_target - tau_old)
    nu_new[0] = nu_old + opts.damping * (nu_target - nu_old)
    if tau_new[0] < 0.0:
        if opts.negative_precision == NEGATIVE_CLIP:
            tau_new[0] = 0.0
            return STEP_CLIPPED
        if opts.negative_precision == NEGATIVE_SKIP:
            return STEP_SKIPPED
    return result
