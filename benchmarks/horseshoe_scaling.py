"""Horseshoe EP: cost of one parallel EP iteration against d (n = 100), and time to convergence.

One iteration is O(n²d + m²d) linear algebra (eqs 2-13: the split Woodbury form for V_w,
the low-rank form for V_u, V_v) plus d one-dimensional quadratures (eqs 15-21), all in the
compiled engine (HorseshoeEP). The script times one iteration as the difference between a run
of one iteration and the evaluation of the same sites (``max_sweeps=0``), and the quadratures
alone (``tilted_moments`` at the cavities; the marginals are the rest), medians of repeats,
hyperparameters fixed, sites from a converged run so that the split set S holds the relevant
features as in practice,
fits the log-log slope of the iteration time against d (1 = linear), and runs EP from the
cold start to tol = 1e-8 at every d (the d = 10 000 row is the time-to-convergence target's).
Memory: the peak of numpy allocations (tracemalloc; the engine's buffers are numpy arrays)
during a one-iteration run and during the whole EP run, next to the size a d x d matrix would
take; the process's peak RSS at the end.

    python benchmarks/horseshoe_scaling.py                 # d = 1000 ... 20000
    python benchmarks/horseshoe_scaling.py --quick         # d = 1000, 2000
    python benchmarks/horseshoe_scaling.py --m 10          # with a rank-10 P
    python benchmarks/horseshoe_scaling.py --blas-threads 1

Unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for this command if they are set (ENGINEERING.md).

Measured with the numpy loop that preceded the compiled engine (2 cores shared with other jobs,
load 2-6; OMP_NUM_THREADS=1, --blas-threads 1, medians of 11): one iteration 0.011 / 0.014 / 0.048 / 0.063 / 0.125 s at d = 1000 / 2000 /
5000 / 10 000 / 20 000 (log-log slope 0.85), EP to 1e-8 at d = 10 000 in 12.2 s (142
iterations); peak traced memory of one iteration 17 MB at d = 10 000 and 34 MB at 20 000
(a d x d array: 800 MB / 3.2 GB), peak RSS 200 MB. With the default two BLAS threads the
same runs were 1.3-10x slower under that load. With m = 10 (P = 0.3 N(0, 1)) EP stopped as
'stuck' at every d (the u/v marginals' shared factors become improper).
"""
import argparse
import os
import resource
import time
import timeit
import tracemalloc

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from fastep._epcore import horseshoe as core
from fastep._epcore.horseshoe_ep import HorseshoeEP, HorseshoeOptions, HorseshoePrior


def make(n, d, m, seed=0, n_relevant=10):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[:n_relevant] = rng.choice([-1, 1], n_relevant) * rng.uniform(1, 3, n_relevant)
    y = X @ w + 0.5 * rng.normal(size=n)
    X -= X.mean(axis=0)
    y -= y.mean()
    P = 0.3 * rng.normal(size=(d, m))
    return X, y, P


def median_time(fn, repeats):
    return float(np.median(timeit.repeat(fn, number=1, repeat=repeats)))


def traced_peak_mb(fn):
    """Peak of traced (numpy) allocations while ``fn`` runs, in MB."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--m", type=int, default=0)
    parser.add_argument("--sizes", type=str, default=None, help="comma-separated d values")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-trace", action="store_true", help="skip the tracemalloc peaks")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="limit BLAS to this many threads (default: the process default)")
    args = parser.parse_args()
    sizes = ([1000, 2000] if args.quick else [1000, 2000, 5000, 10000, 20000]) if args.sizes is None \
        else [int(s) for s in args.sizes.split(",")]
    if args.blas_threads is not None:
        limiter = threadpool_limits(args.blas_threads, "blas")  # noqa: F841  (held for the whole run)
    blas = [(i["internal_api"], i.get("num_threads"), i.get("architecture")) for i in threadpool_info()
            if i["user_api"] == "blas"]
    print(f"BLAS {blas}; OpenMP site step: {core.OPENMP} ({core.max_threads()} threads); cpus {os.cpu_count()}")
    s2, r2, g2 = 0.25, 1e-3, 1.0
    print(f"n = {args.n}, m = {args.m}, sigma2 = {s2}, rho2 = {r2}, gamma2 = {g2}")
    print(f"{'d':>7} {'marginals (s)':>14} {'site step (s)':>14} {'iteration (s)':>14} {'k=|S|':>6} "
          f"{'EP iters':>8} {'EP to 1e-8 (s)':>15} {'EP s/iter':>10} {'peak MB iter':>13} {'peak MB EP':>11} "
          f"{'d x d MB':>9}")
    rows = []
    for d in sizes:
        X, y, P = make(args.n, d, args.m)
        prior = HorseshoePrior(r2, g2, P, np.ones(d))
        result = {}

        def ep():
            t0 = time.perf_counter()
            result["res"] = HorseshoeEP(X, y, s2, prior, HorseshoeOptions(tol=1e-8, max_sweeps=2000)).run()
            result["time"] = time.perf_counter() - t0

        if args.no_trace:
            ep()
            peak_ep = float("nan")
        else:  # tracemalloc costs per allocation, not per flop: negligible next to the BLAS work here
            peak_ep = traced_peak_mb(ep)
        res, t_conv = result["res"], result["time"]
        sites = res.sites
        k = int(np.sum(res.factors[1])) if res.factors[0] == "split" else d

        def evaluation():
            HorseshoeEP(X, y, s2, prior, HorseshoeOptions(max_sweeps=0), sites).run()

        def iteration():
            HorseshoeEP(X, y, s2, prior, HorseshoeOptions(tol=0.0, max_sweeps=1), sites).run()

        cavities = (res.cavity_mean, res.cavity_var, res.cavity_var_u, res.cavity_var_v)
        t_iter = max(median_time(iteration, args.repeats) - median_time(evaluation, args.repeats), 0.0)
        t_step = median_time(lambda: core.tilted_moments(*cavities), args.repeats)
        t_marg = max(t_iter - t_step, 0.0)
        peak_iter = float("nan") if args.no_trace else traced_peak_mb(iteration)
        rows.append((d, t_iter))
        print(f"{d:>7} {t_marg:>14.4f} {t_step:>14.4f} {t_iter:>14.4f} {k:>6} {res.n_sweeps:>8} "
              f"{t_conv:>15.2f} {t_conv / max(res.n_sweeps, 1):>10.4f} {peak_iter:>13.1f} {peak_ep:>11.1f} "
              f"{8e-6 * d * d:>9.0f}  ({res.status})")
    if len(rows) > 1:
        ds, ts = np.log([r[0] for r in rows]), np.log([r[1] for r in rows])
        slope = np.polyfit(ds, ts, 1)[0]
        print(f"log-log slope of the iteration time against d: {slope:.2f} (1 = linear in d)")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
