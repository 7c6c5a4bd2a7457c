"""Test error of fastep's GP classifiers with default settings beside scikit-learn's defaults.

Data: the first ten Rätsch splits of banana, breast_cancer, german, image, titanic and
waveform (``../shared/data/raetsch_splits.npz``) and USPS 10-class (``usps.npz``, the
standard 7291 / 2007 split, pixels as distributed). Models, each with its defaults only:

- fastep ``GaussianProcessClassifier()`` (dense EP; type-II ML of a data-aware RBF start),
- fastep ``SparseGPClassifier()`` (m = 50 inducing inputs, its default),
- fastep ``IVMClassifier(active_set_size=200)`` (d = 200, the size the table asks for; all n
  points on titanic, n = 150),
- scikit-learn ``GaussianProcessClassifier()`` (Laplace; its default kernel ``1.0 * RBF(1.0)`` is
  fixed, nothing is learnt), the same with a learnt ``ConstantKernel(1.0) * RBF(1.0)``, ``SVC()``,
  ``LogisticRegression()``.

Every model fits every split in this one process, one after another; reported per data set:
mean ± standard deviation of the test error over the splits and the mean fit time. The dense
GP classifiers (fastep's and scikit-learn's) are O(n³) per evidence evaluation and are not
run on USPS (n = 7291, 10 one-vs-rest problems); ``--usps-dense`` runs them anyway.

Targets: every fastep GP classifier within one standard deviation of the best peer
(mean error <= best peer's mean + its sd) on every data set; better than scikit-learn's GP
classifier on average; no fastep default worse than ``LogisticRegression()`` anywhere.

    python benchmarks/accuracy_table.py                       # everything (about an hour on 2 cores)
    python benchmarks/accuracy_table.py --splits 2 --datasets banana titanic
    python benchmarks/accuracy_table.py --json results.json
"""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
RAETSCH = ["banana", "breast_cancer", "german", "image", "titanic", "waveform"]
FASTEP = ["fastep GPC", "fastep sparse GPC", "fastep IVM"]
PEERS = ["sklearn GPC (Laplace)", "sklearn GPC learnt C*RBF", "SVC", "LogisticRegression"]
DENSE = {"fastep GPC", "sklearn GPC (Laplace)", "sklearn GPC learnt C*RBF"}


def make_model(name, n_samples):
    if name == "fastep GPC":
        from fastep import GaussianProcessClassifier
        return GaussianProcessClassifier()
    if name == "fastep sparse GPC":
        from fastep import SparseGPClassifier
        return SparseGPClassifier()
    if name == "fastep IVM":
        from fastep import IVMClassifier
        return IVMClassifier(active_set_size=min(200, n_samples))
    if name == "sklearn GPC (Laplace)":
        from sklearn.gaussian_process import GaussianProcessClassifier
        return GaussianProcessClassifier()
    if name == "sklearn GPC learnt C*RBF":
        from sklearn.gaussian_process import GaussianProcessClassifier
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel
        return GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0))
    if name == "SVC":
        from sklearn.svm import SVC
        return SVC()
    if name == "LogisticRegression":
        from sklearn.linear_model import LogisticRegression
        return LogisticRegression()
    raise ValueError(name)


def splits(dataset, n_splits):
    """Yield (X_train, y_train, X_test, y_test) for each split of the data set."""
    if dataset == "usps":
        with np.load(os.path.join(DATA, "usps.npz")) as f:
            yield f["X_train"], f["y_train"], f["X_test"], f["y_test"]
        return
    with np.load(os.path.join(DATA, "raetsch_splits.npz")) as f:
        for k in range(1, n_splits + 1):
            yield (f[f"{dataset}_Xtr_{k}"], f[f"{dataset}_ytr_{k}"], f[f"{dataset}_Xte_{k}"],
                   f[f"{dataset}_yte_{k}"])


def run(datasets, models, n_splits, usps_dense):
    results = {}
    for dataset in datasets:
        for name in models:
            if dataset == "usps" and name in DENSE and not usps_dense:
                continue
            errors, times, notes = [], [], set()
            for X, y, Xt, yt in splits(dataset, n_splits):
                model = make_model(name, X.shape[0])
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    start = time.perf_counter()
                    model.fit(X, y)
                    times.append(time.perf_counter() - start)
                    errors.append(float(np.mean(model.predict(Xt) != yt)))
                notes.update(f"{w.category.__name__}: {str(w.message)[:90]}" for w in caught
                             if not issubclass(w.category, (DeprecationWarning, FutureWarning)))
            results[dataset, name] = {"errors": errors, "times": times, "warnings": sorted(notes)}
            print(f"{dataset:14s} {name:22s} error {100 * np.mean(errors):6.2f} ± {100 * np.std(errors):5.2f} % "
                  f"fit {np.mean(times):7.2f} s  ({len(errors)} splits, {len(notes)} kinds of warning)", flush=True)
    return results


def summary(results, datasets, models):
    def cell(dataset, name):
        r = results.get((dataset, name))
        if r is None:
            return "not run"
        return f"{100 * np.mean(r['errors']):.2f} ± {100 * np.std(r['errors']):.2f} ({np.mean(r['times']):.2f} s)"

    lines = ["| data set | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for dataset in datasets:
        lines.append(f"| {dataset} | " + " | ".join(cell(dataset, name) for name in models) + " |")
    print("\nTest error in % (mean ± sd over the splits), mean fit time in brackets:\n")
    print("\n".join(lines))
    print("\nTargets:")
    for dataset in datasets:
        peers = [(np.mean(results[dataset, p]["errors"]), np.std(results[dataset, p]["errors"]), p)
                 for p in PEERS if (dataset, p) in results]
        if not peers:
            continue
        best = min(peers)
        logistic = results.get((dataset, "LogisticRegression"))
        for name in FASTEP:
            if (dataset, name) not in results:
                continue
            mean = np.mean(results[dataset, name]["errors"])
            within = mean <= best[0] + best[1]
            beats_logistic = logistic is None or mean <= np.mean(logistic["errors"])
            print(f"  {dataset:14s} {name:18s} {100 * mean:6.2f} % vs best peer {best[2]} {100 * best[0]:.2f} ± "
                  f"{100 * best[1]:.2f} %: {'within' if within else 'NOT within'} one sd; "
                  f"{'<=' if beats_logistic else '>'} LogisticRegression")
    sk = [d for d in datasets if (d, "sklearn GPC (Laplace)") in results]
    for name in FASTEP:
        both = [d for d in sk if (d, name) in results]
        if both:
            ours = np.mean([np.mean(results[d, name]["errors"]) for d in both])
            theirs = np.mean([np.mean(results[d, "sklearn GPC (Laplace)"]["errors"]) for d in both])
            print(f"  average over {len(both)} data sets: {name} {100 * ours:.2f} % vs sklearn GPC {100 * theirs:.2f} %")
    print("\nDense fit time, fastep GPC / scikit-learn (same run):")
    for dataset in datasets:
        ours = results.get((dataset, "fastep GPC"))
        if ours is None:
            continue
        ratios = [f"{np.mean(ours['times']) / np.mean(results[dataset, p]['times']):.2f}x {p}"
                  for p in ("sklearn GPC learnt C*RBF", "sklearn GPC (Laplace)") if (dataset, p) in results]
        print(f"  {dataset:14s} " + ", ".join(ratios))
    for (dataset, name), r in sorted(results.items()):
        for note in r["warnings"]:
            print(f"  warning {dataset} / {name}: {note}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=RAETSCH + ["usps"])
    parser.add_argument("--models", nargs="+", default=FASTEP + PEERS)
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--usps-dense", action="store_true", help="also run the dense GP classifiers on USPS")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(DATA, "raetsch_splits.npz")):
        sys.exit(f"data not found under {DATA} (the shared data folder beside the repository)")
    results = run(args.datasets, args.models, args.splits, args.usps_dense)
    summary(results, args.datasets, args.models)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{d}|{m}": r for (d, m), r in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
