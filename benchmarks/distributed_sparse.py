"""Sparse EP at large N: in-core sequential and parallel schedules against the distributed one.

    python benchmarks/distributed_sparse.py                      # N = 1e5 and 1e6, m = 200
    python benchmarks/distributed_sparse.py --n 100000 --iterations 3   # quicker

Data: N points in 10 dimensions, uniform on [-1, 1]^10, labels ``sign(f(x) + noise)`` for a
smooth f; probit likelihood, ``RBF(1, 1)`` kernel (fixed), m = 200 inducing inputs (a seeded
random subset), FITC.  The data are made in row blocks by a seeded function of the block
number, so the in-core runs and the cluster see the same numbers without the driver ever
holding them in the distributed run.

Every mode runs in its own process (so that its peak RSS is its own):

* ``incore-parallel`` / ``incore-sequential``: the compiled engine on the full arrays
  (``SparseGPClassifier`` internals, BLAS with the process's default threads, 2 here);
* ``dask``: a ``LocalCluster`` of 2 worker processes x 1 thread on 127.0.0.1; the chunks
  are made on the workers, each EP iteration is one map over the chunks and one m x m
  reduction on the driver (``fastep._sparse.distributed``).

Per mode: the time of the projection (K(X, Z), Vt and the FITC diagonal), the median time
of one EP iteration over ``--iterations`` iterations from zero sites (tol = 0, so none
stops early), a complete fit to convergence (``optimizer=None``, tol = 1e-6: total time and
iterations), and the peak RSS of the driver (and of each worker for ``dask``).
"""
import argparse
import json
import os
import resource
import time

import numpy as np
from _child import run_child

DIM = 10
SEED = 20261124


def make_block(index, rows):
    """Rows of block ``index``: X (rows x DIM) and ±1 labels, from a seed of the block number."""
    rng = np.random.default_rng([SEED, index])
    X = rng.uniform(-1.0, 1.0, size=(rows, DIM))
    f = np.sin(3.0 * X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    y = np.where(f + 0.3 * rng.standard_normal(rows) > 0.0, 1.0, -1.0)
    return X, y


def block_sizes(n, rows):
    return [min(rows, n - s) for s in range(0, n, rows)]


def inducing_inputs(n, m, rows):
    """m rows chosen by a seeded random subset, made from their blocks (same in every mode)."""
    index = np.sort(np.random.default_rng(SEED).choice(n, size=m, replace=False))
    Z = np.empty((m, DIM))
    for b, size in enumerate(block_sizes(n, rows)):
        lo = b * rows
        sel = (index >= lo) & (index < lo + size)
        if np.any(sel):
            Z[sel] = make_block(b, size)[0][index[sel] - lo]
    return Z


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_incore(n, m, rows, iterations, schedule):
    from fastep import SparseGPClassifier
    from fastep._epcore import sparse_ep as engine
    from fastep._sparse.blocks import project_rows
    from fastep.kernels import RBF
    from fastep.likelihoods import Probit

    blocks = [make_block(b, size) for b, size in enumerate(block_sizes(n, rows))]
    X = np.concatenate([b[0] for b in blocks])
    y = np.concatenate([b[1] for b in blocks])
    del blocks
    Z = inducing_inputs(n, m, rows)
    kernel, likelihood = RBF(), Probit()
    est = SparseGPClassifier(kernel, likelihood, schedule=schedule, inducing_init=Z, optimizer=None,
                             learn_inducing=False)
    opts = est._fit_options()
    t0 = time.perf_counter()
    _, Vt, d = project_rows(kernel, X, Z, np.ascontiguousarray(kernel(Z)), opts)
    t_project = time.perf_counter() - t0
    R, w_mean = np.empty((m, m)), np.empty(m)
    code = engine.SPARSE_PARALLEL if schedule == "parallel" else engine.SPARSE_SEQUENTIAL

    def sweeps(k):                    # k iterations from zero sites (tol = 0: none stops early)
        tau, nu = np.zeros(n), np.zeros(n)
        t0 = time.perf_counter()
        options = engine.SparseEPOptions(schedule=code, damping=opts.damping, tol=1e-300, max_sweeps=k)
        engine.SparseEP(Vt, d, y, likelihood.site_spec(), options, validate=False).run(tau, nu, R, w_mean)
        return time.perf_counter() - t0

    # the engine's loop cannot be timed from outside one iteration at a time: the time of one
    # iteration is (time of 1 + k iterations - time of 1 iteration) / k
    one = sweeps(1)
    more = sweeps(1 + iterations)
    times = [(more - one) / iterations]
    Vt = d = None                      # free the projection before the full fit
    t0 = time.perf_counter()
    est.fit(X, y)
    t_fit = time.perf_counter() - t0
    return dict(project=t_project, iteration=float(np.median(times)), iterations=times, fit=t_fit,
                fit_iterations=int(est.n_sweeps_), log_z=est.log_marginal_likelihood_value_,
                driver_rss_mb=peak_rss_mb())


def run_dask(n, m, rows, iterations):
    import dask
    import dask.array as da
    import distributed

    from fastep import SparseGPClassifier
    from fastep._sparse import distributed as chunked
    from fastep.kernels import RBF
    from fastep.likelihoods import Probit

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, memory_limit=0)
    client = distributed.Client(cluster)
    try:
        sizes = block_sizes(n, rows)
        parts = [dask.delayed(make_block, nout=2)(b, size) for b, size in enumerate(sizes)]
        X = da.concatenate([da.from_delayed(p[0], shape=(size, DIM), dtype=float)
                            for p, size in zip(parts, sizes)])
        y = da.concatenate([da.from_delayed(p[1], shape=(size,), dtype=float) for p, size in zip(parts, sizes)])
        X, y = client.persist([X, y])
        distributed.wait([X, y])
        Z = inducing_inputs(n, m, rows)
        kernel, likelihood = RBF(), Probit()
        est = SparseGPClassifier(kernel, likelihood, schedule="parallel", inducing_init=Z, optimizer=None,
                                 learn_inducing=False)
        opts = est._fit_options()
        executor, data, sizes, X = chunked.load_dask_data(X, y, client, kernel, True, "benchmark")
        data = executor.map(chunked.binary_targets, data, 1.0)
        distributed.wait(data)
        Kmm = np.ascontiguousarray(kernel(Z))
        t0 = time.perf_counter()
        projected = executor.map(chunked.chunk_project, data, kernel, Z, Kmm, opts)
        distributed.wait(projected)
        t_project = time.perf_counter() - t0
        chunks = executor.map(chunked.chunk_start, projected, False)
        distributed.wait(chunks)
        sums = executor.summaries(chunks)
        R, w_mean, _, _ = chunked.posterior_from_sums(chunked._sum([s[0] for s in sums]),
                                                      chunked._sum([s[1] for s in sums]))
        times = []
        for _ in range(iterations):     # exactly the driver loop's iteration: map, gather, reduce
            t0 = time.perf_counter()
            new = executor.map(chunked.chunk_iterate, chunks, R, w_mean, likelihood, opts, True)
            sums = executor.summaries(new)
            R, w_mean, _, _ = chunked.posterior_from_sums(
                chunked._sum([s["precision_sum"] for s in sums]), chunked._sum([s["natural_mean_sum"] for s in sums]))
            times.append(time.perf_counter() - t0)
            chunks = new
        del chunks, new, projected
        t0 = time.perf_counter()
        est.fit(X, y, client=client)
        t_fit = time.perf_counter() - t0
        workers = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        return dict(project=t_project, iteration=float(np.median(times)), iterations=times, fit=t_fit,
                    fit_iterations=int(est.n_sweeps_), log_z=est.log_marginal_likelihood_value_,
                    driver_rss_mb=peak_rss_mb(), worker_rss_mb=sorted(workers.values()),
                    n_chunks=len(sizes))
    finally:
        client.close()
        cluster.close()


def child(args):
    if args.mode == "dask":
        out = run_dask(args.n[0], args.m, args.rows, args.iterations)
    else:
        out = run_incore(args.n[0], args.m, args.rows, args.iterations, args.mode.split("-")[1])
    print("RESULT " + json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--m", type=int, default=200)
    parser.add_argument("--rows", type=int, default=125_000, help="rows per chunk / block")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["incore-parallel", "incore-sequential", "dask"])
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        return child(args)
    print(f"load average {os.getloadavg()[0]:.2f}; m = {args.m}, {DIM} inputs, chunks of {args.rows} rows")
    results = {}
    for n in args.n:
        rows = min(args.rows, max(1, n // 8))
        for mode in args.modes:
            res = run_child(__file__, ["--mode", mode, "--n", n, "--m", args.m, "--rows", rows,
                                       "--iterations", args.iterations], f"N={n} {mode}")
            if res is None:
                continue
            results[(n, mode)] = res
            workers = (" workers " + " / ".join(f"{w:.0f}" for w in res["worker_rss_mb"]) + " MB"
                       if "worker_rss_mb" in res else "")
            print(f"N={n:>8} {mode:18s} projection {res['project']:7.2f} s  iteration {res['iteration']:7.3f} s "
                  f"(runs {', '.join(f'{t:.2f}' for t in res['iterations'])})  fit {res['fit']:7.1f} s in "
                  f"{res['fit_iterations']} iterations, log Z {res['log_z']:.6f}  driver {res['driver_rss_mb']:.0f} MB"
                  + workers, flush=True)
        if (n, "dask") in results and (n, "incore-parallel") in results:
            ratio = results[(n, "dask")]["iteration"] / results[(n, "incore-parallel")]["iteration"]
            print(f"N={n:>8} distributed / in-core parallel time per iteration: {ratio:.2f}x")
    ns = sorted({n for n, _ in results})
    if len(ns) > 1:
        for mode in args.modes:
            if (ns[0], mode) in results and (ns[-1], mode) in results:
                growth = results[(ns[-1], mode)]["iteration"] / results[(ns[0], mode)]["iteration"]
                print(f"{mode}: time per iteration x{growth:.1f} from N={ns[0]} to N={ns[-1]} "
                      f"(N x{ns[-1] / ns[0]:.0f})")


if __name__ == "__main__":
    main()
