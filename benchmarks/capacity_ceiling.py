"""How far can 50 inducing inputs / 200 active points go on Rätsch's image data?

The accuracy table asks fastep's ``SparseGPClassifier()`` (m = 50) and ``IVMClassifier(
active_set_size=200)`` to come within one standard deviation of the best peer on every data
set. On image (n = 1300, 18 inputs) the best peer is scikit-learn's Laplace GP classifier on
all 1300 points. This script measures the ceiling of the model size itself, on the same splits:

- the default fit (type-II ML from the data-aware start);
- an *oracle* over fixed kernels: ``RBF(variance, γ · scale)`` on a grid, no learning, the
  smallest **test** error over the grid per split (no hyperparameter choice, learnt or not,
  can do better at that model size and with those inducing inputs / that selection rule);
- the default fit with learnt inducing inputs (sparse) and with larger m / d.

    python benchmarks/capacity_ceiling.py                  # image, splits 1-3 (~15 min on 2 cores)
    python benchmarks/capacity_ceiling.py --splits 5
"""
import argparse
import os
import time
import warnings

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
VARIANCES = [1.0, 10.0, 100.0, 1000.0]
WIDTH_SCALES = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]


def load(dataset, k):
    with np.load(os.path.join(DATA, "raetsch_splits.npz")) as f:
        return tuple(f[f"{dataset}_{part}_{k}"] for part in ("Xtr", "ytr", "Xte", "yte"))


def error(model, X, y, Xt, yt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        model.fit(X, y)
        elapsed = time.perf_counter() - start
    return float(np.mean(model.predict(Xt) != yt)), elapsed


def main():
    from fastep import IVMClassifier, SparseGPClassifier
    from fastep._search.start import median_inverse_width
    from fastep.kernels import RBF

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="image")
    parser.add_argument("--splits", type=int, default=3)
    args = parser.parse_args()

    rows = {}

    def record(name, value):
        rows.setdefault(name, []).append(value)

    for k in range(1, args.splits + 1):
        X, y, Xt, yt = load(args.dataset, k)
        gamma = median_inverse_width(X)
        grid = [RBF(s2, gamma * c) for s2 in VARIANCES for c in WIDTH_SCALES]
        for label, make in [
            ("sparse m=50", lambda kern=None, **kw: SparseGPClassifier(kernel=kern, n_inducing=50, random_state=0, **kw)),
            ("IVM d=200", lambda kern=None, **kw: IVMClassifier(kernel=kern, active_set_size=200, **kw)),
        ]:
            record(f"{label} default", error(make(), X, y, Xt, yt))
            oracle = min(error(make(kern, optimizer=None), X, y, Xt, yt) for kern in grid)
            record(f"{label} oracle over fixed RBF grid", oracle)
        record("sparse m=50 learn_inducing=True",
               error(SparseGPClassifier(n_inducing=50, learn_inducing=True, random_state=0), X, y, Xt, yt))
        for m in (100, 200):
            record(f"sparse m={m} default", error(SparseGPClassifier(n_inducing=m, random_state=0), X, y, Xt, yt))
        for d in (400, 800):
            record(f"IVM d={d} default", error(IVMClassifier(active_set_size=d), X, y, Xt, yt))
        print(f"split {k} done", flush=True)

    print(f"\n{args.dataset}, splits 1-{args.splits}: test error % (mean ± sd), fit time s (mean)\n")
    print("| model | test error | fit time |\n|---|---|---|")
    for name, values in rows.items():
        errs = 100 * np.array([v[0] for v in values])
        times = np.array([v[1] for v in values])
        print(f"| {name} | {errs.mean():.2f} ± {errs.std():.2f} | {times.mean():.2f} s |")


if __name__ == "__main__":
    main()
