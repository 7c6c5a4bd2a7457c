"""Threading policy: fits change no process-wide thread count.

Times representative fits with the library's policy (the process's BLAS threads as they are)
against the user switch the README documents (``threadpool_limits(1, "blas")`` around the
fit), on a quiet machine and with one core kept busy by another process; and a batch of
small fits run serially against the same batch in a thread pool of two. Medians of
``--repeats`` runs; ratios are the switch's time over the default's.

    python benchmarks/threading_policy.py [--repeats 5] [--contended]
"""
import argparse
import statistics
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

import fastep
from fastep.kernels import RBF


def _classification(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] + 0.5 * np.sin(3 * X[:, 1]) + 0.3 * rng.normal(size=n) > 0, 1, 0)
    return X, y


CASES = {
    "gpc-opt n=400": (lambda: fastep.GaussianProcessClassifier(RBF()), (400, 4)),
    "gpc-fixed n=2000": (lambda: fastep.GaussianProcessClassifier(RBF(), optimizer=None), (2000, 4)),
    "sparse-gpc n=2000 m=50": (lambda: fastep.SparseGPClassifier(n_inducing=50), (2000, 4)),
    "ivm n=5000 d=200": (lambda: fastep.IVMClassifier(active_set_size=200, n_iterations=2), (5000, 4)),
    "linear-ep n=2000 d=300": (lambda: fastep.LinearEPClassifier(), (2000, 300)),
    "gpc-opt n=100 (small)": (lambda: fastep.GaussianProcessClassifier(RBF()), (100, 3)),
}


def _time_fit(make, X, y, one_thread):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        start = time.perf_counter()
        if one_thread:
            with threadpool_limits(1, user_api="blas"):
                make().fit(X, y)
        else:
            make().fit(X, y)
        return time.perf_counter() - start


def _batch(n_fits, workers):
    data = [_classification(120, 3, seed) for seed in range(n_fits)]

    def one(i):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastep.ConvergenceWarning)
            return fastep.GaussianProcessClassifier(RBF()).fit(*data[i]).predict_proba(data[i][0])

    start = time.perf_counter()
    if workers == 1:
        out = [one(i) for i in range(n_fits)]
    else:
        with ThreadPoolExecutor(workers) as pool:
            out = list(pool.map(one, range(n_fits)))
    return time.perf_counter() - start, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--contended", action="store_true", help="keep one core busy in another process")
    args = parser.parse_args()
    busy = None
    if args.contended:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        print(f"{'case':28s} {'default s':>10s} {'1 thread s':>11s} {'ratio':>6s}")
        for name, (make, (n, d)) in CASES.items():
            X, y = _classification(n, d)
            _time_fit(make, X, y, False)                     # warm-up (imports, first BLAS calls)
            default = statistics.median(_time_fit(make, X, y, False) for _ in range(args.repeats))
            single = statistics.median(_time_fit(make, X, y, True) for _ in range(args.repeats))
            print(f"{name:28s} {default:10.3f} {single:11.3f} {single / default:6.2f}", flush=True)
        serial, a = _batch(16, 1)
        pooled, b = _batch(16, 2)
        same = all(np.array_equal(p, q) for p, q in zip(a, b))
        print(f"16 small GPC fits: serial {serial:.2f} s, thread pool of 2 {pooled:.2f} s "
              f"(ratio {pooled / serial:.2f}); bitwise equal: {same}")
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    main()
