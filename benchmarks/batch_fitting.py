"""Batch fitting: fastep.batch.fit_many against a plain loop.

* 200 small data sets (n = 200, 5 features), dense GP classifier with type-II ML: a plain
  Python loop (process BLAS threads), fit_many(n_jobs=1), fit_many(n_jobs=2), and
  fit_many(client=...) on a 2-worker LocalCluster (loopback): throughput in fits per second;
  for the cluster, the scheduler overhead per task is estimated from the same batch of trivial
  tasks.
* a 20-point hyperparameter grid of the dense GP classifier on one data set (n = 600):
  n_jobs=2 against n_jobs=1.
* one-vs-rest IVM on USPS (10 digits, 7291 x 256, d = 200), n_jobs=2 against n_jobs=1 (when
  ../shared/data/usps.npz is present).

    python benchmarks/batch_fitting.py [--n-datasets 200] [--no-dask]
"""
import argparse
import os
import time
import warnings

import numpy as np

import fastep
from fastep.batch import fit_many
from fastep.kernels import RBF, Bias, White


def _datasets(count, n, d, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        X = rng.normal(size=(n, d))
        y = np.where(X[:, 0] + 0.5 * np.sin(2 * X[:, 1]) + 0.3 * rng.normal(size=n) > 0, 1, 0)
        out.append((X, y))
    return out


def _timed(label, fn, count):
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    print(f"{label:44s} {elapsed:8.2f} s  {count / elapsed:8.1f} fits/s", flush=True)
    return elapsed, result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-datasets", type=int, default=200)
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument("--usps-only", action="store_true", help="only the one-vs-rest USPS IVM section")
    args = parser.parse_args()
    warnings.simplefilter("ignore", fastep.ConvergenceWarning)
    if args.usps_only:
        return _usps()
    batch = _batches(args)
    _usps()
    if not args.no_dask:
        _cluster(*batch)


def _batches(args):
    datasets = _datasets(args.n_datasets, 200, 5)
    est = fastep.GaussianProcessClassifier(RBF())
    count = len(datasets)
    t_loop, _ = _timed("plain loop", lambda: [fastep.GaussianProcessClassifier(RBF()).fit(X, y)
                                              for X, y in datasets], count)
    t1, r1 = _timed("fit_many(n_jobs=1)", lambda: fit_many(est, datasets, n_jobs=1), count)
    t2, r2 = _timed("fit_many(n_jobs=2)", lambda: fit_many(est, datasets, n_jobs=2), count)
    same = all(np.array_equal(a.predict_proba(X), b.predict_proba(X)) for a, b, (X, _) in zip(r1, r2, datasets))
    print(f"n_jobs=2 / n_jobs=1 speed-up {t1 / t2:.2f}x, vs the loop {t_loop / t2:.2f}x; bitwise equal: {same}")

    (X, y), = _datasets(1, 600, 5, seed=1)
    grid = [fastep.GaussianProcessClassifier(RBF(v, g), optimizer=None)
            for v in (0.5, 1.0, 2.0, 4.0) for g in (0.05, 0.1, 0.3, 1.0, 3.0)]
    g1, a = _timed("grid of 20, n = 600, n_jobs=1", lambda: fit_many(grid, [(X, y)], n_jobs=1), 20)
    g2, b = _timed("grid of 20, n = 600, n_jobs=2", lambda: fit_many(grid, [(X, y)], n_jobs=2), 20)
    same = all(np.array_equal(p.predict_proba(X), q.predict_proba(X)) for p, q in zip(a, b))
    print(f"grid speed-up {g1 / g2:.2f}x; bitwise equal: {same}")
    return est, datasets, r2, t2


def _usps():
    usps = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "usps.npz")
    if os.path.exists(usps):
        data = np.load(usps)
        Xu, yu = 2.0 * data["X_train"] - 1.0, data["y_train"]
        kernel = RBF(1.0, 1.0 / 256.0) + Bias(0.1) + White(0.01)
        make = lambda n_jobs: fastep.IVMClassifier(kernel, active_set_size=200, n_iterations=1, n_jobs=n_jobs)
        u1, m1 = _timed("USPS 10-class IVM (d = 200), n_jobs=1", lambda: make(1).fit(Xu, yu), 10)
        u2, m2 = _timed("USPS 10-class IVM (d = 200), n_jobs=2", lambda: make(2).fit(Xu, yu), 10)
        Xt = 2.0 * data["X_test"] - 1.0
        same = np.array_equal(m1.predict_proba(Xt), m2.predict_proba(Xt))
        error = np.mean(m2.predict(Xt) != data["y_test"])
        print(f"USPS one-vs-rest speed-up {u1 / u2:.2f}x; bitwise equal: {same}; test error {100 * error:.2f} %")
    else:
        print("USPS one-vs-rest: skipped (../shared/data/usps.npz not found)")


def _cluster(est, datasets, r2, t2):
    count = len(datasets)
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.submit(sum, [1]).result()                 # workers up and importing
        fit_many(est, datasets[:2], client=client)      # fastep imported on the workers
        td, rd = _timed("fit_many(client=LocalCluster(2 workers))", lambda: fit_many(est, datasets, client=client),
                        count)
        start = time.perf_counter()
        client.gather(client.map(lambda i: i, range(count), pure=False))
        overhead = (time.perf_counter() - start) / count
        same = all(np.array_equal(a.predict_proba(X), b.predict_proba(X)) for a, b, (X, _) in zip(r2, rd, datasets))
        print(f"cluster vs n_jobs=2: {t2 / td:.2f}x; scheduler overhead per trivial task "
              f"{1e3 * overhead:.2f} ms; bitwise equal to n_jobs=2: {same}")


if __name__ == "__main__":
    main()
