"""The learnt and default-constructed fits of ``tests/golden.npz``, judged from outside the estimators.

``test_golden.py`` checks that the estimators reproduce ``golden.npz``; a re-recording makes that
true of whatever the code computes. The tests here check the recorded numbers themselves, for
every configuration of :mod:`golden_problems` that learns hyperparameters (or is the
default-constructed estimator), with nothing computed by the estimators or the compiled core
(:mod:`golden_checks` has the checks and the derivation of every tolerance):

* the twin: the plain-numpy reference implementation (:mod:`fastep.reference`) run at the
  recorded hyperparameters on the same data must give the recorded evidence, sites and
  predictions. Independent of the engines' code paths (the twins never import the compiled
  core; sequential where the engines are blocked or parallel; dense where they are O(c n³) or
  O(n m²)); the inputs are rebuilt from the data and the documented preprocessing;
* stationarity: the documented objective of the search (the EP evidence, from the twin, plus
  the documented hyperprior centred at the documented start) must have, at the recorded point,
  a finite-difference gradient as small as the documented stopping rule implies. Independent of
  the search's own gradients, of its path and of its record of why it stopped;
* the rule, where the search is not a gradient-stopped maximisation of one objective (the IVM's
  active-set objective, re-optimised after every reselection): the documented procedure
  replayed with the twins must end at the recorded point;
* every check must fail on a perturbed recording (a hyperparameter moved by 0.05 in log space,
  sites scaled by 1.01, the evidence shifted by 1e-3, ...), so that passing means something.
"""
import numpy as np
import pytest

import golden_checks as gc

pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")

#: Stationarity checks over 10 s (each finite difference re-integrates every Student-t site by
#: adaptive quadrature): the slow tier.
SLOW_STATIONARITY = {"gpr_student_t_learnt", "sgpr_student_t_learnt"}


def _slow_if(condition):
    return [pytest.mark.slow] if condition else []


def _learns(name):
    """Whether the recorded fit of ``name`` learnt anything: a search that evaluated the
    evidence, or the IVM's Algorithm 2 rounds."""
    rec = gc.recorded(name)
    return (np.any(rec.get("n_evaluations_", 0) > 0)
            or any(key.startswith(("history_[0].", "history_[0][0].")) for key in rec))


def test_every_learnt_configuration_is_checked():
    """A configuration added to golden_problems that learns must get the independent checks too."""
    learnt = {name for name in gc.PROBLEMS if _learns(name)}
    assert learnt == set(gc.OBJECTIVES) | set(gc.RULES)
    assert learnt | {"linear_probit"} == set(gc.TWINS)
    # linear_probit is the one default-constructed estimator that learns nothing
    estimator = gc.problem("linear_probit")[0]
    assert estimator.get_params() == type(estimator)().get_params()


@pytest.mark.parametrize("name", sorted(gc.TWINS))
def test_twin_reproduces_the_recorded_fit(name):
    """The reference twin at the recorded hyperparameters gives the recorded evidence, sites and
    predictions, within tolerances derived from the EP tolerance the fit ran to."""
    gc.twin_check(name)


@pytest.mark.parametrize("name", [pytest.param(name, marks=_slow_if(name in SLOW_STATIONARITY))
                                  for name in sorted(gc.OBJECTIVES)])
def test_documented_objective_is_stationary_at_the_recorded_point(name):
    """The documented objective (twin evidence + documented hyperprior) has at the recorded point a
    gradient within what the documented stopping rule allows."""
    gc.stationarity_check(name)


@pytest.mark.parametrize("name", sorted(gc.RULES))
def test_documented_procedure_replayed_with_the_twins_ends_at_the_recorded_point(name):
    gc.RULES[name](name)


def test_fixed_site_differences_equal_rerun_differences():
    """The stationarity checks of the horseshoe and Student-t fits difference the twin's evidence
    at the recorded sites instead of re-running EP at every point (too slow there): exact to first
    order because the EP energy is stationary in the sites at a fixed point. Shown here on the
    horseshoe's log σ² and log ρ², against EP re-run to 1e-11 at each point."""
    rec = gc.recorded("horseshoe")
    [(_, obj)] = gc.objectives_horseshoe("horseshoe", rec)
    h = 1e-4
    with gc.threadpool_limits(1):
        for k in range(2):
            e = np.zeros(obj.space.u.size)
            e[k] = h
            fixed = (obj.f(obj.space.u + e) - obj.f(obj.space.u - e)) / (2 * h)
            rerun = (obj.f(obj.space.u + e, False) - obj.f(obj.space.u - e, False)) / (2 * h)
            assert fixed == pytest.approx(rerun, abs=1e-6)


# --------------------------------------------------------------------------------------------
# Every check fails on a perturbed recording
# --------------------------------------------------------------------------------------------
def _scaled(key, factor):
    def change(rec):
        rec[key] = rec[key] * factor
    return change


def _shifted(key, delta):
    def change(rec):
        rec[key] = rec[key] + delta
    return change


def _log_shifted(key, delta=0.05):
    return _scaled(key, np.exp(delta))


def _swap_active(row, i, j):
    def change(rec):
        active = rec["active_set_"]
        active[row, [i, j]] = active[row, [j, i]]
    return change


def _refit(name, **shifts):
    def change(rec):
        rec.update(gc.horseshoe_refit(name, rec, **shifts))
    return change


LOG_ML = "log_marginal_likelihood_value_"
#: (configuration, check, perturbation of the recorded values, a row that must then fail, slow)
PERTURBATIONS = [
    # the twin
    ("gpc_learnt", "twin", _log_shifted("kernel_.params.variance"), "log marginal likelihood", False),
    ("gpc_learnt", "twin", _scaled("site_precision_", 1.01), "site precision", False),
    ("gpr_learnt", "twin", _shifted(LOG_ML, 1e-3), "log marginal likelihood", False),
    ("gpr_learnt", "twin", _log_shifted("likelihood_.params.noise_variance"), "site precision", False),
    ("gpc_multinomial_learnt", "twin", _shifted(LOG_ML, 1e-3), "log marginal likelihood", False),
    ("gpc_multinomial_learnt", "twin", _scaled("site_precision_", 1.01), "outer site precisions", False),
    ("gpr_student_t_learnt", "twin", _shifted(LOG_ML, 1e-3), "log marginal likelihood", False),
    ("gpr_student_t_learnt", "twin", _scaled("site_precision_", 1.01), "fixed-point residual", False),
    ("sgpc_default", "twin", _scaled("site_natural_mean_", 1.01), "site natural mean", False),
    ("sgpc_learn_inducing", "twin", _shifted("inducing_inputs_", 0.05), "log marginal likelihood", False),
    ("sgpr_default", "twin", _log_shifted("likelihood_.params.noise_variance"), "log marginal likelihood", False),
    ("sgpr_student_t_learnt", "twin", _shifted(LOG_ML, 1e-3), "log marginal likelihood", False),
    ("sgpr_student_t_learnt", "twin", _log_shifted("likelihood_.params.dof"), "fixed-point residual", False),
    ("ivmc_default", "twin", _log_shifted("kernel_.params.variance"), "full-data EP-FITC evidence", False),
    ("ivmc_active_set", "twin", _scaled("site_mean_", 1.01), "site means", False),
    ("ivmc_multiclass", "twin", _swap_active(1, 3, 4), "class 1: active set", False),
    ("ivmr_default", "twin", _shifted("bias_", 1e-3), "site means", False),
    ("ivm_ordinal", "twin", _log_shifted("likelihood_.params.widths"), "site means", False),
    ("horseshoe", "twin", _log_shifted("rho2_"), "fixed-point residual", False),
    ("horseshoe_dependent", "twin", _scaled("sites_.pi_u", 1.01), "fixed-point residual", False),
    ("horseshoe_multitask", "twin", _scaled("sites_[1].h_w", 1.01), "task 1", False),
    ("linear_probit", "twin", _shifted("log_marginal_likelihood_value_", 1e-3), "log evidence", False),
    # stationarity: the hyperparameters moved by 0.05 in log space
    ("gpc_learnt", "stationarity", _log_shifted("kernel_.params.variance"), "projected gradient", False),
    ("gpr_learnt", "stationarity", _log_shifted("kernel_.params.k0__inverse_width"), "projected gradient", False),
    ("gpc_multinomial_learnt", "stationarity", _log_shifted("kernel_.params.variance"), "projected gradient", False),
    ("gpr_student_t_learnt", "stationarity", _log_shifted("kernel_.params.k0__variance"), "projected gradient", True),
    ("sgpc_default", "stationarity", _log_shifted("kernel_.params.inverse_width"), "projected gradient", False),
    ("sgpc_learn_inducing", "stationarity", _log_shifted("kernel_.params.variance"), "projected gradient", False),
    ("sgpr_default", "stationarity", _log_shifted("likelihood_.params.noise_variance"), "projected gradient",
     False),
    ("sgpr_student_t_learnt", "stationarity", _log_shifted("likelihood_.params.scale"), "projected gradient", True),
    ("ivmc_default", "stationarity", _log_shifted("kernel_.params.variance"), "projected gradient", False),
    ("ivmc_multiclass", "stationarity", _log_shifted("kernel_[2].params.inverse_width"), "class 2: |projected",
     False),
    ("ivmr_default", "stationarity", _log_shifted("likelihood_.params.noise_variance"), "projected gradient",
     False),
    ("ivm_ordinal", "stationarity", _log_shifted("kernel_.params.variance"), "projected gradient", False),
    # the horseshoe's objective is differenced at the recorded sites: moved hyperparameters with the
    # old sites fail on the residual row (not a fixed point); a consistent perturbed fit has its
    # sites re-converged by the twin at the moved point and must fail on the gradient
    ("horseshoe", "stationarity", _log_shifted("rho2_"), "fixed-point residual", False),
    ("horseshoe", "stationarity", _refit("horseshoe", log_sigma2_shift=0.05), "projected gradient", False),
    ("horseshoe_dependent", "stationarity", _refit("horseshoe_dependent", log_sigma2_shift=0.05),
     "projected gradient", False),
    ("horseshoe_multitask", "stationarity", _refit("horseshoe_multitask", log_rho2_shift=0.05),
     "projected gradient", False),
    # the replayed rule
    ("ivmc_active_set", "rule", _log_shifted("kernel_.params.variance"), "learnt log-parameters", False),
]
CHECKS = {"twin": gc.twin_check, "stationarity": gc.stationarity_check,
          "rule": lambda name, rec: gc.RULES[name](name, rec)}


def test_every_check_of_every_configuration_has_a_perturbation():
    covered = {(name, check) for name, check, *_ in PERTURBATIONS}
    expected = ({(name, "twin") for name in gc.TWINS} | {(name, "stationarity") for name in gc.OBJECTIVES}
                | {(name, "rule") for name in gc.RULES})
    assert covered == expected


@pytest.mark.parametrize("name, check, change, failing, slow", [
    pytest.param(*case, marks=_slow_if(case[4]), id=f"{case[0]}-{case[1]}-{i}")
    for i, case in enumerate(PERTURBATIONS)])
def test_check_fails_on_a_perturbed_recording(name, check, change, failing, slow):
    rec = gc.recorded(name)
    change(rec)
    with pytest.raises(AssertionError, match=r"FAIL[^\n]*" + failing.replace("|", r"\|")):
        CHECKS[check](name, rec)


# --------------------------------------------------------------------------------------------
# Findings
# --------------------------------------------------------------------------------------------
_P_NOT_LEARNT = (
    "finding: the recorded loadings P are the random start 0.1 N(0, 1) (seed 0) moved by at most "
    "0.05-0.06, at a near-stationary point (gradient norm 0.0067 / 0.012) that is not a maximum: the "
    "twin's evidence is 0.072 (dependent) / 0.141 (multi-task) nats higher at P + 0.3 (0, 1, -1, -1/4, "
    "-1, -1, -1, -1)^T 1^T, and 0.075 / 0.147 higher where a twin L-BFGS-B run confined to +-0.3 of the "
    "recorded point ends (on the box), against the search's 1e-4-nat stop; the search stops near the "
    "saddle of the evidence at small P")


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=_P_NOT_LEARNT))
                                  for name in ("horseshoe_dependent", "horseshoe_multitask")])
def test_learnt_selection_dependencies_are_a_maximum_of_the_evidence(name):
    """The learnt P is a maximum of the twin's evidence: no probe point near it gains more than
    the search's stopping threshold. Independent of the search, whose first-order rule cannot tell
    a saddle from a maximum."""
    gc.local_maximum_check(name)
