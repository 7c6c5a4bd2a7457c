"""Minibatch sparse EP (fastep._sparse.stochastic): equality with full-batch EP, the reference
twin of the tied update and of the gradient estimate, unbiasedness of the stochastic evidence
gradient, and the estimators' minibatch mode (determinism, memmap input, the 'auto' rule)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import fastep
from fastep import SparseGPClassifier, SparseGPRegressor
from fastep._gp.hyperparameters import Hyperparameters
from fastep._sparse import stochastic as sto
from fastep._sparse.problem import _BinarySparseEP
from fastep.kernels import RBF, RBFARD
from fastep.likelihoods import Gaussian, Probit
from fastep.reference import sites as ref_sites
from fastep.reference import sparse_ep as ref_sparse
from fastep.reference import stochastic_sparse_ep as ref


def _problem(n=240, m=12, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] * X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y, X[:m].copy()


def _full_batch(X, y, Z, kernel, approximation="fitc", power=1.0):
    """Full-batch sparse EP run to a tight fixed point, with its evidence and gradient."""
    options = SparseGPClassifier(schedule="parallel", tol=1e-13, max_sweeps=5000, approximation=approximation,
                                 power=power)._fit_options()
    problem = _BinarySparseEP(kernel, Probit(), Z, X, y, options, False, False)
    value, grad, info = problem.evaluate((kernel, Probit(), Z), gradient=True, warm=False, keep=True)
    assert info.converged
    return problem, value, grad, options


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
@pytest.mark.parametrize("power", [1.0, 0.5])
def test_one_minibatch_of_all_the_data_with_untied_sites_is_full_batch_ep(approximation, power):
    X, y, Z = _problem()
    kernel = RBF(1.3, 0.7)
    problem, log_z, _, options = _full_batch(X, y, Z, kernel, approximation, power)
    state = sto.MinibatchSparseEP(kernel, Probit(), Z, len(y), options, sites="per-point")
    index = np.arange(len(y))
    for _ in range(5000):
        out = state.update(X, y, index, step=0.5)
        if out["max_change"] < 1e-14:
            break
    assert out["max_change"] < 1e-14
    np.testing.assert_allclose(state.site_precision, problem.site_precision, rtol=0, atol=1e-10)
    np.testing.assert_allclose(state.site_natural_mean, problem.site_natural_mean, rtol=0, atol=1e-10)
    estimate, se = sto.log_evidence_estimate(state, sto.RowSource(X, y), np.random.default_rng(0))
    assert se == 0.0                                   # every row: the exact EP evidence
    assert abs(estimate - log_z) <= 1e-10 * abs(log_z)


def _at_fixed_point(X, y, Z, kernel, problem, options):
    state = sto.MinibatchSparseEP(kernel, Probit(), Z, len(y), options, sites="per-point")
    state.site_precision[:] = problem.site_precision
    state.site_natural_mean[:] = problem.site_natural_mean
    state.rebuild(sto.RowSource(X, y))
    return state


def test_gradient_estimates_of_a_partition_sum_to_the_full_evidence_gradient():
    X, y, Z = _problem()
    kernel = RBF(1.3, 0.7)
    problem, _, grad, options = _full_batch(X, y, Z, kernel)
    state = _at_fixed_point(X, y, Z, kernel, problem, options)
    total = 0.0
    for start in range(0, len(y), 40):
        index = np.arange(start, start + 40)
        total = total + state.update(X[index], y[index], index, step=0.0, gradient=True)["gradient"] * 40 / len(y)
    np.testing.assert_allclose(total, grad, rtol=1e-9, atol=1e-9)
    # and the full gradient is the derivative of the EP evidence (central differences in log θ)
    h = 1e-5
    for j in range(kernel.n_theta):
        values = []
        for sign in (1.0, -1.0):
            theta = kernel.theta.copy()
            theta[j] += sign * h
            k = kernel.clone_with_theta(theta)
            values.append(_full_batch(X, y, Z, k)[1])
        assert abs((values[0] - values[1]) / (2 * h) - grad[j]) <= 1e-5 * max(1.0, abs(grad[j]))


def test_the_stochastic_gradient_is_unbiased_within_its_standard_error():
    X, y, Z = _problem(n=400)
    kernel = RBF(1.3, 0.7)
    problem, _, grad, options = _full_batch(X, y, Z, kernel)
    state = _at_fixed_point(X, y, Z, kernel, problem, options)
    rng = np.random.default_rng(3)
    draws = []
    for _ in range(300):
        index = np.sort(rng.choice(len(y), size=32, replace=False))
        draws.append(state.update(X[index], y[index], index, step=0.0, gradient=True)["gradient"])
    draws = np.array(draws)
    se = draws.std(axis=0, ddof=1) / np.sqrt(len(draws))
    # 4 standard errors: a false alarm has probability below 1e-4 per component
    assert np.all(np.abs(draws.mean(axis=0) - grad) <= 4 * se), (draws.mean(axis=0), grad, se)
    assert np.all(se < 0.2 * np.abs(grad) + 1.0)       # the check has power


def _kernel_derivatives(kernel, Z, X):
    dKmm = np.array(list(kernel.gradient_iter(Z)))
    dKmB = np.array(list(kernel.cross_gradient_iter(Z, X)))
    dkdiag = np.asarray(kernel.diag_gradient(X)).T
    return dKmm, dKmB, dkdiag


@pytest.mark.parametrize("approximation", ["fitc", "dtc"])
def test_tied_update_and_gradient_match_the_reference_twin(approximation):
    X, y, Z = _problem(n=300, m=10, seed=1)
    kernel = RBFARD([0.6, 0.3], 1.4, 0.8)
    options = SparseGPClassifier(approximation=approximation, jitter=1e-8)._fit_options()
    n = len(y)
    state = sto.MinibatchSparseEP(kernel, Probit(), Z, n, options, sites="tied", window=n)
    rng = np.random.default_rng(0)
    pm = ref_sparse.power_moments(lambda a, b, c: ref_sites.probit_moments(a, b, c))
    for step in range(6):                              # sites away from zero, then compare one step
        index = np.sort(rng.choice(n, size=50, replace=False))
        Lambda, b = state.precision_sum.copy(), state.natural_mean_sum.copy()
        Vt, d = state.project(X[index])
        out = state.update(X[index], y[index], index, gradient=True)
        twin = ref.tied_minibatch_update(Vt.T, d, y[index], pm, Lambda, b, n)
        np.testing.assert_allclose(state.precision_sum, twin["Lambda"], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(state.natural_mean_sum, twin["b"], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(out["log_predictive"], twin["log_z"], rtol=1e-12, atol=1e-12)
        Kmm, KmB = kernel(Z), kernel(Z, X[index])
        expected = ref.tied_gradient_estimate(Kmm, KmB, kernel.diag(X[index]),
                                              *_kernel_derivatives(kernel, Z, X[index]), y[index], pm, Lambda, b,
                                              n, approximation=approximation, jitter=1e-8)
        np.testing.assert_allclose(out["gradient"], expected, rtol=1e-8, atol=1e-8 * np.max(np.abs(expected)))


def test_a_hyperparameter_step_keeps_the_sites_as_functions_of_u():
    X, y, Z = _problem()
    options = SparseGPClassifier()._fit_options()
    state = sto.MinibatchSparseEP(RBF(1.0, 0.7), Probit(), Z, len(y), options, window=len(y))
    state.update(X, y, np.arange(len(y)))

    def in_u(s):
        Linv = np.linalg.inv(s.chol_mm)
        return Linv.T @ s.precision_sum @ Linv, Linv.T @ s.natural_mean_sum

    before = in_u(state)
    state.kernel = RBF(2.0, 0.5)
    state.refactor(keep_sites_in_u=True)
    after = in_u(state)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-8, atol=1e-8 * np.abs(before[0]).max())
    np.testing.assert_allclose(after[1], before[1], rtol=1e-8, atol=1e-8 * np.abs(before[1]).max())


def _two_moons(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 3))
    y = (np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y


def _minibatch_classifier(**kw):
    return SparseGPClassifier(**{"learning": "minibatch", "n_inducing": 16, "batch_size": 128, "max_epochs": 3,
                                 "random_state": 0, **kw})


def test_minibatch_learning_learns_a_good_model_and_sets_irrelevant_inputs_aside():
    X, y = _two_moons(6000)
    Xt, yt = _two_moons(2000, seed=1)
    clf = _minibatch_classifier().fit(X, y)
    assert clf.learning_ == "minibatch"
    assert isinstance(clf.kernel_, RBFARD)             # the default kernel learns a relevance per input
    scales = clf.kernel_.scales if hasattr(clf.kernel_, "scales") else np.exp(clf.kernel_.theta[2:])
    assert scales[2] < 0.3 * min(scales[0], scales[1]), clf.kernel_      # x₃ is irrelevant
    assert np.mean(clf.predict(Xt) == yt) > 0.85
    assert clf.site_precision_ is None                 # tied sites: no per-point state
    assert np.isfinite(clf.log_marginal_likelihood_value_)
    assert clf.log_marginal_likelihood() == clf.log_marginal_likelihood_value_
    with pytest.raises(NotImplementedError, match="learning='full-batch'"):
        clf.log_marginal_likelihood(clf.kernel_.theta)


def test_minibatch_fits_are_deterministic_and_read_a_memmap_as_an_array(tmp_path):
    X, y = _two_moons(3000)
    a = _minibatch_classifier(max_epochs=1).fit(X, y)
    b = _minibatch_classifier(max_epochs=1).fit(X, y)
    path = tmp_path / "X.npy"
    np.save(path, X)
    c = _minibatch_classifier(max_epochs=1).fit(np.load(path, mmap_mode="r"), y)
    Xt, _ = _two_moons(200, seed=2)
    for other in (b, c):
        assert np.array_equal(other.kernel_.theta, a.kernel_.theta)
        assert np.array_equal(other.predict_proba(Xt), a.predict_proba(Xt))


def test_auto_learns_full_batch_below_the_threshold_and_student_t_refuses_minibatch():
    X, y = _two_moons(300)
    assert SparseGPClassifier(n_inducing=8, random_state=0).fit(X, y).learning_ == "full-batch"
    Xr = X
    yr = np.sin(X[:, 0])
    with pytest.raises(ValueError, match="learning='minibatch' is not available with a Student-t"):
        SparseGPRegressor(likelihood="student_t", learning="minibatch").fit(Xr, yr)
    with pytest.raises(ValueError, match="learning"):
        SparseGPClassifier(learning="stochastic").fit(X, y)
    with pytest.raises(ValueError, match="batch_size"):
        SparseGPClassifier(batch_size=0).fit(X, y)


def test_minibatch_regression_learns_the_noise_variance():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(6000, 2))
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=6000)
    reg = SparseGPRegressor(learning="minibatch", n_inducing=16, batch_size=128, max_epochs=3,
                            random_state=0).fit(X, y)
    assert reg.learning_ == "minibatch"
    assert 0.02 < reg.noise_variance_ < 0.08, reg.noise_variance_
    Xt = rng.uniform(-3, 3, size=(500, 2))
    assert np.sqrt(np.mean((reg.predict(Xt) - np.sin(Xt[:, 0])) ** 2)) < 0.15


_UNDER_LIMIT = """
import json, resource, sys, numpy as np, fastep
from fastep._memory import _proc_kilobytes

def status(field):
    return _proc_kilobytes("/proc/self/status", field)

n, m = 300_000, 256
rng = np.random.default_rng(0)
X = rng.uniform(-3, 3, size=(n, 3))
y = (np.sin(1.5 * X[:, 0]) + 0.3 * rng.normal(size=n) > 0).astype(int)
resource.setrlimit(resource.RLIMIT_AS, (3 * 1024 ** 3, 3 * 1024 ** 3))
out = {}
try:
    fastep.SparseGPClassifier(learning="full-batch", n_inducing=m, inducing_init="kmeans++").fit(X, y)
except fastep.MemoryLimitError as error:
    out["full_batch"] = [error.estimate, error.limit]
with open("/proc/self/clear_refs", "w") as f:      # the peak (VmHWM) from here on is the minibatch fit's
    f.write("5")
before = status("VmRSS")
clf = fastep.SparseGPClassifier(learning="minibatch", n_inducing=m, max_epochs=1, random_state=0).fit(X, y)
out["added"] = status("VmHWM") - before
out["accuracy"] = float(np.mean(clf.predict(X[:5000]) == y[:5000]))
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc/self/status and clear_refs")
def test_a_minibatch_fit_runs_where_the_n_by_m_projection_does_not_fit():
    out = subprocess.run([sys.executable, "-c", _UNDER_LIMIT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    estimate, limit = record["full_batch"]          # full-batch learning is refused under the limit
    assert estimate > limit
    # the minibatch fit's peak adds less than half of one n x m array (614 MB here)
    assert record["added"] < 0.5 * 300_000 * 256 * 8, record
    assert record["accuracy"] > 0.8, record


def test_progress_records_each_window_and_a_callback_can_stop_the_fit():
    X, y = _two_moons(6000)
    records = []

    def callback(record):
        records.append(record)
        return len([r for r in records if r.stage == "minibatch"]) < 2

    with pytest.warns(fastep.ConvergenceWarning, match="stopped by the callback"):
        clf = _minibatch_classifier(callback=callback).fit(X, y)
    windows = [r for r in records if r.stage == "minibatch"]
    assert len(windows) == 2                     # nothing reported after the stop
    assert [r.iteration for r in windows] == [1, 2]
    assert all(np.isfinite(r.log_marginal_likelihood) and r.change > 0 for r in windows)
    assert clf._problems[0].info.stopped == "callback"
    assert np.all(np.isfinite(clf.predict_proba(X[:10])))


def test_continue_fit_continues_the_previous_minibatch_fit_and_fit_starts_afresh():
    import copy

    X, y = _two_moons(3000)
    Xt, _ = _two_moons(300, seed=2)
    fresh = _minibatch_classifier(max_epochs=1).fit(X, y)
    continued = _minibatch_classifier(max_epochs=1).fit(X, y).continue_fit(X, y)
    # the second fit starts at the first one's inducing inputs, parameters and tied site ...
    assert not np.array_equal(continued.kernel_.theta, fresh.kernel_.theta)
    # ... and is what the learning loop gives from that start: the default (learn_inducing='auto')
    # learnt Z in its second stage, so the continuation learns Z too, at that stage's step
    start = fresh._problems[0]
    assert start.hyperparameters.extra is not None
    options = fresh._fit_options()
    window, site_window = sto.minibatch_windows(X.shape[0], start.Z.shape[0])
    options = options.replace(minibatch=True, window=window, site_window=site_window,
                              learning_rate=options.learning_rate * sto.SECOND_STAGE_STEP)
    again = sto.fit_minibatch(None, None, None, sto.RowSource(X, (y == 1) * 2.0 - 1.0), options,
                              copy.deepcopy(start.hyperparameters), learn=True, start=start)
    assert np.array_equal(again.kernel.theta, continued.kernel_.theta)
    assert np.array_equal(again.Z, continued.inducing_inputs_)
    assert not np.array_equal(continued.inducing_inputs_, fresh.inducing_inputs_)
    # with learn_inducing=False neither stage moves Z, nor does the continuation
    fixed = _minibatch_classifier(max_epochs=1, learn_inducing=False).fit(X, y)
    assert fixed._problems[0].hyperparameters.extra is None
    fixed_z = fixed.inducing_inputs_.copy()
    assert np.array_equal(fixed.continue_fit(X, y).inducing_inputs_, fixed_z)
    # fit starts afresh whatever came before (fit twice gives the same model)
    twice = _minibatch_classifier(max_epochs=1).fit(X, y).continue_fit(X, y).fit(X, y)
    assert np.array_equal(twice.kernel_.theta, fresh.kernel_.theta)
    assert np.array_equal(twice.predict_proba(Xt), fresh.predict_proba(Xt))
    # continue_fit without a previous fit is a minibatch fit
    first = SparseGPClassifier(n_inducing=16, batch_size=128, max_epochs=1, random_state=0).continue_fit(X, y)
    assert first.learning_ == "minibatch" and np.array_equal(first.kernel_.theta, fresh.kernel_.theta)
    # what defines the model may not change between a fit and its continuation
    for change, message in (({"n_inducing": 8}, "n_inducing changed"), ({"kernel": RBF(1.0, 0.5)}, "kernel changed")):
        est = _minibatch_classifier(max_epochs=1).fit(X, y)
        before = est.kernel_.theta
        with pytest.raises(ValueError, match=message):
            est.set_params(**change).continue_fit(X, y)
        assert np.array_equal(est.kernel_.theta, before)           # the fitted model is unchanged
    with pytest.raises(ValueError, match="features"):
        _minibatch_classifier(max_epochs=1).fit(X, y).continue_fit(X[:, :2], y)
    with pytest.raises(ValueError, match="classes"):
        _minibatch_classifier(max_epochs=1).fit(X, y).continue_fit(X, np.where(y == 1, 2, y))
    with pytest.raises(ValueError, match="call fit to start afresh"):
        SparseGPClassifier(n_inducing=8, random_state=0).fit(X[:300], y[:300]).continue_fit(X, y)


def test_sites_at_fixed_parameters_from_zero_are_settled_before_their_evidence():
    """``fit_minibatch(learn=False, settle=True)`` (the IVM's final pass at the learnt parameters):
    the sites settle from zero before the polish pass, so their evidence is that of sites run
    for passes over the data, not of sites still weighed towards the zero start (a polish pass
    alone from zero was 105 nats low here, against 1.3 for the settled sites; n = 20 000 rows
    are all in the evidence's sample, so the estimates are exact sums)."""
    rng = np.random.default_rng(0)
    n, m = 20_000, 16
    X = rng.uniform(-3, 3, size=(n, 2))
    y = np.where(np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    kernel, likelihood = RBF(1.0, 0.5), Probit()
    Z = X[rng.choice(n, m, replace=False)]
    window, site_window = sto.minibatch_windows(n, m)
    options = SparseGPClassifier(learning="minibatch", random_state=0)._fit_options().replace(
        minibatch=True, jitter=1e-6, window=window, site_window=site_window)
    hyper = Hyperparameters(kernel, likelihood, False)
    source = sto.RowSource(X, y)
    settled = sto.fit_minibatch(kernel, likelihood, Z, source, options.replace(max_epochs=1), hyper, learn=False,
                                settle=True)
    passes = sto.fit_minibatch(kernel, likelihood, Z, source, options.replace(max_epochs=3), hyper, learn=False)
    assert settled.log_ml_se == 0.0 and passes.log_ml_se == 0.0
    # the stochastic sites' own spread: EP's evidence at ε = |B| / 5000 moves by about a nat here
    assert abs(settled.log_ml - passes.log_ml) < 5.0, (settled.log_ml, passes.log_ml)
    assert settled.info.n_points == 0              # no windows of the stopping rule were run
