"""Pictures of fitted models (needs the ``plot`` extra: ``pip install 'fastep[plot]'``).

Each function draws on a matplotlib ``Axes`` (a new figure's when ``ax`` is None) and returns it:

- :func:`plot_decision_surface`: a 2-D classifier's predictive probability with contours, the
  training points, and the IVM's active set or the sparse model's inducing inputs;
- :func:`plot_convergence`: EP's largest site change and log evidence per sweep, from the
  records an estimator's ``callback`` collected;
- :func:`plot_horseshoe_coefficients`: posterior means with credible intervals and the
  inclusion probabilities of a horseshoe regression;
- :func:`plot_calibration`: a reliability diagram (observed frequency against predicted
  probability);
- :func:`plot_evidence_landscape`: the log marginal likelihood over two hyperparameters around
  the learnt point.

matplotlib is imported only when one of them is called.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from ._special import ndtri

from ._base import fill_doc

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from matplotlib.axes import Axes
    from numpy.typing import ArrayLike

    from .gp import GaussianProcessClassifier, GaussianProcessRegressor
    from .horseshoe import HorseshoeRegression, MultiTaskHorseshoeRegression
    from .progress import ProgressRecord
    from .sparse import SparseGPClassifier, SparseGPRegressor

__all__ = ["plot_decision_surface", "plot_convergence", "plot_horseshoe_coefficients", "plot_calibration",
           "plot_evidence_landscape"]

#: What every drawing function returns, and the start of its examples (no display needed).
_SECTIONS = {"RETURNS": """Returns
    -------
    matplotlib.axes.Axes""", "EXAMPLES": """Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np"""}


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("fastep.plotting needs matplotlib: pip install 'fastep[plot]'") from None
    return plt


def _axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return ax
    return _pyplot().subplots()[1]


def plot_decision_surface(model: Any, X: ArrayLike, y: ArrayLike | None = None, *, ax: Axes | None = None,
                          resolution: int = 120, levels: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 0.9),
                          margin: float = 0.05) -> Axes:
    """Predictive probability of a binary classifier over a 2-D input square.

    Draws the probability of ``classes_[1]`` as a filled image, its contours at ``levels`` (the
    0.5 contour is the decision boundary), the points ``X`` coloured by ``y``, and, when the model
    has them, the IVM's active points (``active_set_``, circled) or the sparse model's inducing
    inputs (``inducing_inputs_``, crosses) — the picture of the IVM paper's toy figure.

    Parameters
    ----------
    model : fitted binary classifier with ``predict_proba`` and two input features
    X : array-like (n, 2)
        Points to draw (the training inputs for the active set to be marked).
    y : array-like (n,), optional
        Their labels (colours); default: not coloured.
    ax : matplotlib.axes.Axes, optional
    resolution : int, default 120
        Grid points per axis.
    levels : sequence of float, default (0.1, 0.25, 0.5, 0.75, 0.9)
        Probability contours.
    margin : float, default 0.05
        Fraction of the data range added on every side.

    %RETURNS%

    %EXAMPLES%
    >>> from fastep import IVMClassifier
    >>> from fastep.datasets import make_ivm_toy_classification
    >>> from fastep.plotting import plot_decision_surface
    >>> X, y, _ = make_ivm_toy_classification(200, random_state=0)
    >>> model = IVMClassifier(active_set_size=30).fit(X, y)
    >>> ax = plot_decision_surface(model, X, y)
    >>> ax.get_xlabel(), len(ax.collections) > 2
    ('x[0]', True)
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[1] != 2:
        raise ValueError(f"X must have two columns to draw a surface, got shape {X.shape}")
    classes = getattr(model, "classes_", None)
    if classes is None or len(classes) != 2 or not hasattr(model, "predict_proba"):
        raise ValueError("plot_decision_surface needs a fitted binary classifier (predict_proba, two classes_)")
    ax = _axes(ax)
    low, high = X.min(axis=0), X.max(axis=0)
    pad = margin * np.where(high > low, high - low, 1.0)
    g0 = np.linspace(low[0] - pad[0], high[0] + pad[0], int(resolution))
    g1 = np.linspace(low[1] - pad[1], high[1] + pad[1], int(resolution))
    G0, G1 = np.meshgrid(g0, g1)
    proba = model.predict_proba(np.column_stack([G0.ravel(), G1.ravel()]))[:, 1].reshape(G0.shape)
    image = ax.pcolormesh(G0, G1, proba, cmap="RdBu_r", vmin=0.0, vmax=1.0, shading="auto", alpha=0.6)
    contours = ax.contour(G0, G1, proba, levels=sorted(levels), colors="k",
                          linewidths=[1.8 if abs(level - 0.5) < 1e-12 else 0.7 for level in sorted(levels)])
    ax.clabel(contours, fmt="%.2g", fontsize=7)
    if y is None:
        ax.scatter(X[:, 0], X[:, 1], s=10, c="0.3", label="points")
    else:
        y = np.asarray(y)
        for label, colour in zip(classes, ("tab:blue", "tab:red")):
            mask = y == label
            ax.scatter(X[mask, 0], X[mask, 1], s=10, c=colour, label=f"class {label}")
    active = getattr(model, "active_set_", None)
    if active is not None and np.ndim(active) == 1 and np.max(active, initial=-1) < X.shape[0]:
        ax.scatter(X[active, 0], X[active, 1], s=60, facecolors="none", edgecolors="k", linewidths=1.2,
                   label=f"active set (d = {len(active)})")
    inducing = getattr(model, "inducing_inputs_", None)
    if inducing is not None and np.ndim(inducing) == 2:
        ax.scatter(inducing[:, 0], inducing[:, 1], marker="x", s=50, c="k",
                   label=f"inducing inputs (m = {inducing.shape[0]})")
    ax.figure.colorbar(image, ax=ax, label=f"p(y = {classes[1]} | x)")
    ax.set_xlim(g0[0], g0[-1])
    ax.set_ylim(g1[0], g1[-1])
    ax.set_xlabel("x[0]")
    ax.set_ylabel("x[1]")
    ax.set_title(f"{type(model).__name__}: predictive probability")
    ax.legend(loc="upper right", fontsize=7)
    return ax


def plot_convergence(records: Sequence[ProgressRecord], *, ax: Axes | None = None) -> Axes:
    """EP's convergence trace: the largest relative site change (log scale) and the log evidence
    per sweep.

    Parameters
    ----------
    records : sequence of fastep.ProgressRecord
        What an estimator's ``callback`` received (for example ``callback=records.append``); the
        ``'EP sweep'`` records are drawn, each EP run (a new sweep 1) as its own line.
    ax : matplotlib.axes.Axes, optional

    %RETURNS%
        The site-change axes; the log evidence is on its twin (``ax.right_ax``).

    %EXAMPLES%
    >>> from fastep import GaussianProcessClassifier
    >>> from fastep.kernels import RBF
    >>> from fastep.plotting import plot_convergence
    >>> X = np.linspace(-2, 2, 50)[:, None]; y = (np.sin(3 * X[:, 0]) > 0).astype(int)
    >>> records = []
    >>> model = GaussianProcessClassifier(RBF(4.0, 2.0), optimizer=None, tol=1e-8,
    ...                                   callback=records.append).fit(X, y)
    >>> ax = plot_convergence(records)
    >>> ax.get_yscale(), len(ax.lines)
    ('log', 1)
    """
    sweeps = [r for r in records if r.stage == "EP sweep"]
    if not sweeps:
        raise ValueError("no 'EP sweep' records to draw (collect them with callback=records.append)")
    runs: list[list[ProgressRecord]] = []
    current: list[ProgressRecord] = []
    for record in sweeps:
        if record.iteration == 1 and current:
            runs.append(current)
            current = []
        current.append(record)
    runs.append(current)
    ax = _axes(ax)
    right = ax.twinx()
    for k, run in enumerate(runs):
        sweep = [r.iteration for r in run]
        change = [max(r.change, np.finfo(float).tiny) for r in run]
        evidence = [r.log_marginal_likelihood for r in run]
        ax.plot(sweep, change, "o-", color="tab:blue", alpha=0.3 + 0.7 * (k + 1) / len(runs), markersize=3)
        if not all(math.isnan(e) for e in evidence):
            right.plot(sweep, evidence, "s--", color="tab:orange", alpha=0.3 + 0.7 * (k + 1) / len(runs),
                       markersize=3)
    ax.set_yscale("log")
    ax.set_xlabel("EP sweep")
    ax.set_ylabel("largest relative site change", color="tab:blue")
    right.set_ylabel("log evidence", color="tab:orange")
    ax.set_title(f"{sweeps[0].estimator}: EP convergence ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    ax.right_ax = right  # type: ignore[attr-defined]  # the twin, for the caller
    return ax


def plot_horseshoe_coefficients(model: HorseshoeRegression | MultiTaskHorseshoeRegression, *, task: int = 0,
                                level: float = 0.95, ax: Axes | None = None, top: int | None = None) -> Axes:
    """Posterior means of a horseshoe regression's coefficients with credible intervals, and the
    posterior inclusion probabilities (on a twin axis).

    Parameters
    ----------
    model : fitted HorseshoeRegression or MultiTaskHorseshoeRegression
    task : int, default 0
        The task (multi-task model).
    level : float in (0, 1), default 0.95
        Coverage of the intervals ``mean ± z sd`` of the Gaussian EP posterior.
    ax : matplotlib.axes.Axes, optional
    top : int, optional
        Draw only the ``top`` coefficients of largest inclusion probability (in feature order).

    %RETURNS%
        The coefficient axes; the inclusion probabilities are on ``ax.right_ax``.

    %EXAMPLES%
    >>> from fastep import HorseshoeRegression
    >>> from fastep.plotting import plot_horseshoe_coefficients
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 20)); y = 2 * X[:, 0] - 2 * X[:, 1] + 0.3 * rng.normal(size=60)
    >>> ax = plot_horseshoe_coefficients(HorseshoeRegression().fit(X, y))
    >>> len(ax.containers), len(ax.right_ax.containers), [float(v) for v in ax.right_ax.get_ylim()]
    (1, 1, [0.0, 1.0])
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    coef = np.atleast_2d(model.coef_)
    sd = np.sqrt(np.atleast_2d(model.coef_var_))
    inclusion = np.atleast_2d(model.inclusion_)
    if not 0 <= task < coef.shape[0]:
        raise ValueError(f"task must be in [0, {coef.shape[0]}), got {task!r}")
    coef, sd, inclusion = coef[task], sd[task], inclusion[task]
    index = np.arange(coef.shape[0])
    if top is not None:
        index = np.sort(np.argsort(-inclusion, kind="stable")[:int(top)])
    z = float(ndtri(0.5 + level / 2.0))
    ax = _axes(ax)
    right = ax.twinx()
    positions = np.arange(index.shape[0])
    right.bar(positions, inclusion[index], width=0.8, color="tab:green", alpha=0.25, label="inclusion probability")
    right.set_ylim(0.0, 1.0)
    right.set_ylabel("posterior inclusion probability")
    ax.errorbar(positions, coef[index], yerr=z * sd[index], fmt="o", color="k", ecolor="0.4", capsize=2,
                markersize=3, label=f"mean ± {level:.0%} interval")
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_xticks(positions)
    ax.set_xticklabels([str(j) for j in index], fontsize=7 if index.shape[0] > 30 else 9)
    ax.set_xlabel("feature")
    ax.set_ylabel("coefficient")
    ax.set_zorder(right.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_title(f"{type(model).__name__}: coefficients" + (f" (task {task})" if coef.ndim and
                                                            np.atleast_2d(model.coef_).shape[0] > 1 else ""))
    ax.right_ax = right  # type: ignore[attr-defined]  # the twin, for the caller
    return ax


def plot_calibration(y_true: ArrayLike, proba: ArrayLike, *, positive: Any = None, n_bins: int = 10,
                     ax: Axes | None = None) -> Axes:
    """Reliability diagram: the observed frequency of the positive class against the predicted
    probability, in ``n_bins`` equal-width bins, with the diagonal of perfect calibration.

    Parameters
    ----------
    y_true : array-like (n,)
        True labels.
    proba : array-like (n,) or (n, 2)
        Predicted probabilities of the positive class (or ``predict_proba``'s two columns, the
        second being the positive class).
    positive : label, optional
        The positive class (default: the larger of the two labels, ``classes_[1]``'s rule).
    n_bins : int, default 10
    ax : matplotlib.axes.Axes, optional

    %RETURNS%

    %EXAMPLES%
    >>> from fastep.plotting import plot_calibration
    >>> rng = np.random.default_rng(0)
    >>> p = rng.uniform(size=2000); y = (rng.uniform(size=2000) < p).astype(int)
    >>> ax = plot_calibration(y, p)
    >>> [float(v) for v in ax.get_xlim() + ax.get_ylim()]
    [0.0, 1.0, 0.0, 1.0]
    """
    y_true = np.asarray(y_true)
    proba = np.asarray(proba, dtype=float)
    if proba.ndim == 2:
        if proba.shape[1] != 2:
            raise ValueError(f"proba must be (n,) or (n, 2), got shape {proba.shape}")
        proba = proba[:, 1]
    if proba.shape != y_true.shape:
        raise ValueError(f"y_true and proba must have the same length, got {y_true.shape} and {proba.shape}")
    if not np.all((proba >= 0.0) & (proba <= 1.0)):
        raise ValueError("proba must lie in [0, 1]")
    labels = np.unique(y_true)
    if labels.shape[0] > 2:
        raise ValueError(f"plot_calibration is for two classes, got {labels.shape[0]}")
    positive = labels[-1] if positive is None else positive
    hit = (y_true == positive).astype(float)
    n_bins = int(n_bins)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    which = np.minimum((proba * n_bins).astype(int), n_bins - 1)
    counts = np.bincount(which, minlength=n_bins)
    used = counts > 0
    mean_predicted = np.bincount(which, weights=proba, minlength=n_bins)[used] / counts[used]
    observed = np.bincount(which, weights=hit, minlength=n_bins)[used] / counts[used]
    ax = _axes(ax)
    ax.plot([0.0, 1.0], [0.0, 1.0], ":", color="0.5", label="perfectly calibrated")
    ax.plot(mean_predicted, observed, "o-", color="tab:blue", label="observed frequency")
    for x, yv, count in zip(mean_predicted, observed, counts[used]):
        ax.annotate(str(int(count)), (x, yv), textcoords="offset points", xytext=(0, 5), fontsize=6,
                    ha="center")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel(f"predicted probability of {positive!r}")
    ax.set_ylabel("observed frequency")
    ax.set_title("calibration")
    ax.legend(loc="upper left", fontsize=8)
    return ax


def plot_evidence_landscape(model: GaussianProcessClassifier | GaussianProcessRegressor | SparseGPClassifier
                            | SparseGPRegressor, params: Sequence[str] | None = None, *, span: float = 2.0,
                            resolution: int = 15, ax: Axes | None = None) -> Axes:
    """The log marginal likelihood over two kernel hyperparameters around the learnt point.

    Each grid point is an EP run from zero sites at that point (the other hyperparameters at their
    learnt values); the learnt point is marked.

    Parameters
    ----------
    model : fitted GaussianProcessClassifier / GaussianProcessRegressor / SparseGPClassifier /
        SparseGPRegressor with one binary problem
    params : (str, str), optional
        Two names of ``model.kernel_.hyperparameter_names`` (default: the first two).
    span : float, default 2.0
        Half-width of the grid in the unconstrained coordinates (``theta``).
    resolution : int, default 15
        Grid points per axis (``resolution²`` EP runs).
    ax : matplotlib.axes.Axes, optional

    %RETURNS%

    %EXAMPLES%
    >>> from fastep import GaussianProcessClassifier
    >>> from fastep.plotting import plot_evidence_landscape
    >>> X = np.linspace(-2, 2, 30)[:, None]; y = (X[:, 0] > 0.3).astype(int)
    >>> ax = plot_evidence_landscape(GaussianProcessClassifier().fit(X, y), resolution=5)
    >>> ax.get_xlabel(), ax.get_ylabel()
    ('variance', 'inverse_width')
    """
    kernel = getattr(model, "kernel_", None)
    if kernel is None or isinstance(kernel, list) or not hasattr(model, "log_marginal_likelihood"):
        raise ValueError("plot_evidence_landscape needs a fitted GP model with one kernel_ (binary or regression)")
    names = list(kernel.hyperparameter_names)
    if len(names) < 2:
        raise ValueError(f"the kernel has fewer than two hyperparameters: {names}")
    params = tuple(names[:2]) if params is None else tuple(params)
    unknown = [name for name in params if name not in names]
    if len(params) != 2 or unknown or params[0] == params[1]:
        raise ValueError(f"params must be two different names of {names}, got {params!r}")
    i, j = names.index(params[0]), names.index(params[1])
    learnt = _fitted_theta(model, kernel)
    t_i = learnt[i] + np.linspace(-span, span, int(resolution))
    t_j = learnt[j] + np.linspace(-span, span, int(resolution))
    surface = np.full((t_j.shape[0], t_i.shape[0]), np.nan)
    for b, tj in enumerate(t_j):
        for a, ti in enumerate(t_i):
            theta = learnt.copy()
            theta[i], theta[j] = ti, tj
            try:
                surface[b, a] = model.log_marginal_likelihood(theta)
            except (ValueError, np.linalg.LinAlgError, FloatingPointError):
                pass
    value_i = np.array([_param_value(kernel, learnt[:kernel.n_theta], i, t) for t in t_i])
    value_j = np.array([_param_value(kernel, learnt[:kernel.n_theta], j, t) for t in t_j])
    ax = _axes(ax)
    finite = surface[np.isfinite(surface)]
    if finite.size == 0:
        raise ValueError("EP failed at every grid point; narrow span")
    low = max(float(finite.min()), float(finite.max()) - 50.0)
    shown = np.where(np.isfinite(surface), np.maximum(surface, low), low)
    filled = ax.contourf(value_i, value_j, shown, levels=20, cmap="viridis")
    ax.figure.colorbar(filled, ax=ax, label="log marginal likelihood")
    ax.plot([_param_value(kernel, learnt[:kernel.n_theta], i, learnt[i])],
            [_param_value(kernel, learnt[:kernel.n_theta], j, learnt[j])], "r*", markersize=12, label="learnt")
    for axis, values in (("x", value_i), ("y", value_j)):
        if np.all(values > 0) and values.max() / values.min() > 20:
            getattr(ax, f"set_{axis}scale")("log")
    ax.set_xlabel(params[0].split("__")[-1] if sum(n.endswith(params[0].split("__")[-1]) for n in names) == 1
                  else params[0])
    ax.set_ylabel(params[1].split("__")[-1] if sum(n.endswith(params[1].split("__")[-1]) for n in names) == 1
                  else params[1])
    ax.set_title(f"{type(model).__name__}: evidence landscape")
    ax.legend(loc="upper right", fontsize=8)
    return ax


def _fitted_theta(model, kernel):
    """The full learnt θ (kernel, then likelihood / noise, then inducing inputs) of a GP model."""
    problem = model._problems[0]
    hyper = problem.hyperparameters
    parts = [kernel.theta]
    if hyper.learn_likelihood:
        parts.append(problem.likelihood.theta)
    if hyper.extra is not None:
        parts.append(np.asarray(model.inducing_inputs_, dtype=float).ravel())
    return np.concatenate(parts)


def _param_value(kernel, theta, index, value):
    """The constrained value of kernel hyperparameter ``index`` when its θ coordinate is ``value``."""
    theta = np.array(theta, dtype=float)
    theta[index] = value
    name = kernel.hyperparameter_names[index]
    params = kernel.clone_with_theta(theta).get_params()
    base, _, entry = name.partition("[")
    found = params[base]
    return float(np.asarray(found)[int(entry[:-1])]) if entry else float(found)


for _draw in (plot_decision_surface, plot_convergence, plot_horseshoe_coefficients, plot_calibration,
              plot_evidence_landscape):
    _draw.__doc__ = fill_doc(_draw.__doc__, **_SECTIONS)  # type: ignore[arg-type]  # it has a docstring
del _draw
