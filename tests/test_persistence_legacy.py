"""Files written by an earlier fastep load exactly and predict as they did when written.

``tests/legacy_models/`` holds every estimator of test_persistence.MODELS saved by fastep 0.1.0
(written by ``tests/legacy_models/write.py``) together with its outputs then (every prediction
method on the training inputs). Classes that have since moved to another module are found
through the loader's table of moved classes.

Loading is exact: the loaded model, saved again, holds the file's arrays byte for byte and no
other; outputs that are fitted attributes (LinearEPRankK's posterior and evidence) are those bytes.
Predictions are computed again, by this machine's kernels. The files were written on an AVX2
machine (OpenBLAS's Haswell kernels, numpy and libm without AVX-512 reproduce every output bit
for bit); another CPU sums in another order. Labels, and a classifier's accuracy, compare
exactly: the recorded probabilities of the classifiers that predict their argmax separate the top
class from the next by far more than their tolerance. Every other prediction compares norm-wise,
``max |now - then| <= 2 n R max |then|``, by the rule of ``golden_problems`` (module docstring):
``n`` training points bound every sum behind a prediction, whose backward error is at most ``n``
units in the last place on each of the two machines, and ``R``, the prediction's conditioning, is
measured here as its largest relative change when the inputs move by one unit in the last place
(three sign patterns), at least the unit roundoff.
"""
import io
import os
import warnings
from collections import Counter

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import fastep
import golden_problems
from fastep.persistence import _read
from test_persistence import MODELS, _outputs

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_models")


def flatten_outputs(outputs, prefix=""):
    """``{dotted path: array}`` for a nest of dicts, lists and tuples of arrays."""
    flat = {}
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            flat.update(flatten_outputs(value, f"{prefix}{key}."))
    elif isinstance(outputs, (list, tuple)):
        for index, value in enumerate(outputs):
            flat.update(flatten_outputs(value, f"{prefix}{index}."))
    else:
        array = np.asarray(outputs)
        flat[prefix.rstrip(".")] = array.astype(float) if array.dtype == object else array
    return flat


def _load(name):
    stem = os.path.join(FOLDER, name.replace(" ", "_"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # written by another version
        return fastep.load(stem + ".npz"), stem


def _exact(model, key):
    """Whether output ``key`` compares bitwise: a stored attribute, a label, a classifier's accuracy."""
    return key.endswith("_") or (hasattr(model, "classes_") and key in ("predict", "score"))


def _n_points(X):
    return sum(len(x) for x in X) if isinstance(X, list) else len(X)


def _relative_difference(a, b, scale):
    difference = np.max(np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float)), initial=0.0)
    return 0.0 if difference == 0.0 else difference / scale


@pytest.mark.parametrize("name", list(MODELS))
def test_a_file_from_fastep_0_1_loads_exactly(name):
    model, stem = _load(name)
    assert type(model) is type(MODELS[name][0])
    buffer = io.BytesIO()
    fastep.save(model, buffer)
    buffer.seek(0)
    _, then = _read(stem + ".npz")
    _, now = _read(buffer)

    def contents(arrays):
        return Counter((a.dtype.str, a.shape, a.tobytes()) for a in arrays.values())

    assert contents(now) == contents(then)


def compare_outputs(name):
    """The outputs of model ``name`` now against then: ``(rows, labels_gap)``, rows
    ``(key, relative difference, relative tolerance)`` (tolerance 0: bitwise), ``labels_gap`` the
    smallest gap between the top two recorded probabilities over the tolerance of predict_proba
    (None unless the model predicts their argmax)."""
    model, stem = _load(name)
    _, X, y = MODELS[name]
    with threadpool_limits(1):       # as golden_problems fits: a second thread only slows these small products
        now = flatten_outputs(_outputs(model, X, y))
        moved = [flatten_outputs(_outputs(model, golden_problems.perturbed(X, seed), y))
                 for seed in golden_problems.SENSITIVITY_SEEDS]
    n = _n_points(X)
    with np.load(stem + ".outputs.npz", allow_pickle=False) as archive:
        then = {key: archive[key] for key in archive.files}
    for old_name, new_name in type(model)._renamed_attributes.items():     # attributes renamed since the file
        then = {(new_name + key[len(old_name):] if key.startswith(old_name) else key): value
                for key, value in then.items()}
    assert sorted(then) == sorted(now)
    rows, tolerance = [], {}
    for key, value in then.items():
        assert value.dtype == now[key].dtype, key
        assert value.shape == now[key].shape, key
        if _exact(model, key) or value.dtype.kind != "f":
            rows.append((key, 0.0 if value.tobytes() == now[key].tobytes() else np.inf, 0.0))
            continue
        scale = np.max(np.abs(value))
        R = max(max(_relative_difference(m[key], now[key], scale) for m in moved), golden_problems.UNIT_ROUNDOFF)
        tolerance[key] = 2 * n * R * scale
        rows.append((key, _relative_difference(now[key], value, scale), 2 * n * R))
    proba, gap = then.get("predict_proba"), None
    if proba is not None and np.array_equal(model.classes_[np.argmax(proba, axis=1)], then["predict"]):
        top_two = np.sort(proba, axis=1)[:, -2:]
        gap = np.min(top_two[:, 1] - top_two[:, 0]) / tolerance["predict_proba"]
    return rows, gap


@pytest.mark.parametrize("name", list(MODELS))
def test_a_file_from_fastep_0_1_predicts_as_then(name):
    rows, gap = compare_outputs(name)
    outside = [f"{key}: relative difference {difference:.3g}, tolerance {tol:.3g}"
               for key, difference, tol in rows if not difference <= tol]
    assert not outside, "\n".join(outside)
    assert gap is None or gap > 1e6                        # exact labels: far from a tie


if __name__ == "__main__":             # python tests/test_persistence_legacy.py: the largest difference per model
    for name in MODELS:
        rows, gap = compare_outputs(name)
        moved = [row for row in rows if row[1] > 0 and row[2] > 0]
        bad = [row for row in rows if not row[1] <= row[2]]
        key, difference, tol = max(moved, key=lambda row: row[1] / row[2]) if moved else ("-", 0.0, 0.0)
        print(f"{name:38s} {key:18s} {difference:9.2e} / {tol:9.2e}  {'EXCEEDS' if bad else 'within'}"
              + ("" if gap is None else f"  (label gap / tolerance {gap:.1e})"))
