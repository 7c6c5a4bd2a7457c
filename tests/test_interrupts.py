"""Ctrl-C during a long compiled loop: the fit stops within a second with KeyboardInterrupt,
the estimator is left as it was, and the process keeps working.

The interrupt is delivered as a real SIGINT would be seen by Python (``_thread.interrupt_main``
from a timer thread: it trips the main thread's signal flag); the compiled loops poll the
signal handlers between sites.
"""
import _thread
import signal
import threading
import time

import numpy as np
import pytest

import fastep
from fastep._epcore import _common
from fastep.kernels import RBF

LATENCY = 1.0          # seconds from the interrupt to the KeyboardInterrupt in fit


@pytest.fixture(autouse=True)
def sigint_raises_keyboard_interrupt():
    """A process started in the background ignores SIGINT (and Python then installs no handler,
    so interrupt_main does nothing): install Python's default handler for these tests."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_after(seconds):
    fired = {}

    def fire():
        fired["at"] = time.perf_counter()
        _thread.interrupt_main()

    timer = threading.Timer(seconds, fire)
    timer.start()
    return timer, fired


def _fit_interrupted(model, X, y, after=0.4):
    timer, fired = _interrupt_after(after)
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.fit(X, y)
    finally:
        timer.cancel()
    stopped = time.perf_counter()
    assert "at" in fired, "the fit ended before the interrupt was sent: make the problem larger"
    return stopped - fired["at"], stopped - start


def _toy(n, p=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1, -1)
    return X, y


@pytest.mark.parametrize("schedule", ["sequential", "blocked"])
def test_dense_ep_sweep_stops_on_ctrl_c_and_keeps_the_fitted_model(schedule):
    X, y = _toy(1400)
    model = fastep.GaussianProcessClassifier(RBF(4.0, 1.0), optimizer=None).fit(X[:100], y[:100])
    before = model.predict_proba(X[:50]).copy()
    model.set_params(schedule=schedule, tol=1e-15, max_sweeps=10_000)
    latency, _ = _fit_interrupted(model, X, y)
    assert latency < LATENCY
    np.testing.assert_array_equal(model.predict_proba(X[:50]), before)     # not half-fitted
    assert model.X_train_.shape[0] == 100
    model.set_params(tol=1e-4, max_sweeps=200).fit(X[:200], y[:200])       # the process keeps working
    assert model.X_train_.shape[0] == 200


def test_sparse_ep_sweep_stops_on_ctrl_c():
    X, y = _toy(200_000, p=2)
    model = fastep.SparseGPClassifier(RBF(2.0, 1.0), n_inducing=60, optimizer=None, tol=1e-15, max_sweeps=10_000,
                                      random_state=0)
    latency, _ = _fit_interrupted(model, X, y, after=1.0)
    assert latency < LATENCY
    assert not hasattr(model, "site_precision_")


def test_linear_ep_sweep_stops_on_ctrl_c():
    X, y = _toy(400_000, p=40)
    model = fastep.LinearEPClassifier(tol=1e-300, max_sweeps=10_000)
    latency, _ = _fit_interrupted(model, X, y)
    assert latency < LATENCY
    assert not hasattr(model, "posterior_mean_")


def test_ivm_selection_stops_on_ctrl_c():
    X, y = _toy(60_000, p=5)
    model = fastep.IVMClassifier(RBF(1.0, 0.5), active_set_size=2000, optimizer=None)
    latency, _ = _fit_interrupted(model, X, y)
    assert latency < LATENCY
    assert not hasattr(model, "active_set_")


def test_interrupt_checks_can_be_switched_off_for_benchmarks_only():
    previous = _common.set_interrupt_checks(False)
    try:
        assert previous is True
        X, y = _toy(300)
        fastep.GaussianProcessClassifier(RBF(4.0, 1.0), optimizer=None).fit(X, y)
    finally:
        assert _common.set_interrupt_checks(previous) is False
