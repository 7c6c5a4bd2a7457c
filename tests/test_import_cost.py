"""``import fastep`` loads numpy, scipy.linalg and fastep's own modules only: the estimators' modules
(with their compiled engines), threadpoolctl, optimisers, scipy.special, the metadata machinery and
the optional extras load on first use."""
import json
import subprocess
import sys

import numpy as np

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


#: fastep's modules that ``import fastep`` leaves to first use (an estimator's first use imports
#: its module, its compiled engine and the search machinery).
DEFERRED = ("fastep.gp", "fastep.sparse", "fastep.ivm", "fastep.linear", "fastep.horseshoe", "fastep.multioutput",
            "fastep.batch", "fastep._gp", "fastep._dense", "fastep._sparse", "fastep._ivm", "fastep._horseshoe",
            "fastep._student_t", "fastep._search", "fastep._memory", "fastep._show_versions", "fastep.cli",
            "fastep._epcore.gp_ep", "fastep._epcore.sparse_ep", "fastep._epcore.ivm", "fastep._epcore.linear_ep",
            "fastep._epcore.horseshoe", "fastep._epcore.horseshoe_ep", "fastep._epcore.horseshoe_marginals", "fastep._epcore.rank_k_ep", "fastep._epcore.multiclass_ep")

FRESH = """
import json, sys
import fastep
print(json.dumps(sorted(sys.modules)))
"""


def test_estimator_modules_and_threadpoolctl_load_on_first_use():
    out = subprocess.run([sys.executable, "-c", FRESH], check=True, capture_output=True, text=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    early = [name for name in loaded if any(name == lazy or name.startswith(lazy + ".") for lazy in DEFERRED)]
    assert early == []
    assert "threadpoolctl" not in loaded
    assert {"fastep.kernels", "fastep.likelihoods", "fastep.hyperpriors", "fastep.persistence"} <= set(loaded)


def test_public_names_import_their_modules_on_first_use():
    code = ("import sys, fastep; assert 'fastep.gp' not in sys.modules; "
            "from fastep import GaussianProcessClassifier; assert 'fastep.gp' in sys.modules; "
            "assert fastep.GaussianProcessClassifier is GaussianProcessClassifier; "
            "assert GaussianProcessClassifier.__module__ == 'fastep.gp'; "
            "assert 'fastep.sparse' not in sys.modules; fastep.SparseGPRegressor; "
            "assert 'fastep.sparse' in sys.modules; "
            "missing = [n for n in fastep.__all__ if n not in dir(fastep)]; assert not missing, missing; "
            "assert all(getattr(fastep, n) is not None for n in fastep.__all__); "
            "assert fastep.batch.fit_many and fastep.plotting.plot_convergence; "
            "ns = {}; exec('from fastep import *', ns); assert 'LinearEPRankK' in ns and 'show_versions' in ns; "
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-c", "import fastep; fastep.NoSuchThing"], capture_output=True, text=True)
    assert out.returncode == 1 and "AttributeError: module 'fastep' has no attribute 'NoSuchThing'" in out.stderr


def test_a_fresh_process_loads_a_saved_model_before_any_estimator_is_imported(tmp_path):
    """``fastep.load`` finds the classes a file names among fastep's modules: it imports the
    estimators' modules first, as ``fastep predict`` needs in a new process."""
    import fastep
    from fastep.kernels import RBF

    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = np.where(X[:, 0] > 0, 1, -1)
    classifier = fastep.GaussianProcessClassifier(RBF(), optimizer=None).fit(X, y)
    regressor = fastep.SparseGPRegressor(RBF(), n_inducing=5, optimizer=None).fit(X, X[:, 1])
    fastep.save(classifier, tmp_path / "gpc.npz")
    fastep.save(regressor, tmp_path / "sparse.npz")
    code = ("import json, sys, numpy as np, fastep; X = np.array(json.loads(sys.argv[1])); "
            "print(json.dumps([fastep.load('gpc.npz').predict_proba(X).tolist(), "
            "fastep.load('sparse.npz').predict(X).tolist()]))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(X[:3].tolist())], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    proba, mean = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(proba, classifier.predict_proba(X[:3]), rtol=1e-9)
    np.testing.assert_allclose(mean, regressor.predict(X[:3]), rtol=1e-9)
