# cython: language_level=3
"""Horseshoe-prior EP engine: parallel damped EP for one task of the (multi-task) horseshoe
regression model (see horseshoe_ep.pyx).

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning*.
"""
from fastep._epcore.horseshoe cimport SiteState, SiteTargets
from fastep._epcore.horseshoe_marginals cimport Sites, Marginals, MarginalsWork


cpdef enum NegativePrecision:
    W_FLOOR_CLIP = 0        # w-site targets kept >= w_floor/η_j ('clip')
    W_FLOOR_NONE = 1        # every target kept ('allow')

cpdef enum HorseshoeStatus:
    STATUS_CONVERGED = 0
    STATUS_MAX_SWEEPS = 1
    STATUS_STUCK = 2        # no valid step for more than max_held iterations
    STATUS_STOPPED = 3      # the sweep callback returned False


from fastep._epcore._common cimport FrozenOptions


cdef class HorseshoeDamping(FrozenOptions):
    cdef readonly double damping
    cdef readonly double damping_decay
    cdef readonly double min_damping
    cdef readonly int stall_window
    cdef readonly double stall_factor
    cdef readonly double lowest_damping


cdef class HorseshoeOptions(FrozenOptions):
    cdef readonly HorseshoeDamping damping_schedule
    cdef readonly double damping
    cdef readonly double damping_decay
    cdef readonly double min_damping
    cdef readonly double tol
    cdef readonly int max_sweeps
    cdef readonly int max_halvings
    cdef readonly int max_held
    cdef readonly str negative_precision
    cdef readonly double w_floor
    cdef readonly int n_threads
    cdef readonly int stall_window
    cdef readonly double stall_factor
    cdef readonly double lowest_damping


cdef class HorseshoePrior:
    cdef readonly object rho2           # ρ², as given (float)
    cdef readonly object gamma2         # γ², as given (float)
    cdef readonly object P              # (d, m)
    cdef readonly object D              # (d,)
    cdef readonly int d
    cdef readonly int m
    cdef readonly object delta          # (D + rowsum P²)^{-1/2}
    cdef readonly object a              # δ²D
    cdef readonly object U              # ΔP


cdef class HorseshoeEP:
    cdef readonly object X              # (n, d), C-contiguous float64
    cdef readonly object y              # (n,)
    cdef readonly int n
    cdef readonly int d
    cdef readonly object sigma2         # σ², as given (float)
    cdef readonly HorseshoePrior prior
    cdef readonly HorseshoeOptions options
    cdef readonly object pi_w           # the sites (eq 1), updated in place by run()
    cdef readonly object h_w
    cdef readonly object pi_u
    cdef readonly object pi_v
    cdef MarginalsWork work
    cdef dict buffers
    cdef Sites sites
    cdef Sites trial
    cdef Marginals current
    cdef Marginals proposed
    cdef SiteTargets targets

    cdef object _finish(self, int status, int it, double residual, int n_clipped, long n_halvings,
                        long n_held, int n_held_iter, double damp_floor, bint stopped)
    cdef double* _ptr(self, str name)
