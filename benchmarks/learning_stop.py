"""Learning on nearly separable data: fit time, evaluations and test quality beside scikit-learn.

Data: scikit-learn's bundled digits (8x8 images scaled to [0, 1], 10 classes), ``--n-train``
rows (600) drawn with ``--seed`` (0), the other rows as test set; optionally USPS digits 0-3
(150 training images per class from ``../shared/data/usps.npz``, the standard test images of
those classes), the multinomial fit of ``compare_robust_multiclass.py``.

Models, in one process, one after another (``--models`` picks some):

- ``ovr``: fastep ``GaussianProcessClassifier()`` (one-vs-rest, the default hyperprior);
- ``ovr-ml``: the same with ``hyperprior=None`` (plain type-II ML);
- ``multinomial``: fastep ``GaussianProcessClassifier(multi_class="multinomial")``;
- ``multinomial-ml``: the same with ``hyperprior=None``;
- ``sklearn-fixed``: scikit-learn ``GaussianProcessClassifier()`` (its default kernel is fixed);
- ``sklearn-learnt``: scikit-learn ``GaussianProcessClassifier(C(1.0) * RBF(1.0))`` (Laplace, learns).

Reported: fit time, test error, test log loss, and for fastep the type-II evaluations per
binary problem (one-vs-rest) or of the one multinomial problem, and the learnt kernels.

    python benchmarks/learning_stop.py                      # digits, every model
    python benchmarks/learning_stop.py --data usps03 --models multinomial ovr
"""
import argparse
import os
import time
import warnings

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
MODELS = ["ovr", "ovr-ml", "multinomial", "multinomial-ml", "sklearn-fixed", "sklearn-learnt"]


def load(name, n_train, seed):
    if name == "digits":
        from sklearn.datasets import load_digits
        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        order = np.random.default_rng(seed).permutation(y.shape[0])
        train, test = order[:n_train], order[n_train:]
        return X[train], y[train], X[test], y[test]
    data = np.load(os.path.join(DATA, "usps.npz"))
    rng = np.random.default_rng(seed)
    classes = [0, 1, 2, 3]
    train = np.concatenate([rng.choice(np.flatnonzero(data["y_train"] == c), 150, replace=False) for c in classes])
    test = np.flatnonzero(np.isin(data["y_test"], classes))
    return data["X_train"][train], data["y_train"][train], data["X_test"][test], data["y_test"][test]


def make(name):
    if name.startswith("sklearn"):
        from sklearn.gaussian_process import GaussianProcessClassifier
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel
        if name == "sklearn-fixed":
            return GaussianProcessClassifier()
        return GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0))
    from fastep import GaussianProcessClassifier
    kwargs = {}
    if name.startswith("multinomial"):
        kwargs["multi_class"] = "multinomial"
    if name.endswith("-ml"):
        kwargs["hyperprior"] = None
    return GaussianProcessClassifier(**kwargs)


def run(name, data):
    Xtr, ytr, Xte, yte = data
    model = make(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        model.fit(Xtr, ytr)
        seconds = time.perf_counter() - start
    proba = model.predict_proba(Xte)
    column = np.searchsorted(model.classes_, yte)
    error = float(np.mean(model.classes_[np.argmax(proba, axis=1)] != yte))
    log_loss = float(-np.mean(np.log(np.clip(proba[np.arange(yte.shape[0]), column], 1e-300, None))))
    row = {"model": name, "fit_s": seconds, "error": error, "log_loss": log_loss,
           "warnings": sorted({type(w.message).__name__ for w in caught})}
    if hasattr(model, "n_evaluations_"):
        row["evaluations"] = np.atleast_1d(model.n_evaluations_).tolist()
        kernels = model.kernel_ if isinstance(model.kernel_, list) else [model.kernel_]
        row["variance"] = [round(float(k.get_params()["variance"]), 3) for k in kernels
                           if "variance" in k.get_params()]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=["digits", "usps03"], default="digits")
    parser.add_argument("--n-train", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    args = parser.parse_args()
    data = load(args.data, args.n_train, args.seed)
    print(f"{args.data}: {data[0].shape[0]} training rows, {data[2].shape[0]} test rows, "
          f"{np.unique(data[1]).size} classes")
    print("| model | fit s | test error % | test log loss | evaluations | learnt variances |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        row = run(name, data)
        evals = row.get("evaluations", [])
        variances = row.get("variance", [])
        print(f"| {name} | {row['fit_s']:.2f} | {100 * row['error']:.2f} | {row['log_loss']:.4f} | "
              f"{sum(evals) if evals else ''} {evals if len(evals) > 1 else ''} | "
              f"{', '.join(f'{v:.3g}' for v in variances)} |"
              + (f" warnings: {row['warnings']}" if row["warnings"] else ""), flush=True)


if __name__ == "__main__":
    main()
