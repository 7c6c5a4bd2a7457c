"""Progress of long fits: ``verbose`` through logging (or stderr), the ``callback`` records, a
clean stop when the callback returns False, and the engines' per-sweep hook."""
import logging
import warnings

import numpy as np
import pytest

import fastep
from engine_helpers import run_gp_ep, run_rank_k_ep, run_sparse_ep
from support import ESTIMATORS as REGISTRY
from fastep import ConvergenceWarning, ProgressRecord
from fastep._epcore import gp_ep, linear_ep
from fastep._epcore.rank_k_ep import RankKLikelihood
from fastep.kernels import RBF


def _data(seed=0, n=80):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y_binary = np.where(X[:, 0] + 0.4 * rng.normal(size=n) > 0, 1, -1)
    y_real = X[:, 0] - 0.5 * X[:, 1] + 0.1 * rng.normal(size=n)
    return X, y_binary, y_real


def _estimators():
    """Every registered estimator with its problem: ``{name: (class, parameters, X, y)}``."""
    X, yb, yr = _data()
    rng = np.random.default_rng(1)
    Xk = rng.normal(size=(60, 2, 3))
    Yk = Xk @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=(60, 2))
    data = {"binary": (X, yb), "regression": (X, yr), "ordinal": (X, np.digitize(yr, [-0.5, 0.5])),
            "multitask": ([X[:40], X[40:]], [yr[:40], yr[40:]]), "rank_k": (Xk, Yk)}
    overrides = {
        "SparseGPClassifier": {"n_inducing": 10},
        "SparseGPRegressor": {"n_inducing": 10},
        "IVMClassifier": {"active_set_size": 20, "n_iterations": 2},
        "IVMRegressor": {"active_set_size": 20, "n_iterations": 2},
        "IVMOrdinalRegressor": {"active_set_size": 20, "n_iterations": 1},
        "HorseshoeRegression": {"max_optimizer_iter": 5},
    }
    return {name: (spec.cls, {**spec.params, **overrides.get(name, {})}, *data[spec.task])
            for name, spec in REGISTRY.items()}


ESTIMATORS = _estimators()
# the finest stage each estimator reports (with verbose=2 / to the callback)
SWEEPING = {"GaussianProcessClassifier", "GaussianProcessRegressor", "SparseGPClassifier", "SparseGPRegressor",
            "LinearEPClassifier", "LinearEPRegressor", "LinearEPRankK"}


def _fit(name, **extra):
    cls, params, X, y = ESTIMATORS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return cls(**params, **extra).fit(X, y)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_callback_receives_records_from_every_estimator(name):
    records = []
    model = _fit(name, callback=records.append)
    assert records and all(isinstance(r, ProgressRecord) for r in records)
    assert {r.estimator for r in records} == {type(model).__name__}
    assert records[-1].stage.endswith("done")
    elapsed = [r.elapsed for r in records]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0.0
    stages = {r.stage for r in records}
    if name in SWEEPING:
        assert "EP sweep" in stages
        sweeps = [r for r in records if r.stage == "EP sweep"]
        assert all(r.iteration >= 1 and r.change >= 0.0 for r in sweeps)
    if name.startswith(("Gaussian", "Sparse", "Horseshoe", "MultiTask")):
        assert "type-II ML" in stages
        search = [r.log_marginal_likelihood for r in records if r.stage == "type-II ML"]
        assert np.all(np.isfinite(search) | (np.array(search) == -np.inf))
    if name.startswith("IVM"):                  # the full-data objective's search, then the round's record
        assert "Algorithm 2 full data" in stages and "type-II ML" in stages


@pytest.mark.parametrize("name", ["GaussianProcessClassifier", "IVMClassifier", "HorseshoeRegression",
                                  "LinearEPRegressor"])
def test_verbose_writes_to_stderr_without_logging_configuration(name, capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger("fastep"), "hasHandlers", lambda: False)
    _fit(name, verbose=1)
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert lines and all(line.startswith(f"{name}: ") for line in lines)
    assert "elapsed" in lines[-1] and "done" in lines[-1]
    quiet = _fit(name, verbose=0)
    assert quiet is not None and capsys.readouterr().err == ""


def test_verbose_levels_go_to_the_fastep_logger_when_configured(caplog):
    with caplog.at_level(logging.INFO, logger="fastep"):
        _fit("SparseGPClassifier", verbose=1)
    level1 = [r.getMessage() for r in caplog.records if r.name == "fastep"]
    assert level1 and not any("EP sweep" in m for m in level1) and any("type-II ML" in m for m in level1)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastep"):
        _fit("SparseGPClassifier", verbose=2)
    level2 = [r.getMessage() for r in caplog.records if r.name == "fastep"]
    assert any("EP sweep" in m for m in level2) and len(level2) > len(level1)


def test_stopping_the_search_keeps_the_best_hyperparameters_so_far():
    X, y, _ = _data(2, 120)
    seen = []

    def stop_after_three(record):
        if record.stage == "type-II ML":
            seen.append(record)
            return record.iteration < 3

    with pytest.warns(ConvergenceWarning, match=r"stopped by the callback after type-II ML 3"):
        model = fastep.GaussianProcessClassifier(callback=stop_after_three).fit(X, y)
    assert len(seen) == 3
    full = fastep.GaussianProcessClassifier().fit(X, y)
    assert model.kernel_.theta.tolist() != full.kernel_.theta.tolist()
    # the kept point is the best of the three evaluated (the search reports its objective,
    # the evidence plus the hyperprior); EP ran to `tol` there
    best = max(seen, key=lambda r: r.log_marginal_likelihood)
    assert model.log_hyperposterior_value_ == pytest.approx(best.log_marginal_likelihood, abs=0.05)
    assert model.converged_ and model.score(X, y) > 0.7


def test_stopping_the_sweeps_returns_the_current_sites():
    X, y, _ = _data(3, 100)
    stop = lambda record: not (record.stage == "EP sweep" and record.iteration == 2)  # noqa: E731
    with pytest.warns(ConvergenceWarning, match="stopped by the callback after EP sweep 2"):
        model = fastep.GaussianProcessClassifier(RBF(2.0, 0.5), optimizer=None, tol=1e-10, callback=stop).fit(X, y)
    assert model.n_sweeps_ == 2 and not model.converged_
    capped = fastep.GaussianProcessClassifier(RBF(2.0, 0.5), optimizer=None, tol=1e-10, max_sweeps=2)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        capped.fit(X, y)
    np.testing.assert_allclose(model.site_precision_, capped.site_precision_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(model.predict_proba(X), capped.predict_proba(X), rtol=1e-12)


def test_stopping_algorithm_2_keeps_the_stage_reached():
    X, y, _ = _data(4, 120)
    stop = lambda record: record.stage != "Algorithm 2 kernel"  # noqa: E731
    with pytest.warns(ConvergenceWarning, match="stopped by the callback after Algorithm 2 kernel 1"):
        model = fastep.IVMClassifier(active_set_size=30, n_iterations=4, callback=stop,
                                     kernel_objective="active_set").fit(X, y)
    assert [h["stage"] for h in model.history_] == ["kernel"]
    assert model.score(X, y) > 0.7
    stop = lambda record: record.stage != "Algorithm 2 full data"  # noqa: E731
    with pytest.warns(ConvergenceWarning, match="stopped by the callback after Algorithm 2 full data 1"):
        model = fastep.IVMClassifier(active_set_size=30, n_iterations=4, callback=stop).fit(X, y)
    assert [h["stage"] for h in model.history_] == ["full data"]
    assert model.score(X, y) > 0.7


def test_the_ivm_refinement_reports_its_sweeps_and_stops_at_the_callback():
    X, y, _ = _data(6, 120)
    common = dict(kernel=RBF(1.0, 0.5), optimizer=None, active_set_size=25, refine_sweeps=50, exchange="greedy")
    records = []
    model = fastep.IVMClassifier(callback=records.append, **common).fit(X, y)
    sweeps = [r for r in records if r.stage == "EP sweep"]
    ep = model.refinement_["ep"]
    assert [r.iteration for r in sweeps[:ep.n_sweeps]] == list(range(1, ep.n_sweeps + 1))
    assert sweeps[ep.n_sweeps - 1].change == ep.max_change
    assert np.all(np.isfinite([r.log_marginal_likelihood for r in sweeps]))
    quiet = fastep.IVMClassifier(**common).fit(X, y)                  # listening changes nothing
    np.testing.assert_array_equal(model.site_mean_, quiet.site_mean_)
    assert model.refinement_ == quiet.refinement_
    stop = lambda record: not (record.stage == "EP sweep" and record.iteration == 2)  # noqa: E731
    with pytest.warns(ConvergenceWarning, match="stopped by the callback after EP sweep 2"):
        stopped = fastep.IVMClassifier(callback=stop, **common).fit(X, y)
    assert set(stopped.refinement_) == {"ep"} and stopped.refinement_["ep"].stopped
    assert stopped.refinement_["ep"].n_sweeps == 2 and stopped.score(X, y) > 0.7


def test_stopping_the_horseshoe_search():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 30))
    y = X[:, :3] @ np.array([2.0, -2.0, 1.5]) + 0.3 * rng.normal(size=40)
    stop = lambda record: not (record.stage == "type-II ML" and record.iteration >= 4)  # noqa: E731
    with pytest.warns(ConvergenceWarning, match="stopped by the callback after type-II ML 4"):
        model = fastep.HorseshoeRegression(callback=stop).fit(X, y)
    assert model.n_evaluations_ == 4 and np.all(np.isfinite(model.coef_))


def test_an_exception_in_the_callback_propagates_and_leaves_the_fitted_model_unchanged():
    X, y, _ = _data(5, 80)
    model = fastep.GaussianProcessClassifier(RBF(1.0, 0.5), optimizer=None).fit(X, y)
    before = model.predict_proba(X).copy()

    class Interrupt(Exception):
        pass

    def boom(record):
        raise Interrupt

    for estimator_setting in ({"optimizer": None}, {"optimizer": "L-BFGS-B"}):
        model.set_params(callback=boom, **estimator_setting)
        with pytest.raises(Interrupt):
            model.fit(X[:60], y[:60])
        assert model.n_features_in_ == 3 and model.X_train_.shape[0] == 80
        np.testing.assert_array_equal(model.predict_proba(X), before)


def test_bad_verbose_and_callback_are_refused():
    X, y, _ = _data()
    for params, exc, word in [({"verbose": 3}, ValueError, "verbose"), ({"verbose": "yes"}, TypeError, "verbose"),
                              ({"callback": 5}, TypeError, "callback")]:
        for cls in (fastep.GaussianProcessClassifier, fastep.LinearEPClassifier, fastep.HorseshoeRegression):
            with pytest.raises(exc, match=word):
                cls(**params).fit(X, y if cls is not fastep.HorseshoeRegression else X[:, 0])


def test_a_saved_model_drops_its_callback_with_a_warning():
    import io
    model = _fit("LinearEPClassifier", callback=lambda record: None)
    buffer = io.BytesIO()
    with pytest.warns(UserWarning, match="callback .* is not saved"):
        fastep.save(model, buffer)
    buffer.seek(0)
    loaded = fastep.load(buffer)
    assert loaded.callback is None and model.callback is not None


# -- the engines' sweep_callback ------------------------------------------------------------------

def _gp_problem(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    K = 4.0 * np.exp(-0.5 * np.sum((X[:, None] - X[None]) ** 2, axis=-1)) + 1e-8 * np.eye(n)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, K, y


@pytest.mark.parametrize("schedule", [gp_ep.SCHEDULE_SEQUENTIAL, gp_ep.SCHEDULE_BLOCKED, gp_ep.SCHEDULE_PARALLEL])
@pytest.mark.parametrize("refresh_every", [1, 3])
def test_gp_engine_stopped_by_the_callback_equals_a_run_capped_at_that_sweep(schedule, refresh_every):
    _, K, y = _gp_problem()
    spec = fastep.Probit().site_spec()
    n = y.shape[0]

    def run(**kwargs):
        tau, nu, cov, mean = np.zeros(n), np.zeros(n), np.empty((n, n)), np.empty(n)
        info = run_gp_ep(K, y, spec, tau, nu, cov, mean, schedule=schedule, tol=1e-12,
                         refresh_every=refresh_every, **kwargs)
        return info, tau, nu, cov, mean

    calls = []
    stopped = run(sweep_callback=lambda s, c, z: calls.append((s, c, z)) or s < 2)
    capped = run(max_sweeps=2)
    assert [s for s, _, _ in calls] == [1, 2] and stopped[0].stopped and not capped[0].stopped
    assert stopped[0].n_sweeps == 2 == capped[0].n_sweeps
    for a, b in zip(stopped[1:], capped[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert stopped[0].log_z == pytest.approx(capped[0].log_z, rel=1e-12)


def test_an_engine_callback_exception_restores_the_sites():
    _, K, y = _gp_problem()
    n = y.shape[0]
    tau, nu = np.full(n, 0.1), np.zeros(n)
    saved = tau.copy(), nu.copy()

    def interrupt(sweep, change, log_z):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_gp_ep(K, y, fastep.Probit().site_spec(), tau, nu, np.empty((n, n)), np.empty(n),
                  sweep_callback=interrupt)
    np.testing.assert_array_equal(tau, saved[0])
    np.testing.assert_array_equal(nu, saved[1])


def test_sparse_linear_and_rank_k_engines_stop_on_request():
    X, K, y = _gp_problem()
    n = y.shape[0]
    spec = fastep.Probit().site_spec()
    Z = X[:8]
    Kmm = 4.0 * np.exp(-0.5 * np.sum((Z[:, None] - Z[None]) ** 2, axis=-1)) + 1e-6 * np.eye(8)
    Knm = 4.0 * np.exp(-0.5 * np.sum((X[:, None] - Z[None]) ** 2, axis=-1))
    L = np.linalg.cholesky(Kmm)
    Vt = np.ascontiguousarray(np.linalg.solve(L, Knm.T).T)
    d = np.maximum(4.0 - np.sum(Vt ** 2, axis=1), 0.0)
    out = run_sparse_ep(Vt, d, y, spec, np.zeros(n), np.zeros(n), np.empty((8, 8)), np.empty(8),
                        tol=1e-12, sweep_callback=lambda s, c, z: s < 3)
    assert out.stopped and out.n_sweeps == 3 and np.isfinite(out.log_z)

    design = np.ascontiguousarray(X)
    direct = linear_ep.LinearEP(design, y, np.zeros(2), np.eye(2), spec, linear_ep.LinearEPOptions(tol=1e-14)).run(
        np.zeros(n), np.zeros(n), np.empty(2), np.empty((2, 2)), sweep_callback=lambda s, c, z: s < 2)
    assert direct.stopped and direct.n_sweeps == 2

    rng = np.random.default_rng(0)
    Xk = rng.normal(size=(30, 2, 3))
    Yk = Xk @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=(30, 2))
    sites = np.zeros((30, 2, 2)), np.zeros((30, 2))
    res = run_rank_k_ep(Xk, Yk, np.zeros(3), np.eye(3), RankKLikelihood.mvgaussian(np.eye(2)), *sites,
                        np.empty(3), np.empty((3, 3)), tol=0.0, max_sweeps=50,
                        sweep_callback=lambda s, c, z: s < 2)
    assert res.stopped and res.n_sweeps == 2


# -- fastep.progress.ProgressBar ------------------------------------------------------------------

class _Terminal:
    """A stream that says it is a terminal and keeps what was written."""

    def __init__(self):
        self.parts = []

    def isatty(self):
        return True

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass

    def getvalue(self):
        return "".join(self.parts)


def test_progress_bar_plain_lines_skip_sweeps():
    import io
    from fastep.progress import ProgressBar
    stream = io.StringIO()
    bar = ProgressBar(stream)                          # not a terminal: plain lines
    assert bar.backend == "plain"
    model = _fit("SparseGPClassifier", callback=bar)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines and all(line.startswith("SparseGPClassifier: ") for line in lines)
    assert not any("EP sweep" in line for line in lines) and "done" in lines[-1]
    assert model.callback is bar


def test_progress_bar_status_line_on_a_terminal():
    from fastep.progress import ProgressBar
    stream = _Terminal()
    bar = ProgressBar(stream, backend="line", min_interval=0.0)
    _fit("GaussianProcessClassifier", callback=bar)
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") >= 3 and text.endswith("\n") and text.count("\n") == 1
    assert "GaussianProcessClassifier: done" in text.split("\r")[-1]


def test_progress_bar_with_tqdm_or_a_clear_import_error(monkeypatch):
    import builtins
    from fastep.progress import ProgressBar
    pytest.importorskip("tqdm")
    stream = _Terminal()
    bar = ProgressBar(stream, backend="tqdm")
    _fit("LinearEPClassifier", callback=bar)
    bar.close()
    assert bar.backend == "tqdm" and "LinearEPClassifier: done" in stream.getvalue()
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with pytest.raises(ImportError, match=r"fastep\[progress\]"):
        ProgressBar(stream, backend="tqdm")
    assert ProgressBar(_Terminal()).backend == "line"          # auto without tqdm
    with pytest.raises(ValueError, match="backend"):
        ProgressBar(stream, backend="fancy")


def test_log_evidence_is_a_deprecated_alias_of_log_marginal_likelihood():
    record = ProgressRecord("GaussianProcessClassifier", "done", 3, -12.5, 0.5, 0.25)
    assert record._fields == ("estimator", "stage", "iteration", "log_marginal_likelihood", "change", "elapsed")
    with pytest.warns(FutureWarning, match="log_evidence is deprecated.*use log_marginal_likelihood"):
        old = record.log_evidence
    assert old == record.log_marginal_likelihood == record[3] == -12.5
    assert record == ("GaussianProcessClassifier", "done", 3, -12.5, 0.5, 0.25)
