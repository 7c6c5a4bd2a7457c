"""asv: the sparse GP EP engine (fastep._epcore.sparse_ep) and SparseGPClassifier on the dense-GP toy.

One sequential sweep (rank-1 Cholesky updates, O(nm²)), one rebuild (O(nm²) BLAS-3), full runs to
convergence per schedule and approximation (time, peak memory, sweeps), and one evidence
gradient with respect to the kernel parameters and Z; one BLAS thread (the estimator's policy).
"""
import numpy as np

import fastep
from fastep import Probit
from fastep._epcore import sparse_ep
from fastep.kernels import RBF

from . import build_engine

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None


def _problem(n, m):
    """The dense-GP toy (deterministic) and m inducing inputs drawn from it."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    Z = X[np.sort(np.random.default_rng(1).choice(n, size=m, replace=False))].copy()
    return X, y, Z


def _projection(X, Z, approximation="fitc"):
    k = RBF(variance=1.0, inverse_width=1.0)
    _, Vt, d = sparse_ep.sparse_projection(k(Z), np.ascontiguousarray(k(X, Z)), k.diag(X),
                                           approximation=approximation, jitter=1e-6, overwrite_knm=True)
    return Vt, d


class _OneThread:
    def _limit(self):
        self.limits = threadpool_limits(1, "blas") if threadpool_limits is not None else None

    def teardown(self, *args):
        if getattr(self, "limits", None) is not None:
            self.limits.unregister()


class SparseEPSweep(_OneThread):
    """One sequential sweep and one rebuild, from a warm state two sweeps in."""
    params = [[2000, 20000], [50, 200]]
    param_names = ["n", "m"]
    timeout = 600

    def setup(self, n, m):
        self._limit()
        X, self.y, Z = _problem(n, m)
        self.Vt, self.d = _projection(X, Z)
        self.spec = Probit().site_spec()
        self.tau, self.nu = np.zeros(n), np.zeros(n)
        self.R, self.wm = np.empty((m, m)), np.empty(m)
        engine = build_engine(sparse_ep, "SparseEP", self.Vt, self.d, self.y, self.spec, max_sweeps=2)
        engine.run(self.tau, self.nu, self.R, self.wm)
        if hasattr(engine, "incremental_sweep"):
            self.sweep = engine.incremental_sweep
        else:       # asv times older commits with this suite: there a module function
            self.sweep = lambda *arrays: sparse_ep.incremental_sweep(self.Vt, self.d, self.y, self.spec, *arrays)

    def time_sequential_sweep(self, n, m):
        tau, nu, R, wm = self.tau.copy(), self.nu.copy(), self.R.copy(), self.wm.copy()
        self.sweep(tau, nu, R, wm)

    def time_rebuild(self, n, m):
        R, wm = np.empty_like(self.R), np.empty_like(self.wm)
        sparse_ep.rebuild(self.Vt, self.tau, self.nu, R, wm, np.empty(n), np.empty(n))


class SparseEPRun(_OneThread):
    """Cold runs to convergence (tol 1e-6). The engine's workspace is O(n + m²), allocated before
    the first sweep, so ``peakmem_run`` measures two sweeps, which reach the run's peak."""
    params = [["fitc-sequential", "fitc-parallel", "dtc-sequential"], [2000, 20000], [50, 200]]
    param_names = ["config", "n", "m"]
    timeout = 900

    def setup(self, config, n, m):
        self._limit()
        approximation, schedule = config.split("-")
        X, self.y, Z = _problem(n, m)
        self.Vt, self.d = _projection(X, Z, approximation)
        self.spec = Probit().site_spec()
        self.options = dict(schedule=sparse_ep.SPARSE_PARALLEL if schedule == "parallel" else sparse_ep.SPARSE_SEQUENTIAL,
                            damping=0.5 if schedule == "parallel" else 1.0, tol=1e-6, max_sweeps=500)

    def _run(self, **options):
        n, m = self.Vt.shape
        tau, nu, R, wm = np.zeros(n), np.zeros(n), np.empty((m, m)), np.empty(m)
        engine = build_engine(sparse_ep, "SparseEP", self.Vt, self.d, self.y, self.spec,
                              **dict(self.options, **options))
        return engine.run(tau, nu, R, wm)

    def time_run(self, config, n, m):
        self._run()

    def peakmem_run(self, config, n, m):
        self._run(max_sweeps=2)

    def track_sweeps(self, config, n, m):
        return self._run().n_sweeps

    track_sweeps.unit = "sweeps"


class SparseGPClassifierEvidence(_OneThread):
    """The estimator: a fit with fixed hyperparameters and Z, and one EP run + exact gradient
    (kernel parameters and the m x 2 inducing coordinates)."""
    params = [[2000, 10000], [50]]
    param_names = ["n", "m"]
    timeout = 900

    def setup(self, n, m):
        self._limit()
        self.X, self.y, self.Z = _problem(n, m)
        self.clf = fastep.SparseGPClassifier(RBF(), Probit(), inducing_init=self.Z, optimizer=None,
                                             learn_inducing=True)
        self.clf.fit(self.X, self.y)
        self.theta = np.concatenate([self.clf.kernel_.theta, self.Z.ravel()])

    def time_fit(self, n, m):
        fastep.SparseGPClassifier(RBF(), Probit(), inducing_init=self.Z, optimizer=None).fit(self.X, self.y)

    def time_evidence_gradient(self, n, m):
        self.clf.log_marginal_likelihood(self.theta, eval_gradient=True)

    def peakmem_evidence_gradient(self, n, m):
        self.clf.log_marginal_likelihood(self.theta, eval_gradient=True)


class SparseEPChunked(_OneThread):
    """The map-reduce form of the parallel schedule (``fastep._sparse.distributed``) run in
    process over row chunks (``LocalChunks``; asv does not host a Dask cluster, which
    ``benchmarks/distributed_sparse.py`` measures): one iteration (map over the chunks + the
    m x m reduction) and a full run, against one iteration of the in-core parallel engine."""
    params = [[20000], [50, 200], [1, 8]]
    param_names = ["n", "m", "n_chunks"]
    timeout = 900

    def setup(self, n, m, n_chunks):
        from fastep._sparse import distributed as chunked
        self._limit()
        self.chunked = chunked
        X, y, Z = _problem(n, m)
        self.likelihood = Probit()
        self.options = fastep.SparseGPClassifier(RBF(), self.likelihood)._fit_options()
        kernel = RBF(variance=1.0, inverse_width=1.0)
        Kmm = np.ascontiguousarray(kernel(Z))
        self.executor = chunked.LocalChunks()
        bounds = np.linspace(0, n, n_chunks + 1).astype(int)
        data = [chunked.Chunk(X[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        projected = self.executor.map(chunked.chunk_project, data, kernel, Z, Kmm, self.options)
        self.start = self.executor.map(chunked.chunk_start, projected, False)
        # a warm state two iterations in, as for SparseEPSweep
        chunks = self.start
        for _ in range(2):
            chunks, self.R, self.w_mean = self._iterate(chunks)
        self.warm = chunks
        self.Vt, self.d, self.y = _projection(X, Z) + (y,)
        self.spec = self.likelihood.site_spec()

    def _iterate(self, chunks):
        chunked = self.chunked
        if chunks is self.start:
            sums = self.executor.summaries(chunks)
            R, w_mean, _, _ = chunked.posterior_from_sums(chunked._sum([s[0] for s in sums]),
                                                          chunked._sum([s[1] for s in sums]))
        else:
            R, w_mean = self.R, self.w_mean
        new = self.executor.map(chunked.chunk_iterate, chunks, R, w_mean, self.likelihood, self.options, True)
        sums = self.executor.summaries(new)
        R, w_mean, _, _ = chunked.posterior_from_sums(chunked._sum([s["precision_sum"] for s in sums]),
                                                      chunked._sum([s["natural_mean_sum"] for s in sums]))
        return new, R, w_mean

    def time_chunked_iteration(self, n, m, n_chunks):
        self._iterate(self.warm)

    def time_incore_parallel_iteration(self, n, m, n_chunks):
        # one damped parallel iteration of the compiled engine from zero sites (the same work)
        tau, nu = np.zeros(n), np.zeros(n)
        engine = build_engine(sparse_ep, "SparseEP", self.Vt, self.d, self.y, self.spec,
                              schedule=sparse_ep.SPARSE_PARALLEL, damping=0.5, tol=1e-300, max_sweeps=1)
        engine.run(tau, nu, np.empty((m, m)), np.empty(m))

    def time_chunked_run(self, n, m, n_chunks):
        self.chunked.run_parallel_ep(self.executor, self.start, self.likelihood, self.options)
