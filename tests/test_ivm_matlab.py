"""fastep's IVM against states written by the authors' implementation (Lawrence's MATLAB IVM toolbox).

``../shared/data/ivm_reference/testIvm{Probit,Gaussian}.mat`` hold, for 500 points
in 2-D, the kernel (``kernInit``), the noise model (``noiseInit``) and the result
of selecting d = 50 points (``ivmInfoInit``: ``I`` 1-based in inclusion order, ``J``
the rest, ``m`` and ``beta`` the site parameters, sparse 500 x 1).

What the toolbox computes, as read off these files (and confirmed by the
agreement below to ~1e-13):

* kernel: ``rbf(inverse width, variance) + lin(variance) + bias(variance) +
  white(variance)``, the white term on the diagonal only = fastep's
  ``RBF + Linear + Bias + White`` with the same parameters (``kernel.columns``);
* probit noise: ``g, ν`` from ``Z = Φ(y (μ + b) / sqrt(sigma2 + ς))``, i.e. the
  probit site with bias ``b`` and ``sigma2`` added to the cavity variance
  (equivalently slope ``sigma2^(-1/2)``); Gaussian noise: ``Z = N(y - b; μ, sigma2 + ς)``,
  i.e. the Gaussian site on ``y - bias`` with noise variance ``sigma2``;
* ``m``, ``beta`` are the site mean and precision of each included point in the
  latent (f) space, eqs 22-23 (``m = μ + g/ν``, ``β = ν/(1 - ν ς)``); for the
  Gaussian ("spherical") model ``m = y - bias`` and ``β = 1/sigma2``. fastep's
  site natural mean is ``β m``;
* selection: the entropy criterion (eq 26; the toolbox uses log2, which does not
  change the argmax), first maximum among the inactive points.
"""

import numpy as np
import pytest

from fastep._epcore import ivm as engine
from fastep.kernels import RBF, Bias, Linear, White
from fastep.likelihoods import Gaussian, Probit
from support import shared_data



def _load(name):
    path = shared_data(f"ivm_reference/testIvm{name}.mat")
    from scipy.io import loadmat
    return loadmat(str(path), squeeze_me=True, struct_as_record=False)


def _kernel(kern):
    types = [c.type for c in kern.comp]
    assert types == ["rbf", "lin", "bias", "white"]
    rbf, lin, bias, white = kern.comp
    return (RBF(variance=float(rbf.variance), inverse_width=float(rbf.inverseWidth))
            + Linear(variance=float(lin.variance)) + Bias(variance=float(bias.variance))
            + White(variance=float(white.variance)))


def _reference(name):
    d = _load(name)
    X = np.asarray(d["X"], dtype=float)
    y = np.asarray(d["y"], dtype=float).reshape(-1)
    noise = d["noiseInit"]
    info = d["ivmInfoInit"]
    active = np.asarray(info.I, dtype=np.intp).reshape(-1) - 1
    inactive = np.asarray(info.J, dtype=np.intp).reshape(-1) - 1
    m = np.asarray(info.m.todense()).reshape(-1)
    beta = np.asarray(info.beta.todense()).reshape(-1)
    return X, y, _kernel(d["kernInit"]), noise, active, inactive, m, beta


@pytest.mark.parametrize("name", ["Probit", "Gaussian"])
def test_same_points_same_order_same_sites_as_matlab(name):
    X, y, kernel, noise, active, inactive, m, beta = _reference(name)
    n = X.shape[0]
    assert n == 500 and active.shape == (50,)
    assert sorted(np.concatenate([active, inactive]).tolist()) == list(range(n))
    cols = kernel.columns(X)
    if name == "Probit":
        assert noise.type == "probit"
        spec = Probit(slope=np.inf, bias=float(noise.bias)).site_spec()
        targets, sigma2 = y, float(noise.sigma2)
        assert sigma2 == 1e-6
    else:
        assert noise.type == "gaussian" and noise.spherical == 1
        spec = Gaussian(noise_variance=float(noise.sigma2)).site_spec()
        targets, sigma2 = y - float(noise.bias), 0.0
    state = engine.IVMEP(targets, spec, cols.diag, active.shape[0], sigma2=sigma2)
    chosen = state.select(active.shape[0], cols)
    np.testing.assert_array_equal(chosen, active)
    np.testing.assert_array_equal(np.flatnonzero(~np.array(state.is_active)), np.sort(inactive))
    np.testing.assert_allclose(state.site_mean, m, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(state.site_precision, beta, rtol=1e-8, atol=1e-8)
    # inactive points carry no site
    assert np.all(m[inactive] == 0) and np.all(beta[inactive] == 0)
    if name == "Probit":
        # the same model written as a probit slope instead of the cavity offset
        alt = engine.IVMEP(y, Probit(slope=sigma2 ** -0.5, bias=float(noise.bias)).site_spec(),
                              cols.diag, active.shape[0])
        np.testing.assert_array_equal(alt.select(active.shape[0], cols), active)
        np.testing.assert_allclose(alt.site_mean, m, rtol=1e-8, atol=1e-8)
        np.testing.assert_allclose(alt.site_precision, beta, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("name", ["Probit", "Gaussian"])
def test_estimators_with_fixed_parameters_reproduce_matlab(name):
    from fastep import IVMClassifier, IVMRegressor
    X, y, kernel, noise, active, _, m, beta = _reference(name)
    if name == "Probit":
        model = IVMClassifier(kernel, Probit(slope=float(noise.sigma2) ** -0.5, bias=float(noise.bias)),
                              active_set_size=50, optimizer=None).fit(X, y)
        np.testing.assert_array_equal(model.classes_, [-1, 1])
    else:
        model = IVMRegressor(kernel, noise_variance=float(noise.sigma2), bias=float(noise.bias),
                             learn_noise=False, active_set_size=50, optimizer=None).fit(X, y)
    np.testing.assert_array_equal(model.active_set_, active)
    np.testing.assert_allclose(model.site_mean_, m[active], rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(model.site_precision_, beta[active], rtol=1e-8, atol=1e-8)
