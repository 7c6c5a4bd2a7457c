"""Public linear EP estimators: closed forms, conventions, bad input, warnings."""
import warnings

import numpy as np
import pytest
from scipy.special import ndtr
from scipy.stats import multivariate_normal

from fastep import (ConvergenceWarning, LinearEPClassifier, LinearEPRegressor, Logistic, NotFittedError,
                    Probit, Step)


def _blr_closed_form(X, y, m0, V0, noise_var):
    V = np.linalg.inv(np.linalg.inv(V0) + X.T @ X / noise_var)
    m = V @ (np.linalg.solve(V0, m0) + X.T @ y / noise_var)
    log_ev = multivariate_normal(X @ m0, X @ V0 @ X.T + noise_var * np.eye(len(y))).logpdf(y)
    return m, V, log_ev


@pytest.fixture
def regression_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 6))
    y = X @ rng.normal(size=6) + 0.4 * rng.normal(size=80)
    return X, y


@pytest.fixture
def classification_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 4))
    y = np.where(X @ np.array([1.5, -1.0, 0.5, 0.0]) + 0.5 * rng.normal(size=150) > 0, "pos", "neg")
    return X, y


@pytest.mark.parametrize("update_form", ["natural", "moment"])
def test_regressor_equals_bayesian_linear_regression(regression_data, update_form):
    X, y = regression_data
    rng = np.random.default_rng(2)
    A = rng.normal(size=(6, 6))
    V0 = A @ A.T / 6 + 0.5 * np.eye(6)
    m0 = rng.normal(size=6)
    reg = LinearEPRegressor(noise_variance=0.3, prior_mean=m0, prior_cov=V0, update_form=update_form).fit(X, y)
    m, V, log_ev = _blr_closed_form(X, y, m0, V0, 0.3)
    np.testing.assert_allclose(reg.posterior_mean_, m, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(reg.posterior_cov_, V, rtol=1e-10, atol=1e-13)
    assert reg.log_marginal_likelihood_value_ == pytest.approx(log_ev, rel=1e-10, abs=1e-9)
    mean, std = reg.predict(X[:5], return_std=True)
    np.testing.assert_allclose(mean, X[:5] @ m, rtol=1e-10)
    np.testing.assert_allclose(std**2, np.einsum("ij,jk,ik->i", X[:5], V, X[:5]) + 0.3, rtol=1e-10)


def test_regressor_intercept_is_an_extra_feature(regression_data):
    X, y = regression_data
    y = y + 3.0
    reg = LinearEPRegressor(noise_variance=0.2, prior_cov=2.0, fit_intercept=True, intercept_prior_var=50.0).fit(X, y)
    Xa = np.hstack([X, np.ones((len(y), 1))])
    V0 = np.diag([2.0] * 6 + [50.0])
    m, _, log_ev = _blr_closed_form(Xa, y, np.zeros(7), V0, 0.2)
    np.testing.assert_allclose(reg.coef_, m[:6], rtol=1e-10)
    assert reg.intercept_ == pytest.approx(m[6], rel=1e-10)
    assert reg.log_marginal_likelihood_value_ == pytest.approx(log_ev, rel=1e-10)


def test_classifier_conventions(classification_data):
    X, y = classification_data
    clf = LinearEPClassifier(Probit()).fit(X, y)
    assert clf.classes_.tolist() == ["neg", "pos"]
    assert clf.converged_ and clf.n_sweeps_ >= 2
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-14)
    pred = clf.predict(X)
    np.testing.assert_array_equal(pred, clf.classes_[(proba[:, 1] > 0.5).astype(int)])
    assert np.all((clf.decision_function(X) > 0) == (pred == "pos"))
    assert clf.score(X, y) > 0.8
    # probit predictive: Φ(μ / sqrt(1 + σ²))
    mean, var = clf.predict_latent(X)
    np.testing.assert_allclose(proba[:, 1], ndtr(mean / np.sqrt(1.0 + var)), rtol=1e-12, atol=1e-15)
    assert np.all(clf.site_precision_ >= 0)
    assert clf.get_params()["likelihood"] is not None and "tol" in clf.get_params()


@pytest.mark.parametrize("likelihood", [Probit(slope=3.0), Step(flip_noise=0.1), Logistic(method="mackay"),
                                        Logistic(method="gauss-hermite", n_nodes=24)])
def test_classifier_likelihoods_fit_and_agree_on_direction(classification_data, likelihood):
    X, y = classification_data
    clf = LinearEPClassifier(likelihood, max_sweeps=300, damping=0.8).fit(X, y)
    assert clf.converged_
    assert np.isfinite(clf.log_marginal_likelihood_value_)
    assert clf.coef_[0] > 0 and clf.coef_[1] < 0


def test_predict_before_fit_and_feature_mismatch(classification_data):
    X, y = classification_data
    clf = LinearEPClassifier()
    with pytest.raises(NotFittedError, match="not fitted"):
        clf.predict(X)
    clf.fit(X, y)
    with pytest.raises(ValueError, match="3 features, but LinearEPClassifier is expecting 4 features"):
        clf.predict(X[:, :3])


@pytest.mark.parametrize("bad_fit, match, exc", [
    (lambda X, y: (np.where(np.eye(len(X), 4, dtype=bool), np.nan, X), y), "X must be finite", ValueError),
    (lambda X, y: (np.where(np.eye(len(X), 4, dtype=bool), np.inf, X), y), "X must be finite", ValueError),
    (lambda X, y: (X[:, 0], y), "X must be a 2-D array", ValueError),
    (lambda X, y: (X, y[:-1]), "inconsistent numbers of samples", ValueError),
    (lambda X, y: (X, np.full(len(y), "pos")), "only one class", ValueError),
    (lambda X, y: (X, np.arange(len(y)) % 3), "exactly two classes", ValueError),
])
def test_bad_input_leaves_state_unchanged(classification_data, bad_fit, match, exc):
    X, y = classification_data
    clf = LinearEPClassifier().fit(X, y)
    before = clf.posterior_mean_.copy(), clf.log_marginal_likelihood_value_, clf.classes_.copy()
    Xb, yb = bad_fit(X, y)
    with pytest.raises(exc, match=match):
        clf.fit(Xb, yb)
    np.testing.assert_array_equal(clf.posterior_mean_, before[0])
    assert clf.log_marginal_likelihood_value_ == before[1]
    np.testing.assert_array_equal(clf.classes_, before[2])


def test_unfitted_estimator_stays_unfitted_after_bad_input(classification_data):
    X, y = classification_data
    clf = LinearEPClassifier(prior_cov=np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="prior_cov must have shape"):
        clf.fit(X, y)
    clf = LinearEPClassifier(prior_cov=-np.eye(4))
    with pytest.raises(ValueError, match="positive definite"):
        clf.fit(X, y)
    assert not hasattr(clf, "posterior_mean_")


@pytest.mark.parametrize("kwargs, match, exc", [
    (dict(update_form="fast"), "update_form must be one of", ValueError),
    (dict(negative_precision="ignore"), "negative_precision must be one of", ValueError),
    (dict(tol=-1.0), "tol must be finite and > 0", ValueError),
    (dict(max_sweeps=0), "max_sweeps must be >= 1", ValueError),
    (dict(damping=0.0), "damping must be in", ValueError),
    (dict(damping=1.5), "damping must be in", ValueError),
    (dict(likelihood="probit"), "likelihood must be a binary classification likelihood", TypeError),
    (dict(fit_intercept="yes"), "fit_intercept must be a bool", TypeError),
])
def test_bad_options(classification_data, kwargs, match, exc):
    X, y = classification_data
    with pytest.raises(exc, match=match):
        LinearEPClassifier(**kwargs).fit(X, y)


def test_bad_likelihood_parameters():
    with pytest.raises(ValueError, match="flip_noise"):
        Step(flip_noise=0.5)
    with pytest.raises(ValueError, match="flip_noise"):
        Step(flip_noise=-0.1)
    with pytest.raises(ValueError, match="slope"):
        Probit(slope=0.0)
    with pytest.raises(ValueError, match="slope"):
        Probit(slope=-2.0)
    with pytest.raises(ValueError, match="method"):
        Logistic(method="laplace")


def test_regressor_rejects_bad_noise_variance(regression_data):
    X, y = regression_data
    with pytest.raises(ValueError, match="noise_variance must be finite and > 0"):
        LinearEPRegressor(noise_variance=0.0).fit(X, y)


def test_non_convergence_warns_with_sweep_count(classification_data):
    X, y = classification_data
    with pytest.warns(ConvergenceWarning, match="did not converge in 1 sweeps"):
        clf = LinearEPClassifier(max_sweeps=1).fit(X, y)
    assert not clf.converged_
    assert np.all(np.isfinite(clf.posterior_mean_))


def test_no_warning_when_converged(classification_data):
    X, y = classification_data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LinearEPClassifier().fit(X, y)


def test_log_evidence_is_a_deprecated_alias_of_log_marginal_likelihood_value():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = np.where(X[:, 0] > 0, 1, -1)
    clf = LinearEPClassifier().fit(X, y)
    with pytest.warns(FutureWarning, match="log_evidence_ is deprecated.*log_marginal_likelihood_value_"):
        old = clf.log_evidence_
    assert old == clf.log_marginal_likelihood_value_
    assert "log_evidence_" not in vars(clf)


def test_rank_k_ep_is_a_deprecated_alias_of_linear_ep_rank_k():
    import pickle

    import fastep
    from fastep.linear import LinearEPRankK
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 2, 3))
    Y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=(20, 2))
    with pytest.warns(FutureWarning, match="RankKEP is deprecated.*use LinearEPRankK"):
        old = fastep.RankKEP
    with pytest.warns(FutureWarning, match="RankKEP is deprecated.*use LinearEPRankK"):
        from fastep.linear import RankKEP
    assert old is RankKEP is LinearEPRankK is fastep.LinearEPRankK
    assert "RankKEP" not in fastep.__all__ and "LinearEPRankK" in fastep.__all__
    model = old(noise_cov=0.01 * np.eye(2)).fit(X, Y)
    new = LinearEPRankK(noise_cov=0.01 * np.eye(2)).fit(X, Y)
    np.testing.assert_array_equal(model.posterior_mean_, new.posterior_mean_)
    assert model.log_marginal_likelihood_value_ == new.log_marginal_likelihood_value_
    # a pickle written under the former name loads as the class under its new name
    written = pickle.dumps(new, protocol=0)
    assert b"\nLinearEPRankK\n" in written
    with pytest.warns(FutureWarning, match="RankKEP is deprecated"):
        loaded = pickle.loads(written.replace(b"\nLinearEPRankK\n", b"\nRankKEP\n"))
    assert type(loaded) is LinearEPRankK
    np.testing.assert_array_equal(loaded.posterior_mean_, new.posterior_mean_)


def test_multioutput_is_a_deprecated_alias_of_linear_for_linear_ep_rank_k():
    import pickle
    import sys

    import fastep.linear
    sys.modules.pop("fastep.multioutput", None)
    with pytest.warns(FutureWarning, match="fastep.multioutput is deprecated.*fastep.linear"):
        import fastep.multioutput
    assert fastep.multioutput.LinearEPRankK is fastep.linear.LinearEPRankK
    assert fastep.LinearEPRankK.__module__ == "fastep.linear"
    rng = np.random.default_rng(2)
    X = rng.normal(size=(15, 2, 3))
    Y = X @ np.array([0.5, 1.0, -1.0]) + 0.1 * rng.normal(size=(15, 2))
    new = fastep.linear.LinearEPRankK(noise_cov=0.01 * np.eye(2)).fit(X, Y)
    # a pickle written when the class lived in fastep.multioutput loads as the same class
    written = pickle.dumps(new, protocol=0)
    assert b"cfastep.linear\nLinearEPRankK\n" in written
    loaded = pickle.loads(written.replace(b"cfastep.linear\nLinearEPRankK\n", b"cfastep.multioutput\nLinearEPRankK\n"))
    assert type(loaded) is fastep.linear.LinearEPRankK
    np.testing.assert_array_equal(loaded.posterior_mean_, new.posterior_mean_)
