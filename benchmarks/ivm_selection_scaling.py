"""IVM selection (Algorithm 1): time per inclusion against n and d, and one binary selection at USPS scale.

    python benchmarks/ivm_selection_scaling.py            # full run (about two minutes)
    python benchmarks/ivm_selection_scaling.py --quick    # smaller grid, no USPS section
    python benchmarks/ivm_selection_scaling.py --usps-only --repeat 7   # the USPS ratios alone

Part 1 times the compiled engine (``fastep._epcore.ivm.IVMEP.select``) on
synthetic 16-dimensional data with an RBF + White kernel and a probit
likelihood, for several n and d, and prints the mean time per inclusion and
that time divided by n d / 2 (the average number of M entries read per
inclusion): Algorithm 1 is O(d² n), so the normalised figure should be roughly
constant once the problem no longer fits in cache.

Part 2 selects d = 500 points for one binary USPS problem (digit 0 against the
rest, n = 7291, pixels mapped to [-1, 1] as in the paper, kernel RBF(1, 1/256) +
Linear + Bias + White (the paper's base kernel, fixed)) and splits the time into
the kernel columns (``Kernel.columns``, one O(n p) column per inclusion) and the
engine (scoring pass + inclusion update), and times the bare BLAS calls of the
same selection alone (``bare_blas_selection``: the M reads of eq 30, one gemv
per inclusion, and optionally the row-append triangular solves, which the engine
does not need because the new row of L is read off M). The engine time is also
split into the scoring passes (``IVMEP.score`` timed at the state after 0, d/2
and d - 1 inclusions, averaged over the three, times d) and the rest (the
inclusion update, whose gemv is the M reads). Timed apart, the M reads find much of M
(28 MB) in the 32 MB L3 cache, which the selection cannot, as each kernel column streams
X (15 MB) between them; so the bare calls are also timed in one loop, X gemv, M reads and
solve per step (``bare_blas_selection(..., X=X)``), and the selection is compared with
that too. The data are
``../shared/data/usps.npz``; the section is skipped when the file is absent.

Timings are medians of ``--repeat`` runs, and the ratios are those of medians
measured in the same run (the 2-core machines are shared: the load average is
printed with each section); BLAS runs on one thread (the engine's setting; with
``--two-threads`` the other setting is printed too).
"""
import argparse
import os
import pathlib
import time

import numpy as np
from threadpoolctl import threadpool_limits

from fastep._epcore import ivm as engine
from fastep.kernels import RBF, Bias, Linear, White
from fastep.likelihoods import Probit

USPS = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "usps.npz"


def _median(fun, repeat):
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fun()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def _load():
    return f"load average {os.getloadavg()[0]:.2f}"


def scaling(ns, ds, repeat):
    rng = np.random.default_rng(0)
    print(f"Part 1: time per inclusion (engine + kernel column), synthetic data, RBF + White, probit ({_load()})")
    print(f"{'n':>7} {'d':>5} {'total s':>9} {'per incl. ms':>13} {'ns per (n d/2)':>15}")
    for n in ns:
        X = rng.normal(size=(n, 16))
        y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
        kernel = RBF(1.0, 0.1) + White(0.01)
        cols = kernel.columns(X)
        spec = Probit().site_spec()
        for d in ds:
            if d > n:
                continue

            def run():
                st = engine.IVMEP(y, spec, cols.diag, d)
                st.select(d, cols)
                return st

            t, _ = _median(run, repeat)
            print(f"{n:>7} {d:>5} {t:>9.3f} {t / d * 1e3:>13.3f} {t / d / (n * d / 2) * 1e9:>15.3f}")


def usps(d, repeat, threads_list=(1,)):
    if not USPS.is_file():
        print(f"\nPart 2 skipped: {USPS} not found")
        return
    data = np.load(USPS)
    X = np.ascontiguousarray(2.0 * data["X_train"] - 1.0)
    y = np.where(data["y_train"] == 0, 1.0, -1.0)
    n = X.shape[0]
    kernel = RBF(1.0, 1.0 / X.shape[1]) + Linear(1.0 / X.shape[1]) + Bias(np.exp(-2)) + White(np.exp(-2))
    cols = kernel.columns(X)
    spec = Probit().site_spec()
    print(f"\nPart 2: one binary USPS selection (digit 0 vs rest), n = {n}, d = {d}, p = {X.shape[1]}")
    print(f"  M holds {d * n * 8 / 2**20:.1f} MB (the n x n kernel would be {n * n * 8 / 2**20:.0f} MB)")
    for threads in threads_list:
        with threadpool_limits(threads, "blas"):
            col_time = [0.0]

            def timed_cols(j):
                t0 = time.perf_counter()
                c = cols(j)
                col_time[0] += time.perf_counter() - t0
                return c

            # The scoring pass alone, at the states after 0, d/2 and d - 1 inclusions (the
            # pass is repeated there; for the entropy criterion it is pure).
            score_at = {0: None, d // 2: None, d - 1: None}
            probe = engine.IVMEP(y, spec, cols.diag, d)

            def probing_cols(j):
                k = probe.n_active
                if k in score_at:
                    score_at[k], _ = _median(probe.score, max(repeat, 5) * 4)
                return cols(j)

            probe.select(d, probing_cols)
            t_score = float(np.mean(list(score_at.values())))
            runs = []
            for _ in range(repeat):
                col_time[0] = 0.0
                st = engine.IVMEP(y, spec, cols.diag, d)
                t0 = time.perf_counter()
                st.select(d, timed_cols)
                total = time.perf_counter() - t0
                M = np.ascontiguousarray(st.M)
                L = np.ascontiguousarray(st.L)
                points = np.ascontiguousarray(st.active, dtype=np.intc)
                t_reads, _ = _median(lambda: engine.bare_blas_selection(M, L, points, False), 1)
                t_solves, _ = _median(lambda: engine.bare_blas_selection(M, L, points, True), 1)
                t_x, _ = _median(lambda: [X @ X[j] for j in range(50)], 1)
                try:
                    t_all, _ = _median(lambda: engine.bare_blas_selection(M, L, points, True, X), 1)
                except TypeError:                    # an engine from before bare_blas_selection(X=)
                    t_all = np.nan
                runs.append((total, col_time[0], t_reads, t_solves, t_x / 50 * d, t_all))
            total, t_cols, t_reads, t_solves, x_gemv, t_all = np.median(np.array(runs), axis=0)
            engine_time = total - t_cols
            t_scoring = t_score * d
            print(f"  BLAS threads {threads} (medians of {repeat} runs, {_load()}):")
            print(f"    selection total          {total:8.3f} s  ({total / d * 1e3:.2f} ms per inclusion)")
            print(f"    kernel columns           {t_cols:8.3f} s  (bare X @ x_j gemv alone: {x_gemv:.3f} s)")
            print(f"    engine (score + update)  {engine_time:8.3f} s  (scoring passes about {t_scoring:.3f} s: "
                  f"{t_score * 1e3:.3f} ms per pass, at k = 0, d/2, d-1: "
                  + ", ".join(f"{v * 1e3:.3f}" for v in score_at.values()) + " ms)")
            print(f"    bare BLAS: M reads       {t_reads:8.3f} s;  + row-append solves {t_solves:8.3f} s")
            print(f"    ratio engine / bare (M reads + solves)              {engine_time / t_solves:6.2f}")
            print(f"    ratio engine / bare M reads                         {engine_time / t_reads:6.2f}")
            print(f"    bare BLAS of the whole selection in one loop (X gemv, M reads, solves): {t_all:.3f} s")
            print(f"    ratio selection / bare (M reads + solves + X gemv)  {total / (t_solves + x_gemv):6.2f}"
                  f"   (one loop: {total / t_all:.2f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--usps-only", action="store_true", help="skip part 1")
    parser.add_argument("--two-threads", action="store_true", help="part 2 also with two BLAS threads")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not args.usps_only:
        with threadpool_limits(1, "blas"):
            if args.quick:
                scaling([1000, 4000], [50, 200], args.repeat)
            else:
                scaling([1000, 2000, 4000, 8000], [100, 200, 400], args.repeat)
    if not args.quick:
        usps(500, args.repeat, (1, 2) if args.two_threads else (1,))


if __name__ == "__main__":
    main()
