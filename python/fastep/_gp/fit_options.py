"""The fit options of the GP estimators: one frozen, typed object per model family.

An estimator turns its constructor parameters into one of these when ``fit`` starts
(:class:`DenseFitOptions` for the dense GP, :class:`SparseFitOptions` for the sparse GP,
:class:`IVMFitOptions` for the IVM). The object is checked once, when it is built, and never
changes: a fit that needs a variant (the search's looser tolerance, a minibatch fit's windows,
fractional EP's power) derives it with :meth:`FitOptions.replace`. Its problems keep it, and build
their compiled engine's options (:class:`~fastep._epcore.gp_ep.DenseEPOptions`,
:class:`~fastep._epcore.sparse_ep.SparseEPOptions`, ...) from it once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._epcore import gp_ep as _dense_engine
from .._epcore import sparse_ep as _sparse_engine

__all__ = ["FitOptions", "DenseFitOptions", "SparseFitOptions", "RefineOptions", "IVMFitOptions", "KeepsFitOptions",
           "KeepsSparseFitOptions"]


def _require(condition, name, value, what):
    if not condition:
        raise ValueError(f"{name} must be {what}, got {value!r}")


def _check_positive_int(value, name, minimum=1, allow_none=False):
    if value is None and allow_none:
        return
    _require(isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= minimum,
             name, value, f"an integer >= {minimum}" + (" or None" if allow_none else ""))


def _check_choice(value, name, choices):
    _require(value in choices, name, value, f"one of {tuple(choices)}")


@dataclass(frozen=True, eq=False)
class FitOptions:
    """The options every GP estimator's EP fit shares.

    Parameters
    ----------
    schedule : int
        The family engine's schedule code (:mod:`fastep._epcore.gp_ep`,
        :mod:`fastep._epcore.sparse_ep`); the default is the family's.
    order : int, default ``ORDER_FIXED``
        The engine's code of the order sites are visited in.
    seed : int, default 0
        Seed of the fit's random choices (site order, restarts, subsets), from ``random_state``.
    damping : float in (0, 1], default 1.0
        Step of each site update (1: undamped).
    tol : float >= 0, default 1e-4
        EP's convergence tolerance (the largest site-parameter change of a sweep).
    max_sweeps : int >= 1, default 200
        Most sweeps of one EP run.
    negative_precision : int, default ``NEGATIVE_CLIP``
        The engine's code of what a site update that would give a negative precision does.
    jitter : float >= 0, default 0.0
        Added to the diagonal of the kernel matrix (the sparse GP's ``K_mm``).
    hyperprior : object, default None
        The hyperprior of type-II maximum likelihood as the estimator checked it.
    progress : fastep.progress.Progress or None, default None
        The fit's progress reporter (None: quiet).
    adaptive_damping : bool, default False
        Whether the multinomial engine adapts its damping from ``damping`` on.
    power : float in (0, 1], default 1.0
        Power η of fractional (power) EP; 1 is standard EP.
    max_halvings : int >= 0, default 0
        Halvings of a fractional EP step that would make a cavity improper.

    Notes
    -----
    Instances are frozen: :meth:`replace` returns a checked copy with some fields changed.
    Two instances are equal only when they are the same object.
    """

    schedule: int = _dense_engine.SCHEDULE_BLOCKED
    order: int = _dense_engine.ORDER_FIXED
    seed: int = 0
    damping: float = 1.0
    tol: float = 1e-4
    max_sweeps: int = 200
    negative_precision: int = _dense_engine.NEGATIVE_CLIP
    jitter: float = 0.0
    hyperprior: Any = None
    progress: Any = None
    adaptive_damping: bool = False
    power: float = 1.0
    max_halvings: int = 0

    #: Keys of option dicts written by earlier versions that are fields under another name.
    _legacy_keys: ClassVar[dict[str, str]] = {}

    def __post_init__(self):
        self._check()

    def _check(self):
        """Raise ``ValueError`` for a field out of its range."""
        _check_positive_int(self.seed, "seed", minimum=0)
        _require(0.0 < self.damping <= 1.0, "damping", self.damping, "in (0, 1]")
        _require(self.tol >= 0.0, "tol", self.tol, ">= 0")
        _check_positive_int(self.max_sweeps, "max_sweeps")
        _require(np.isfinite(self.jitter) and self.jitter >= 0.0, "jitter", self.jitter, "a finite float >= 0")
        _require(0.0 < self.power <= 1.0, "power", self.power, "in (0, 1]")
        _check_positive_int(self.max_halvings, "max_halvings", minimum=0)

    def replace(self, **changes: Any) -> FitOptions:
        """A checked copy of these options with the fields named in ``changes`` replaced."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> FitOptions:
        """These options from a dict of the form earlier versions kept in their fitted problems
        (a model file's): its keys that name fields (under their current or former name) are
        taken, the others dropped, and missing fields keep their defaults."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {}
        for key, value in options.items():
            key = cls._legacy_keys.get(key, key)
            if key in names:
                values[key] = value
        return cls(**values)

    @classmethod
    def migrate(cls, state: dict[str, Any], key: str = "options") -> dict[str, Any]:
        """``state`` (an object's saved ``__dict__``) with a plain-dict ``state[key]``, as
        earlier versions saved it, turned into these options; returned as it is otherwise."""
        if isinstance(state.get(key), dict):
            state = dict(state)
            state[key] = cls.from_dict(state[key])
        return state


@dataclass(frozen=True, eq=False)
class DenseFitOptions(FitOptions):
    """The fit options of the dense GP (:class:`~fastep.GaussianProcessClassifier`,
    :class:`~fastep.GaussianProcessRegressor`), their Student-t and multinomial problems included.

    Parameters
    ----------
    block_size : int >= 0, default 0
        Sites per block of the blocked schedule (0: the engine's choice).
    refresh_every : int >= 1, default 1
        Sweeps between full refactorisations of the posterior.
    **kwargs
        The fields of :class:`FitOptions` (``schedule`` by default ``SCHEDULE_BLOCKED``).
    """

    block_size: int = 0
    refresh_every: int = 1

    _legacy_keys: ClassVar[dict[str, str]] = {"refactor_every": "refresh_every"}

    def _check(self):
        super()._check()
        _check_positive_int(self.block_size, "block_size", minimum=0)
        _check_positive_int(self.refresh_every, "refresh_every")


@dataclass(frozen=True, eq=False)
class SparseFitOptions(FitOptions):
    """The fit options of the sparse GP (:class:`~fastep.SparseGPClassifier`,
    :class:`~fastep.SparseGPRegressor`): full-batch, minibatch, multinomial and on a Dask
    cluster; also the IVM's full-data objective.

    Parameters
    ----------
    approximation : {'fitc', 'dtc'}, default 'fitc'
        The sparse approximation.
    n_quadrature : int >= 1, default 32
        Gauss-Hermite nodes of fractional EP's site moments.
    learning : {'auto', 'full-batch', 'minibatch'}, default 'full-batch'
        How the estimator was asked to learn (``'auto'``: by the number of rows).
    minibatch : bool, default False
        Whether this fit learns from minibatches (:mod:`fastep._sparse.stochastic`).
    batch_size, max_epochs : int >= 1 or None, default None
        Rows per minibatch and most passes over the data of minibatch learning.
    learning_rate : float > 0 or None, default None
        Adam's step of minibatch learning.
    sites : {'tied', 'per-point'}, default 'tied'
        The sites of minibatch learning.
    patience : int >= 1 or None, default None
        Windows without a better running log loss before minibatch learning stops.
    window, site_window : int >= 1 or None, default None
        Rows per window of minibatch learning's stopping rule and of its tied site's average.
    n_features : int >= 1 or None, default None
        Inputs of X in a minibatch fit (for its memory estimate).
    n_classes : int >= 2 or None, default None
        Classes of the multinomial model (None: a binary or regression model).
    n_problems : int >= 1, default 1
        Problems fitted together (one-vs-rest), for the memory estimate of growing m.
    **kwargs
        The fields of :class:`FitOptions` (``schedule`` by default ``SPARSE_SEQUENTIAL``).
    """

    schedule: int = _sparse_engine.SPARSE_SEQUENTIAL
    approximation: str = "fitc"
    n_quadrature: int = 32
    learning: str = "full-batch"
    minibatch: bool = False
    batch_size: int | None = None
    max_epochs: int | None = None
    learning_rate: float | None = None
    sites: str = "tied"
    patience: int | None = None
    window: int | None = None
    site_window: int | None = None
    n_features: int | None = None
    n_classes: int | None = None
    n_problems: int = 1

    def _check(self):
        super()._check()
        _check_choice(self.approximation, "approximation", ("fitc", "dtc"))
        _check_positive_int(self.n_quadrature, "n_quadrature")
        _check_choice(self.learning, "learning", ("auto", "full-batch", "minibatch"))
        _check_choice(self.sites, "sites", ("tied", "per-point"))
        for name in ("batch_size", "max_epochs", "patience", "window", "site_window", "n_features"):
            _check_positive_int(getattr(self, name), name, allow_none=True)
        _check_positive_int(self.n_classes, "n_classes", minimum=2, allow_none=True)
        _check_positive_int(self.n_problems, "n_problems")
        _require(self.learning_rate is None or self.learning_rate > 0.0, "learning_rate", self.learning_rate,
                 "> 0 or None")

    @property
    def multinomial(self) -> bool:
        """Whether these are the options of the multinomial model."""
        return self.n_classes is not None


@dataclass(frozen=True)
class RefineOptions:
    """How the IVM refines its active set after the greedy selection.

    Parameters
    ----------
    sweeps : int >= 0, default 0
        Sweeps of EP over the active sites (0: no refinement).
    exchange : {'greedy', 'random'} or None, default None
        The exchange moves after the refinement (None: none).
    exchange_tol : float >= 0, default 1e-6
        The smallest gain in nats an exchange must bring.
    max_exchanges : int >= 0 or None, default None
        Most exchange moves (None: the engine's limit).
    """

    sweeps: int = 0
    exchange: str | None = None
    exchange_tol: float = 1e-6
    max_exchanges: int | None = None

    def __post_init__(self):
        _check_positive_int(self.sweeps, "sweeps", minimum=0)
        _check_choice(self.exchange, "exchange", ("greedy", "random", None))
        _require(self.exchange_tol >= 0.0, "exchange_tol", self.exchange_tol, ">= 0")
        _check_positive_int(self.max_exchanges, "max_exchanges", minimum=0, allow_none=True)

    @classmethod
    def from_dict(cls, refine: dict[str, Any] | None) -> RefineOptions:
        """These options from the dict earlier versions kept (None: the defaults)."""
        return cls(**{key: value for key, value in (refine or {}).items()
                      if key in {field.name for field in dataclasses.fields(cls)}})


@dataclass(frozen=True, eq=False)
class IVMFitOptions:
    """The fit options of the IVM (:class:`~fastep.IVMClassifier`, :class:`~fastep.IVMRegressor`,
    :class:`~fastep.IVMOrdinalRegressor`).

    Parameters
    ----------
    kernel : fastep.kernels.Kernel
        The kernel the fit starts from (validated on X).
    d : int >= 1
        Active points per problem.
    criterion : int
        The engine's code of the selection score (:data:`fastep._epcore.ivm.CRITERIA`).
    refine : RefineOptions
        The refinement of the active set.
    n_iterations : int >= 0
        Rounds of Algorithm 2 (0: no learning).
    max_optimizer_iter : int >= 1
        Most optimiser iterations of one round.
    optimizer : {'L-BFGS-B', 'SCG'} or None
        The optimiser of the kernel objective.
    kernel_objective : {'full_data', 'active_set'}
        The objective the kernel is learnt from.
    full_data : SparseFitOptions
        The options of the full-data objective's sparse EP (and of its minibatch learning).
    minibatch : bool
        Whether the full-data objective is learnt from minibatches.
    seed : int, default 0
        Seed of the fit's random choices.
    progress : fastep.progress.Progress or None, default None
        The fit's progress reporter.
    hyperprior : object, default None
        The hyperprior as the estimator checked it.
    estimator_name : str, default 'IVM'
        The estimator's name in the learning warnings.
    latent_scale : float or None, default None
        The latent scale of the learning checks (1 for classifiers).

    Notes
    -----
    Instances are frozen: :meth:`replace` returns a checked copy with some fields changed.
    """

    kernel: Any
    d: int
    criterion: int
    refine: RefineOptions
    n_iterations: int
    max_optimizer_iter: int
    optimizer: str | None
    kernel_objective: str
    full_data: SparseFitOptions
    minibatch: bool
    seed: int = 0
    progress: Any = None
    hyperprior: Any = None
    estimator_name: str = "IVM"
    latent_scale: float | None = None

    def __post_init__(self):
        _check_positive_int(self.d, "d")
        _check_positive_int(self.n_iterations, "n_iterations", minimum=0)
        _check_positive_int(self.max_optimizer_iter, "max_optimizer_iter")
        _check_positive_int(self.seed, "seed", minimum=0)
        _check_choice(self.optimizer, "optimizer", ("L-BFGS-B", "SCG", None))
        _check_choice(self.kernel_objective, "kernel_objective", ("full_data", "active_set"))
        _require(isinstance(self.full_data, SparseFitOptions), "full_data", self.full_data, "SparseFitOptions")
        _require(isinstance(self.refine, RefineOptions), "refine", self.refine, "RefineOptions")

    def replace(self, **changes: Any) -> IVMFitOptions:
        """A checked copy of these options with the fields named in ``changes`` replaced."""
        return dataclasses.replace(self, **changes)


class KeepsFitOptions:
    """Mixin of the objects that keep their fit's options in ``options`` (the problems, the
    minibatch states and fits): restoring a saved, pickled or copied one turns ``options``
    saved as a plain dict, as earlier versions wrote them, into :attr:`options_class`."""

    #: The class of ``options``: the fit options of the object's model family.
    options_class: ClassVar[type[FitOptions]] = FitOptions

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(self.options_class.migrate(state))


class KeepsSparseFitOptions(KeepsFitOptions):
    """:class:`KeepsFitOptions` of the sparse GP's objects (:class:`SparseFitOptions`)."""

    options_class = SparseFitOptions
