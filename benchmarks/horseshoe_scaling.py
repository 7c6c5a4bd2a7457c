"""Horseshoe EP: cost of one parallel EP iteration against d (n = 100), and time to convergence.

One iteration is O(n²d + m²d) linear algebra (eqs 2-13: the split Woodbury form for V_w,
the low-rank form for V_u, V_v) plus d one-dimensional quadratures (eqs 15-21, compiled).
The script times both parts separately (median of repeats, hyperparameters fixed, sites
from a converged run so that the split set S holds the relevant features as in practice)
and then EP from the cold start to tol = 1e-8 at d = 10 000.

    python benchmarks/horseshoe_scaling.py                 # d = 1000 ... 20000
    python benchmarks/horseshoe_scaling.py --quick         # d = 1000, 2000
    python benchmarks/horseshoe_scaling.py --m 10          # with a rank-10 P

Unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for this command if they are set (ENGINEERING.md).
"""
import argparse
import os
import time

import numpy as np
from threadpoolctl import threadpool_info

from fastep import _horseshoe_engine as eng
from fastep._epcore import horseshoe as core


def make(n, d, m, seed=0, n_relevant=10):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[:n_relevant] = rng.choice([-1, 1], n_relevant) * rng.uniform(1, 3, n_relevant)
    y = X @ w + 0.5 * rng.normal(size=n)
    X -= X.mean(axis=0)
    y -= y.mean()
    P = 0.3 * rng.normal(size=(d, m))
    return eng.Task(X, y), eng.CorrelationFactors(P, np.ones(d))


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--m", type=int, default=0)
    parser.add_argument("--sizes", type=str, default=None, help="comma-separated d values")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = ([1000, 2000] if args.quick else [1000, 2000, 5000, 10000, 20000]) if args.sizes is None \
        else [int(s) for s in args.sizes.split(",")]
    blas = [(i["internal_api"], i.get("num_threads"), i.get("architecture")) for i in threadpool_info()
            if i["user_api"] == "blas"]
    print(f"BLAS {blas}; OpenMP site step: {core.OPENMP} ({core.max_threads()} threads); cpus {os.cpu_count()}")
    s2, r2, g2 = 0.25, 1e-3, 1.0
    print(f"n = {args.n}, m = {args.m}, sigma2 = {s2}, rho2 = {r2}, gamma2 = {g2}")
    print(f"{'d':>7} {'marginals (s)':>14} {'site step (s)':>14} {'iteration (s)':>14} "
          f"{'k=|S|':>6} {'EP iters':>8} {'EP to 1e-8 (s)':>15}")
    for d in sizes:
        task, cf = make(args.n, d, args.m)
        sites = eng.initial_sites(d, r2, g2)
        t0 = time.perf_counter()
        res = eng.run_task_ep(task, s2, r2, g2, cf, sites, tol=1e-8, max_iter=2000)
        t_conv = time.perf_counter() - t0
        state = eng._marginals(task, s2, r2, g2, cf, sites)
        k = int(np.sum(sites["pi_w"] < eng.SPLIT * task.col_sq / s2))
        t_marg = median_time(lambda: eng._marginals(task, s2, r2, g2, cf, sites), args.repeats)
        args_step = (state["w"]["cav_mean"], state["cav_var"], state["u"]["cav_var"], state["v"]["cav_var"],
                     state["w"]["mean"], state["w"]["var"], state["u"]["var"], state["v"]["var"],
                     sites["pi_w"], sites["h_w"], sites["pi_u"], sites["pi_v"])
        t_step = median_time(lambda: core.site_step(*args_step), args.repeats)
        print(f"{d:>7} {t_marg:>14.4f} {t_step:>14.4f} {t_marg + t_step:>14.4f} {k:>6} "
              f"{res['n_iter']:>8} {t_conv:>15.2f}  ({res['status']})")


if __name__ == "__main__":
    main()
