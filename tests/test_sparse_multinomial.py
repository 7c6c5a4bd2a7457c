"""Joint multiclass sparse GP EP (``SparseGPClassifier(multi_class='multinomial')``): c latent
GPs sharing inducing inputs under the multinomial probit, by nested EP.

Analytic checks: with two classes the model is binary sparse probit EP on ``(f_1 - f_0)/√2``
(log Z to 1e-8); with the inducing inputs at the training inputs (DTC, Q = K exactly) it is the
dense nested EP on Q (log Z to 1e-6); the evidence gradient matches central differences in the
kernel's θ and in Z; the batched per-input algebra matches the plain-numpy twin
(:mod:`fastep.reference.sparse_multinomial`) on random and adversarial inputs.
"""
import numpy as np
import pytest

from fastep import SparseGPClassifier
from fastep._epcore import sparse_ep as _sparse_engine
from fastep._gp.fit_options import SparseFitOptions
from fastep._sparse import multinomial as mn
from fastep.kernels import RBF, RBFARD
from fastep.likelihoods import Logistic, Probit
from fastep.persistence import load, save
from fastep.reference import sparse_multinomial as ref
from support import dense_nested_ep


def projections(X, Z, kernel, approximation, jitter=1e-8):
    L, Vt, d = _sparse_engine.sparse_projection(kernel(Z), np.ascontiguousarray(kernel(X, Z)), kernel.diag(X),
                                                approximation=approximation, jitter=jitter)
    return L, Vt, d


def three_classes(n, seed, dim=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    y = np.argmax(X @ rng.normal(size=(dim, 3)) + 0.5 * rng.normal(size=(n, 3)), axis=1).astype(np.int32)
    return X, y


@pytest.mark.parametrize("approximation", ["dtc", "fitc"])
def test_two_classes_equal_binary_sparse_probit_ep(approximation):
    """p(y = 1 | f) = Φ((f_1 - f_0)/√2) and (f_1 - f_0)/√2 ~ GP(0, k): binary sparse EP with the
    same kernel, Z and approximation; with one probit factor the inner EP is exact."""
    rng = np.random.default_rng(0)
    n, m = 60, 12
    X = rng.normal(size=(n, 2))
    Z = X[rng.choice(n, m, replace=False)] + 0.1
    y = (X[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(np.int32)
    _, Vt, d = projections(X, Z, RBF(1.3, 0.7), approximation)
    joint = mn.MultinomialSparseEP(Vt, d, y, 2, np.zeros((n, 2)), np.zeros((n, 2)), tol=1e-12, max_sweeps=500)
    joint_result = joint.run()
    binary = _sparse_engine.SparseEP(Vt, d, (2.0 * y - 1.0), Probit().site_spec(),
                                     _sparse_engine.SparseEPOptions(tol=1e-12, max_sweeps=500))
    binary_result = binary.run(np.zeros(n), np.zeros(n), np.empty((m, m)), np.empty(m))
    assert joint_result.converged and binary_result.converged
    assert joint_result.log_z == pytest.approx(binary_result.log_z, abs=1e-8, rel=0)


def test_inducing_inputs_at_the_training_inputs_equal_dense_nested_ep():
    """Z = X with DTC: the prior of the training latents is Q = K_nm K_mm⁻¹ K_mn exactly, and the
    joint sparse model is dense nested EP on Q."""
    X, y = three_classes(50, 1)
    _, Vt, d = projections(X, X, RBF(1.3, 0.7), "dtc")
    Q = np.ascontiguousarray(Vt @ Vt.T)
    sparse = mn.MultinomialSparseEP(Vt, d, y, 3, np.zeros((50, 3)), np.zeros((50, 3)), tol=1e-12, max_sweeps=500)
    sparse_result = sparse.run()
    _, dense_result, dense_inner_precision, _ = dense_nested_ep(Q, y, 3, tol=1e-12, max_sweeps=500)
    assert sparse_result.converged and dense_result.converged
    assert sparse_result.log_z == pytest.approx(dense_result.log_z, abs=1e-6, rel=0)
    np.testing.assert_allclose(sparse.inner_precision, dense_inner_precision, atol=1e-6)


@pytest.mark.parametrize("approximation", [pytest.param("dtc", marks=pytest.mark.slow), "fitc"])
def test_evidence_gradient_matches_central_differences_including_the_inducing_inputs(approximation):
    X, y = three_classes(70, 2)
    rng = np.random.default_rng(3)
    Z = X[rng.choice(70, 9, replace=False)] + 0.05
    options = SparseFitOptions(approximation=approximation, jitter=1e-8, damping=1.0, tol=1e-12, max_sweeps=1000)
    kernel = RBFARD([0.8, 0.3], variance=1.5, inverse_width=0.9)
    problem = mn.MultinomialSparseProblem(kernel, Z, X, y, 3, options, learn_inducing=True)
    _, grad, info = problem.evaluate((kernel, None, Z), gradient=True, warm=False)
    assert info.converged
    theta, eps = kernel.theta.copy(), 1e-5
    numeric = []
    for i in range(theta.size):
        values = [problem.evaluate((kernel.clone_with_theta(theta + s * eps * np.eye(theta.size)[i]), None, Z),
                                   gradient=False, warm=False)[0] for s in (1, -1)]
        numeric.append((values[0] - values[1]) / (2 * eps))
    for i in (0, 5, 11, 17):
        shifted = []
        for s in (1, -1):
            Z2 = Z.copy()
            Z2.flat[i] += s * eps
            shifted.append(problem.evaluate((kernel, None, Z2), gradient=False, warm=False)[0])
        numeric.append((shifted[0] - shifted[1]) / (2 * eps))
    analytic = np.concatenate([grad[:theta.size], grad[theta.size:][[0, 5, 11, 17]]])
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6)


def _random_sites(rng, n, c, adversarial=False):
    """Inner-site-like outer sites: π > 0 (the label's entry 1), ν̃ of either sign."""
    pi = rng.uniform(0.01, 3.0, size=(n, c))
    if adversarial:
        pi[::3] *= 1e-7                                   # nearly flat sites
        pi[1::3] *= 1e4                                   # very sharp sites
    labels = rng.integers(0, c, n)
    pi[np.arange(n), labels] = 1.0
    nu = rng.normal(scale=2.0, size=(n, c))
    return pi, nu


@pytest.mark.parametrize("adversarial", [False, True])
@pytest.mark.parametrize("c", [2, 3, 6])
def test_batched_site_algebra_matches_the_reference_twin(c, adversarial):
    rng = np.random.default_rng(10 * c + adversarial)
    n = 24
    pi, nu = _random_sites(rng, n, c, adversarial)
    delta = rng.uniform(0.0, 0.8, n)
    if adversarial:
        delta[::4] = 0.0
        delta[1::4] = 1e-9
    kappa, h = mn.effective_sites(pi, nu, delta)
    P = mn.outer_site_precisions(kappa)
    for i in range(n):
        # the twin forms diag(π) - π πᵀ / Σπ, whose entries cancel to about eps · max π
        P_ref, h_ref = ref.effective_site(pi[i], nu[i], delta[i])
        scale = pi[i].max() * (1.0 + np.abs(nu[i]).max())
        np.testing.assert_allclose(P[i], P_ref, rtol=1e-9, atol=1e-12 * scale)
        np.testing.assert_allclose(h[i], h_ref, rtol=1e-9, atol=1e-12 * scale)
    # marginals of a proper posterior that includes the sites: S = (S_cav⁻¹ + P)⁻¹
    root = rng.normal(size=(n, c, c))
    cav_cov = root @ np.transpose(root, (0, 2, 1)) + 0.3 * np.eye(c)
    cav_mean = rng.normal(size=(n, c))
    S = np.linalg.inv(np.linalg.inv(cav_cov) + P)
    mu = np.einsum("iab,ib->ia", S, np.einsum("iab,ib->ia", np.linalg.inv(cav_cov), cav_mean) + h)
    C, m = mn.cavities_from_marginals(S, mu, P, h)
    log_norm = mn.site_log_normalisers(C, m, P, h)
    a, fitc_term = mn.gradient_terms(mu, C, P, h, fitc=True)
    for i in range(n):
        C_ref, m_ref = ref.cavity(S[i], mu[i], P[i], h[i])
        scale = np.abs(C_ref).max()
        # both sides solve with I - S P (the twin through S⁻¹): errors of eps times its condition
        rtol = max(1e-7, 1e-14 * np.linalg.cond(np.eye(c) - S[i] @ P[i]) * np.linalg.cond(S[i]))
        np.testing.assert_allclose(C[i], C_ref, rtol=rtol, atol=rtol * scale)
        np.testing.assert_allclose(m[i], m_ref, rtol=rtol, atol=rtol * max(1.0, np.abs(m_ref).max()))
        expected = ref.site_log_normaliser(C_ref, m_ref, P[i], h[i])
        assert log_norm[i] == pytest.approx(expected, rel=1e-7, abs=1e-7 * max(1.0, abs(expected)))
        a_ref, c_ref = ref.fitc_gradient_term(mu[i], C_ref, P[i], h[i])
        np.testing.assert_allclose(a[i], a_ref, rtol=1e-7, atol=1e-7 * max(1.0, np.abs(a_ref).max()))
        assert fitc_term[i] == pytest.approx(c_ref, rel=1e-6, abs=1e-6 * max(1.0, abs(c_ref)))


def test_posterior_and_marginals_match_the_kronecker_reference():
    rng = np.random.default_rng(4)
    n, m, c = 30, 5, 4
    Vt = rng.normal(size=(n, m))
    pi, nu = _random_sites(rng, n, c)
    delta = rng.uniform(0.0, 0.5, n)
    kappa, h = mn.effective_sites(pi, nu, delta)
    P = mn.outer_site_precisions(kappa)
    post = mn.MultinomialSparsePosterior(*mn.site_sums(Vt, kappa, h), c)
    A, mean_ref = ref.posterior(Vt, list(P), list(h))
    np.testing.assert_allclose(post.mean_w.ravel(), mean_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(post.cov_w, np.linalg.inv(A), rtol=1e-10, atol=1e-12)
    assert post.log_det == pytest.approx(np.linalg.slogdet(A)[1], rel=1e-12)
    mean, S = post.marginals(Vt)
    for i in range(n):
        mu_ref, S_ref = ref.marginal(A, mean_ref, Vt[i], c)
        np.testing.assert_allclose(mean[i], mu_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(S[i], S_ref, rtol=1e-10, atol=1e-12)


def test_invariant_holds_after_many_outer_iterations():
    """After an EP run the posterior precision is I + Σ P_i ⊗ b_i b_iᵀ of the returned sites."""
    X, y = three_classes(80, 5)
    rng = np.random.default_rng(5)
    _, Vt, d = projections(X, X[rng.choice(80, 10, replace=False)], RBF(2.0, 0.5), "fitc")
    engine = mn.MultinomialSparseEP(Vt, d, y, 3, np.zeros((80, 3)), np.zeros((80, 3)), damping=0.7, tol=1e-10,
                                    max_sweeps=300)
    assert engine.run().converged
    pi, nu = engine.state["pi"], engine.state["nu"]
    Ps, hs = [], []
    for i in range(80):
        P_i, h_i = ref.effective_site(pi[i], nu[i], d[i])
        Ps.append(P_i)
        hs.append(h_i)
    A, mean_ref = ref.posterior(Vt, Ps, hs)
    np.testing.assert_allclose(np.linalg.inv(engine.posterior.cov_w), A, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(engine.posterior.mean_w.ravel(), mean_ref, rtol=1e-8, atol=1e-10)


# -- the estimator ----------------------------------------------------------------------------------
def test_default_multinomial_classifier_fits_and_predicts_on_the_simplex():
    X, y = three_classes(150, 6)
    labels = np.array(["a", "b", "c"])[y]
    clf = SparseGPClassifier(multi_class="multinomial").fit(X, labels)
    proba = clf.predict_proba(X)
    assert proba.shape == (150, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(proba > 0)
    assert list(clf.classes_) == ["a", "b", "c"]
    assert clf.score(X, labels) > 0.8
    assert np.array_equal(clf.predict(X), clf.classes_[np.argmax(proba, axis=1)])
    assert clf.decision_function(X).shape == (150, 3)
    assert clf.site_precision_.shape == (3, 150)
    assert clf.inducing_inputs_.shape == (clf.n_inducing_, 2)
    assert np.isfinite(clf.log_marginal_likelihood_value_)
    assert clf.learning_ == "full-batch"


def test_multinomial_fit_is_bitwise_repeatable_and_round_trips_through_save_and_load(tmp_path):
    X, y = three_classes(90, 7)
    first = SparseGPClassifier(multi_class="multinomial", n_inducing=12, random_state=1).fit(X, y)
    second = SparseGPClassifier(multi_class="multinomial", n_inducing=12, random_state=1).fit(X, y)
    assert np.array_equal(first.predict_proba(X), second.predict_proba(X))
    save(first, tmp_path / "model.npz")
    loaded = load(tmp_path / "model.npz")
    assert np.array_equal(loaded.predict_proba(X), first.predict_proba(X))


def test_two_class_multinomial_estimator_matches_the_binary_probit_estimator():
    """Equal kernels (fixed), Z and FITC: the two-class joint model's probabilities are those of the
    binary probit model on (f_1 - f_0)/√2, whose variance is the joint kernel's."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(80, 2))
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.4 * rng.normal(size=80) > 0).astype(int)
    Z = X[:10].copy()
    common = dict(optimizer=None, inducing_init=Z, tol=1e-11, max_sweeps=1000)
    joint = SparseGPClassifier(RBF(1.5, 0.6), multi_class="multinomial", **common).fit(X, y)
    binary = SparseGPClassifier(RBF(1.5, 0.6), schedule="parallel", **common).fit(X, y)
    assert joint.log_marginal_likelihood_value_ == pytest.approx(binary.log_marginal_likelihood_value_, abs=1e-7)
    np.testing.assert_allclose(joint.predict_proba(X), binary.predict_proba(X), atol=1e-6)


def test_multinomial_refuses_other_likelihoods_power_and_one_class():
    X, y = three_classes(40, 9)
    with pytest.raises(ValueError, match="multinomial probit"):
        SparseGPClassifier(likelihood=Logistic(), multi_class="multinomial").fit(X, y)
    with pytest.raises(ValueError, match="multinomial probit"):
        SparseGPClassifier(learn_likelihood=True, multi_class="multinomial").fit(X, y)
    with pytest.raises(ValueError, match="power"):
        SparseGPClassifier(power=0.5, multi_class="multinomial").fit(X, y)
    with pytest.raises(ValueError, match="two classes"):
        SparseGPClassifier(multi_class="multinomial").fit(X, np.zeros(40))
    with pytest.raises(ValueError, match="multi_class"):
        SparseGPClassifier(multi_class="joint").fit(X, y)
    clf = SparseGPClassifier(multi_class="multinomial")
    with pytest.raises(ValueError):
        clf.fit(X[:, :1] * np.nan, y)
    assert not hasattr(clf, "classes_")


def test_selection_across_classes_takes_rows_from_every_class():
    X, y = three_classes(200, 10)
    Z = mn.select_across_classes(X, y, 3, RBF(1.0, 1.0), 30)
    assert Z.shape == (30, 2)
    rows = [int(np.flatnonzero(np.all(X == z, axis=1))[0]) for z in Z]
    assert len(set(rows)) == 30
    assert set(y[rows]) == {0, 1, 2}


# -- minibatch EP -----------------------------------------------------------------------------------
def test_one_minibatch_of_all_points_is_full_batch_ep_with_its_evidence_and_gradient():
    """Per-point sites, one minibatch of every point, step 1: each update is one outer iteration
    of full-batch EP; the evidence estimate on all rows and the gradient estimate are the exact ones."""
    from fastep._sparse.multinomial_minibatch import MinibatchMultinomialSparseEP
    from fastep._sparse.stochastic import RowSource

    X, y = three_classes(60, 11)
    Z = X[:8] + 0.05
    kernel = RBF(1.4, 0.6)
    options = SparseFitOptions(approximation="fitc", jitter=1e-8, damping=1.0, tol=0.0, max_sweeps=6, n_classes=3)
    problem = mn.MultinomialSparseProblem(kernel, Z, X, y, 3, options)
    log_z, grad, _ = problem.evaluate((kernel, None, Z), gradient=True, warm=False)
    state = MinibatchMultinomialSparseEP(kernel, None, Z, 60, options, sites="per-point", window=60)
    for _ in range(6):
        state.update(X, y.astype(float), np.arange(60), step=1.0)
    np.testing.assert_allclose(state.inner_precision, problem.inner_precision, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(state.inner_natural_mean, problem.inner_natural_mean, rtol=1e-9, atol=1e-12)
    estimate, se = state.log_evidence_estimate(RowSource(X, y), np.random.default_rng(0), rows=100)
    assert se == 0.0
    assert estimate == pytest.approx(log_z, abs=1e-8)
    out = state.update(X, y.astype(float), np.arange(60), step=1.0, gradient=True)
    np.testing.assert_allclose(out["gradient"], grad, rtol=1e-7, atol=1e-9)


def _three_class_rows(n, seed):
    """Three classes from x0, -x0 and x1 (x2 irrelevant), Gumbel noise: the Bayes rule is the argmax."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    scores = np.column_stack([X[:, 0], -X[:, 0], X[:, 1]]) * 2.0
    return X, np.argmax(scores + rng.gumbel(size=(n, 3)), axis=1), np.argmax(scores, axis=1)


def test_tied_sites_learn_from_minibatches_and_repeat_bitwise():
    X, y, _ = _three_class_rows(3000, 12)
    Xt, _, bayes_t = _three_class_rows(2000, 13)
    kw = dict(multi_class="multinomial", learning="minibatch", n_inducing=16, batch_size=256, max_epochs=3,
              random_state=0)
    clf = SparseGPClassifier(**kw).fit(X, y)
    again = SparseGPClassifier(**kw).fit(X, y)
    assert clf.learning_ == "minibatch" and clf.site_precision_ is None
    proba = clf.predict_proba(Xt)
    assert np.array_equal(proba, again.predict_proba(Xt))
    assert np.mean(bayes_t != np.argmax(proba, axis=1)) < 0.1     # agrees with the Bayes rule on 90 %
    assert np.isfinite(clf.log_marginal_likelihood_value_)


@pytest.mark.slow
def test_minibatch_learning_sets_the_irrelevant_input_aside():
    X, y, _ = _three_class_rows(3000, 12)
    clf = SparseGPClassifier(multi_class="multinomial", learning="minibatch", n_inducing=16, batch_size=100,
                             max_epochs=15, random_state=0).fit(X, y)
    scales = clf.kernel_.get_params()["scales"]
    assert scales[2] < 0.25 * min(scales[0], scales[1])


def test_batched_solve_matches_lapack_including_pivoting_and_singular_matrices():
    from fastep._linalg import batched_solve
    rng = np.random.default_rng(14)
    A = rng.normal(size=(50, 5, 5))
    A[:, 0, 0] = 0.0                                   # pivoting needed
    A[7] = np.outer(np.arange(5.0), np.ones(5))        # singular
    B = rng.normal(size=(50, 5, 3))
    x, sign, log_det = batched_solve(A, B)
    vector, _, _ = batched_solve(A, B[:, :, 0])
    good = np.arange(50) != 7
    np.testing.assert_allclose(x[good], np.linalg.solve(A[good], B[good]), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(vector[good], x[good][:, :, 0], rtol=1e-12, atol=1e-14)
    ref_sign, ref_log_det = np.linalg.slogdet(A[good])
    np.testing.assert_array_equal(sign[good], ref_sign)
    np.testing.assert_allclose(log_det[good], ref_log_det, rtol=1e-10)
    assert sign[7] == 0.0
