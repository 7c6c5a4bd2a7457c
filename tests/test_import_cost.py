"""``import fastep`` loads numpy, scipy.linalg, threadpoolctl and fastep's own modules only:
optimisers, scipy.special, the metadata machinery and the optional extras load on first use."""
import json
import subprocess
import sys

LAZY = ("scipy.optimize", "scipy.special", "scipy.sparse", "scipy.spatial", "scipy.stats",
        "scipy.integrate", "importlib.metadata", "concurrent.futures", "pandas", "dask",
        "distributed", "matplotlib", "sklearn", "tqdm")

PROBE = """
import json, sys
import numpy, scipy.linalg, threadpoolctl
before = set(sys.modules)
import fastep
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _loaded_by_import():
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_import_fastep_loads_only_its_own_modules():
    loaded = _loaded_by_import()
    assert any(name.startswith("fastep._epcore.") for name in loaded)
    heavy = [name for name in loaded if name.split(".")[0] != "fastep" and
             any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY)]
    assert heavy == []
    # Beyond that, only the standard library (which modules of it depends on the Python and
    # scipy versions) and Cython's shared module.
    others = [name for name in loaded if name.split(".")[0] != "fastep" and not name.startswith("_cython_")
              and name.split(".")[0] not in sys.stdlib_module_names]
    assert others == []


def test_version_and_first_use_still_work():
    code = ("import sys, fastep; v = fastep.__version__; assert isinstance(v, str) and v; "
            "assert 'scipy.optimize' not in sys.modules; "
            "from fastep._search.optimize import maximize_log_likelihood; import numpy as np; "
            "theta, value = maximize_log_likelihood(lambda t: (-float(t @ t), -2 * t), np.ones(2), "
            "[(-5, 5), (-5, 5)])[:2]; assert 'scipy.optimize' in sys.modules; print(v)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
