"""Estimator options declared once: a table of constraints per estimator and one function that
checks them (the role of scikit-learn's ``_parameter_constraints``).

Each estimator lists its options as ``{name: constraint}``; :func:`validate_params` checks every
one at ``fit`` (a ``ValueError`` or ``TypeError`` naming the option and what was expected) and
returns the checked values. Options whose default depends on another option (``damping=None``)
are resolved by the estimator from the checked values.
"""
import math

import numpy as np

from . import _validation as v

__all__ = ["Choice", "Interval", "Integer", "Positive", "Boolean", "Seed", "Custom", "validate_params"]


class Choice:
    """One of the keys of ``options`` (a dict or a tuple of strings)."""

    def __init__(self, options):
        self.options = options

    def check(self, value, name):
        v.check_choice(value, name, self.options)
        return value


class Interval:
    """A real number in ``[low, high]`` (ends open where not inclusive); None allowed with ``allow_none``."""

    def __init__(self, low, high, *, low_inclusive=True, high_inclusive=True, finite=False, allow_none=False):
        self.low, self.high = low, high
        self.low_inclusive, self.high_inclusive = low_inclusive, high_inclusive
        self.finite, self.allow_none = finite, allow_none

    def check(self, value, name):
        if value is None and self.allow_none:
            return None
        value = v.check_in_range(value, name, self.low, self.high, low_inclusive=self.low_inclusive,
                                 high_inclusive=self.high_inclusive)
        if self.finite and not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        return value


class Integer:
    """An integer at least ``minimum`` (and at most ``maximum``); None allowed with ``allow_none``."""

    def __init__(self, minimum=None, maximum=None, *, allow_none=False):
        self.minimum, self.maximum, self.allow_none = minimum, maximum, allow_none

    def check(self, value, name):
        if value is None and self.allow_none:
            return None
        value = v.check_int(value, name, minimum=self.minimum)
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"{name} must be <= {self.maximum}, got {value}")
        return value


class Positive:
    """A finite real number > 0."""

    def check(self, value, name):
        return v.check_positive(value, name)


class Boolean:
    """True or False, or one of the strings in ``also`` (e.g. ``'auto'``)."""

    def __init__(self, *, also=()):
        self.also = tuple(also)

    def check(self, value, name):
        if isinstance(value, str) and value in self.also:
            return value
        if self.also and not isinstance(value, (bool, np.bool_)):
            choices = ", ".join(repr(a) for a in self.also)
            raise TypeError(f"{name} must be True, False or {choices}, got {value!r}")
        v.check_bool(value, name)
        return bool(value)


class Seed:
    """None, an int seed or a ``numpy.random.Generator`` (``random_state``); returns the seed."""

    def check(self, value, name):
        return v.check_seed(value, name)


class Custom:
    """A check function ``func(value) -> checked value`` that names the option in its errors."""

    def __init__(self, func):
        self.func = func

    def check(self, value, name):
        return self.func(value)


def validate_params(estimator, constraints):
    """Check the options of ``estimator`` named in ``constraints``; returns ``{name: checked value}``."""
    return {name: constraint.check(getattr(estimator, name), name) for name, constraint in constraints.items()}
