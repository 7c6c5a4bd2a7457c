"""fastep.plotting renders with matplotlib's Agg backend; the tests check what was drawn."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PathCollection, QuadMesh  # noqa: E402

import fastep  # noqa: E402
from fastep import plotting  # noqa: E402
from fastep.datasets import make_ivm_toy_classification  # noqa: E402
from fastep.kernels import RBF  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def toy():
    X, y, _ = make_ivm_toy_classification(240, random_state=0)
    return X, y


def _scatter_offsets(ax):
    return [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)]


def test_decision_surface_of_an_ivm_marks_its_active_set(toy):
    X, y = toy
    model = fastep.IVMClassifier(RBF(100.0, 10.0), active_set_size=25, optimizer=None).fit(X, y)
    ax = plotting.plot_decision_surface(model, X, y, resolution=40)
    mesh = [c for c in ax.collections if isinstance(c, QuadMesh)]
    assert len(mesh) == 1
    grid = mesh[0].get_array().reshape(40, 40)
    g0 = np.linspace(*ax.get_xlim(), 40)
    g1 = np.linspace(*ax.get_ylim(), 40)
    G0, G1 = np.meshgrid(g0, g1)
    expected = model.predict_proba(np.column_stack([G0.ravel(), G1.ravel()]))[:, 1].reshape(40, 40)
    np.testing.assert_allclose(grid, expected, rtol=1e-12)
    offsets = _scatter_offsets(ax)
    # the two classes, then the active set circled
    assert sum(len(o) for o in offsets[:2]) == X.shape[0]
    np.testing.assert_array_equal(offsets[2], X[model.active_set_])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["class -1.0", "class 1.0", "active set (d = 25)"]
    contour = [c for c in ax.collections if hasattr(c, "levels")]
    assert len(contour) == 1 and 0.5 in list(contour[0].levels)
    low, high = X.min(axis=0), X.max(axis=0)
    assert ax.get_xlim()[0] < low[0] and ax.get_xlim()[1] > high[0]
    assert ax.get_xlabel() == "x[0]" and ax.get_ylabel() == "x[1]" and "IVMClassifier" in ax.get_title()


def test_decision_surface_of_a_sparse_model_marks_its_inducing_inputs(toy):
    X, y = toy
    model = fastep.SparseGPClassifier(n_inducing=12, optimizer=None, random_state=0).fit(X, y)
    ax = plotting.plot_decision_surface(model, X, y, resolution=20)
    offsets = _scatter_offsets(ax)
    np.testing.assert_array_equal(offsets[-1], model.inducing_inputs_)
    assert ax.get_legend().get_texts()[-1].get_text() == "inducing inputs (m = 12)"


def test_decision_surface_refuses_what_it_cannot_draw(toy):
    X, y = toy
    model = fastep.IVMClassifier(active_set_size=20, optimizer=None).fit(X, y)
    with pytest.raises(ValueError, match="two columns"):
        plotting.plot_decision_surface(model, np.c_[X, X[:, :1]], y)
    three = np.digitize(X[:, 0], [0.33, 0.66])
    multi = fastep.IVMClassifier(active_set_size=20, optimizer=None).fit(X, three)
    with pytest.raises(ValueError, match="binary classifier"):
        plotting.plot_decision_surface(multi, X, three)


def test_convergence_trace_draws_every_sweep_of_every_run(toy):
    X, y = toy
    records = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        fastep.GaussianProcessClassifier(RBF(1.0, 3.0), callback=records.append).fit(X[:120], y[:120])
    sweeps = [r for r in records if r.stage == "EP sweep"]
    n_runs = sum(r.iteration == 1 for r in sweeps)
    ax = plotting.plot_convergence(records)
    assert len(ax.lines) == n_runs and len(ax.right_ax.lines) == n_runs
    drawn = np.concatenate([line.get_ydata() for line in ax.lines])
    np.testing.assert_allclose(drawn, [max(r.change, np.finfo(float).tiny) for r in sweeps])
    evidence = np.concatenate([line.get_ydata() for line in ax.right_ax.lines])
    np.testing.assert_allclose(evidence, [r.log_marginal_likelihood for r in sweeps])
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "EP sweep"
    assert ax.right_ax.get_ylabel() == "log evidence"
    with pytest.raises(ValueError, match="no 'EP sweep' records"):
        plotting.plot_convergence([r for r in records if r.stage != "EP sweep"])


def test_horseshoe_coefficients_and_intervals():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 15))
    y = 2.0 * X[:, 0] - 1.5 * X[:, 3] + 0.3 * rng.normal(size=60)
    model = fastep.HorseshoeRegression().fit(X, y)
    ax = plotting.plot_horseshoe_coefficients(model, level=0.9)
    container = ax.containers[0]
    points = container.lines[0]
    np.testing.assert_allclose(points.get_ydata(), model.coef_)
    segments = container.lines[2][0].get_segments()
    half_width = np.array([(s[1, 1] - s[0, 1]) / 2 for s in segments])
    np.testing.assert_allclose(half_width, 1.6448536269514722 * np.sqrt(model.coef_var_), rtol=1e-9)
    bars = ax.right_ax.containers[0]
    np.testing.assert_allclose([b.get_height() for b in bars], model.inclusion_)
    assert np.argmax([b.get_height() for b in bars]) in (0, 3)
    top = plotting.plot_horseshoe_coefficients(model, top=3)
    assert [t.get_text() for t in top.get_xticklabels()] == [str(j) for j in
                                                            np.sort(np.argsort(-model.inclusion_)[:3])]
    with pytest.raises(ValueError, match="level"):
        plotting.plot_horseshoe_coefficients(model, level=1.5)


def test_calibration_bins_match_a_direct_count():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=3000)
    y = np.where(rng.uniform(size=3000) < p ** 2, "b", "a")         # overconfident predictions
    ax = plotting.plot_calibration(y, np.c_[1 - p, p], n_bins=5)
    line = ax.lines[1]
    bins = np.minimum((p * 5).astype(int), 4)
    expected_x = [p[bins == k].mean() for k in range(5)]
    expected_y = [np.mean(y[bins == k] == "b") for k in range(5)]
    np.testing.assert_allclose(line.get_xdata(), expected_x)
    np.testing.assert_allclose(line.get_ydata(), expected_y)
    assert np.all(line.get_ydata() <= line.get_xdata() + 0.03)        # below the diagonal
    assert [t.get_text() for t in ax.texts] == [str(np.sum(bins == k)) for k in range(5)]
    with pytest.raises(ValueError, match="same length"):
        plotting.plot_calibration(y[:10], p)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        plotting.plot_calibration(y, p + 1.0)


def test_evidence_landscape_peaks_at_the_learnt_point():
    rng = np.random.default_rng(2)
    X = rng.uniform(-3, 3, size=(60, 1))
    y = np.where(np.sin(X[:, 0]) + 0.3 * rng.normal(size=60) > 0, 1, 0)
    model = fastep.GaussianProcessClassifier(tol=1e-8).fit(X, y)
    ax = plotting.plot_evidence_landscape(model, resolution=7, span=1.5)
    star = ax.lines[0]
    params = model.kernel_.get_params()
    assert star.get_xdata()[0] == pytest.approx(params["variance"])
    assert star.get_ydata()[0] == pytest.approx(params["inverse_width"])
    filled = [c for c in ax.collections if hasattr(c, "levels")]
    assert filled and filled[0].levels.max() >= model.log_marginal_likelihood_value_ - 1e-6
    assert filled[0].levels.max() <= model.log_marginal_likelihood_value_ + 0.5
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("variance", "inverse_width")
    with pytest.raises(ValueError, match="two different names"):
        plotting.plot_evidence_landscape(model, params=("variance", "variance"))


def test_missing_matplotlib_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.pyplot'] = None\n"
            "import numpy as np, fastep\nfrom fastep import plotting\n"
            "try:\n    plotting.plot_calibration(np.array([0, 1]), np.array([0.2, 0.8]))\n"
            "except ImportError as e:\n    print('IMPORT-ERROR', e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "IMPORT-ERROR" in res.stdout and "fastep[plot]" in res.stdout, res.stderr


def test_demo_writes_the_toy_figure(tmp_path):
    out = tmp_path / "toy.png"
    res = subprocess.run([sys.executable, "-m", "fastep", "demo", "--n-train", "120", "--n-test", "40",
                          "--plot", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"figure written to {out}" in res.stdout
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 300 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05                          # not a blank canvas
