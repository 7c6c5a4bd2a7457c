"""A likelihood is one class: two toy likelihoods written here, against the public base class
only, run through the dense and the sparse GP classifiers with no change to either model.

* ``QuadratureLogit``: the logit site ``σ(y f)`` with its moments by Gauss-Hermite quadrature
  (the compiled site kernel's quadrature path).  Its one-site moments must equal the exact
  moments by adaptive 1-D quadrature, and a fit with it must be the fit with the built-in
  logistic likelihood on the same quadrature rule (bitwise: the same site kernel).
* ``SlopeProbit``: a probit ``Φ(λ y f)`` whose only learnable parameter is the slope λ,
  declared through :meth:`Likelihood.parameters`.  The evidence gradient in log λ must match
  finite differences in both models, and learning it must raise the evidence.
"""
import math

import numpy as np
import pytest
from scipy import integrate

from fastep import GaussianProcessClassifier, SparseGPClassifier
from fastep._epcore.sites import LIKELIHOOD_CODES, SiteSpec
from fastep.kernels import RBF, TRANSFORMS
from fastep.likelihoods import BinaryLikelihood, LikelihoodParameter, Logistic


class QuadratureLogit(BinaryLikelihood):
    """``p(y | f) = σ(y f)``, site moments by ``n_nodes``-point Gauss-Hermite quadrature."""

    _param_names = ("n_nodes",)
    n_nodes: int

    def __init__(self, n_nodes: int = 40) -> None:
        super().__init__(n_nodes=n_nodes)

    @staticmethod
    def _validate(params):
        n_nodes = params["n_nodes"]
        if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or not 2 <= n_nodes <= 256:
            raise ValueError(f"n_nodes must be an integer in [2, 256], got {n_nodes!r}")
        return {"n_nodes": n_nodes}

    def _make_spec(self):
        nodes, weights = np.polynomial.hermite.hermgauss(self._params["n_nodes"])
        return SiteSpec(LIKELIHOOD_CODES["logistic_gh"], [], nodes, np.log(weights) - 0.5 * np.log(np.pi))

    def parameters(self):
        return []


class SlopeProbit(BinaryLikelihood):
    """``p(y | f) = Φ(λ y f)`` with the slope λ learnable (t = log λ)."""

    _param_names = ("slope",)
    slope: float

    def __init__(self, slope: float = 1.0) -> None:
        super().__init__(slope=slope)

    @staticmethod
    def _validate(params):
        slope = float(params["slope"])
        if not (slope > 0 and math.isfinite(slope)):
            raise ValueError(f"slope must be finite and > 0, got {slope!r}")
        return {"slope": slope}

    def _make_spec(self):
        return SiteSpec(LIKELIHOOD_CODES["probit"], [self._params["slope"], 0.0])

    def parameters(self):
        return [LikelihoodParameter("log_slope", "slope", TRANSFORMS["log"], box=(-20.0, 20.0))]

    def _theta_terms(self, name, log_z, alpha, beta, cavity_mean, cavity_var):
        # Z = Φ(λ y m / sqrt(1 + λ² v)): ∂ log Z/∂ log λ = α m / (1 + λ² v)
        return alpha * cavity_mean / (1.0 + self.slope ** 2 * cavity_var)


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] - 0.5 * X[:, 1] + 0.4 * rng.normal(size=n) > 0, 1, -1)
    return X, y


@pytest.mark.parametrize("y, mean, var", [(1.0, 0.3, 0.7), (-1.0, 2.0, 0.2), (1.0, -3.0, 4.0)])
def test_quadrature_logit_site_moments_are_the_exact_moments(y, mean, var):
    log_z, alpha, beta = QuadratureLogit(120).moments(np.array([y]), np.array([mean]), np.array([var]))
    sd = math.sqrt(var)

    def tilted(f, power):
        return f ** power / (1.0 + math.exp(-y * f)) * math.exp(-0.5 * (f - mean) ** 2 / var) / (sd * math.sqrt(2 * math.pi))

    z = integrate.quad(tilted, mean - 12 * sd, mean + 12 * sd, args=(0,), epsabs=0, epsrel=1e-12)[0]
    m1 = integrate.quad(tilted, mean - 12 * sd, mean + 12 * sd, args=(1,), epsabs=0, epsrel=1e-12)[0] / z
    m2 = integrate.quad(tilted, mean - 12 * sd, mean + 12 * sd, args=(2,), epsabs=0, epsrel=1e-12)[0] / z
    # the 120-node Gauss-Hermite rule: its error on these cavities is at most 3e-11 (largest at v = 4)
    assert log_z[0] == pytest.approx(math.log(z), abs=1e-9)
    assert mean + var * alpha[0] == pytest.approx(m1, abs=1e-9)
    assert var - var * var * beta[0] == pytest.approx(m2 - m1 * m1, abs=1e-9)


@pytest.mark.parametrize("make", [lambda lik: GaussianProcessClassifier(kernel=RBF(1.0, 0.5), likelihood=lik,
                                                                         optimizer=None),
                                  lambda lik: SparseGPClassifier(kernel=RBF(1.0, 0.5), likelihood=lik, n_inducing=8,
                                                                 optimizer=None, random_state=0),
                                  lambda lik: SparseGPClassifier(kernel=RBF(1.0, 0.5), likelihood=lik, n_inducing=8,
                                                                 power=0.5, optimizer=None, random_state=0)],
                         ids=["dense", "sparse", "sparse-power-ep"])
def test_a_new_likelihood_runs_through_the_models_unchanged(make):
    X, y = _data()
    toy = make(QuadratureLogit(40)).fit(X, y)
    builtin = make(Logistic(method="gauss-hermite", n_nodes=40)).fit(X, y)
    assert toy.log_marginal_likelihood_value_ == builtin.log_marginal_likelihood_value_
    np.testing.assert_array_equal(toy.predict_proba(X), builtin.predict_proba(X))


@pytest.mark.parametrize("make", [lambda: GaussianProcessClassifier(kernel=RBF(1.0, 0.5), likelihood=SlopeProbit(2.0),
                                                                    learn_likelihood=True, optimizer=None),
                                  lambda: SparseGPClassifier(kernel=RBF(1.0, 0.5), likelihood=SlopeProbit(2.0),
                                                             learn_likelihood=True, n_inducing=10, optimizer=None,
                                                             random_state=0)],
                         ids=["dense", "sparse"])
def test_a_new_likelihoods_declared_parameter_has_the_evidence_gradient(make):
    X, y = _data()
    model = make().fit(X, y)
    theta = model.kernel_.theta
    theta = np.concatenate([theta, model.likelihood_.theta])
    value, grad = model.log_marginal_likelihood(theta, eval_gradient=True)
    h = 1e-5
    step = np.zeros_like(theta)
    step[-1] = h
    central = (model.log_marginal_likelihood(theta + step) - model.log_marginal_likelihood(theta - step)) / (2 * h)
    # EP run to its tolerance: the fixed point's gradient identity holds to about the site error
    assert grad[-1] == pytest.approx(central, rel=1e-4, abs=1e-6)


def test_learning_a_new_likelihoods_parameter_raises_the_evidence():
    X, y = _data(seed=3)
    kernel = RBF(1.0, 0.5, transforms={"variance": "fixed", "inverse_width": "fixed"})    # only λ is learnt
    start = GaussianProcessClassifier(kernel=kernel, likelihood=SlopeProbit(0.3), optimizer=None).fit(X, y)
    learnt = GaussianProcessClassifier(kernel=kernel, likelihood=SlopeProbit(0.3), learn_likelihood=True,
                                       hyperprior=None).fit(X, y)
    assert learnt.likelihood_.slope > 1.0
    assert learnt.log_marginal_likelihood_value_ > start.log_marginal_likelihood_value_ + 1.0
