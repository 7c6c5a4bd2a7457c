"""Estimator plumbing shared by every fastep model (scikit-learn conventions, no dependency on it)."""
import inspect

import numpy as np

from .exceptions import NotFittedError

__all__ = ["BaseEstimator", "check_is_fitted", "one_vs_rest_proba"]


class BaseEstimator:
    """Minimal scikit-learn-compatible base: ``get_params``, ``set_params``, ``repr``.

    Constructor arguments are stored unchanged as attributes of the same name
    and validated in ``fit`` (as scikit-learn requires); fitted attributes end
    in an underscore.
    """

    @classmethod
    def _param_names(cls):
        sig = inspect.signature(cls.__init__)
        return sorted(
            name for name, p in sig.parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def get_params(self, deep=True):
        """Return the constructor parameters as a dict (nested ones as ``name__sub`` when ``deep``)."""
        out = {}
        for name in self._param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                for sub_name, sub_value in value.get_params().items():
                    out[f"{name}__{sub_name}"] = sub_value
            out[name] = value
        return out

    def set_params(self, **params):
        """Set constructor parameters; returns ``self``. Unknown names raise ``ValueError``."""
        valid = set(self._param_names())
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"invalid parameter {name!r} for {type(self).__name__}; "
                    f"valid parameters are {sorted(valid)}")
            if sub:
                getattr(self, name).set_params(**{sub: value})
            else:
                setattr(self, name, value)
        return self

    def __repr__(self):
        defaults = {
            name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()
        }
        parts = []
        for name in self._param_names():
            value = getattr(self, name)
            default = defaults.get(name, inspect.Parameter.empty)
            try:
                same = value is default or (type(value) is type(default) and value == default)
            except Exception:  # arrays and other objects without a scalar ==
                same = False
            if not same:
                parts.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


def check_is_fitted(estimator, attribute):
    """Raise :class:`NotFittedError` unless ``estimator`` has the fitted ``attribute``."""
    if not hasattr(estimator, attribute):
        raise NotFittedError(
            f"this {type(estimator).__name__} instance is not fitted yet; call 'fit' first")


def one_vs_rest_proba(problems, X):
    """Class probabilities from fitted binary problems (each with ``latent(X)`` and ``likelihood``).

    One problem: columns ``(1 - p, p)`` with ``p = ∫ t(f) N(f; μ*, σ*²) df`` from the
    likelihood's ``predictive``. Several (one-vs-rest): each class's binary predictive,
    normalised to sum to one.
    """
    p = np.column_stack([prob.likelihood.predictive(*prob.latent(X)) for prob in problems])
    if p.shape[1] == 1:
        return np.column_stack([1.0 - p[:, 0], p[:, 0]])
    total = p.sum(axis=1, keepdims=True)
    return p / np.where(total > 0, total, 1.0)
