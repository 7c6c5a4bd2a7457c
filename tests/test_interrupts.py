"""Ctrl-C during a long compiled loop: the fit stops with KeyboardInterrupt, the estimator is left
as it was, and the process keeps working.

The interrupt is delivered as a real SIGINT would be seen by Python (``_thread.interrupt_main``
from another thread: it trips the main thread's signal flag); the compiled loops poll the signal
handlers between sites. It is sent once the code under test has reported a given amount of
progress (its first EP sweep, its fifth kernel column), never after a delay, and how far the
fit got is counted in progress marks, never timed: how fast an interrupt is honoured is measured
in ``benchmarks/interrupts.py``.
"""
import _thread
import queue
import signal
import threading

import numpy as np
import pytest

import fastep
from fastep._epcore import _common, gp_ep, linear_ep, sparse_ep
from fastep.kernels import RBF
from fastep.kernels.columns import KernelColumns

# How long the interrupting thread waits for a progress mark, and the test for that thread to
# end, before giving up (the test then fails with a message saying so). A run that ends
# without enough marks wakes the thread at once; every run here has a bounded number of sweeps
# or inclusions, so none waits for an interrupt that never comes.
WAIT = 300.0
_CLOSED = object()

# one BLAS thread: the small dense problems here are as fast on one, and a busy 2-core machine
# does not slow them down by an order of magnitude
pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.fixture(autouse=True)
def sigint_raises_keyboard_interrupt():
    """A process started in the background ignores SIGINT (and Python then installs no handler,
    so interrupt_main does nothing): install Python's default handler for these tests."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class Interrupter:
    """Sends one interrupt from another thread once the code under test has made ``after``
    progress marks (calls of :attr:`mark`), and notes how many marks had been made then.

    :attr:`mark` is ``queue.SimpleQueue.put``, a C function taking up to three positional
    arguments (the engines' ``sweep_callback(sweep, max_change, log_z)``; ``put`` ignores the
    last two): calling it runs no Python frame in which a pending signal could be handled, so
    with the engines only their own polling can honour the interrupt. No interrupt is sent
    once the ``with`` block has ended.
    """

    def __init__(self, after=1):
        self._queue = queue.SimpleQueue()
        self.mark = self._queue.put
        self._after = after
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.received = []
        self.marks_when_sent = None         # None: no interrupt was sent

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        with self._lock:
            self._closed = True
        self._queue.put(_CLOSED)            # wakes the thread if it still waits for a mark
        return False

    def _run(self):
        while len(self.received) < self._after:
            try:
                item = self._queue.get(timeout=WAIT)
            except queue.Empty:
                return
            if item is _CLOSED:
                return
            self.received.append(item)
        with self._lock:
            if not self._closed:
                _thread.interrupt_main()
                # counted after sending: a mark made in between counts as made before, so the
                # marks counted after the interrupt are never more than were made after it
                self.marks_when_sent = len(self.received) + self._queue.qsize()

    def marks(self):
        """Every mark made (after the ``with`` block: waits for the thread first)."""
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the interrupting thread did not end"
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _CLOSED:
                self.received.append(item)
        return self.received


def _run_interrupted(run, after=1):
    """``run(mark)`` with an interrupt sent after its ``after``-th mark; checks that it was sent
    and that ``run`` ended with KeyboardInterrupt. Returns (all marks, marks made when sent)."""
    interrupter = Interrupter(after)
    raised = False
    try:
        with interrupter:
            run(interrupter.mark)
    except KeyboardInterrupt:
        raised = True
    marks = interrupter.marks()
    assert interrupter.marks_when_sent is not None, (
        f"no interrupt was sent: the run ended after {len(marks)} progress marks (the interrupt "
        f"waits for {after}, and none is sent once the run has ended) or made none within {WAIT:.0f} s")
    assert raised, f"the interrupt was sent after {interrupter.marks_when_sent} marks, but the run ended normally"
    return marks, interrupter.marks_when_sent


def _toy(n, p=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1, -1)
    return X, y


def _public_fitted_attributes(model):
    return sorted(a for a in vars(model) if a.endswith("_") and not a.startswith("_"))


# --------------------------------------------------------------------------- #
# the compiled engines: the sweep stops where the interrupt arrived
# --------------------------------------------------------------------------- #

def _dense_engine(schedule, n=200):
    X, y = _toy(n)
    K = 4.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, axis=-1)) + 1e-8 * np.eye(n)
    spec = fastep.Probit().site_spec()

    def run(site_precision, site_natural_mean, max_sweeps, mark):
        gp_ep.DenseEP(K, y.astype(float), spec, gp_ep.DenseEPOptions(schedule=schedule, tol=1e-300,
                                                                      max_sweeps=max_sweeps)).run(
            site_precision, site_natural_mean, np.empty((n, n)), np.empty(n), sweep_callback=mark)
    return n, run


def _sparse_engine(n=20_000, m=50):
    rng = np.random.default_rng(1)
    Vt = np.ascontiguousarray(rng.normal(size=(n, m)) / np.sqrt(m))
    d = np.full(n, 0.1)
    y = np.where(rng.normal(size=n) > 0, 1.0, -1.0)
    spec = fastep.Probit().site_spec()

    def run(site_precision, site_natural_mean, max_sweeps, mark):
        sparse_ep.SparseEP(Vt, d, y, spec, sparse_ep.SparseEPOptions(tol=1e-300, max_sweeps=max_sweeps)).run(
            site_precision, site_natural_mean, np.empty((m, m)), np.empty(m), sweep_callback=mark)
    return n, run


def _linear_engine(n=20_000, d=40):
    rng = np.random.default_rng(2)
    X = np.ascontiguousarray(rng.normal(size=(n, d)))
    y = np.where(rng.normal(size=n) > 0, 1.0, -1.0)
    spec = fastep.Probit().site_spec()

    def run(site_precision, site_natural_mean, max_sweeps, mark):
        linear_ep.LinearEP(X, y, np.zeros(d), np.eye(d), spec,
                           linear_ep.LinearEPOptions(tol=0.0, max_sweeps=max_sweeps)).run(
            site_precision, site_natural_mean, np.empty(d), np.empty((d, d)), sweep_callback=mark)
    return n, run


def _nested_engine(n=150, c=3):
    """Nested EP (multinomial probit) on a dense kernel matrix: n inputs, c classes, n c inner
    sites of each kind (the test's flat site arrays, viewed as (n, c))."""
    from fastep._dense.multiclass import dense_posterior_of
    from fastep._epcore import multiclass_ep
    X, _ = _toy(n)
    K = 4.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, axis=-1)) + 1e-8 * np.eye(n)
    labels = np.arange(n, dtype=np.int32) % c
    posterior_of = dense_posterior_of(K)

    def run(site_precision, site_natural_mean, max_sweeps, mark):
        multiclass_ep.MultinomialEP(posterior_of, labels, c, damping=0.5, tol=1e-300, max_sweeps=max_sweeps).run(
            site_precision.reshape(n, c), site_natural_mean.reshape(n, c), sweep_callback=mark)
    return n * c, run


# (engine, whether it puts the in/out site arrays back when interrupted)
ENGINES = {
    "dense sequential": (lambda: _dense_engine(gp_ep.SCHEDULE_SEQUENTIAL), True),
    "dense blocked": (lambda: _dense_engine(gp_ep.SCHEDULE_BLOCKED), True),
    "sparse": (_sparse_engine, True),
    # the linear engine keeps no copy of the sites (its estimators discard them on an error)
    "linear": (_linear_engine, False),
    "nested": (_nested_engine, True),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_compiled_sweep_stops_within_the_sweep_the_interrupt_arrived_in(engine):
    make, restores_sites = ENGINES[engine]
    n, run = make()
    max_sweeps = 500            # ends a run that ignores the interrupt (7 ms to 0.14 s a sweep here)
    site_precision, site_natural_mean = np.full(n, 0.5), np.zeros(n)     # a warm start
    marks, sent = _run_interrupted(lambda mark: run(site_precision, site_natural_mean, max_sweeps, mark))
    # the interrupt is sent once sweep 1 has been reported, i.e. while a later sweep runs;
    # that sweep may end (and be reported) when the interrupt lands after its last poll,
    # in the work between two sweeps, but no sweep starts after it
    assert marks == list(range(1, len(marks) + 1))
    assert len(marks) - sent <= 1, (
        f"{len(marks) - sent} sweeps were reported after the interrupt was sent (after sweep {sent})")
    assert len(marks) < max_sweeps
    if restores_sites:
        np.testing.assert_array_equal(site_precision, 0.5)
        np.testing.assert_array_equal(site_natural_mean, 0.0)


@pytest.mark.parametrize("engine, max_sweeps", [("dense blocked", 200), ("sparse", 12), ("linear", 20)])
def test_without_polling_the_sweeps_run_on_to_max_sweeps(engine, max_sweeps):
    """The control for the test above: with the polling switched off the interrupt waits for
    the engine to return, so the sweep count there does tell whether the loops poll. (About
    1.5 s of sweeps each here, so that the interrupt is sent before the run ends.)"""
    n, run = ENGINES[engine][0]()
    previous = _common.set_interrupt_checks(False)
    try:
        marks, sent = _run_interrupted(lambda mark: run(np.full(n, 0.5), np.zeros(n), max_sweeps, mark))
    finally:
        _common.set_interrupt_checks(previous)
    assert sent < max_sweeps
    assert len(marks) == max_sweeps


# --------------------------------------------------------------------------- #
# the estimators: KeyboardInterrupt out of fit, nothing half-fitted
# --------------------------------------------------------------------------- #

def _fit_interrupted(model, X, y, max_sweeps):
    """``model.fit(X, y)`` interrupted after its first progress record; checks the fit stopped
    before its end and returns the stages it reported."""
    records, sent = _run_interrupted(lambda mark: model.set_params(callback=mark).fit(X, y))
    model.set_params(callback=None)
    stages = [record.stage for record in records]
    assert "done" not in stages
    assert len(records) - sent <= 1, f"{len(records) - sent} progress records after the interrupt: {stages}"
    assert stages.count("EP sweep") < max_sweeps
    return stages


@pytest.mark.parametrize("schedule", ["sequential", "blocked"])
def test_dense_ep_sweep_stops_on_ctrl_c_and_keeps_the_fitted_model(schedule):
    X, y = _toy(600)
    model = fastep.GaussianProcessClassifier(RBF(4.0, 1.0), optimizer=None).fit(X[:100], y[:100])
    before = model.predict_proba(X[:50]).copy()
    attributes = _public_fitted_attributes(model)
    model.set_params(schedule=schedule, tol=1e-15, max_sweeps=500)
    stages = _fit_interrupted(model, X, y, max_sweeps=500)
    assert "EP sweep" in stages
    np.testing.assert_array_equal(model.predict_proba(X[:50]), before)     # not half-fitted
    assert model.X_train_.shape[0] == 100
    assert _public_fitted_attributes(model) == attributes
    model.set_params(tol=1e-4, max_sweeps=200).fit(X[:200], y[:200])       # the process keeps working
    assert model.X_train_.shape[0] == 200


def test_sparse_ep_sweep_stops_on_ctrl_c():
    X, y = _toy(20_000, p=2)
    model = fastep.SparseGPClassifier(RBF(2.0, 1.0), n_inducing=60, optimizer=None, tol=1e-15, max_sweeps=500,
                                      random_state=0)
    assert "EP sweep" in _fit_interrupted(model, X, y, max_sweeps=500)
    assert _public_fitted_attributes(model) == []


def test_linear_ep_sweep_stops_on_ctrl_c():
    X, y = _toy(20_000, p=40)
    model = fastep.LinearEPClassifier(tol=1e-300, max_sweeps=500)
    assert "EP sweep" in _fit_interrupted(model, X, y, max_sweeps=500)
    assert _public_fitted_attributes(model) == []


def test_ivm_selection_stops_on_ctrl_c(monkeypatch):
    """The selection asks for one kernel column per inclusion: the interrupt is sent after the
    fifth, and the selection must not take more than one more."""
    X, y = _toy(20_000, p=5)
    d = 500
    model = fastep.IVMClassifier(RBF(1.0, 0.5), active_set_size=d, optimizer=None)
    column = KernelColumns.__call__

    def select(mark):
        def counted_column(self, j):
            mark(j)
            return column(self, j)
        monkeypatch.setattr(KernelColumns, "__call__", counted_column)
        try:
            model.fit(X, y)
        finally:
            monkeypatch.setattr(KernelColumns, "__call__", column)

    columns, sent = _run_interrupted(select, after=5)
    assert len(columns) - sent <= 1, f"{len(columns) - sent} kernel columns were fetched after the interrupt"
    assert len(columns) < d
    assert _public_fitted_attributes(model) == []
    model.set_params(active_set_size=20).fit(X[:500], y[:500])                # the process keeps working
    assert len(model.active_set_) == 20


def test_ivm_refinement_sweeps_stop_on_ctrl_c_and_leave_the_state_as_it_was():
    """The EP sweeps over an IVM active set poll between sites (every ~1e6 / k² of them); the
    interrupt is sent once sweep 1 has been reported, and the state's sites, factors and
    marginals are those before the call."""
    from fastep._epcore import ivm
    X, y = _toy(1500, p=5)
    cols = RBF(1.0, 0.5).columns(X)
    state = ivm.IVMEP(y.astype(float), fastep.Probit().site_spec(), cols.diag, 300)
    state.select(300, cols)
    names = ("site_mean", "site_precision", "post_mean", "post_var", "M", "L", "g", "nu")
    before = {name: np.array(getattr(state, name)) for name in names}
    max_sweeps = 500           # tol 0: the sweeps run on (about 0.1 s each here)
    marks, sent = _run_interrupted(lambda mark: state.refine(cols, n_sweeps=max_sweeps, tol=0.0, callback=mark))
    assert marks == list(range(1, len(marks) + 1))
    assert len(marks) - sent <= 1, f"{len(marks) - sent} sweeps were reported after the interrupt"
    assert len(marks) < max_sweeps
    for name in names:
        np.testing.assert_array_equal(getattr(state, name), before[name], err_msg=name)
    assert state.refine(cols, n_sweeps=3).n_sweeps == 3                    # the state keeps working


def test_interrupt_checks_can_be_switched_off_for_benchmarks_only():
    previous = _common.set_interrupt_checks(False)
    try:
        assert previous is True
        X, y = _toy(300)
        fastep.GaussianProcessClassifier(RBF(4.0, 1.0), optimizer=None).fit(X, y)
    finally:
        assert _common.set_interrupt_checks(previous) is False
