"""Command-line interface: ``fastep demo`` (also ``python -m fastep demo``)."""
import argparse
import sys
import time

import numpy as np

__all__ = ["main"]


def _rbf_features(X, centres, inverse_width):
    """Radial basis features exp(-inverse_width/2 |x - c|^2) (a weight-space stand-in for the RBF GP)."""
    d2 = np.sum((X[:, None, :] - centres[None, :, :]) ** 2, axis=-1)
    return np.exp(-0.5 * inverse_width * d2)


def demo(n_train=500, n_test=500, grid=12, seed=0, out=sys.stdout):
    """Fit fastep's models to the IVM paper's toy problem and print accuracy, evidence and time.

    Returns a dict of the fitted models: ``linear`` (weight-space EP on RBF features),
    ``gp_fixed`` and ``gp_learnt`` (dense GP EP classifiers), ``ivm`` (IVM classifier).
    """
    from .datasets import make_ivm_toy_classification
    from .likelihoods import Probit
    from .linear import LinearEPClassifier

    # Draw one pool of at least 1000 points so that smaller runs are subsets of the default problem.
    n_pool = max(1000, n_train + n_test)
    X, y, f = make_ivm_toy_classification(n_pool, random_state=seed)
    X_train, y_train = X[:n_train], y[:n_train]
    X_test, y_test, f_test = X[n_pool - n_test:], y[n_pool - n_test:], f[n_pool - n_test:]
    g = (np.arange(grid) + 0.5) / grid
    centres = np.array([(a, b) for a in g for b in g])
    inverse_width = 10.0  # the generating GP's inverse width (IVM §4.1.2)
    F_train = _rbf_features(X_train, centres, inverse_width)
    F_test = _rbf_features(X_test, centres, inverse_width)

    print("fastep demo: IVM toy problem (Lawrence, Seeger & Herbrich 2005, §4.1.2)", file=out)
    print(f"  {n_train} training / {n_test} test points uniform on the unit square; labels from "
          "Φ(GP sample), RBF variance 100, inverse width 10; seed "
          f"{seed}", file=out)
    bayes = np.mean(np.sign(f_test) == y_test)
    print(f"  accuracy of the true latent sign on the test points (noise ceiling): {bayes:.3f}", file=out)
    print("", file=out)
    print(f"Bayesian probit regression on {centres.shape[0]} RBF basis features, weight-space EP (Minka §1.1)",
          file=out)
    model = LinearEPClassifier(Probit(), prior_cov=25.0, fit_intercept=True, intercept_prior_var=25.0)
    t0 = time.perf_counter()
    model.fit(F_train, y_train)
    elapsed = time.perf_counter() - t0
    print(f"  sweeps {model.n_sweeps_} (converged: {model.converged_}), fit time {elapsed * 1e3:.1f} ms", file=out)
    print(f"  log evidence        {model.log_evidence_:.4f}", file=out)
    print(f"  training accuracy   {model.score(F_train, y_train):.3f}", file=out)
    print(f"  test accuracy       {model.score(F_test, y_test):.3f}", file=out)
    p = model.predict_proba(F_test)[:, 1]
    log_loss = -np.mean(np.log(np.where(y_test > 0, p, 1.0 - p)))
    print(f"  test log loss       {log_loss:.4f}", file=out)

    from .gp import GaussianProcessClassifier
    from .kernels import RBF

    models = {"linear": model}
    for title, kernel, optimizer in (
            ("at the generating hyperparameters (RBF variance 100, inverse width 10)",
             RBF(variance=100.0, inverse_width=10.0), None),
            ("hyperparameters learnt from RBF(1, 1) by L-BFGS-B on the EP evidence",
             RBF(variance=1.0, inverse_width=1.0, transforms={"variance": "log", "inverse_width": "log"}),
             "L-BFGS-B")):
        print("", file=out)
        print(f"GP classifier, dense EP in kernel space (Minka §2), {title}", file=out)
        gpc = GaussianProcessClassifier(kernel, Probit(), optimizer=optimizer, tol=1e-6)
        t0 = time.perf_counter()
        gpc.fit(X_train, y_train)
        elapsed = time.perf_counter() - t0
        params = gpc.kernel_.get_params()
        print(f"  kernel              RBF(variance={params['variance']:.4g}, "
              f"inverse_width={params['inverse_width']:.4g})", file=out)
        print(f"  sweeps {gpc.n_sweeps_} (converged: {gpc.converged_}), fit time {elapsed * 1e3:.1f} ms",
              file=out)
        print(f"  log evidence        {gpc.log_marginal_likelihood_value_:.4f}", file=out)
        print(f"  training accuracy   {gpc.score(X_train, y_train):.3f}", file=out)
        print(f"  test accuracy       {gpc.score(X_test, y_test):.3f}", file=out)
        p = gpc.predict_proba(X_test)[:, 1]
        log_loss = -np.mean(np.log(np.where(y_test > 0, p, 1.0 - p)))
        print(f"  test log loss       {log_loss:.4f}", file=out)
        models["gp_fixed" if optimizer is None else "gp_learnt"] = gpc

    from .ivm import IVMClassifier

    d = min(100, max(1, n_train // 5))
    print("", file=out)
    print(f"Informative Vector Machine (Lawrence, Seeger & Herbrich 2005): {d} of {n_train} points active, "
          "RBF kernel learnt from RBF(1, 1) by Algorithm 2 (3 rounds of selection + L-BFGS-B on eq 32)",
          file=out)
    ivm = IVMClassifier(RBF(variance=1.0, inverse_width=1.0), Probit(), active_set_size=d, n_iterations=3,
                        max_optimizer_iter=50)
    t0 = time.perf_counter()
    ivm.fit(X_train, y_train)
    elapsed = time.perf_counter() - t0
    params = ivm.kernel_.get_params()
    print(f"  kernel              RBF(variance={params['variance']:.4g}, "
          f"inverse_width={params['inverse_width']:.4g})   (paper, d = 200: 6.54, 8.51)", file=out)
    print(f"  fit time {elapsed * 1e3:.1f} ms; prediction costs {d} kernel evaluations per point", file=out)
    print(f"  log likelihood (eq 32) {ivm.log_likelihood_:.4f}", file=out)
    print(f"  training accuracy   {ivm.score(X_train, y_train):.3f}", file=out)
    print(f"  test accuracy       {ivm.score(X_test, y_test):.3f}", file=out)
    p = ivm.predict_proba(X_test)[:, 1]
    log_loss = -np.mean(np.log(np.where(y_test > 0, p, 1.0 - p)))
    print(f"  test log loss       {log_loss:.4f}", file=out)
    models["ivm"] = ivm
    return models


def main(argv=None):
    """Entry point of the ``fastep`` console script."""
    parser = argparse.ArgumentParser(prog="fastep", description="fastep: fast, trustworthy Expectation Propagation")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="fit fastep's models to the IVM paper's toy problem (no download)")
    p_demo.add_argument("--n-train", type=int, default=500)
    p_demo.add_argument("--n-test", type=int, default=500)
    p_demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.n_train < 2 or args.n_test < 1:
            parser.error("--n-train must be >= 2 and --n-test >= 1")
        demo(n_train=args.n_train, n_test=args.n_test, seed=args.seed)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
