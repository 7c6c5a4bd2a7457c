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

n = int(sys.argv[1])
rng = np.random.default_rng(0)
X = rng.normal(size=(n, 3)); y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1, 0)
model = fastep.GaussianProcessClassifier(optimizer=None, max_sweeps=3)
# Reset the peak (VmHWM) to the current resident size, so the peak measured below is the
# fit's own and not an earlier one (an import may have peaked higher than the fit adds).
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model.fit(X, y)
peak = status("VmHWM")
print(json.dumps({"used": peak - before, "estimate": _memory.dense_gp_bytes(n, learning=False)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and clear_refs are Linux's")
def test_dense_estimate_is_within_a_quarter_of_measured_peak_rss():
    for n in (1500, 2500, 3500):
        out = subprocess.run([sys.executable, "-c", _PEAK, str(n)], check=True, capture_output=True, text=True)
        record = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = record["estimate"] / record["used"]
        assert 0.75 <= ratio <= 1.25, (n, record)


_LIMITED = """
import resource, time, numpy as np, fastep
resource.setrlimit(resource.RLIMIT_AS, (4 * 1024 ** 3, 4 * 1024 ** 3))
X = np.random.default_rng(0).normal(size=(40000, 5)); y = (X[:, 0] > 0).astype(int)
model = fastep.GaussianProcessClassifier()
start = time.perf_counter()
try:
    model.fit(X, y)
except fastep.MemoryLimitError as error:
    elapsed = time.perf_counter() - start
    assert isinstance(error, MemoryError) and error.estimate > error.limit, error
    assert "address-space" in error.source
    assert not [a for a in vars(model) if a.endswith("_") and not a.startswith("_")], vars(model)
    print(f"{elapsed:.3f}", error)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS")
def test_a_dense_fit_beyond_the_address_space_limit_is_refused_at_once():
    out = subprocess.run([sys.executable, "-c", _LIMITED], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    elapsed, message = out.stdout.split(" ", 1)
    assert float(elapsed) < 1.0
    for words in ("n = 40000", "GiB", "SparseGPClassifier()", "IVMClassifier(active_set_size=d)",
                  "FASTEP_MAX_MEMORY"):
        assert words in message


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
