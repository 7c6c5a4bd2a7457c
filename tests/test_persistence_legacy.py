"""Files written by an earlier fastep load and predict bitwise as they did when written.

``tests/legacy_models/`` holds every estimator of test_persistence.MODELS saved by fastep 0.1.0
(written by ``tests/legacy_models/write.py``) together with its outputs then. Classes that have
since moved to another module are found through the loader's table of moved classes.
"""
import os
import warnings

import numpy as np
import pytest

import fastep
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


@pytest.mark.parametrize("name", list(MODELS))
def test_a_file_from_fastep_0_1_loads_and_predicts_bitwise(name):
    stem = os.path.join(FOLDER, name.replace(" ", "_"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # written by another version
        model = fastep.load(stem + ".npz")
    assert type(model) is type(MODELS[name][0])
    _, X, y = MODELS[name]
    now = flatten_outputs(_outputs(model, X, y))
    with np.load(stem + ".outputs.npz", allow_pickle=False) as then:
        assert sorted(then.files) == sorted(now)
        for key in then.files:
            assert then[key].dtype == now[key].dtype, key
            assert then[key].shape == now[key].shape, key
            assert then[key].tobytes() == now[key].tobytes(), key
