"""The array entry point of the site kernels (fastep._epcore.sites.site_moments_array).

``site_moments_array`` precomputes the likelihood's constants once per call,
runs staged loops over blocks of sites and spreads chunks of sites over
OpenMP threads. These tests pin down what that must not change:

* results bitwise identical to ``site_moments`` called site by site (the
  engines' entry point) and independent of the number of threads;
* the first failing site is the one reported, whichever chunk or block it is in;
* the piecewise-polynomial Gaussian tail G(x) = N(x)/Phi(-x) - x behind the
  probit/step/ordinal kernels is accurate at and between its interval edges;
* the noisy-step kernel is accurate across its switch from linear to log
  space (z = -37), and the Gauss-Hermite logistic kernel across its switch
  to log space (Z = 1e-280) and for log Z -> 0.
"""
import math
import multiprocessing
import os

import mpmath
import numpy as np
import pytest

from fastep._epcore import sites as S
from fastep.reference import sites as R

EPS = np.finfo(np.float64).eps
MP_RTOL = 64 * EPS
CHUNK = 8192

SPECS = {
    "probit": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["probit"], [2.0, 0.1]), "pm"),
    "probit_inf": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["probit"], [math.inf, -0.3]), "pm"),
    "step": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["step"], [0.0]), "pm"),
    "step_noisy": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["step"], [0.05]), "pm"),
    "mackay": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["logistic_mackay"], []), "pm"),
    "gh": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["logistic_gh"], [], *R.gauss_hermite_rule(20)), "pm"),
    "gaussian": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["gaussian"], [0.5]), "real"),
    "ordinal": (lambda: S.SiteSpec(S.LIKELIHOOD_CODES["ordinal"], [2.0, -1.0, 0.7, 0.6, 0.8]), "ord5"),
}


def site_inputs(kind, n, seed=0):
    """Bulk cavities plus tails (|z| up to ~1e3) and tiny/huge variances, all valid."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(scale=3.0, size=n)
    s2 = rng.uniform(0.01, 4.0, size=n)
    k = n // 10
    mu[:k] = rng.choice([-1e3, -60.0, -38.0, -37.0, -20.0, -8.0, 8.0, 20.0, 40.0, 1e3], k)
    s2[k:2 * k] = rng.choice([1e-300, 1e-12, 1e-4, 1e4, 1e12], k)
    perm = rng.permutation(n)
    mu, s2 = mu[perm], s2[perm]
    if kind == "pm":
        y = np.where(rng.uniform(size=n) < 0.5, -1.0, 1.0)
    elif kind == "real":
        y = rng.normal(scale=2.0, size=n)
    else:
        y = rng.integers(0, 5, size=n).astype(float)
    return y, mu, s2


@pytest.mark.parametrize("name", sorted(SPECS))
def test_array_matches_single_site_entry_point_bitwise(name):
    make, kind = SPECS[name]
    spec = make()
    y, mu, s2 = site_inputs(kind, 3 * CHUNK + 101)
    status, *single = S._site_moments_per_site(spec, y, mu, s2)
    assert np.all(status == S.OK)
    got = S.site_moments_array(spec, y, mu, s2)
    for a, b in zip(got, single):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not S.OPENMP, reason="built without OpenMP")
@pytest.mark.parametrize("name", sorted(SPECS))
def test_results_do_not_depend_on_thread_count(name):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    make, kind = SPECS[name]
    spec = make()
    y, mu, s2 = site_inputs(kind, 5 * CHUNK + 3, seed=1)
    results = []
    for threads in (1, 2, 3):
        with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
            assert S.max_threads() == threads
            results.append(S.site_moments_array(spec, y, mu, s2))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["probit", "step_noisy", "gh", "gaussian", "ordinal"])
def test_first_failing_site_is_reported(name, threads):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    make, kind = SPECS[name]
    spec = make()
    n = 4 * CHUNK + 5
    for bad in (0, 63, 64, CHUNK - 1, 2 * CHUNK + 7, n - 1):
        y, mu, s2 = site_inputs(kind, n, seed=bad)
        mu[bad] = np.nan
        if bad + 70 < n:
            s2[bad + 70] = -1.0          # a later failure in the same block or the next
        if bad + CHUNK < n:
            mu[bad + CHUNK] = np.inf     # and one in a later chunk
        with threadpoolctl.threadpool_limits(threads, user_api="openmp"):
            with pytest.raises(ValueError, match=rf"^site {bad} failed.*cavity"):
                S.site_moments_array(spec, y, mu, s2)
        status, *_ = S._site_moments_per_site(spec, y, mu, s2)
        assert np.flatnonzero(status != S.OK)[0] == bad


def test_failures_found_after_the_special_functions_are_reported_in_order():
    # An overflowing alpha (cavity variance 1e-320 with an infinite slope) is only
    # detected once the block's outputs are formed; an earlier bad label wins.
    spec = S.SiteSpec(S.LIKELIHOOD_CODES["probit"], [math.inf, 0.0])
    n = 3 * CHUNK
    y, mu, s2 = np.ones(n), np.zeros(n), np.ones(n)
    mu[CHUNK + 10], s2[CHUNK + 10] = -1e-150, 1e-320
    with pytest.raises(ValueError, match=rf"^site {CHUNK + 10} failed.*overflows"):
        S.site_moments_array(spec, y, mu, s2)
    y[CHUNK + 3] = 0.5
    with pytest.raises(ValueError, match=rf"^site {CHUNK + 3} failed.*target outside"):
        S.site_moments_array(spec, y, mu, s2)


def test_threads_reported():
    assert S.max_threads() >= 1
    assert isinstance(S.OPENMP, bool)


def _sum_log_z_of_large_call(seed):
    y, mu, s2 = site_inputs("pm", 4 * CHUNK, seed=seed)
    spec = S.SiteSpec(S.LIKELIHOOD_CODES["probit"], [2.0, 0.1])
    return S.max_threads(), float(np.sum(S.site_moments_array(spec, y, mu, s2)[0]))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_children_do_not_deadlock():
    # GNU libgomp hangs in a child forked after the parent used a parallel region;
    # forked children must fall back to one thread.
    parent = _sum_log_z_of_large_call(0)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        children = pool.map_async(_sum_log_z_of_large_call, [0, 0]).get(timeout=120)
    for threads, total in children:
        assert threads == 1
        assert total == parent[1]


# ---------------------------------------------------------------------------
# accuracy at the seams of the fast paths, against mpmath
# ---------------------------------------------------------------------------

mpmath.mp.dps = 50


def _mp_probit(z):
    """log Phi(z), alpha = N(z)/Phi(z), beta = alpha (alpha + z) for c = 1."""
    z = mpmath.mpf(z)
    cdf = mpmath.ncdf(z)
    log_z = mpmath.log(cdf) if z <= 0 else mpmath.log1p(-mpmath.ncdf(-z))
    alpha = mpmath.npdf(z) / cdf
    return log_z, alpha, alpha * (alpha + z)


def _assert_close(value, exact, rtol, what):
    exact = mpmath.mpf(exact)
    assert math.isfinite(value), what
    assert abs(mpmath.mpf(float(value)) - exact) <= rtol * abs(exact) + mpmath.mpf(1e-300), \
        (what, value, exact)


def test_gaussian_tail_table_edges_against_mpmath():
    # slope inf, bias 0, s2 = 1: the kernel's standardised argument is exactly y * mu.
    edges = np.arange(-32, 33) * 0.25
    rng = np.random.default_rng(7)
    z = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf),
                        rng.uniform(-8.5, 8.5, 200)])
    y = np.where(np.arange(z.size) % 2 == 0, 1.0, -1.0)
    spec = S.SiteSpec(S.LIKELIHOOD_CODES["probit"], [math.inf, 0.0])
    log_z, alpha, beta = S.site_moments_array(spec, y, y * z, np.ones_like(z))
    for i in range(z.size):
        want = _mp_probit(z[i])
        _assert_close(log_z[i], want[0], MP_RTOL, f"log_z at z={z[i]!r}")
        _assert_close(y[i] * alpha[i], want[1], MP_RTOL, f"alpha at z={z[i]!r}")
        _assert_close(beta[i], want[2], MP_RTOL, f"beta at z={z[i]!r}")


@pytest.mark.parametrize("eps", [1e-300, 1e-12, 0.05, 0.4])
def test_noisy_step_across_linear_and_log_space(eps):
    z = np.array([-45.0, -38.0, -37.5, np.nextafter(-37.0, -np.inf), -37.0, np.nextafter(-37.0, 0.0),
                  -36.5, -30.0, -9.0, -1.0, 0.0, 0.5, 3.0, 9.0, 30.0, 37.5])
    y = np.ones_like(z)
    log_z, alpha, beta = S.site_moments_array(S.SiteSpec(S.LIKELIHOOD_CODES["step"], [eps]), y, z,
                                              np.ones_like(z))
    for i in range(z.size):
        zz, e = mpmath.mpf(z[i]), mpmath.mpf(eps)
        mass = e + (1 - 2 * e) * mpmath.ncdf(zz)
        want_alpha = (1 - 2 * e) * mpmath.npdf(zz) / mass
        want_beta = want_alpha * (want_alpha + zz)
        want_log_z = mpmath.log(mass) if zz <= 0 else mpmath.log1p(-(e + (1 - 2 * e) * mpmath.ncdf(-zz)))
        # For z >= 8, log Z ≈ -(1 - 2eps) Phi(-z) comes from erfc(z/√2), whose relative
        # error carries the condition number ~z² of exp(-z²/2) through the rounding of z/√2.
        rtol_log_z = MP_RTOL * (1 + z[i] ** 2 if z[i] >= 8 else 1)
        _assert_close(log_z[i], want_log_z, rtol_log_z, f"log_z at z={z[i]!r}")
        # alpha is exponentially small in the lower tail, where its condition number in z is ~z².
        _assert_close(alpha[i], want_alpha, MP_RTOL * (1 + z[i] ** 2), f"alpha at z={z[i]!r}")
        scale = abs(want_beta) + abs(want_alpha) * (abs(want_alpha) + abs(zz))
        assert abs(mpmath.mpf(float(beta[i])) - want_beta) <= MP_RTOL * (1 + z[i] ** 2) * scale + 1e-300


def test_gauss_hermite_across_the_log_space_switch_matches_reference():
    # Z < 1e-280 (y mu <~ -645 with a narrow cavity) switches to the log-space
    # evaluation; the numpy twin works in log space throughout.
    nodes, log_weights = R.gauss_hermite_rule(20)
    spec = S.SiteSpec(S.LIKELIHOOD_CODES["logistic_gh"], [], nodes, log_weights)
    mu = np.linspace(-660.0, -630.0, 61)
    for s2 in (0.0, 1e-3, 2.0):
        s2s = np.full(mu.shape, s2)
        got = S.site_moments_array(spec, np.ones_like(mu), mu, s2s)
        want = R.logistic_gh_moments(np.ones_like(mu), mu, s2s, 20)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-14)
        # The twin normalises its weights by exp(log_terms - log_z), which carries the
        # absolute error ~|log Z| eps (~1e-13 here) of log Z into alpha and beta.
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6, atol=1e-12)


def test_gauss_hermite_log_z_near_zero_keeps_relative_precision():
    # s2 = 0: every node sits at mu and log Z = log sigma(mu) = -log1p(exp(-mu)).
    nodes, log_weights = R.gauss_hermite_rule(32)
    spec = S.SiteSpec(S.LIKELIHOOD_CODES["logistic_gh"], [], nodes, log_weights)
    mu = np.array([5.0, 20.0, 40.0, 300.0])
    log_z, alpha, _ = S.site_moments_array(spec, np.ones_like(mu), mu, np.zeros_like(mu))
    np.testing.assert_allclose(log_z, -np.log1p(np.exp(-mu)), rtol=1e-14)
    np.testing.assert_allclose(alpha, 1.0 / (1.0 + np.exp(mu)), rtol=1e-14)
