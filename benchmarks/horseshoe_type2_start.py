"""Does the horseshoe's type-II ML find the evidence peak, and how fast?

Problem: n = 100 samples, d features (1 000 or 5 000) drawn N(0, 1),
the first 20 coefficients 2, the rest 0, noise sd 0.5 (true σ² = 0.25). For each seed:

- the default ``HorseshoeRegression().fit``: time, σ², ρ², log evidence, relative coefficient
  error ``‖ŵ - w‖/‖w‖``, EP evaluations;
- a reference grid: σ² in {4, 1} x the true σ², 0.1 Var(y) and the default floor
  1e-3 Var(y), ρ² on decades
  ``10^-1 ... 10^-7``, each σ² walked from weak to strong shrinkage with warm starts (EP has
  several fixed points at strong shrinkage; a cold start there can keep every coefficient at
  zero): its best log evidence, and the coefficient error of EP at the true σ² with the ρ² of
  best evidence there ("EP at the true hyperparameters");
- with scikit-learn installed, ``LassoCV`` for scale.

Targets: default fit <= 30 s at d = 1 000; its log evidence >= the grid's best; its
coefficient error <= 1.5 x that of EP at the true hyperparameters.

    python benchmarks/horseshoe_type2_start.py                 # seeds 0-4, d = 1000
    python benchmarks/horseshoe_type2_start.py --d 5000 --seeds 0 1
"""
import argparse
import time
import warnings

import numpy as np

from fastep import HorseshoeRegression
from fastep._epcore.horseshoe_ep import HorseshoeEP, HorseshoeOptions, HorseshoePrior

TRUE_SIGMA2 = 0.25


def problem(seed, d, n=100, relevant=20, weight=2.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    coef = np.zeros(d)
    coef[:relevant] = weight
    y = X @ coef + np.sqrt(TRUE_SIGMA2) * rng.standard_normal(n)
    return X, y, coef


def relative_error(estimate, coef):
    return float(np.linalg.norm(estimate - coef) / np.linalg.norm(coef))


def reference_grid(X, y, coef):
    """Best log evidence over the grid, and the error of EP at the true σ² (best ρ² there)."""
    Xc, yc = X - X.mean(0), y - y.mean()
    d = X.shape[1]
    options = HorseshoeOptions(negative_precision="clip", damping=0.5, damping_decay=0.99, min_damping=0.3,
                               tol=1e-8, max_sweeps=1000, n_threads=1 if d < 4096 else 0)
    best, at_truth = (-np.inf, None), (-np.inf, None)
    for sigma2 in (TRUE_SIGMA2 * 4, TRUE_SIGMA2, 1e-3 * np.var(y), 0.1 * np.var(y)):
        sites = None
        for k in range(1, 8):
            rho2 = 10.0 ** -k
            prior = HorseshoePrior(rho2, 1.0, np.zeros((d, 0)), np.ones(d))
            try:
                result = HorseshoeEP(Xc, yc, sigma2, prior, options, sites).run()
            except ValueError:
                break
            sites = result.sites
            if not result.converged:
                break
            point = (result.log_z, (sigma2, rho2, relative_error(result.mean, coef)))
            best = max(best, point, key=lambda p: p[0])
            if sigma2 == TRUE_SIGMA2:
                at_truth = max(at_truth, point, key=lambda p: p[0])
    return best, at_truth


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--no-grid", action="store_true", help="skip the reference grid")
    args = parser.parse_args()
    try:
        from sklearn.linear_model import LassoCV
    except ImportError:
        LassoCV = None
    print(f"n = 100, d = {args.d}, 20 relevant (w = 2), noise sd 0.5")
    for seed in args.seeds:
        X, y, coef = problem(seed, args.d)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            model = HorseshoeRegression().fit(X, y)
            seconds = time.perf_counter() - start
        line = (f"seed {seed}: default fit {seconds:6.1f} s, {model.n_evaluations_:3d} evaluations, "
                f"sigma2 {model.noise_variance_:.4g}, rho2 {model.rho2_:.3g}, log evidence {model.log_marginal_likelihood_value_:9.2f}, "
                f"error {relative_error(model.coef_, coef):.3f}")
        if caught:
            line += f" [{len(caught)} warnings: {str(caught[0].message)[:60]}]"
        print(line, flush=True)
        if not args.no_grid:
            start = time.perf_counter()
            best, at_truth = reference_grid(X, y, coef)
            print(f"    grid ({time.perf_counter() - start:.0f} s): best log evidence {best[0]:9.2f} at sigma2 "
                  f"{best[1][0]:.4g}, rho2 {best[1][1]:.0e}; EP at the true sigma2 (rho2 {at_truth[1][1]:.0e}): "
                  f"log evidence {at_truth[0]:9.2f}, error {at_truth[1][2]:.3f}; "
                  f"ratios: evidence {model.log_marginal_likelihood_value_ - best[0]:+.2f} nats, "
                  f"error {relative_error(model.coef_, coef) / at_truth[1][2]:.2f}x", flush=True)
        if LassoCV is not None:
            start = time.perf_counter()
            lasso = LassoCV(cv=5, random_state=0).fit(X, y)
            print(f"    LassoCV {time.perf_counter() - start:.1f} s, error {relative_error(lasso.coef_, coef):.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
