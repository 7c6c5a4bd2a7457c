"""fastep: fast, trustworthy Expectation Propagation.

Public API
----------
LinearEPClassifier, LinearEPRegressor
    Bayesian linear models fitted by weight-space Gaussian EP (Minka §1).
GaussianProcessClassifier, GaussianProcessRegressor
    Gaussian-process models fitted by dense kernel-space EP (Minka §2), with evidence
    gradients and hyperparameter learning.
SparseGPClassifier, SparseGPRegressor
    Sparse GP models by EP with inducing inputs (EP-FITC, EP-DTC, power EP): O(nm²) time,
    O(nm) memory, exact evidence gradients for the hyperparameters and the inducing inputs.
IVMClassifier, IVMRegressor, IVMOrdinalRegressor
    Informative Vector Machines (Lawrence, Seeger & Herbrich 2005): sparse GP models by
    greedy entropy-based active-set selection, O(d² n) time, O(d n) memory.
fastep.kernels
    Covariance functions with exact gradients.
LinearEPRankK
    Weight-space Gaussian EP with factors on k-dimensional projections (Minka §3); ``RankKEP`` is
    its deprecated former name.
HorseshoeRegression, MultiTaskHorseshoeRegression
    Sparse linear regression with horseshoe priors by parallel EP, with feature-selection
    dependencies learnt across tasks (Hernández-Lobato & Hernández-Lobato).
fastep.likelihoods
    Probit, Step, Logistic, Gaussian, OrderedCategorical, StudentT site models.
fastep.reference
    Plain-numpy twins of the compiled kernels, for cross-checking.
ProgressRecord
    What an estimator's ``callback`` receives during ``fit`` (stage, iteration, log evidence, ...).
save, load
    Store a fitted estimator in one ``.npz`` file and read it back, without pickle.
get_include
    Directory for Cython's ``-I`` so that downstream code can ``cimport fastep._epcore.sites`` etc.
show_versions
    Print the versions of fastep, Python, numpy, scipy, the BLAS and the optional extras (for bug
    reports; ``fastep info`` on the command line).

``import fastep`` loads the kernels, likelihoods, hyperpriors, persistence and progress modules;
each estimator's module (with its compiled engine) is imported on first use of the estimator,
``from fastep import GaussianProcessClassifier`` or ``fastep.GaussianProcessClassifier``.
"""
from typing import TYPE_CHECKING

from . import hyperpriors, kernels, likelihoods
from ._include import get_include
from .exceptions import ConvergenceWarning, MemoryLimitError, NotFittedError
from .likelihoods import Gaussian, Logistic, OrderedCategorical, Probit, Step, StudentT
from .persistence import load, save
from .progress import ProgressRecord

__all__ = [
    "__version__", "hyperpriors", "kernels", "likelihoods", "ConvergenceWarning", "NotFittedError", "MemoryLimitError",
    "Probit", "Step", "Logistic", "Gaussian", "OrderedCategorical", "StudentT",
    "LinearEPClassifier", "LinearEPRegressor", "LinearEPRankK",
    "GaussianProcessClassifier", "GaussianProcessRegressor",
    "IVMClassifier", "IVMRegressor", "IVMOrdinalRegressor", "get_include",
    "SparseGPClassifier", "SparseGPRegressor",
    "HorseshoeRegression", "MultiTaskHorseshoeRegression", "save", "load", "ProgressRecord", "show_versions",
]

#: Names imported from their module on first access: {name: module}.
_LAZY = {
    "GaussianProcessClassifier": "gp", "GaussianProcessRegressor": "gp",
    "HorseshoeRegression": "horseshoe", "MultiTaskHorseshoeRegression": "horseshoe",
    "IVMClassifier": "ivm", "IVMOrdinalRegressor": "ivm", "IVMRegressor": "ivm",
    "LinearEPClassifier": "linear", "LinearEPRegressor": "linear",
    "SparseGPClassifier": "sparse", "SparseGPRegressor": "sparse",
    "LinearEPRankK": "linear",
    "show_versions": "_show_versions",
}
#: Former names of public classes, imported with a ``FutureWarning``: {old name: module}.
_DEPRECATED = {"RankKEP": "linear"}
#: Public submodules that ``fastep.<name>`` imports on first access.
_SUBMODULES = ("batch", "cli", "datasets", "gp", "horseshoe", "ivm", "linear", "multioutput", "plotting",
               "reference", "sparse")

if TYPE_CHECKING:
    from ._show_versions import show_versions
    from .gp import GaussianProcessClassifier, GaussianProcessRegressor
    from .horseshoe import HorseshoeRegression, MultiTaskHorseshoeRegression
    from .ivm import IVMClassifier, IVMOrdinalRegressor, IVMRegressor
    from .linear import LinearEPClassifier, LinearEPRankK, LinearEPRegressor
    from .sparse import SparseGPClassifier, SparseGPRegressor

    __version__: str
else:
    def __getattr__(name):
        # The version is read from the installed metadata on first access, not at import; the
        # estimators' modules are imported on first use.
        if name == "__version__":
            from ._version import version
            return version()
        from importlib import import_module
        if name in _LAZY:
            value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
            globals()[name] = value
            return value
        if name in _DEPRECATED:                 # not cached: every use warns
            return import_module(f"{__name__}.{_DEPRECATED[name]}")._renamed_class(name)
        if name in _SUBMODULES:
            return import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'fastep' has no attribute {name!r}")

    def __dir__():
        return sorted(set(globals()) | set(__all__))
