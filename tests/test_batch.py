"""fastep.batch.fit_many: many independent fits in a thread pool or on a Dask cluster."""
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import fastep
from fastep.batch import BatchProgress, effective_n_jobs, fit_many
from fastep.kernels import RBF


def _datasets(count, n=60, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        X = rng.normal(size=(n, 2))
        y = np.where(X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1, 0)
        out.append((X, y))
    return out


def _proba(models, datasets):
    return [m.predict_proba(X) for m, (X, _) in zip(models, datasets)]


def test_thread_pool_results_are_bitwise_identical_for_every_n_jobs_and_in_input_order():
    datasets = _datasets(6)
    est = fastep.GaussianProcessClassifier(RBF())
    one = fit_many(est, datasets, n_jobs=1)
    two = fit_many(est, datasets, n_jobs=2)
    assert all(isinstance(m, fastep.GaussianProcessClassifier) for m in two)
    for a, b in zip(_proba(one, datasets), _proba(two, datasets)):
        assert np.array_equal(a, b)
    # input order: each model is the one fitted on its own data set (alone, with the default BLAS
    # threads: other rounding, and type-II ML searches with EP to 1e-2, so the learnt evidence
    # agrees to about 1e-4 relative; on a near-separable set the learnt variance slides along a
    # flat ridge, so the probabilities agree to ~1e-3 absolute, while another set's model is off
    # by far more)
    for model, (X, y) in zip(two, datasets):
        alone = fastep.GaussianProcessClassifier(RBF()).fit(X, y)
        assert model.log_marginal_likelihood_value_ == pytest.approx(alone.log_marginal_likelihood_value_, rel=1e-4)
        np.testing.assert_allclose(model.predict_proba(X), alone.predict_proba(X), atol=1e-2)
    wrong = [np.max(np.abs(m.predict_proba(X) - fastep.GaussianProcessClassifier(RBF()).fit(X, y).predict_proba(X)))
             for m, (X, y) in zip(two[1:] + two[:1], datasets)]
    assert min(wrong) > 0.05                           # the check above tells the models apart
    assert not hasattr(est, "classes_")                 # the template is never fitted


def test_thread_counts_are_restored_after_the_batch():
    before = [(i["filepath"], i["num_threads"]) for i in threadpool_info()]
    fit_many(fastep.LinearEPClassifier(), _datasets(3), n_jobs=2)
    assert [(i["filepath"], i["num_threads"]) for i in threadpool_info()] == before


def test_a_list_of_estimators_on_one_data_set_is_a_grid():
    (X, y), = _datasets(1)
    grid = [fastep.GaussianProcessClassifier(RBF(1.0, g), optimizer=None) for g in (0.1, 1.0, 10.0)]
    models = fit_many(grid, [(X, y)], n_jobs=2)
    assert [m.kernel.get_params()["inverse_width"] for m in models] == [0.1, 1.0, 10.0]
    scores = [m.log_marginal_likelihood_value_ for m in models]
    assert len(set(scores)) == 3


def test_collect_keeps_the_other_fits_and_raise_raises():
    datasets = _datasets(4)
    X_bad = datasets[2][0].copy()
    X_bad[0, 0] = np.nan
    datasets[2] = (X_bad, datasets[2][1])
    for n_jobs in (None, 2):
        out = fit_many(fastep.LinearEPClassifier(), datasets, n_jobs=n_jobs, on_error="collect")
        assert isinstance(out[2], ValueError) and "X must be finite" in str(out[2])
        assert all(isinstance(out[i], fastep.LinearEPClassifier) for i in (0, 1, 3))
        with pytest.raises(ValueError, match="X must be finite"):
            fit_many(fastep.LinearEPClassifier(), datasets, n_jobs=n_jobs)


def test_progress_reports_every_fit():
    reports = []
    datasets = _datasets(5)
    fit_many(fastep.LinearEPClassifier(), datasets, n_jobs=2, progress=reports.append)
    assert [r.n_done for r in reports] == [1, 2, 3, 4, 5]
    assert sorted(r.index for r in reports) == [0, 1, 2, 3, 4]
    assert all(isinstance(r, BatchProgress) and r.n_total == 5 and not r.failed for r in reports)
    assert all(b.elapsed >= a.elapsed for a, b in zip(reports, reports[1:]))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(n_jobs=0), ValueError, "n_jobs"),
    (dict(n_jobs=1.5), ValueError, "n_jobs"),
    (dict(on_error="ignore"), ValueError, "on_error"),
    (dict(progress=3), TypeError, "progress"),
])
def test_bad_options_are_named(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fit_many(fastep.LinearEPClassifier(), _datasets(2), **kwargs)


def test_bad_datasets_and_estimators_are_named():
    X, y = _datasets(1)[0]
    with pytest.raises(TypeError, match=r"\[\(X, y\)\]"):
        fit_many(fastep.LinearEPClassifier(), (X, y))
    with pytest.raises(TypeError, match=r"datasets\[1\]"):
        fit_many(fastep.LinearEPClassifier(), [(X, y), X])
    with pytest.raises(ValueError, match="2 estimators and 3 data sets"):
        fit_many([fastep.LinearEPClassifier()] * 2, _datasets(3))
    with pytest.raises(TypeError, match="estimator"):
        fit_many("svm", [(X, y)])


def test_effective_n_jobs():
    assert effective_n_jobs(None) == 1 and effective_n_jobs(4) == 4
    assert 1 <= effective_n_jobs(-1) and effective_n_jobs(-1) >= effective_n_jobs(-2)


def test_client_without_dask_names_the_extra():
    script = textwrap.dedent("""
        import sys

        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name in ("distributed", "dask") or name.startswith(("distributed.", "dask.")):
                    raise ImportError("blocked")

        sys.meta_path.insert(0, _Block())
        import numpy as np
        import fastep
        from fastep.batch import fit_many
        X = np.random.default_rng(0).normal(size=(10, 2))
        try:
            fit_many(fastep.LinearEPRegressor(), [(X, X[:, 0])], client=object())
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'pip install "fastep[dask]"' in out.stdout


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.cluster
def test_dask_cluster_fits_equal_the_thread_pool_fits(client):
    datasets = _datasets(5, seed=3)
    est = fastep.GaussianProcessClassifier(RBF())
    local = fit_many(est, datasets, n_jobs=2)
    remote = fit_many(est, datasets, client=client)
    assert len(client.scheduler_info()["workers"]) == 2
    for a, b in zip(_proba(local, datasets), _proba(remote, datasets)):
        assert np.array_equal(a, b)


@pytest.mark.cluster
def test_dask_scatters_each_array_once_and_collects_errors(client, monkeypatch):
    (X, y), = _datasets(1, seed=4)
    calls = []
    original = client.scatter

    def counting(data, *args, **kwargs):
        calls.append(id(data))
        return original(data, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", counting)
    grid = [fastep.LinearEPClassifier(prior_cov=v) for v in (0.1, 1.0, 10.0, -1.0)]
    reports = []
    out = fit_many(grid, [(X, y)], client=client, on_error="collect", progress=reports.append)
    assert sorted(calls) == sorted([id(X), id(y)])          # X and y sent once for four fits
    assert all(isinstance(m, fastep.LinearEPClassifier) for m in out[:3])
    assert isinstance(out[3], ValueError) and "prior_cov" in str(out[3])
    assert sorted(r.index for r in reports) == [0, 1, 2, 3] and sum(r.failed for r in reports) == 1
    with pytest.raises(ValueError, match="prior_cov"):
        fit_many(grid, [(X, y)], client=client)


@pytest.mark.cluster
def test_a_scatter_that_fails_as_a_worker_dies_is_retried(client, monkeypatch):
    # The scheduler answers a scatter to a worker it has just removed with a KeyError naming it.
    (X, y), = _datasets(1, seed=4)
    original, failures = client.scatter, []

    def dying_once(data, *args, **kwargs):
        if not failures:
            failures.append(data)
            raise KeyError("tcp://127.0.0.1:1")
        return original(data, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", dying_once)
    est = fastep.LinearEPClassifier()
    out = fit_many(est, [(X, y)], client=client)
    assert len(failures) == 1
    assert np.array_equal(out[0].predict_proba(X), fit_many(est, [(X, y)], n_jobs=1)[0].predict_proba(X))


@pytest.mark.cluster
def test_a_scatter_that_always_fails_raises_its_error(client, monkeypatch):
    (X, y), = _datasets(1, seed=4)

    def broken(data, *args, **kwargs):
        raise TypeError("cannot serialise")

    monkeypatch.setattr(client, "scatter", broken)
    with pytest.raises(TypeError, match="cannot serialise"):
        fit_many(fastep.LinearEPClassifier(), [(X, y)], client=client)


def _three_classes(n=150, seed=5):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [2.5, 0.0], [0.0, 2.5]])
    labels = rng.integers(0, 3, size=n)
    return centres[labels] + rng.normal(size=(n, 2)), np.array(["a", "b", "c"])[labels]


@pytest.mark.parametrize("make", [
    lambda n_jobs: fastep.GaussianProcessClassifier(RBF(), n_jobs=n_jobs),
    lambda n_jobs: fastep.SparseGPClassifier(n_inducing=8, n_jobs=n_jobs),
    lambda n_jobs: fastep.IVMClassifier(active_set_size=30, n_iterations=2, n_jobs=n_jobs),
], ids=["GPC", "SGPC", "IVM"])
def test_one_vs_rest_n_jobs_gives_bitwise_identical_fits(make):
    X, y = _three_classes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        one = make(1).fit(X, y)
        two = make(2).fit(X, y)
        serial = make(None).fit(X, y)
    assert np.array_equal(one.predict_proba(X), two.predict_proba(X))
    assert list(two.classes_) == ["a", "b", "c"]
    # None keeps the process's BLAS threads: the same model up to round-off
    assert np.mean(serial.predict(X) == two.predict(X)) > 0.95
    with pytest.raises(ValueError, match="n_jobs"):
        make(0).fit(X, y)


# -- failure injection -------------------------------------------------------------------------

def test_unconverged_fits_are_reported_per_task_and_kept():
    datasets = _datasets(4, seed=9)
    grid = [fastep.GaussianProcessClassifier(RBF(4.0, 1.0), optimizer=None, max_sweeps=s, tol=1e-10)
            for s in (200, 1, 200, 1)]
    for n_jobs in (None, 2):
        reports = []
        with pytest.warns(fastep.ConvergenceWarning, match=r"2 of 4 fits did not converge .* positions \[1, 3\]"):
            out = fit_many(grid, datasets, n_jobs=n_jobs, progress=reports.append)
        assert [m.converged_ for m in out] == [True, False, True, False]
        by_index = {r.index: r.converged for r in reports}
        assert by_index == {0: True, 1: False, 2: True, 3: False}


def test_a_failing_fit_is_reported_per_task_with_the_others_kept():
    datasets = _datasets(5, seed=10)
    datasets[3] = (datasets[3][0], np.zeros(60, dtype=int))           # one class: the fit raises
    reports = []
    out = fit_many(fastep.GaussianProcessClassifier(RBF(), optimizer=None), datasets, n_jobs=2,
                   on_error="collect", progress=reports.append)
    assert isinstance(out[3], ValueError) and "two classes" in str(out[3])
    assert all(isinstance(out[i], fastep.GaussianProcessClassifier) and out[i].converged_ for i in (0, 1, 2, 4))
    assert {r.index: (r.failed, r.converged) for r in reports}[3] == (True, None)


def _kill_a_busy_worker(client, deadline=60.0):
    """SIGKILL the process of a worker that is running a task (waits until one is)."""
    import os
    import signal
    import time
    pids = client.run(os.getpid)
    start = time.perf_counter()
    while time.perf_counter() - start < deadline:
        busy = [address for address, keys in client.processing().items() if keys]
        if busy:
            time.sleep(0.3)                      # let the fit get going
            os.kill(pids[busy[0]], signal.SIGKILL)
            return busy[0]
        time.sleep(0.05)
    raise AssertionError("no worker started a task")


def _slow_datasets():
    return _datasets(4, n=500, seed=11)


def _fit_many_while_killing(client, on_error):
    import threading
    box = {}

    def run():
        try:
            box["out"] = fit_many(fastep.GaussianProcessClassifier(RBF(), tol=1e-8), _slow_datasets(), client=client,
                                  on_error=on_error)
        except BaseException as exc:            # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    _kill_a_busy_worker(client)
    thread.join(timeout=600)
    assert not thread.is_alive()
    return box


@pytest.mark.cluster
def test_a_worker_killed_mid_fit_is_retried_and_no_fit_is_lost(client):
    box = _fit_many_while_killing(client, on_error="raise")
    assert "error" not in box, box.get("error")
    out = box["out"]
    local = fit_many(fastep.GaussianProcessClassifier(RBF(), tol=1e-8), _slow_datasets(), n_jobs=1)
    assert len(out) == 4
    for a, b in zip(_proba(out, _slow_datasets()), _proba(local, _slow_datasets())):
        assert np.array_equal(a, b)                # every model complete: the killed fit ran again elsewhere


@pytest.mark.cluster
def test_a_worker_killed_once_too_often_is_that_fits_failure():
    distributed = pytest.importorskip("distributed")
    import dask
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        try:
            box = _fit_many_while_killing(client, on_error="collect")
        finally:
            client.close()
            cluster.close()
    assert "error" not in box, box.get("error")
    out = box["out"]
    failed = [i for i, r in enumerate(out) if isinstance(r, BaseException)]
    assert len(failed) >= 1 and all(type(out[i]).__name__ == "KilledWorker" for i in failed)
    kept = [r for r in out if not isinstance(r, BaseException)]
    assert kept and all(m.converged_ and np.isfinite(m.log_marginal_likelihood_value_) for m in kept)
