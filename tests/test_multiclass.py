"""Multiclass GP classification by nested EP (multinomial probit; Riihimäki, Jylänki & Vehtari 2013).

The compiled inner-EP site kernel against its reference twin, the O(c n³) posterior algebra
against the dense (cn)×(cn) posterior, two classes against the binary probit model, the
probability simplex, evidence gradients against finite differences, and the estimator's API.
"""
import pickle

import numpy as np
import pytest
from scipy.stats import norm

from fastep import GaussianProcessClassifier, load, save
from fastep._epcore import multiclass_ep
from fastep._gp.fit_options import DenseFitOptions
from fastep._dense.multiclass import MultinomialGPProblem, MultinomialPosterior, _outer_sites, dense_posterior_of
from fastep._epcore.multiclass_ep import InnerEP, MultinomialEP, MultinomialResult
from fastep.kernels import RBF, Bias
from fastep.reference import multinomial_ep as ref
from support import dense_nested_ep


def _random_cavity(rng, c, scale=1.0):
    A = rng.normal(size=(c, c))
    cov = scale * (A @ A.T / c + 0.3 * np.eye(c))
    prec = np.linalg.inv(cov)
    return 0.5 * (prec + prec.T), prec @ rng.normal(scale=1.5, size=c)


@pytest.mark.parametrize("c", [2, 3, 5])
@pytest.mark.parametrize("n_sweeps,damping", [(0, 1.0), (1, 1.0), (3, 0.5)])
def test_inner_ep_matches_reference(c, n_sweeps, damping):
    rng = np.random.default_rng(c * 10 + n_sweeps)
    n = 6
    precs, lins, labels = [], [], rng.integers(0, c, size=n).astype(np.int32)
    for _ in range(n):
        p, q = _random_cavity(rng, c, scale=rng.uniform(0.1, 5.0))
        precs.append(p)
        lins.append(q)
    precs, lins = np.array(precs), np.array(lins)
    alpha = np.abs(rng.normal(size=(n, c))) * 0.5
    beta = rng.normal(size=(n, c)) * 0.5
    alpha[np.arange(n), labels] = 0.0
    beta[np.arange(n), labels] = 0.0
    a_ref, b_ref = alpha.copy(), beta.copy()
    log_z, status = InnerEP(n_inner_sweeps=n_sweeps, damping=damping).update(labels, precs, lins, alpha, beta)
    assert np.all(status == multiclass_ep.NESTED_OK)
    for i in range(n):
        a, b, lz = ref.nested_site(precs[i], lins[i], labels[i], a_ref[i], b_ref[i], n_sweeps, damping)
        np.testing.assert_allclose(alpha[i], a, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(beta[i], b, rtol=1e-10, atol=1e-12)
        assert log_z[i] == pytest.approx(lz, rel=1e-10, abs=1e-12)


def test_inner_ep_probabilities_are_exact_for_two_classes_and_close_for_three():
    mean = np.array([[0.3, -0.5], [2.0, -1.0]])
    cov = np.array([[[1.0, 0.3], [0.3, 2.0]], [[0.5, 0.0], [0.0, 0.5]]])
    p = np.exp(multiclass_ep.nested_log_probabilities(mean, cov))
    d_var = 2.0 + cov[:, 0, 0] + cov[:, 1, 1] - 2 * cov[:, 0, 1]       # f0 - f1 + ε0 - ε1
    want = norm.cdf((mean[:, 0] - mean[:, 1]) / np.sqrt(d_var))
    np.testing.assert_allclose(p[:, 0], want, rtol=1e-12)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    # three classes: against a large seeded Monte Carlo sample of argmax(f + ε)
    rng = np.random.default_rng(0)
    m3 = np.array([0.5, 0.0, -0.3])
    A = rng.normal(size=(3, 3))
    V3 = A @ A.T / 3 + 0.2 * np.eye(3)
    p3 = np.exp(multiclass_ep.nested_log_probabilities(m3[None], V3[None]))[0]
    draws = rng.multivariate_normal(m3, V3, size=400_000) + rng.normal(size=(400_000, 3))
    freq = np.bincount(draws.argmax(axis=1), minlength=3) / draws.shape[0]
    np.testing.assert_allclose(p3, freq, atol=0.005)


def test_improper_cavity_leaves_the_site_unchanged():
    labels = np.array([0], dtype=np.int32)
    prec = -np.eye(3)[None]
    alpha, beta = np.array([[0.0, 0.4, 0.2]]), np.array([[0.0, 0.1, -0.3]])
    before = alpha.copy(), beta.copy()
    log_z, status = InnerEP().update(labels, prec, np.zeros((1, 3)), alpha, beta)
    assert status[0] == multiclass_ep.NESTED_IMPROPER_CAVITY and np.isnan(log_z[0])
    np.testing.assert_array_equal(alpha, before[0])
    np.testing.assert_array_equal(beta, before[1])
    with pytest.raises(ValueError, match="labels"):
        InnerEP().update(np.array([3], dtype=np.int32), np.eye(3)[None], np.zeros((1, 3)), alpha, beta)
    with pytest.raises(ValueError, match="damping"):
        InnerEP(damping=0.0)


def _toy(n=60, c=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    W = rng.normal(size=(2, c))
    y = np.argmax(X @ W + 0.3 * rng.normal(size=(n, c)), axis=1)
    return X, y


@pytest.mark.parametrize("c", [3, 4])
def test_structured_posterior_matches_the_dense_one(c):
    rng = np.random.default_rng(c)
    n = 25
    X = rng.normal(size=(n, 2))
    K = RBF(1.3, 0.7)(X) + 1e-8 * np.eye(n)
    labels = rng.integers(0, c, size=n).astype(np.int32)
    alpha = np.abs(rng.normal(size=(n, c)))
    beta = rng.normal(size=(n, c))
    alpha[np.arange(n), labels] = 0.0
    beta[np.arange(n), labels] = 0.0
    pi, nu = _outer_sites(labels, alpha, beta)
    post = MultinomialPosterior(K, pi, nu)
    site_prec, site_lin = ref.outer_sites(labels, alpha, beta)
    np.testing.assert_allclose(site_lin, nu, rtol=1e-12, atol=1e-12)
    cov, mean, log_det = ref.dense_posterior(K, site_prec, site_lin)
    blocks = np.array([[[cov[j * n + i, l * n + i] for l in range(c)] for j in range(c)] for i in range(n)])
    np.testing.assert_allclose(post.cov, blocks, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(post.mean.T.reshape(-1), mean, rtol=1e-8, atol=1e-10)
    assert post.log_det == pytest.approx(log_det, rel=1e-10)


def test_two_classes_equal_the_binary_probit_model():
    X, y = _toy(n=80, c=2, seed=3)
    kernel = RBF(2.0, 0.5) + Bias(0.3)
    X_test = np.random.default_rng(9).normal(size=(50, 2))
    binary = GaussianProcessClassifier(kernel, optimizer=None, tol=1e-10).fit(X, y)
    multi = GaussianProcessClassifier(kernel, optimizer=None, tol=1e-10, multi_class="multinomial").fit(X, y)
    assert multi.log_marginal_likelihood_value_ == pytest.approx(binary.log_marginal_likelihood_value_, rel=1e-8)
    np.testing.assert_allclose(multi.predict_proba(X_test), binary.predict_proba(X_test), atol=1e-8)
    np.testing.assert_array_equal(multi.predict(X_test), binary.predict(X_test))
    # the binary latent is f1 - f0 with kernel 2k and slope 1/√2: the mean of f1 - f0 is its √2 multiple
    latent = multi.predict_latent(X_test)[0]
    np.testing.assert_allclose((latent[:, 1] - latent[:, 0]) / np.sqrt(2),
                               binary.predict_latent(X_test)[0], rtol=1e-6, atol=1e-8)
    # two classes: decision values are the predictive log-odds of classes_[1], as the binary model's
    np.testing.assert_allclose(multi.decision_function(X_test), binary.decision_function(X_test),
                               rtol=1e-6, atol=1e-7)


def test_probabilities_lie_on_the_simplex_and_learning_works():
    X, y = _toy(n=90, c=3, seed=1)
    labels = np.array(["red", "green", "blue"], dtype=object)[y]
    clf = GaussianProcessClassifier(multi_class="multinomial").fit(X, labels)
    X_test = np.random.default_rng(5).normal(scale=3.0, size=(200, 2))
    p = clf.predict_proba(X_test)
    assert p.shape == (200, 3) and np.all(p >= 0) and np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert set(clf.predict(X_test)) <= set(clf.classes_)
    assert np.mean(clf.predict(X) == labels) > 0.85
    assert clf.converged_
    assert clf.site_precision_.shape == (3, 90)
    mean, var = clf.predict_latent(X_test)
    assert mean.shape == var.shape == (200, 3) and np.all(var >= 0)


def test_evidence_gradient_matches_finite_differences():
    X, y = _toy(n=40, c=3, seed=2)
    clf = GaussianProcessClassifier(RBF(1.0, 1.0) + Bias(0.5), multi_class="multinomial", tol=1e-11,
                                    max_sweeps=2000).fit(X, y)
    theta = np.array([0.4, -0.3, -0.5])
    value, grad = clf.log_marginal_likelihood(theta, eval_gradient=True)
    h = 1e-5
    fd = np.array([(clf.log_marginal_likelihood(theta + h * e) - clf.log_marginal_likelihood(theta - h * e)) / (2 * h)
                   for e in np.eye(3)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


def _evaluated_problem(tol, max_sweeps):
    """A 3-class problem after one nested EP run from zero sites: ``(X, y, kernel, problem, log_z, info)``."""
    X, y = _toy(n=30, c=3, seed=4)
    kernel = RBF(1.5, 0.8)
    opts = DenseFitOptions(jitter=0.0, damping=0.5, tol=tol, max_sweeps=max_sweeps)
    problem = MultinomialGPProblem(kernel, X, y.astype(np.int32), 3, opts)
    log_z, _, info = problem.evaluate((kernel, None, None), gradient=False, warm=False)
    return X, y, kernel, problem, log_z, info


def test_evidence_matches_the_dense_energy_of_the_same_sites():
    X, y, kernel, problem, log_z, info = _evaluated_problem(1e-10, 1000)
    K = kernel(X)
    site_prec, site_lin = ref.outer_sites(y, problem.inner_precision, problem.inner_natural_mean)
    cov, mean, log_det = ref.dense_posterior(K, site_prec, site_lin)
    total = -0.5 * log_det + 0.5 * site_lin.T.reshape(-1) @ mean
    n = 30
    for i in range(n):
        idx = [j * n + i for j in range(3)]
        marg_prec = np.linalg.inv(cov[np.ix_(idx, idx)])
        marg_lin = marg_prec @ mean[idx]
        cav_prec, cav_lin = marg_prec - site_prec[i], marg_lin - site_lin[i]
        _, _, lz = ref.nested_site(cav_prec, cav_lin, y[i], problem.inner_precision[i],
                                   problem.inner_natural_mean[i], n_sweeps=0)
        psi = lambda P, q: -0.5 * np.linalg.slogdet(P)[1] + 0.5 * q @ np.linalg.solve(P, q)
        total += lz + psi(cav_prec, cav_lin) - psi(marg_prec, marg_lin)
    assert log_z == pytest.approx(total, rel=1e-9)


def test_engine_runs_the_problem_bitwise_and_checks_its_inputs():
    X, y, kernel, problem, log_z, info = _evaluated_problem(1e-8, 200)
    K = np.ascontiguousarray(kernel(X))
    labels = y.astype(np.int32)
    engine, result, alpha, _ = dense_nested_ep(K, labels, 3, damping=0.5, tol=1e-8, max_sweeps=200)
    assert isinstance(result, MultinomialResult) and result == info
    assert result.log_z == log_z and result.n_sweeps == info.n_sweeps and result.converged
    assert result.final_damping == 0.5
    np.testing.assert_array_equal(alpha, problem.inner_precision)
    np.testing.assert_array_equal(result.outer_precision.T, problem.site_precision)
    np.testing.assert_array_equal(result.outer_natural_mean.T, problem.site_natural_mean)
    assert isinstance(engine.posterior, MultinomialPosterior)
    with pytest.raises(TypeError, match="labels"):
        MultinomialEP(dense_posterior_of(K), y.astype(np.int64), 3)
    with pytest.raises(ValueError, match="labels"):
        MultinomialEP(dense_posterior_of(K), labels, 2)
    with pytest.raises(ValueError, match="n_classes"):
        MultinomialEP(dense_posterior_of(K), labels, 1)
    with pytest.raises(ValueError, match="K must be symmetric"):
        dense_posterior_of(K + np.triu(np.ones_like(K), 1))
    with pytest.raises(TypeError, match="posterior_of"):
        MultinomialEP(K, labels, 3)
    with pytest.raises(ValueError, match="damping"):
        MultinomialEP(dense_posterior_of(K), labels, 3, damping=0.0)
    with pytest.raises(ValueError, match="max_sweeps"):
        MultinomialEP(dense_posterior_of(K), labels, 3, max_sweeps=-1)
    engine = MultinomialEP(dense_posterior_of(K), labels, 3)
    with pytest.raises(TypeError, match="inner_precision"):
        engine.run(np.zeros((30, 2)), np.zeros((30, 3)))
    with pytest.raises(TypeError, match="inner_natural_mean"):
        engine.run(np.zeros((30, 3)), np.zeros((30, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="finite"):
        engine.run(np.full((30, 3), np.nan), np.zeros((30, 3)))
    shared = np.zeros((30, 3))
    with pytest.raises(ValueError, match="share memory"):
        engine.run(shared, shared)


def test_result_is_typed_and_round_trips():
    X, y = _toy(n=25, c=3, seed=6)
    K = np.ascontiguousarray(RBF(1.5, 0.8)(X) + 1e-8 * np.eye(25))
    labels = y.astype(np.int32)
    _, result, alpha, beta = dense_nested_ep(K, labels, 3, damping=0.7, tol=1e-9)
    pi, nu = _outer_sites(labels, alpha, beta)
    np.testing.assert_array_equal(result.outer_precision, pi)
    np.testing.assert_array_equal(result.outer_natural_mean, nu)
    again = pickle.loads(pickle.dumps(result))
    assert type(again) is MultinomialResult and again == result and again.final_damping == 0.7
    np.testing.assert_array_equal(again.outer_precision, pi)
    changed = result.replace(n_clipped=1, final_damping=0.5)
    assert type(changed) is MultinomialResult and changed.n_clipped == 1 and changed != result
    assert changed.outer_precision is result.outer_precision
    assert result.as_dict()["final_damping"] == 0.7 and "MultinomialResult(" in repr(result)
    with pytest.raises(TypeError, match="unknown"):
        result.replace(posterior=None)


def test_zero_sweeps_only_evaluate_the_sites():
    X, y = _toy(n=25, c=3, seed=7)
    K = np.ascontiguousarray(RBF(1.5, 0.8)(X) + 1e-8 * np.eye(25))
    labels = y.astype(np.int32)
    _, converged, alpha, beta = dense_nested_ep(K, labels, 3, damping=0.7, tol=1e-9)
    start = alpha.copy(), beta.copy()
    _, result, alpha, beta = dense_nested_ep(K, labels, 3, alpha, beta, max_sweeps=0)
    assert result.n_sweeps == 0 and not result.converged
    assert result.log_z == pytest.approx(converged.log_z, rel=1e-10)
    np.testing.assert_array_equal(alpha, start[0])
    np.testing.assert_array_equal(beta, start[1])


def test_a_run_that_fails_or_is_stopped_leaves_the_sites_as_they_were():
    X, y = _toy(n=25, c=3, seed=8)
    K = np.ascontiguousarray(RBF(1.5, 0.8)(X) + 1e-8 * np.eye(25))
    labels = y.astype(np.int32)
    calls = []

    def failing(pi, nu):
        calls.append(1)
        if len(calls) == 3:
            raise np.linalg.LinAlgError("the posterior failed")
        return MultinomialPosterior(K, pi, nu)

    alpha, beta = np.zeros((25, 3)), np.zeros((25, 3))
    with pytest.raises(np.linalg.LinAlgError, match="the posterior failed"):
        MultinomialEP(failing, labels, 3).run(alpha, beta)
    assert len(calls) == 3 and not np.any(alpha) and not np.any(beta)

    def raising(sweep, max_change, log_z):
        if sweep == 2:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        dense_nested_ep(K, labels, 3, alpha, beta, damping=0.5, sweep_callback=raising)
    assert not np.any(alpha) and not np.any(beta)
    seen = []
    _, result, alpha, _ = dense_nested_ep(K, labels, 3, damping=0.5,
                                          sweep_callback=lambda sweep, *_: seen.append(sweep) or sweep < 3)
    assert result.stopped and result.n_sweeps == 3 and seen == [1, 2, 3] and np.any(alpha)


def test_posterior_of_must_return_cavities_of_the_sites_shape():
    K = np.ascontiguousarray(RBF(1.0, 1.0)(np.linspace(-1, 1, 10)[:, None]) + 1e-8 * np.eye(10))
    labels = np.arange(10, dtype=np.int32) % 3

    class Wrong:
        cavity_precision = np.tile(np.eye(3), (9, 1, 1))
        cavity_natural_mean = np.zeros((9, 3))

    with pytest.raises(ValueError, match="expected"):
        MultinomialEP(lambda pi, nu: Wrong(), labels, 3).run(np.zeros((10, 3)), np.zeros((10, 3)))


def test_engine_converges_to_the_twin_fixed_point():
    """Against the reference twin's outer EP (dense (cn)×(cn) posterior, inner EP from scratch)."""
    X, y = _toy(n=20, c=3, seed=9)
    K = np.ascontiguousarray(RBF(2.0, 0.8)(X) + 1e-8 * np.eye(20))
    labels = y.astype(np.int32)
    for adaptive in (False, True):
        _, result, alpha, beta = dense_nested_ep(K, labels, 3, damping=0.9 if adaptive else 0.6,
                                                 adaptive_damping=adaptive, tol=1e-12, max_sweeps=500)
        a_ref, b_ref, log_z_ref, _ = ref.nested_ep(K, labels, 3, damping=0.6, tol=1e-12)
        assert result.converged
        np.testing.assert_allclose(alpha, a_ref, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(beta, b_ref, rtol=1e-7, atol=1e-9)
        assert result.log_z == pytest.approx(log_z_ref, rel=1e-9)
        assert result.log_z == pytest.approx(ref.evidence(K, labels, alpha, beta), rel=1e-10)


def test_adaptive_damping_ends_the_oscillation_of_undamped_updates_at_the_same_fixed_point():
    X, y = _toy(n=60, c=3, seed=4)
    labels = y.astype(np.int32)
    K = np.ascontiguousarray(RBF(100.0, 0.8)(X))      # a large variance: the parallel updates overshoot
    K.flat[:: K.shape[0] + 1] += 1e-6

    def run(damping, adaptive):
        engine, result, _, _ = dense_nested_ep(K, labels, 3, damping=damping, adaptive_damping=adaptive, tol=1e-9,
                                               max_sweeps=300)
        return engine, result

    _, undamped = run(1.0, False)
    assert not undamped.converged
    fixed, fixed_result = run(0.5, False)
    for start in (1.0, 0.9):
        adaptive, result = run(start, True)
        assert result.converged and result.n_sweeps < 300
        assert result.final_damping < start
        assert result.log_z == pytest.approx(fixed_result.log_z, abs=1e-6)
        np.testing.assert_allclose(result.outer_precision, fixed_result.outer_precision, atol=1e-5)
        np.testing.assert_allclose(adaptive.posterior.mean, fixed.posterior.mean, atol=1e-5)


def test_multinomial_rejects_other_likelihoods_and_bad_choices():
    from fastep import Logistic, Probit
    X, y = _toy(n=30)
    with pytest.raises(ValueError, match="multinomial probit"):
        GaussianProcessClassifier(likelihood=Logistic(), multi_class="multinomial").fit(X, y)
    with pytest.raises(ValueError, match="multinomial probit"):
        GaussianProcessClassifier(likelihood=Probit(slope=2.0), multi_class="multinomial").fit(X, y)
    with pytest.raises(ValueError, match="multi_class"):
        GaussianProcessClassifier(multi_class="softmax").fit(X, y)
    with pytest.raises(ValueError, match="two classes"):
        GaussianProcessClassifier(multi_class="multinomial").fit(X, np.zeros(30))


def test_multinomial_model_round_trips_through_save_and_load(tmp_path):
    X, y = _toy(n=40)
    clf = GaussianProcessClassifier(multi_class="multinomial").fit(X, y)
    path = tmp_path / "multi.npz"
    save(clf, path)
    loaded = load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_batched_small_matrix_helpers_match_lapack():
    from fastep._linalg import (batched_cholesky, batched_cholesky_solve, batched_inverse_spd,
                                batched_log_det_from_cholesky)
    rng = np.random.default_rng(5)
    B = rng.normal(size=(40, 5, 5))
    A = np.einsum("nij,nkj->nik", B, B) + 0.05 * np.eye(5)
    L, ok = batched_cholesky(A)
    assert ok.all()
    np.testing.assert_allclose(L, np.linalg.cholesky(A), rtol=1e-10, atol=1e-12)
    b = rng.normal(size=(40, 5))
    np.testing.assert_allclose(batched_cholesky_solve(L, b), np.linalg.solve(A, b[:, :, None])[:, :, 0],
                               rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(batched_inverse_spd(A), np.linalg.inv(A), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(batched_log_det_from_cholesky(L), np.linalg.slogdet(A)[1], rtol=1e-12)
    A[7] -= 50.0 * np.eye(5)                             # one indefinite matrix in the stack
    _, ok = batched_cholesky(A)
    assert not ok[7] and ok[np.arange(40) != 7].all()
    with pytest.raises(np.linalg.LinAlgError, match="positive definite"):
        batched_inverse_spd(A)


def test_reference_multiclass_ep_is_a_deprecated_name_of_multinomial_ep():
    import importlib
    import sys

    import fastep.reference
    sys.modules.pop("fastep.reference.multiclass_ep", None)
    vars(fastep.reference).pop("multiclass_ep", None)
    with pytest.warns(FutureWarning, match="fastep.reference.multiclass_ep is deprecated.*multinomial_ep"):
        old = importlib.import_module("fastep.reference.multiclass_ep")
    assert old.__all__ == ref.__all__
    for name in ref.__all__ + ["_inner_posterior"]:
        assert getattr(old, name) is getattr(ref, name)
    assert fastep.reference.multiclass_ep is old and "multiclass_ep" not in fastep.reference.__all__
