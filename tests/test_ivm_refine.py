"""Refinement on a fixed-size IVM active set: EP deletion-inclusion sweeps and exchange moves.

Seeger's notes §2.1 (eq 7 and the h update) and §2.3 (eqs 8-9, the 2x2 Woodbury update):
the compiled ``IVMEP.refine`` / ``IVMEP.exchange`` against the plain-numpy twins in
:mod:`fastep.reference.ivm` (which recompute the posterior from the sites after every
change), dense GP EP and exact GP regression at d = n, the entropy criterion, the
refactorisation, and bad input.
"""
import copy
import pickle
import warnings

import numpy as np
import pytest
from scipy.linalg import cho_solve, cholesky

from fastep import ConvergenceWarning, IVMClassifier, IVMOrdinalRegressor, IVMRegressor
from fastep._epcore import ivm as engine
from fastep._epcore._common import SweepResult
from fastep._epcore.ivm_refine import ExchangeResult, RefineResult
from fastep.kernels import RBF, Linear
from fastep.likelihoods import Gaussian
from fastep.reference import gp_ep as ref_gp
from fastep.reference import ivm as ref

from test_ivm_engine import _problem

KINDS = ["probit", "gaussian", "ordinal"]


# the engines and twins make many small sequential BLAS calls (conftest.one_blas_thread)
pytestmark = pytest.mark.usefixtures("one_blas_thread")


def _selected(kind, n, d, seed, sigma2=0.0):
    X, y, lik, moments, spherical, kernel = _problem(kind, n, seed)
    cols = kernel.columns(X)
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, d, sigma2=sigma2)
    state.select(d, cols)
    return state, cols, kernel(X), y, moments, spherical


def _snapshot(state):
    return {name: np.array(getattr(state, name)) for name in
            ("active", "site_mean", "site_precision", "post_mean", "post_var", "M", "L", "chosen_score")}


def _assert_state_close(state, snap, atol):
    for name, value in snap.items():
        np.testing.assert_allclose(np.array(getattr(state, name)), value, rtol=0, atol=atol, err_msg=name)


def _assert_consistent_with_sites(state, K):
    """L, M, ς, μ are the Seeger factors of the current sites (and Σ = K - MᵀM)."""
    idx = state.active
    mu, Sigma = ref.posterior_from_sites(K, idx, state.site_mean, state.site_precision)
    np.testing.assert_allclose(state.post_mean, mu, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_var, np.diag(Sigma), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(K - state.M.T @ state.M, Sigma, rtol=1e-9, atol=1e-10)
    sb = np.sqrt(state.site_precision[idx])
    B = np.eye(idx.size) + sb[:, None] * K[np.ix_(idx, idx)] * sb[None, :]
    np.testing.assert_allclose(state.L @ state.L.T, B, rtol=1e-11, atol=1e-11)
    assert np.all(np.triu(state.L, 1) == 0.0)
    inactive = np.ones(K.shape[0], dtype=bool)
    inactive[idx] = False
    assert np.all(state.site_precision[inactive] == 0.0) and np.all(state.site_mean[inactive] == 0.0)
    assert np.all(state.site_precision[idx] > 0.0)
    assert state.entropy_reduction() == pytest.approx(ref.entropy_reduction(K, idx, state.site_precision),
                                                      rel=1e-11)


# --------------------------------------------------------------------------- EP sweeps

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_refine_matches_the_twin(kind, seed):
    sigma2 = 0.0 if seed == 0 else 0.05
    state, cols, K, y, moments, spherical = _selected(kind, 120, 30, seed, sigma2)
    before = _snapshot(state)
    info = state.refine(cols, n_sweeps=3)
    twin = ref.ep_refine(K, y, moments, before["active"], before["site_mean"], before["site_precision"], 3,
                         sigma2=sigma2, spherical_noise=spherical)
    assert (info.n_sweeps, info.n_updates, info.converged, info.n_rejected) == \
        (twin["n_sweeps"], twin["n_updates"], twin["converged"], twin["n_rejected"])
    assert info.max_change == pytest.approx(twin["max_change"], rel=1e-6, abs=1e-12)
    np.testing.assert_array_equal(state.active, before["active"])           # the set and its order stay
    np.testing.assert_allclose(state.site_mean, twin["site_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.site_precision, twin["site_precision"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_mean, twin["post_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_var, np.diag(twin["post_cov"]), rtol=1e-9, atol=1e-10)
    _assert_consistent_with_sites(state, K)
    if kind == "gaussian":
        # spherical sites are exact: nothing to refine
        assert info.n_updates == 0 and info.converged
        np.testing.assert_array_equal(state.site_mean, before["site_mean"])
    else:
        assert info.n_updates > 0
        assert np.max(np.abs(state.site_precision - before["site_precision"])) > 1e-6


@pytest.mark.parametrize("kind", ["probit", "ordinal"])
def test_refine_converges_to_an_ep_fixed_point_that_a_second_run_leaves_unchanged(kind):
    state, cols, K, y, moments, _ = _selected(kind, 120, 30, 2, 0.02)
    info = state.refine(cols, n_sweeps=100)
    assert info.converged and info.n_rejected == 0 and info.n_sweeps < 100
    assert info.max_change <= 1e-9
    # EP fixed point: each site equals the moment match at its own cavity (dense check)
    idx = state.active
    mu, Sigma = ref.posterior_from_sites(K, idx, state.site_mean, state.site_precision)
    var, b, m = np.diag(Sigma)[idx], state.site_precision[idx], state.site_mean[idx]
    lam = 1.0 / (1.0 / var - b)
    h = lam * (mu[idx] / var - b * m)
    _, g, nu = moments(y[idx], h, lam + 0.02)
    np.testing.assert_allclose(nu / (1.0 - nu * lam), b, rtol=1e-7)
    np.testing.assert_allclose(h + g / nu, m, rtol=1e-7, atol=1e-8 / np.sqrt(b.min()))
    snap = _snapshot(state)
    again = state.refine(cols, n_sweeps=10)
    assert again.converged and again.n_sweeps == 1 and again.n_updates == 0
    _assert_state_close(state, snap, atol=1e-10)


def test_refine_with_every_point_active_and_gaussian_noise_is_exact_gp_regression():
    n = 60
    X, y, _, _, _, _ = _problem("gaussian", n, 5)
    kernel = RBF(1.2, 0.7) + Linear(0.3)
    noise = 0.04
    cols = kernel.columns(X)
    state = engine.IVMEP(y, Gaussian(noise_variance=noise).site_spec(), cols.diag, n)
    state.select(n, cols)
    info = state.refine(cols, n_sweeps=5)
    assert info.converged and info.n_updates == 0
    K = kernel(X)
    c = cholesky(K + noise * np.eye(n), lower=True)
    alpha = cho_solve((c, True), y)
    np.testing.assert_allclose(state.post_mean, K @ alpha, rtol=1e-9, atol=1e-10)
    Sigma = K - K @ cho_solve((c, True), K)
    np.testing.assert_allclose(state.post_var, np.diag(Sigma), rtol=1e-8, atol=1e-11)
    log_ml = -0.5 * y @ alpha - np.sum(np.log(np.diag(c))) - 0.5 * n * np.log(2 * np.pi)
    assert state.log_likelihood() == pytest.approx(log_ml, rel=1e-11)


@pytest.mark.parametrize("kind", ["probit", "ordinal"])
def test_refine_with_every_point_active_equals_dense_gp_ep(kind):
    n = 60
    X, y, lik, moments, _, kernel = _problem(kind, n, 1)
    cols = kernel.columns(X)
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, n)
    state.select(n, cols)
    info = state.refine(cols, n_sweeps=200, tol=1e-12)
    assert info.converged
    dense = ref_gp.run_gp_ep(kernel(X), y, moments, tol=1e-13, max_sweeps=500)
    assert dense["converged"]
    np.testing.assert_allclose(state.site_precision, dense["site_precision"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.site_precision * state.site_mean, dense["site_natural_mean"],
                               rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_mean, dense["post_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_var, np.diag(dense["post_cov"]), rtol=1e-9, atol=1e-10)


# --------------------------------------------------------------------------- refactorisation

@pytest.mark.parametrize("kind", ["probit", "ordinal"])
def test_refactorisation_changes_results_by_rounding_only(kind):
    state, cols, K, _, _, _ = _selected(kind, 150, 40, 3, 0.01)
    snap = _snapshot(state)
    state.refactorize(cols)                      # after Algorithm 1's row appends
    _assert_state_close(state, snap, atol=1e-10)
    # Σ[I, I] rebuilt after every sweep vs never during the sweeps
    a, cols_a, _, _, _, _ = _selected(kind, 150, 40, 3, 0.01)
    b, cols_b, _, _, _, _ = _selected(kind, 150, 40, 3, 0.01)
    ia = a.refine(cols_a, n_sweeps=6, refactor_every=1)
    ib = b.refine(cols_b, n_sweeps=6, refactor_every=100)
    assert ia.n_updates == ib.n_updates > 0
    _assert_state_close(a, _snapshot(b), atol=1e-10)
    # exchanges with Σ[I, :] rebuilt after every move vs only at the end
    ea = a.exchange(cols_a, tol=1e-8, max_moves=6, refactor_every=1)
    eb = b.exchange(cols_b, tol=1e-8, max_moves=6, refactor_every=1000)
    assert [m[:2] for m in ea.moves] == [m[:2] for m in eb.moves] and ea.n_moves > 0
    np.testing.assert_allclose([m[2] for m in ea.moves], [m[2] for m in eb.moves], rtol=1e-9, atol=1e-12)
    _assert_state_close(a, _snapshot(b), atol=1e-10)
    snap = _snapshot(a)
    a.refactorize(cols_a)
    _assert_state_close(a, snap, atol=1e-10)
    _assert_consistent_with_sites(a, K)


def test_the_criterion_after_selection_is_the_sum_of_the_inclusion_scores():
    state, cols, K, _, _, _ = _selected("probit", 100, 25, 4)
    assert state.entropy_reduction() == pytest.approx(float(np.sum(state.chosen_score)), rel=1e-11)
    assert state.entropy_reduction() == pytest.approx(
        ref.entropy_reduction(K, state.active, state.site_precision), rel=1e-11)


# --------------------------------------------------------------------------- exchange moves

@pytest.mark.parametrize("kind", KINDS)
def test_exchange_gains_match_the_twin(kind):
    state, cols, K, y, moments, spherical = _selected(kind, 120, 30, 6, 0.03)
    partner, gains = state.exchange_gains(cols)
    twin = ref.exchange_gains(K, y, moments, state.active, state.site_mean, state.site_precision,
                              sigma2=0.03, spherical_noise=spherical)
    np.testing.assert_array_equal(partner, np.argmax(twin, axis=1))
    np.testing.assert_allclose(gains, np.max(twin, axis=1), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_exchange_matches_the_twin(kind, seed):
    sigma2 = 0.0 if seed == 0 else 0.05
    state, cols, K, y, moments, spherical = _selected(kind, 120, 30, seed, sigma2)
    before = _snapshot(state)
    info = state.exchange(cols, "greedy", tol=1e-6, max_moves=8)
    twin = ref.exchange(K, y, moments, before["active"], before["site_mean"], before["site_precision"],
                        tol=1e-6, max_moves=8, sigma2=sigma2, spherical_noise=spherical)
    assert info.n_moves > 0
    assert [m[:2] for m in info.moves] == [m[:2] for m in twin["moves"]]
    np.testing.assert_allclose([m[2] for m in info.moves], [m[2] for m in twin["moves"]],
                               rtol=1e-9, atol=1e-12)
    assert info.converged == twin["converged"]
    np.testing.assert_array_equal(state.active, twin["active"])
    np.testing.assert_allclose(state.site_mean, twin["site_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.site_precision, twin["site_precision"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_mean, twin["post_mean"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(state.post_var, np.diag(twin["post_cov"]), rtol=1e-9, atol=1e-10)
    _assert_consistent_with_sites(state, K)
    # the leavers are out, the entrants in, in order of entry at the end
    assert state.active[-1] == info.moves[-1][1]
    assert len(set(state.active.tolist())) == 30


@pytest.mark.parametrize("mode", ["greedy", "random"])
@pytest.mark.parametrize("kind", ["probit", "ordinal"])
def test_exchange_moves_never_make_the_criterion_worse(mode, kind):
    tol = 1e-6
    state, cols, K, y, moments, _ = _selected(kind, 100, 20, 7, 0.01)
    n_moves = 0
    for step in range(40):
        before = ref.entropy_reduction(K, state.active, state.site_precision)
        active_before = state.active
        info = state.exchange(cols, mode, tol=tol, max_moves=1, seed=step)
        after = ref.entropy_reduction(K, state.active, state.site_precision)
        if info.n_moves == 0:
            assert info.converged
            np.testing.assert_array_equal(state.active, active_before)
            break
        n_moves += 1
        (j, i, gain), = info.moves
        assert j in active_before and i not in active_before
        assert gain > tol
        assert after > before                                  # checked densely, move by move
        assert after - before == pytest.approx(gain, rel=1e-9, abs=1e-12)
        assert state.entropy_reduction() == pytest.approx(after, rel=1e-11)
    else:
        pytest.fail("exchange moves did not stop within 40 moves")
    assert n_moves > 0
    # converged: no pair improves by more than tol (dense check of every pair)
    gains = ref.exchange_gains(K, y, moments, state.active, state.site_mean, state.site_precision, sigma2=0.01)
    assert np.max(gains) <= tol
    _assert_consistent_with_sites(state, K)


def test_random_exchange_is_seeded_and_stops_where_greedy_would():
    runs = {}
    for label, mode, seed in [("a", "random", 3), ("b", "random", 3), ("c", "random", 4), ("g", "greedy", 0)]:
        state, cols, K, y, moments, _ = _selected("probit", 120, 25, 8)
        info = state.exchange(cols, mode, tol=1e-6, max_moves=100, seed=seed)
        assert info.converged
        partner, gains = state.exchange_gains(cols)
        assert np.max(gains) <= 1e-6
        runs[label] = (info.moves, state.entropy_reduction())
    assert runs["a"] == runs["b"]
    for label in "abcg":
        assert runs[label][1] > runs["g"][1] - 1.0             # all local optima of the same criterion
    assert [m[:2] for m in runs["a"][0]] != [m[:2] for m in runs["g"][0]]


def test_refinement_reports_are_read_only_typed_results():
    state, cols, _, _, _, _ = _selected("probit", 150, 40, 3, 0.01)
    sweeps = state.refine(cols, n_sweeps=6)
    assert sweeps.log_z == state.log_likelihood() and np.isfinite(sweeps.log_z)     # eq 32 at its sites
    moves = state.exchange(cols, tol=1e-8, max_moves=6)
    assert isinstance(sweeps, RefineResult) and isinstance(moves, ExchangeResult)
    assert isinstance(sweeps, SweepResult) and not isinstance(moves, SweepResult)
    assert set(sweeps.as_dict()) == {"n_sweeps", "converged", "max_change", "log_z", "n_skipped", "n_failed",
                                     "stopped", "n_updates", "n_rejected"}
    assert sweeps.n_failed == sweeps.n_rejected and not sweeps.stopped
    # the constructor keeps the positional order of the reports saved before the common fields
    old = RefineResult(3, True, 1e-10, 12, 4, 1)
    assert (old.n_sweeps, old.converged, old.max_change, old.n_updates, old.n_skipped, old.n_rejected,
            old.n_failed, old.stopped) == (3, True, 1e-10, 12, 4, 1, 1, False) and np.isnan(old.log_z)
    assert old.replace(n_updates=5) == RefineResult(3, True, 1e-10, 5, 4, 1) != old
    assert set(moves.as_dict()) == {"moves", "n_moves", "converged", "best_gain"}
    assert moves.n_moves == len(moves.moves) > 0
    assert all(type(j) is int and type(i) is int and type(gain) is float for j, i, gain in moves.moves)
    for result, field in ((sweeps, "n_sweeps"), (moves, "moves")):
        with pytest.raises(AttributeError):
            setattr(result, field, 0)
        assert pickle.loads(pickle.dumps(result)) == result and copy.deepcopy(result) == result
    assert repr(sweeps).startswith("RefineResult(n_sweeps=") and sweeps != moves


def test_exchange_and_refine_on_degenerate_active_sets():
    X, y, lik, _, _, kernel = _problem("probit", 15, 9)
    cols = kernel.columns(X)
    full = engine.IVMEP(y, lik.site_spec(), cols.diag, 15)
    full.select(15, cols)
    info = full.exchange(cols)
    assert (info.moves, info.n_moves, info.converged, info.best_gain) == ((), 0, True, -np.inf)
    empty = engine.IVMEP(y, lik.site_spec(), cols.diag, 5)
    assert empty.refine(cols, n_sweeps=3).n_sweeps == 0
    assert empty.exchange(cols).n_moves == 0
    assert empty.entropy_reduction() == 0.0
    # after refinement the state can still grow by Algorithm 1
    st = engine.IVMEP(y, lik.site_spec(), cols.diag, 8)
    st.select(5, cols)
    st.refine(cols, n_sweeps=20)
    st.exchange(cols, tol=1e-8)
    st.select(3, cols)
    assert st.n_active == 8
    _assert_consistent_with_sites(st, kernel(X))


# --------------------------------------------------------------------------- the engine's run

_STATE_ARRAYS = ("active", "site_mean", "site_precision", "post_mean", "post_var", "M", "L", "chosen_score",
                 "g", "nu")


def _arrays(state):
    return {name: np.array(getattr(state, name)) for name in _STATE_ARRAYS}


def _assert_same_arrays(a, b):
    for name in _STATE_ARRAYS:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("kind, exchange", [("probit", "greedy"), ("ordinal", "random"), ("gaussian", "greedy"),
                                            ("probit", None)])
def test_run_is_the_selection_and_the_stages_step_by_step_bitwise(kind, exchange):
    X, y, lik, _, _, kernel = _problem(kind, 120, 21)
    cols = kernel.columns(X)
    options = engine.IVMOptions(25, seed=5, refine_sweeps=4, exchange=exchange, exchange_tol=1e-6,
                                max_exchanges=6)
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, options, sigma2=0.02)
    result = state.run(cols)
    steps = engine.IVMEP(y, lik.site_spec(), cols.diag, engine.IVMOptions(25, seed=5), sigma2=0.02)
    steps.select(25, cols)
    ep = steps.refine(cols, n_sweeps=4)
    stages = {"ep": ep}
    if exchange is not None:
        stages["exchange"] = moves = steps.exchange(cols, exchange, tol=1e-6, max_moves=6, seed=5)
        if moves.n_moves:
            stages["ep_after_exchange"] = steps.refine(cols, n_sweeps=4)
    _assert_same_arrays(_arrays(state), _arrays(steps))
    assert isinstance(result, engine.IVMResult) and isinstance(result, SweepResult)
    assert result.refinement == stages and result.ep == ep
    assert result.exchange == stages.get("exchange") and result.ep_after_exchange == stages.get("ep_after_exchange")
    sweeps = [stages[name] for name in ("ep", "ep_after_exchange") if name in stages]
    assert result.n_sweeps == sum(r.n_sweeps for r in sweeps)
    assert result.n_skipped == sum(r.n_skipped for r in sweeps)
    assert result.n_failed == sum(r.n_rejected for r in sweeps)
    assert result.max_change == sweeps[-1].max_change
    assert result.converged == all(r.converged for r in stages.values())
    assert result.n_active == state.n_active == 25 and not result.stopped
    assert result.log_z == state.log_likelihood() == steps.log_likelihood()
    assert result.log_z == sweeps[-1].log_z or "exchange" in stages
    assert pickle.loads(pickle.dumps(result)) == result and copy.deepcopy(result) == result
    assert repr(result).startswith("IVMResult(n_sweeps=")
    assert set(result.as_dict()) == {"n_sweeps", "converged", "max_change", "log_z", "n_skipped", "n_failed",
                                     "stopped", "n_active", "ep", "exchange", "ep_after_exchange"}
    assert result.as_dict()["ep"] == ep.as_dict()


def test_run_without_refinement_is_algorithm_1():
    X, y, lik, _, _, kernel = _problem("probit", 100, 22)
    cols = kernel.columns(X)
    for criterion in ("entropy", "info_gain", "random"):
        options = engine.IVMOptions(20, criterion=criterion, seed=3)
        a = engine.IVMEP(y, lik.site_spec(), cols.diag, options)
        b = engine.IVMEP(y, lik.site_spec(), cols.diag, options)
        result = a.run(cols)
        b.select(20, cols)
        _assert_same_arrays(_arrays(a), _arrays(b))
        assert result.refinement is None and result.ep is result.exchange is None
        assert (result.n_sweeps, result.converged, result.max_change, result.n_active) == (0, True, 0.0, 20)
        assert result.log_z == b.log_likelihood()
        assert a.run(cols) == result                      # full: nothing more to select or refine
    # a state grown by hand is completed up to d
    c = engine.IVMEP(y, lik.site_spec(), cols.diag, engine.IVMOptions(20, seed=3))
    c.select(7, cols)
    assert c.run(cols).n_active == 20
    _assert_same_arrays(_arrays(c), _arrays(engine_state_selected(y, lik, cols, 20)))


def engine_state_selected(y, lik, cols, d):
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, d)
    state.select(d, cols)
    return state


def test_the_sweep_callback_sees_every_sweep_and_can_stop_the_refinement():
    state, cols, _, _, _, _ = _selected("probit", 150, 30, 23, 0.01)
    seen = []
    quiet = state.refine(cols, n_sweeps=50, callback=lambda *args: seen.append(args))
    assert [s for s, _, _ in seen] == list(range(1, quiet.n_sweeps + 1)) and quiet.converged
    assert seen[-1][1] == quiet.max_change
    # log_z: eq 32 at the sites after each sweep (the last one as the result's, to rounding)
    assert seen[-1][2] == pytest.approx(quiet.log_z, rel=1e-12)
    # a callback that lets the sweeps run changes nothing
    again, cols2, _, _, _, _ = _selected("probit", 150, 30, 23, 0.01)
    plain = again.refine(cols2, n_sweeps=50)
    _assert_same_arrays(_arrays(state), _arrays(again))
    assert plain == quiet
    # returning False stops the sweeps (and, in run, the stages after them)
    options = engine.IVMOptions(30, refine_sweeps=50, exchange="greedy")
    X, yy, lik, _, _, kernel = _problem("probit", 150, 23)
    cols3 = kernel.columns(X)
    st = engine.IVMEP(yy, lik.site_spec(), cols3.diag, options, sigma2=0.01)
    result = st.run(cols3, callback=lambda sweep, change, log_z: sweep < 2)
    assert result.stopped and result.ep.stopped and result.n_sweeps == result.ep.n_sweeps == 2
    assert not result.converged and result.refinement == {"ep": result.ep}
    _assert_consistent_with_sites(st, kernel(X))
    assert result.log_z == st.log_likelihood()


@pytest.mark.parametrize("failure", ["callback", "kernel"])
def test_a_failed_refinement_leaves_the_state_as_it_was(failure):
    state, cols, _, _, _, _ = _selected("probit", 120, 25, 24, 0.01)
    before = _arrays(state)

    class Boom(Exception):
        pass

    def callback(sweep, change, log_z):
        if sweep == 2:
            raise Boom

    if failure == "callback":
        with pytest.raises(Boom):
            state.refine(cols, n_sweeps=20, callback=callback)
    else:
        # a kernel whose rows make I + B^½ K_I B^½ indefinite: the first refactorisation fails
        with pytest.raises(np.linalg.LinAlgError):
            state.refine(lambda j: -10.0 * cols(j), n_sweeps=20)
    _assert_same_arrays(_arrays(state), before)
    assert state.refine(cols, n_sweeps=20).converged                # and the state still works


def test_options_are_validated_once_and_read_only():
    options = engine.IVMOptions(10, criterion="info_gain", seed=2 ** 63, refine_sweeps=3, exchange="random",
                                max_exchanges=4)
    assert options.criterion == engine.CRITERION_INFO_GAIN and options.seed == 2 ** 63
    assert options == engine.IVMOptions(10, criterion=engine.CRITERION_INFO_GAIN, seed=2 ** 63, refine_sweeps=3,
                                        exchange="random", max_exchanges=4)
    assert pickle.loads(pickle.dumps(options)) == options == copy.copy(options)
    assert repr(options).startswith("IVMOptions(d=10, criterion=1")
    with pytest.raises(AttributeError):
        options.d = 3
    assert engine.IVMOptions(4).as_dict() == {"d": 4, "criterion": 0, "seed": 0, "refine_sweeps": 0,
                                              "refine_tol": 1e-9, "exchange": None, "exchange_tol": 1e-6,
                                              "max_exchanges": None}
    bad = [(dict(d=0), "d"), (dict(d=2.0), "d"), (dict(d=True), "d"), (dict(d=3, criterion="best"), "criterion"),
           (dict(d=3, criterion=3), "criterion"), (dict(d=3, seed=-1), "seed"), (dict(d=3, seed=2 ** 64), "seed"),
           (dict(d=3, refine_sweeps=-1), "refine_sweeps"), (dict(d=3, refine_tol=np.nan), "refine_tol"),
           (dict(d=3, exchange="best"), "exchange"), (dict(d=3, exchange_tol=-1.0), "exchange_tol"),
           (dict(d=3, max_exchanges=1.5), "max_exchanges")]
    for kwargs, name in bad:
        with pytest.raises(ValueError, match=name):
            engine.IVMOptions(**kwargs)
    X, y, lik, _, _, kernel = _problem("probit", 30, 25)
    cols = kernel.columns(X)
    state = engine.IVMEP(y, lik.site_spec(), cols.diag, options)
    assert state.options is options and state.d_max == 10 and state.criterion == engine.CRITERION_INFO_GAIN
    with pytest.raises(TypeError, match="column_fn"):
        state.run("cols")
    assert state.n_active == 0


# --------------------------------------------------------------------------- bad input

def test_bad_arguments_raise_naming_the_argument_and_leave_the_state_unchanged():
    state, cols, _, _, _, _ = _selected("probit", 60, 15, 10)
    snap = _snapshot(state)
    bad = [
        (lambda: state.refine(cols, n_sweeps=-1), ValueError, "n_sweeps"),
        (lambda: state.refine(cols, n_sweeps=1.5), ValueError, "n_sweeps"),
        (lambda: state.refine(cols, n_sweeps=True), ValueError, "n_sweeps"),
        (lambda: state.refine(cols, tol=-1e-3), ValueError, "tol"),
        (lambda: state.refine(cols, tol=np.nan), ValueError, "tol"),
        (lambda: state.refine(cols, refactor_every=0), ValueError, "refactor_every"),
        (lambda: state.refine(None), TypeError, "column_fn"),
        (lambda: state.exchange(cols, mode="best"), ValueError, "mode"),
        (lambda: state.exchange(cols, mode=None), ValueError, "mode"),
        (lambda: state.exchange(cols, tol=-1.0), ValueError, "tol"),
        (lambda: state.exchange(cols, max_moves=-2), ValueError, "max_moves"),
        (lambda: state.exchange(cols, seed=-1), ValueError, "seed"),
        (lambda: state.exchange(cols, refactor_every=0), ValueError, "refactor_every"),
        (lambda: state.exchange("cols"), TypeError, "column_fn"),
        (lambda: state.refine(lambda j: np.ones(3)), ValueError, "column_fn"),
        (lambda: state.exchange(lambda j: np.full(60, np.nan)), ValueError, "column_fn"),
    ]
    for call, exc, name in bad:
        with pytest.raises(exc, match=name):
            call()
        _assert_state_close(state, snap, atol=0.0)


@pytest.mark.parametrize("param, value", [("refine_sweeps", -1), ("exchange", "best"), ("exchange", 1),
                                          ("exchange_tol", -1e-6), ("exchange_tol", np.inf),
                                          ("max_exchanges", -1)])
def test_estimators_reject_bad_refinement_options_without_changing_a_fit(param, value):
    X, y, _, _, _, _ = _problem("probit", 60, 11)
    clf = IVMClassifier(active_set_size=10, optimizer=None).fit(X, y)
    active, sites = clf.active_set_.copy(), clf.site_mean_.copy()
    clf.set_params(**{param: value})
    with pytest.raises((ValueError, TypeError), match=param):
        clf.fit(X, y)
    np.testing.assert_array_equal(clf.active_set_, active)
    np.testing.assert_array_equal(clf.site_mean_, sites)
    with pytest.raises((ValueError, TypeError), match=param):
        IVMRegressor(active_set_size=10, optimizer=None, **{param: value}).fit(X, y)


# --------------------------------------------------------------------------- estimators

def test_estimators_refine_their_active_sets():
    X, y, lik, _, _, kernel = _problem("probit", 150, 12)
    common = dict(kernel=kernel, likelihood=lik, active_set_size=25, optimizer=None)
    plain = IVMClassifier(**common).fit(X, y)
    assert plain.refinement_ is None
    ep = IVMClassifier(refine_sweeps=50, **common).fit(X, y)
    np.testing.assert_array_equal(ep.active_set_, plain.active_set_)
    assert ep.refinement_["ep"].converged
    cols = kernel.columns(X)
    st = engine.IVMEP(y, lik.site_spec(), cols.diag, 25)                 # y is already ±1
    st.select(25, cols)
    st.refine(cols, n_sweeps=50)
    np.testing.assert_allclose(ep.site_precision_, st.site_precision[ep.active_set_], rtol=1e-12)
    np.testing.assert_allclose(ep.site_mean_, st.site_mean[ep.active_set_], rtol=1e-12, atol=1e-12)
    ex = IVMClassifier(exchange="greedy", max_exchanges=200, **common).fit(X, y)
    assert ex.refinement_["exchange"].converged and ex.refinement_["exchange"].n_moves > 0
    K = kernel(X)
    gain = sum(m[2] for m in ex.refinement_["exchange"].moves)
    assert (ref.entropy_reduction(K, ex.active_set_, _full(ex.site_precision_, ex.active_set_, 150))
            == pytest.approx(ref.entropy_reduction(K, plain.active_set_,
                                                   _full(plain.site_precision_, plain.active_set_, 150)) + gain,
                             rel=1e-9))
    assert 0.0 <= ex.predict_proba(X[:5]).min() and ex.predict_proba(X[:5]).max() <= 1.0
    both = IVMClassifier(exchange="random", refine_sweeps=50, random_state=3, **common).fit(X, y)
    assert set(both.refinement_) == {"ep", "exchange", "ep_after_exchange"}
    assert both.refinement_["ep_after_exchange"].converged
    # regression (spherical sites: exchanges only) and ordinal regression with learning
    Xr, yr, _, _, _, kr = _problem("gaussian", 120, 13)
    reg = IVMRegressor(kernel=kr, noise_variance=0.05, active_set_size=20, n_iterations=1, max_optimizer_iter=5,
                       exchange="greedy", refine_sweeps=2).fit(Xr, yr)
    assert reg.refinement_["ep"].n_updates == 0 and reg.score(Xr, yr) > 0.5
    Xo, yo, lo, _, _, ko = _problem("ordinal", 120, 14)
    ordi = IVMOrdinalRegressor(kernel=ko, likelihood=lo, active_set_size=20, n_iterations=1, max_optimizer_iter=5,
                               refine_sweeps=30, exchange="random", random_state=1).fit(Xo, yo)
    assert ordi.refinement_["ep"].converged and ordi.score(Xo, yo) > 0.5


def _full(values, idx, n):
    out = np.zeros(n)
    out[idx] = values
    return out


def test_estimator_warns_when_the_final_refinement_stops_early():
    X, y, lik, _, _, kernel = _problem("probit", 150, 12)
    with pytest.warns(ConvergenceWarning, match="refine_sweeps"):
        IVMClassifier(kernel=kernel, likelihood=lik, active_set_size=25, optimizer=None, refine_sweeps=1).fit(X, y)
    with pytest.warns(ConvergenceWarning, match="max_exchanges"):
        IVMClassifier(kernel=kernel, likelihood=lik, active_set_size=25, optimizer=None, exchange="greedy",
                      max_exchanges=1).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        IVMClassifier(kernel=kernel, likelihood=lik, active_set_size=25, optimizer=None, refine_sweeps=50).fit(X, y)
