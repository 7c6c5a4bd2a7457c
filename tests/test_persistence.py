"""fastep.save / fastep.load: every estimator round-trips bitwise, bad files are refused, nothing
named in a file is imported; pickle round-trips the same way."""
import builtins
import hashlib
import io
import json
import pickle
import warnings
import zipfile

import numpy as np
import pytest

import fastep
from fastep import persistence
from fastep.kernels import RBF, Bias, White
from support import ESTIMATORS as REGISTRY

METHODS = ("predict", "predict_proba", "predict_latent", "decision_function")


def _data(seed=0, n=60):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y_binary = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, "yes", "no")
    y_real = X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.normal(size=n)
    y_three = np.digitize(X[:, 0], [-0.5, 0.5])
    return X, y_binary, y_real, y_three


def _fitted_models():
    X, yb, yr, y3 = _data()
    rng = np.random.default_rng(1)
    Xk = rng.normal(size=(80, 2, 3))
    Yk = Xk @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=(80, 2))
    labels = np.array([(10, 20, 30.5)[i] for i in y3], dtype=object)     # an object array of numbers
    return {
        "LinearEPClassifier": (fastep.LinearEPClassifier(), X, yb),
        "LinearEPRegressor": (fastep.LinearEPRegressor(), X, yr),
        "GaussianProcessClassifier": (fastep.GaussianProcessClassifier(), X, yb),
        "GaussianProcessClassifier 3 classes": (fastep.GaussianProcessClassifier(), X, y3),
        "GaussianProcessRegressor": (fastep.GaussianProcessRegressor(RBF(1.0, 0.5) + White(0.1)), X, yr),
        "SparseGPClassifier": (fastep.SparseGPClassifier(n_inducing=10, random_state=0), X, yb),
        "SparseGPRegressor": (fastep.SparseGPRegressor(n_inducing=10, random_state=0), X, yr),
        "IVMClassifier": (fastep.IVMClassifier(active_set_size=20), X, yb),
        "IVMClassifier object labels": (fastep.IVMClassifier(active_set_size=20, n_iterations=1), X, labels),
        "IVMRegressor": (fastep.IVMRegressor(active_set_size=20), X, yr),
        "IVMOrdinalRegressor": (fastep.IVMOrdinalRegressor(active_set_size=20, n_iterations=1), X, y3),
        "HorseshoeRegression": (fastep.HorseshoeRegression(max_optimizer_iter=5), X, yr),
        "MultiTaskHorseshoeRegression": (fastep.MultiTaskHorseshoeRegression(max_optimizer_iter=3),
                                         [X[:30], X[30:]], [yr[:30], yr[30:]]),
        "RankKEP": (fastep.LinearEPRankK(noise_cov=0.01 * np.eye(2)), Xk, Yk),     # the file has its former name
    }


MODELS = _fitted_models()


def test_every_registered_estimator_is_round_tripped():
    # MODELS' names are those of the files in legacy_models/: each registered estimator, plus
    # variants (three classes, object labels)
    assert {type(model).__name__ for model, _, _ in MODELS.values()} == set(REGISTRY)


@pytest.fixture(scope="module")
def fitted():
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        for name, (model, X, y) in MODELS.items():
            out[name] = (model.fit(X, y), X, y)
    return out


def _outputs(model, X, y):
    """Every prediction the model offers on X (one task's inputs for the multi-task model)."""
    if isinstance(model, fastep.MultiTaskHorseshoeRegression):
        return {"predict": [model.predict(X[t], task=t, return_std=True) for t in range(len(X))]}
    if isinstance(model, fastep.LinearEPRankK):         # no predict: its posterior is the output
        return {name: getattr(model, name) for name in ("posterior_mean_", "posterior_cov_", "log_marginal_likelihood_value_")}
    out = {}
    for method in METHODS:
        if hasattr(model, method):
            out[method] = getattr(model, method)(X)
    if hasattr(model, "score"):
        out["score"] = model.score(X, y)
    return out


def _assert_bitwise_equal(a, b):
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            _assert_bitwise_equal(u, v)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.kind == "f":
        assert a.tobytes() == b.tobytes()
    else:
        assert np.array_equal(a, b)


def _saved_bytes(model):
    buffer = io.BytesIO()
    fastep.save(model, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("name", list(MODELS))
def test_save_load_predicts_bitwise_identically(fitted, name, tmp_path):
    model, X, y = fitted[name]
    path = tmp_path / "model.npz"
    fastep.save(model, path)
    loaded = fastep.load(path)
    assert type(loaded) is type(model) and loaded is not model
    assert repr(loaded) == repr(model)
    expected, got = _outputs(model, X, y), _outputs(loaded, X, y)
    assert expected.keys() == got.keys() and expected
    for method in expected:
        _assert_bitwise_equal(expected[method], got[method])
    # the file is a plain npz: every member loads without pickle
    with np.load(path, allow_pickle=False) as archive:
        assert all(archive[member].dtype != object for member in archive.files)
    # saving the loaded model gives the same file content
    assert _saved_bytes(loaded) == _saved_bytes(model)


@pytest.mark.parametrize("name", list(MODELS))
def test_pickle_round_trip_predicts_bitwise_identically(fitted, name):
    model, X, y = fitted[name]
    loaded = pickle.loads(pickle.dumps(model))
    expected, got = _outputs(model, X, y), _outputs(loaded, X, y)
    for method in expected:
        _assert_bitwise_equal(expected[method], got[method])


def test_ivm_refinement_reports_load_from_files_that_hold_them_as_dicts():
    """The refinement reports are typed results; files written before that hold plain dicts,
    which load as typed results, and the model predicts bitwise as before."""
    X, y, _, _ = _data()
    model = fastep.IVMClassifier(RBF(1.0, 0.5), optimizer=None, active_set_size=15, refine_sweeps=20,
                                 exchange="greedy").fit(X, y)
    typed = model.refinement_
    assert typed["ep"].n_sweeps > 0 and typed["exchange"].n_moves == len(typed["exchange"].moves)
    loaded = fastep.load(io.BytesIO(_saved_bytes(model)))
    assert loaded.refinement_ == typed and loaded._problems[0].refinement == typed
    # the layout of the older files: each stage a dict of its fields then (moves a list), the EP
    # sweeps without the common fields of SweepResult
    problem = model._problems[0]
    old_fields = ("n_sweeps", "converged", "max_change", "n_updates", "n_skipped", "n_rejected")
    as_dicts = {stage: (dict(result.as_dict(), moves=list(result.moves)) if stage == "exchange"
                        else {name: getattr(result, name) for name in old_fields})
                for stage, result in typed.items()}
    model.refinement_, problem.refinement = as_dicts, dict(as_dicts)
    try:
        old_file = _saved_bytes(model)
    finally:
        model.refinement_ = problem.refinement = typed
    assert b"ivm_refine" not in old_file
    old = fastep.load(io.BytesIO(old_file))
    then = {stage: result if stage == "exchange" else result.replace(log_z=np.nan)   # not in those files
            for stage, result in typed.items()}
    assert old.refinement_ == then and old._problems[0].refinement == then
    # files written with the common fields load too
    model.refinement_ = problem.refinement = {stage: dict(result.as_dict(), **({"moves": list(result.moves)}
                                                                               if stage == "exchange" else {}))
                                              for stage, result in typed.items()}
    try:
        new_file = _saved_bytes(model)
    finally:
        model.refinement_ = problem.refinement = typed
    assert fastep.load(io.BytesIO(new_file)).refinement_ == typed
    assert type(old.refinement_["exchange"]).__name__ == "ExchangeResult"
    expected, got = _outputs(model, X, y), _outputs(old, X, y)
    for method in expected:
        _assert_bitwise_equal(expected[method], got[method])


def test_unfitted_estimator_round_trips_its_parameters():
    model = fastep.GaussianProcessClassifier(RBF(2.0, 0.5) + Bias(0.1), fastep.Probit(slope=3.0), tol=1e-5)
    buffer = io.BytesIO(_saved_bytes(model))
    loaded = fastep.load(buffer)
    assert repr(loaded) == repr(model)
    assert loaded.get_params()["kernel"].theta.tolist() == model.kernel.theta.tolist()
    with pytest.raises(fastep.NotFittedError):
        loaded.predict(np.zeros((2, 3)))


def test_loaded_model_refits_and_keeps_working(fitted):
    model, X, y = fitted["IVMClassifier"]
    loaded = fastep.load(io.BytesIO(_saved_bytes(model)))
    loaded.fit(X[:40], y[:40])
    assert loaded.predict(X).shape == (X.shape[0],)


def test_metadata_describes_the_model(fitted, tmp_path):
    model, X, y = fitted["GaussianProcessClassifier"]
    path = tmp_path / "m.npz"
    fastep.save(model, path)
    meta = persistence.read_metadata(path)
    assert meta["estimator"] == "GaussianProcessClassifier"
    assert meta["format_version"] == persistence.FORMAT_VERSION and meta["fastep_version"] == fastep.__version__
    assert meta["summary"]["kernel_"] == repr(model.kernel_)
    assert meta["summary"]["log_marginal_likelihood_value_"] == model.log_marginal_likelihood_value_
    assert meta["summary"]["classes_"] == ["no", "yes"]
    assert set(meta["params"]) == set(model.get_params(deep=False))


# -- bad files --------------------------------------------------------------------------------

def _members(data):
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _write(members):
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    buffer.seek(0)
    return buffer


def _document(members):
    return json.loads(members[persistence._METADATA].tobytes().decode("utf-8"))


def _with_document(members, document, fix_checksum):
    document = dict(document)
    if fix_checksum:
        document.pop("checksum", None)
        arrays = {k: v for k, v in members.items() if k != persistence._METADATA}
        document["checksum"] = persistence._checksum(document, arrays)
    out = dict(members)
    out[persistence._METADATA] = np.frombuffer(json.dumps(document).encode("utf-8"), dtype=np.uint8)
    return out


@pytest.fixture(scope="module")
def saved(fitted):
    return _saved_bytes(fitted["SparseGPClassifier"][0])


def test_truncated_file_is_refused(saved):
    for cut in (10, len(saved) // 2, len(saved) - 5):
        with pytest.raises(ValueError, match="not a readable fastep model file"):
            fastep.load(io.BytesIO(saved[:cut]))


def test_a_modified_array_or_description_fails_the_checksum(saved):
    members = _members(saved)
    name = next(k for k, v in members.items() if k != persistence._METADATA and v.dtype == np.float64 and v.size)
    changed = dict(members)
    changed[name] = members[name].copy()
    changed[name].flat[0] += 1e-12
    with pytest.raises(ValueError, match="fails its checksum"):
        fastep.load(_write(changed))
    document = _document(members)
    document["params"]["tol"] = 0.5
    with pytest.raises(ValueError, match="fails its checksum"):
        fastep.load(_write(_with_document(members, document, fix_checksum=False)))


def test_unknown_format_version_and_foreign_files_are_refused(saved, tmp_path):
    members = _members(saved)
    document = _document(members)
    document["format_version"] = persistence.FORMAT_VERSION + 1
    with pytest.raises(ValueError, match="format version"):
        fastep.load(_write(_with_document(members, document, fix_checksum=True)))
    with pytest.raises(ValueError, match="not a fastep model file"):
        fastep.load(_write({"x": np.arange(3.0)}))
    plain = tmp_path / "plain.txt"
    plain.write_text("label,x\n1,2\n")
    with pytest.raises(ValueError, match="not a readable fastep model file"):
        fastep.load(plain)
    with pytest.raises(FileNotFoundError):
        fastep.load(tmp_path / "missing.npz")


def test_a_pickled_member_is_refused(saved):
    """An npz member holding a pickled object array (np.save's default allows it) never unpickles."""
    buffer = io.BytesIO(saved)
    with zipfile.ZipFile(buffer, "a") as archive:
        payload = io.BytesIO()
        np.save(payload, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        archive.writestr("evil.npy", payload.getvalue())
    buffer.seek(0)
    with pytest.raises(ValueError, match="not a readable fastep model file"):
        fastep.load(buffer)


@pytest.mark.parametrize("foreign", ["os.system", "builtins.eval", "subprocess.Popen",
                                     "fastep_evil.Model", "numpy.lib.npyio.NpzFile"])
def test_a_class_outside_fastep_is_refused_and_nothing_is_imported(saved, foreign, monkeypatch):
    """A consistent file (valid checksum) that names another class is refused before anything
    is imported or called."""
    members = _members(saved)
    document = _document(members)
    document["state"]["state"]["kernel"] = {persistence._TAG: "object", "id": 999, "class": foreign,
                                            "args": ["echo pwned"]}
    crafted = _write(_with_document(members, document, fix_checksum=True))
    imported = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    with pytest.raises(ValueError, match="not one of fastep's classes"):
        fastep.load(crafted)
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert not [name for name in imported if name.split(".")[0] in ("os", "subprocess", "fastep_evil")]


def test_save_refuses_what_it_cannot_store_without_pickle(fitted):
    with pytest.raises(TypeError, match="estimator must be a fastep estimator"):
        fastep.save(object(), io.BytesIO())
    model, X, y = fitted["GaussianProcessClassifier"]
    odd = fastep.load(io.BytesIO(_saved_bytes(model)))
    odd.classes_ = np.array([("a", 1), ("b", 2)] + [None], dtype=object)[:2]
    with pytest.raises(TypeError, match="without pickle"):
        fastep.save(odd, io.BytesIO())
    odd.fit_note_ = lambda: None
    del odd.classes_
    with pytest.raises(TypeError, match="cannot save"):
        fastep.save(odd, io.BytesIO())


def test_checksum_covers_every_array_byte():
    a = {"a0": np.arange(4.0)}
    b = {"a0": np.arange(4.0)[::-1].copy()[::-1].copy()}
    assert persistence._checksum({"x": 1}, a) == persistence._checksum({"x": 1}, b)
    b["a0"][3] = np.nextafter(3.0, 4.0)
    assert persistence._checksum({"x": 1}, a) != persistence._checksum({"x": 1}, b)
    assert len(persistence._checksum({}, {})) == len(hashlib.sha256().hexdigest())


def test_a_file_from_another_fastep_version_loads_with_a_warning(saved, monkeypatch):
    members = _members(saved)
    document = _document(members)
    document["fastep_version"] = "0.0.1-old"
    with pytest.warns(UserWarning, match="saved by fastep 0.0.1-old"):
        fastep.load(_write(_with_document(members, document, fix_checksum=True)))
