"""IVM refinement on a fixed-size active set: EP sweeps and exchange moves at USPS scale.

    python benchmarks/ivm_refine_timing.py            # digit 0 against the rest, n = 7291, d = 500
    python benchmarks/ivm_refine_timing.py --d 200 --moves 5
    python benchmarks/ivm_refine_timing.py --gains-repeats 7   # also time the exchange scoring alone

One binary USPS problem (digit 0 against the rest, pixels mapped to [-1, 1], the
paper's base kernel RBF(1, 1/256) + Linear + Bias + White, fixed, probit
likelihood) as in ``ivm_selection_scaling.py``: select d points with Algorithm 1,
then time

* ``IVMEP.refine``: the first call (which also fetches the d kernel rows
  K[I, :]), the EP sweeps to convergence, and a final ``refactorize``;
* with ``--gains-repeats R``: R calls of ``IVMEP.exchange_gains`` (one O(d² n)
  refactorisation that also forms Σ[I, :], then the entropy gain of every one of the
  d (n - d) pairs, eqs 8-9: the scoring pass of a greedy move) and, for reference, R calls
  of ``refactorize`` (the O(d² n) part without Σ[I, :]); medians and minima;
* ``IVMEP.exchange``: ``--moves`` greedy moves (each scores all d (n - d) pairs)
  and ``--moves`` random-search moves;

and prints the entropy criterion before and after, and the peak resident memory.
BLAS runs on one thread, as in the estimators. Skipped when ``../shared/data/usps.npz``
is absent.
"""
import argparse
import os
import pathlib
import resource
import time

import numpy as np
from threadpoolctl import threadpool_limits

from fastep._epcore import ivm as engine
from fastep.kernels import RBF, Bias, Linear, White
from fastep.likelihoods import Probit

USPS = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "usps.npz"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=500)
    parser.add_argument("--moves", type=int, default=3)
    parser.add_argument("--sweeps", type=int, default=100)
    parser.add_argument("--gains-repeats", type=int, default=0,
                        help="time this many exchange_gains (and refactorize) calls after the refinement")
    args = parser.parse_args()
    if not USPS.is_file():
        print(f"{USPS} not found; skipped")
        return
    data = np.load(USPS)
    X = 2.0 * data["X_train"] - 1.0
    y = np.where(data["y_train"] == 0, 1.0, -1.0)
    n, p = X.shape
    kernel = RBF(1.0, 1.0 / p) + Linear(1.0) + Bias(np.exp(-2)) + White(np.exp(-2))
    with threadpool_limits(1, "blas"):
        cols = kernel.columns(X)
        st = engine.IVMEP(y, Probit().site_spec(), cols.diag, args.d)
        t = time.perf_counter()
        st.select(args.d, cols)
        t_select = time.perf_counter() - t
        crit0 = st.entropy_reduction()
        print(f"load average {os.getloadavg()[0]:.2f}")
        print(f"n = {n}, d = {args.d}: selection {t_select:.2f} s, entropy criterion {crit0:.4f}")

        t = time.perf_counter()
        info = st.refine(cols, n_sweeps=1)
        t_first = time.perf_counter() - t
        t = time.perf_counter()
        info2 = st.refine(cols, n_sweeps=args.sweeps)
        t_sweeps = time.perf_counter() - t
        t = time.perf_counter()
        st.refactorize(cols)
        t_refactor = time.perf_counter() - t
        print(f"refine, 1 sweep incl. fetching K[I, :] ({args.d} columns): {t_first:.2f} s")
        print(f"refine, {info2.n_sweeps} more sweeps to convergence ({info2.converged}, "
              f"{info2.n_updates} site updates): {t_sweeps:.2f} s = "
              f"{t_sweeps / max(info2.n_sweeps, 1):.3f} s per sweep (with one O(d^2 n) refactorisation)")
        print(f"refactorize (kernel rows cached): {t_refactor:.3f} s; entropy criterion {st.entropy_reduction():.4f}")

        if args.gains_repeats > 0:
            t_gains, t_refac = [], []
            for _ in range(args.gains_repeats):
                t = time.perf_counter()
                st.refactorize(cols)
                t_refac.append(time.perf_counter() - t)
                t = time.perf_counter()
                st.exchange_gains(cols)
                t_gains.append(time.perf_counter() - t)
            print(f"exchange_gains ({args.d} x {n - args.d} pairs scored, after one refactorisation with "
                  f"Σ[I, :]): median {np.median(t_gains):.3f} s, min {min(t_gains):.3f} s over "
                  f"{args.gains_repeats}; refactorize alone: median {np.median(t_refac):.3f} s, "
                  f"min {min(t_refac):.3f} s")

        for mode in ("greedy", "random"):
            t = time.perf_counter()
            ex = st.exchange(cols, mode, tol=1e-6, max_moves=args.moves, seed=1)
            dt = time.perf_counter() - t
            gains = ", ".join(f"{g:.4f}" for _, _, g in ex.moves)
            print(f"exchange {mode}: {ex.n_moves} moves in {dt:.2f} s "
                  f"({dt / max(ex.n_moves, 1):.3f} s per move incl. one extra scoring pass and the "
                  f"O(d^2 n) setup); gains {gains}; criterion {st.entropy_reduction():.4f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"peak resident memory {peak:.0f} MB (M, K[I, :] and Σ[I, :] are {args.d * n * 8 / 2**20:.0f} MB each)")


if __name__ == "__main__":
    main()
