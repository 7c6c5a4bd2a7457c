"""Shared fixtures, test tiers and the suite's policies.

Tiers
    ``python -m pytest tests`` runs the default tier: every module's correctness checks.
    Tests marked with one of :data:`TIERS` are left out of it; ``--tiered`` runs exactly those
    (CI runs the default tier, then ``--tiered``: the union is every test), ``--all-tiers``
    runs everything in one go, and ``-m <expression>`` selects by marker as usual (``-m fuzz``:
    that tier alone), in place of the default selection.

Hypothesis
    Profile ``dev`` (the default): random draws; a failure prints the blob that reproduces it
    (``@reproduce_failure``). Profile ``ci`` (``--hypothesis-profile=ci``): derandomised, so a
    run draws the same examples every time, and likewise prints the blob of a failure.

Data
    ``shared_data`` (from :mod:`support`) skips a test whose data file is absent, and fails it
    when ``FASTEP_REQUIRE_DATA=1``.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from threadpoolctl import threadpool_limits

from support import shared_data  # noqa: F401  (re-exported for modules that use the fixture form)

#: marker -> what it holds; each is a tier outside the default run
TIERS = {
    "slow": "long fits and repeated checks (real-size learning, the repeats of scikit-learn's checks, "
            "second cases of reference sweeps)",
    "fuzz": "property tests with large example budgets",
    "soak": "repeated fits that watch for leaks",
    "cluster": "fits on a real dask.distributed LocalCluster",
    "typing": "mypy over the public API",
    "downstream": "a downstream C extension compiled against the shipped headers",
    "docs": "the examples of the manual and of the docstrings, executed",
    "data": "fits on the real data sets beside the repository",
}

# explicit derandomize=False: hypothesis loads its own "ci" profile (derandomised) when it sees a
# CI environment variable, and a profile registered without it would inherit that
settings.register_profile("dev", derandomize=False, print_blob=True)
settings.register_profile("ci", derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dev")


def pytest_addoption(parser):
    parser.addoption("--all-tiers", action="store_true", default=False,
                     help="run every tier (the default run leaves out tests marked "
                          + ", ".join(TIERS) + ")")
    parser.addoption("--tiered", action="store_true", default=False,
                     help="run only the tests marked with a tier (" + ", ".join(TIERS) + ")")


def pytest_configure(config):
    for marker, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{marker}: tier outside the default run: {meaning}")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all-tiers") or config.getoption("markexpr"):
        return
    tiered = config.getoption("--tiered")
    selected, deselected = [], []
    for item in items:
        in_a_tier = any(item.get_closest_marker(m) for m in TIERS)
        (selected if in_a_tier == tiered else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture
def one_blas_thread():
    """Run the test with one BLAS thread: the small sequential BLAS calls of the engines and
    their twins are fastest on one thread, and a busy 2-core machine stays quick."""
    with threadpool_limits(1, "blas"):
        yield
