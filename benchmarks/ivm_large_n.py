"""IVM selection at N = 10^6: time and peak memory of Algorithm 1 with d = 500.

    python benchmarks/ivm_large_n.py                    # N = 1e6, d = 500 (a few minutes)
    python benchmarks/ivm_large_n.py --n 200000 --d 200 # quicker
    python benchmarks/ivm_large_n.py --modes select learn   # kernel learning against one selection

Data: N points in 10 dimensions, standard normal inputs, labels ``sign(f(x) + noise)`` for a
smooth f (seeded); kernel ``RBF(1, 0.1) + Bias(1) + White(0.01)`` (fixed), probit
likelihood, entropy criterion.  The budget is the matrix M of eq 30 (d x N float64, 4 GB
at N = 10^6, d = 500): nothing N x N, nothing N x d beyond M.

Two modes, each in its own process so that its peak RSS (``ru_maxrss``) is its own:

* ``select``: ``fastep.ivm.select_active_set`` (Algorithm 1 alone);
* ``estimator``: ``IVMClassifier(kernel, active_set_size=d, optimizer=None).fit`` (input
  validation, selection, the prediction state) followed by ``predict`` on 10^5 held-out
  points (test error and log loss);
* ``learn`` (``--modes learn``): the default fit ``IVMClassifier(active_set_size=d)``, which
  learns its kernel (at this N from minibatches; default start kernel), with the time at
  which each round of Algorithm 2 ended (each round: one selection, then learning).

Printed per mode: wall time, peak RSS, RSS minus the inputs and M (the overhead), and for
``estimator`` the test error.  BLAS threads: the process default (2 here).
"""
import argparse
import json
import os
import resource
import time

import numpy as np
from _child import run_child

DIM = 10
SEED = 20261125


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, DIM))
    f = np.sin(2.0 * X[:, 0]) + X[:, 1] * X[:, 2] - 0.5 * X[:, 3]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0.0, 1.0, -1.0)
    return X, y


def kernel():
    from fastep.kernels import RBF, Bias, White
    return RBF(1.0, 0.1) + Bias(1.0) + White(0.01)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(args):
    from fastep.likelihoods import Probit
    X, y = make_data(args.n, SEED)
    base = peak_rss_mb()
    out = dict(base_rss_mb=base)
    t0 = time.perf_counter()
    if args.mode == "select":
        from fastep.ivm import select_active_set
        active = select_active_set(X, y, kernel(), Probit(), args.d)
        out["n_active"] = int(np.unique(active).size)
    else:
        from fastep import IVMClassifier
        if args.mode == "learn":
            # the default fit: the kernel learnt (minibatch learning of the full-data objective at
            # this N), default start kernel
            est = IVMClassifier(active_set_size=args.d, random_state=0).fit(X, y)
            out["rounds"] = [{"iteration": h["iteration"], "elapsed": h["elapsed"]} for h in est.history_]
            out["learning"] = est.learning_
            out["kernel"] = repr(est.kernel_)
        else:
            est = IVMClassifier(kernel(), Probit(), active_set_size=args.d, optimizer=None).fit(X, y)
        out["fit_s"] = time.perf_counter() - t0
        out["n_active"] = int(est.active_set_.size)
        Xt, yt = make_data(100_000, SEED + 1)
        out["test_error"] = float(np.mean(est.predict(Xt) != yt))
        p = np.clip(est.predict_proba(Xt)[:, 1], 1e-12, 1 - 1e-12)
        out["test_log_loss"] = float(-np.mean(np.where(yt == 1, np.log(p), np.log1p(-p))))
    out["time_s"] = time.perf_counter() - t0
    out["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=500)
    parser.add_argument("--modes", nargs="+", default=["select", "estimator"])
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        return child(args)
    m_mb = args.d * args.n * 8 / 2**20
    inputs_mb = args.n * (DIM + 1) * 8 / 2**20
    print(f"load average {os.getloadavg()[0]:.2f}; N = {args.n}, d = {args.d}, {DIM} inputs; "
          f"M is {m_mb:.0f} MB, X and y {inputs_mb:.0f} MB")
    for mode in args.modes:
        res = run_child(__file__, ["--mode", mode, "--n", args.n, "--d", args.d], mode)
        if res is None:
            continue
        extra = (f", fit {res['fit_s']:.1f} s, test error {100 * res['test_error']:.2f} %, log loss "
                 f"{res['test_log_loss']:.4f} on 1e5 points" if mode != "select" else "")
        if mode == "learn":
            ends = ", ".join(f"{r['elapsed']:.1f}" for r in res["rounds"])
            extra += f"; learning {res['learning']}, rounds ended at {ends} s; kernel {res['kernel']}"
        print(f"{mode:10s} {res['time_s']:7.1f} s, peak RSS {res['peak_rss_mb']:.0f} MB "
              f"(after making the data {res['base_rss_mb']:.0f} MB; overhead beyond data and M "
              f"{res['peak_rss_mb'] - res['base_rss_mb'] - m_mb:.0f} MB), {res['n_active']} distinct active "
              f"points{extra}", flush=True)


if __name__ == "__main__":
    main()
