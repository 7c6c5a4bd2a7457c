# cython: language_level=3
"""Sparse GP EP with inducing inputs (EP-FITC, EP-DTC, power EP): nogil building blocks (see sparse_ep.pyx).

State (row-major; n sites, m inducing inputs):

* ``Vt`` (n x m, input): row i is v_i = L_mm⁻¹ k_m(x_i), the projection of site i
  (``Q_nn = Vt Vtᵀ``); ``d`` (n): the FITC diagonal K_ii - Q_ii (0 for DTC).
* ``R`` (m x m, upper triangular): A = I + Vtᵀ diag(τ) Vt = Rᵀ R (strict lower part zero after a rebuild).
* ``w_mean`` (m): μ_w = A⁻¹ Vtᵀ ν, so that E[g] = Vt μ_w and Var[g_i] = |R⁻ᵀ v_i|²; during a
  sequential sweep the engine carries β = R⁻ᵀ Vtᵀ ν instead (μ_w = R⁻¹ β).
* sites ``site_precision[i] = τ_i`` (>= 0, except in the Student-t engine of ``student_t_ep``),
  ``site_natural_mean[i] = ν_i`` on the projections g_i.
"""
from fastep._epcore.sites cimport SiteModel, SiteSpec
from fastep._epcore._common cimport SiteUpdateOptions, SweepStats, EngineOptions, SweepResult, SweepSettings
from fastep._epcore.power_ep cimport PowerRule, PowerQuadrature


cpdef enum SparseSchedule:
    SPARSE_SEQUENTIAL = 0    # one site at a time: two trsv and a rank-1 Cholesky update per site
    SPARSE_PARALLEL = 1      # every site from the same posterior, then a rebuild (damping advised)


cdef int cholesky_rank1(double* R, int m, double* x, bint downdate, double* beta) noexcept nogil

cdef int sparse_sweep_sequential(const SiteModel* model, const PowerRule* rule, const double* y,
                                 const double* Vt, const double* d, int n, int m,
                                 double* site_precision, double* site_natural_mean,
                                 double* R, double* beta, const int* perm,
                                 double* w, double* z, double* scratch, int scratch_rows,
                                 const SiteUpdateOptions* opts, SweepStats* stats) noexcept nogil

cdef void sparse_parallel_update(const SiteModel* model, const PowerRule* rule, const double* y,
                                 const double* d, int n, double* site_precision,
                                 double* site_natural_mean, const double* g_mean,
                                 const double* g_var, const SiteUpdateOptions* opts,
                                 SweepStats* stats) noexcept nogil

cdef void sparse_natural_sums(const double* Vt, int n, int m, const double* site_precision,
                              const double* site_natural_mean, double* precision_sum,
                              double* natural_mean_sum, double* scratch, int scratch_rows) noexcept nogil

cdef void sparse_marginal_variances(const double* Vt, int n, int m, const double* R, double* g_var,
                                    double* scratch, int scratch_rows) noexcept nogil

cdef int sparse_rebuild(const double* Vt, int n, int m, const double* site_precision,
                        const double* site_natural_mean, double* R, double* w_mean,
                        double* g_mean, double* g_var, double* scratch, int scratch_rows,
                        double* half_log_det_a, double* quad_b, double* beta) noexcept nogil

cdef double sparse_log_z(const SiteModel* model, const PowerRule* rule, const double* y,
                         const double* d, int n, const double* site_precision,
                         const double* site_natural_mean, const double* g_mean,
                         const double* g_var, double half_log_det_a, double quad_b,
                         int* bad_site) noexcept nogil

cdef int scratch_rows(int n, int m) noexcept nogil


# --- the engine state (sparse_ep.pyx: __init__, run) ---------------------------------
cdef class SparseEPOptions(EngineOptions):
    cdef readonly double power
    cdef readonly int n_quadrature


cdef class SparseEPResult(SweepResult):
    cdef readonly long n_rebuilds


cdef class SparseEP:
    cdef SweepSettings sweep            # copied from the options
    cdef readonly SparseEPOptions options
    cdef readonly unsigned long seed
    cdef readonly object Vt
    cdef readonly object d
    cdef readonly object y
    cdef readonly SiteSpec spec
    cdef readonly int n
    cdef readonly int m
    cdef readonly double power
    cdef readonly int n_quadrature
    cdef readonly bint validate
    cdef PowerQuadrature quadrature
