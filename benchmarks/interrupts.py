"""Ctrl-C inside the compiled loops: how fast it is honoured, and what the polling costs (issue 17).

1. Latency: a long fit is interrupted (``_thread.interrupt_main`` from a timer, as SIGINT is
   seen by Python) while it runs a dense EP sweep at n = 4000 (sequential and blocked), an IVM
   selection at N = 10⁵ (d = 1000) and a sparse EP sweep at n = 10⁶ (m = 50); reported: seconds
   from the interrupt to the KeyboardInterrupt out of ``fit``.
2. Overhead: EP sweeps with the signal polling on and off (``_common.set_interrupt_checks``),
   alternating, median of ``--repeats`` runs each: dense n = 2000 (sequential, blocked), sparse
   n = 2·10⁵ (m = 50), linear n = 2·10⁵ (d = 50).

    python benchmarks/interrupts.py                 # about 5 minutes on 2 cores
    python benchmarks/interrupts.py --skip-latency
"""
import _thread
import argparse
import signal
import statistics
import threading
import time

import numpy as np

import fastep
from fastep._epcore import _common
from fastep.kernels import RBF


def _toy(n, p, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    return X, np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1, -1)


def latency(name, model, X, y, after):
    fired = {}

    def fire():
        fired["at"] = time.perf_counter()
        _thread.interrupt_main()

    timer = threading.Timer(after, fire)
    start = time.perf_counter()
    timer.start()
    try:
        model.fit(X, y)
        outcome = "finished before the interrupt"
    except KeyboardInterrupt:
        outcome = f"{time.perf_counter() - fired['at']:.3f} s"
    finally:
        timer.cancel()
    print(f"| {name} | interrupt after {after:.1f} s | {outcome} | fit ran {time.perf_counter() - start:.2f} s |",
          flush=True)


def overhead(name, run, repeats):
    times = {True: [], False: []}
    for _ in range(repeats):
        for enabled in (True, False):
            previous = _common.set_interrupt_checks(enabled)
            try:
                start = time.perf_counter()
                run()
                times[enabled].append(time.perf_counter() - start)
            finally:
                _common.set_interrupt_checks(previous)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"| {name} | {on:.3f} s | {off:.3f} s | {on / off:.3f} |", flush=True)


def main():
    # a process started in the background by a shell ignores SIGINT, and Python then installs no
    # KeyboardInterrupt handler: put it back, as an interactive session has it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()

    if not args.skip_latency:
        print("| loop | when | KeyboardInterrupt after | |\n|---|---|---|---|")
        X, y = _toy(4000, 3)
        for schedule in ("sequential", "blocked"):
            latency(f"dense EP sweep, n = 4000, {schedule}",
                    fastep.GaussianProcessClassifier(RBF(4.0, 1.0), optimizer=None, schedule=schedule, tol=1e-15,
                                                     max_sweeps=10_000), X, y, after=6.0)
        X, y = _toy(100_000, 5)
        latency("IVM selection, N = 10^5, d = 1000",
                fastep.IVMClassifier(RBF(1.0, 0.5), active_set_size=1000, optimizer=None), X, y, after=3.0)
        X, y = _toy(1_000_000, 2)
        latency("sparse EP sweep, n = 10^6, m = 50",
                fastep.SparseGPClassifier(RBF(2.0, 1.0), n_inducing=50, optimizer=None, tol=1e-15, max_sweeps=10_000,
                                          random_state=0), X, y, after=8.0)
        del X, y

    print("\n| sweeps | polling on | polling off | on / off |\n|---|---|---|---|")
    from fastep._epcore import gp_ep, linear_ep, sparse_ep
    spec = fastep.Probit().site_spec()
    X, y = _toy(2000, 3)
    K = 4.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, axis=-1)) + 1e-8 * np.eye(2000)
    yf = y.astype(float)
    for schedule, label in ((gp_ep.SCHEDULE_SEQUENTIAL, "sequential"), (gp_ep.SCHEDULE_BLOCKED, "blocked")):
        def dense(schedule=schedule):
            n = K.shape[0]
            gp_ep.DenseEP(K, yf, spec, schedule=schedule, tol=1e-300, max_sweeps=3, validate=False).run(
                np.zeros(n), np.zeros(n), np.empty((n, n)), np.empty(n))
        overhead(f"dense EP, n = 2000, {label}, 3 sweeps", dense, args.repeats)

    rng = np.random.default_rng(1)
    n, m = 200_000, 50
    Vt = np.ascontiguousarray(rng.normal(size=(n, m)) / np.sqrt(m))
    d = np.full(n, 0.1)
    ys = np.where(rng.normal(size=n) > 0, 1.0, -1.0)

    def sparse():
        sparse_ep.SparseEP(Vt, d, ys, spec, tol=1e-300, max_sweeps=3, validate=False).run(
            np.zeros(n), np.zeros(n), np.empty((m, m)), np.empty(m))
    overhead("sparse EP, n = 2e5, m = 50, 3 sweeps", sparse, args.repeats)

    Xl = np.ascontiguousarray(rng.normal(size=(n, 50)))

    def linear():
        linear_ep.LinearEP(Xl, ys, np.zeros(50), np.eye(50), spec, tol=1e-300, max_sweeps=3,
                           validate=False).run(np.zeros(n), np.zeros(n), np.empty(50), np.empty((50, 50)))
    overhead("linear EP, n = 2e5, d = 50, 3 sweeps", linear, args.repeats)


if __name__ == "__main__":
    main()
