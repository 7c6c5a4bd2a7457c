"""Ctrl-C inside the compiled loops: how fast it is honoured, and what the polling costs.

1. Latency: a long fit is interrupted (``_thread.interrupt_main`` from a timer, as SIGINT is
   seen by Python) while it runs; reported per loop: the EP sweeps reported by then (smallest
   and largest; 0: the fit was still in its first sweep or setting up), and the median,
   smallest and largest number of seconds from the interrupt to the KeyboardInterrupt out of
   ``fit`` over ``--repeats`` fits. Two sets of cases (``--cases``):

   - ``unit``: the problems ``tests/test_interrupts.py`` timed when it still asserted a latency
     under one second (the tests now count sweeps and kernel columns instead): a dense EP sweep
     at n = 1400 (sequential and blocked), a sparse EP sweep at n = 2·10⁵ (m = 60), a linear
     EP sweep at n = 4·10⁵ (d = 40) and an IVM selection at N = 6·10⁴ (d = 2000);
   - ``large``: a dense EP sweep at n = 4000 (sequential and blocked), an IVM selection at
     N = 10⁵ (d = 1000) and a sparse EP sweep at n = 10⁶ (m = 50).

2. Overhead: EP sweeps with the signal polling on and off (``_common.set_interrupt_checks``),
   alternating, median of ``--repeats`` runs each: dense n = 2000 (sequential, blocked), sparse
   n = 2·10⁵ (m = 50), linear n = 2·10⁵ (d = 50).

    python benchmarks/interrupts.py                 # about 10 minutes on 2 cores
    python benchmarks/interrupts.py --cases unit --skip-overhead
    python benchmarks/interrupts.py --skip-latency
"""
import _thread
import argparse
import os
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


def interrupted_fit(model, X, y, after):
    """Seconds from the interrupt to the KeyboardInterrupt out of ``model.fit`` (None: the fit
    ended before the interrupt was sent), the seconds the fit ran, and the EP sweeps it had
    reported when the interrupt was sent (None for the IVM selection, which reports none)."""
    fired = {}
    sweeps = []

    def count(record):
        if record.stage == "EP sweep":
            sweeps.append(record.iteration)

    def fire():
        fired["sweeps"] = len(sweeps)
        fired["at"] = time.perf_counter()
        _thread.interrupt_main()

    if not isinstance(model, fastep.IVMClassifier):
        model.set_params(callback=count)
    timer = threading.Timer(after, fire)
    start = time.perf_counter()
    timer.start()
    latency = None
    try:
        model.fit(X, y)
    except KeyboardInterrupt:
        latency = time.perf_counter() - fired["at"]
    finally:
        timer.cancel()
    return latency, time.perf_counter() - start, fired.get("sweeps") if model.callback else None


def latency(name, make, X, y, after, repeats):
    latencies, ran, sweeps = [], [], []
    for _ in range(repeats):
        seconds, total, done = interrupted_fit(make(), X, y, after)
        ran.append(total)
        if seconds is not None:
            latencies.append(seconds)
            sweeps.append(done)
    finished = repeats - len(latencies)
    if latencies:
        figures = (f"{statistics.median(latencies):.3f} s | {min(latencies):.3f}-{max(latencies):.3f} s")
    else:
        figures = "- | -"
    note = f" ({finished} of {repeats} fits ended before the interrupt)" if finished else ""
    done = "-" if not sweeps or sweeps[0] is None else f"{min(sweeps)}-{max(sweeps)}"
    print(f"| {name} | {after:.1f} s | {done} | {figures} | {len(latencies)}{note} | {statistics.median(ran):.2f} s |",
          flush=True)


def latency_cases(which):
    """(name, estimator factory, data, interrupt after seconds) of the ``unit`` or ``large`` set."""
    if which == "unit":
        X, y = _toy(1400, 3)
        for schedule in ("sequential", "blocked"):
            yield (f"dense EP sweep, n = 1400, {schedule}",
                   lambda schedule=schedule: fastep.GaussianProcessClassifier(
                       RBF(4.0, 1.0), optimizer=None, schedule=schedule, tol=1e-15, max_sweeps=10_000),
                   X, y, 0.4)
        X, y = _toy(200_000, 2)
        yield ("sparse EP sweep, n = 2·10^5, m = 60",
               lambda: fastep.SparseGPClassifier(RBF(2.0, 1.0), n_inducing=60, optimizer=None, tol=1e-15,
                                                 max_sweeps=10_000, random_state=0), X, y, 1.0)
        X, y = _toy(400_000, 40)
        yield ("linear EP sweep, n = 4·10^5, d = 40",
               lambda: fastep.LinearEPClassifier(tol=1e-300, max_sweeps=10_000), X, y, 0.4)
        X, y = _toy(60_000, 5)
        yield ("IVM selection, N = 6·10^4, d = 2000",
               lambda: fastep.IVMClassifier(RBF(1.0, 0.5), active_set_size=2000, optimizer=None), X, y, 0.4)
    else:
        X, y = _toy(4000, 3)
        for schedule in ("sequential", "blocked"):
            yield (f"dense EP sweep, n = 4000, {schedule}",
                   lambda schedule=schedule: fastep.GaussianProcessClassifier(
                       RBF(4.0, 1.0), optimizer=None, schedule=schedule, tol=1e-15, max_sweeps=10_000),
                   X, y, 6.0)
        X, y = _toy(100_000, 5)
        yield ("IVM selection, N = 10^5, d = 1000",
               lambda: fastep.IVMClassifier(RBF(1.0, 0.5), active_set_size=1000, optimizer=None), X, y, 3.0)
        X, y = _toy(1_000_000, 2)
        yield ("sparse EP sweep, n = 10^6, m = 50",
               lambda: fastep.SparseGPClassifier(RBF(2.0, 1.0), n_inducing=50, optimizer=None, tol=1e-15,
                                                 max_sweeps=10_000, random_state=0), X, y, 8.0)


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
    parser.add_argument("--repeats", type=int, default=5, help="fits per latency case, runs per overhead case")
    parser.add_argument("--cases", nargs="+", choices=["unit", "large"], default=["unit", "large"])
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)

    if not args.skip_latency:
        print("\n| loop | interrupt sent after | EP sweeps done by then | KeyboardInterrupt after (median) "
              "| smallest-largest | fits | fit ran (median) |\n|---|---|---|---|---|---|---|", flush=True)
        for which in args.cases:
            for name, make, X, y, after in latency_cases(which):
                latency(name, make, X, y, after, args.repeats)
            del X, y
        print(f"load average {os.getloadavg()[0]:.1f} after the latency runs", flush=True)
    if args.skip_overhead:
        return

    print("\n| sweeps | polling on | polling off | on / off |\n|---|---|---|---|")
    from fastep._epcore import gp_ep, linear_ep, sparse_ep
    spec = fastep.Probit().site_spec()
    X, y = _toy(2000, 3)
    K = 4.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, axis=-1)) + 1e-8 * np.eye(2000)
    yf = y.astype(float)
    for schedule, label in ((gp_ep.SCHEDULE_SEQUENTIAL, "sequential"), (gp_ep.SCHEDULE_BLOCKED, "blocked")):
        def dense(schedule=schedule):
            n = K.shape[0]
            options = gp_ep.DenseEPOptions(schedule=schedule, tol=1e-300, max_sweeps=3)
            gp_ep.DenseEP(K, yf, spec, options, validate=False).run(
                np.zeros(n), np.zeros(n), np.empty((n, n)), np.empty(n))
        overhead(f"dense EP, n = 2000, {label}, 3 sweeps", dense, args.repeats)

    rng = np.random.default_rng(1)
    n, m = 200_000, 50
    Vt = np.ascontiguousarray(rng.normal(size=(n, m)) / np.sqrt(m))
    d = np.full(n, 0.1)
    ys = np.where(rng.normal(size=n) > 0, 1.0, -1.0)

    def sparse():
        options = sparse_ep.SparseEPOptions(tol=1e-300, max_sweeps=3)
        sparse_ep.SparseEP(Vt, d, ys, spec, options, validate=False).run(
            np.zeros(n), np.zeros(n), np.empty((m, m)), np.empty(m))
    overhead("sparse EP, n = 2e5, m = 50, 3 sweeps", sparse, args.repeats)

    Xl = np.ascontiguousarray(rng.normal(size=(n, 50)))

    def linear():
        options = linear_ep.LinearEPOptions(tol=1e-300, max_sweeps=3)
        linear_ep.LinearEP(Xl, ys, np.zeros(50), np.eye(50), spec, options, validate=False).run(np.zeros(n), np.zeros(n), np.empty(50), np.empty((50, 50)))
    overhead("linear EP, n = 2e5, d = 50, 3 sweeps", linear, args.repeats)


if __name__ == "__main__":
    main()
