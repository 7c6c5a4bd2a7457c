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
* interrupts: the compiled loops poll Python's signal handlers between sites (with the GIL,
  about every ``INTERRUPT_FLOPS`` floating-point operations of work), so that Ctrl-C stops
  a long sweep within a fraction of a second; the engine then restores its inputs and
  re-raises the ``KeyboardInterrupt``.
"""
import numpy as np

from libc.math cimport isfinite
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
    if opts.damping == 1.0:
        tau_new = tau_target
        nu_new = nu_target
    else:
        tau_new = tau_old + opts.damping * (tau_target - tau_old)
        nu_new = nu_old + opts.damping * (nu_target - nu_old)
        if tau_new < 0.0:
            if opts.negative_precision == NEGATIVE_CLIP:
                tau_new = 0.0
                result = STEP_CLIPPED
            elif opts.negative_precision == NEGATIVE_SKIP:
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
