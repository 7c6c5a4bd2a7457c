"""Time the same workloads on two builds of fastep, side by side, in one run.

A refactoring that is meant to leave the speed alone is checked here: each workload runs in
a fresh process of one interpreter, then of the other, alternately, ``--rounds`` times; the
report gives each build's median and the ratio new/old. The workloads are the estimators and
the validated engines: a build's engine class (``DenseEP``, ``SparseEP``, ``LinearEP``) where it
has one, else its function form (``run_gp_ep``, ``run_sparse_ep``, ``run_linear_ep``), so one
script times builds on either side of that change; both paths check the inputs, build the
engine and run it.

    python benchmarks/compare_builds.py --old /path/to/old/venv/bin/python \\
        --new /path/to/new/venv/bin/python --rounds 5

Run it on a quiet machine (no test suite or build beside it): the 2-core machines here
change by a few per cent between runs, which the medians of alternating rounds absorb.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np


def _rbf(X, inverse_width=1.0):
    sq = np.sum(X * X, axis=1)
    return np.exp(-0.5 * inverse_width * (sq[:, None] + sq[None, :] - 2.0 * X @ X.T))


def _binary(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def _dense_run(K, y, spec, **options):
    """One validated dense GP EP run from zero sites (a callable)."""
    from fastep._epcore import gp_ep
    n = K.shape[0]
    if hasattr(gp_ep, "DenseEPOptions"):
        return lambda: gp_ep.DenseEP(K, y, spec, gp_ep.DenseEPOptions(**options)).run(
            np.zeros(n), np.zeros(n), np.empty((n, n)), np.empty(n))
    if hasattr(gp_ep, "DenseEP"):
        return lambda: gp_ep.DenseEP(K, y, spec, **options).run(np.zeros(n), np.zeros(n), np.empty((n, n)),
                                                                np.empty(n))
    return lambda: gp_ep.run_gp_ep(K, y, spec, np.zeros(n), np.zeros(n), np.empty((n, n)), np.empty(n),
                                   **options)


def _sparse_run(Vt, d, y, spec, **options):
    """One validated sparse EP run from zero sites (a callable)."""
    from fastep._epcore import sparse_ep
    n, m = Vt.shape
    if hasattr(sparse_ep, "SparseEPOptions"):
        return lambda: sparse_ep.SparseEP(Vt, d, y, spec, sparse_ep.SparseEPOptions(**options)).run(
            np.zeros(n), np.zeros(n), np.empty((m, m)), np.empty(m))
    if hasattr(sparse_ep, "SparseEP"):
        return lambda: sparse_ep.SparseEP(Vt, d, y, spec, **options).run(np.zeros(n), np.zeros(n),
                                                                         np.empty((m, m)), np.empty(m))
    return lambda: sparse_ep.run_sparse_ep(Vt, d, y, spec, np.zeros(n), np.zeros(n), np.empty((m, m)),
                                           np.empty(m), **options)


def _linear_run(X, y, prior_mean, prior_cov, spec, **options):
    """One validated linear EP run from zero sites (a callable)."""
    from fastep._epcore import linear_ep
    n, d = X.shape
    if hasattr(linear_ep, "LinearEPOptions"):
        return lambda: linear_ep.LinearEP(X, y, prior_mean, prior_cov, spec, linear_ep.LinearEPOptions(**options)).run(
            np.zeros(n), np.zeros(n), np.empty(d), np.empty((d, d)))
    if hasattr(linear_ep, "LinearEP"):
        return lambda: linear_ep.LinearEP(X, y, prior_mean, prior_cov, spec, **options).run(
            np.zeros(n), np.zeros(n), np.empty(d), np.empty((d, d)))
    return lambda: linear_ep.run_linear_ep(X, y, prior_mean, prior_cov, spec, np.zeros(n), np.zeros(n),
                                           np.empty(d), np.empty((d, d)), **options)


def _dense_case(schedule_name, **options):
    """Dense GP EP at n = 1500 with one schedule, from zero sites."""
    from fastep import Probit
    from fastep._epcore import gp_ep
    X, y = _binary(1500, 3)
    K = _rbf(X) + 1e-6 * np.eye(1500)
    return _dense_run(K, y, Probit().site_spec(), schedule=getattr(gp_ep, schedule_name), **options)


def case_dense_blocked():
    return _dense_case("SCHEDULE_BLOCKED", tol=1e-6, max_sweeps=50)


def case_dense_parallel():
    return _dense_case("SCHEDULE_PARALLEL", damping=0.5, tol=1e-6, max_sweeps=100)


def _projection(n, m, seed=0):
    from fastep._epcore import sparse_ep
    X, y = _binary(n, 3, seed)
    Z = X[:m].copy()
    sqz = np.sum(Z * Z, axis=1)
    sqx = np.sum(X * X, axis=1)
    Kmm = np.exp(-0.5 * (sqz[:, None] + sqz[None, :] - 2.0 * Z @ Z.T))
    Knm = np.ascontiguousarray(np.exp(-0.5 * (sqx[:, None] + sqz[None, :] - 2.0 * X @ Z.T)))
    _, Vt, d = sparse_ep.sparse_projection(Kmm, Knm, np.ones(n), jitter=1e-6)
    return Vt, d, y


def case_sparse_sequential():
    from fastep import Probit
    Vt, d, y = _projection(20000, 200)
    return _sparse_run(Vt, d, y, Probit().site_spec(), tol=1e-6, max_sweeps=20)


def case_sparse_parallel():
    from fastep import Probit
    from fastep._epcore import sparse_ep
    Vt, d, y = _projection(20000, 200)
    return _sparse_run(Vt, d, y, Probit().site_spec(), schedule=sparse_ep.SPARSE_PARALLEL, damping=0.5,
                       tol=1e-6, max_sweeps=40)


def case_linear():
    from fastep import Probit
    X, y = _binary(10000, 100)
    X = np.ascontiguousarray(X)
    return _linear_run(X, y, np.zeros(100), np.eye(100), Probit().site_spec(), tol=1e-6, max_sweeps=20)


def case_student_t_dense():
    from fastep import GaussianProcessRegressor
    from fastep.kernels import RBF
    from fastep.likelihoods import StudentT
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(600, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=600)
    y[::10] += 4.0

    def run():
        GaussianProcessRegressor(RBF(1.0, 4.0), likelihood=StudentT(4.0, 0.1), optimizer=None).fit(X, y)
    return run


def case_gpc_learning():
    from fastep import GaussianProcessClassifier
    X, y = _binary(300, 2)

    def run():
        GaussianProcessClassifier().fit(X, y)
    return run


def case_sparse_default():
    from fastep import SparseGPClassifier
    X, y = _binary(2000, 3)

    def run():
        SparseGPClassifier(random_state=0).fit(X, y)
    return run


def case_ivm_default():
    from fastep import IVMClassifier
    X, y = _binary(3000, 3)

    def run():
        IVMClassifier(active_set_size=100, random_state=0).fit(X, y)
    return run


def case_site_moments():
    from fastep import Probit
    rng = np.random.default_rng(0)
    y = np.sign(rng.normal(size=1_000_000))
    m = rng.normal(size=1_000_000)
    v = rng.uniform(0.1, 3.0, size=1_000_000)
    likelihood = Probit()

    def run():
        likelihood.moments(y, m, v)
    return run


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def worker(case, repeat):
    run = CASES[case]()
    run()                                    # warm-up (first-touch, caches)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(json.dumps(min(times)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="python of the old build")
    parser.add_argument("--new", help="python of the new build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per process (the minimum is kept)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.repeat)
        return
    cases = args.cases.split(",")
    results = {case: {"old": [], "new": []} for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            for label, python in (("old", args.old), ("new", args.new)):
                out = subprocess.run([python, __file__, "--worker", case, "--repeat", str(args.repeat)],
                                     check=True, capture_output=True, text=True)
                results[case][label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'workload':24s} {'old (s)':>10s} {'new (s)':>10s} {'new/old':>8s}")
    for case in cases:
        old = statistics.median(results[case]["old"])
        new = statistics.median(results[case]["new"])
        print(f"{case:24s} {old:10.4f} {new:10.4f} {new / old:8.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
