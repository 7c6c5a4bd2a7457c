"""The suite's own contract: the estimator registry is complete, the per-test timeout is active,
and the default run leaves the marked tiers out."""
import inspect
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import fastep
from conftest import TIERS
from support import ESTIMATORS, configured, estimator_names, public_estimator_classes

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_registry_holds_exactly_the_public_estimators():
    public = public_estimator_classes()
    assert public, "fastep.__all__ exports no estimator"
    assert {name: spec.cls for name, spec in ESTIMATORS.items()} == public


def test_every_public_name_with_fit_is_an_estimator_class():
    # the registry's reference list: a function or an instance with `fit` would slip past it
    fitting = [name for name in fastep.__all__ if hasattr(getattr(fastep, name), "fit")]
    assert all(inspect.isclass(getattr(fastep, name)) for name in fitting)


# the horseshoe searches are the longest of these fits: slow tier
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if "Horseshoe" in name else name
                                  for name in ESTIMATORS])
def test_each_registered_configuration_fits_its_problem(name):
    spec = ESTIMATORS[name]
    X, y = spec.data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        model = spec.make().fit(X, y)
    fitted = [key for key in vars(model) if key.endswith("_") and not key.startswith("_")]
    assert fitted, f"{name} has no fitted attribute after fit"
    if spec.fit_shape == "Xy":
        assert np.all(np.isfinite(np.asarray(model.predict(X), dtype=float)))


def test_registry_helpers_refuse_unknown_names_and_bare_exclusions():
    with pytest.raises(KeyError, match="NoSuchEstimator"):
        estimator_names(exclude={"NoSuchEstimator": "a typo"})
    with pytest.raises(ValueError, match="reason"):
        estimator_names(exclude={"LinearEPRankK": ""})
    with pytest.raises(KeyError, match="NoSuchEstimator"):
        configured({"NoSuchEstimator": {}})
    cases = configured({"IVMClassifier": {"active_set_size": 7}}, exclude={"LinearEPRankK": "3-D inputs"},
                       variants={"GPC-multinomial": ("GaussianProcessClassifier", {"multi_class": "multinomial"})})
    assert "LinearEPRankK" not in cases and set(cases) == (set(ESTIMATORS) - {"LinearEPRankK"}) | {"GPC-multinomial"}
    assert cases["IVMClassifier"]().active_set_size == 7
    assert cases["IVMClassifier"]().n_iterations == ESTIMATORS["IVMClassifier"].params["n_iterations"]
    assert cases["GPC-multinomial"]().multi_class == "multinomial"


def _pytest(tmp_path, *args, env=None):
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
               "--rootdir", str(ROOT), *args]
    # the child gets the options given here only (CI's PYTEST_ADDOPTS would choose its profile)
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTEST_ADDOPTS": "", **(env or {})})


def test_the_timeout_plugin_is_configured_for_this_run(request):
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    assert 0 < float(request.config.getini("timeout")) <= 900


def test_a_hanging_test_is_stopped_by_the_timeout_and_named(tmp_path):
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent("""
        import time

        def test_waits_for_an_event_that_never_comes():
            while True:
                time.sleep(0.05)

        def test_after_the_hang():
            assert True
    """))
    # the project's configuration, with the limit shortened so the check takes seconds
    out = _pytest(tmp_path, "test_hangs.py", "-o", "timeout=2", "-q")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Timeout" in out.stdout and "test_waits_for_an_event_that_never_comes" in out.stdout
    assert "1 failed, 1 passed" in out.stdout           # the run went on after the hang


@pytest.mark.slow
def test_the_default_run_leaves_the_tiers_out_and_all_tiers_runs_them(tmp_path):
    module = ROOT / "tests" / "test_suite.py"
    default = _pytest(tmp_path, str(module), "--collect-only", "-q")
    everything = _pytest(tmp_path, str(module), "--collect-only", "-q", "--all-tiers")
    only = _pytest(tmp_path, str(module), "--collect-only", "-q", "-m", "soak")
    tiered = _pytest(tmp_path, str(module), "--collect-only", "-q", "--tiered")
    for out in (default, everything, only, tiered):
        assert out.returncode == 0, out.stdout + out.stderr
    marked = "test_suite.py::test_a_test_marked_with_a_tier_is_left_out_by_default"
    assert marked not in default.stdout
    assert marked in everything.stdout and marked in only.stdout and marked in tiered.stdout
    unmarked = "test_the_registry_holds_exactly_the_public_estimators"
    assert unmarked in default.stdout and unmarked in everything.stdout
    assert unmarked not in only.stdout and unmarked not in tiered.stdout


@pytest.mark.soak
def test_a_test_marked_with_a_tier_is_left_out_by_default():
    # collected by the test above; running it checks that every tier is declared
    assert set(TIERS) >= {"slow", "fuzz", "soak", "cluster", "typing", "downstream", "docs", "data"}


def test_missing_data_skips_by_default_and_fails_when_required(tmp_path):
    (tmp_path / "test_needs_data.py").write_text(textwrap.dedent("""
        from support import shared_data

        def test_reads_a_file_that_is_not_there():
            shared_data("no-such-file.npz")
    """))
    tests = str(ROOT / "tests")
    env = {"PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]),
           "FASTEP_DATA_DIR": str(tmp_path)}
    skipped = _pytest(tmp_path, "test_needs_data.py", "-q", env={**env, "FASTEP_REQUIRE_DATA": ""})
    required = _pytest(tmp_path, "test_needs_data.py", "-q", env={**env, "FASTEP_REQUIRE_DATA": "1"})
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout + skipped.stderr
    assert required.returncode == 1 and "FASTEP_REQUIRE_DATA" in required.stdout, required.stdout


def test_the_support_matrix_runs_the_default_and_downstream_tiers():
    # .ci/support-matrix names the tiers it leaves out in a marker expression: keep it in step
    # with conftest.TIERS (a tier added there and not here would run in the matrix)
    script = (ROOT / ".ci" / "support-matrix").read_text()
    line = next(line for line in script.splitlines() if line.startswith("default_and_downstream=("))
    left_out = line.split('"not (', 1)[1].split(')"', 1)[0].split(" or ")
    assert set(left_out) == set(TIERS) - {"downstream"}


@pytest.mark.slow
def test_the_ci_profile_derandomises_hypothesis_and_prints_the_blob(tmp_path):
    (tmp_path / "test_draws.py").write_text(textwrap.dedent("""
        from hypothesis import given, settings, strategies as st

        @settings(max_examples=5, deadline=None)      # as the suite's property tests declare theirs
        @given(st.integers())
        def test_draws(x):
            pass

        def test_report():
            used = test_draws._hypothesis_internal_use_settings
            print("SETTINGS", used.derandomize, used.print_blob)
    """))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    dev = _pytest(tmp_path, "test_draws.py", "-q", "-s", "-p", "conftest", env=env)
    ci = _pytest(tmp_path, "test_draws.py", "-q", "-s", "-p", "conftest", "--hypothesis-profile=ci", env=env)
    assert "SETTINGS False True" in dev.stdout, dev.stdout + dev.stderr
    assert "SETTINGS True True" in ci.stdout, ci.stdout + ci.stderr
