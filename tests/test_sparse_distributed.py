"""Sparse EP over row chunks (fastep._sparse.distributed): the map-reduce form of the parallel schedule.

Oracles: the reference twin of the chunk step (fastep.reference.sparse_ep.parallel_chunk_step),
the in-core compiled engine with schedule=SPARSE_PARALLEL (same iterates, same fixed point),
the in-core estimators, and a real dask.distributed.LocalCluster (two worker processes on the
loopback interface, started and closed here).
"""
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="the dask extra is not installed")
distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")

from fastep import Logistic, Probit, SparseGPClassifier, SparseGPRegressor
from fastep._sparse import distributed as chunked
from fastep._search.start import default_kernel
from fastep._epcore import sparse_ep as engine
from fastep.kernels import RBF
from fastep.likelihoods import Gaussian
from fastep.reference import sites as ref_sites
from fastep.reference import sparse_ep as ref
from fastep._sparse.problem import _BinarySparseEP

def _data(n, seed, classes=2, dim=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, dim))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    if classes == 2:
        y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    else:
        y = np.digitize(f + 0.3 * rng.standard_normal(n), np.quantile(f, np.linspace(0, 1, classes + 1)[1:-1]))
    return X, y, f + 0.2 * rng.standard_normal(n)


def _options(**changes):
    return SparseGPClassifier(schedule="parallel")._fit_options().replace(**changes)


def _split(X, y, sizes):
    edges = np.cumsum([0] + list(sizes))
    return [chunked.Chunk(X[a:b], y[a:b]) for a, b in zip(edges[:-1], edges[1:])]


# --------------------------------------------------------------------------------------------
# the compiled chunk step and its reference twin
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("power", [1.0, 0.5])
def test_chunk_step_equals_its_reference_twin(power):
    X, y, _ = _data(60, seed=1)
    k = RBF(variance=1.5, inverse_width=0.7)
    Z = X[::6]
    L, Vt, d = engine.sparse_projection(k(Z), np.ascontiguousarray(k(X, Z)), k.diag(X), jitter=1e-8)
    rng = np.random.default_rng(2)
    # a state away from the fixed point: some large sites, some zero, mixed signs of nu
    tau = rng.gamma(0.5, 2.0, size=60) * (rng.random(60) < 0.8)
    nu = rng.normal(scale=2.0, size=60)
    A = np.eye(Vt.shape[1]) + (Vt.T * tau) @ Vt
    R = np.linalg.cholesky(A).T.copy()
    w_cov = np.linalg.inv(A)
    w_mean = w_cov @ (Vt.T @ nu)
    block = slice(17, 49)
    got = engine._parallel_chunk_step(Vt[block], d[block], y[block], Probit().site_spec(), tau[block],
                                      nu[block], R, w_mean, power=power, n_quadrature=64, damping=0.7)
    pm = ref.power_moments(lambda yy, m, v: ref_sites.probit_moments(yy, m, v),
                           ref.quadrature_power_moments(ref.probit_log_lik) if power < 1 else None)
    want = ref.parallel_chunk_step(Vt[block].T, d[block], y[block], pm, tau[block], nu[block], w_mean, w_cov,
                                   power=power, damping=0.7)
    np.testing.assert_allclose(got["g_mean"], want["g_mean"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["g_var"], want["g_var"], rtol=1e-10)
    np.testing.assert_allclose(got["log_z_sites"], want["log_z_sites"], rtol=1e-7)
    np.testing.assert_allclose(got["site_precision"], want["site_precision"], rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(got["site_natural_mean"], want["site_natural_mean"], rtol=1e-6, atol=1e-10)
    for key in ("n_clipped", "n_skipped", "n_failed"):
        assert got[key] == want[key]
    np.testing.assert_allclose(got["precision_sum"], np.triu(want["precision_sum"]), rtol=1e-6, atol=1e-10)
    assert not np.any(np.tril(got["precision_sum"], -1))
    np.testing.assert_allclose(got["natural_mean_sum"], want["natural_mean_sum"], rtol=1e-6, atol=1e-10)
    # the input sites are untouched and update=False only evaluates
    only = engine._parallel_chunk_step(Vt[block], d[block], y[block], Probit().site_spec(), tau[block],
                                       nu[block], R, w_mean, power=power, n_quadrature=64, update=False)
    assert set(only) == {"g_mean", "g_var", "log_z_sites", "bad_site"}
    assert only["log_z_sites"] == got["log_z_sites"]


def test_chunk_step_reports_an_improper_cavity_and_leaves_those_sites():
    X, y, _ = _data(10, seed=3)
    k = RBF()
    L, Vt, d = engine.sparse_projection(k(X[:3]), np.ascontiguousarray(k(X, X[:3])), k.diag(X), jitter=1e-8)
    tau = np.full(10, 0.5)
    tau[[2, 7]] = 1e6                 # sites far more precise than the posterior they are given
    R, w_mean = np.eye(3), np.zeros(3)
    out = engine._parallel_chunk_step(Vt, d, y, Probit().site_spec(), tau, np.zeros(10), R, w_mean)
    assert np.isnan(out["log_z_sites"]) and out["bad_site"] == 2
    assert out["n_failed"] == 2 and out["n_skipped"] == 2
    np.testing.assert_array_equal(out["site_precision"][[2, 7]], tau[[2, 7]])
    assert np.all(out["site_precision"][[0, 1, 3]] != 0.5)


def test_natural_sums_add_up_over_blocks():
    rng = np.random.default_rng(4)
    Vt = rng.normal(size=(300, 7))
    tau, nu = rng.random(300), rng.normal(size=300)
    P, b = engine._natural_sums(Vt, tau, nu)
    P1, b1 = engine._natural_sums(Vt[:120], tau[:120], nu[:120])
    P2, b2 = engine._natural_sums(Vt[120:], tau[120:], nu[120:])
    np.testing.assert_allclose(P, np.triu((Vt.T * tau) @ Vt), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(P1 + P2, P, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b1 + b2, Vt.T @ nu, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------
# the chunked driver (in process) against the in-core engine
# --------------------------------------------------------------------------------------------

CASES = {
    "probit-fitc": (Probit(), dict()),
    "probit-dtc": (Probit(), dict(approximation="dtc")),
    "probit-power": (Probit(), dict(power=0.5)),
    "logistic": (Logistic(method="gauss-hermite"), dict()),
    "gaussian": (Gaussian(noise_variance=0.3), dict(damping=0.8)),
}


def _pair(case, sizes, **changes):
    likelihood, extra = CASES[case]
    X, y_class, y_reg = _data(sum(sizes), seed=5)
    y = y_reg if case == "gaussian" else y_class
    opts = _options(**{**extra, **changes})
    kernel, Z = RBF(variance=1.4, inverse_width=0.6), X[::11].copy()
    incore = _BinarySparseEP(kernel, likelihood, Z, X, y, opts, False, True)
    local = chunked.DistributedSparseEP(kernel, likelihood, Z, chunked.LocalChunks(), _split(X, y, sizes),
                                        sizes, opts, False, True)
    return incore, local, (kernel, likelihood, Z)


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_schedule_reaches_the_in_core_fixed_point(case):
    incore, local, params = _pair(case, [70, 1, 130, 99])
    lz1, g1, info1 = incore.evaluate(params, gradient=True, warm=False, keep=True)
    lz2, g2, info2 = local.evaluate(params, gradient=True, warm=False, keep=True)
    assert info1.converged and info2.converged
    assert info1.n_sweeps == info2.n_sweeps
    for key in ("n_skipped", "n_clipped", "n_failed"):
        assert getattr(info1, key) == getattr(info2, key)
    np.testing.assert_allclose(lz2, lz1, rtol=1e-10)
    np.testing.assert_allclose(g2, g1, rtol=1e-8, atol=1e-8 * np.max(np.abs(g1)))
    np.testing.assert_allclose(local.site_precision, incore.site_precision, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(local.site_natural_mean, incore.site_natural_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(local.predictor.w_mean, incore.predictor.w_mean, rtol=1e-8, atol=1e-10)
    Xs = np.random.default_rng(6).uniform(-3, 3, size=(40, 2))
    for a, b in zip(local.latent(Xs), incore.latent(Xs)):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def test_chunked_schedule_stops_where_the_engine_stops():
    incore, local, params = _pair("probit-fitc", [150, 150], max_sweeps=3)
    _, _, info1 = incore.evaluate(params, gradient=False, warm=False, keep=True)
    _, _, info2 = local.evaluate(params, gradient=False, warm=False, keep=True)
    assert not info1.converged and not info2.converged
    assert info1.n_sweeps == info2.n_sweeps == 3
    np.testing.assert_allclose(info2.log_z, info1.log_z, rtol=1e-12)
    np.testing.assert_allclose(info2.max_change, info1.max_change, rtol=1e-8)
    np.testing.assert_allclose(local.site_precision, incore.site_precision, rtol=1e-10, atol=1e-12)


def test_warm_start_is_used_and_equals_a_cold_start():
    incore, local, (kernel, likelihood, Z) = _pair("probit-fitc", [100, 100])
    local.evaluate((kernel, likelihood, Z), gradient=False, warm=False)
    moved = kernel.clone_with_theta(kernel.theta + 0.05)
    _, _, warm = local.evaluate((moved, likelihood, Z), gradient=False, warm=True, keep=True)
    _, _, cold = incore.evaluate((moved, likelihood, Z), gradient=False, warm=False, keep=True)
    assert warm.n_sweeps < cold.n_sweeps
    np.testing.assert_allclose(warm.log_z, cold.log_z, rtol=1e-7)


# --------------------------------------------------------------------------------------------
# a real Dask cluster
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def _dask(X, y, rows):
    return da.from_array(X, chunks=(rows, X.shape[1])), da.from_array(y, chunks=rows)


def _n_length_arrays(obj, n, seen=None):
    """Names of numpy arrays with a dimension of length n reachable from ``obj``'s attributes."""
    seen = set() if seen is None else seen
    found = []
    if id(obj) in seen:
        return found
    seen.add(id(obj))
    items = (obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple))
             else vars(obj).items() if hasattr(obj, "__dict__") and type(obj).__module__.startswith("fastep")
             else ())
    for key, val in items:
        if isinstance(val, np.ndarray):
            if n in val.shape:
                found.append(key)
        else:
            found += _n_length_arrays(val, n, seen)
    return found


@pytest.mark.cluster
def test_dask_fit_equals_the_in_core_parallel_fit(client):
    X, y, _ = _data(900, seed=7)
    labels = np.where(y > 0, "yes", "no")
    kw = dict(schedule="parallel", n_inducing=12, random_state=0, optimizer=None, learn_inducing=True)
    incore = SparseGPClassifier(inducing_init="kmeans++", **kw).fit(X, labels)
    remote = SparseGPClassifier(**kw).fit(*_dask(X, labels, 250), client=client)
    assert len(client.scheduler_info()["workers"]) == 2
    np.testing.assert_array_equal(remote.classes_, incore.classes_)
    # inducing_init='auto' on a dask array: the same k-means++ as in core
    np.testing.assert_array_equal(remote.inducing_inputs_, incore.inducing_inputs_)
    # kernel=None: the same data-aware start, from rows fetched off the cluster
    np.testing.assert_array_equal(remote.kernel_.theta, incore.kernel_.theta)
    np.testing.assert_array_equal(remote.kernel_.theta, default_kernel(X).theta)
    np.testing.assert_allclose(remote.log_marginal_likelihood_value_, incore.log_marginal_likelihood_value_,
                               rtol=1e-10)
    assert remote.n_sweeps_ == incore.n_sweeps_ and remote.converged_
    np.testing.assert_allclose(remote._problems[0].predictor.w_mean, incore._problems[0].predictor.w_mean,
                               rtol=1e-8, atol=1e-10)
    assert isinstance(remote.site_precision_, da.Array)
    np.testing.assert_allclose(remote.site_precision_.compute(), incore.site_precision_, rtol=1e-8, atol=1e-10)
    Xt = np.random.default_rng(8).uniform(-3, 3, size=(500, 2))
    Xt_d = da.from_array(Xt, chunks=(128, 2))
    proba = remote.predict_proba(Xt_d)
    assert isinstance(proba, da.Array) and proba.chunks[0] == Xt_d.chunks[0]
    np.testing.assert_allclose(proba.compute(), incore.predict_proba(Xt), rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(remote.predict(Xt_d).compute(), incore.predict(Xt))
    mean, var = remote.predict_latent(Xt_d)
    np.testing.assert_allclose(var.compute(), incore.predict_latent(Xt)[1], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(remote.decision_function(Xt_d).compute(), incore.decision_function(Xt),
                               rtol=1e-8, atol=1e-10)
    # the evidence and its exact gradient by the same reduction
    theta = incore.kernel_.theta + np.array([0.2, -0.1])
    theta = np.concatenate([theta, incore.inducing_inputs_.ravel()])
    v1, g1 = incore.log_marginal_likelihood(theta, eval_gradient=True)
    v2, g2 = remote.log_marginal_likelihood(theta, eval_gradient=True)
    np.testing.assert_allclose(v2, v1, rtol=1e-10)
    np.testing.assert_allclose(g2, g1, rtol=1e-8, atol=1e-8 * np.max(np.abs(g1)))
    # the driver holds no array of length n (the sites live on the workers)
    assert _n_length_arrays(remote, 900) == []


@pytest.mark.cluster
def test_dask_type_ii_ml_learns_what_the_in_core_fit_learns(client):
    X, _, y = _data(600, seed=9)
    kw = dict(schedule="parallel", n_inducing=10, random_state=0, learn_inducing=False, tol=1e-9)
    incore = SparseGPRegressor(**kw).fit(X, y)
    remote = SparseGPRegressor(**kw).fit(*_dask(X, y, 200), client=client)
    np.testing.assert_allclose(remote.kernel_.theta, incore.kernel_.theta, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(remote.noise_variance_, incore.noise_variance_, rtol=1e-6)
    # noise_variance=None starts at var(y) / 10 there too (from the chunks' summed moments)
    start = SparseGPRegressor(**kw, optimizer=None).fit(*_dask(X, y, 200), client=client)
    np.testing.assert_allclose(start.noise_variance_, np.var(y) / 10, rtol=1e-10)
    np.testing.assert_allclose(start.kernel_.theta, default_kernel(X, y, regression=True).theta, rtol=1e-10)
    np.testing.assert_allclose(remote.log_marginal_likelihood_value_, incore.log_marginal_likelihood_value_,
                               rtol=1e-8)
    Xt = np.random.default_rng(10).uniform(-2, 2, size=(100, 2))
    m1, s1 = incore.predict(Xt, return_std=True)
    m2, s2 = remote.predict(da.from_array(Xt, chunks=(30, 2)), return_std=True)
    np.testing.assert_allclose(m2.compute(), m1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s2.compute(), s1, rtol=1e-5, atol=1e-6)


@pytest.mark.cluster
def test_dask_auto_inducing_grows_as_the_in_core_fit_does(client):
    # n <= the k-means++ sample: every size's inputs are the in-core ones, so the growth matches
    X, _, y = _data(300, seed=13)
    y = np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.1 * np.random.default_rng(14).normal(size=300)
    kw = dict(schedule="parallel", random_state=0, tol=1e-8)
    incore = SparseGPRegressor(**kw).fit(X, y)
    remote = SparseGPRegressor(**kw).fit(*_dask(X, y, 150), client=client)
    assert len(incore.growth_history_) >= 2
    assert [h["n_inducing"] for h in remote.growth_history_] == [h["n_inducing"] for h in incore.growth_history_]
    assert remote.n_inducing_ == incore.n_inducing_
    np.testing.assert_array_equal(remote.inducing_inputs_, incore.inducing_inputs_)
    np.testing.assert_allclose(remote.log_marginal_likelihood_value_, incore.log_marginal_likelihood_value_,
                               rtol=1e-6)


@pytest.mark.cluster
def test_a_dask_fitted_model_saves_loads_and_predicts(client, tmp_path):
    import fastep
    X, y, _ = _data(600, seed=11)
    remote = SparseGPClassifier(schedule="parallel", n_inducing=10, random_state=0, optimizer=None).fit(
        *_dask(X, np.where(y > 0, 1, 0), 200), client=client)
    Xt = np.random.default_rng(12).uniform(-3, 3, size=(50, 2))
    path = tmp_path / "remote.npz"
    fastep.save(remote, path)
    loaded = fastep.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(Xt), remote.predict_proba(Xt))
    np.testing.assert_array_equal(loaded.site_precision_, remote.site_precision_.compute())
    with pytest.raises(ValueError, match="fitted on a Dask cluster"):
        loaded.log_marginal_likelihood(loaded.kernel_.theta)
    assert remote.log_marginal_likelihood(remote.kernel_.theta) == pytest.approx(
        remote.log_marginal_likelihood_value_, rel=1e-8)          # the original still has its cluster


@pytest.mark.cluster
def test_dask_one_vs_rest(client):
    X, y, _ = _data(450, seed=11, classes=3)
    kw = dict(schedule="parallel", n_inducing=8, random_state=1, optimizer=None, inducing_init="random")
    incore = SparseGPClassifier(**kw).fit(X, y)
    remote = SparseGPClassifier(**kw, n_jobs=2).fit(*_dask(X, y, 100), client=client)
    np.testing.assert_array_equal(remote.inducing_inputs_, incore.inducing_inputs_)
    np.testing.assert_allclose(remote.log_marginal_likelihood_value_, incore.log_marginal_likelihood_value_,
                               rtol=1e-10)
    assert remote.site_precision_.shape == (3, 450)
    np.testing.assert_allclose(remote.predict_proba(da.from_array(X, chunks=(64, 2))).compute(),
                               incore.predict_proba(X), rtol=1e-8, atol=1e-12)


@pytest.mark.cluster
def test_dask_input_errors(client):
    X, y, _ = _data(200, seed=12)
    Xd, yd = _dask(X, y, 50)
    with pytest.raises(ValueError, match="schedule='parallel'"):
        SparseGPClassifier(n_inducing=5).fit(Xd, yd, client=client)
    with pytest.raises(ValueError, match="inducing_init='ivm'"):
        SparseGPClassifier(n_inducing=5, inducing_init="ivm", learning="minibatch").fit(Xd, yd, client=client)
    with pytest.raises(ValueError, match="inducing_init='ivm'"):
        SparseGPClassifier(schedule="parallel", n_inducing=5, inducing_init="ivm").fit(Xd, yd, client=client)
    with pytest.raises(TypeError, match="dask.array"):
        SparseGPClassifier(schedule="parallel", n_inducing=5).fit(X, y, client=client)
    with pytest.raises(TypeError, match="client must be a dask.distributed.Client"):
        SparseGPClassifier(schedule="parallel", n_inducing=5).fit(Xd, yd, client=object())
    bad = X.copy()
    bad[130, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        SparseGPClassifier(schedule="parallel", n_inducing=5).fit(*_dask(bad, y, 50), client=client)
    with pytest.raises(ValueError, match="only one class"):
        SparseGPClassifier(schedule="parallel", n_inducing=5).fit(Xd, da.ones(200, chunks=50), client=client)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        SparseGPClassifier(schedule="parallel", n_inducing=5).fit(Xd, yd[:150], client=client)
    fitted = SparseGPClassifier(schedule="parallel", n_inducing=5, optimizer=None).fit(Xd, yd, client=client)
    with pytest.raises(ValueError, match="features"):
        fitted.predict(da.ones((10, 3), chunks=5))


@pytest.mark.cluster
def test_minibatch_fits_from_memory_a_memmap_and_a_dask_array_are_the_same(client, tmp_path, monkeypatch):
    """Minibatch learning reads a dask X a chunk at a time to the driver: for one random_state
    the batches, and so every step and the fitted model, are those of the in-core fit (bitwise).
    With learning='auto' a dask X learns from minibatches from the same number of rows on."""
    import fastep._sparse.estimator as sparse_module

    X, y, t = _data(2500, seed=21, dim=3)
    path = tmp_path / "X.npy"
    np.save(path, X)
    kw = dict(n_inducing=10, batch_size=200, max_epochs=2, random_state=3)
    monkeypatch.setattr(sparse_module, "MINIBATCH_MIN_ROWS", 2000)
    incore = SparseGPClassifier(**kw).fit(X, y)
    memmap = SparseGPClassifier(**kw).fit(np.load(path, mmap_mode="r"), y)
    remote = SparseGPClassifier(**kw).fit(*_dask(X, y, 600), client=client)
    assert incore.learning_ == memmap.learning_ == remote.learning_ == "minibatch"
    Xt, _, _ = _data(100, seed=22, dim=3)
    for other in (memmap, remote):
        assert np.array_equal(other.kernel_.theta, incore.kernel_.theta)
        assert np.array_equal(other.inducing_inputs_, incore.inducing_inputs_)
        assert np.array_equal(other.predict_proba(Xt), incore.predict_proba(Xt))
    reg = SparseGPRegressor(learning="minibatch", **kw)
    a = reg.fit(X, t).predict(Xt, return_std=True)
    b = SparseGPRegressor(learning="minibatch", **kw).fit(*_dask(X, t, 600), client=client)
    assert b.learning_ == "minibatch"
    assert np.array_equal(b.predict(Xt, return_std=True), a)
    bad = X.copy()
    bad[1700, 2] = np.inf
    with pytest.raises(ValueError, match="NaN or infinity"):
        SparseGPClassifier(**kw).fit(*_dask(bad, y, 600), client=client)


def test_dask_fit_without_dask_names_the_extra():
    script = textwrap.dedent("""
        import sys

        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name in ("distributed", "dask") or name.startswith(("distributed.", "dask.")):
                    raise ImportError("blocked")

        sys.meta_path.insert(0, _Block())
        import numpy as np
        from fastep import SparseGPClassifier
        X = np.random.default_rng(0).normal(size=(20, 2))
        try:
            SparseGPClassifier(schedule="parallel").fit(X, X[:, 0] > 0, client=object())
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'pip install "fastep[dask]"' in out.stdout
