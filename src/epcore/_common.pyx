# cython: language_level=3
"""Machinery shared by the EP engines.

* the scalar part of a rank-1 site update, ``site_step`` (Minka, *EP: a quick reference*,
  §1.1: deletion eqs 25 and 29, moment matching eqs 39-41, the damped step and inclusion
  coefficients eqs 36/38 and 42-45), with the options it takes (update form, damping,
  negative-precision policy) and the statistics a sweep keeps;
* the seeded random order of sites (splitmix64 and a Fisher-Yates permutation);
* the input checks of the public engine functions (their private ``_run_*`` twins skip
  them);
* the enum constants, exported as plain integers for Python callers;
* the sweep driver (:class:`SweepDriver`): what every EP run does between two sweeps — the
  running totals, the convergence test, the progress callback, interrupt polling, and the
  restore of the site arrays when a run ends in an error — and the typed result of a run
  (:class:`SweepResult`), for the compiled engines and the Python paths alike;
* interrupts: the compiled loops poll Python's signal handlers between sites (with the GIL,
  about every ``INTERRUPT_FLOPS`` floating-point operations of work), so that Ctrl-C stops
  a long sweep within a fraction of a second; the engine then restores its inputs and
  re-raises the ``KeyboardInterrupt``.
"""
import numpy as np

from libc.math cimport isfinite, fabs, INFINITY, NAN
from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.ref cimport PyObject
from fastep._epcore.sites cimport SiteModel, SiteSpec, site_moments, SITE_BAD_LABEL, SITE_BAD_PARAMS


def site_update_constants():
    """The site-update enums as a ``{name: int}`` dict (``UPDATE_*``, ``NEGATIVE_*``)."""
    out = {}
    for enum_class in (UpdateForm, NegativePrecisionPolicy):
        for member in enum_class:
            out[member.name] = int(member)
    return out


# --------------------------------------------------------------------------- #
# the rank-1 site step
# --------------------------------------------------------------------------- #

cdef int site_step(const SiteModel* model, double y, double xVx, double xm,
                   double* site_precision_i, double* site_natural_mean_i,
                   const SiteUpdateOptions* opts, double* cov_coef, double* mean_coef) noexcept nogil:
    """Scalar part of one site update: deletion, moment matching, inclusion coefficients.

    Given ``xVx = x_i^T V x_i`` and ``xm = x_i^T m`` of the current posterior,
    computes the new site (written to ``site_precision_i``/``site_natural_mean_i``
    unless the result is STEP_SKIPPED/STEP_FAILED) and the coefficients of the
    posterior update ``V += cov_coef u u^T``, ``m += mean_coef u`` with
    ``u = V x_i`` (eqs 36/38 or 44/45).  Returns a ``SiteStepResult``.
    """
    cdef double tau_old = site_precision_i[0], nu_old = site_natural_mean_i[0]
    cdef double denom = 1.0 - tau_old * xVx
    cdef double cavity_var, cavity_mean, log_z = 0.0, alpha = 0.0, beta = 0.0
    cdef double one_minus, tau_target, nu_target, beta_eff, tau_new, nu_new, d_tau, d_nu, c, inv_denom
    cdef int result = STEP_APPLIED
    cov_coef[0] = 0.0
    mean_coef[0] = 0.0
    if not (denom > 0.0 and xVx >= 0.0 and isfinite(xVx) and isfinite(xm)):
        return STEP_FAILED
    cavity_var = xVx / denom                                      # eq 25
    cavity_mean = xm + cavity_var * (tau_old * xm - nu_old)       # eq 29
    if not (isfinite(cavity_var) and isfinite(cavity_mean)):
        return STEP_FAILED
    if site_moments(model, y, cavity_mean, cavity_var, &log_z, &alpha, &beta) != 0:
        return STEP_FAILED
    if not (isfinite(alpha) and isfinite(beta)):
        return STEP_FAILED
    one_minus = 1.0 - cavity_var * beta
    if not one_minus > 0.0:
        return STEP_FAILED
    tau_target = beta / one_minus                                 # eqs 39-40
    nu_target = (alpha + beta * cavity_mean) / one_minus          # eq 41
    beta_eff = beta
    if tau_target < 0.0:
        if opts.negative_precision == NEGATIVE_SKIP:
            return STEP_SKIPPED
        if opts.negative_precision == NEGATIVE_CLIP:
            tau_target = 0.0
            nu_target = alpha
            beta_eff = 0.0
            result = STEP_CLIPPED
    result = damped_site_update(opts, tau_old, nu_old, tau_target, nu_target, result, &tau_new, &nu_new)
    if result == STEP_SKIPPED:
        return STEP_SKIPPED
    d_tau = tau_new - tau_old                                     # eq 42
    d_nu = nu_new - nu_old                                        # eq 43
    c = 1.0 + xVx * d_tau
    if not c > 0.0:
        return STEP_SKIPPED
    if opts.update_form == UPDATE_MOMENT and opts.damping == 1.0:
        inv_denom = 1.0 / denom                                   # d_i, eq 34
        cov_coef[0] = inv_denom * (tau_old - beta_eff * inv_denom)        # eq 38
        mean_coef[0] = inv_denom * (tau_old * xm - nu_old + alpha)        # eq 36
    else:
        cov_coef[0] = -d_tau / c                                  # eq 44
        mean_coef[0] = (d_nu - xm * d_tau) / c                    # eq 45
    site_precision_i[0] = tau_new
    site_natural_mean_i[0] = nu_new
    return result



# --------------------------------------------------------------------------- #
# random order
# --------------------------------------------------------------------------- #

cdef unsigned long long _GOLDEN = (<unsigned long long>0x9E3779B9 << 32) | <unsigned long long>0x7F4A7C15
cdef unsigned long long _MIX1 = (<unsigned long long>0xBF58476D << 32) | <unsigned long long>0x1CE4E5B9
cdef unsigned long long _MIX2 = (<unsigned long long>0x94D049BB << 32) | <unsigned long long>0x133111EB


cdef unsigned long long splitmix64_next(unsigned long long* state) noexcept nogil:
    """Next output of Steele-Lea-Flood's splitmix64 generator (state advanced in place)."""
    cdef unsigned long long z
    state[0] += _GOLDEN
    z = state[0]
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    return z ^ (z >> 31)


cdef void random_permutation(int n, int* perm, unsigned long long* state) noexcept nogil:
    """A uniformly random permutation of 0..n-1 (Fisher-Yates; modulo bias < n / 2**64)."""
    cdef int i, j, tmp
    for i in range(n):
        perm[i] = i
    for i in range(n - 1, 0, -1):
        j = <int>(splitmix64_next(state) % <unsigned long long>(i + 1))
        tmp = perm[i]
        perm[i] = perm[j]
        perm[j] = tmp


# --------------------------------------------------------------------------- #
# input checks of the public engine functions
# --------------------------------------------------------------------------- #

def _check_vector(name, const double[::1] v, int n, bint nonnegative=False):
    if v.shape[0] != n:
        raise ValueError(f"{name} must have length n = K.shape[0] = {n}; got {v.shape[0]}")
    a = np.asarray(v)
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be finite; {name}[{i}] = {float(a[i])!r}")
    if nonnegative:
        bad = a < 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name} must be >= 0 (negative site precisions are not supported "
                             f"by GP EP); {name}[{i}] = {float(a[i])!r}")


def _check_targets(SiteSpec spec, const double[::1] y, int n):
    """y finite and in the support of the likelihood (checked with a unit cavity)."""
    cdef int i, status = 0, bad = -1
    cdef double log_z, alpha, beta
    _check_vector("y", y, n)
    with nogil:
        for i in range(n):
            status = site_moments(&spec.model, y[i], 0.0, 1.0, &log_z, &alpha, &beta)
            if status == SITE_BAD_LABEL or status == SITE_BAD_PARAMS:
                bad = i
                break
    if bad >= 0:
        if status == SITE_BAD_PARAMS:
            raise ValueError("spec is inconsistent (site kernel reports bad parameters)")
        raise ValueError(f"y[{bad}] = {y[bad]!r} is not a valid target for this likelihood")


def _check_no_aliasing(inputs, outputs):
    names = list(outputs)
    for a_pos, out_name in enumerate(names):
        out_arr = np.asarray(outputs[out_name])
        for in_name, in_arr in inputs.items():
            if np.may_share_memory(out_arr, np.asarray(in_arr)):
                raise ValueError(f"{out_name} must not share memory with {in_name}")
        for other in names[a_pos + 1:]:
            if np.may_share_memory(out_arr, np.asarray(outputs[other])):
                raise ValueError(f"{out_name} must not share memory with {other}")


cdef bint sweep_callback_stops(object callback, int sweep, double max_change, double log_z,
                               list errors) noexcept:
    """Call ``callback(sweep, max_change, log_z)`` (the engines' ``sweep_callback``, with the GIL
    held, between two sweeps); True if it asks the sweeps to stop (returns ``False``) or raises
    (the exception is appended to ``errors`` for the engine to re-raise once its state is
    consistent)."""
    try:
        return callback(sweep, max_change, log_z) is False
    except BaseException as exc:
        errors.append(exc)
        return True



# --------------------------------------------------------------------------- #
# interrupts
# --------------------------------------------------------------------------- #

cdef extern from "Python.h":
    int _check_signals "PyErr_CheckSignals" () nogil

#: Work between two polls of the signal handlers (floating-point operations): a poll takes the
#: GIL (well under a microsecond uncontended), 2e6 flops take about a millisecond.
INTERRUPT_FLOPS = 2_000_000
cdef int _interrupt_checks_enabled = 1


def set_interrupt_checks(bint enabled):
    """Turn the compiled loops' signal polling on or off (process-wide; for benchmarks that
    measure its cost, never called by fastep itself). Returns the previous setting."""
    global _interrupt_checks_enabled
    previous = bool(_interrupt_checks_enabled)
    _interrupt_checks_enabled = 1 if enabled else 0
    return previous


cdef void interrupt_init(InterruptCheck* check, SweepStats* stats, double site_cost) noexcept nogil:
    """Set ``stats`` to poll through ``check`` every ``INTERRUPT_FLOPS / site_cost`` sites (at
    least every site), or not at all while the checks are turned off."""
    cdef double every = 2e6 / site_cost if site_cost > 1.0 else 2e6
    check.every = <int>every if every < 1e9 else 1000000000
    if check.every < 1:
        check.every = 1
    check.countdown = check.every
    check.pending = 0
    check.exc_type = NULL
    check.exc_value = NULL
    check.exc_tb = NULL
    stats.interrupt = check if _interrupt_checks_enabled else NULL


cdef bint interrupt_poll(InterruptCheck* check) noexcept nogil:
    """Run Python's pending signal handlers now; if one raised, keep its exception in ``check``."""
    if check.pending:
        return True
    with gil:
        if _check_signals() != 0:
            PyErr_Fetch(&check.exc_type, &check.exc_value, &check.exc_tb)
            check.pending = 1
    return check.pending


cdef int interrupt_reraise(InterruptCheck* check) except -1:
    """Raise the exception a poll kept (with the GIL held); 0 if there is none."""
    if not check.pending:
        return 0
    check.pending = 0
    PyErr_Restore(check.exc_type, check.exc_value, check.exc_tb)
    check.exc_type = NULL
    check.exc_value = NULL
    check.exc_tb = NULL
    return -1



# --------------------------------------------------------------------------- #
# the sweep driver and the result of a run
# --------------------------------------------------------------------------- #

def former_name(dict namespace, dict renamed, str name):
    """The object a module's former name ``name`` stands for (``renamed`` maps former names to
    current ones in ``namespace``, the module's globals), with a ``FutureWarning``; for a module's
    ``__getattr__``. Raises ``AttributeError`` for any other name."""
    current = renamed.get(name)
    if current is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    import warnings
    warnings.warn(f"{name} is deprecated and will be removed in the next release; use {current}", FutureWarning,
                  stacklevel=3)
    return namespace[current]


def replaced_fields(obj, dict changes, names=None):
    """The fields ``names`` (default ``obj._FIELDS``) of ``obj`` by name, with ``changes``
    applied (what a ``replace`` method builds its copy from); TypeError naming unknown ones."""
    names = type(obj)._FIELDS if names is None else names
    unknown = set(changes) - set(names)
    if unknown:
        raise TypeError(f"unknown {type(obj).__name__} field(s): {sorted(unknown)}")
    fields = {name: getattr(obj, name) for name in names}
    fields.update(changes)
    return fields


def same_fields(a, b):
    """Whether ``a`` and ``b`` agree on the fields of ``a`` (``_FIELDS``; NaN equals NaN)."""
    for name in a._FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x != y and not (isinstance(x, float) and isinstance(y, float) and x != x and y != y):
            return False
    return True


def _result_from_fields(dict fields):
    """A SweepResult from any of its fields by name."""
    cdef SweepResult result = SweepResult.__new__(SweepResult)
    result._assign(fields)
    return result


cdef class SweepResult:
    """What one EP run reports (read-only): the fields every engine has.

    An engine family with more to report returns a subclass that adds its own fields: the
    dense GP engine's :class:`~fastep._epcore.gp_ep.DenseEPResult`, the sparse GP engine's
    :class:`~fastep._epcore.sparse_ep.SparseEPResult`, the Student-t engines'
    :class:`~fastep._epcore.student_t_ep.StudentTEPResult`, the multinomial engine's
    :class:`~fastep._epcore.multiclass_ep.MultinomialResult`, the IVM's
    :class:`~fastep._epcore.ivm_refine.IVMResult` and the horseshoe's
    :class:`~fastep._epcore.horseshoe_ep.HorseshoeResult`. Such a family result is built from
    the run's SweepResult and the family's fields: the dense, sparse and Student-t results take
    ``(result=None, *fields)``, the common fields of ``result`` (default: ``SweepResult()``'s)
    and the family's own in the order of its ``_OWN`` (``DenseEPResult(result, block_size)``).

    Equality is field by field between results of the same class (NaN equals NaN); a result
    pickles, saves (:func:`fastep.save`) and prints its class and main fields.

    Parameters
    ----------
    n_sweeps, converged, max_change, log_z, log_z_change, stopped, diagnostics
        As the attributes.
    counts : mapping, optional
        Any of ``n_skipped``, ``n_clipped`` and ``n_failed`` by name (the others are 0).

    Attributes
    ----------
    n_sweeps : int
        Sweeps (parallel schedules: iterations) completed.
    converged : bool
        The convergence test passed (and, for engines that track it, log Z is finite).
    max_change : float
        Largest relative site change of the last sweep (``inf`` if none ran).
    log_z : float
        EP approximation of the log marginal likelihood at the returned sites.
    log_z_change : float
        ``|Δ log Z|`` over the last sweep.
    n_skipped, n_clipped, n_failed : int
        Site updates skipped (including failed ones), clipped to zero precision, and failed
        (improper cavity or tilted moments), summed over the run; for the engines that step
        all sites at once (the Student-t, multinomial and horseshoe engines, the double loop)
        ``n_failed`` counts the sites that failed in the last iteration.
    stopped : bool
        The sweep callback returned False.
    diagnostics : dict
        Engine-specific details (e.g. the double loop's Newton steps and energy trace).
    """
    _FIELDS = ("n_sweeps", "converged", "max_change", "log_z", "log_z_change", "n_skipped",
               "n_clipped", "n_failed", "stopped", "diagnostics")
    #: The fields given to the constructor through ``counts``.
    _COUNTS = ("n_skipped", "n_clipped", "n_failed")
    #: The fields a family result adds: its constructor's arguments after the SweepResult.
    _OWN = ()

    def __init__(self, int n_sweeps=0, bint converged=False, double max_change=INFINITY,
                 double log_z=NAN, double log_z_change=INFINITY, bint stopped=False,
                 counts=None, dict diagnostics=None):
        self.n_sweeps, self.converged, self.max_change = n_sweeps, converged, max_change
        self.log_z, self.log_z_change, self.stopped = log_z, log_z_change, stopped
        self.diagnostics = {} if diagnostics is None else diagnostics
        self.n_skipped = self.n_clipped = self.n_failed = 0
        if counts:
            unknown = set(counts) - set(SweepResult._COUNTS)
            if unknown:
                raise TypeError(f"unknown SweepResult count(s): {sorted(unknown)}")
            self.n_skipped = counts.get("n_skipped", 0)
            self.n_clipped = counts.get("n_clipped", 0)
            self.n_failed = counts.get("n_failed", 0)

    cdef void copy_common(self, SweepResult source) noexcept:
        """Take the common fields of ``source`` (a family result's constructor)."""
        self.n_sweeps, self.converged, self.max_change = source.n_sweeps, source.converged, source.max_change
        self.log_z, self.log_z_change, self.stopped = source.log_z, source.log_z_change, source.stopped
        self.n_skipped, self.n_clipped, self.n_failed = source.n_skipped, source.n_clipped, source.n_failed
        self.diagnostics = source.diagnostics

    def _assign(self, fields):
        """(Re)initialise the common fields from any of them by name (subclasses' constructors)."""
        fields = dict(fields)
        counts = {name: fields.pop(name) for name in SweepResult._COUNTS if name in fields}
        SweepResult.__init__(self, counts=counts, **fields)

    def common(self):
        """The common fields alone, as a :class:`SweepResult` (a family result's base part)."""
        cdef SweepResult result = SweepResult.__new__(SweepResult)
        result.copy_common(self)
        return result

    def replace(self, **changes):
        """A copy of the same class with the given fields changed (as
        :func:`dataclasses.replace`)."""
        fields = replaced_fields(self, changes)
        common = _result_from_fields({name: fields[name] for name in SweepResult._FIELDS})
        if type(self) is SweepResult:
            return common
        return type(self)(common, *[fields[name] for name in self._OWN])

    def as_dict(self):
        """The fields as a plain dict (for logging and JSON)."""
        return {name: getattr(self, name) for name in self._FIELDS}

    def __eq__(self, other):
        """Field by field between results of the same class; NaN equals NaN (a result equals
        its own copy)."""
        if type(other) is not type(self):
            return NotImplemented
        return same_fields(self, other)

    def __reduce__(self):
        if type(self) is not SweepResult:
            return (type(self), (self.common(), *[getattr(self, name) for name in self._OWN]))
        return (SweepResult, (self.n_sweeps, self.converged, self.max_change, self.log_z,
                              self.log_z_change, self.stopped,
                              {name: getattr(self, name) for name in self._COUNTS}, self.diagnostics))

    def __repr__(self):
        own = "".join(f", {name}={getattr(self, name)!r}" for name in self._OWN)
        return (f"{type(self).__name__}(n_sweeps={self.n_sweeps}, converged={bool(self.converged)}, "
                f"log_z={self.log_z!r}, max_change={self.max_change!r}{own})")


cdef class SweepDriver:
    """The loop bookkeeping of one EP run, one object for every engine.

    An engine asks for the statistics of a sweep (``begin_sweep``), runs the sweep, and
    hands over: ``record_sweep`` (totals and the largest relative site change, from the
    statistics the site steps kept) or ``record_change`` (engines that step all sites at
    once), then ``test`` (the convergence test: largest relative site change below ``tol``,
    ``|Δ log Z|`` below ``tol · max(1, |log Z|)``, and no failed site in the sweep; engines
    without log Z between sweeps use ``test_sites``, and those that skip converged sites
    ``test_unchanged``) and
    ``notify`` (the progress callback, with the GIL, between sweeps; it stops the run by
    returning False). The compiled engines call these from ``nogil`` code; Python paths call
    :meth:`end_sweep`, which does all three.

    Before the first sweep the engine hands its in/out site arrays to :meth:`keep`; on
    Ctrl-C (polled every ``INTERRUPT_FLOPS / site_cost`` sites) or an exception raised by
    the callback, :meth:`raise_pending` puts them back and re-raises, so a failed run leaves
    its inputs as they were. :meth:`result` builds the :class:`SweepResult`.

    Parameters
    ----------
    tol : float > 0
        Convergence threshold (relative site change and relative change of log Z).
    max_sweeps : int >= 1
    callback : callable or None
        ``callback(sweep, max_change, log_z)`` after every sweep.
    site_cost : float
        Floating-point operations per site update (sets the polling interval); 0 turns
        polling off for this run.
    """

    def __cinit__(self, double tol=1e-8, int max_sweeps=100, object callback=None,
                  double site_cost=0.0):
        self.tol = tol
        self.max_sweeps = max_sweeps
        self.callback = callback
        self.errors = []
        self.saved = []
        self.n_sweeps = 0
        self.n_skipped = self.n_clipped = self.n_failed = 0
        self.n_failed_last = 0
        self.max_change = INFINITY
        self.log_z = NAN
        self.log_z_change = INFINITY
        self.converged = False
        self.stopped = False
        sweep_stats_reset(&self.stats)
        self.interrupt.pending = 0
        self.stats.interrupt = NULL
        if site_cost > 0.0:
            interrupt_init(&self.interrupt, &self.stats, site_cost)

    cdef SweepStats* begin_sweep(self) noexcept nogil:
        """The statistics the next sweep's site steps record into (reset by the steps'
        engine as before; polling stays attached)."""
        return &self.stats

    cdef bint interrupted(self) noexcept nogil:
        """True once a Ctrl-C is pending (polls the signal handlers now)."""
        return self.stats.interrupt != NULL and interrupt_poll(self.stats.interrupt)

    cdef void record_sweep(self, int sweep) noexcept nogil:
        """Count a completed sweep from the statistics its site steps kept."""
        self.n_sweeps = sweep
        self.n_skipped += self.stats.n_skipped
        self.n_clipped += self.stats.n_clipped
        self.n_failed += self.stats.n_failed
        self.n_failed_last = self.stats.n_failed
        self.max_change = self.stats.max_change_precision
        if self.stats.max_change_natural_mean > self.max_change:
            self.max_change = self.stats.max_change_natural_mean

    cdef void record_change(self, int sweep, double max_change, int n_failed) noexcept nogil:
        """Count a completed iteration of an engine that steps all sites at once (its
        ``n_failed`` is that of the last iteration)."""
        self.n_sweeps = sweep
        self.max_change = max_change
        self.n_failed_last = n_failed
        self.n_failed = n_failed

    cdef bint test(self, double new_log_z, double reference_log_z) noexcept nogil:
        """The convergence test at ``new_log_z`` against ``reference_log_z`` (sets
        ``log_z_change`` and ``converged``; ``log_z`` is the caller's to set)."""
        cdef double scale = fabs(new_log_z)
        if not scale > 1.0:
            scale = 1.0
        self.log_z_change = fabs(new_log_z - reference_log_z)
        self.converged = (self.max_change < self.tol and self.log_z_change < self.tol * scale
                          and self.n_failed_last == 0)
        return self.converged

    cdef bint test_sites(self) noexcept nogil:
        """The convergence test of engines without a log Z between sweeps: largest relative
        site change below ``tol`` and no failed site."""
        self.converged = self.max_change < self.tol and self.n_failed_last == 0
        return self.converged

    cdef bint test_unchanged(self, long n_changed) noexcept nogil:
        """The convergence test of engines that leave a site alone when its change is within
        ``tol`` (the IVM's refinement sweeps): the sweep changed no site and none failed.
        ``n_changed`` is the number of sites the sweep updated."""
        self.converged = n_changed == 0 and self.n_failed_last == 0
        return self.converged

    cdef bint notify(self, int sweep) noexcept nogil:
        """Call the progress callback (if any); True if it asks the run to stop."""
        if self.callback is None:
            return False
        with gil:
            self.stopped = sweep_callback_stops(self.callback, sweep, self.max_change, self.log_z,
                                                self.errors)
        return self.stopped

    def end_sweep(self, int sweep, double max_change, double new_log_z, int n_failed=0):
        """Python paths: record an iteration, test convergence against the previous log Z,
        call the callback. Returns True if the run should stop (converged or stopped)."""
        self.record_change(sweep, max_change, n_failed)
        self.test(new_log_z, self.log_z)
        self.log_z = new_log_z
        self.notify(sweep)
        if self.errors:
            self.raise_pending()
        return bool(self.converged or self.stopped)

    def test_change(self, double max_change, double new_log_z, double reference_log_z, int n_failed=0):
        """Python paths that record and test in separate steps: the convergence test of an
        iteration with the given largest site change against ``reference_log_z``."""
        self.max_change = max_change
        self.n_failed_last = n_failed
        return bool(self.test(new_log_z, reference_log_z))

    def set_log_z(self, double log_z):
        """Set the current log Z (the start value, or a refactorised one)."""
        self.log_z = log_z

    def keep(self, *arrays):
        """Keep copies of in/out arrays, to be put back if the run ends in an error."""
        self.saved = [(np.asarray(a), np.array(a, copy=True)) for a in arrays]

    def restore(self):
        """Put the kept arrays back to their values at :meth:`keep`."""
        for target, copy in self.saved:
            target[...] = copy

    def raise_pending(self):
        """After the loop: on a pending Ctrl-C or a callback's exception, restore the kept
        arrays and re-raise it; otherwise do nothing."""
        if self.interrupt.pending or self.errors:
            self.restore()
            interrupt_reraise(&self.interrupt)
            raise self.errors[0]

    def result(self, bint has_log_z=True, dict diagnostics=None):
        """The :class:`SweepResult` of the run (``diagnostics``: engine-specific details); an
        engine family with fields of its own builds its result from it
        (``DenseEPResult(driver.result(), block_size)``). With ``has_log_z`` (engines that
        track log Z) a run whose log Z is not finite has not converged."""
        return SweepResult(self.n_sweeps, self.converged and (isfinite(self.log_z) or not has_log_z),
                           self.max_change, self.log_z, self.log_z_change, self.stopped,
                           {"n_skipped": self.n_skipped, "n_clipped": self.n_clipped, "n_failed": self.n_failed},
                           diagnostics)



# --------------------------------------------------------------------------- #
# the engines' options
# --------------------------------------------------------------------------- #

def _rebuild_options(cls, dict fields):
    """Unpickle an engine's options (their constructors take keywords only)."""
    return cls(**fields)


cdef class FrozenOptions:
    """Base of the engines' options objects: frozen, compared field by field, picklable.

    A subclass lists its constructor's keywords in ``_FIELDS`` (read-only attributes of the
    same names) and checks them once, in its constructor (ValueError naming the field);
    :meth:`replace` gives a checked copy with some fields changed.
    """
    _FIELDS = ()

    def as_dict(self):
        """The fields as a plain dict (the constructor's keywords)."""
        return {name: getattr(self, name) for name in self._FIELDS}

    def replace(self, **changes):
        """A copy with the given fields changed, checked as by the constructor."""
        return type(self)(**replaced_fields(self, changes))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __hash__(self):
        return hash((type(self), tuple(self.as_dict().items())))

    def __reduce__(self):
        return (_rebuild_options, (type(self), self.as_dict()))

    def __repr__(self):
        fields = ", ".join(f"{name}={value!r}" for name, value in self.as_dict().items())
        return f"{type(self).__name__}({fields})"


#: The fields of ``SweepSettings``: the attributes of the same names of a family's options.
_SWEEP_FIELDS = ("damping", "tol", "max_sweeps", "negative_precision", "schedule", "order")


cdef class EngineOptions(FrozenOptions):
    """Base of the options of the engines that share the sweep settings (:class:`FrozenOptions`
    with the ``SweepSettings`` struct of ``_common.pxd``): the engine copies the checked values
    (a family struct embedding it) when it is built.
    """

    cdef int set_sweep(self, double damping, double tol, int max_sweeps, int min_sweeps,
                       bint tol_positive) except -1:
        """Check and keep the fields every family has."""
        if not (damping > 0.0 and damping <= 1.0):
            raise ValueError(f"damping must be in (0, 1]; got {damping}")
        if tol_positive and not tol > 0.0:
            raise ValueError(f"tol must be > 0; got {tol}")
        if not tol >= 0.0:
            raise ValueError(f"tol must be >= 0; got {tol}")
        if max_sweeps < min_sweeps:
            raise ValueError(f"max_sweeps must be >= {min_sweeps}; got {max_sweeps}")
        self.sweep.damping = damping
        self.sweep.tol = tol
        self.sweep.max_sweeps = max_sweeps
        self.sweep.negative_precision = NEGATIVE_CLIP
        self.sweep.schedule = 0
        self.sweep.order = 0
        return 0

    cdef int set_negative_precision(self, int policy, str no_allow) except -1:
        """Check and keep the negative-precision policy; ``no_allow`` (None: every policy is
        supported) says why NEGATIVE_ALLOW is not."""
        if policy == NEGATIVE_ALLOW and no_allow is not None:
            raise ValueError(f"negative_precision = NEGATIVE_ALLOW (2) is not supported by {no_allow}; "
                             "use NEGATIVE_CLIP (0) or NEGATIVE_SKIP (1)")
        if policy not in (NEGATIVE_CLIP, NEGATIVE_SKIP, NEGATIVE_ALLOW):
            allowed = "NEGATIVE_CLIP (0), NEGATIVE_SKIP (1)" + (" or NEGATIVE_ALLOW (2)" if no_allow is None else "")
            raise ValueError(f"negative_precision must be {allowed}; got {policy}")
        self.sweep.negative_precision = policy
        return 0

    def __getattr__(self, name):
        # the shared fields a family has (in its _FIELDS) are read from the struct
        cdef dict sweep
        if name in _SWEEP_FIELDS and name in type(self)._FIELDS:
            sweep = self.sweep
            return sweep[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
