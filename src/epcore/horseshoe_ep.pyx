# cython: language_level=3
"""Horseshoe-prior EP engine: parallel damped EP for one task (supplement §1).

Equation numbers refer to the supplement of Hernández-Lobato & Hernández-Lobato,
*Learning Feature Selection Dependencies in Multi-task Learning* (NIPS 2013).

Model (one task): ``y = X w + ε``, ``ε ~ N(0, σ² I)``, each coefficient with the factor
``g_j(w_j, u_j, v_j) = N(w_j | 0, u_j²/v_j²)``, ``u ~ N(0, ρ² C)``, ``v ~ N(0, γ² C)``,
``C = ΔDΔ + ΔPPᵀΔ`` with ``diag C = 1`` (:class:`HorseshoePrior`). EP approximates every
``g_j`` by a site (eq 1), stored in natural form: ``pi_w = 1/η̃``, ``h_w = m̃/η̃``,
``pi_u = 1/ν̃``, ``pi_v = 1/ξ̃``.

:class:`HorseshoeEP` holds one task's data, its hyperparameters, options and sites;
:meth:`HorseshoeEP.run` iterates: marginals (eqs 2-13, :mod:`.horseshoe_marginals`) →
cavities, tilted moments and target sites for all features (eqs 14-25, :mod:`.horseshoe`)
→ every site moves a fraction ``ε_k`` towards its target, all with the GIL released, through
the shared sweep driver (progress callback, Ctrl-C, convergence rule). At the end it
evaluates the evidence (eq 27) and its gradients (eqs 33-50) and returns a
:class:`HorseshoeResult`.
"""
import numpy as np
import scipy.linalg as sla
from scipy.linalg import blas as _blas

from libc.math cimport pow, isnan, INFINITY
from libc.string cimport memcpy
from fastep._epcore._common cimport SweepDriver
from fastep._epcore._common import SweepResult, replaced_fields
from fastep._epcore.horseshoe cimport SiteState, SiteTargets, site_targets
from fastep._epcore.horseshoe_marginals cimport (Sites, Marginals, MarginalsWork, marginals,
                                                 MARGINALS_OK, MARGINALS_SINGULAR)

__all__ = ["HorseshoeDamping", "HorseshoeOptions", "HorseshoePrior", "HorseshoeEP", "HorseshoeResult", "initial_sites"]

_LOG_2PI = float(np.log(2.0 * np.pi))
_STATUS = {STATUS_CONVERGED: "converged", STATUS_MAX_SWEEPS: "max_sweeps", STATUS_STUCK: "stuck",
           STATUS_STOPPED: "stopped"}
_SITE_NAMES = ("pi_w", "h_w", "pi_u", "pi_v")


def initial_sites(int d, double rho2, double gamma2):
    """Cold start: w-sites of precision ``γ²/ρ²`` (the prior variance at ``λ = 1``), flat u and v
    sites; a dict of the four site arrays (natural form, eq 1)."""
    return {"pi_w": np.full(d, gamma2 / rho2), "h_w": np.zeros(d), "pi_u": np.zeros(d), "pi_v": np.zeros(d)}


# --------------------------------------------------------------------------------------
# options, prior, result
# --------------------------------------------------------------------------------------
cdef class HorseshoeDamping(FrozenOptions):
    """The step-size schedule of :meth:`HorseshoeEP.run` (read-only; part of
    :class:`HorseshoeOptions`).

    Parameters
    ----------
    damping, damping_decay, min_damping : float, default 0.5, 0.99, 0.3
        Iteration ``k`` (from 0) moves every site a fraction
        ``ε_k = max(damping · damping_decay^k, floor)`` towards its target in natural
        parameters (``g̃ ← g̃_new^ε g̃_old^{1-ε}``); the floor starts at ``min_damping``. The
        supplement's schedule is 0.5, reduced by 1% per iteration; it sums to 50, so alone it
        can stall before ``tol``: the floor keeps EP moving.
    stall_window, stall_factor, lowest_damping : int, float, float, default 50, 0.5, 0.02
        Stall watch: every ``stall_window`` iterations, if every step of the window was taken
        at the scheduled ``ε`` (no halving) and the smallest residual of the window is not
        below ``stall_factor`` times that of the previous window, the floor is halved (never
        below ``lowest_damping``). When ``C`` has strong correlations (``|C_ij|`` near 0.95)
        a fixed floor of 0.3 leaves an oscillating mode that contracts by only about 1% per
        iteration; the smaller step damps it.
    """

    _FIELDS = ("damping", "damping_decay", "min_damping", "stall_window", "stall_factor", "lowest_damping")

    def __init__(self, *, double damping=0.5, double damping_decay=0.99, double min_damping=0.3,
                 int stall_window=50, double stall_factor=0.5, double lowest_damping=0.02):
        if not 0.0 < damping <= 1.0:
            raise ValueError(f"damping must be in (0, 1], got {damping}")
        if not 0.0 < damping_decay <= 1.0:
            raise ValueError(f"damping_decay must be in (0, 1], got {damping_decay}")
        for name, value in (("min_damping", min_damping), ("lowest_damping", lowest_damping)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if stall_window < 1:
            raise ValueError(f"stall_window must be >= 1, got {stall_window}")
        if not stall_factor > 0.0:
            raise ValueError(f"stall_factor must be > 0, got {stall_factor}")
        self.damping, self.damping_decay, self.min_damping = damping, damping_decay, min_damping
        self.stall_window, self.stall_factor, self.lowest_damping = stall_window, stall_factor, lowest_damping


_DEFAULT_DAMPING = HorseshoeDamping()


cdef class HorseshoeOptions(FrozenOptions):
    """The options of :meth:`HorseshoeEP.run` (read-only; :meth:`replace` makes a changed copy).

    Parameters
    ----------
    damping_schedule : HorseshoeDamping, optional
        The step-size schedule and its stall watch (default ``HorseshoeDamping()``); its
        fields are also attributes of the options (``options.damping`` and so on).
    tol : float >= 0, default 1e-8
        Converged when the largest scaled site residual (target minus current, undamped)
        ``max_j max(|Δπ_w|/p_w, |Δh_w|/√p_w, |Δπ_u|/p_u, |Δπ_v|/p_v)``, ``p_w = 1/η + |π_w|``,
        ``p_u = 1/ν + |π_u|``, ``p_v = 1/ξ + |π_v|`` (relative changes of the marginals; a
        plain ``|Δπ|η`` stalls at rounding level for the huge v-site precisions of relevant
        features under strong global shrinkage) is below ``tol``.
    max_sweeps : int >= 0, default 1000
        EP iterations (0 evaluates the starting sites).
    max_halvings : int >= 0, default 10
        Halvings of a step that would leave an improper posterior or cavity.
    max_held : int >= 0, default 25
        Iterations in a row with held-back precision decreases before EP stops as 'stuck'.
    negative_precision : {'clip', 'allow'}, default 'clip'
        Policy for negative w-site precisions: 'clip' keeps a target precision
        ``>= w_floor/η_j`` (``η_j`` the cavity variance) with the mean still matched;
        'allow' keeps every target.
    w_floor : float, default -0.1
        The floor of 'clip'.
    n_threads : int >= 0, default 0
        OpenMP threads of the site step (0: the OpenMP default); results do not depend on it.
    """

    _FIELDS = ("damping_schedule", "tol", "max_sweeps", "max_halvings", "max_held", "negative_precision",
               "w_floor", "n_threads")

    def __init__(self, *, HorseshoeDamping damping_schedule=None, double tol=1e-8, int max_sweeps=1000,
                 int max_halvings=10, int max_held=25, str negative_precision="clip", double w_floor=-0.1,
                 n_threads=0):
        if damping_schedule is None:
            damping_schedule = _DEFAULT_DAMPING
        if negative_precision not in ("clip", "allow"):
            raise ValueError(f"negative_precision must be 'clip' or 'allow', got {negative_precision!r}")
        if not tol >= 0.0:
            raise ValueError(f"tol must be >= 0, got {tol}")
        for name, value in (("max_sweeps", max_sweeps), ("max_halvings", max_halvings), ("max_held", max_held)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if w_floor != w_floor:
            raise ValueError("w_floor must not be NaN")
        threads = 0 if n_threads is None else int(n_threads)
        if threads < 0:
            raise ValueError(f"n_threads must be >= 0 (0: the OpenMP default), got {n_threads}")
        cdef HorseshoeDamping step = damping_schedule
        self.damping_schedule = step
        self.damping, self.damping_decay, self.min_damping = step.damping, step.damping_decay, step.min_damping
        self.stall_window, self.stall_factor, self.lowest_damping = step.stall_window, step.stall_factor, step.lowest_damping
        self.tol, self.max_sweeps, self.max_halvings, self.max_held = tol, max_sweeps, max_halvings, max_held
        self.negative_precision, self.w_floor, self.n_threads = negative_precision, w_floor, threads


def _options_from_dict(fields):
    """Unpickle HorseshoeOptions pickled with the schedule's fields among the options'."""
    fields = dict(fields)
    schedule = {name: fields.pop(name) for name in HorseshoeDamping._FIELDS if name in fields}
    if schedule:
        fields["damping_schedule"] = HorseshoeDamping(**schedule)
    return HorseshoeOptions(**fields)


cdef class HorseshoePrior:
    """The prior of one task's coefficients: ``w_j | u, v ~ N(0, u_j²/v_j²)``, ``u ~ N(0, ρ²C)``,
    ``v ~ N(0, γ²C)`` with the correlation matrix ``C = ΔDΔ + ΔPPᵀΔ = diag(a) + UUᵀ``
    (eqs 5, 31, 43), ``δ = (D + rowsum P²)^{-1/2}``, ``a = δ²D``, ``U = ΔP``, so that
    ``diag C = 1``. ``|u_j/v_j|`` is half-Cauchy with scale ``ρ/γ``: each ``w_j`` has a
    horseshoe prior, and features with correlated ``u`` and ``v`` tend to be relevant or
    irrelevant together.

    Parameters
    ----------
    rho2, gamma2 : float > 0
        ``ρ²`` and ``γ²``.
    P : array_like (d, m)
        Loadings of the selection dependencies (``m = 0``: independent horseshoes).
    D : array_like (d,), > 0
        The idiosyncratic part of ``C`` before normalisation.
    """

    def __init__(self, rho2, gamma2, P, D):
        P = np.ascontiguousarray(P, dtype=float)
        D = np.ascontiguousarray(D, dtype=float)
        if P.ndim != 2 or D.ndim != 1 or P.shape[0] != D.shape[0]:
            raise ValueError(f"P must be (d, m) and D (d,), got shapes {P.shape} and {D.shape}")
        if not (rho2 > 0 and gamma2 > 0 and np.isfinite(rho2) and np.isfinite(gamma2)):
            raise ValueError(f"rho2 and gamma2 must be positive and finite, got {rho2!r} and {gamma2!r}")
        if not (np.all(D > 0) and np.all(np.isfinite(D)) and np.all(np.isfinite(P))):
            raise ValueError("D must be positive and finite, P finite")
        self.rho2, self.gamma2 = rho2, gamma2
        self.P, self.D = P, D
        self.d, self.m = P.shape
        self.delta = 1.0 / np.sqrt(D + np.einsum("ij,ij->i", P, P))
        self.a = self.delta ** 2 * D
        self.U = self.delta[:, None] * P

    def __reduce__(self):
        return (HorseshoePrior, (self.rho2, self.gamma2, self.P, self.D))

    def __repr__(self):
        return f"HorseshoePrior(rho2={self.rho2!r}, gamma2={self.gamma2!r}, d={self.d}, m={self.m})"


_RESULT_FIELDS = (
    "status", "n_halvings", "n_held", "n_held_iter", "damping_floor",
    "pi_w", "h_w", "pi_u", "pi_v",
    "mean", "var", "var_u", "var_v",
    "cavity_mean", "cavity_var", "cavity_var_u", "cavity_var_v",
    "target_pi_w", "target_h_w", "target_pi_u", "target_pi_v", "site_log_z", "site_residual", "relevance",
    "log_z_w", "log_z_u", "log_z_v", "grad_sigma2", "grad_rho2", "grad_gamma2", "grad_P_u", "grad_P_v",
    "factors",
)


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f")))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


class HorseshoeResult(SweepResult):
    """What one :meth:`HorseshoeEP.run` reports (read-only): the :class:`SweepResult` fields and
    the horseshoe's own.

    Common fields: ``n_sweeps`` (EP iterations run), ``converged``, ``max_change`` (the last
    scaled site residual, also ``residual``), ``log_z`` (the EP evidence, eq 27, at the returned
    sites), ``n_clipped`` (w-site targets raised to the floor in the last iteration),
    ``stopped``.

    Attributes
    ----------
    status : {'converged', 'max_sweeps', 'stuck', 'stopped'}
    stuck : bool
        ``status == 'stuck'``.
    n_halvings : int
        Step halvings in the run.
    n_held : int
        Site-precision decreases held back in the last held iteration (0 if none).
    n_held_iter : int
        Iterations with held-back decreases.
    damping_floor : float
        The floor of the step size reached by the stall watch.
    pi_w, h_w, pi_u, pi_v : ndarray (d,)
        The returned sites (natural form, eq 1); ``sites`` gives them as a dict.
    mean, var : ndarray (d,)
        Marginal means and variances of ``w`` (eq 2).
    var_u, var_v : ndarray (d,)
        Marginal variances of ``u`` and ``v`` (eqs 5-13).
    cavity_mean, cavity_var, cavity_var_u, cavity_var_v : ndarray (d,)
        The cavities ``m_j``, ``η_j``, ``ν_j``, ``ξ_j`` (eq 14).
    target_pi_w, target_h_w, target_pi_u, target_pi_v : ndarray (d,)
        The undamped targets (eqs 22-25) at the returned sites.
    site_log_z : ndarray (d,)
        ``log Z̃'_j``: eq (26) for the returned sites without the ``m̃²/η̃`` term, which
        cancels in eq (27).
    site_residual : ndarray (d,)
        Each feature's scaled residual (:class:`HorseshoeOptions`, ``tol``).
    relevance : ndarray (d,)
        ``E[λ²/(λ² + η)]`` under the tilted distribution of each factor (``E[w_j] = r_j m_j``,
        eq 16): 1 minus the shrinkage factor.
    log_z_w, log_z_u, log_z_v : float
        The w-, u- and v-terms of eq (27) (eqs 28-32); ``log_z = Σ site_log_z + log_z_w +
        log_z_u + log_z_v``.
    grad_sigma2, grad_rho2, grad_gamma2 : float
        ``∂ log Z/∂σ²`` (eqs 33-35), ``∂/∂ρ²`` and ``∂/∂γ²`` (eqs 36-38), sites fixed (exact
        at an EP fixed point where no w-site is clipped).
    grad_P_u, grad_P_v : ndarray (d, m)
        The u- and v-parts of ``∂ log Z/∂P`` (eqs 40-50).
    factors : tuple
        What ``x*ᵀ V_w x*`` needs: ``('dense', V_w)`` when ``d <= n``, else ``('split', in_s,
        Π_B⁻¹, L, W_S, L_Q)`` (:mod:`.horseshoe_marginals`; ``W_S``, ``L_Q`` None when S is empty).
    """

    __slots__ = _RESULT_FIELDS
    _FIELDS = SweepResult._FIELDS + _RESULT_FIELDS

    def __init__(self, **fields):
        common = {name: fields.pop(name) for name in SweepResult._FIELDS if name in fields}
        unknown = set(fields) - set(_RESULT_FIELDS)
        missing = set(_RESULT_FIELDS) - set(fields)
        if unknown or missing:
            raise TypeError(f"HorseshoeResult: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        self._assign(common)
        for name in _RESULT_FIELDS:
            object.__setattr__(self, name, fields[name])

    def __setattr__(self, name, value):
        raise AttributeError(f"HorseshoeResult is read-only (use replace); cannot set {name!r}")

    @property
    def stuck(self):
        """Whether EP stopped as 'stuck' (``status == 'stuck'``)."""
        return self.status == "stuck"

    @property
    def residual(self):
        """The largest scaled site residual at the returned sites (``max_change``)."""
        return self.max_change

    @property
    def sites(self):
        """The returned sites as a dict ``{'pi_w', 'h_w', 'pi_u', 'pi_v'}`` (the arrays themselves)."""
        return {name: getattr(self, name) for name in _SITE_NAMES}

    def replace(self, **changes):
        """A copy with the given fields changed (as :func:`dataclasses.replace`)."""
        return HorseshoeResult(**replaced_fields(self, changes))

    def __eq__(self, other):
        """Field by field (arrays elementwise; NaN equals NaN)."""
        if not isinstance(other, HorseshoeResult):
            return NotImplemented
        return all(_same(getattr(self, name), getattr(other, name)) for name in self._FIELDS)

    __hash__ = None

    def __reduce__(self):
        return (_result_from_dict, (self.as_dict(),))

    def __repr__(self):
        return (f"HorseshoeResult(status={self.status!r}, n_sweeps={self.n_sweeps}, "
                f"residual={self.max_change!r}, log_z={self.log_z!r})")


def _result_from_dict(fields):
    return HorseshoeResult(**fields)


# --------------------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------------------
cdef double* _pointer(dict buffers, str name, Py_ssize_t d):
    buffers[name] = np.empty(max(d, 1))
    return <double*><size_t>buffers[name].ctypes.data


cdef void _set_marginals(dict buffers, str prefix, Marginals* out, Py_ssize_t d):
    out.mean = _pointer(buffers, prefix + "mean", d)
    out.var = _pointer(buffers, prefix + "var", d)
    out.cav_prec = _pointer(buffers, prefix + "cav_prec", d)
    out.cav_mean = _pointer(buffers, prefix + "cav_mean", d)
    out.cav_var = _pointer(buffers, prefix + "cav_var", d)
    out.var_u = _pointer(buffers, prefix + "var_u", d)
    out.cav_var_u = _pointer(buffers, prefix + "cav_var_u", d)
    out.var_v = _pointer(buffers, prefix + "var_v", d)
    out.cav_var_v = _pointer(buffers, prefix + "cav_var_v", d)


cdef inline void _site_state(const Sites* sites, const Marginals* m, SiteState* s) noexcept nogil:
    s.cavity_mean, s.cavity_var, s.cavity_var_u, s.cavity_var_v = m.cav_mean, m.cav_var, m.cav_var_u, m.cav_var_v
    s.mean, s.var, s.var_u, s.var_v = m.mean, m.var, m.var_u, m.var_v
    s.pi_w, s.h_w, s.pi_u, s.pi_v = sites.pi_w, sites.h_w, sites.pi_u, sites.pi_v


cdef inline void _damped(Py_ssize_t d, const double* site, const double* target, double eps,
                         double* out) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(d):
        out[j] = site[j] + eps * (target[j] - site[j])


cdef inline Py_ssize_t _held(Py_ssize_t d, const double* site, const double* target, double eps,
                             double* out) noexcept nogil:
    """A step with every precision decrease held back; returns the number of decreases."""
    cdef Py_ssize_t j, count = 0
    cdef double t
    for j in range(d):
        t = target[j]
        if target[j] < site[j]:
            count += 1
        if not t > site[j]:
            t = site[j]
        out[j] = site[j] + eps * (t - site[j])
    return count


cdef class HorseshoeEP:
    """Parallel damped EP for one task of the horseshoe regression model (supplement §1).

    Built once from validated arrays; :meth:`run` iterates from the current sites and returns
    a :class:`HorseshoeResult`; the sites it ends at stay in ``pi_w``, ``h_w``, ``pi_u``,
    ``pi_v`` (a second :meth:`run` continues from them).

    Parameters
    ----------
    X : ndarray (n, d)
        Design (float64; copied if not C-contiguous).
    y : ndarray (n,)
        Targets.
    sigma2 : float > 0
        Noise variance ``σ²``.
    prior : HorseshoePrior
        ``ρ²``, ``γ²`` and the correlation matrix ``C``.
    options : HorseshoeOptions, optional
        Default ``HorseshoeOptions()``.
    sites : mapping, optional
        Starting sites ``{'pi_w', 'h_w', 'pi_u', 'pi_v'}`` (arrays of length d, copied); default
        the cold start (:func:`initial_sites`).

    Notes
    -----
    Negative site precisions (the policy):

    - u- and v-sites: negative precisions are accepted (eqs 18-21 make one of the two
      negative for almost every feature; the tilted second moments are at most twice the
      cavity variances, so a target is never below ``-1/(2ν_j)`` or ``-1/(2ξ_j)``).
    - w-sites: ``negative_precision='clip'`` keeps a target precision ``>= w_floor/η_j``
      with the mean still matched; ``'allow'`` keeps every target. Unbounded negative w-sites
      are exact EP but unstable when many features are ambiguous (bimodal tilted ``w``,
      targets of -0.2/η to -0.35/η): together they make the posterior nearly improper along
      some direction, other features' cavity variances blow up and the iteration diverges
      (for instance at small σ² with n = 60 and d = 200, also in the reference twin, where a
      floor of -0.2/η still diverges and -0.1/η converges). Clearly relevant features have
      small negative targets (about -0.001/η to -0.02/η) that pass the floor, so on
      well-determined problems nothing is clipped (``n_clipped == 0``); the evidence
      gradient is exact only then.
    - Every step must leave a valid state: ``V_w``, ``V_u``, ``V_v`` positive definite and
      every cavity variance (eq 14) positive and finite. An invalid step is halved, up to
      ``max_halvings`` times. If it is still invalid, the step is taken with every
      site-precision *decrease* held back (increases and ``h_w`` move by the full ``ε``):
      raising site precisions raises the posterior precision and every cavity precision,
      so this step keeps a valid state valid (it is checked all the same). After more than
      ``max_held`` consecutive held iterations EP stops with status 'stuck' (the targets lie
      outside the region where all cavities are proper, typically when ``C`` correlates
      features strongly), keeping the last valid state. Nothing returned is NaN.

    Examples
    --------
    >>> import numpy as np
    >>> from fastep._epcore.horseshoe_ep import HorseshoeEP, HorseshoePrior
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(30, 50))
    >>> y = 2.0 * X[:, 3] + 0.3 * rng.normal(size=30)
    >>> engine = HorseshoeEP(X, y, 0.1, HorseshoePrior(0.01, 1.0, np.zeros((50, 0)), np.ones(50)))
    >>> result = engine.run()
    >>> result.status, int(np.argmax(result.relevance))
    ('converged', 3)
    """

    def __init__(self, X, y, sigma2, HorseshoePrior prior not None, HorseshoeOptions options=None,
                 sites=None):
        X = np.ascontiguousarray(X, dtype=float)
        y = np.ascontiguousarray(y, dtype=float)
        if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0] or X.shape[0] < 1 or X.shape[1] < 1:
            raise ValueError(f"X must be (n, d) and y (n,) with n, d >= 1, got shapes {X.shape} and {y.shape}")
        if prior.d != X.shape[1]:
            raise ValueError(f"the prior has d = {prior.d} features, X has {X.shape[1]}")
        if not (sigma2 > 0 and np.isfinite(sigma2)):
            raise ValueError(f"sigma2 must be positive and finite, got {sigma2!r}")
        self.X, self.y = X, y
        self.n, self.d = X.shape
        self.sigma2 = sigma2
        self.prior = prior
        self.options = HorseshoeOptions() if options is None else options
        cdef Py_ssize_t d = self.d
        start = initial_sites(self.d, prior.rho2, prior.gamma2) if sites is None else sites
        self.buffers = {}
        for name in _SITE_NAMES:
            value = np.array(start[name], dtype=float)
            if value.shape != (d,) or not np.all(np.isfinite(value)):
                raise ValueError(f"sites[{name!r}] must be a finite array of length {d}")
            self.buffers[name] = value
        self.pi_w, self.h_w, self.pi_u, self.pi_v = (self.buffers[name] for name in _SITE_NAMES)
        self.sites.pi_w = <double*><size_t>self.pi_w.ctypes.data
        self.sites.h_w = <double*><size_t>self.h_w.ctypes.data
        self.sites.pi_u = <double*><size_t>self.pi_u.ctypes.data
        self.sites.pi_v = <double*><size_t>self.pi_v.ctypes.data
        self.trial.pi_w = _pointer(self.buffers, "trial.pi_w", d)
        self.trial.h_w = _pointer(self.buffers, "trial.h_w", d)
        self.trial.pi_u = _pointer(self.buffers, "trial.pi_u", d)
        self.trial.pi_v = _pointer(self.buffers, "trial.pi_v", d)
        _set_marginals(self.buffers, "a.", &self.current, d)
        _set_marginals(self.buffers, "b.", &self.proposed, d)
        self.targets.pi_w = _pointer(self.buffers, "target.pi_w", d)
        self.targets.h_w = _pointer(self.buffers, "target.h_w", d)
        self.targets.pi_u = _pointer(self.buffers, "target.pi_u", d)
        self.targets.pi_v = _pointer(self.buffers, "target.pi_v", d)
        self.targets.log_z = _pointer(self.buffers, "target.log_z", d)
        self.targets.residual = _pointer(self.buffers, "target.residual", d)
        self.targets.relevance = _pointer(self.buffers, "target.relevance", d)
        self.buffers["target.status"] = np.zeros(d, dtype=np.intc)
        self.targets.status = <int*><size_t>self.buffers["target.status"].ctypes.data
        self.work = MarginalsWork(X, y, prior.a, prior.U)

    def run(self, *, object sweep_callback=None):
        """Iterate from the current sites (updated in place) to convergence, ``max_sweeps``, a stop
        by the callback, or 'stuck'.

        Iteration ``k``: the site targets at the current sites (eqs 14-25); converged if the
        largest scaled residual is below ``tol``; otherwise every site moves ``ε_k`` towards
        its target (:class:`HorseshoeOptions`), halved while the new posterior or a cavity
        would be improper, with the precision decreases held back when no halving helps.

        Parameters
        ----------
        sweep_callback : callable, optional
            ``sweep_callback(iteration, residual, nan)`` after every iteration (with the GIL,
            between iterations); returning ``False`` stops the run (status 'stopped'). An
            exception it raises is re-raised after the sites are restored to their values at
            the start of the run, as on Ctrl-C.

        Returns
        -------
        HorseshoeResult

        Raises
        ------
        ValueError
            If the starting sites give an improper posterior or cavity (nothing changes).
        FloatingPointError
            If EP reaches an improper cavity (cannot happen for a validated state; the sites
            are restored).
        """
        cdef HorseshoeOptions opts = self.options
        cdef MarginalsWork work = self.work
        cdef double sigma2 = self.sigma2, rho2 = self.prior.rho2, gamma2 = self.prior.gamma2
        cdef double w_floor = opts.w_floor if opts.negative_precision == "clip" else -INFINITY
        cdef double tol = opts.tol, residual = INFINITY, damp_floor = opts.min_damping
        cdef double window_best = INFINITY, prev_window_best = INFINITY, eps, eps0, r
        cdef double damping = opts.damping, decay = opts.damping_decay
        cdef int max_sweeps = opts.max_sweeps, max_halvings = opts.max_halvings, max_held = opts.max_held
        cdef int stall_window = opts.stall_window, n_threads = opts.n_threads
        cdef double stall_factor = opts.stall_factor, lowest_damping = opts.lowest_damping
        cdef int status = STATUS_MAX_SWEEPS, it = 0, held_run = 0, n_held_iter = 0, st = MARGINALS_OK
        cdef int n_bad = 0, n_clipped = 0, attempt
        cdef long n_halvings = 0
        cdef Py_ssize_t j, d = self.d, n_held = 0
        cdef bint window_clean = True, accepted
        cdef SiteState state
        cdef Marginals swap
        cdef Sites* sites = &self.sites
        cdef Sites* trial = &self.trial
        cdef SweepDriver driver = SweepDriver(tol, max_sweeps, sweep_callback, 1.0)
        driver.keep(self.pi_w, self.h_w, self.pi_u, self.pi_v)
        with nogil:
            st = marginals(work, sigma2, rho2, gamma2, sites, &self.current)
        if st == MARGINALS_SINGULAR:
            raise np.linalg.LinAlgError("a triangular factor of the posterior is singular")
        if st != MARGINALS_OK:
            raise ValueError("the starting sites give an improper posterior or cavity")
        with nogil:
            while True:
                _site_state(sites, &self.current, &state)
                n_bad = site_targets(&state, &self.targets, d, w_floor, n_threads, &n_clipped)
                if n_bad:
                    break
                residual = self.targets.residual[0]
                for j in range(1, d):
                    r = self.targets.residual[j]
                    if r > residual or isnan(r):
                        residual = r
                driver.record_change(it, residual, 0)
                if driver.test_sites():                 # residual < tol
                    status = STATUS_CONVERGED
                if it > 0 and driver.notify(it) and status != STATUS_CONVERGED:
                    status = STATUS_STOPPED
                if status != STATUS_MAX_SWEEPS or it >= max_sweeps or driver.interrupted():
                    break
                # stall watch: a window of stall_window iterations, all taken at the scheduled
                # step, that did not lower the residual by stall_factor halves the floor
                if residual < window_best:
                    window_best = residual
                if it and it % stall_window == 0:
                    if window_clean and window_best > stall_factor * prev_window_best:
                        damp_floor = 0.5 * damp_floor
                        if lowest_damping > damp_floor:
                            damp_floor = lowest_damping
                    prev_window_best, window_best, window_clean = window_best, INFINITY, True
                eps = damping * pow(decay, <double>it)
                if damp_floor > eps:
                    eps = damp_floor
                eps0 = eps
                accepted = False
                for attempt in range(max_halvings + 1):
                    _damped(d, sites.pi_w, self.targets.pi_w, eps, trial.pi_w)
                    _damped(d, sites.h_w, self.targets.h_w, eps, trial.h_w)
                    _damped(d, sites.pi_u, self.targets.pi_u, eps, trial.pi_u)
                    _damped(d, sites.pi_v, self.targets.pi_v, eps, trial.pi_v)
                    st = marginals(work, sigma2, rho2, gamma2, trial, &self.proposed)
                    if st == MARGINALS_OK:
                        held_run = 0
                        accepted = True
                        break
                    if st == MARGINALS_SINGULAR:
                        break
                    eps *= 0.5
                    n_halvings += 1
                    window_clean = False
                if st == MARGINALS_SINGULAR:
                    break
                if not accepted:
                    # hold the precision decreases: raising site precisions can only raise the
                    # posterior precision and every cavity precision, so this step keeps the
                    # state valid (class docstring)
                    n_held = _held(d, sites.pi_w, self.targets.pi_w, eps0, trial.pi_w)
                    _damped(d, sites.h_w, self.targets.h_w, eps0, trial.h_w)
                    n_held += _held(d, sites.pi_u, self.targets.pi_u, eps0, trial.pi_u)
                    n_held += _held(d, sites.pi_v, self.targets.pi_v, eps0, trial.pi_v)
                    st = marginals(work, sigma2, rho2, gamma2, trial, &self.proposed)
                    held_run += 1
                    n_held_iter += 1
                    if st == MARGINALS_SINGULAR:
                        break
                    if st != MARGINALS_OK or held_run > max_held:
                        status = STATUS_STUCK
                        break
                memcpy(sites.pi_w, trial.pi_w, d * sizeof(double))
                memcpy(sites.h_w, trial.h_w, d * sizeof(double))
                memcpy(sites.pi_u, trial.pi_u, d * sizeof(double))
                memcpy(sites.pi_v, trial.pi_v, d * sizeof(double))
                swap = self.current
                self.current = self.proposed
                self.proposed = swap
                it += 1
        driver.raise_pending()                  # Ctrl-C or the callback raised: sites back, re-raise
        if n_bad:
            driver.restore()
            raise FloatingPointError("EP produced an improper cavity; this is a bug, please report it")
        if st == MARGINALS_SINGULAR:
            driver.restore()
            raise np.linalg.LinAlgError("a triangular factor of the posterior is singular")
        return self._finish(status, it, residual, n_clipped, n_halvings, <long>n_held, n_held_iter,
                            damp_floor, driver.stopped)

    cdef object _finish(self, int status, int it, double residual, int n_clipped, long n_halvings,
                        long n_held, int n_held_iter, double damp_floor, bint stopped):
        """The evidence (eq 27), its gradients (eqs 33-50) and the prediction factors at the
        current sites, and the result."""
        cdef int st
        cdef MarginalsWork work = self.work
        cdef double sigma2 = self.sigma2, rho2 = self.prior.rho2, gamma2 = self.prior.gamma2
        with nogil:
            st = marginals(work, sigma2, rho2, gamma2, &self.sites, &self.current)
        if st != MARGINALS_OK:
            raise FloatingPointError("the marginals of the returned sites are improper; this is a bug, "
                                     "please report it")
        factors = work.factors()
        sites = {name: getattr(self, name).copy() for name in _SITE_NAMES}
        prefix = "a." if self.current.mean == self._ptr("a.mean") else "b."
        marg = {name: self._copy(prefix + name) for name in
                ("mean", "var", "cav_mean", "cav_var", "var_u", "cav_var_u", "var_v", "cav_var_v")}
        target = {name: self._copy("target." + name) for name in
                  ("pi_w", "h_w", "pi_u", "pi_v", "log_z", "residual", "relevance")}
        log_z_w, grad_sigma2, prediction = _w_evidence(self, factors, marg["mean"], sites)
        prior = self.prior
        log_z_u, grad_rho2, grad_P_u = _latent_evidence(prior, prior.rho2, sites["pi_u"], marg["var_u"],
                                                        factors["u"])
        log_z_v, grad_gamma2, grad_P_v = _latent_evidence(prior, prior.gamma2, sites["pi_v"], marg["var_v"],
                                                          factors["v"])
        log_z = float(np.sum(target["log_z"]) + log_z_w + log_z_u + log_z_v)
        return HorseshoeResult(
            n_sweeps=it, converged=status == STATUS_CONVERGED, max_change=residual, log_z=log_z,
            n_clipped=n_clipped, n_halvings=n_halvings, stopped=stopped,
            status=_STATUS[status], n_held=int(n_held), n_held_iter=n_held_iter, damping_floor=damp_floor,
            pi_w=sites["pi_w"], h_w=sites["h_w"], pi_u=sites["pi_u"], pi_v=sites["pi_v"],
            mean=marg["mean"], var=marg["var"], var_u=marg["var_u"], var_v=marg["var_v"],
            cavity_mean=marg["cav_mean"], cavity_var=marg["cav_var"], cavity_var_u=marg["cav_var_u"],
            cavity_var_v=marg["cav_var_v"],
            target_pi_w=target["pi_w"], target_h_w=target["h_w"], target_pi_u=target["pi_u"],
            target_pi_v=target["pi_v"], site_log_z=target["log_z"], site_residual=target["residual"],
            relevance=target["relevance"],
            log_z_w=log_z_w, log_z_u=log_z_u, log_z_v=log_z_v, grad_sigma2=grad_sigma2, grad_rho2=grad_rho2,
            grad_gamma2=grad_gamma2, grad_P_u=grad_P_u, grad_P_v=grad_P_v, factors=prediction)

    cdef double* _ptr(self, str name):
        return <double*><size_t>self.buffers[name].ctypes.data

    def _copy(self, name):
        return self.buffers[name][:self.d].copy()


# --------------------------------------------------------------------------------------
# the evidence and its gradients (eqs 27-50), at the end of a run
# --------------------------------------------------------------------------------------
def _inner(a, b):
    """``Σ a_i b_i`` of two vectors by ``ddot``."""
    return float(_blas.ddot(a, b))


def _w_evidence(HorseshoeEP engine, dict factors, mean, dict sites):
    """The w-terms of eq (27) (eqs 28, 32: ``log ∫ N(y|Xw, σ²I) Π_j exp(-π_j w_j²/2 + h_j w_j) dw``,
    written around the residual ``y - Xμ`` so that no large terms cancel), ``∂/∂σ²`` (eqs 33-35:
    ``E‖y - Xw‖²/(2σ⁴) - n/(2σ²)``) and the prediction factors."""
    X, y, sigma2 = engine.X, engine.y, engine.sigma2
    n, d = engine.n, engine.d
    pi, h = sites["pi_w"], sites["h_w"]
    if engine.d <= engine.n:
        L = factors["L"]
        mat, trans = (X, 0) if X.flags.f_contiguous else (X.T, 1)
        resid = y - _blas.dgemv(1.0, mat, mean, trans=trans)
        rr = _inner(resid, resid)
        log_z = (-0.5 * n * np.log(2 * np.pi * sigma2) + 0.5 * d * _LOG_2PI - np.sum(np.log(np.diag(L)))
                 - 0.5 * rr / sigma2 - 0.5 * _inner(mean, pi * mean) + _inner(h, mean))
        tr_xvx = float(np.sum(factors["vxtx"]))
        grad = (rr + tr_xvx) / (2 * sigma2 ** 2) - n / (2 * sigma2)
        return float(log_z), float(grad), ("dense", factors["V"].copy())
    in_s, S, inv_pi_b, m_b = factors["in_s"], factors["S"], factors["inv_pi_b"], factors["m_b"]
    L, beta = factors["L"], factors["beta"]
    k = S.size
    log_z = (0.5 * (d - k) * _LOG_2PI + 0.5 * np.sum(np.log(pi[~in_s])) * -1.0
             + 0.5 * float(np.sum(h * m_b)) - 0.5 * n * _LOG_2PI - np.sum(np.log(np.diag(L))))
    if k:
        LQ, WS, mu_s = factors["LQ"], factors["WS"], factors["mu_s"]
        # -½‖α‖² + ½ b_SᵀQ⁻¹b_S = -½‖β‖² - ½ μ_SᵀΠ_Sμ_S + h_Sᵀμ_S (no cancellation)
        log_z += (0.5 * k * _LOG_2PI - np.sum(np.log(np.diag(LQ))) - 0.5 * _inner(beta, beta)
                  - 0.5 * _inner(mu_s, pi[S] * mu_s) + _inner(h[S], mu_s))
    else:
        log_z += -0.5 * _inner(beta, beta)
    # σ² gradient: -½tr M_B⁻¹ + ½‖M_B⁻¹(r₀ - X_Sμ_S)‖² + ½tr(Q⁻¹ X_Sᵀ M_B⁻² X_S)
    Linv = sla.solve_triangular(L, np.eye(n), lower=True, check_finite=False)
    Mb = _blas.dgemv(1.0, Linv, beta, trans=1)                                # M_B⁻¹(r₀ - X_Sμ_S)
    grad = -0.5 * float(np.sum(Linv * Linv)) + 0.5 * _inner(Mb, Mb)
    if k:
        Zs = _blas.dgemm(1.0, WS.T, Linv).T                                  # M_B⁻¹ X_S  (n, k)
        Y = sla.solve_triangular(LQ, Zs.T, lower=True, check_finite=False)
        grad += 0.5 * float(np.sum(Y * Y))
        prediction = ("split", in_s, inv_pi_b.copy(), L.copy(order="F"), WS.copy(), LQ.copy(order="F"))
    else:
        prediction = ("split", in_s, inv_pi_b.copy(), L.copy(order="F"), None, None)
    return float(log_z), float(grad), prediction


def _latent_evidence(HorseshoePrior prior, scale2, pi, var, dict factors):
    """``log_z = ½log|V| - ½log|scale2·C| = -½Σ log g - ½log|M|`` (eqs 29-31),
    ``∂/∂scale2 = -tr(VΠ)/(2 scale2)`` (eqs 36-38) and ``∂/∂P = -scale2·ΔWΔP + diag(δ²·V_jj·π_j)P``,
    ``W = Π - ΠVΠ`` (eqs 40-50)."""
    g = factors["g"]
    grad_scale2 = -_inner(var, pi) / (2.0 * scale2)
    if prior.m == 0:
        return -0.5 * float(np.sum(np.log(g))), grad_scale2, np.zeros_like(prior.P)
    R, T, G = factors["R"], factors["T"], factors["G"]
    log_z = -0.5 * float(np.sum(np.log(g))) - float(np.sum(np.log(np.diag(R))))
    delta, P = prior.delta, prior.P
    Zp = (pi * delta)[:, None] * P                                           # ΠΔP
    # V ΠΔP with L M⁻¹ Lᵀ = TᵀT
    right, trans = (T.T, 0) if T.T.flags.f_contiguous else (T, 1)
    TZ = _blas.dgemm(1.0, Zp.T, right, trans_b=trans).T
    VZ = G[:, None] * Zp + _blas.dgemm(1.0, TZ.T, T).T
    grad_P = (-scale2 * delta[:, None] * (Zp - pi[:, None] * VZ) + (delta ** 2 * var * pi)[:, None] * P)
    return log_z, grad_scale2, grad_P
