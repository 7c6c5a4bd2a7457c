"""Command-line interface (also ``python -m fastep``).

``fastep fit``, ``fastep predict``, ``fastep evaluate``, ``fastep info`` fit and use models on the
user's own files (CSV with a header row, or ``.npz`` with ``X`` and ``y``); ``fastep info`` without
a model file prints the installation's versions (:func:`fastep.show_versions`); ``fastep demo`` runs
the built-in toy problem. ``fastep <command> --help`` describes each.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING

import numpy as np

from ._version import version as _fastep_version

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import IO

    from numpy.typing import NDArray

    from ._base import BaseEstimator
    from .kernels import Kernel

__all__ = ["main", "parse_kernel", "demo"]


def _rbf_features(X, centres, inverse_width):
    """Radial basis features exp(-inverse_width/2 |x - c|^2) (a weight-space stand-in for the RBF GP)."""
    d2 = np.sum((X[:, None, :] - centres[None, :, :]) ** 2, axis=-1)
    return np.exp(-0.5 * inverse_width * d2)


def _timed_fit(model, X, y):
    """Fit ``model``; the seconds it took."""
    start = time.perf_counter()
    model.fit(X, y)
    return time.perf_counter() - start


def _rbf_text(kernel):
    """An RBF kernel's two parameters, to four significant digits."""
    params = kernel.get_params()
    return f"RBF(variance={params['variance']:.4g}, inverse_width={params['inverse_width']:.4g})"


def _print_scores(model, X_train, y_train, X_test, y_test, out):
    """The demo's accuracy on the training and test points and its test log loss (labels ±1)."""
    print(f"  training accuracy   {model.score(X_train, y_train):.3f}", file=out)
    print(f"  test accuracy       {model.score(X_test, y_test):.3f}", file=out)
    p = model.predict_proba(X_test)[:, 1]
    log_loss = -np.mean(np.log(np.where(y_test > 0, p, 1.0 - p)))
    print(f"  test log loss       {log_loss:.4f}", file=out)


def demo(n_train: int = 500, n_test: int = 500, grid: int = 12, seed: int = 0, out: IO[str] = sys.stdout
         ) -> dict[str, BaseEstimator]:
    """Fit fastep's models to the IVM paper's toy problem and print accuracy, evidence and time.

    Parameters
    ----------
    n_train, n_test : int, default 500, 500
        Training and test points (uniform on the unit square, labels from Φ of a GP sample).
    grid : int, default 12
        RBF basis centres per axis of the weight-space model.
    seed : int, default 0
    out : file-like, default sys.stdout

    Returns
    -------
    dict
        The fitted models: ``linear`` (weight-space EP on RBF features), ``gp_fixed`` and
        ``gp_learnt`` (dense GP EP classifiers), ``ivm`` (IVM classifier).

    Examples
    --------
    >>> import io
    >>> from fastep.cli import demo
    >>> models = demo(n_train=60, n_test=30, out=io.StringIO())
    >>> sorted(models)
    ['gp_fixed', 'gp_learnt', 'ivm', 'linear']
    """
    from .datasets import make_ivm_toy_classification
    from .gp import GaussianProcessClassifier
    from .ivm import IVMClassifier
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
    elapsed = _timed_fit(model, F_train, y_train)
    print(f"  sweeps {model.n_sweeps_} (converged: {model.converged_}), fit time {elapsed * 1e3:.1f} ms", file=out)
    print(f"  log evidence        {model.log_marginal_likelihood_value_:.4f}", file=out)
    _print_scores(model, F_train, y_train, F_test, y_test, out)

    from .kernels import RBF

    models: dict[str, BaseEstimator] = {"linear": model}
    for title, kernel, optimizer in (
            ("at the generating hyperparameters (RBF variance 100, inverse width 10)",
             RBF(variance=100.0, inverse_width=10.0), None),
            ("hyperparameters learnt from RBF(1, 1) by L-BFGS-B on the EP evidence and the default "
             "hyperprior (MAP-II)",
             RBF(variance=1.0, inverse_width=1.0, transforms={"variance": "log", "inverse_width": "log"}),
             "L-BFGS-B")):
        print("", file=out)
        print(f"GP classifier, dense EP in kernel space (Minka §2), {title}", file=out)
        gpc = GaussianProcessClassifier(kernel, Probit(), optimizer=optimizer, tol=1e-6)  # type: ignore[arg-type]
        elapsed = _timed_fit(gpc, X_train, y_train)
        print(f"  kernel              {_rbf_text(gpc.kernel_)}", file=out)
        print(f"  sweeps {gpc.n_sweeps_} (converged: {gpc.converged_}), evidence evaluations "
              f"{gpc.n_evaluations_}, fit time {elapsed * 1e3:.1f} ms", file=out)
        print(f"  log evidence        {gpc.log_marginal_likelihood_value_:.4f}", file=out)
        _print_scores(gpc, X_train, y_train, X_test, y_test, out)
        models["gp_fixed" if optimizer is None else "gp_learnt"] = gpc

    d = min(100, max(1, n_train // 5))
    print("", file=out)
    print(f"Informative Vector Machine (Lawrence, Seeger & Herbrich 2005): {d} of {n_train} points active, "
          "RBF kernel learnt from RBF(1, 1) by Algorithm 2 (3 rounds of selection + the EP evidence of all "
          "training points with the active set as inducing inputs)",
          file=out)
    ivm = IVMClassifier(RBF(variance=1.0, inverse_width=1.0), Probit(), active_set_size=d, n_iterations=3,
                        max_optimizer_iter=50)
    elapsed = _timed_fit(ivm, X_train, y_train)
    print(f"  kernel              {_rbf_text(ivm.kernel_)}   (paper, d = 200: 6.54, 8.51)", file=out)
    print(f"  fit time {elapsed * 1e3:.1f} ms; prediction costs {d} kernel evaluations per point", file=out)
    print(f"  log evidence (all {n_train} points, active set as inducing inputs) "
          f"{ivm.log_marginal_likelihood_value_:.4f}", file=out)
    _print_scores(ivm, X_train, y_train, X_test, y_test, out)
    models["ivm"] = ivm
    return models


#: ``--model`` names: (fastep module, estimator class, task); the module is imported by the fit
#: (``fastep info`` and ``--help`` stay quick).
MODELS = {
    "gpc": ("gp", "GaussianProcessClassifier", "classification"),
    "gpr": ("gp", "GaussianProcessRegressor", "regression"),
    "sparse-gpc": ("sparse", "SparseGPClassifier", "classification"),
    "sparse-gpr": ("sparse", "SparseGPRegressor", "regression"),
    "ivm": ("ivm", "IVMClassifier", "classification"),
    "ivm-regression": ("ivm", "IVMRegressor", "regression"),
    "linear": ("linear", "LinearEPClassifier", "classification"),
    "linear-regression": ("linear", "LinearEPRegressor", "regression"),
    "horseshoe": ("horseshoe", "HorseshoeRegression", "regression"),
}
_KERNEL_TERMS = ("rbf", "rbf-ard", "linear", "linear-ard", "mlp", "bias", "white")


class UsageError(ValueError):
    """A problem with the command line or the user's files: reported in one line, exit status 2."""


def parse_kernel(spec: str, X: NDArray[np.float64], y: NDArray[np.float64] | None = None, *,
                 regression: bool = False) -> Kernel:
    """A kernel from a spec such as ``"rbf+bias+white"`` or ``"rbf(variance=2, inverse_width=0.1)+white"``.

    Terms: ``rbf``, ``rbf-ard``, ``linear``, ``linear-ard``, ``mlp``, ``bias``, ``white``. A term
    without parameters starts from the data: RBF inverse width 1 / median squared distance (per
    feature for ``rbf-ard``), variances from the targets' variance (regression) or 1, ``bias`` from
    the targets' mean square (regression) or 1, ``white`` a tenth of the signal variance.

    Parameters
    ----------
    spec : str
    X : ndarray (n, p)
        Training inputs (for the data-aware starting values).
    y : ndarray (n,), optional
        Real targets (regression).
    regression : bool, default False

    Returns
    -------
    fastep.kernels.Kernel

    Examples
    --------
    >>> import numpy as np
    >>> from fastep.cli import parse_kernel
    >>> X = np.array([[0.0], [1.0], [3.0]])
    >>> parse_kernel("rbf(variance=2, inverse_width=0.5)+white(variance=0.1)", X)
    RBF(variance=2.0, inverse_width=0.5) + White(variance=0.1)
    """
    from . import kernels
    from ._search.start import median_inverse_width, target_scale

    variance, offset = target_scale(y) if regression else (1.0, 1.0)
    terms: list[Kernel] = []
    cls: Callable[..., Kernel]
    for raw in spec.split("+"):
        raw = raw.strip().lower()
        name, _, rest = raw.partition("(")
        name = name.strip()
        if name not in _KERNEL_TERMS:
            raise UsageError(f"--kernel: unknown term {name!r} in {spec!r}; terms are {', '.join(_KERNEL_TERMS)}")
        params = {}
        if rest:
            if not rest.endswith(")"):
                raise UsageError(f"--kernel: missing ')' in {raw!r}")
            for item in filter(None, (part.strip() for part in rest[:-1].split(","))):
                key, eq, value = item.partition("=")
                try:
                    params[key.strip()] = float(value)
                except ValueError:
                    eq = ""
                if not eq:
                    raise UsageError(f"--kernel: {item!r} in {raw!r} is not name=number")
        p = X.shape[1]
        if name == "rbf":
            defaults = {"variance": variance, "inverse_width": median_inverse_width(X)}
            cls = kernels.RBF
        elif name == "rbf-ard":
            defaults = {"variance": variance, "inverse_width": 1.0,
                        "scales": np.sqrt(median_inverse_width(X, ard=True) / p)}
            cls = kernels.RBFARD
        elif name == "linear":
            defaults, cls = {"variance": variance / max(float(np.mean(X * X)) * p, 1e-300)}, kernels.Linear
        elif name == "linear-ard":
            defaults, cls = {"variance": variance, "scales": 1.0 / np.sqrt(np.maximum(np.mean(X * X, axis=0) * p,
                                                                                       1e-300))}, kernels.LinearARD
        elif name == "mlp":
            defaults, cls = {"variance": variance}, kernels.MLP
        elif name == "bias":
            defaults, cls = {"variance": offset}, kernels.Bias
        else:
            defaults, cls = {"variance": 0.1 * variance}, kernels.White
        defaults.update(params)
        try:
            terms.append(cls(**defaults))
        except (TypeError, ValueError) as error:
            raise UsageError(f"--kernel: {raw!r}: {error}") from None
    kernel = terms[0]
    for term in terms[1:]:
        kernel = kernel + term
    return kernel


def _estimator(args, X, y):
    from importlib import import_module
    module, name, task = MODELS[args.model]
    cls = getattr(import_module(f"fastep.{module}"), name)
    params = {}
    if args.kernel is not None:
        if args.model.startswith(("linear", "horseshoe")):
            raise UsageError(f"--kernel does not apply to --model {args.model}")
        params["kernel"] = parse_kernel(args.kernel, X, y, regression=task == "regression")
    if args.active_set_size is not None:
        if not args.model.startswith("ivm"):
            raise UsageError("--active-set-size applies to --model ivm / ivm-regression only")
        params["active_set_size"] = args.active_set_size
    if args.inducing is not None:
        if not args.model.startswith("sparse"):
            raise UsageError("--inducing applies to --model sparse-gpc / sparse-gpr only")
        params["n_inducing"] = args.inducing
    if args.model.startswith("linear"):
        params["fit_intercept"] = True
    return cls(**params), task


def _read(path, **kwargs):
    from ._tabular import read_table
    try:
        return read_table(path, **kwargs)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None


def _fit(args, err):
    from ._tabular import parse_labels
    from .persistence import save
    from .progress import ProgressBar

    features = args.features.split(",") if args.features else None
    table = _read(args.data, target=args.target, features=features)
    task = MODELS[args.model][2]
    y = parse_labels(table.y, regression=task == "regression")
    if task == "classification" and np.unique(y).shape[0] < 2:
        raise UsageError(f"{args.data}: the target column {table.target_name!r} has a single class "
                         f"({y[0]!r}); a classifier needs at least two")
    model, task = _estimator(args, table.X, y)
    bar = None if args.quiet else ProgressBar(err)
    model.set_params(callback=bar)
    start = time.perf_counter()
    try:
        model.fit(table.X, y)
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - start
    model.set_params(callback=None)
    metadata = {"features": table.feature_names, "target": table.target_name, "task": task,
                "fit_time_seconds": elapsed, "n_samples": int(table.X.shape[0]),
                "data": os.path.basename(str(args.data)), "model": args.model}
    save(model, args.output, metadata=metadata)
    if not args.quiet:
        print(f"fitted {type(model).__name__} on {table.X.shape[0]} rows x {table.X.shape[1]} features in "
              f"{elapsed:.2f} s; saved to {args.output}", file=err)
    return 0


def _load(path):
    from .persistence import load, read_metadata
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such model file")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # another fastep version: said by `info`
        model = load(path)
    return model, read_metadata(path)


def _prediction_columns(model, X, meta):
    """``{name: column}`` of the predictions ``fastep predict`` writes."""
    columns = {}
    if hasattr(model, "predict_proba"):
        columns["label"] = model.predict(X)
        proba = model.predict_proba(X)
        for j, label in enumerate(model.classes_):
            columns[f"proba_{label}"] = proba[:, j]
    else:
        mean, std = model.predict(X, return_std=True)
        columns["mean"], columns["std"] = mean, std
    if hasattr(model, "predict_latent"):
        mean, var = model.predict_latent(X)
        if mean.ndim == 1:
            columns["latent_mean"], columns["latent_var"] = mean, var
        else:
            for j, label in enumerate(model.classes_):
                columns[f"latent_mean_{label}"], columns[f"latent_var_{label}"] = mean[:, j], var[:, j]
    return columns


def _predict(args, out):
    from ._tabular import write_csv
    model, meta = _load(args.model)
    features = meta["metadata"].get("features")
    table = _read(args.data, target=None, features=features, need_target=False)
    columns = _prediction_columns(model, table.X, meta)
    if args.output:
        write_csv(args.output, columns)
    else:
        write_csv(out, columns)
    return 0


def _evaluate(args, out):
    from ._tabular import parse_labels
    model, meta = _load(args.model)
    target = args.target or meta["metadata"].get("target")
    if target is None:
        raise UsageError("--target is required (the model file does not name its target column)")
    table = _read(args.data, target=target, features=meta["metadata"].get("features"))
    n = table.X.shape[0]
    if hasattr(model, "predict_proba"):
        y = parse_labels(table.y, regression=False)
        known = set(np.asarray(model.classes_).tolist())
        unseen = sorted({str(label) for label in y.tolist() if label not in known})
        if unseen:
            raise UsageError(f"{args.data}: labels {unseen} were not seen in training (classes {sorted(map(str, known))})")
        proba = model.predict_proba(table.X)
        index = np.searchsorted(model.classes_, y)
        p_true = np.clip(proba[np.arange(n), index], 1e-300, 1.0)
        accuracy = float(np.mean(model.predict(table.X) == y))
        print(f"n {n}\naccuracy {accuracy:.6f}\nerror rate {1 - accuracy:.6f}\n"
              f"log loss {float(-np.mean(np.log(p_true))):.6f}", file=out)
    else:
        y = parse_labels(table.y, regression=True)
        mean, std = model.predict(table.X, return_std=True)
        rmse = float(np.sqrt(np.mean((y - mean) ** 2)))
        nlpd = float(np.mean(0.5 * np.log(2 * np.pi * std ** 2) + 0.5 * ((y - mean) / std) ** 2))
        print(f"n {n}\nRMSE {rmse:.6g}\nNLPD {nlpd:.6g}", file=out)
    return 0


def _info(args, out):
    if args.model is None:
        from ._show_versions import show_versions
        show_versions(file=out)
        return 0
    from .persistence import read_metadata
    if not os.path.exists(args.model):
        raise UsageError(f"{args.model}: no such model file")
    meta = read_metadata(args.model)
    extra = meta.get("metadata", {})
    summary = meta.get("summary", {})
    lines = [f"model      {meta['estimator']}" + (f" (--model {extra['model']})" if "model" in extra else "")]
    for key, label in (("kernel_", "kernel"), ("likelihood_", "likelihood"),
                       ("log_marginal_likelihood_value_", "log evidence"), ("log_evidence_", "log evidence"),
                       ("classes_", "classes"), ("n_features_in_", "features in")):
        if key in summary:
            lines.append(f"{label:<10} {summary[key]}")
    if "features" in extra:
        lines.append(f"features   {', '.join(extra['features'])}")
    if extra.get("target") is not None:
        lines.append(f"target     {extra['target']}")
    if "fit_time_seconds" in extra:
        lines.append(f"trained    on {extra.get('n_samples')} rows of {extra.get('data')} in "
                     f"{extra['fit_time_seconds']:.2f} s")
    changed = {k: v for k, v in meta["params"].items() if v is not None and v != "deprecated"}
    lines.append("parameters " + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
    lines.append(f"saved by   fastep {meta['fastep_version']} (format {meta['format_version']}); "
                 f"this is fastep {_fastep_version()}")
    print("\n".join(lines), file=out)
    return 0


def _pyplot_agg():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("fastep demo --plot needs matplotlib: pip install 'fastep[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _demo_figure(model, n_train, n_test, seed, path):
    """The IVM toy figure: the demo's training points, predictive probability and active set."""
    from .datasets import make_ivm_toy_classification
    from .plotting import plot_decision_surface
    plt = _pyplot_agg()
    X, y, _ = make_ivm_toy_classification(max(1000, n_train + n_test), random_state=seed)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    plot_decision_surface(model, X[:n_train], y[:n_train], ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser():
    parser = argparse.ArgumentParser(prog="fastep", description="fastep: fast, trustworthy Expectation Propagation")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="fit fastep's models to the IVM paper's toy problem (no download)")
    p_demo.add_argument("--n-train", type=int, default=500)
    p_demo.add_argument("--n-test", type=int, default=500)
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--plot", metavar="PNG", help="also draw the IVM's predictive probability and active set "
                                                       "(the paper's toy figure) to this file (needs fastep[plot])")

    p_fit = sub.add_parser("fit", help="fit a model to a CSV or .npz file and save it",
                           description="Fit a model to DATA (CSV with a header row, or .npz with X and y) and "
                                       "save it to -o (an .npz model file, read by predict/evaluate/info).")
    p_fit.add_argument("data")
    p_fit.add_argument("--target", help="the column (CSV) or array (.npz, default 'y') to predict")
    p_fit.add_argument("--model", choices=sorted(MODELS), default="gpc")
    p_fit.add_argument("--features", help="comma-separated feature columns (default: all but the target)")
    p_fit.add_argument("--kernel", help="e.g. 'rbf+bias+white' or 'rbf(variance=2,inverse_width=0.1)'; terms: "
                                        + ", ".join(_KERNEL_TERMS) + " (default: the model's data-aware kernel)")
    p_fit.add_argument("--active-set-size", type=int, help="IVM: number of active points")
    p_fit.add_argument("--inducing", type=int, help="sparse GP: number of inducing inputs")
    p_fit.add_argument("-o", "--output", required=True, help="model file to write (.npz)")
    p_fit.add_argument("--quiet", action="store_true", help="no progress display")

    p_predict = sub.add_parser("predict", help="predict with a saved model",
                               description="Write labels and class probabilities (classifiers) or predictive "
                                           "mean and standard deviation (regressors), and the latent mean and "
                                           "variance, for every row of DATA.")
    p_predict.add_argument("model")
    p_predict.add_argument("data")
    p_predict.add_argument("-o", "--output", help="CSV to write (default: standard output)")

    p_eval = sub.add_parser("evaluate", help="score a saved model on labelled data",
                            description="Accuracy, error rate and log loss (classifiers) or RMSE and NLPD "
                                        "(regressors) of a saved model on DATA.")
    p_eval.add_argument("model")
    p_eval.add_argument("data")
    p_eval.add_argument("--target", help="target column (default: the one the model was fitted to)")

    p_info = sub.add_parser("info", help="describe a saved model, or (without MODEL) this installation",
                            description="With MODEL: the saved model's estimator, kernel, likelihood, evidence, "
                                        "features, target, training and versions. Without: the versions of "
                                        "fastep, Python, numpy, scipy and threadpoolctl, the BLAS and OpenMP "
                                        "libraries loaded and the optional extras installed (as "
                                        "fastep.show_versions() prints them; paste it into a bug report).")
    p_info.add_argument("model", nargs="?", help="a model file written by fastep fit or fastep.save")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastep`` console script; returns the exit status.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 for a usage or data error (reported on standard error in one line).

    Examples
    --------
    >>> from fastep.cli import main
    >>> main(["demo", "--n-train", "40", "--n-test", "20"])  # doctest: +SKIP
    0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    out, err = sys.stdout, sys.stderr
    if args.command == "demo":
        if args.n_train < 2 or args.n_test < 1:
            parser.error("--n-train must be >= 2 and --n-test >= 1")
        if args.plot:
            _pyplot_agg()                         # fail before the fits if matplotlib is missing
        models = demo(n_train=args.n_train, n_test=args.n_test, seed=args.seed)
        if args.plot:
            _demo_figure(models["ivm"], args.n_train, args.n_test, args.seed, args.plot)
            print(f"figure written to {args.plot}", file=out)
        return 0
    commands = {"fit": lambda: _fit(args, err), "predict": lambda: _predict(args, out),
                "evaluate": lambda: _evaluate(args, out), "info": lambda: _info(args, out)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            status = commands[args.command]()
        except (UsageError, ValueError, TypeError) as error:
            print(f"fastep {args.command}: error: {error}", file=err)
            status = 2
        finally:
            seen = set()
            for warning in caught:                  # one line each, without Python's source location
                text = f"{warning.category.__name__}: {warning.message}"
                if text not in seen and not issubclass(warning.category, (DeprecationWarning, PendingDeprecationWarning)):
                    seen.add(text)
                    print(f"fastep {args.command}: warning: {text}", file=err)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
