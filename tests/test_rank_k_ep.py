"""Tests of the compiled rank-k Gaussian EP engine (fastep._epcore.rank_k_ep).

Checks: exact conjugate answers (MVGAUSSIAN), equivalence with k rank-1 updates,
compiled vs the plain-numpy reference twin, the refresh invariant, Gauss-Hermite
PRODUCT moments vs brute-force integration, the regrouped log evidence vs the
literal Minka eqs 48-49/109, the skip policy and input errors.
"""
import warnings

import numpy as np
import pytest
from numpy.linalg import LinAlgError
from scipy import integrate, special, stats

from engine_helpers import rank_k_log_evidence, run_rank_k_ep
from fastep._epcore import rank_k_ep as engine
from fastep._epcore.rank_k_ep import RankKEPOptions, RankKLikelihood, tilted_moments
from fastep._epcore.sites import SiteSpec
from fastep.linear import ConvergenceWarning, LinearEPRankK
from fastep.reference import rank_k_ep as ref

from fastep._epcore.sites import LIKELIHOOD_CODES
from fastep.likelihoods import Logistic, Probit

LIK_PROBIT, LIK_STEP, LIK_GAUSSIAN = (LIKELIHOOD_CODES[c] for c in ("probit", "step", "gaussian"))


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def random_spd(rng, n, jitter=0.5):
    A = rng.normal(size=(n, n))
    return A @ A.T / n + jitter * np.eye(n)


def problem(seed, n=6, k=3, d=5, correlated_noise=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k, d))
    R = random_spd(rng, k) if correlated_noise else np.diag(rng.uniform(0.3, 2.0, size=k))
    V0 = random_spd(rng, d, 1.0)
    m0 = rng.normal(size=d)
    w = rng.multivariate_normal(m0, V0)
    Y = np.einsum('nkd,d->nk', X, w) + rng.multivariate_normal(np.zeros(k), R, size=n)
    return X, Y, m0, V0, R


def conjugate(X, Y, m0, V0, R):
    """Closed-form posterior and log marginal likelihood of the stacked regression."""
    n, k, d = X.shape
    Xs = X.reshape(n * k, d)
    Rb = np.kron(np.eye(n), R)
    prec = np.linalg.inv(V0) + Xs.T @ np.linalg.solve(Rb, Xs)
    V = np.linalg.inv(prec)
    m = V @ (np.linalg.solve(V0, m0) + Xs.T @ np.linalg.solve(Rb, Y.ravel()))
    log_ev = stats.multivariate_normal(Xs @ m0, Xs @ V0 @ Xs.T + Rb).logpdf(Y.ravel())
    return m, V, log_ev


def run(X, Y, m0, V0, lik, P=None, b=None, **kw):
    n, k, d = X.shape
    P = np.zeros((n, k, k)) if P is None else P.copy()
    b = np.zeros((n, k)) if b is None else b.copy()
    m, V = np.empty(d), np.empty((d, d))
    info = run_rank_k_ep(X, Y, m0, V0, lik, P, b, m, V, **kw)
    return m, V, P, b, info


def gaussian_site(noise_var):
    return SiteSpec(LIK_GAUSSIAN, [noise_var])


def probit_log_lik(slope, bias):
    # t(f) = Phi(slope * y * (f + bias)).
    return lambda y, z: special.log_ndtr(slope * y * (z + bias))


def probit_moments_1d(slope, bias):
    def moments(y, mu, var):
        c = 1.0 / np.sqrt(slope ** -2 + var)
        z = y * (mu + bias) * c
        r = np.exp(-0.5 * z * z - 0.5 * np.log(2 * np.pi) - special.log_ndtr(z))
        return special.log_ndtr(z), y * c * r, c * c * r * (z + r)
    return moments


# ---------------------------------------------------------------------------
# MVGAUSSIAN: EP is exact
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mvgaussian_equals_conjugate(seed):
    X, Y, m0, V0, R = problem(seed)
    lik = RankKLikelihood.mvgaussian(R)
    m, V, P, b, info = run(X, Y, m0, V0, lik)
    mc, Vc, evc = conjugate(X, Y, m0, V0, R)
    assert info.converged and info.n_skipped == 0 and info.n_sweeps <= 3
    np.testing.assert_allclose(m, mc, rtol=0, atol=1e-10 * (1 + np.abs(mc).max()))
    np.testing.assert_allclose(V, Vc, rtol=0, atol=1e-11)
    # Exact sites: P_i = R^{-1}, b_i = R^{-1} y_i.
    Rinv = np.linalg.inv(R)
    np.testing.assert_allclose(P, np.broadcast_to(Rinv, P.shape), atol=1e-10)
    np.testing.assert_allclose(b, Y @ Rinv, atol=1e-10)
    ev = rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
    assert abs(ev - evc) < 1e-10 * max(1.0, abs(evc))
    assert np.array_equal(V, V.T)


def test_mvgaussian_diagonal_noise_equals_rank1_rows():
    """A rank-k Gaussian factor with diagonal R equals k rank-1 Gaussian factors."""
    X, Y, m0, V0, R = problem(5, n=5, k=3, d=4, correlated_noise=False)
    n, k, d = X.shape
    m, V, P, b, _ = run(X, Y, m0, V0, RankKLikelihood.mvgaussian(R))
    ev = rank_k_log_evidence(X, Y, m0, V0, RankKLikelihood.mvgaussian(R), P, b)
    # Closed form from k*n scalar rows.
    Xs = X.reshape(n * k, 1, d)
    noise = np.tile(np.diag(R), n)
    prec = np.linalg.inv(V0) + sum(x.T @ x / s for x, s in zip(Xs, noise))
    Vc = np.linalg.inv(prec)
    mc = Vc @ (np.linalg.solve(V0, m0) + sum(x[0] * yy / s for x, yy, s in zip(Xs, Y.ravel(), noise)))
    evc = stats.multivariate_normal(Xs[:, 0] @ m0, Xs[:, 0] @ V0 @ Xs[:, 0].T + np.diag(noise)).logpdf(
        Y.ravel())
    np.testing.assert_allclose(m, mc, atol=1e-10)
    np.testing.assert_allclose(V, Vc, atol=1e-11)
    assert abs(ev - evc) < 1e-10 * max(1, abs(evc))
    # And k*n rank-1 EP updates (reference twin, k = 1, per-row noise) agree too.
    mom1 = lambda i, h, L: ref.mvgaussian_moments(Y.ravel()[i:i + 1], h, L, noise[i] * np.eye(1))
    r = ref.run_rank_k_ep(Xs, Y.reshape(-1, 1), m0, V0, mom1)
    np.testing.assert_allclose(r['post_mean'], m, atol=1e-10)
    np.testing.assert_allclose(r['post_cov'], V, atol=1e-11)
    np.testing.assert_allclose(r['site_precision'].reshape(n, k), np.einsum('nkk->nk', P), atol=1e-10)
    ev1 = ref.log_evidence(Xs, Y.reshape(-1, 1), m0, V0, mom1, r['site_precision'], r['site_natural_mean'])
    assert abs(ev1 - ev) < 1e-10 * max(1, abs(evc))


# ---------------------------------------------------------------------------
# PRODUCT vs rank-1 updates with independent projections
# ---------------------------------------------------------------------------
def block_problem(seed, n=6, k=3, block=2):
    """Output j of every factor touches only coordinate block j; V0 diagonal."""
    rng = np.random.default_rng(seed)
    d = k * block
    X = np.zeros((n, k, d))
    for j in range(k):
        X[:, j, j * block:(j + 1) * block] = rng.normal(size=(n, block))
    V0 = np.diag(rng.uniform(0.5, 2.0, size=d))
    m0 = rng.normal(size=d) * 0.3
    return rng, X, m0, V0


def assert_product_equals_rank1(X, Y, m0, V0, site, damping, sweeps):
    n, k, d = X.shape
    lik = RankKLikelihood.product(site)
    m, V, P, b, info = run(X, Y, m0, V0, lik, damping=damping, tol=0.0, max_sweeps=sweeps)
    assert info.n_sweeps == sweeps and info.n_skipped == 0
    # Off-diagonal site precisions stay exactly zero: the separable path was taken.
    off = P - np.einsum('nkk->nk', P)[:, :, None] * np.eye(k)
    assert np.all(off == 0.0)
    # Same schedule as n*k rank-1 factors: factor i output 0, 1, ..., k-1.
    X1 = X.reshape(n * k, 1, d)
    Y1 = Y.reshape(n * k, 1)
    m1, V1, P1, b1, _ = run(X1, Y1, m0, V0, lik, damping=damping, tol=0.0, max_sweeps=sweeps)
    np.testing.assert_allclose(np.einsum('nkk->nk', P).ravel(), P1.ravel(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.ravel(), b1.ravel(), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(m, m1, atol=1e-11)
    np.testing.assert_allclose(V, V1, atol=1e-12)
    ev = rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
    ev1 = rank_k_log_evidence(X1, Y1, m0, V0, lik, P1, b1)
    assert abs(ev - ev1) < 1e-10 * max(1, abs(ev))
    return m, V, P, b, ev


@pytest.mark.parametrize("damping", [1.0, 0.6])
def test_product_gaussian_equals_rank1_and_closed_form(damping):
    rng, X, m0, V0 = block_problem(3)
    n, k, d = X.shape
    noise = 0.7
    Y = np.einsum('nkd,d->nk', X, rng.normal(size=d)) + rng.normal(size=(n, k))
    m, V, P, b, ev = assert_product_equals_rank1(X, Y, m0, V0, gaussian_site(noise), damping,
                                                 sweeps=60 if damping < 1 else 2)
    mc, Vc, evc = conjugate(X, Y, m0, V0, noise * np.eye(k))
    np.testing.assert_allclose(m, mc, atol=1e-10)
    np.testing.assert_allclose(V, Vc, atol=1e-10)
    assert abs(ev - evc) < 1e-9 * max(1, abs(evc))


@pytest.mark.parametrize("damping", [1.0, 0.5])
def test_product_probit_equals_rank1(damping):
    rng, X, m0, V0 = block_problem(4)
    n, k, d = X.shape
    Y = np.where(rng.uniform(size=(n, k)) < 0.5, -1.0, 1.0)
    site = SiteSpec(LIK_PROBIT, [1.3, 0.2])
    assert_product_equals_rank1(X, Y, m0, V0, site, damping, sweeps=8)
    # And against the reference twin with its own probit moments (rank-k diagonal path).
    mom1 = probit_moments_1d(1.3, 0.2)
    mom = lambda i, h, L: ref.product_moments_diagonal(Y[i], h, L, mom1)
    r = ref.run_rank_k_ep(X, Y, m0, V0, mom, damping=damping, tol=0.0, max_sweeps=8)
    m, V, P, b, _ = run(X, Y, m0, V0, RankKLikelihood.product(site), damping=damping, tol=0.0, max_sweeps=8)
    np.testing.assert_allclose(m, r['post_mean'], atol=1e-9)
    np.testing.assert_allclose(P, r['site_precision'], atol=1e-9)


# ---------------------------------------------------------------------------
# Compiled vs reference twin
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed,damping", [(10, 1.0), (11, 0.7), (12, 0.4)])
def test_compiled_vs_reference_mvgaussian_trajectory(seed, damping):
    X, Y, m0, V0, R = problem(seed, n=5, k=2, d=4)
    lik = RankKLikelihood.mvgaussian(R)
    mom = lambda i, h, L: ref.mvgaussian_moments(Y[i], h, L, R)
    for sweeps in (1, 3):
        m, V, P, b, info = run(X, Y, m0, V0, lik, damping=damping, tol=0.0, max_sweeps=sweeps)
        r = ref.run_rank_k_ep(X, Y, m0, V0, mom, damping=damping, tol=0.0, max_sweeps=sweeps)
        np.testing.assert_allclose(P, r['site_precision'], atol=1e-10)
        np.testing.assert_allclose(b, r['site_natural_mean'], atol=1e-10)
        np.testing.assert_allclose(m, r['post_mean'], atol=1e-10)
        np.testing.assert_allclose(V, r['post_cov'], atol=1e-10)
        ev = rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
        assert abs(ev - ref.log_evidence(X, Y, m0, V0, mom, P, b)) < 1e-9


@pytest.mark.parametrize("seed", [20, 21])
def test_compiled_vs_reference_product_quadrature(seed):
    """Correlated cavities: the PRODUCT moments go through tensor Gauss-Hermite."""
    X, Y, m0, V0, _ = problem(seed, n=4, k=2, d=3)
    noise = 0.8
    # Few nodes on purpose: the rule is then visibly inexact, so the sites pick up
    # off-diagonal precision and the comparison exercises the full k x k algebra.
    lik = RankKLikelihood.product(gaussian_site(noise), n_nodes=3)
    log_lik = lambda yj, z: ref.gaussian_1d_log_lik(yj, z, noise)
    mom = lambda i, h, L: ref.product_moments_quadrature(Y[i], h, L, log_lik, n_nodes=3)
    m, V, P, b, info = run(X, Y, m0, V0, lik, damping=0.8, tol=0.0, max_sweeps=4)
    r = ref.run_rank_k_ep(X, Y, m0, V0, mom, damping=0.8, tol=0.0, max_sweeps=4)
    assert info.n_skipped == r["n_skipped"] == 0
    corr = [abs(L[0, 1]) / np.sqrt(L[0, 0] * L[1, 1])
            for L in (ref.cavity(X[i], m, V, P[i], b[i])[3] for i in range(len(X)))]
    assert max(corr) > 0.1                                            # correlated cavities
    assert np.any(np.abs(P[:, 0, 1]) > 1e-3)                          # non-diagonal sites
    np.testing.assert_allclose(P, r['site_precision'], atol=1e-9)
    np.testing.assert_allclose(b, r['site_natural_mean'], atol=1e-9)
    np.testing.assert_allclose(m, r['post_mean'], atol=1e-9)
    np.testing.assert_allclose(V, r['post_cov'], atol=1e-10)


def test_product_gaussian_quadrature_converges_to_exact():
    """Gaussian 1-D likelihoods in a correlated cavity: GH EP ~ the exact MVGAUSSIAN answer."""
    X, Y, m0, V0, _ = problem(30, n=5, k=2, d=4)
    noise = 1.5
    m, V, P, b, info = run(X, Y, m0, V0, RankKLikelihood.product(gaussian_site(noise), n_nodes=40))
    assert info.converged
    mc, Vc, evc = conjugate(X, Y, m0, V0, noise * np.eye(2))
    np.testing.assert_allclose(m, mc, atol=1e-7)
    np.testing.assert_allclose(V, Vc, atol=1e-7)
    ev = rank_k_log_evidence(X, Y, m0, V0, RankKLikelihood.product(gaussian_site(noise), n_nodes=40), P, b)
    assert abs(ev - evc) < 1e-6


def test_compiled_vs_reference_probit_correlated():
    """Probit outputs with correlated cavities (quadrature path), trajectory and evidence."""
    X, Y, m0, V0, _ = problem(22, n=6, k=2, d=3)
    Y = np.where(Y > 0, 1.0, -1.0)
    slope, bias = 1.5, -0.2
    lik = RankKLikelihood.product(SiteSpec(LIK_PROBIT, [slope, bias]), n_nodes=16)
    log_lik = probit_log_lik(slope, bias)
    mom = lambda i, h, L: ref.product_moments_quadrature(Y[i], h, L, log_lik, n_nodes=16)
    m, V, P, b, info = run(X, Y, m0, V0, lik, damping=0.7, tol=0.0, max_sweeps=4)
    r = ref.run_rank_k_ep(X, Y, m0, V0, mom, damping=0.7, tol=0.0, max_sweeps=4)
    assert np.any(np.abs(P[:, 0, 1]) > 1e-3)
    np.testing.assert_allclose(P, r['site_precision'], atol=1e-9)
    np.testing.assert_allclose(b, r['site_natural_mean'], atol=1e-9)
    np.testing.assert_allclose(V, r['post_cov'], atol=1e-10)
    m, V, P, b, info = run(X, Y, m0, V0, lik, tol=1e-12, max_sweeps=300)
    assert info.converged and info.n_skipped == 0
    assert all(np.all(np.linalg.eigvalsh(p) > 0) for p in P)           # log-concave: PD sites
    ev = rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
    assert abs(ev - ref.log_evidence_literal(X, Y, m0, V0, mom, P, b)) < 1e-8
    assert abs(ev - ref.log_evidence(X, Y, m0, V0, mom, P, b)) < 1e-8


# ---------------------------------------------------------------------------
# Invariant and refresh
# ---------------------------------------------------------------------------
def test_invariant_after_many_updates():
    X, Y, m0, V0, _ = problem(40, n=30, k=3, d=8)
    noise = 0.9
    lik = RankKLikelihood.product(gaussian_site(noise), n_nodes=8)
    # 40 sweeps x 30 rank-3 Woodbury updates with no refresh.
    m, V, P, b, info = run(X, Y, m0, V0, lik, damping=0.5, tol=0.0, max_sweeps=40, refresh_every=0)
    assert info.n_sweeps == 40
    m_ref, V_ref = np.empty_like(m), np.empty_like(V)
    run_rank_k_ep(X, Y, m0, V0, lik, P, b, m_ref, V_ref, max_sweeps=0)   # rebuild only
    np.testing.assert_allclose(m, m_ref, atol=1e-10 * (1 + np.abs(m_ref).max()))
    np.testing.assert_allclose(V, V_ref, atol=1e-10 * np.abs(V_ref).max())
    mr, Vr = ref.posterior_from_sites(X, m0, V0, P, b)
    np.testing.assert_allclose(m_ref, mr, atol=1e-10)
    np.testing.assert_allclose(V_ref, Vr, atol=1e-12)


def test_refresh_does_not_change_result():
    X, Y, m0, V0, R = problem(41, n=20, k=2, d=6)
    lik = RankKLikelihood.mvgaussian(R)
    a = run(X, Y, m0, V0, lik, damping=0.5, tol=0.0, max_sweeps=10, refresh_every=1)
    c = run(X, Y, m0, V0, lik, damping=0.5, tol=0.0, max_sweeps=10, refresh_every=0)
    for u, v in zip(a[:4], c[:4]):
        np.testing.assert_allclose(u, v, atol=1e-10)


def test_warm_start_from_sites():
    X, Y, m0, V0, R = problem(42, n=5, k=2, d=3)
    lik = RankKLikelihood.mvgaussian(R)
    m, V, P, b, _ = run(X, Y, m0, V0, lik)
    # Garbage in post_mean/post_cov is ignored: rebuilt from the sites on entry.
    m2, V2 = np.full(3, np.nan), np.full((3, 3), np.nan)
    info = run_rank_k_ep(X, Y, m0, V0, lik, P, b, m2, V2)
    assert info.converged and info.n_sweeps == 1
    np.testing.assert_allclose(m2, m, atol=1e-12)


# ---------------------------------------------------------------------------
# Tilted moments
# ---------------------------------------------------------------------------
CORRELATED_CAVITY = (np.array([0.3, -0.4]), np.array([[1.2, 0.7], [0.7, 0.9]]))


def brute_force_moments(y, h, Lam, log_lik):
    """log Z, a, B of prod_j f(y_j, z_j) N(z; h, Lam) by scipy dblquad (k = 2)."""
    dist = stats.multivariate_normal(h, Lam)
    sd = np.sqrt(np.diag(Lam))
    lo, hi = h - 10 * sd, h + 10 * sd

    def integral(g):
        f = lambda z1, z0: g(z0, z1) * np.exp(log_lik(y[0], z0) + log_lik(y[1], z1)) * dist.pdf([z0, z1])
        return integrate.dblquad(f, lo[0], hi[0], lo[1], hi[1], epsabs=1e-12, epsrel=1e-10)[0]

    Z = integral(lambda a, c: 1.0)
    mean = np.array([integral(lambda a, c: a), integral(lambda a, c: c)]) / Z
    s00 = integral(lambda a, c: (a - mean[0]) ** 2) / Z
    s01 = integral(lambda a, c: (a - mean[0]) * (c - mean[1])) / Z
    s11 = integral(lambda a, c: (c - mean[1]) ** 2) / Z
    C = np.array([[s00, s01], [s01, s11]])
    Li = np.linalg.inv(Lam)
    return np.log(Z), Li @ (mean - h), Li - Li @ C @ Li


@pytest.mark.slow
def test_gaussian_product_quadrature_vs_dblquad():
    h, Lam = CORRELATED_CAVITY
    y = np.array([0.9, -1.1])
    noise = 0.6
    log_lik = lambda yj, z: ref.gaussian_1d_log_lik(yj, z, noise)
    # GH error decays geometrically here: ~1e-8 at 30 nodes, ~1e-15 at 60.
    lz_c, a_c, B_c = tilted_moments(RankKLikelihood.product(gaussian_site(noise), n_nodes=60), y, h, Lam)
    lz_b, a_b, B_b = brute_force_moments(y, h, Lam, log_lik)
    lz_e, a_e, B_e = ref.mvgaussian_moments(y, h, Lam, noise * np.eye(2))   # exact
    for lz, a, B in ((lz_c, a_c, B_c), (lz_b, a_b, B_b)):
        assert abs(lz - lz_e) < 1e-10
        np.testing.assert_allclose(a, a_e, atol=1e-9)
        np.testing.assert_allclose(B, B_e, atol=1e-9)
    lz_r, a_r, B_r = ref.product_moments_quadrature(y, h, Lam, log_lik, n_nodes=60)
    assert abs(lz_r - lz_c) < 1e-12
    np.testing.assert_allclose(a_r, a_c, atol=1e-11)
    np.testing.assert_allclose(B_r, B_c, atol=1e-10)


@pytest.mark.parametrize("y", [(1.0, -1.0), pytest.param((1.0, 1.0), marks=pytest.mark.slow)])
def test_probit_product_quadrature_vs_dblquad(y):
    h, Lam = CORRELATED_CAVITY
    y = np.array(y)
    slope, bias = 2.0, 0.1
    log_lik = probit_log_lik(slope, bias)
    lik = RankKLikelihood.product(SiteSpec(LIK_PROBIT, [slope, bias]), n_nodes=60)
    lz_c, a_c, B_c = tilted_moments(lik, y, h, Lam)
    lz_b, a_b, B_b = brute_force_moments(y, h, Lam, log_lik)
    assert abs(lz_c - lz_b) < 1e-6
    np.testing.assert_allclose(a_c, a_b, atol=1e-5)
    np.testing.assert_allclose(B_c, B_b, atol=1e-4)
    lz_r, a_r, B_r = ref.product_moments_quadrature(y, h, Lam, log_lik, n_nodes=60)
    assert abs(lz_r - lz_c) < 1e-10
    np.testing.assert_allclose(a_r, a_c, atol=1e-9)
    np.testing.assert_allclose(B_r, B_c, atol=1e-8)


@pytest.mark.slow
def test_logistic_gh_product_quadrature_vs_dblquad():
    h, Lam = CORRELATED_CAVITY
    y = np.array([-1.0, 1.0])
    log_lik = lambda yj, z: -np.logaddexp(0.0, -yj * z)
    lik = RankKLikelihood.product(Logistic(method="gauss-hermite").site_spec(), n_nodes=40)
    lz_c, a_c, B_c = tilted_moments(lik, y, h, Lam)
    lz_b, a_b, B_b = brute_force_moments(y, h, Lam, log_lik)
    assert abs(lz_c - lz_b) < 1e-8
    np.testing.assert_allclose(a_c, a_b, atol=1e-8)
    np.testing.assert_allclose(B_c, B_b, atol=1e-7)


def test_mvgaussian_moments_vs_reference():
    rng = np.random.default_rng(50)
    for k in (1, 2, 4):
        R, Lam = random_spd(rng, k), random_spd(rng, k)
        h, y = rng.normal(size=k), rng.normal(size=k)
        got = tilted_moments(RankKLikelihood.mvgaussian(R), y, h, Lam)
        want = ref.mvgaussian_moments(y, h, Lam, R)
        assert abs(got[0] - want[0]) < 1e-12
        np.testing.assert_allclose(got[1], want[1], atol=1e-12)
        np.testing.assert_allclose(got[2], want[2], atol=1e-12)


def test_diagonal_cavity_uses_exact_separable_moments():
    h = np.array([0.2, -0.5, 1.0])
    Lam = np.diag([0.5, 1.5, 2.0])
    y = np.array([1.0, 0.0, -1.0])
    noise = 0.3
    # n_nodes=1 would be a terrible quadrature: exact results prove the separable path.
    lz, a, B = tilted_moments(RankKLikelihood.product(gaussian_site(noise), n_nodes=1), y, h, Lam)
    want = ref.mvgaussian_moments(y, h, Lam, noise * np.eye(3))
    assert abs(lz - want[0]) < 1e-13
    np.testing.assert_allclose(a, want[1], atol=1e-13)
    np.testing.assert_allclose(B, want[2], atol=1e-13)
    assert np.all(B - np.diag(np.diag(B)) == 0.0)


# ---------------------------------------------------------------------------
# Log evidence
# ---------------------------------------------------------------------------
def test_evidence_regrouped_equals_literal_at_fixed_point():
    X, Y, m0, V0, _ = problem(60, n=6, k=2, d=4)
    noise = 1.2
    lik = RankKLikelihood.product(gaussian_site(noise), n_nodes=10)
    m, V, P, b, info = run(X, Y, m0, V0, lik, tol=1e-13, max_sweeps=500)
    assert info.converged
    assert all(np.all(np.linalg.eigvalsh(p) > 0) for p in P)
    log_lik = lambda yj, z: ref.gaussian_1d_log_lik(yj, z, noise)
    mom = lambda i, h, L: ref.product_moments_quadrature(Y[i], h, L, log_lik, n_nodes=10)
    ev = rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
    assert abs(ev - ref.log_evidence_literal(X, Y, m0, V0, mom, P, b)) < 1e-9
    assert abs(ev - ref.log_evidence(X, Y, m0, V0, mom, P, b)) < 1e-9


def test_evidence_with_singular_site_precision():
    X, Y, m0, V0, R = problem(61, n=4, k=3, d=5)
    lik = RankKLikelihood.mvgaussian(R)
    mom = lambda i, h, L: ref.mvgaussian_moments(Y[i], h, L, R)
    # Zero sites: the evidence is sum_i log Z_i at the prior cavities.
    P0, b0 = np.zeros((4, 3, 3)), np.zeros((4, 3))
    ev0 = rank_k_log_evidence(X, Y, m0, V0, lik, P0, b0)
    want = sum(ref.mvgaussian_moments(Y[i], X[i] @ m0, X[i] @ V0 @ X[i].T, R)[0] for i in range(4))
    assert abs(ev0 - want) < 1e-11
    # Rank-deficient PSD and indefinite-but-proper sites.
    rng = np.random.default_rng(0)
    P = np.zeros((4, 3, 3))
    for i in range(4):
        u = rng.normal(size=(3, 1))
        P[i] = u @ u.T * 0.3 + (np.diag([0.0, 0.0, -0.05]) if i % 2 else 0)
    b = rng.normal(size=(4, 3))
    ev = rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
    assert np.isfinite(ev)
    assert abs(ev - ref.log_evidence(X, Y, m0, V0, mom, P, b)) < 1e-9


# ---------------------------------------------------------------------------
# Skip policy
# ---------------------------------------------------------------------------
def test_improper_cavity_is_skipped_then_recovers():
    d, k = 1, 1
    X = np.ones((2, 1, 1))
    Y = np.array([[0.5], [1.0]])
    m0, V0 = np.zeros(1), np.eye(1)
    # V^{-1} = 1 + 2 - 1.5 > 0, but factor 0's cavity 1 - 1.5 < 0.
    P = np.array([[[2.0]], [[-1.5]]])
    b = np.zeros((2, 1))
    lik = RankKLikelihood.product(gaussian_site(1.0))
    m, V, P1, b1, info = run(X, Y, m0, V0, lik, P=P, b=b)
    assert info.converged and info.n_skipped == 1 and info.diagnostics["n_skipped_last_sweep"] == 0
    mc, Vc, _ = conjugate(X, Y, m0, V0, np.eye(1))
    np.testing.assert_allclose(m, mc, atol=1e-12)
    mom = lambda i, h, L: ref.mvgaussian_moments(Y[i], h, L, np.eye(1))
    r = ref.run_rank_k_ep(X, Y, m0, V0, mom, site_precision=P, site_natural_mean=b)
    assert r["n_skipped"] == 1
    np.testing.assert_allclose(P1, r['site_precision'], atol=1e-12)


def test_improper_sites_raise():
    X, Y, m0, V0, R = problem(70, n=3, k=2, d=2)
    P = np.broadcast_to(-10 * np.eye(2), (3, 2, 2)).copy()
    with pytest.raises(LinAlgError, match="not positive definite"):
        run(X, Y, m0, V0, RankKLikelihood.mvgaussian(R), P=P)
    with pytest.raises(LinAlgError):
        rank_k_log_evidence(X, Y, m0, V0, RankKLikelihood.mvgaussian(R), P, np.zeros((3, 2)))


# ---------------------------------------------------------------------------
# Input errors (compiled API)
# ---------------------------------------------------------------------------
def test_engine_input_errors():
    X, Y, m0, V0, R = problem(80, n=3, k=2, d=4)
    lik = RankKLikelihood.mvgaussian(R)
    n, k, d = X.shape
    P, b, m, V = np.zeros((n, k, k)), np.zeros((n, k)), np.empty(d), np.empty((d, d))

    def call(**over):
        args = dict(X=X, y=Y, prior_mean=m0, prior_cov=V0, likelihood=lik, site_precision=P,
                    site_natural_mean=b, post_mean=m, post_cov=V)
        args.update(over)
        return run_rank_k_ep(**args)

    with pytest.raises(ValueError, match="X must be a 3-D"):
        call(X=X[0])
    with pytest.raises(ValueError, match="y must have shape"):
        call(y=Y[:, :1])
    Xbad = X.copy()
    Xbad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="X must be finite"):
        call(X=Xbad)
    with pytest.raises(ValueError, match="prior_mean"):
        call(prior_mean=np.zeros(d + 1))
    with pytest.raises(LinAlgError, match="prior_cov"):
        call(prior_cov=-np.eye(d))
    with pytest.raises(ValueError, match="noise_cov is 3x3"):
        call(likelihood=RankKLikelihood.mvgaussian(np.eye(3)))
    with pytest.raises(TypeError, match="site_precision"):
        call(site_precision=np.zeros((n, k, k), dtype=np.float32))
    with pytest.raises(TypeError, match="post_cov"):
        call(post_cov=np.empty((d, d))[:, ::1].T)
    with pytest.raises(TypeError, match="post_mean"):
        call(post_mean=[0.0] * d)
    with pytest.raises(ValueError, match="site_natural_mean must have shape"):
        call(site_natural_mean=np.zeros((n, k + 1)))
    with pytest.raises(ValueError, match="symmetric"):
        Pa = P.copy()
        Pa[0, 0, 1] = 1.0
        call(site_precision=Pa)
    with pytest.raises(ValueError, match="damping"):
        call(damping=0.0)
    with pytest.raises(ValueError, match="max_sweeps"):
        run_rank_k_ep(X, Y, m0, V0, lik, P, b, m, V, max_sweeps=-1)
    with pytest.raises(TypeError, match="likelihood"):
        call(likelihood=None)
    X3, Y3 = np.zeros((n, 3, d)), np.zeros((n, 3))
    with pytest.raises(ValueError, match="quadrature points"):
        run_rank_k_ep(X3, Y3, m0, V0, RankKLikelihood.product(gaussian_site(1.0), n_nodes=101),
                      np.zeros((n, 3, 3)), np.zeros((n, 3)), m, V)
    assert np.all(P == 0) and np.all(b == 0)    # nothing ran


def test_bad_label_raises_with_factor_index():
    rng, X, m0, V0 = block_problem(82)
    n, k, d = X.shape
    Y = np.ones((n, k))
    Y[3, 1] = 0.5
    with pytest.raises(ValueError, match=r"y\[3\] holds a label"):
        run(X, Y, m0, V0, RankKLikelihood.product(SiteSpec(LIK_PROBIT, [1.0, 0.0])))


def test_product_without_quadrature_raises_on_correlated_cavity():
    X, Y, m0, V0, _ = problem(81, n=3, k=2, d=4)
    Y = np.sign(Y)
    lik = RankKLikelihood.product(SiteSpec(LIK_STEP, [0.1]))
    with pytest.raises(ValueError, match="correlated cavity"):
        run(X, Y, m0, V0, lik)


def test_likelihood_constructor_errors():
    with pytest.raises(ValueError, match="square"):
        RankKLikelihood.mvgaussian(np.eye(2)[:1])
    with pytest.raises(ValueError, match="symmetric"):
        RankKLikelihood.mvgaussian([[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match="positive definite"):
        RankKLikelihood.mvgaussian([[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="finite"):
        RankKLikelihood.mvgaussian([[np.inf]])
    with pytest.raises(ValueError, match="n_nodes"):
        RankKLikelihood.product(gaussian_site(1.0), n_nodes=0)
    with pytest.raises(ValueError, match="n_nodes"):
        RankKLikelihood.product(gaussian_site(1.0), n_nodes=1000)
    with pytest.raises(TypeError):
        RankKLikelihood.product(None)


# ---------------------------------------------------------------------------
# Python wrapper
# ---------------------------------------------------------------------------
def test_rankkep_matches_conjugate():
    X, Y, m0, V0, R = problem(90)
    X0, Y0 = X.copy(), Y.copy()
    est = LinearEPRankK('gaussian', noise_cov=R, prior_mean=m0, prior_cov=V0).fit(X, Y)
    mc, Vc, evc = conjugate(X, Y, m0, V0, R)
    np.testing.assert_allclose(est.posterior_mean_, mc, atol=1e-10)
    np.testing.assert_allclose(est.posterior_cov_, Vc, atol=1e-11)
    assert abs(est.log_marginal_likelihood_value_ - evc) < 1e-9
    assert est.converged_ and est.n_skipped_ == 0
    assert est.site_precision_.shape == (X.shape[0], 3, 3)
    assert np.array_equal(X, X0) and np.array_equal(Y, Y0)


def test_rankkep_product_and_warning():
    X, Y, m0, V0, _ = problem(91, n=4, k=2, d=3)
    with pytest.warns(ConvergenceWarning):
        est = LinearEPRankK(gaussian_site(1.0), n_nodes=6, damping=0.3, max_sweeps=2).fit(X, Y)
    assert not est.converged_ and est.n_sweeps_ == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = LinearEPRankK(gaussian_site(1.0), n_nodes=6, prior_cov=2.0).fit(X, Y)
    assert est.converged_


def test_rankkep_probit_likelihood_object():
    rng, X, m0, V0 = block_problem(93)
    n, k, d = X.shape
    Y = np.where(rng.uniform(size=(n, k)) < 0.5, -1.0, 1.0)
    est = LinearEPRankK(Probit(slope=1.3, bias=0.2), prior_cov=np.diag(V0), prior_mean=m0).fit(X, Y)
    m, V, P, b, info = run(X, Y, m0, V0, RankKLikelihood.product(SiteSpec(LIK_PROBIT, [1.3, 0.2])))
    np.testing.assert_array_equal(est.posterior_mean_, m)
    np.testing.assert_array_equal(est.site_precision_, P)
    Ybad = Y.copy()
    Ybad[1, 2] = 0.0
    with pytest.raises(ValueError, match=r"Y \(flattened row-major\): binary targets"):
        LinearEPRankK(Probit()).fit(X, Ybad)


@pytest.mark.parametrize("kwargs,fit_args,exc,match", [
    (dict(), ("X2d", "Y"), ValueError, "X must have 3 dimensions"),
    (dict(), ("X", "Ybad"), ValueError, "Y must have shape"),
    (dict(), ("Xnan", "Y"), ValueError, "X must be finite"),
    (dict(), ("Xstr", "Y"), TypeError, "X must hold real numbers"),
    (dict(noise_cov=np.eye(2)), ("X", "Y"), ValueError, "noise_cov must have shape"),
    (dict(noise_cov=-np.eye(3)), ("X", "Y"), ValueError, "noise_cov must be positive definite"),
    (dict(prior_cov=np.ones((5, 5))), ("X", "Y"), ValueError, "prior_cov must be positive definite"),
    (dict(prior_cov=np.eye(4)), ("X", "Y"), ValueError, "prior_cov must have shape"),
    (dict(prior_mean=np.zeros(2)), ("X", "Y"), ValueError, "prior_mean must have shape"),
    (dict(damping=1.5), ("X", "Y"), ValueError, "damping"),
    (dict(max_sweeps=2.5), ("X", "Y"), ValueError, "max_sweeps"),
    (dict(likelihood='poisson'), ("X", "Y"), ValueError, "likelihood must be"),
    (dict(likelihood=3), ("X", "Y"), TypeError, "likelihood must be"),
])
def test_rankkep_errors_leave_state_unchanged(kwargs, fit_args, exc, match):
    X, Y, m0, V0, R = problem(92)
    data = dict(X=X, Y=Y, X2d=X[0], Ybad=Y[:, :2], Xstr=np.full(X.shape, "a"))
    data["Xnan"] = X.copy()
    data["Xnan"][1, 1, 1] = np.inf
    est = LinearEPRankK('gaussian').fit(X, Y)
    before = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in vars(est).items() if k.endswith('_')}
    for name, value in kwargs.items():
        setattr(est, name, value)
    with pytest.raises(exc, match=match):
        est.fit(*(data[a] for a in fit_args))
    for name, value in before.items():
        np.testing.assert_array_equal(getattr(est, name), value)


# ---------------------------------------------------------------------------
# The state class
# ---------------------------------------------------------------------------
def test_state_is_bitwise_the_same_on_given_or_own_arrays_validated_or_not():
    X, Y, m0, V0, R = problem(90, n=8, k=2, d=4)
    lik = RankKLikelihood.mvgaussian(R)
    m, V, P, b, info = run(X, Y, m0, V0, lik, damping=0.7, max_sweeps=5, tol=0.0)
    options = RankKEPOptions(damping=0.7, max_sweeps=5, tol=0.0)
    state = engine.RankKEP(X, Y, m0, V0, lik, options)
    result = state.run()
    assert result.n_sweeps == info.n_sweeps == 5
    for got, want in ((state.post_mean, m), (state.post_cov, V), (state.site_precision, P),
                      (state.site_natural_mean, b)):
        np.testing.assert_array_equal(got, want)
    assert state.log_evidence() == rank_k_log_evidence(X, Y, m0, V0, lik, P, b)
    # the unchecked path, on the same (already checked) arrays
    fast = engine.RankKEP(X, Y, m0, V0, lik, options, validate=False)
    fast.run()
    np.testing.assert_array_equal(fast.site_precision, P)
    assert fast.log_evidence() == state.log_evidence()


def test_state_checks_its_inputs_before_anything_runs():
    X, Y, m0, V0, R = problem(91, n=3, k=2, d=3)
    lik = RankKLikelihood.mvgaussian(R)
    with pytest.raises(TypeError, match="site_precision"):
        engine.RankKEP(X, Y, m0, V0, lik, state=(np.zeros((3, 2, 2), dtype=np.float32), None))
    with pytest.raises(ValueError, match="state"):
        engine.RankKEP(X, Y, m0, V0, lik, state=(np.zeros((3, 2, 2)),))
    with pytest.raises(ValueError, match="refresh_every"):
        RankKEPOptions(refresh_every=-1)
    with pytest.raises(TypeError, match="likelihood"):
        engine.RankKEP(X, Y, m0, V0, None, validate=False)
    with pytest.raises(LinAlgError, match="prior_cov"):
        engine.RankKEP(X, Y, m0, -np.eye(3), lik, validate=False)

