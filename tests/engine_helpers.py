"""Function forms of the compiled engines, for tests that want one call per EP run.

The package's engines are classes (``HorseshoeEP(...).run()``); these helpers build the class
from plain arguments, run it and return what the tests compare.
"""
from __future__ import annotations

import numpy as np

from fastep._epcore.horseshoe_ep import HorseshoeEP, HorseshoeOptions, HorseshoePrior


def run_horseshoe_ep(X, y, sigma2, rho2, gamma2, P, D, *, sites=None, **options):
    """One horseshoe EP run from ``sites`` (default the cold start) with ``HorseshoeOptions(**options)``:
    ``(result, sites)``, the :class:`HorseshoeResult` and its returned sites as a dict."""
    engine = HorseshoeEP(X, y, sigma2, HorseshoePrior(rho2, gamma2, P, D), HorseshoeOptions(**options), sites)
    result = engine.run()
    return result, result.sites


def horseshoe_state(X, y, sigma2, rho2, gamma2, P, D, **sites):
    """The marginals, cavities, evidence pieces, gradients and prediction factors at the given sites
    (a run with ``max_iter=0``); unspecified site arrays are those of the cold start. Raises
    ``ValueError`` if the sites give an improper posterior or cavity."""
    d = np.shape(X)[1]
    start = {"pi_w": np.full(d, gamma2 / rho2), "h_w": np.zeros(d), "pi_u": np.zeros(d), "pi_v": np.zeros(d)}
    start.update(sites)
    return run_horseshoe_ep(X, y, sigma2, rho2, gamma2, P, D, sites=start, max_iter=0)[0]
