"""``fastep fit / predict / evaluate / info`` run as a user runs them: through subprocess, on files;
``fastep info`` without a file reports the installation."""
import csv
import io
import os
import subprocess
import sys

import numpy as np
import pytest

import fastep
from fastep._search.start import median_inverse_width, target_scale
from fastep.cli import parse_kernel
from fastep.kernels import RBF, RBFARD, Bias, White


def run(*args, cwd):
    env = dict(os.environ, PYTHONWARNINGS="default")
    return subprocess.run([sys.executable, "-m", "fastep", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 3)) * [1.0, 50.0, 0.01]
    score = X[:, 0] + X[:, 1] / 50.0 + 0.3 * rng.normal(size=240)
    label = np.where(score > 0, "yes", "no")
    target = X[:, 0] - X[:, 1] / 50.0 + 0.1 * rng.normal(size=240)
    header = ["age", "income", "ratio", "label", "value"]
    rows = [[*map(repr, x), lab, repr(t)] for x, lab, t in zip(X.tolist(), label, target.tolist())]
    _write_csv(root / "train.csv", header, rows[:180])
    _write_csv(root / "test.csv", header, rows[180:])
    _write_csv(root / "new.csv", ["ratio", "income", "age"], [[r[2], r[1], r[0]] for r in rows[180:]])
    np.savez(root / "train.npz", X=X[:180], y=target[:180])
    return root, X, label, target


def _read_csv(text):
    rows = list(csv.reader(io.StringIO(text)))
    return rows[0], rows[1:]


def test_fit_predict_evaluate_info_round_trip(files):
    root, X, label, _ = files
    fit = run("fit", "train.csv", "--target", "label", "--features", "age,income,ratio", "--model", "gpc",
              "-o", "gpc.npz", cwd=root)
    assert fit.returncode == 0, fit.stderr
    assert (root / "gpc.npz").exists() and "saved to gpc.npz" in fit.stderr
    # not a terminal: plain progress lines on stderr, nothing on stdout
    assert fit.stdout == "" and "GaussianProcessClassifier: type-II ML 1" in fit.stderr
    assert "GaussianProcessClassifier: done" in fit.stderr

    model = fastep.load(root / "gpc.npz")
    expected = model.predict_proba(X[180:])

    pred = run("predict", "gpc.npz", "new.csv", cwd=root)     # columns in another order: read by name
    assert pred.returncode == 0, pred.stderr
    header, rows = _read_csv(pred.stdout)
    assert header == ["label", "proba_no", "proba_yes", "latent_mean", "latent_var"]
    assert len(rows) == 60
    proba = np.array([[float(r[1]), float(r[2])] for r in rows])
    # written with full precision (a rounded format would miss by 1e-7 or more; the CLI's own
    # process may round the last bits differently where its BLAS picks other kernels)
    np.testing.assert_allclose(proba, expected, rtol=1e-9, atol=0)
    assert [r[0] for r in rows] == model.predict(X[180:]).tolist()

    out = run("predict", "gpc.npz", "test.csv", "-o", "pred.csv", cwd=root)
    assert out.returncode == 0 and out.stdout == ""
    assert _read_csv((root / "pred.csv").read_text())[1] == rows

    ev = run("evaluate", "gpc.npz", "test.csv", cwd=root)
    assert ev.returncode == 0, ev.stderr
    values = dict(line.rsplit(" ", 1) for line in ev.stdout.strip().splitlines())
    accuracy = np.mean(model.predict(X[180:]) == label[180:])
    assert float(values["accuracy"]) == pytest.approx(accuracy, abs=1e-6) and accuracy > 0.75
    p_true = expected[np.arange(60), (label[180:] == "yes").astype(int)]
    assert float(values["log loss"]) == pytest.approx(-np.mean(np.log(p_true)), abs=1e-6)

    info = run("info", "gpc.npz", cwd=root)
    assert info.returncode == 0, info.stderr
    assert "GaussianProcessClassifier" in info.stdout and repr(model.kernel_) in info.stdout
    assert "features   age, income, ratio" in info.stdout and "target     label" in info.stdout
    assert f"log evidence {model.log_marginal_likelihood_value_}" in info.stdout
    assert "trained    on 180 rows of train.csv" in info.stdout


@pytest.mark.parametrize("model, extra", [
    ("sparse-gpc", ["--inducing", "15", "--kernel", "rbf+bias"]),
    ("ivm", ["--active-set-size", "40"]),
    ("linear", []),
])
def test_other_classifiers(files, model, extra):
    root, X, label, _ = files
    out = f"{model}.npz"
    fit = run("fit", "train.csv", "--target", "label", "--features", "age,income,ratio", "--model", model,
              *extra, "-o", out, "--quiet", cwd=root)
    assert fit.returncode == 0, fit.stderr
    assert "type-II ML" not in fit.stderr and "saved to" not in fit.stderr      # --quiet
    ev = run("evaluate", out, "test.csv", cwd=root)
    assert ev.returncode == 0, ev.stderr
    assert float(dict(line.rsplit(" ", 1) for line in ev.stdout.strip().splitlines())["accuracy"]) > 0.7
    loaded = fastep.load(root / out)
    if model == "sparse-gpc":
        assert loaded.inducing_inputs_.shape == (15, 3) and "Bias" in repr(loaded.kernel_)
    if model == "ivm":
        assert loaded.active_set_.shape == (40,)


@pytest.mark.parametrize("model", ["gpr", "linear-regression"] + [pytest.param(m, marks=pytest.mark.slow)
                                                   for m in ("sparse-gpr", "horseshoe", "ivm-regression")])
def test_regressors_from_csv_and_npz(files, model):
    root, X, _, target = files
    fit = run("fit", "train.csv", "--target", "value", "--features", "age,income,ratio", "--model", model,
              "-o", f"{model}.npz", "--quiet", cwd=root)
    assert fit.returncode == 0, fit.stderr
    ev = run("evaluate", f"{model}.npz", "test.csv", cwd=root)
    assert ev.returncode == 0, ev.stderr
    values = dict(line.rsplit(" ", 1) for line in ev.stdout.strip().splitlines())
    loaded = fastep.load(root / f"{model}.npz")
    mean, std = loaded.predict(X[180:], return_std=True)
    assert float(values["RMSE"]) == pytest.approx(np.sqrt(np.mean((target[180:] - mean) ** 2)), rel=1e-5)
    assert float(values["RMSE"]) < 0.5 * np.std(target)
    pred = run("predict", f"{model}.npz", "test.csv", cwd=root)
    header, rows = _read_csv(pred.stdout)
    assert header[:2] == ["mean", "std"] and len(rows) == 60
    np.testing.assert_allclose([float(r[0]) for r in rows], mean, rtol=1e-9, atol=1e-12)
    if model == "gpr":
        npz = run("fit", "train.npz", "--model", "gpr", "-o", "npz.npz", "--quiet", cwd=root)
        assert npz.returncode == 0, npz.stderr
        meta = fastep.persistence.read_metadata(root / "npz.npz")["metadata"]
        assert meta["features"] == ["x0", "x1", "x2"] and meta["target"] == "y"


@pytest.mark.parametrize("rows, args, message", [
    ([["1", "2", "a"], ["3", "x", "b"]], ["--target", "label"], "line 3, column 'f2': 'x' is not a number"),
    ([["1", "2", "a"], ["3", "", "b"]], ["--target", "label"], "line 3, column 'f2': missing value"),
    ([["1", "nan", "a"], ["3", "4", "b"]], ["--target", "label"], "line 2, column 'f2': 'nan' is not a finite"),
    ([["1", "2", "a"], ["3", "4", "a"]], ["--target", "label"], "single class"),
    ([["1", "2", "a"], ["3", "4", "b"]], ["--target", "species"], "no column 'species'"),
    ([["1", "2", "a"], ["3", "4", "b"]], [], "--target is required"),
    ([["1", "2", "a"], ["3", "4"]], ["--target", "label"], "line 3: 2 cells, but the header has 3"),
    ([["1", "2", "a"], ["3", "4", "b"]], ["--target", "label", "--features", "f1,f9"], "no column 'f9'"),
    ([["1", "2", "a"], ["3", "4", "b"]], ["--target", "label", "--kernel", "rbf+spline"], "unknown term 'spline'"),
    ([["1", "2", "a"], ["3", "4", "b"]], ["--target", "label", "--active-set-size", "3"], "applies to --model ivm"),
])
def test_bad_files_and_arguments_give_one_clear_line(tmp_path, rows, args, message):
    _write_csv(tmp_path / "d.csv", ["f1", "f2", "label"], rows)
    res = run("fit", "d.csv", *args, "-o", "m.npz", cwd=tmp_path)
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "m.npz").exists()


def test_missing_files_and_tampered_models(files, tmp_path):
    root = files[0]
    res = run("fit", "absent.csv", "--target", "label", "-o", "m.npz", cwd=root)
    assert res.returncode == 2 and "absent.csv: no such file" in res.stderr
    res = run("info", "absent.npz", cwd=root)
    assert res.returncode == 2 and "no such model file" in res.stderr
    data = (root / "gpc.npz").read_bytes() if (root / "gpc.npz").exists() else None
    if data is None:
        assert run("fit", "train.csv", "--target", "label", "--features", "age,income,ratio", "-o", "gpc.npz",
                   "--quiet", cwd=root).returncode == 0
        data = (root / "gpc.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    res = run("predict", "cut.npz", str(root / "test.csv"), cwd=tmp_path)
    assert res.returncode == 2 and "not a readable fastep model file" in res.stderr
    res = run("evaluate", str(root / "gpc.npz"), str(root / "new.csv"), cwd=tmp_path)
    assert res.returncode == 2 and "no column 'label'" in res.stderr


def test_fit_warnings_are_reported_as_lines(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 255, size=(60, 8))
    y = np.where(X[:, 0] > 128, 1, 0)
    _write_csv(tmp_path / "d.csv", [f"p{j}" for j in range(8)] + ["y"],
               [[*map(repr, x), str(t)] for x, t in zip(X.tolist(), y)])
    res = run("fit", "d.csv", "--target", "y", "--kernel", "rbf(variance=1,inverse_width=1)", "-o", "m.npz",
              "--quiet", cwd=tmp_path)
    assert res.returncode == 0
    assert "fastep fit: warning: ConvergenceWarning: GaussianProcessClassifier" in res.stderr
    assert ".py:" not in res.stderr


def test_parse_kernel_starts_from_the_data():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(50, 2)) * [1.0, 100.0]
    y = 3.0 + 2.0 * rng.normal(size=50)
    gamma = median_inverse_width(X)
    kernel = parse_kernel("rbf + bias + white", X, y, regression=True)
    variance, offset = target_scale(y)
    assert repr(kernel) == repr(RBF(variance, gamma) + Bias(offset) + White(0.1 * variance))
    ard = parse_kernel("rbf-ard", X)
    assert isinstance(ard, RBFARD)
    scales = ard.get_params()["scales"]
    assert scales[0] / scales[1] == pytest.approx(100.0, rel=0.5)
    assert repr(parse_kernel("RBF(variance=2, inverse_width=0.5)", X)) == repr(RBF(2.0, 0.5))


def test_info_without_a_model_reports_the_installation(tmp_path):
    import numpy
    import scipy
    import threadpoolctl

    res = run("info", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"fastep: {fastep.__version__}" in out
    assert f"numpy: {numpy.__version__}" in out and f"scipy: {scipy.__version__}" in out
    assert f"threadpoolctl: {threadpoolctl.__version__}" in out
    assert f"executable: {sys.executable}" in out
    assert "internal_api: " in out and "num_threads: " in out and "filepath: " in out
    blas = [lib for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    assert blas and any(f"internal_api: {lib['internal_api']}" in out for lib in blas)
    assert "Optional extras:" in out
    for name, extra in (("dask", "dask"), ("distributed", "dask"), ("matplotlib", "plot"), ("tqdm", "progress"),
                        ("sphinx", "docs"), ("numpydoc", "docs"), ("pandas", "test"), ("scikit-learn", "test")):
        line = next((line for line in out.splitlines() if line.strip().startswith(f"{name}: ")), None)
        assert line is not None, f"{name} missing from:\n{out}"
        assert line.rstrip().endswith(f"fastep[{extra}]")
    assert "usage" not in out
    # the same report from Python
    same = subprocess.run([sys.executable, "-c", "import fastep; fastep.show_versions()"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[:12] == out.splitlines()[:12]     # fastep, system and dependencies


def test_info_help_names_both_uses(tmp_path):
    res = run("info", "--help", cwd=tmp_path)
    assert res.returncode == 0
    assert "[model]" in res.stdout and "Without: the versions of fastep" in " ".join(res.stdout.split())
    top = run("--help", cwd=tmp_path)
    assert "describe a saved model, or (without MODEL) this installation" in " ".join(top.stdout.split())
