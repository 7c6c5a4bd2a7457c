"""USPS side by side: the IVM protocol with fastep's engine, with the plain-numpy twin, and dense EP.

    python benchmarks/ivm_usps_compare.py                        # N = 2000, digit 0 (about 10 minutes)
    python benchmarks/ivm_usps_compare.py --train-size 2000 --digits 0,3 --json compare.json
    python benchmarks/ivm_usps_compare.py --only fastep,dense-gp  # skip the slow reference twin

Two comparisons on USPS; both use a seeded class-stratified subset of
``--train-size`` training points (the full test set of 2007 images is always used) and one
binary problem per digit (digit against the rest), because the reference twin and the dense
classifier need O(N²) memory:

1. ``fastep`` vs ``reference``: the Table 1 protocol of ``ivm_usps_table1.py`` (d = 500,
   5 iterations of Algorithm 2 with noise-parameter updates, RBF + Linear + White + Bias)
   run once with the compiled selection and once with :func:`fastep.reference.ivm.select`
   (the full n x n kernel and posterior covariance, literal eqs 15-16, numpy probit moments
   from :mod:`fastep.reference.sites`); the optimisation steps are the same code in both. The
   ratio is reference time / fastep time per digit (target: at least 3x).
2. ``dense-gp``: ``fastep.GaussianProcessClassifier`` (dense EP on all N points, blocked
   schedule, one BLAS thread) with the same starting kernel and the same likelihood
   learning (probit bias and slope), hyperparameters by type-II maximum likelihood, against
   the IVM's d = 500 active points of the same N: test error and time.

Measured at commit ab9fc0b (2-core machine, N = 2000, digits 0 and 3, load average 3-8; errors on the 2007 test images):

=====  ====================  =======  ==============  =======
digit  method                error %  fit wall (CPU)  peak MB
=====  ====================  =======  ==============  =======
0      IVM, fastep engine    1.893    6.5 s (3.5 s)   146
0      IVM, reference twin   1.893    213 s (111 s)   257
0      dense EP GP, all N    1.893    224 s (218 s)   291
3      IVM, fastep engine    2.093    8.9 s (4.5 s)   147
3      IVM, reference twin   2.093    219 s (109 s)   261
3      dense EP GP, all N    2.192    253 s (249 s)   295
=====  ====================  =======  ==============  =======

Reference / fastep: 25-33x for the whole protocol (24-32x in CPU time), 52-68x for the 11
selections alone; the two engines give the same test errors. The dense classifier (learnt
RBF + Linear + White + Bias and probit slope and bias, EP on all 2000 points) is no more
accurate than the IVM's 500 active points here and takes about 60x longer.

Every configuration runs in a fresh process, so the peak resident memory printed
(``ru_maxrss``) is that configuration's own. The first comparison calls
``ivm_usps_table1.py --engine ...``; the dense GP runs in ``--worker dense-gp`` mode here.
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ivm_usps_table1 as table1  # noqa: E402


def dense_gp_worker(args):
    import fastep
    from fastep.likelihoods import Probit
    X, y, Xt, yt = table1.load_usps(args.data)
    sub = table1.stratified_subset(y, args.train_size)
    X, y = np.ascontiguousarray(X[sub]), y[sub]
    out = []
    for digit in args.digits:
        kernel = table1.make_kernel("rbf", X.shape[1])
        clf = fastep.GaussianProcessClassifier(kernel, Probit(), learn_likelihood=True,
                                               max_sweeps=args.max_sweeps)
        t0 = time.perf_counter()
        c0 = time.process_time()
        clf.fit(X, np.where(y == digit, 1, -1))
        fit_time = time.perf_counter() - t0
        cpu = time.process_time() - c0
        err = 100.0 * float(np.mean(clf.predict(Xt) != np.where(yt == digit, 1, -1)))
        out.append({"digit": digit, "error": err, "fit_time": fit_time, "cpu_time": cpu,
                    "kernel": repr(clf.kernel_), "likelihood": repr(clf.likelihood_),
                    "log_marginal_likelihood": float(clf.log_marginal_likelihood_value_),
                    "peak_rss_mb": table1.peak_rss_mb()})
        print(f"  dense GP digit {digit}: error {err:.3f} %  fit {fit_time:.1f} s  {clf.kernel_!r}  "
              f"{clf.likelihood_!r}", flush=True)
    return out


def run_ivm(engine, args, tmp):
    path = pathlib.Path(tmp) / f"{engine}.json"
    cmd = [sys.executable, str(HERE / "ivm_usps_table1.py"), "--data", args.data, "--engine", engine,
           "--train-size", str(args.train_size), "--digits", ",".join(map(str, args.digits)),
           "--active-size", str(args.active_size), "--iterations", str(args.iterations),
           "--max-optimizer-iter", str(args.max_optimizer_iter), "--json", str(path), "--quiet"]
    print(f"\n$ {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(path.read_text())["rows"][0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(table1.DEFAULT_DATA))
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--digits", default="0")
    parser.add_argument("--active-size", type=int, default=500)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--max-optimizer-iter", type=int, default=10)
    parser.add_argument("--max-sweeps", type=int, default=200, help="dense GP: EP sweeps per evaluation")
    parser.add_argument("--only", default="fastep,reference,dense-gp")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.digits = [int(s) for s in args.digits.split(",") if s.strip()]
    if not pathlib.Path(args.data).is_file():
        print(f"USPS data not found at {args.data} (expected ../shared/data/usps.npz relative to the "
              "repository; pass --data PATH): nothing to do")
        sys.exit(0)
    if args.worker == "dense-gp":
        out = dense_gp_worker(args)
        pathlib.Path(args.json).write_text(json.dumps(out))
        return

    only = [s.strip() for s in args.only.split(",") if s.strip()]
    print(f"USPS subset: N = {args.train_size} training points (seeded, class-stratified), 2007 test points; "
          f"digits {args.digits}; d = {args.active_size}, {args.iterations} iterations of Algorithm 2; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("fastep", "reference"):
            if engine in only:
                results[engine] = run_ivm(engine, args, tmp)
        if "dense-gp" in only:
            path = pathlib.Path(tmp) / "dense.json"
            cmd = [sys.executable, __file__, "--worker", "dense-gp", "--data", args.data,
                   "--train-size", str(args.train_size), "--digits", ",".join(map(str, args.digits)),
                   "--max-sweeps", str(args.max_sweeps), "--json", str(path)]
            print(f"\n$ {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=True)
            results["dense-gp"] = json.loads(path.read_text())

    print(f"\nSummary (N = {args.train_size}; binary test error % on the 2007 test images; wall time of the fit)")
    print(f"{'digit':>5} {'method':>26} {'error %':>8} {'fit s':>8} {'cpu s':>8} {'peak MB':>8}")
    per_digit = {}
    for digit in args.digits:
        rows = []
        for key, label in (("fastep", "IVM fastep engine"), ("reference", "IVM reference twin")):
            if key in results:
                r = next(x for x in results[key]["results"] if x["digit"] == digit)
                rows.append((label, r))
        if "dense-gp" in results:
            rows.append(("dense EP GP (all N)", next(x for x in results["dense-gp"] if x["digit"] == digit)))
        for label, r in rows:
            print(f"{digit:>5} {label:>26} {r['error']:>8.3f} {r['fit_time']:>8.1f} {r['cpu_time']:>8.1f} "
                  f"{r['peak_rss_mb']:>8.0f}")
        entry = {label: r for label, r in rows}
        if "fastep" in results and "reference" in results:
            f = next(x for x in results["fastep"]["results"] if x["digit"] == digit)
            ref = next(x for x in results["reference"]["results"] if x["digit"] == digit)
            ratio = ref["fit_time"] / f["fit_time"]
            cpu_ratio = ref["cpu_time"] / f["cpu_time"]
            sel_ratio = ref["select_time"] / f["select_time"]
            print(f"{'':>5} reference / fastep: whole protocol {ratio:.1f}x wall, {cpu_ratio:.1f}x CPU; "
                  f"selections alone {sel_ratio:.1f}x wall ({f['n_select']} selections)")
            entry["ratio"] = ratio
            entry["cpu_ratio"] = cpu_ratio
            entry["selection_ratio"] = sel_ratio
        per_digit[digit] = entry
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "results": results,
                                                       "per_digit": {str(k): v for k, v in per_digit.items()}},
                                                      indent=1, default=str))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
