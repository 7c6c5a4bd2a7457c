"""The compiled IVM selection engine (fastep._epcore.ivm) against its plain-numpy twin and closed forms."""
import numpy as np
import pytest
from scipy.linalg import cho_solve, cholesky

from fastep._epcore import ivm as engine
from fastep.kernels import MLP, RBF, Bias, Linear, White
from fastep.likelihoods import Gaussian, OrderedCategorical, Probit
from fastep.reference import ivm as ref
from fastep.reference import sites as ref_sites


def _problem(kind, n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    f = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    if kind == "probit":
        y = np.where(f + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
        lik = Probit(slope=float(rng.uniform(0.5, 3.0)), bias=float(rng.normal(0, 0.3)))
        p = lik.get_params()
        moments = lambda yy, m, v: ref_sites.probit_moments(yy, m, v, slope=p["slope"], bias=p["bias"])  # noqa: E731
        spherical = None
    elif kind == "gaussian":
        y = f + 0.2 * rng.normal(size=n)
        lik = Gaussian(noise_variance=float(rng.uniform(0.01, 0.5)))
        nv = lik.noise_variance
        moments = lambda yy, m, v: ref_sites.gaussian_moments(yy, m, v, noise_variance=nv)  # noqa: E731
        spherical = nv
    else:
        y = np.digitize(f, [-0.5, 0.3, 1.0]).astype(float)
        lik = OrderedCategorical(4, slope=2.0, bias=-0.5, widths=[0.8, 0.7])
        moments = lambda yy, m, v: ref_sites.ordinal_moments(yy, m, v, slope=2.0, bias=-0.5,  # noqa: E731
                                                             widths=[0.8, 0.7])
        spherical = None
    kernel = RBF(variance=float(rng.uniform(0.5, 2.0)), inverse_width=float(rng.uniform(0.2, 2.0))) \
        + Linear(0.2) + Bias(0.1) + White(0.05)
    return X, y, lik, moments, spherical, kernel


@pytest.mark.parametrize("kind", ["probit", "gaussian", "ordinal"])
@pytest.mark.parametrize("criterion", ["entropy", "info_gain"])
@pytest.mark.parametrize("seed", [0, 1])
def test_engine_matches_full_covariance_twin(kind, criterion, seed):
    n, d = 120, 35
    X, y, lik, moments, spherical, kernel = _problem(kind, n, seed)
    sigma2 = 0.0 if seed == 0 else 0.05
    K = kernel(X)
    cols = kernel.columns(X)
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, engine.IVMOptions(d, criterion=criterion),
                            sigma2=sigma2)
    chosen = state.select(d, cols)
    twin = ref.select(K, y, moments, d, sigma2=sigma2, criterion=criterion, spherical_noise=spherical)
    # same points in the same order
    np.testing.assert_array_equal(chosen, twin["active"])
    np.testing.assert_array_equal(state.active, twin["active"])
    np.testing.assert_allclose(state.chosen_score, twin["scores"], rtol=1e-9, atol=1e-12)
    # same sites and posterior marginals
    np.testing.assert_allclose(state.site_mean, twin["site_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.site_precision, twin["site_precision"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_mean, twin["post_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_var, np.diag(twin["post_cov"]), rtol=1e-9, atol=1e-10)
    # the low-rank representation: Σ = K - MᵀM (eq 29)
    np.testing.assert_allclose(K - state.M.T @ state.M, twin["post_cov"], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind", ["probit", "gaussian"])
def test_cholesky_rows_and_M_are_the_seeger_factors(kind):
    n, d = 90, 30
    X, y, lik, _, _, kernel = _problem(kind, n, 3)
    cols = kernel.columns(X)
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, d, sigma2=0.01)
    state.select(d, cols)
    idx = state.active
    K = kernel(X)
    sb = np.sqrt(state.site_precision[idx])
    B = np.eye(d) + sb[:, None] * K[np.ix_(idx, idx)] * sb[None, :]
    L = state.L
    assert np.allclose(np.triu(L, 1), 0.0)
    np.testing.assert_allclose(L @ L.T, B, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(L, cholesky(B, lower=True), rtol=1e-9, atol=1e-11)
    # M = L⁻¹ B_I^½ K[I, :]
    np.testing.assert_allclose(state.M, np.linalg.solve(L, sb[:, None] * K[idx, :]), rtol=1e-9, atol=1e-11)
    # eq 32 and the prediction weights from L agree with the dense formulas
    m_I = state.site_mean[idx]
    assert state.log_likelihood() == pytest.approx(
        ref.log_likelihood(K[np.ix_(idx, idx)], m_I, state.site_precision[idx]), rel=1e-11)
    C = K[np.ix_(idx, idx)] + np.diag(1.0 / state.site_precision[idx])
    np.testing.assert_allclose(state.weights(), np.linalg.solve(C, m_I), rtol=1e-9, atol=1e-12)
    # the posterior mean at the training points is K[:, I] w
    np.testing.assert_allclose(K[:, idx] @ state.weights(), state.post_mean, rtol=1e-9, atol=1e-10)


def test_all_points_with_gaussian_noise_is_exact_gp_regression():
    n = 60
    X, y, _, _, _, _ = _problem("gaussian", n, 5)
    kernel = RBF(1.2, 0.7) + Linear(0.3)
    noise = 0.04
    cols = kernel.columns(X)
    state = engine.IVMEP(y, Gaussian(noise_variance=noise).site_spec(), cols.diag, n)
    state.select(n, cols)
    assert sorted(state.active) == list(range(n))
    K = kernel(X)
    c = cholesky(K + noise * np.eye(n), lower=True)
    alpha = cho_solve((c, True), y)
    np.testing.assert_allclose(state.post_mean, K @ alpha, rtol=1e-9, atol=1e-10)
    Sigma = K - K @ cho_solve((c, True), K)
    np.testing.assert_allclose(state.post_var, np.diag(Sigma), rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(state.site_mean, y, rtol=0, atol=0)
    np.testing.assert_allclose(state.site_precision, 1.0 / noise, rtol=1e-15)
    log_ml = -0.5 * y @ alpha - np.sum(np.log(np.diag(c))) - 0.5 * n * np.log(2 * np.pi)
    assert state.log_likelihood() == pytest.approx(log_ml, rel=1e-11)


def test_scoring_paths_agree_and_ties_go_to_the_lowest_index():
    # Gaussian noise with a stationary kernel: every point has the same prior variance,
    # so the first scores tie exactly and point 0 must be chosen.
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(50, 2))
    kernel = RBF(1.0, 3.0)
    cols = kernel.columns(X)
    y = rng.normal(size=50)
    state = engine.IVMEP(y, Gaussian(0.1).site_spec(), cols.diag, 10)
    assert state.score() == 0
    assert state.score_per_site() == 0
    # Duplicate the best later point: the copy with the lower index wins.
    X2 = np.vstack([X, X[17]])
    X2[0] = X2[1]                                      # 0 and 1 are identical as well
    y2 = np.append(y, y[17])
    for path in ("score", "score_per_site"):
        st = engine.IVMEP(y2, Gaussian(0.1).site_spec(), kernel.columns(X2).diag, 10)
        chosen = st.select(10, kernel.columns(X2))
        assert chosen[0] == 0
        scores = np.array(st.score_values)
        best = getattr(st, path)()
        eligible = ~np.array(st.is_active)
        assert best == int(np.flatnonzero(eligible & (scores == scores[eligible].max()))[0])


@pytest.mark.parametrize("kind", ["probit", "ordinal"])
def test_vectorised_and_per_site_scoring_are_identical(kind):
    X, y, lik, _, _, kernel = _problem(kind, 80, 4)
    cols = kernel.columns(X)
    a = engine.IVMEP(y, lik.site_spec(), cols.diag, 20, sigma2=0.02)
    b = engine.IVMEP(y, lik.site_spec(), cols.diag, 20, sigma2=0.02)
    for _ in range(20):
        i = a.score()
        j = b.score_per_site()
        assert i == j
        np.testing.assert_array_equal(np.array(a.score_values), np.array(b.score_values))
        np.testing.assert_array_equal(np.array(a.nu), np.array(b.nu))
        a.include_point(i, cols(i))
        b.include_point(j, cols(j))
    np.testing.assert_array_equal(np.array(a.M), np.array(b.M))


def test_random_criterion_is_seeded_and_valid():
    X, y, lik, _, _, kernel = _problem("probit", 100, 6)
    cols = kernel.columns(X)

    def run(seed):
        st = engine.IVMEP(y, lik.site_spec(), cols.diag,
                             engine.IVMOptions(30, criterion=engine.CRITERION_RANDOM, seed=seed))
        return st.select(30, cols), st

    a, st = run(7)
    b, _ = run(7)
    c, _ = run(8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) == 30
    # the random choice differs from the greedy one, and the sites are still the ADF ones
    greedy = engine.IVMEP(y, lik.site_spec(), cols.diag, 30)
    assert not np.array_equal(greedy.select(30, cols), a)
    K = kernel(X)
    sb = np.sqrt(st.site_precision[a])
    B = np.eye(30) + sb[:, None] * K[np.ix_(a, a)] * sb[None, :]
    np.testing.assert_allclose(st.L @ st.L.T, B, rtol=1e-11, atol=1e-11)


def test_state_is_usable_step_by_step_and_views_are_read_only():
    X, y, lik, _, _, kernel = _problem("probit", 40, 8)
    cols = kernel.columns(X)
    st = engine.IVMEP(y, lik.site_spec(), cols.diag, 5)
    i = st.score()
    st.include_point(i, cols(i))
    assert st.n_active == 1 and st.active.tolist() == [i]
    assert st.M.shape == (1, 40) and st.L.shape == (1, 1)
    with pytest.raises(ValueError):
        st.post_mean[0] = 1.0
    # the MLP kernel goes through the same path
    k2 = MLP(1.0, 2.0, 1.0) + White(0.01)
    c2 = k2.columns(X)
    st2 = engine.IVMEP(y, lik.site_spec(), c2.diag, 10)
    st2.select(10, c2)
    assert st2.n_active == 10


def test_bad_input_raises_naming_the_argument_and_leaves_state_unchanged():
    X, y, lik, _, _, kernel = _problem("probit", 30, 9)
    cols = kernel.columns(X)
    spec = lik.site_spec()
    with pytest.raises(ValueError, match="d_max"):
        engine.IVMEP(y, spec, cols.diag, 31)
    with pytest.raises(ValueError, match="d_max"):
        engine.IVMEP(y, spec, cols.diag, 0)
    with pytest.raises(ValueError, match="criterion"):
        engine.IVMOptions(5, criterion=7)
    with pytest.raises(ValueError, match="diag_k"):
        engine.IVMEP(y, spec, np.where(np.arange(30) == 4, 0.0, cols.diag), 5)
    with pytest.raises(ValueError, match="diag_k"):
        engine.IVMEP(y, spec, cols.diag[:-1], 5)
    with pytest.raises(ValueError, match="y"):
        engine.IVMEP(np.where(np.arange(30) == 3, np.nan, y), spec, cols.diag, 5)
    with pytest.raises(ValueError, match=r"y\[2\]"):
        engine.IVMEP(np.where(np.arange(30) == 2, 0.5, y), spec, cols.diag, 5)
    with pytest.raises(ValueError, match="sigma2"):
        engine.IVMEP(y, spec, cols.diag, 5, sigma2=-1.0)
    st = engine.IVMEP(y, spec, cols.diag, 2)
    with pytest.raises(ValueError, match="column"):
        st.include_point(0, cols(0)[:-1])
    with pytest.raises(ValueError, match="column"):
        st.include_point(0, np.full(30, np.nan))
    with pytest.raises(ValueError, match="point"):
        st.include_point(30, cols(0))
    assert st.n_active == 0
    np.testing.assert_array_equal(st.post_var, cols.diag)
    st.include_point(0, cols(0))
    with pytest.raises(ValueError, match="already active"):
        st.include_point(0, cols(0))
    st.include_point(1, cols(1))
    with pytest.raises(ValueError, match="full"):
        st.include_point(2, cols(2))
    with pytest.raises(ValueError, match="n_points"):
        st.select(1, cols)
    with pytest.raises(ValueError, match="column_fn"):
        engine.IVMEP(y, spec, cols.diag, 3).select(1, lambda j: np.ones(3))


def test_read_only_targets_and_diagonal_are_accepted():
    X, y, lik, _, _, kernel = _problem("probit", 30, 9)
    cols = kernel.columns(X)
    y_ro, diag_ro = y.copy(), np.array(cols.diag)
    y_ro.setflags(write=False)
    diag_ro.setflags(write=False)
    st = engine.IVMEP(y_ro, lik.site_spec(), diag_ro, 5)
    ref_st = engine.IVMEP(y, lik.site_spec(), np.array(cols.diag), 5)
    np.testing.assert_array_equal(st.select(5, cols), ref_st.select(5, cols))
    np.testing.assert_array_equal(st.post_var, ref_st.post_var)


def test_a_kernel_that_is_not_psd_raises_linalg_error():
    n = 20
    rng = np.random.default_rng(0)
    A = rng.normal(size=(n, n))
    K = A + A.T
    np.fill_diagonal(K, 1.0)                          # positive diagonal, strongly indefinite
    y = rng.normal(size=n)
    st = engine.IVMEP(y, Gaussian(0.5).site_spec(), np.diag(K).copy(), n)
    with pytest.raises((np.linalg.LinAlgError, RuntimeError)):
        st.select(n, lambda j: K[:, j])


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_active_set_evidence_matches_the_dense_twin(scale):
    """Eq 32 and the weights from the factor of A = I + B^½ K_I B^½ (the one implementation the
    engine and the estimators share) against a dense Cholesky of K_I + B⁻¹."""
    rng = np.random.default_rng(3)
    d = 12
    F = rng.normal(size=(d, d + 3))
    K_I = F @ F.T / d + 1e-3 * np.eye(d)
    beta = scale * rng.uniform(0.1, 10.0, size=d)
    m = rng.normal(size=d)
    sb = np.sqrt(beta)
    L = np.linalg.cholesky(np.eye(d) + sb[:, None] * K_I * sb[None, :])
    value, w = engine.active_set_evidence(L, m, beta)
    assert value == pytest.approx(ref.log_likelihood(K_I, m, beta), rel=1e-10, abs=1e-9)
    np.testing.assert_allclose(w, np.linalg.solve(K_I + np.diag(1.0 / beta), m), rtol=1e-8,
                               atol=1e-10 * np.max(np.abs(w)))
