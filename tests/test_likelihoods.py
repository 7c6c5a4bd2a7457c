"""Likelihood objects (fastep.likelihoods): validation, targets, moments, predictive."""
import copy
import math
import pickle

import numpy as np
import pytest
from scipy import integrate
from scipy.special import expit, ndtr

from fastep._epcore import sites as S
from fastep.likelihoods import Gaussian, Logistic, OrderedCategorical, Probit, Step
from fastep.reference import sites as R

EPS = np.finfo(np.float64).eps
RTOL = 1e4 * EPS

ALL = [
    Probit(),
    Probit(slope=2.5, bias=-0.3),
    Probit(slope=np.inf),
    Step(),
    Step(flip_noise=0.1),
    Logistic(),
    Logistic("gauss-hermite", n_nodes=24),
    Gaussian(0.4),
    OrderedCategorical(2),
    OrderedCategorical(4, slope=3.0, bias=-1.0, widths=[0.5, 2.0]),
]


def example_targets(lik, n):
    rng = np.random.default_rng(0)
    if isinstance(lik, OrderedCategorical):
        return rng.integers(0, lik.n_categories, n)
    if isinstance(lik, Gaussian):
        return rng.normal(size=n)
    return rng.choice([-1, 1], n)


# ---------------------------------------------------------------------------
# parameter validation
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("factory,message", [
    (lambda: Probit(slope=0.0), "slope"),
    (lambda: Probit(slope=-1.0), "slope"),
    (lambda: Probit(slope=np.nan), "slope"),
    (lambda: Probit(bias=np.inf), "bias"),
    (lambda: Step(flip_noise=0.5), "flip_noise"),
    (lambda: Step(flip_noise=-1e-3), "flip_noise"),
    (lambda: Step(flip_noise=np.nan), "flip_noise"),
    (lambda: Logistic(method="laplace"), "method"),
    (lambda: Logistic("gauss-hermite", n_nodes=1), "n_nodes"),
    (lambda: Logistic("gauss-hermite", n_nodes=257), "n_nodes"),
    (lambda: Gaussian(0.0), "noise_variance"),
    (lambda: Gaussian(-1.0), "noise_variance"),
    (lambda: Gaussian(np.inf), "noise_variance"),
    (lambda: OrderedCategorical(1), "n_categories"),
    (lambda: OrderedCategorical(3, widths=[0.0]), "widths"),
    (lambda: OrderedCategorical(3, widths=[-1.0]), "widths"),
    (lambda: OrderedCategorical(3, widths=[1.0, 1.0]), "widths"),
    (lambda: OrderedCategorical(3, slope=0.0), "slope"),
    (lambda: OrderedCategorical(3, bias=np.nan), "bias"),
])
def test_invalid_parameters_raise_value_error(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


@pytest.mark.parametrize("factory", [
    lambda: Probit(slope="steep"),
    lambda: Logistic("gauss-hermite", n_nodes=3.5),
    lambda: OrderedCategorical(3.0),
    lambda: OrderedCategorical(True),
])
def test_wrong_parameter_types_raise_type_error(factory):
    with pytest.raises(TypeError):
        factory()


def test_params_repr_and_set_params():
    lik = OrderedCategorical(4, slope=2.0, widths=[1.0, 3.0])
    params = lik.get_params()
    assert params["n_categories"] == 4 and params["slope"] == 2.0
    np.testing.assert_array_equal(params["widths"], [1.0, 3.0])
    params["widths"][0] = 99.0  # a copy
    assert lik.widths[0] == 1.0
    assert "OrderedCategorical(n_categories=4" in repr(lik)
    np.testing.assert_allclose(lik.thresholds, [0.0, 1.0, 4.0])

    spec = lik.site_spec()
    assert lik.site_spec() is spec  # cached
    assert lik.set_params(bias=0.5) is lik
    assert lik.site_spec() is not spec  # invalidated
    np.testing.assert_allclose(lik.site_spec().params, [2.0, 0.5, 1.0, 3.0])
    with pytest.raises(ValueError, match="unknown parameter"):
        lik.set_params(noise=1.0)
    with pytest.raises(ValueError, match="widths"):
        lik.set_params(n_categories=5)  # widths no longer fit
    assert lik.n_categories == 4  # failed update leaves the object unchanged
    assert repr(Probit()) == "Probit(slope=1.0, bias=0.0)"
    assert Probit(2.0) == Probit(2.0) and Probit(2.0) != Probit(3.0)


@pytest.mark.parametrize("lik", ALL, ids=repr)
def test_copy_and_pickle_round_trip(lik):
    lik.site_spec()
    for other in (copy.deepcopy(lik), pickle.loads(pickle.dumps(lik))):
        assert other == lik
        y = lik.encode_targets(example_targets(lik, 5))
        mu, s2 = np.linspace(-1, 1, 5), np.full(5, 0.7)
        for a, b in zip(other.moments(y, mu, s2), lik.moments(y, mu, s2)):
            np.testing.assert_array_equal(a, b)


def test_site_specs_carry_the_right_codes():
    codes = S.LIKELIHOOD_CODES
    assert Probit().site_spec().code == codes["probit"]
    assert Step(0.1).site_spec().code == codes["step"]
    assert Logistic().site_spec().code == codes["logistic_mackay"]
    gh = Logistic("gauss-hermite", n_nodes=10).site_spec()
    assert gh.code == codes["logistic_gh"] and gh.gh_nodes.shape == (10,)
    np.testing.assert_allclose(np.exp(gh.gh_log_weights).sum(), 1.0, rtol=1e-14)
    assert Gaussian(2.0).site_spec().code == codes["gaussian"]
    assert OrderedCategorical(5).site_spec().params.shape == (5,)


@pytest.mark.parametrize("lik", ALL, ids=repr)
def test_classification_flag(lik):
    assert lik.is_classification is (not isinstance(lik, Gaussian))


# ---------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("lik", [Probit(), Step(), Logistic()], ids=repr)
def test_binary_targets(lik):
    out = lik.encode_targets([1, -1, 1])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match=r"y\[1\] = 0.0"):
        lik.encode_targets([1, 0, 1])
    with pytest.raises(ValueError, match="-1 or \\+1"):
        lik.encode_targets([1.0, np.nan])
    with pytest.raises(ValueError, match="1-D"):
        lik.encode_targets([[1, -1]])
    with pytest.raises(TypeError):
        lik.encode_targets(["a", "b"])


def test_ordinal_and_gaussian_targets():
    lik = OrderedCategorical(3)
    np.testing.assert_array_equal(lik.encode_targets([0, 2, 1]), [0.0, 2.0, 1.0])
    for bad in ([0, 3], [-1], [0.5]):
        with pytest.raises(ValueError, match="0..2"):
            lik.encode_targets(bad)
    gauss = Gaussian()
    np.testing.assert_array_equal(gauss.encode_targets([0.5, -2]), [0.5, -2.0])
    with pytest.raises(ValueError, match="finite"):
        gauss.encode_targets([0.0, np.inf])


# ---------------------------------------------------------------------------
# moments agree with the reference twins
# ---------------------------------------------------------------------------

def reference_moments(lik, y, mu, s2):
    p = lik.get_params()
    if isinstance(lik, Probit):
        return R.probit_moments(y, mu, s2, p["slope"], p["bias"])
    if isinstance(lik, Step):
        return R.step_moments(y, mu, s2, p["flip_noise"])
    if isinstance(lik, Logistic):
        if p["method"] == "mackay":
            return R.logistic_mackay_moments(y, mu, s2)
        return R.logistic_gh_moments(y, mu, s2, p["n_nodes"])
    if isinstance(lik, Gaussian):
        return R.gaussian_moments(y, mu, s2, p["noise_variance"])
    return R.ordinal_moments(y, mu, s2, p["slope"], p["bias"], p["widths"])


@pytest.mark.parametrize("lik", ALL, ids=repr)
def test_moments_match_reference(lik):
    n = 200
    rng = np.random.default_rng(3)
    y = lik.encode_targets(example_targets(lik, n))
    mu = rng.uniform(-2, 2, n)
    s2 = rng.uniform(0.05, 3, n)
    got = lik.moments(y, mu, s2)
    want = reference_moments(lik, y, mu, s2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL)


def test_moments_errors_name_the_site():
    with pytest.raises(ValueError, match="site 1 failed"):
        Step().moments([1.0, 1.0], [0.0, 0.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="same length"):
        Probit().moments([1.0], [0.0, 1.0], [1.0, 1.0])


# ---------------------------------------------------------------------------
# predictive
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("lik", [Probit(), Probit(slope=2.0, bias=0.5), Logistic(),
                                 Logistic("gauss-hermite", n_nodes=64), Step(0.1)], ids=repr)
def test_binary_predictive_is_expected_likelihood(lik):
    mean = np.array([-1.5, 0.0, 0.7, 3.0])
    var = np.array([0.5, 2.0, 0.1, 1.0])
    p = lik.get_params()
    if isinstance(lik, Probit):
        exact = ndtr((mean + p["bias"]) / np.sqrt(p["slope"] ** -2 + var))
        np.testing.assert_allclose(lik.predictive(mean, var), exact, rtol=1e-14)
    elif isinstance(lik, Step):
        eps = p["flip_noise"]
        exact = eps + (1 - 2 * eps) * ndtr(mean / np.sqrt(var))
        np.testing.assert_allclose(lik.predictive(mean, var), exact, rtol=1e-14)
    else:
        _check_logistic_predictive(lik, mean, var)


def _check_logistic_predictive(lik, mean, var):
    # Logistic: compare with the true E[sigma(f)] by quadrature (MacKay is approximate).
    exact = np.array([
        integrate.quad(lambda f: expit(f) * math.exp(-0.5 * (f - m) ** 2 / v)
                       / math.sqrt(2 * math.pi * v), m - 14 * math.sqrt(v), m + 14 * math.sqrt(v),
                       epsabs=0, epsrel=1e-12)[0]
        for m, v in zip(mean, var)])
    tol = 0.02 if lik.get_params()["method"] == "mackay" else 1e-9
    np.testing.assert_allclose(lik.predictive(mean, var), exact, atol=tol)


def test_binary_predictive_zero_variance():
    np.testing.assert_allclose(Probit().predictive([0.3], [0.0]), ndtr(0.3), rtol=1e-15)
    np.testing.assert_array_equal(Probit(slope=np.inf, bias=0.1).predictive([-0.2, 0.0], [0.0, 0.0]),
                                  [0.0, 1.0])
    np.testing.assert_allclose(Step(0.1).predictive([-1.0, 2.0, 1.0], [0.0, 0.0, 1.0]),
                               [0.1, 0.9, 0.1 + 0.8 * ndtr(1.0)], rtol=1e-15)


def test_ordinal_predictive_probabilities():
    lik = OrderedCategorical(4, slope=2.0, bias=-0.5, widths=[1.0, 0.5])
    mean = np.array([-3.0, 0.0, 0.4, 5.0])
    var = np.array([1.0, 0.0, 2.0, 0.3])
    probs = lik.predictive(mean, var)
    assert probs.shape == (4, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-14)
    theta = np.r_[-np.inf, lik.thresholds, np.inf]
    c = 1 / np.sqrt(lik.slope**-2 + var)
    exact = ndtr(c[:, None] * (theta[None, 1:] - mean[:, None])) - ndtr(
        c[:, None] * (theta[None, :-1] - mean[:, None]))
    np.testing.assert_allclose(probs, exact, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="latent variance"):
        OrderedCategorical(3, slope=np.inf).predictive([0.0], [0.0])


def test_gaussian_predictive():
    mean, var = Gaussian(0.25).predictive([1.0, -2.0], [0.5, 0.0])
    np.testing.assert_array_equal(mean, [1.0, -2.0])
    np.testing.assert_allclose(var, [0.75, 0.25])


@pytest.mark.parametrize("lik", ALL, ids=repr)
def test_predictive_validates_latent(lik):
    with pytest.raises(ValueError, match="same length"):
        lik.predictive([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="var"):
        lik.predictive([0.0], [-1.0])
    with pytest.raises(ValueError, match="mean"):
        lik.predictive([np.nan], [1.0])
