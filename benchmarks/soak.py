"""Soak: 10 000 small fits of each estimator in one process.

Reports per estimator the resident memory after a 100-fit warm-up and after all the fits
(growth target < 20 MB), open file descriptors and threads before and after, and fits per
second. Linux only (reads /proc/self).

    python benchmarks/soak.py                  # 10 000 fits each (about 20 minutes on 2 cores)
    python benchmarks/soak.py --fits 1000 --only LinearEPClassifier IVMClassifier
"""
import argparse
import gc
import os
import sys
import threading
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from test_soak import ESTIMATORS, _fds, _problem, _rss_mb  # noqa: E402

import fastep  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=10_000)
    parser.add_argument("--only", nargs="+", default=list(ESTIMATORS))
    args = parser.parse_args()
    print("| estimator | fits | RSS after warm-up | RSS growth | fds before / after | threads before / after "
          "| fits/s |\n|---|---|---|---|---|---|---|")
    for name in args.only:
        make, kind = ESTIMATORS[name]
        data = [_problem(seed, kind) for seed in range(10)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastep.ConvergenceWarning)
            for i in range(100):
                X, y = data[i % 10]
                make().fit(X, y).predict(X)
            gc.collect()
            rss, fds, threads = _rss_mb(), _fds(), threading.active_count()
            start = time.perf_counter()
            for i in range(args.fits):
                X, y = data[i % 10]
                make().fit(X, y).predict(X)
            elapsed = time.perf_counter() - start
        gc.collect()
        print(f"| {name} | {args.fits} | {rss:.1f} MB | {_rss_mb() - rss:+.2f} MB | {fds} / {_fds()} | "
              f"{threads} / {threading.active_count()} | {args.fits / elapsed:.0f} |", flush=True)


if __name__ == "__main__":
    main()
