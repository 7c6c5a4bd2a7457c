"""asv: the dense GP EP engine (fastep._epcore.gp_ep) on the dense-GP toy.

One sweep / iteration per schedule, the refactorisation, and full runs to convergence
(time, peak memory and the number of sweeps), at n in {500, 2000}; the sweeps and the
refactorisation with one BLAS thread and with the default, the runs to convergence with the default.
"""
import numpy as np

from fastep import Probit
from fastep._epcore import gp_ep
from fastep.kernels import RBF

from . import build_engine

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None

SCHEDULES = {"sequential": gp_ep.SCHEDULE_SEQUENTIAL, "blocked": gp_ep.SCHEDULE_BLOCKED,
             "parallel": gp_ep.SCHEDULE_PARALLEL}


def _problem(n):
    """The dense-GP toy (deterministic)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    K = np.ascontiguousarray(RBF(variance=1.0, inverse_width=1.0)(X))
    return K, y


def _warm_sites():
    """The sites two sequential sweeps in, for each n of the suite: made once per class
    (``setup_cache``) rather than in every benchmark process."""
    sites = {}
    for n in (500, 2000):
        K, y = _problem(n)
        tau, nu = np.zeros(n), np.zeros(n)
        build_engine(gp_ep, "DenseEP", K, y, Probit().site_spec(), max_sweeps=2).run(tau, nu, np.empty((n, n)), np.empty(n))
        sites[n] = (tau, nu)
    return sites


def _damping(schedule):
    return 0.5 if schedule == "parallel" else 1.0


class _Threads:
    def _limit(self, threads):
        self.limits = None
        if threads == "1":
            if threadpool_limits is None:
                raise NotImplementedError("threadpoolctl is needed for single-threaded runs")
            self.limits = threadpool_limits(1, "blas")

    def teardown(self, *args):
        if getattr(self, "limits", None) is not None:
            self.limits.unregister()


class GPEPSweep(_Threads):
    """One sweep (parallel: one iteration) from a warm start two sweeps in, as ``DenseEP.run`` does
    it: the warm-start refactorisation, the sweep, the refactorisation after it and log Z (the
    engine built, with its checks, in the timed call)."""
    params = [list(SCHEDULES), [500, 2000], ["1", "default"]]
    param_names = ["schedule", "n", "blas_threads"]
    timeout = 600

    def setup_cache(self):
        return _warm_sites()

    def setup(self, sites, schedule, n, threads):
        self._limit(threads)
        self.K, self.y = _problem(n)
        self.spec = Probit().site_spec()
        self.tau, self.nu = sites[n]
        self.post_cov, self.post_mean = np.empty((n, n)), np.empty(n)

    def _run(self, schedule):
        engine = build_engine(gp_ep, "DenseEP", self.K, self.y, self.spec, schedule=SCHEDULES[schedule],
                              damping=_damping(schedule), max_sweeps=1)
        engine.run(self.tau.copy(), self.nu.copy(), self.post_cov, self.post_mean)

    def time_run_one_sweep(self, sites, schedule, n, threads):
        self._run(schedule)

    def peakmem_run_one_sweep(self, sites, schedule, n, threads):
        self._run(schedule)


class GPEPIncrementalSweep(_Threads):
    """The sweep alone (rank-1 / delayed rank-1 updates, no refactorisation)."""
    params = [["sequential", "blocked"], [500, 2000], ["1", "default"]]
    param_names = ["schedule", "n", "blas_threads"]
    timeout = 600

    def setup_cache(self):
        return _warm_sites()

    def setup(self, sites, schedule, n, threads):
        self._limit(threads)
        self.K, self.y = _problem(n)
        self.spec = Probit().site_spec()
        self.tau, self.nu = sites[n]
        self.post_cov, self.post_mean = np.empty((n, n)), np.empty(n)
        gp_ep.refactor_posterior(self.K, self.tau, self.nu, self.post_cov, self.post_mean)
        self.work_cov = np.empty_like(self.post_cov)
        engine = build_engine(gp_ep, "DenseEP", self.K, self.y, self.spec, schedule=SCHEDULES[schedule])
        if hasattr(engine, "incremental_sweep"):
            self.sweep = engine.incremental_sweep
        else:       # asv times older commits with this suite: there a module function
            self.sweep = lambda *arrays: gp_ep.incremental_sweep(self.y, self.spec, *arrays,
                                                                 schedule=SCHEDULES[schedule])

    def time_incremental_sweep(self, sites, schedule, n, threads):
        self.work_cov[...] = self.post_cov
        self.sweep(self.tau.copy(), self.nu.copy(), self.work_cov, self.post_mean.copy())


class GPEPRefactor(_Threads):
    """Posterior from the sites (chol of B, trsm, syrk) and the stand-alone log Z."""
    params = [[500, 2000], ["1", "default"]]
    param_names = ["n", "blas_threads"]
    timeout = 300

    def setup_cache(self):
        return _warm_sites()

    def setup(self, sites, n, threads):
        self._limit(threads)
        self.K, self.y = _problem(n)
        self.spec = Probit().site_spec()
        self.tau, self.nu = sites[n]
        self.post_cov, self.post_mean = np.empty((n, n)), np.empty(n)

    def time_refactor_posterior(self, sites, n, threads):
        gp_ep.refactor_posterior(self.K, self.tau, self.nu, self.post_cov, self.post_mean)

    def time_log_marginal_likelihood(self, sites, n, threads):
        gp_ep.log_marginal_likelihood(self.K, self.y, self.spec, self.tau, self.nu)


class GPEPConverge:
    """Cold start to convergence at tol 1e-8 with the default BLAS threads: time, peak memory,
    number of sweeps (one-thread sweeps are timed by ``GPEPSweep``).

    The engine allocates its whole workspace before the first sweep, so
    ``peakmem_to_convergence`` measures two sweeps, which reach the run's peak.
    """
    params = [list(SCHEDULES) + ["blocked-entropy"], [500, 2000]]
    param_names = ["schedule", "n"]
    timeout = 900
    repeat = (1, 3, 120.0)
    number = 1

    def setup(self, schedule, n):
        self.K, self.y = _problem(n)
        self.spec = Probit().site_spec()
        self.post_cov, self.post_mean = np.empty((n, n)), np.empty(n)
        base = schedule.split("-")[0]
        self.options = dict(schedule=SCHEDULES[base], damping=_damping(base), tol=1e-8, max_sweeps=500,
                            order=gp_ep.ORDER_ENTROPY if schedule.endswith("entropy") else gp_ep.ORDER_FIXED)

    def _run(self, n, **options):
        engine = build_engine(gp_ep, "DenseEP", self.K, self.y, self.spec, **dict(self.options, **options))
        return engine.run(np.zeros(n), np.zeros(n), self.post_cov, self.post_mean)

    def time_to_convergence(self, schedule, n):
        self._run(n)

    def peakmem_to_convergence(self, schedule, n):
        self._run(n, max_sweeps=2)

    def track_sweeps(self, schedule, n):
        return self._run(n).n_sweeps

    track_sweeps.unit = "sweeps"
