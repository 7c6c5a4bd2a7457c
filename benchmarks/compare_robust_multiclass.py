"""Robust (Student-t) GP regression and multinomial GP classification, side by side.

    python benchmarks/compare_robust_multiclass.py [--part robust|multiclass|all] [--repeats 3] [--quick]

Robust regression (Jylänki, Vanhatalo & Vehtari 2011), data generated here:

* ``neal``: Neal's (1997) outlier benchmark, x ~ U(-3, 3), f(x) = 0.3 + 0.4x + 0.5 sin(2.7x)
  + 1.1/(1 + x²), noise N(0, 0.1²) on 85 % of the targets and N(0, 1²) on 15 %; 200 training
  points, the error measured against f on 1000 test inputs.
* ``friedman``: Friedman #1 (x ~ U(0, 1)^10, f = 10 sin(π x₁x₂) + 20 (x₃ - ½)² + 10 x₄ + 5 x₅),
  noise N(0, 1) with 10 % of the targets replaced by f + N(0, 15²); 300 training points.

Each problem is fitted by ``fastep.GaussianProcessRegressor(likelihood='student_t')``
(fractional EP, η = 0.5, ν and σ learnt), its sparse twin ``fastep.SparseGPRegressor(
likelihood='student_t', n_inducing=50)`` (FITC), the Gaussian ``fastep.GaussianProcessRegressor()``,
scikit-learn's ``GaussianProcessRegressor(C·RBF + White)`` (5 restarts off: one start, as
fastep) and a Laplace fit of the same Student-t model written here with scipy (mode by
Newton on log p(y|f) - ½ fᵀK⁻¹f with step halving, Laplace evidence
``log p(y|f̂) - ½ f̂ᵀK⁻¹f̂ - ½ log|I + K W|``, hyperparameters by L-BFGS-B with
finite-difference gradients from fastep's data-aware start). Reported: test RMSE against f,
mean absolute error, fit time (median over ``--repeats`` seeds of the data).

Multiclass (Riihimäki, Jylänki & Vehtari 2013):

* ``toy3``: 3 classes from argmax of three linear functions of 2-D Gaussian inputs plus
  N(0, 0.3²) noise; 300 training, 1000 test points.
* ``usps``: USPS digits (../shared/data/usps.npz; skipped when absent), classes {3, 5, 8} and
  {0, 1, 2, 3}, 150 training images per class, the standard test images of those classes.

``fastep`` multinomial (nested EP), fastep one-vs-rest, scikit-learn's
``GaussianProcessClassifier`` (Laplace, one-vs-rest). Reported: accuracy, log loss, fit time.
"""
import argparse
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import minimize
from scipy.special import gammaln

from fastep import GaussianProcessClassifier, GaussianProcessRegressor, SparseGPRegressor

HERE = Path(__file__).resolve().parent
USPS = HERE.parent.parent / "shared" / "data" / "usps.npz"


# -- data -----------------------------------------------------------------------------------------

def neal(seed, n=200, n_test=1000):
    rng = np.random.default_rng(seed)
    f = lambda x: 0.3 + 0.4 * x + 0.5 * np.sin(2.7 * x) + 1.1 / (1 + x * x)
    x = rng.uniform(-3, 3, n)
    noise = np.where(rng.random(n) < 0.15, 1.0, 0.1) * rng.normal(size=n)
    xt = np.linspace(-3, 3, n_test)
    return x[:, None], f(x) + noise, xt[:, None], f(xt)


def friedman(seed, n=300, n_test=1000):
    rng = np.random.default_rng(seed)
    f = lambda X: (10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3]
                   + 5 * X[:, 4])
    X = rng.uniform(size=(n, 10))
    y = f(X) + rng.normal(size=n)
    out = rng.random(n) < 0.1
    y[out] = f(X[out]) + 15.0 * rng.normal(size=out.sum())
    Xt = rng.uniform(size=(n_test, 10))
    return X, y, Xt, f(Xt)


def toy3(seed, n=300, n_test=1000):
    rng = np.random.default_rng(seed)
    W = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
    X = rng.normal(size=(n, 2))
    Xt = rng.normal(size=(n_test, 2))
    return X, np.argmax(X @ W + 0.3 * rng.normal(size=(n, 3)), axis=1), Xt, np.argmax(Xt @ W, axis=1)


def usps(seed, digits, per_class=150):
    data = np.load(USPS)
    rng = np.random.default_rng(seed)
    idx = np.concatenate([rng.choice(np.flatnonzero(data["y_train"] == d), per_class, replace=False)
                          for d in digits])
    test = np.isin(data["y_test"], digits)
    return (2 * data["X_train"][idx] - 1, data["y_train"][idx], 2 * data["X_test"][test] - 1,
            data["y_test"][test])


# -- the Laplace fit of the Student-t model (written for this comparison) --------------------------

def _student_t_terms(r, dof, scale):
    c = dof * scale * scale
    log_p = (gammaln(0.5 * (dof + 1)) - gammaln(0.5 * dof) - 0.5 * np.log(dof * np.pi) - np.log(scale)
             - 0.5 * (dof + 1) * np.log1p(r * r / c))
    grad = (dof + 1) * r / (c + r * r)                   # d log p / d f  (r = y - f)
    W = (dof + 1) * (c - r * r) / (c + r * r) ** 2       # -d² log p / d f²
    return log_p, grad, W


def laplace_student_t(K, y, dof, scale, f0=None, max_iter=100):
    """Mode f̂ and the Laplace log evidence of the Student-t GP; -inf where the Hessian is not PD."""
    n = y.size
    f = np.zeros(n) if f0 is None else f0.copy()
    K_chol = cho_factor(K, lower=True)

    def objective(f):
        a = cho_solve(K_chol, f)
        return np.sum(_student_t_terms(y - f, dof, scale)[0]) - 0.5 * f @ a

    value = objective(f)
    for _ in range(max_iter):
        _, g, W = _student_t_terms(y - f, dof, scale)
        # Newton step on the posterior: (K⁻¹ + W) δ = g - K⁻¹ f, with W floored at 0 for a descent direction
        Wp = np.maximum(W, 0.0)
        s = np.sqrt(Wp)
        B = np.eye(n) + s[:, None] * K * s[None, :]
        b = Wp * f + g
        L = cho_factor(B, lower=True)
        a = b - s * cho_solve(L, s * (K @ b))
        f_new = K @ a
        step = 1.0
        while step > 1e-6:
            trial = f + step * (f_new - f)
            v = objective(trial)
            if v >= value - 1e-12:
                break
            step *= 0.5
        converged = abs(v - value) < 1e-10 * max(1.0, abs(value))
        f, value = trial, v
        if converged:
            break
    log_p, _, W = _student_t_terms(y - f, dof, scale)
    sign, log_det = np.linalg.slogdet(np.eye(n) + K * W[None, :])
    if sign <= 0:
        return -np.inf, f
    return value - 0.5 * log_det, f


def fit_laplace(X, y, kernel0, dof0, scale0):
    """Type-II ML of (kernel θ, log ν, log σ) for the Laplace approximation; returns a predictor."""
    theta0 = np.concatenate([kernel0.theta, [np.log(dof0), np.log(scale0)]])
    cache = {"f": None}

    def negative(theta):
        kernel = kernel0.clone_with_theta(theta[:-2])
        K = kernel(X) + 1e-8 * np.eye(X.shape[0])
        try:
            value, f = laplace_student_t(K, y, np.exp(theta[-2]), np.exp(theta[-1]), cache["f"])
        except np.linalg.LinAlgError:
            return 1e10
        if not np.isfinite(value):
            return 1e10
        cache["f"] = f
        return -value

    bounds = list(kernel0.bounds.reshape(-1, 2)) + [(np.log(0.2), np.log(1e5)), (np.log(scale0) - 15, np.log(scale0) + 10)]
    result = minimize(negative, theta0, method="L-BFGS-B", bounds=bounds)
    theta = result.x
    kernel = kernel0.clone_with_theta(theta[:-2])
    K = kernel(X) + 1e-8 * np.eye(X.shape[0])
    _, f = laplace_student_t(K, y, np.exp(theta[-2]), np.exp(theta[-1]))
    weights = cho_solve(cho_factor(K, lower=True), f)
    return lambda Xt: kernel(Xt, X) @ weights


# -- runs -----------------------------------------------------------------------------------------

def _timed(fit):
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fit()
    return out, time.perf_counter() - t


def robust(repeats):
    from sklearn.gaussian_process import GaussianProcessRegressor as SkGPR
    from sklearn.gaussian_process.kernels import RBF as SkRBF, ConstantKernel, WhiteKernel
    rows = []
    for name, make in (("neal", neal), ("friedman", friedman)):
        results = {}
        for seed in range(repeats):
            X, y, Xt, ft = make(seed)
            fits = {
                "fastep student-t (EP)": lambda: GaussianProcessRegressor(likelihood="student_t").fit(X, y).predict,
                "fastep sparse student-t m=50": lambda: SparseGPRegressor(
                    likelihood="student_t", n_inducing=50, random_state=seed).fit(X, y).predict,
                "fastep gaussian": lambda: GaussianProcessRegressor().fit(X, y).predict,
                "sklearn gaussian": lambda: SkGPR(ConstantKernel(np.var(y)) * SkRBF(1.0) + WhiteKernel(np.var(y) / 10),
                                                  normalize_y=True).fit(X, y).predict,
            }

            def laplace():
                start = GaussianProcessRegressor(likelihood="student_t", optimizer=None).fit(X, y)
                return fit_laplace(X, y, start.kernel_, 4.0, start.likelihood_.scale)

            fits["scipy student-t (Laplace)"] = laplace
            for label, fit in fits.items():
                predict, seconds = _timed(fit)
                err = predict(Xt) - ft
                results.setdefault(label, []).append((np.sqrt(np.mean(err ** 2)), np.mean(np.abs(err)), seconds))
        for label, values in results.items():
            v = np.array(values)
            rows.append((name, label, np.median(v[:, 0]), np.median(v[:, 1]), np.median(v[:, 2])))
    print(f"{'data':10s} {'model':28s} {'RMSE':>8s} {'MAE':>8s} {'fit s':>8s}")
    for row in rows:
        print(f"{row[0]:10s} {row[1]:28s} {row[2]:8.4f} {row[3]:8.4f} {row[4]:8.2f}")


def multiclass(repeats, quick):
    from sklearn.gaussian_process import GaussianProcessClassifier as SkGPC
    from sklearn.gaussian_process.kernels import RBF as SkRBF, ConstantKernel
    problems = [("toy3", toy3)]
    if USPS.exists():
        problems += [("usps 3/5/8", lambda s: usps(s, [3, 5, 8], 60 if quick else 150)),
                     ("usps 0-3", lambda s: usps(s, [0, 1, 2, 3], 50 if quick else 150))]
    else:
        print(f"(USPS not found at {USPS}: skipped)")
    rows = []
    for name, make in problems:
        results = {}
        for seed in range(repeats):
            X, y, Xt, yt = make(seed)
            classes = np.unique(y)
            fits = {
                "fastep multinomial (nested EP)": lambda: GaussianProcessClassifier(multi_class="multinomial").fit(X, y),
                "fastep one-vs-rest (EP)": lambda: GaussianProcessClassifier().fit(X, y),
                "sklearn one-vs-rest (Laplace)": lambda: SkGPC(ConstantKernel(1.0) * SkRBF(np.sqrt(X.shape[1]))).fit(X, y),
            }
            for label, fit in fits.items():
                model, seconds = _timed(fit)
                p = np.clip(model.predict_proba(Xt), 1e-300, None)
                col = np.searchsorted(classes, yt)
                results.setdefault(label, []).append((np.mean(classes[p.argmax(1)] == yt),
                                                      -np.mean(np.log(p[np.arange(yt.size), col])), seconds))
        for label, values in results.items():
            v = np.array(values)
            rows.append((name, label, np.median(v[:, 0]), np.median(v[:, 1]), np.median(v[:, 2])))
    print(f"{'data':12s} {'model':32s} {'accuracy':>9s} {'log loss':>9s} {'fit s':>8s}")
    for row in rows:
        print(f"{row[0]:12s} {row[1]:32s} {row[2]:9.4f} {row[3]:9.4f} {row[4]:8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["robust", "multiclass", "all"], default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller USPS subsets")
    args = parser.parse_args()
    if args.part in ("robust", "all"):
        robust(args.repeats)
    if args.part in ("multiclass", "all"):
        multiclass(args.repeats, args.quick)


if __name__ == "__main__":
    main()
