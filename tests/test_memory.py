"""Memory known before it is spent: the dense GP's estimate against measured peak RSS, and
MemoryLimitError before any large allocation (address-space limit, FASTEP_MAX_MEMORY)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import fastep
from fastep import _memory
from fastep.exceptions import MemoryLimitError

_PEAK = """
import json, sys, warnings
import numpy as np, fastep
from fastep import _memory

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

model_name, n, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
X = rng.normal(size=(n, 3)); f = np.sin(X[:, 0]) + X[:, 1]
y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1, 0)
model, target, estimate = {
    "dense": (fastep.GaussianProcessClassifier(optimizer=None, max_sweeps=3), y,
              _memory.dense_gp_bytes(n, learning=False)),
    "student_t": (fastep.GaussianProcessRegressor(likelihood="student_t", optimizer=None), f,
                  _memory.student_t_gp_bytes(n, learning=False)),
    "sparse": (fastep.SparseGPClassifier(n_inducing=width, inducing_init="kmeans++", optimizer=None, max_sweeps=3), y,
               _memory.sparse_gp_bytes(n, width, learning=False)),
    "ivm": (fastep.IVMClassifier(active_set_size=width, optimizer=None), y,
            _memory.ivm_bytes(n, width, learning=False)),
}[model_name]
# Reset the peak (VmHWM) to the current resident size, so the peak measured below is the
# fit's own and not an earlier one (an import may have peaked higher than the fit adds).
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model.fit(X, target)
peak = status("VmHWM")
print(json.dumps({"used": peak - before, "estimate": estimate}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and clear_refs are Linux's")
@pytest.mark.parametrize("model, sizes", [
    ("dense", [(1500, 0), (2500, 0), (3500, 0)]),
    ("student_t", [(1200, 0)]),
    ("sparse", [(20000, 200), (40000, 200)]),
    ("ivm", [(40000, 300), (40000, 500)]),
])
def test_the_estimate_is_within_a_quarter_of_measured_peak_rss(model, sizes):
    for n, width in sizes:
        out = subprocess.run([sys.executable, "-c", _PEAK, model, str(n), str(width)], check=True,
                             capture_output=True, text=True)
        record = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = record["estimate"] / record["used"]
        assert 0.75 <= ratio <= 1.25, (model, n, width, record)


_LIMITED = """
import json, resource, numpy as np, fastep

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)

resource.setrlimit(resource.RLIMIT_AS, (4 * 1024 ** 3, 4 * 1024 ** 3))
X = np.random.default_rng(0).normal(size=(40000, 5)); y = (X[:, 0] > 0).astype(int)
model = fastep.GaussianProcessClassifier()
with open("/proc/self/clear_refs", "w") as f:      # the peak (VmHWM) from here on is the fit's
    f.write("5")
before = status("VmRSS")
try:
    model.fit(X, y)
except MemoryError as error:
    print(json.dumps({"type": type(error).__name__, "message": str(error), "added": status("VmHWM") - before,
                      "estimate": getattr(error, "estimate", None), "limit": getattr(error, "limit", None),
                      "source": getattr(error, "source", None),
                      "fitted": [a for a in vars(model) if a.endswith("_") and not a.startswith("_")]}))
else:
    print(json.dumps({"type": None}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc/self/status and clear_refs")
def test_a_dense_fit_beyond_the_address_space_limit_is_refused_before_allocating():
    out = subprocess.run([sys.executable, "-c", _LIMITED], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["type"] == "MemoryLimitError", record       # not a MemoryError from an allocation
    assert record["estimate"] > record["limit"], record
    assert "address-space" in record["source"], record
    assert record["fitted"] == [], record
    # "nothing was allocated": the refused fit added less to the peak resident memory than
    # 1/190 of one of the n×n arrays it would need (11.9 GiB at n = 40000)
    assert record["added"] < 64 * 1024 ** 2, record
    message = record["message"]
    for words in ("n = 40000", "GiB", "nothing was allocated", "SparseGPClassifier()",
                  "IVMClassifier(active_set_size=d)", "FASTEP_MAX_MEMORY"):
        assert words in message, (words, message)


def test_the_user_limit_applies_and_a_refused_fit_changes_nothing(monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 2))
    y = np.where(X[:, 0] > 0, 1, -1)
    model = fastep.GaussianProcessRegressor(optimizer=None).fit(X, X[:, 0])
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(model).items()}
    monkeypatch.setenv("FASTEP_MAX_MEMORY", "1M")
    with pytest.raises(MemoryLimitError, match="FASTEP_MAX_MEMORY=1M") as info:
        model.fit(2 * X, y)
    assert info.value.limit == 1024 ** 2 and info.value.estimate > info.value.limit
    for key, value in before.items():
        now = vars(model)[key]
        assert now is value or (isinstance(value, np.ndarray) and np.array_equal(now, value)) or now == value, key
    with pytest.raises(MemoryLimitError, match="SparseGPClassifier"):
        fastep.GaussianProcessClassifier().fit(X, y)
    monkeypatch.setenv("FASTEP_MAX_MEMORY", "2G")
    fastep.GaussianProcessClassifier(optimizer=None).fit(X, y)


@pytest.mark.parametrize("text, expected", [("4G", 4 * 1024 ** 3), ("512 MiB", 512 * 1024 ** 2),
                                            ("1e9", 10 ** 9), ("2.5GB", 2_500_000_000)])
def test_limits_are_parsed(text, expected):
    assert _memory.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "-1G", "0", "4 potatoes"])
def test_bad_limits_are_refused(text, monkeypatch):
    monkeypatch.setenv("FASTEP_MAX_MEMORY", text)
    with pytest.raises(ValueError, match="FASTEP_MAX_MEMORY"):
        _memory.memory_limit()


def test_the_estimate_grows_with_classes_jobs_and_learning():
    one = _memory.dense_gp_bytes(1000, learning=False)
    assert _memory.dense_gp_bytes(1000, learning=True) > one
    assert _memory.dense_gp_bytes(1000, learning=False, n_problems=4) > one
    assert (_memory.dense_gp_bytes(1000, learning=False, n_problems=4, n_concurrent=2)
            > _memory.dense_gp_bytes(1000, learning=False, n_problems=4))
    assert _memory.dense_gp_bytes(1000, learning=False, n_classes_multinomial=3) > one
    assert _memory.dense_gp_bytes(2000, learning=False) > 3.9 * (one - _memory.BASE_BYTES)


def _fitted_state(model):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(model).items()}


def _assert_unchanged(model, before):
    assert set(vars(model)) == set(before)
    for key, value in before.items():
        now = vars(model)[key]
        assert now is value or (isinstance(value, np.ndarray) and np.array_equal(now, value)) or now == value, key


@pytest.mark.parametrize("make, target, words", [
    (lambda: fastep.SparseGPClassifier(n_inducing=20, optimizer=None), "labels", "m = 20 inducing inputs"),
    (lambda: fastep.SparseGPRegressor(n_inducing=20, optimizer=None), "real", "m = 20 inducing inputs"),
    (lambda: fastep.IVMClassifier(active_set_size=20, optimizer=None), "labels", "d = 20 points"),
    (lambda: fastep.IVMRegressor(active_set_size=20, optimizer=None), "real", "d = 20 points"),
    (lambda: fastep.IVMOrdinalRegressor(active_set_size=20, optimizer=None), "labels", "d = 20 points"),
    (lambda: fastep.GaussianProcessRegressor(likelihood="student_t", optimizer=None), "real", "O(n²)"),
])
def test_sparse_ivm_and_student_t_fits_are_refused_above_the_limit(make, target, words, monkeypatch):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 2))
    y = np.where(X[:, 0] > 0, 1, 0) if target == "labels" else X[:, 0] + 0.1 * rng.normal(size=200)
    model = make().fit(X, y)
    before = _fitted_state(model)
    monkeypatch.setenv("FASTEP_MAX_MEMORY", "1M")
    with pytest.raises(MemoryLimitError, match="FASTEP_MAX_MEMORY=1M") as info:
        model.fit(X[::-1], y[::-1])
    assert words in str(info.value) and type(model).__name__ in str(info.value)
    assert info.value.estimate > info.value.limit == 1024 ** 2
    _assert_unchanged(model, before)


def test_the_estimates_grow_with_width_problems_and_learning():
    for estimate in (_memory.sparse_gp_bytes, _memory.ivm_bytes):
        one = estimate(10_000, 100, learning=False)
        assert estimate(10_000, 200, learning=False) > one
        assert estimate(10_000, 100, learning=True) > one
        assert estimate(10_000, 100, learning=False, n_problems=3, n_concurrent=2) > one
        assert (estimate(10_000, 100, learning=False, n_problems=3, n_concurrent=1)
                == estimate(10_000, 100, learning=False))
    assert _memory.student_t_gp_bytes(1000, learning=True) > _memory.student_t_gp_bytes(1000, learning=False) \
        > _memory.dense_gp_bytes(1000, learning=False)


def test_auto_inducing_growth_stops_at_the_memory_limit_with_a_warning(monkeypatch):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 2))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] > 0, 1, 0)
    model = fastep.SparseGPClassifier(optimizer=None)
    first, second = 64, 128                       # auto_sizes(400)[:2]
    limit = (model._memory_estimate(400, first, 1) + model._memory_estimate(400, second, 1)) // 2
    monkeypatch.setenv("FASTEP_MAX_MEMORY", str(limit))
    with pytest.warns(UserWarning, match="stopped growing at m = 64"):
        model.fit(X, y)
    assert model.inducing_inputs_.shape[0] == first
    assert [record["n_inducing"] for record in model.growth_history_] == [first]
    monkeypatch.delenv("FASTEP_MAX_MEMORY")
    grown = fastep.SparseGPClassifier(optimizer=None).fit(X, y)
    assert [record["n_inducing"] for record in grown.growth_history_][:2] == [first, second]
