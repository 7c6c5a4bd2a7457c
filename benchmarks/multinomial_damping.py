"""Nested-EP damping of the multinomial model on small ARD problems: the default (adaptive) rule
against fixed damping, one run.

Each problem: 3 classes, n = 200 training and 2000 test points, 4 inputs of which the last two
are irrelevant, the class the argmax of three latent functions of the first two inputs plus
Gaussian noise; ``GaussianProcessClassifier(RBFARD([0.5] * 4, 1, 1), multi_class="multinomial")``
learns the kernel. Generators: ``sin`` (inputs uniform on [-2, 2], latents 2 sin(w_k . x), the
asv benchmark ``bench_learning.LearnSmallARDMultinomial``) and ``lin`` (standard normal inputs,
latents 1.5 w_k . x), w_k unit vectors 120 degrees apart; noise sd 0.7 or 0.1 (nearly
separable). Printed per fit: time, evidence evaluations, nested-EP runs and their outer
iterations in total, test error and log loss; beside them (``--peer``, needs scikit-learn)
scikit-learn's ``GaussianProcessClassifier(C(1) * RBF([1] * 4))`` (one-vs-rest Laplace, the
kernel learnt by its default optimiser).

Usage::

    python benchmarks/multinomial_damping.py [--dampings None 0.5] [--peer]
"""
import argparse
import time
import warnings

import numpy as np

PROBLEMS = [("sin", 0, 0.7), ("sin", 1, 0.7), ("lin", 0, 0.7), ("lin", 1, 0.7), ("lin", 0, 0.1), ("sin", 0, 0.1)]


def make(kind, n, seed, noise):
    rng = np.random.default_rng(seed)
    angles = np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3])
    W = np.c_[np.cos(angles), np.sin(angles)]
    if kind == "sin":
        X = rng.uniform(-2, 2, size=(n, 4))
        f = 2.0 * np.sin(X[:, :2] @ W.T)
    else:
        X = rng.standard_normal((n, 4))
        f = 1.5 * X[:, :2] @ W.T
    return X, np.argmax(f + noise * rng.standard_normal((n, 3)), axis=1)


def fit_one(kind, seed, noise, damping):
    from fastep import GaussianProcessClassifier
    from fastep.kernels import RBFARD
    import fastep._dense.multiclass as multiclass
    X, y = make(kind, 200, 10 * seed, noise)
    Xt, yt = make(kind, 2000, 10 * seed + 1, noise)
    iterations = []
    run = multiclass.MultinomialGPProblem._ep

    def counted(self, *args, **kwargs):
        state = run(self, *args, **kwargs)
        iterations.append(state.info.n_sweeps)
        return state
    multiclass.MultinomialGPProblem._ep = counted
    try:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = GaussianProcessClassifier(RBFARD([0.5] * 4, 1.0, 1.0), multi_class="multinomial",
                                            damping=damping).fit(X, y)
        elapsed = time.perf_counter() - start
    finally:
        multiclass.MultinomialGPProblem._ep = run
    p = clf.predict_proba(Xt)
    return (elapsed, int(clf.n_evaluations_), len(iterations), int(sum(iterations)),
            float(np.mean(clf.predict(Xt) != yt)), float(-np.mean(np.log(p[np.arange(yt.size), yt]))))


def fit_peer(kind, seed, noise):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    X, y = make(kind, 200, 10 * seed, noise)
    Xt, yt = make(kind, 2000, 10 * seed + 1, noise)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = GaussianProcessClassifier(ConstantKernel(1.0) * RBF(np.ones(4))).fit(X, y)
    elapsed = time.perf_counter() - start
    p = np.clip(clf.predict_proba(Xt), 1e-12, 1.0)
    return elapsed, float(np.mean(clf.predict(Xt) != yt)), float(-np.mean(np.log(p[np.arange(yt.size), yt])))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dampings", nargs="+", default=["None", "0.5"])
    parser.add_argument("--peer", action="store_true", help="scikit-learn's learnt ARD GPC beside each problem")
    args = parser.parse_args()
    print("| problem (kind, seed, noise sd) | damping | fit | evaluations | EP runs | outer iterations | "
          "test error | log loss |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, seed, noise in PROBLEMS:
        for name in args.dampings:
            damping = None if name == "None" else float(name)
            t, evals, runs, its, err, ll = fit_one(kind, seed, noise, damping)
            print(f"| {kind}, {seed}, {noise} | {name} | {t:.2f} s | {evals} | {runs} | {its} | {100 * err:.2f} % | "
                  f"{ll:.4f} |", flush=True)
        if args.peer:
            t, err, ll = fit_peer(kind, seed, noise)
            print(f"| {kind}, {seed}, {noise} | scikit-learn, learnt ARD | {t:.2f} s | | | | {100 * err:.2f} % | "
                  f"{ll:.4f} |", flush=True)


if __name__ == "__main__":
    main()
