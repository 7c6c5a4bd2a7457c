"""asv: the IVM and the sparse GP classifier as a user meets them, on real data.

The test error of ``IVMClassifier(active_set_size=200)`` (the kernel learnt by the full-data
objective) and of ``SparseGPClassifier()`` (m grown from the data), and the fit time, so that a
regression in what these defaults learn shows in the asv history:

- image, Rätsch split 1 (1300 training rows, 18 features, 1010 test rows);
- a USPS subset: digit 3 against 5 (the most confused pair), 1000 training rows, the standard
  test rows of those digits.

The data sets are read from ``../shared/data`` (or ``$FASTEP_DATA``); without them the
benchmarks are skipped (``NotImplementedError``).
"""
import os
import warnings

import numpy as np

from fastep import IVMClassifier, SparseGPClassifier

_DATA = os.environ.get("FASTEP_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))


def _image():
    path = os.path.join(_DATA, "raetsch_splits.npz")
    if not os.path.exists(path):
        raise NotImplementedError(f"{path} not found")
    with np.load(path) as f:
        return tuple(f[f"image_{part}_1"] for part in ("Xtr", "ytr", "Xte", "yte"))


def _usps_3_vs_5(n_train=1000):
    path = os.path.join(_DATA, "usps.npz")
    if not os.path.exists(path):
        raise NotImplementedError(f"{path} not found")
    with np.load(path) as f:
        X, y, Xt, yt = f["X_train"], f["y_train"], f["X_test"], f["y_test"]
    keep, keep_t = np.flatnonzero((y == 3) | (y == 5))[:n_train], (yt == 3) | (yt == 5)
    return X[keep], y[keep], Xt[keep_t], yt[keep_t]


_DATASETS = {"image": _image, "usps_3_vs_5": _usps_3_vs_5}
_MODELS = {"ivm_d200": lambda: IVMClassifier(active_set_size=200), "sparse_default": lambda: SparseGPClassifier()}


def _fit(name, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _MODELS[name]().fit(X, y)


class SparseDefaults:
    """Fit time and test error of the IVM (d = 200) and sparse defaults."""
    params = [list(_DATASETS), list(_MODELS)]
    param_names = ["data", "model"]
    timeout = 600
    number = 1
    repeat = (1, 2, 120.0)

    def setup_cache(self):
        out = {}
        for name, load in _DATASETS.items():
            try:
                out[name] = load()
            except NotImplementedError:
                out[name] = None
        return out

    def setup(self, cache, data, model):
        if cache[data] is None:
            raise NotImplementedError(f"the {data} data are not available")

    def time_fit(self, cache, data, model):
        X, y, _, _ = cache[data]
        _fit(model, X, y)

    def track_test_error_percent(self, cache, data, model):
        X, y, Xt, yt = cache[data]
        return 100.0 * float(np.mean(_fit(model, X, y).predict(Xt) != yt))

    track_test_error_percent.unit = "%"
