"""The few ``scipy.special`` functions fastep calls from Python, imported on first use.

``import fastep`` loads numpy, ``scipy.linalg`` and threadpoolctl only; ``scipy.special`` (and
what it pulls in) is imported the first time one of these is called. Each forwards to the
scipy function of the same name, so results are scipy's own.
"""

__all__ = ["expit", "logit", "ndtr", "ndtri"]


def expit(x):
    """``scipy.special.expit``: the logistic sigmoid 1 / (1 + exp(-x))."""
    from scipy.special import expit as function
    return function(x)


def logit(p):
    """``scipy.special.logit``: log(p / (1 - p))."""
    from scipy.special import logit as function
    return function(p)


def ndtr(x):
    """``scipy.special.ndtr``: the standard normal CDF."""
    from scipy.special import ndtr as function
    return function(x)


def ndtri(p):
    """``scipy.special.ndtri``: the inverse of the standard normal CDF."""
    from scipy.special import ndtri as function
    return function(p)
