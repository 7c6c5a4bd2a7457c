"""fastep.kernels against independent references.

* values of every kernel (symmetric and cross) against the plain formulas in
  ``fastep.reference.kernels`` on random and adversarial inputs (duplicate
  points, data far from the origin, large distances, tiny/huge parameters),
  and against mpmath where the naive MLP formula is ill-conditioned;
* exact symmetry, positive semi-definiteness, ``diag`` equal to the diagonal;
* gradients w.r.t. the unconstrained parameters against central finite
  differences (every kernel, sums, products, tied and fixed parameters), and
  the three gradient paths (``eval_gradient``, ``gradient``, ``gradient_iter``)
  against each other;
* transforms: round trips, derivatives, extremes against mpmath;
* parameter plumbing (theta, bounds, get/set_params) and bad-input errors.

Tolerances: EPS = 2.2e-16. Values vs reference: ``RTOL = 1e3 * EPS`` relative
to the largest entry (|x|² + |y|² - 2xᵀy loses ~|x|² eps absolutely, and the
reference's arcsin/einsum round differently). Finite differences use step
``H = 1e-5`` in t (truncation ~H² ≈ 1e-10, rounding ~EPS/H ≈ 2e-11) and accept
``FD_TOL = 1e-7`` relative to the largest derivative.
"""
import copy
import pickle

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastep import kernels as K
from fastep.reference import kernels as R

EPS = np.finfo(np.float64).eps
RTOL = 1e3 * EPS
H = 1e-5
FD_TOL = 1e-7


# ------------------------------------------------------------------------------------------------
# Kernel zoo with reference twins
# ------------------------------------------------------------------------------------------------
def zoo(d=3):
    """(id, kernel, reference(X, Y)) for every kernel type, d input columns."""
    rng = np.random.default_rng(1234)
    s = rng.uniform(0.2, 0.9, size=d)
    groups = np.arange(d) % 2                      # tied: columns 0, 2, ... share scale 0
    s2 = np.array([0.35, 0.8])
    cases = [
        ("linear", K.Linear(0.7), lambda X, Y: R.linear(X, Y, 0.7)),
        ("rbf", K.RBF(1.3, 0.4), lambda X, Y: R.rbf(X, Y, 1.3, 0.4)),
        ("mlp", K.MLP(1.2, 2.0, 0.5), lambda X, Y: R.mlp(X, Y, 1.2, 2.0, 0.5)),
        ("white", K.White(0.3), lambda X, Y: R.white(X, Y, 0.3)),
        ("bias", K.Bias(0.2), lambda X, Y: R.bias(X, Y, 0.2)),
        ("linear_ard", K.LinearARD(s, 2.0), lambda X, Y: R.linear(X, Y, 2.0, s)),
        ("rbf_ard", K.RBFARD(s, 1.1, 0.7), lambda X, Y: R.rbf(X, Y, 1.1, 0.7, s)),
        ("mlp_ard", K.MLPARD(s, 1.1, 3.0, 0.7), lambda X, Y: R.mlp(X, Y, 1.1, 3.0, 0.7, s)),
        ("linear_ard_tied", K.LinearARD(s2, 1.5, ard_groups=groups),
         lambda X, Y: R.linear(X, Y, 1.5, R.column_scales(s2, groups))),
        ("rbf_ard_tied", K.RBFARD(s2, 0.9, 1.7, ard_groups=groups),
         lambda X, Y: R.rbf(X, Y, 0.9, 1.7, R.column_scales(s2, groups))),
        ("mlp_ard_tied", K.MLPARD(s2, 0.8, 5.0, 2.0, ard_groups=groups),
         lambda X, Y: R.mlp(X, Y, 0.8, 5.0, 2.0, R.column_scales(s2, groups))),
        ("rbf_log", K.RBF(2.0, 0.3, transforms={"variance": "log", "inverse_width": "log"}),
         lambda X, Y: R.rbf(X, Y, 2.0, 0.3)),
        ("rbf_ard_softplus_scales", K.RBFARD(3 * s, 1.0, 0.5, transforms={"scales": "softplus"}),
         lambda X, Y: R.rbf(X, Y, 1.0, 0.5, 3 * s)),
        ("mlp_fixed_bias", K.MLP(1.0, 4.0, 3.0, transforms={"bias_variance": "fixed"}),
         lambda X, Y: R.mlp(X, Y, 1.0, 4.0, 3.0)),
    ]
    sum_kernel = K.RBF(1.3, 0.4) + K.Linear(0.5) + K.White(0.1)
    cases.append(("sum", sum_kernel,
                  lambda X, Y: R.rbf(X, Y, 1.3, 0.4) + R.linear(X, Y, 0.5) + R.white(X, Y, 0.1)))
    prod_kernel = K.MLP(1.2, 2.0, 0.5) * K.RBFARD(s, 1.1, 0.7) * K.Bias(0.6)
    cases.append(("product", prod_kernel,
                  lambda X, Y: R.mlp(X, Y, 1.2, 2.0, 0.5) * R.rbf(X, Y, 1.1, 0.7, s) * R.bias(X, Y, 0.6)))
    nested = K.Sum([K.Product([K.Linear(0.4), K.RBF(0.9, 2.0)]), K.MLPARD(s, 1.0, 2.0, 1.0), K.Bias(0.3)])
    cases.append(("nested", nested,
                  lambda X, Y: R.linear(X, Y, 0.4) * R.rbf(X, Y, 0.9, 2.0) + R.mlp(X, Y, 1.0, 2.0, 1.0, s)
                  + R.bias(X, Y, 0.3)))
    return cases


ZOO = zoo()
IDS = [c[0] for c in ZOO]


@pytest.fixture(params=ZOO, ids=IDS)
def case(request):
    name, kernel, ref = request.param
    return name, copy.deepcopy(kernel), ref


def data(n=9, m=5, d=3, seed=0, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    return offset + scale * rng.normal(size=(n, d)), offset + scale * rng.normal(size=(m, d))


def assert_close(actual, expected, rtol=RTOL, what=""):
    scale = max(np.max(np.abs(expected)), np.finfo(float).tiny)
    err = np.max(np.abs(actual - expected)) / scale
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:.3g}"


def finite_difference(kernel, X, h=H):
    theta = kernel.theta
    out = np.empty((X.shape[0], X.shape[0], theta.size))
    for i in range(theta.size):
        tp, tm = theta.copy(), theta.copy()
        tp[i] += h
        tm[i] -= h
        out[:, :, i] = (kernel.clone_with_theta(tp)(X) - kernel.clone_with_theta(tm)(X)) / (2 * h)
    return out


def assert_psd(Kx, what=""):
    eig = np.linalg.eigvalsh(Kx)
    tol = 1e-12 * Kx.shape[0] * max(np.max(np.abs(eig)), np.finfo(float).tiny)
    assert eig.min() >= -tol, f"{what}: min eigenvalue {eig.min():.3g} < -{tol:.3g}"


# ------------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_match_reference(case, seed):
    name, kernel, ref = case
    X, Y = data(seed=seed)
    assert_close(kernel(X), ref(X, None), what=f"{name} K(X, X)")
    assert_close(kernel(X, Y), ref(X, Y), what=f"{name} K(X, Y)")
    assert kernel(X, Y).shape == (9, 5)


def test_symmetric_psd_and_diag(case):
    name, kernel, _ = case
    X, Y = data(n=30)
    Kx = kernel(X)
    assert Kx.shape == (30, 30) and Kx.dtype == np.float64
    np.testing.assert_array_equal(Kx, Kx.T, err_msg=name)
    assert_psd(Kx, name)
    np.testing.assert_allclose(kernel.diag(X), np.diag(Kx), rtol=1e-14, atol=0, err_msg=name)
    np.testing.assert_allclose(kernel.diag(Y), np.diag(kernel(Y)), rtol=1e-14, atol=0, err_msg=name)


def test_cross_covariance_consistent_with_joint_matrix(case):
    """K(X*, X) equals the corresponding block of K([X*; X]) (White excepted by design)."""
    name, kernel, _ = case
    X, Y = data()
    joint = kernel(np.vstack([Y, X]))
    cross = kernel(Y, X)
    joint_block = joint[:5, 5:]      # White is zero off the diagonal in both
    assert_close(cross, joint_block, what=name)


def test_white_and_bias_conventions():
    X, Y = data()
    w = K.White(0.25)
    np.testing.assert_array_equal(w(X), 0.25 * np.eye(9))
    np.testing.assert_array_equal(w(X, X), np.zeros((9, 9)))       # cross-covariance is zero
    np.testing.assert_array_equal(w(Y, X), np.zeros((5, 9)))
    np.testing.assert_array_equal(w.diag(Y), np.full(5, 0.25))
    b = K.Bias(0.5)
    np.testing.assert_array_equal(b(Y, X), np.full((5, 9), 0.5))
    np.testing.assert_array_equal(b.diag(X), np.full(9, 0.5))


def test_rbf_lengthscale_and_ivm_form():
    X, _ = data()
    k = K.RBF(2.0, 0.25)
    assert k.lengthscale == pytest.approx(2.0)
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    assert_close(k(X), 2.0 * np.exp(-D / (2 * 2.0 ** 2)))


def test_mlp_bounded_and_ivm_scaling():
    """|k| <= v for the MLP kernel; (2/π)·v·asin on the diagonal reproduces the IVM formula."""
    X, Y = data(scale=3.0)
    k = K.MLP(1.7, 10.0, 10.0)                   # IVM initialisation w = b = 10
    assert np.all(np.abs(k(X, Y)) <= 1.7)
    s = 10.0 * (X ** 2).sum(1) + 10.0
    np.testing.assert_allclose(k.diag(X), 1.7 * 2 / np.pi * np.arcsin(s / (s + 1)), rtol=1e-14)


# ---- adversarial inputs ------------------------------------------------------------------------
def test_duplicate_points(case):
    name, kernel, ref = case
    X, _ = data(n=6)
    Xd = np.vstack([X, X[:3], X[:1]])          # exact duplicates
    Kx = kernel(Xd)
    assert_close(Kx, ref(Xd, None), what=name)
    np.testing.assert_array_equal(Kx, Kx.T)
    if name not in ("white", "sum", "nested") and "white" not in name:
        np.testing.assert_array_equal(Kx[6], Kx[0])   # duplicate rows are identical
    assert_psd(Kx, name)


@pytest.mark.parametrize("kernel_ref", [
    (K.RBF(1.0, 1.0), lambda X, Y: R.rbf(X, Y, 1.0, 1.0)),
    (K.RBFARD([0.3, 0.9, 0.5], 2.0, 3.0), lambda X, Y: R.rbf(X, Y, 2.0, 3.0, [0.3, 0.9, 0.5])),
], ids=["rbf", "rbf_ard"])
def test_rbf_far_from_origin(kernel_ref):
    """Data at 1e8 with unit spread: centring keeps the distances exact (no |x|²-cancellation)."""
    kernel, ref = kernel_ref
    X, Y = data(offset=1e8)
    for Kv, Kr in ((kernel(X), ref(X, None)), (kernel(X, Y), ref(X, Y))):
        np.testing.assert_allclose(Kv, Kr, rtol=1e-12, atol=1e-300)
    assert_psd(kernel(X))


def test_rbf_large_distances_underflow_cleanly():
    X, Y = data(scale=1e3)
    k = K.RBF(1.0, 1.0)
    Kx = k(X)
    np.testing.assert_array_equal(Kx, np.eye(9))      # off-diagonal underflows to exact 0
    assert np.all(k(X, Y) == 0)
    _, dK = k(X, eval_gradient=True)
    assert np.all(np.isfinite(dK))


@pytest.mark.parametrize("kernel_ref", [
    (K.RBF(1e-200, 1e-12, transforms={"variance": "log"}), lambda X, Y: R.rbf(X, Y, 1e-200, 1e-12)),
    (K.RBF(1e200, 1e6, transforms={"variance": "log"}), lambda X, Y: R.rbf(X, Y, 1e200, 1e6)),
    (K.Linear(1e-250), lambda X, Y: R.linear(X, Y, 1e-250)),
    (K.Bias(1e250), lambda X, Y: R.bias(X, Y, 1e250)),
    (K.MLP(1e-100, 1e-8, 1e-8), lambda X, Y: R.mlp(X, Y, 1e-100, 1e-8, 1e-8)),
    (K.RBFARD([1e-12, 1 - 1e-12, 0.5], 1.0, 1.0), lambda X, Y: R.rbf(X, Y, 1.0, 1.0, [1e-12, 1 - 1e-12, .5])),
], ids=["rbf_tiny", "rbf_huge", "linear_tiny", "bias_huge", "mlp_tiny", "rbf_ard_extreme_scales"])
def test_extreme_parameters(kernel_ref):
    kernel, ref = kernel_ref
    X, Y = data()
    assert_close(kernel(X), ref(X, None), rtol=1e4 * EPS)
    assert_close(kernel(X, Y), ref(X, Y), rtol=1e4 * EPS)
    K0, dK = kernel(X, eval_gradient=True)
    assert np.all(np.isfinite(K0)) and np.all(np.isfinite(dK))


def _mlp_mp(x, y, v, w, b, dps=60):
    with mpmath.workdps(dps):
        x = [mpmath.mpf(float(t)) for t in x]
        y = [mpmath.mpf(float(t)) for t in y]
        dot = lambda p, q: mpmath.fsum(pi * qi for pi, qi in zip(p, q))  # noqa: E731
        a = w * dot(x, y) + b
        z = a / mpmath.sqrt((w * dot(x, x) + b + 1) * (w * dot(y, y) + b + 1))
        return float(mpmath.mpf(v) * 2 / mpmath.pi * mpmath.asin(z))


@pytest.mark.parametrize("w,b", [(1e8, 1.0), (1.0, 1e12), (1e6, 1e6), (1e-10, 1e-10), (10.0, 10.0)])
def test_mlp_against_mpmath_near_saturation(w, b):
    """asin near ±1 is ill-conditioned; the atan2 form with N ≥ 1 stays accurate (diagonal: exact form)."""
    X, _ = data(n=4, scale=10.0)
    # parallel, nearly parallel, nearly equal and opposite rows: asin's argument near ±1
    Y = np.vstack([2 * X[0], X[1] * (1 + 1e-7), X[2] + 1e-6, -X[3]])
    k = K.MLP(1.0, w, b)
    Kx, Kxy, dg = k(X), k(X, Y), k.diag(X)
    for i in range(4):
        assert dg[i] == pytest.approx(_mlp_mp(X[i], X[i], 1.0, w, b), rel=64 * EPS)
        assert Kx[i, i] == pytest.approx(_mlp_mp(X[i], X[i], 1.0, w, b), rel=64 * EPS)
        for j in range(4):
            # off-diagonal: rounding in |x|²|y|² - (xᵀy)² limits accuracy for near-parallel rows
            # (observed ~1e-11 at w = 1e8, like the naive formula; exact on the diagonal)
            assert Kxy[i, j] == pytest.approx(_mlp_mp(X[i], Y[j], 1.0, w, b), rel=1e-9, abs=1e-12)
    _, dK = k(X, eval_gradient=True)
    assert np.all(np.isfinite(dK))


# ------------------------------------------------------------------------------------------------
# Gradients
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_matches_finite_differences(case, seed):
    name, kernel, _ = case
    X, _ = data(n=8, seed=seed)
    Kx, dK = kernel(X, eval_gradient=True)
    assert dK.shape == (8, 8, kernel.n_theta)
    np.testing.assert_array_equal(Kx, kernel(X))
    fd = finite_difference(kernel, X)
    scale = max(1.0, np.max(np.abs(dK)))
    err = np.max(np.abs(dK - fd), axis=(0, 1)) / scale
    assert np.all(err <= FD_TOL), f"{name}: worst parameter {kernel.hyperparameter_names[int(np.argmax(err))]} " \
                                   f"error {err.max():.3g}"
    for i in range(kernel.n_theta):
        np.testing.assert_array_equal(dK[:, :, i], dK[:, :, i].T)


def test_gradient_paths_agree(case):
    name, kernel, _ = case
    X, _ = data(n=7)
    _, dK = kernel(X, eval_gradient=True)
    iterated = list(kernel.gradient_iter(X))
    assert len(iterated) == kernel.n_theta
    for i in range(kernel.n_theta):
        np.testing.assert_allclose(kernel.gradient(X, i), dK[:, :, i], rtol=1e-13, atol=1e-15 * np.abs(dK).max())
        np.testing.assert_allclose(iterated[i], dK[:, :, i], rtol=1e-13, atol=1e-15 * np.abs(dK).max())


@pytest.mark.parametrize("kernel", [
    K.RBF(3.0, 50.0), K.MLP(2.0, 1e3, 1e2), K.MLP(1.0, 1e-3, 1e-3), K.MLPARD([0.99, 0.01, 0.5], 1.0, 10.0, 10.0),
    K.RBFARD([0.999, 0.001, 0.5], 1.0, 0.1), K.Linear(1e3, transforms={"variance": "log"}),
], ids=["rbf_narrow", "mlp_large", "mlp_small", "mlp_ard_ivm", "rbf_ard_uneven", "linear_log"])
def test_gradient_other_regimes(kernel):
    X, _ = data(n=8, seed=5)
    _, dK = kernel(X, eval_gradient=True)
    fd = finite_difference(kernel, X)
    scale = max(1.0, np.max(np.abs(dK)))
    assert np.max(np.abs(dK - fd)) / scale <= 1e-6


@pytest.mark.parametrize("cls,extra", [
    (K.LinearARD, {"variance": 1.3}),
    (K.RBFARD, {"variance": 1.3, "inverse_width": 0.6}),
    (K.MLPARD, {"variance": 1.3, "weight_variance": 2.0, "bias_variance": 0.4}),
])
def test_tied_scales_chain_rule(cls, extra):
    """A scale shared by a block of columns: same K as the untied kernel with repeated values, and the
    derivative w.r.t. the shared (unconstrained) scale is the sum over its columns' derivatives."""
    groups = np.array([0, 1, 0, 2, 1])
    scales = np.array([0.3, 0.7, 0.45])
    tied = cls(scales, ard_groups=groups, **extra)
    untied = cls(scales[groups], **extra)
    X, Y = data(n=8, d=5)
    assert_close(tied(X), untied(X))
    assert_close(tied(X, Y), untied(X, Y))
    np.testing.assert_allclose(tied.diag(X), untied.diag(X), rtol=1e-14)
    _, dt = tied(X, eval_gradient=True)
    _, du = untied(X, eval_gradient=True)
    n_scalar = len(extra)
    np.testing.assert_allclose(dt[:, :, :n_scalar], du[:, :, :n_scalar], rtol=1e-12, atol=1e-14)
    for g in range(3):
        cols = np.flatnonzero(groups == g)
        np.testing.assert_allclose(dt[:, :, n_scalar + g], du[:, :, n_scalar + cols].sum(-1),
                                   rtol=1e-11, atol=1e-14)


def test_fixed_parameters_leave_theta():
    k = K.RBFARD([0.5, 0.5], 1.0, 2.0, transforms={"inverse_width": "fixed", "variance": "log"})
    assert k.hyperparameter_names == ["variance", "scales[0]", "scales[1]"]
    np.testing.assert_allclose(k.theta, [0.0, 0.0, 0.0], atol=1e-15)
    X, _ = data(d=2)
    _, dK = k(X, eval_gradient=True)
    assert dK.shape[2] == 3
    allfixed = K.Bias(2.0, transforms={"variance": "fixed"})
    assert allfixed.n_theta == 0 and allfixed.theta.shape == (0,)
    K0, dK0 = allfixed(X, eval_gradient=True)
    assert dK0.shape == (9, 9, 0)
    assert list(allfixed.gradient_iter(X)) == []


# ------------------------------------------------------------------------------------------------
# Transforms
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,fwd,dfwd,inv", [
    ("softplus", R.softplus, R.softplus_derivative, R.inverse_softplus),
    ("log", R.log_transform, R.log_transform_derivative, R.inverse_log_transform),
    ("sigmoid", R.sigmoid, R.sigmoid_derivative, R.logit),
])
def test_transforms_match_reference_moderate_range(name, fwd, dfwd, inv):
    tr = K.TRANSFORMS[name]
    t = np.linspace(-30, 30, 241)
    np.testing.assert_allclose(tr.forward(t), fwd(t), rtol=1e-13)
    np.testing.assert_allclose(tr.derivative(t), dfwd(t), rtol=1e-13)
    x = tr.forward(t[(t > -25) & (t < 25)])
    np.testing.assert_allclose(tr.inverse(x), inv(x), rtol=1e-12, atol=1e-12)
    # derivative vs central differences
    h = 1e-6
    np.testing.assert_allclose(tr.derivative(t), (tr.forward(t + h) - tr.forward(t - h)) / (2 * h),
                               rtol=1e-6, atol=1e-9 * np.max(np.abs(tr.forward(t))))


def test_transform_round_trips_full_range():
    sp, lg, sg = K.TRANSFORMS["softplus"], K.TRANSFORMS["log"], K.TRANSFORMS["sigmoid"]
    x = np.logspace(-300, 300, 601)
    np.testing.assert_allclose(sp.forward(sp.inverse(x)), x, rtol=1e-12)   # exp(t) amplifies |t|·eps
    np.testing.assert_allclose(lg.forward(lg.inverse(x)), x, rtol=1e-12)
    assert np.all(np.isfinite(sp.inverse(x)))
    np.testing.assert_array_equal(sp.inverse(np.array([1e300])), [1e300])   # no overflow
    p = np.concatenate([np.logspace(-300, -1, 300), 1 - np.logspace(-1, -15, 50)])
    np.testing.assert_allclose(sg.forward(sg.inverse(p)), p, rtol=1e-12)
    t = np.linspace(-700, 700, 1401)
    np.testing.assert_allclose(sp.inverse(sp.forward(t[t > -700])), t[t > -700], rtol=1e-12, atol=1e-12)
    # x = σ(t) near 1 keeps only |log(1 - x)| ≈ t digits of 1 - x: t is recoverable to ~eps·e^t
    tm = t[np.abs(t) <= 10]
    np.testing.assert_allclose(sg.inverse(sg.forward(tm)), tm, rtol=0, atol=1e-11)
    tn = t[(t < 0) & (t > -700)]
    np.testing.assert_allclose(sg.inverse(sg.forward(tn)), tn, rtol=1e-13)


@pytest.mark.parametrize("t", [-740.0, -700.0, -40.0, -1e-3, 0.0, 2.5, 40.0, 700.0, 1e6])
def test_transforms_extremes_against_mpmath(t):
    with mpmath.workdps(50):
        T = mpmath.mpf(t)
        sp = mpmath.log1p(mpmath.exp(T))
        sig = 1 / (1 + mpmath.exp(-T))
        dsig = mpmath.exp(-T) / (1 + mpmath.exp(-T)) ** 2
        assert K.TRANSFORMS["softplus"].forward(t) == pytest.approx(float(sp), rel=4 * EPS)
        assert K.TRANSFORMS["softplus"].derivative(t) == pytest.approx(float(sig), rel=4 * EPS)
        assert K.TRANSFORMS["sigmoid"].forward(t) == pytest.approx(float(sig), rel=4 * EPS)
        assert K.TRANSFORMS["sigmoid"].derivative(t) == pytest.approx(float(dsig), rel=8 * EPS, abs=1e-320)
        if abs(t) < 700:
            assert K.TRANSFORMS["log"].forward(t) == pytest.approx(float(mpmath.exp(T)), rel=1e3 * EPS)
        if t > -700:
            assert K.TRANSFORMS["softplus"].inverse(float(sp)) == pytest.approx(t, rel=1e-12, abs=1e-12)


def test_bounds_keep_values_representable(case):
    _, kernel, _ = case
    b = kernel.bounds
    assert b.shape == (kernel.n_theta, 2)
    lo = np.where(np.isfinite(b[:, 0]), b[:, 0], -1e3)
    hi = np.where(np.isfinite(b[:, 1]), b[:, 1], 1e3)
    for theta in (lo, hi):
        k = kernel.clone_with_theta(theta)
        for key, value in k.get_params().items():
            if key != "ard_groups" and isinstance(value, (float, np.ndarray)):
                assert np.all(np.isfinite(value)) and np.all(np.asarray(value) > 0)


# ------------------------------------------------------------------------------------------------
# Parameters, composition
# ------------------------------------------------------------------------------------------------
def test_theta_round_trip_and_clone(case):
    name, kernel, _ = case
    rng = np.random.default_rng(7)
    theta = kernel.theta + rng.normal(scale=0.3, size=kernel.n_theta)
    kernel.theta = theta
    np.testing.assert_array_equal(kernel.theta, theta)
    clone = kernel.clone_with_theta(theta + 0.1)
    np.testing.assert_array_equal(kernel.theta, theta)      # original untouched
    np.testing.assert_allclose(clone.theta, theta + 0.1)
    assert len(kernel.hyperparameter_names) == kernel.n_theta
    assert len(set(kernel.hyperparameter_names)) == kernel.n_theta


def test_theta_is_a_copy_and_pickle_round_trip(case):
    name, kernel, _ = case
    theta = kernel.theta
    theta += 1.0
    assert not np.array_equal(kernel.theta, theta) or kernel.n_theta == 0
    X, _ = data()
    restored = pickle.loads(pickle.dumps(kernel))
    np.testing.assert_array_equal(restored(X), kernel(X))
    np.testing.assert_array_equal(restored.theta, kernel.theta)


@pytest.mark.parametrize("kernel_ref", [
    (K.RBF(1.3, 0.4), lambda X, Y: R.rbf(X, Y, 1.3, 0.4)),
    (K.RBFARD([0.6], 1.3, 0.4), lambda X, Y: R.rbf(X, Y, 1.3, 0.4, [0.6])),
    (K.MLPARD([0.6], 1.3, 2.0, 0.4), lambda X, Y: R.mlp(X, Y, 1.3, 2.0, 0.4, [0.6])),
    (K.LinearARD([0.6], 1.3), lambda X, Y: R.linear(X, Y, 1.3, [0.6])),
], ids=["rbf", "rbf_ard", "mlp_ard", "linear_ard"])
def test_single_column_inputs(kernel_ref):
    """One input column takes the exact-difference distance path."""
    kernel, ref = kernel_ref
    offset = 1e6 if isinstance(kernel, K.RBF) else 0.0    # translation invariant: exact at any offset
    X, Y = data(d=1, offset=offset)
    assert_close(kernel(X), ref(X, None))
    assert_close(kernel(X, Y), ref(X, Y))
    Xs, _ = data(n=8, d=1)
    _, dK = kernel(Xs, eval_gradient=True)
    fd = finite_difference(kernel, Xs)
    assert np.max(np.abs(dK - fd)) <= FD_TOL * max(1.0, np.abs(dK).max())


def test_constrained_values_follow_theta():
    k = K.RBFARD([0.2, 0.6], 1.5, 0.5)
    assert k.hyperparameter_names == ["variance", "inverse_width", "scales[0]", "scales[1]"]
    np.testing.assert_allclose(k.theta, [np.log(np.expm1(1.5)), np.log(np.expm1(0.5)),
                                         np.log(0.2 / 0.8), np.log(0.6 / 0.4)], rtol=1e-14)
    k.theta = [0.0, 1.0, 0.0, -2.0]
    p = k.get_params()
    assert p["variance"] == pytest.approx(np.log(2.0), rel=1e-15)
    assert p["inverse_width"] == pytest.approx(np.log1p(np.e), rel=1e-15)
    np.testing.assert_allclose(p["scales"], [0.5, 1 / (1 + np.e ** 2)], rtol=1e-15)


def test_get_set_params_round_trip(case):
    name, kernel, _ = case
    X, _ = data()
    params = kernel.get_params()
    if isinstance(kernel, K.Sum) or isinstance(kernel, K.Product):
        rebuilt = type(kernel)(params["kernels"])
    else:
        rebuilt = type(kernel)(**params)
    np.testing.assert_array_equal(rebuilt(X), kernel(X))
    np.testing.assert_allclose(rebuilt.theta, kernel.theta, rtol=1e-14)
    assert rebuilt.hyperparameter_names == kernel.hyperparameter_names


def test_set_params_leaf_and_composite():
    k = K.RBF(1.0, 1.0)
    assert k.set_params(variance=2.0) is k
    assert k.get_params()["variance"] == 2.0
    k.set_params(transforms={"variance": "log"})
    assert k.theta[0] == pytest.approx(np.log(2.0))
    assert k.get_params()["variance"] == 2.0
    s = K.RBF() + K.Linear()
    s.set_params(k1__variance=3.0, k0__inverse_width=0.5)
    assert s.kernels[1].get_params()["variance"] == 3.0
    assert s.get_params()["k0__inverse_width"] == 0.5
    a = K.RBFARD([0.5, 0.5, 0.5])
    a.set_params(scales=[0.2, 0.4], ard_groups=[0, 1, 1, 0])
    assert a.n_features == 4 and a.n_theta == 4
    with pytest.raises(ValueError, match="scale index 1"):
        a.set_params(ard_groups=[0, 0, 0, 0])
    assert a.ard_groups.tolist() == [0, 1, 1, 0]              # unchanged after the failed call


def test_operators_flatten_and_copy():
    a, b, c = K.RBF(), K.Linear(), K.White(0.1)
    s = (a + b) + c
    assert isinstance(s, K.Sum) and len(s.kernels) == 3
    p = a * (b * c)
    assert isinstance(p, K.Product) and len(p.kernels) == 3
    m = a + b * c
    assert isinstance(m, K.Sum) and isinstance(m.kernels[1], K.Product)
    a.set_params(variance=5.0)                                 # terms are copies
    assert s.kernels[0].get_params()["variance"] == 1.0
    kk = a + a                                                 # independent parameters
    kk.set_params(k0__variance=2.0)
    assert kk.kernels[1].get_params()["variance"] == 5.0
    assert kk.n_theta == 4
    assert m.hyperparameter_names == ["k0__variance", "k0__inverse_width", "k1__k0__variance",
                                      "k1__k1__variance"]
    with pytest.raises(TypeError):
        a + 1.0
    with pytest.raises(TypeError):
        2.0 * a


def test_composite_theta_update_is_atomic():
    s = K.RBF() + K.Linear(transforms={"variance": "log"})
    before = s.theta
    with pytest.raises(ValueError, match="representable"):
        s.theta = [0.0, 0.0, 800.0]                             # exp(800) overflows
    np.testing.assert_array_equal(s.theta, before)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(0, 2**31 - 1),
       st.floats(-3, 3), st.floats(-3, 3), st.floats(-3, 3))
def test_random_sums_products_psd(n, d, seed, t0, t1, t2):
    X = np.random.default_rng(seed).normal(size=(n, d))
    k = (K.RBF() * K.MLP()) + K.Linear() + K.RBFARD(np.full(d, 0.5))
    theta = k.theta
    theta[:3] += [t0, t1, t2]
    k.theta = theta
    Kx = k(X)
    np.testing.assert_array_equal(Kx, Kx.T)
    assert_psd(Kx)
    np.testing.assert_allclose(k.diag(X), np.diag(Kx), rtol=1e-14)


def test_diag_does_not_form_n_by_n():
    """10⁶ rows: an n×n array would need 8 TB; diag must be O(n)."""
    X = np.random.default_rng(0).normal(size=(10**6, 2))
    k = K.MLPARD([0.5, 0.9], 1.0, 2.0, 1.0) + K.RBF() * K.Linear() + K.White(0.1) + K.Bias()
    dg = k.diag(X)
    assert dg.shape == (10**6,) and np.all(np.isfinite(dg))


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,exc,match", [
    (lambda: K.RBF(variance=-1.0), ValueError, "variance"),
    (lambda: K.RBF(variance=0.0), ValueError, "variance"),
    (lambda: K.RBF(inverse_width=np.nan), ValueError, "inverse_width"),
    (lambda: K.RBF(inverse_width=np.inf), ValueError, "inverse_width"),
    (lambda: K.MLP(weight_variance="1"), TypeError, "weight_variance"),
    (lambda: K.Linear(variance=True), TypeError, "variance"),
    (lambda: K.Linear(variance=2.0, transforms={"variance": "sigmoid"}), ValueError, r"\(0, 1\)"),
    (lambda: K.Bias(variance=-2.0, transforms={"variance": "fixed"}), ValueError, "variance"),
    (lambda: K.RBF(transforms={"variance": "exp"}), ValueError, "transforms"),
    (lambda: K.RBF(transforms={"lengthscale": "log"}), ValueError, "lengthscale"),
    (lambda: K.RBF(transforms=["log"]), TypeError, "transforms"),
    (lambda: K.RBFARD([0.5, 1.0]), ValueError, "scales"),
    (lambda: K.RBFARD([0.5, 0.0]), ValueError, "scales"),
    (lambda: K.RBFARD([0.5, np.nan]), ValueError, "scales"),
    (lambda: K.RBFARD(0.5), ValueError, "scales"),
    (lambda: K.RBFARD(None), TypeError, "scales"),
    (lambda: K.RBFARD([]), ValueError, "scales"),
    (lambda: K.LinearARD([0.5, 0.5], ard_groups=[0.0, 1.0]), TypeError, "ard_groups"),
    (lambda: K.LinearARD([0.5, 0.5], ard_groups=[0, 2]), ValueError, "ard_groups"),
    (lambda: K.LinearARD([0.5, 0.5], ard_groups=[-1, 1]), ValueError, "ard_groups"),
    (lambda: K.LinearARD([0.5, 0.5], ard_groups=[[0, 1]]), ValueError, "ard_groups"),
    (lambda: K.LinearARD([0.5, 0.5], ard_groups=[True, False]), TypeError, "ard_groups"),
    (lambda: K.MLPARD([0.5, 0.5, 0.5], ard_groups=[0, 1, 1]), ValueError, "scale index 2"),
    (lambda: K.Sum([]), ValueError, "kernels"),
    (lambda: K.Sum(K.RBF()), TypeError, "kernels"),
    (lambda: K.Product([K.RBF(), "rbf"]), TypeError, r"kernels\[1\]"),
    (lambda: K.RBFARD([0.5, 0.5]) + K.LinearARD([0.5, 0.5, 0.5]), ValueError, "columns"),
], ids=lambda v: None)
def test_constructor_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_call_errors():
    X, Y = data()
    k = K.RBFARD([0.5, 0.5], ard_groups=[0, 1, 1])
    with pytest.raises(ValueError, match="X has 2 columns"):
        k(X[:, :2])
    with pytest.raises(ValueError, match="Y has 4 columns"):
        k(X, np.ones((3, 4)))
    with pytest.raises(ValueError, match="Y must have the same number of columns"):
        K.RBF()(X, np.ones((3, 2)))
    bad = X.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="X must be finite"):
        K.RBF()(bad)
    bad[2, 1] = np.inf
    with pytest.raises(ValueError, match="Y must be finite"):
        K.RBF()(X, bad)
    with pytest.raises(ValueError, match="X must be finite"):
        K.Linear().diag(bad)
    with pytest.raises(ValueError, match="2-D"):
        K.RBF()(np.ones(3))
    with pytest.raises(TypeError, match="X"):
        K.RBF()("abc")
    with pytest.raises(ValueError, match="eval_gradient"):
        K.RBF()(X, Y, eval_gradient=True)
    with pytest.raises(TypeError, match="eval_gradient"):
        K.RBF()(X, eval_gradient="yes")
    with pytest.raises(ValueError, match="index"):
        K.RBF().gradient(X, 2)
    with pytest.raises(ValueError, match="index"):
        K.RBF().gradient(X, -1)
    with pytest.raises(TypeError, match="index"):
        K.RBF().gradient(X, 1.0)
    with pytest.raises(ValueError, match="X has 2 columns"):
        next(k.gradient_iter(X[:, :2]))


def test_theta_and_set_params_errors():
    k = K.RBF()
    with pytest.raises(ValueError, match="theta must have length 2"):
        k.theta = [0.0]
    with pytest.raises(ValueError, match="theta must be finite"):
        k.theta = [0.0, np.nan]
    with pytest.raises(ValueError, match=r"theta entry 1 \(inverse_width\)"):
        k.theta = [0.0, -800.0]
    a = K.RBFARD([0.5, 0.5], transforms={"scales": "log"})
    with pytest.raises(ValueError, match=r"scales\[1\]"):
        a.theta = [0.0, 0.0, 0.0, 710.0]
    np.testing.assert_allclose(a.theta[2:], np.log([0.5, 0.5]))   # unchanged
    with pytest.raises(ValueError, match="invalid parameter 'lengthscale'"):
        k.set_params(lengthscale=1.0)
    with pytest.raises(ValueError, match="variance"):
        k.set_params(variance=-1.0)
    assert k.get_params()["variance"] == 1.0                      # unchanged
    with pytest.raises(ValueError, match="invalid parameter"):
        (K.RBF() + K.Linear()).set_params(k2__variance=1.0)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        K.RBFARD([2.0, 3.0], transforms={"scales": "softplus"}).set_params(transforms={})


@pytest.mark.parametrize("make", [
    lambda: K.RBF(1.3, 0.7),
    lambda: K.RBFARD([0.3, 0.8, 0.05], 2.0, 0.6),
    lambda: K.RBFARD([0.3, 0.8], 0.9, 1.7, ard_groups=[0, 1, 1]),
    lambda: K.RBFARD([0.3, 0.8, 0.5], 1.1, 0.4, transforms={"variance": "fixed"}),
    lambda: K.RBFARD([0.4, 0.6, 0.2], 1.5, 0.8) + K.Bias(0.3),
])
def test_weighted_gradient_is_the_contraction_of_the_gradient_matrices(make):
    """``_weighted_grads`` (the RBF family's one-pass form, and a sum's
    concatenation of its terms') equals Σ_ij W_ij ∂K_ij/∂θ_s from the gradient matrices, for K(X, Y) and K(X, X)."""
    rng = np.random.default_rng(5)
    kernel = make()
    X, Y = rng.normal(size=(17, 3)) + 4.0, rng.normal(size=(9, 3)) + 4.0      # off-centre inputs
    for Y_, W in ((Y, rng.normal(size=(17, 9))), (None, rng.normal(size=(17, 17)))):
        grads = kernel.gradient_iter(X) if Y_ is None else kernel.cross_gradient_iter(X, Y_)
        expected = np.array([np.sum(W * g) for g in grads])
        got = kernel._weighted_grads(X, Y_, W)
        assert got.shape == (kernel.n_theta,)
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max())
