"""The IVM engine's fused scoring pass (``IVMEP.score`` / ``select``) against the plain
per-site pass (``IVMEP.score_per_site``) and the compiled site kernel.

The fused pass computes g and ν without log Z (probit and Gaussian sites inline, other
likelihoods and out-of-range points through ``site_moments``) and ranks the entropy
criterion by p = ν ς, evaluating ΔH = -½ log(1 - p) only near the largest p; with probit
sites it computes g and ν only for the points whose bound on p reaches the best p found,
the others' when they are read. These tests pin down that nothing observable changes: g and
ν are bitwise the site kernel's (also for the deferred points, also read after the posterior
has moved on), and the choice -- exact ties and near-ties whose scores round to the same
value included -- is the one of the full pass (highest score, lowest index).
"""
import numpy as np
import pytest

from fastep._epcore import ivm as engine
from fastep._epcore.sites import _site_moments_per_site
from fastep.likelihoods import Gaussian, OrderedCategorical, Probit


def _lowrank_kernel(diag_extra, rank, seed):
    """K = F Fᵀ + diag(diag_extra): exact columns, any diagonal we like."""
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(diag_extra.size, rank)) / np.sqrt(rank)
    diag = np.einsum("ij,ij->i", F, F) + diag_extra

    def column(j):
        col = F @ F[j]
        col[j] += diag_extra[j]
        return col

    return diag, column


def _pair(y, spec, diag, d, **kw):
    return (engine.IVMEP(y, spec, diag, d, **kw), engine.IVMEP(y, spec, diag, d, **kw))


def _assert_same_pass(a, b, i, j):
    """a was scored by the fused pass (returned i), b by the per-site pass (returned j)."""
    assert i == j
    inactive = ~np.asarray(a.is_active)
    np.testing.assert_array_equal(np.asarray(a.g)[inactive], np.asarray(b.g)[inactive])
    np.testing.assert_array_equal(np.asarray(a.nu)[inactive], np.asarray(b.nu)[inactive])
    np.testing.assert_array_equal(np.asarray(a.score_values), np.asarray(b.score_values))


def _score_both(a, b, spec):
    """Score a (fused pass) and b (per-site pass) and check them against each other and a's
    g, ν of the inactive points against the site kernel at N(μ, ς + sigma2) (NaN where it
    fails). Returns the chosen point."""
    i = a.score()
    j = b.score_per_site()
    _assert_same_pass(a, b, i, j)
    status, _, alpha, beta = _site_moments_per_site(spec, a.y, np.asarray(a.post_mean),
                                                    np.asarray(a.post_var) + a.sigma2)
    ok = status == 0
    inactive = ~np.asarray(a.is_active)
    np.testing.assert_array_equal(np.asarray(a.g)[inactive], np.where(ok, alpha, np.nan)[inactive])
    np.testing.assert_array_equal(np.asarray(a.nu)[inactive], np.where(ok, beta, np.nan)[inactive])
    return i


@pytest.mark.parametrize("slope, bias, sigma2", [(1.0, 0.0, 0.0), (25.0, 0.4, 0.0), (np.inf, -0.7, 1e-4),
                                                 (185.3, -0.29, 0.0), (30.0, 1.5, 1e-6)])
def test_probit_moments_are_bitwise_the_site_kernel_on_every_branch(slope, bias, sigma2):
    # Prior variances from 1e-8 to 1e6 and a few just around |z| = 8 (the end of the inline
    # kernel's table range) give z on both sides of 0 and of ±8; inclusions through a
    # low-rank kernel then move every mean.
    n = 400
    rng = np.random.default_rng(11)
    extra = 10.0 ** rng.uniform(-8, 6, size=n)
    inv_s2 = 0.0 if np.isinf(slope) else 1.0 / slope**2
    if bias != 0.0:
        edge = (bias / 8.0) ** 2 - inv_s2 - sigma2       # cavity variance with |c bias| = 8
        if edge > 0:
            extra[:6] = edge * np.array([1 - 1e-15, 1.0, 1 + 1e-15, 1 - 1e-9, 1 + 1e-9, 1.0])
    y = np.where(rng.uniform(size=n) < 0.5, 1.0, -1.0)
    spec = Probit(slope=slope, bias=bias).site_spec()
    diag_lr, column = _lowrank_kernel(extra, 3, 12)
    seen = set()
    def diagonal_column(j):
        col = np.zeros(n)
        col[j] = extra[j]
        return col

    for diag in (extra, diag_lr):                       # k = 0: μ = 0, z = y c bias exactly
        col_fn = diagonal_column if diag is extra else column
        a, b = _pair(y, spec, diag, 25, sigma2=sigma2)
        for _ in range(25):
            z = y * (np.asarray(a.post_mean) + bias) / np.sqrt(np.asarray(a.post_var) + sigma2 + inv_s2)
            z = z[~np.asarray(a.is_active)]
            seen.update(name for name, hit in [("z<=-8", z <= -8), ("-8<z<=0", (z > -8) & (z <= 0)),
                                               ("0<z<8", (z > 0) & (z < 8)), ("z>=8", z >= 8)] if hit.any())
            i = _score_both(a, b, spec)
            col = col_fn(i)
            a.include_point(i, col)
            b.include_point(i, col)
        np.testing.assert_array_equal(a.active, b.active)
        np.testing.assert_array_equal(np.asarray(a.M), np.asarray(b.M))
    expected = {"-8<z<=0", "0<z<8"} if bias == 0.0 else {"z<=-8", "-8<z<=0", "0<z<8", "z>=8"}
    assert expected <= seen


@pytest.mark.parametrize("noise, sigma2", [(0.1, 0.0), (1e-4, 0.02), (50.0, 0.0)])
def test_gaussian_moments_are_bitwise_the_site_kernel(noise, sigma2):
    n = 300
    rng = np.random.default_rng(5)
    extra = 10.0 ** rng.uniform(-6, 3, size=n)
    y = rng.normal(scale=3.0, size=n)
    spec = Gaussian(noise_variance=noise).site_spec()
    diag, column = _lowrank_kernel(extra, 4, 6)
    a, b = _pair(y, spec, diag, 30, sigma2=sigma2)
    for _ in range(30):
        i = _score_both(a, b, spec)
        a.include_point(i, column(i))
        b.include_point(i, column(i))
    np.testing.assert_array_equal(np.asarray(a.post_mean), np.asarray(b.post_mean))


def _near_tie_variances(rng, centres, copies, spread, step=None):
    """Clusters of variances ``c + k step``, |k| <= spread (step: one ulp of c unless given)
    around randomly jittered centres c, shuffled."""
    out = []
    for c in centres:
        c = c * (1.0 + rng.uniform(-1e-3, 1e-3))
        h = np.spacing(c) if step is None else step
        out.append(c + h * rng.integers(-spread, spread + 1, size=copies))
    out = np.concatenate(out)
    rng.shuffle(out)
    return out


def _collapsed(a, chosen):
    """Whether the last pass (before including ``chosen``) had a point with a larger p than
    the chosen one but the same score (the full pass picks the lower index there; ranking
    by p alone would not)."""
    inactive = ~np.asarray(a.is_active)
    var = np.asarray(a.post_var)
    p = np.where(inactive, var * np.asarray(a.nu), -np.inf)
    scores = np.asarray(a.score_values)
    return bool(np.any(inactive & (p > p[chosen]) & (scores == scores[chosen])))


@pytest.mark.parametrize("case", ["gaussian p < 1/2", "gaussian p > 1/2", "gaussian subnormal scores",
                                  "probit z = 0"])
def test_entropy_ranking_by_p_chooses_like_the_full_scores_on_near_ties(case):
    # At the prior (μ = 0) p = ν ς depends on ς = diag K only, so clusters of adjacent
    # doubles in diag K make exact ties (lowest index wins) and near-ties whose p differ
    # while ΔH = -½ log(1 - p) rounds to the same value (the full pass then also takes the
    # lowest index, whereas the largest p may sit at a higher one).
    # Where p is just below a power of two, ΔH is just above it (ΔH > p/2 ... here -log(1 - p)
    # > p) and adjacent p round to the same ΔH: p ≈ 0.238 (Gaussian, noise 3.2, ς = 1),
    # p ≈ 0.249 (probit, slope 1.3, z = 0, ς = 0.38); subnormal p (noise 1e307) lose their last
    # bit in ½ log1p(-p). Above p = 1/2 the log expands differences and adjacent p never tie
    # (that case checks exact ties only).
    rng = np.random.default_rng(["gaussian p < 1/2", "gaussian p > 1/2", "gaussian subnormal scores",
                                 "probit z = 0"].index(case))
    step = None
    if case == "gaussian p < 1/2":
        spec, centres = Gaussian(noise_variance=3.2).site_spec(), [0.5, 0.8, 1.0]
    elif case == "gaussian p > 1/2":
        spec, centres = Gaussian(noise_variance=0.05).site_spec(), [0.3, 0.7, 1.1]
    elif case == "gaussian subnormal scores":
        # ν = 1e-307: p = ς ν ~ 1e-315 moves by one subnormal unit (5e-324) when ς moves by
        # 5e-17, and 1e-9 p is below one unit (only scoring every point separates them)
        spec, centres, step = Gaussian(noise_variance=1e307).site_spec(), [3e-9, 7e-9, 1.1e-8], 5e-17
    else:
        spec, centres = Probit(slope=1.3).site_spec(), [0.2, 0.3, 0.38]
    collapses = 0
    for trial in range(40):
        diag = _near_tie_variances(rng, centres, 40, 6, step)
        n = diag.size
        y = rng.normal(size=n) if spec.code == 4 else np.where(rng.uniform(size=n) < 0.5, 1.0, -1.0)
        a, b = _pair(y, spec, diag, 5)
        for _ in range(5):                         # diagonal kernel: ties persist after inclusions
            i = a.score()
            j = b.score_per_site()
            _assert_same_pass(a, b, i, j)
            collapses += _collapsed(a, i)
            col = np.zeros(n)
            col[i] = diag[i]
            a.include_point(i, col)
            b.include_point(j, col)
    if case == "gaussian subnormal scores":
        assert np.all(np.asarray(a.score_values)[~np.asarray(a.is_active)] < 1e-300)
    # the inputs do exercise the case where ranking by p alone would choose another point
    assert (collapses > 0) == (case != "gaussian p > 1/2")


@pytest.mark.parametrize("criterion", ["info_gain", "random"])
@pytest.mark.parametrize("lik", ["probit", "gaussian", "ordinal"])
def test_other_criteria_choose_like_the_per_site_pass(criterion, lik):
    n = 200
    rng = np.random.default_rng(3)
    extra = 10.0 ** rng.uniform(-3, 1, size=n)
    diag, column = _lowrank_kernel(extra, 4, 4)
    if lik == "probit":
        spec, y = Probit(slope=2.0, bias=0.3).site_spec(), np.where(rng.uniform(size=n) < 0.4, 1.0, -1.0)
    elif lik == "gaussian":
        spec, y = Gaussian(0.2).site_spec(), rng.normal(size=n)
    else:
        spec = OrderedCategorical(3, slope=2.0, bias=-0.2, widths=[0.7]).site_spec()
        y = rng.integers(0, 3, size=n).astype(float)
    a, b = _pair(y, spec, diag, engine.IVMOptions(20, criterion=criterion, seed=9))
    for _ in range(20):
        i = a.score()
        j = b.score_per_site()
        _assert_same_pass(a, b, i, j)
        a.include_point(i, column(i))
        b.include_point(j, column(j))


def test_select_records_the_scores_of_the_chosen_points():
    n = 150
    rng = np.random.default_rng(8)
    diag, column = _lowrank_kernel(10.0 ** rng.uniform(-2, 1, size=n), 3, 8)
    spec = Probit(slope=3.0, bias=0.1).site_spec()
    y = np.where(rng.uniform(size=n) < 0.5, 1.0, -1.0)
    a = engine.IVMEP(y, spec, diag, 16)
    chosen = a.select(15, column)
    b = engine.IVMEP(y, spec, diag, 16)
    expected = []
    for _ in range(15):
        j = b.score_per_site()
        expected.append(np.asarray(b.score_values)[j])
        b.include_point(j, column(j))
    np.testing.assert_array_equal(chosen, b.active)
    np.testing.assert_array_equal(np.asarray(a.chosen_score), expected)
    # an active point's score value is its score when it was included, as with the full pass
    np.testing.assert_array_equal(np.asarray(a.score_values)[chosen], expected)
    # include_point after score(): the point's score is kept, its chosen_score is NaN
    i = a.score()
    j = b.score_per_site()
    assert i == j
    a.include_point(i, column(i))
    assert np.asarray(a.score_values)[i] == np.asarray(b.score_values)[j]
    assert np.isnan(np.asarray(a.chosen_score)[-1])


def test_probit_bound_table_bounds_h_on_each_cell():
    # The entropy pass for probit sites skips points whose bound ς c² h(z_k) on ν ς falls
    # below the best p found; that is only exact if h(z) = r (r + z), r = N(z)/Φ(z), is at
    # most the table value on the whole cell [z_k, z_k + 1/4).
    from scipy.special import log_ndtr

    zk, bound = engine._probit_h_bound()
    assert np.all(np.isfinite(bound)) and np.all(np.diff(bound) < 0) and bound[0] >= 1.0
    np.testing.assert_array_equal(zk, -8.0 + 0.25 * np.arange(zk.size))
    for k, z0 in enumerate(zk):
        z = np.linspace(z0, z0 + 0.25, 2001)[:-1]
        r = np.exp(-0.5 * z**2 - 0.5 * np.log(2 * np.pi) - log_ndtr(z))
        h = r * (r + z)
        assert np.all(h <= bound[k] * (1 - 1e-13)), k
        # and it is not loose beyond the cell's own variation (the skipping works)
        assert bound[k] <= h[0] * (1 + 1e-9) or k == 0


@pytest.mark.parametrize("manual", [False, True])
def test_pruned_entropy_pass_fills_g_nu_and_scores_of_skipped_points_when_read(manual):
    # After the pass, the posterior moves (inclusion); g, ν and the scores read afterwards
    # are still those of the pass (as with the full pass), also for the points it skipped.
    n = 600
    rng = np.random.default_rng(21)
    diag, column = _lowrank_kernel(10.0 ** rng.uniform(-2, 1, size=n), 5, 22)
    spec = Probit(slope=40.0, bias=-0.3).site_spec()
    y = np.where(rng.uniform(size=n) < 0.3, 1.0, -1.0)
    a, b = _pair(y, spec, diag, 30, sigma2=1e-3)
    deferred = []
    for step in range(30):
        i = a.score()
        j = b.score_per_site()
        assert i == j
        deferred.append(a.n_deferred / (n - step))
        assert b.n_deferred == 0
        if manual:                                   # include some other point, maybe a skipped one
            inactive = np.flatnonzero(~np.asarray(a.is_active))
            i = j = int(inactive[(7 * step) % inactive.size])
        a.include_point(i, column(i))
        b.include_point(j, column(j))
        if step % 3 == 0:
            inactive = ~np.asarray(a.is_active)
            for name in ("g", "nu"):
                np.testing.assert_array_equal(np.asarray(getattr(a, name))[inactive],
                                              np.asarray(getattr(b, name))[inactive])
            np.testing.assert_array_equal(np.asarray(a.score_values), np.asarray(b.score_values))
    np.testing.assert_array_equal(a.active, b.active)
    np.testing.assert_array_equal(np.asarray(a.site_precision), np.asarray(b.site_precision))
    # most points were never given g, ν by the pass itself
    assert np.median(deferred) > 0.5
