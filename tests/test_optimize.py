"""fastep._search.optimize.maximize_log_likelihood: L-BFGS-B with a trust-region fallback for runs that stall at their start."""
import numpy as np

from fastep._search.optimize import maximize_log_likelihood


def _sum_over_points(n=200, centre=(1.0, -2.0), finite_within=5.0):
    """``Σ_i -|θ - c|²/2`` over n points (gradient O(n)), ``-inf`` beyond ``finite_within`` of the origin
    (a model that cannot be evaluated there), and a list of the evaluated points."""
    centre = np.asarray(centre)
    seen = []

    def objective(theta):
        seen.append(np.array(theta))
        if np.max(np.abs(theta)) > finite_within:
            return -np.inf, np.zeros_like(theta)
        return -0.5 * n * float(np.sum((theta - centre) ** 2)), -n * (theta - centre)
    return objective, seen


BOXED = np.array([[-30.0, 20.0], [-30.0, 20.0]])        # the likelihood bounds' kind: every variable boxed


def test_lbfgsb_alone_stalls_at_the_start_when_every_variable_is_boxed():
    """The premise of the fallback: the first trial is the raw O(n) gradient, lands where the
    objective is -inf, and L-BFGS-B then reports convergence at the start."""
    objective, seen = _sum_over_points()
    theta, value, _ = maximize_log_likelihood(objective, np.zeros(2), BOXED, stall_fallback=False)
    assert np.max(np.abs(seen[1] - seen[0])) > 10           # first trial: the whole gradient, clipped
    np.testing.assert_array_equal(theta, np.zeros(2))
    assert value == objective(np.zeros(2))[0]


def test_stalled_start_is_searched_again_in_trust_regions():
    objective, _ = _sum_over_points()
    theta, value, n_evals = maximize_log_likelihood(objective, np.zeros(2), BOXED)
    np.testing.assert_allclose(theta, [1.0, -2.0], atol=1e-6)
    assert value > -1e-8 and n_evals > 3


def test_stalled_restart_is_searched_again_and_the_best_start_wins():
    objective, _ = _sum_over_points(centre=(3.0, 3.0))
    theta, _, _ = maximize_log_likelihood(objective, np.zeros(2), BOXED, n_restarts=2,
                                          rng=np.random.default_rng(0))
    np.testing.assert_allclose(theta, [3.0, 3.0], atol=1e-6)


def test_runs_that_make_progress_are_not_repeated():
    """With an unbounded variable L-BFGS-B's first step has length 1 and it converges: the
    fallback never runs, so the result and the evaluation count are those of L-BFGS-B alone."""
    bounds = np.array([[-30.0, 20.0], [-np.inf, np.inf]])
    results = []
    for fallback in (True, False):
        objective, _ = _sum_over_points()
        results.append(maximize_log_likelihood(objective, np.zeros(2), bounds, stall_fallback=fallback))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1:] == results[1][1:]
    np.testing.assert_allclose(results[0][0], [1.0, -2.0], atol=1e-6)


def test_stationary_start_is_not_searched_again():
    objective, seen = _sum_over_points()
    theta, _, n_evals = maximize_log_likelihood(objective, np.array([1.0, -2.0]), BOXED)
    np.testing.assert_array_equal(theta, [1.0, -2.0])
    assert n_evals == len(seen) == 1


def _lbfgsb_result(x, gradient, message, status=0, fun=-10.0):
    from scipy.optimize import OptimizeResult
    return OptimizeResult(x=np.asarray(x, float), jac=-np.asarray(gradient, float), fun=fun,
                          message=message, status=status, nit=3)


REL = "CONVERGENCE: RELATIVE REDUCTION OF F <= FACTR*EPSMCH"


def test_stopped_short_only_for_relative_reduction_stops_far_from_stationarity():
    from fastep._search.optimize import _stopped_short
    bounds = np.array([[-1.0, 1.0], [-np.inf, np.inf]])
    assert _stopped_short(_lbfgsb_result([0.0, 0.0], [0.0, 0.5], REL), bounds)
    assert not _stopped_short(_lbfgsb_result([0.0, 0.0], [0.0, 1e-4], REL), bounds)        # stationary enough
    assert not _stopped_short(_lbfgsb_result([0.0, 0.0], [0.0, 0.5],
                                             "CONVERGENCE: NORM OF PROJECTED GRADIENT <= PGTOL"), bounds)
    assert not _stopped_short(_lbfgsb_result([0.0, 0.0], [0.0, 0.5], "STOP: TOTAL NO. OF ITERATIONS "
                                             "REACHED LIMIT", status=1), bounds)           # budget spent
    assert not _stopped_short(_lbfgsb_result([1.0, 0.0], [5.0, 1e-4], REL), bounds)        # pushes into a bound
    assert _stopped_short(_lbfgsb_result([1.0, 0.0], [-5.0, 1e-4], REL), bounds)           # away from it
    assert not _stopped_short(_lbfgsb_result([0.0, 0.0], [0.0, 0.5], REL, fun=1e300), bounds)  # failed point


def test_an_objective_stop_on_a_face_of_the_trust_box_moves_to_the_next_box():
    """An objective whose own rule (``SearchStop``) ends a run at a point it evaluated: when that
    point lies on a face of the trust box, only the box's run ends and the search goes on in
    the next, larger box, to the maximiser beyond it; ``on_recentre`` is called at each new
    centre (a caller's rule counts afresh from there)."""
    from fastep._search.optimize import SearchStop, maximize_log_likelihood_trust_region
    base, _ = _sum_over_points(n=1, centre=(4.0, 0.0), finite_within=np.inf)
    state = {"raised": 0, "recentred": 0}

    def objective(theta):            # the rule fires at the first evaluation on the first box's face
        value, gradient = base(theta)
        if state["raised"] == 0 and np.max(np.abs(theta)) >= 0.5 - 1e-12:
            state["raised"] += 1
            raise SearchStop(np.array(theta), value)
        return value, gradient

    def recentre():
        state["recentred"] += 1

    theta, value, _ = maximize_log_likelihood_trust_region(objective, np.zeros(2), BOXED, radius=0.5,
                                                           on_recentre=recentre)
    assert state["raised"] == 1               # the rule did end the first box's run on its face
    np.testing.assert_allclose(theta, [4.0, 0.0], atol=1e-6)
    assert state["recentred"] >= 2            # boxes of half-width 0.5, 1, 2 lie short of 4
    # a rule that fires without progress from the start ends the search at the start
    stuck = lambda theta: (_ for _ in ()).throw(SearchStop(np.zeros(2), 0.0)) if np.any(theta) else (0.0, np.ones(2))  # noqa: E731
    theta, value, _ = maximize_log_likelihood_trust_region(stuck, np.zeros(2), BOXED)
    np.testing.assert_array_equal(theta, np.zeros(2))
