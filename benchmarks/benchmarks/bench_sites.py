"""asv: throughput of the vectorised likelihood site kernels (compiled vs reference twin)."""
import numpy as np

from fastep import Gaussian, Logistic, OrderedCategorical, Probit, Step
from fastep.reference import sites as ref

_N = 1_000_000
_LIKELIHOODS = {
    "probit": (lambda: Probit(slope=2.0, bias=0.1), lambda y, m, v: ref.probit_moments(y, m, v, 2.0, 0.1)),
    "step": (lambda: Step(flip_noise=0.05), lambda y, m, v: ref.step_moments(y, m, v, 0.05)),
    "logistic_mackay": (lambda: Logistic(method="mackay"), lambda y, m, v: ref.logistic_mackay_moments(y, m, v)),
    "logistic_gh": (lambda: Logistic(method="gauss-hermite", n_nodes=20),
                    lambda y, m, v: ref.logistic_gh_moments(y, m, v, 20)),
    "gaussian": (lambda: Gaussian(noise_variance=0.5), lambda y, m, v: ref.gaussian_moments(y, m, v, 0.5)),
}


def _inputs(name, n):
    rng = np.random.default_rng(0)
    mean = rng.normal(scale=2.0, size=n)
    var = rng.uniform(0.05, 3.0, size=n)
    if name == "gaussian":
        y = rng.normal(size=n)
    else:
        y = np.where(rng.uniform(size=n) < 0.5, -1.0, 1.0)
    return y, mean, var


class SiteKernels:
    params = [list(_LIKELIHOODS)]
    param_names = ["likelihood"]

    def setup(self, name):
        self.likelihood = _LIKELIHOODS[name][0]()
        self.y, self.mean, self.var = _inputs(name, _N)

    def time_compiled(self, name):
        self.likelihood.moments(self.y, self.mean, self.var)


class SiteKernelsOrdinal:
    def setup(self):
        self.likelihood = OrderedCategorical(5, slope=2.0, bias=-1.0, widths=[0.7, 0.6, 0.8])
        rng = np.random.default_rng(1)
        self.y = rng.integers(0, 5, size=_N).astype(float)
        self.mean = rng.normal(size=_N)
        self.var = rng.uniform(0.05, 3.0, size=_N)

    def time_compiled(self):
        self.likelihood.moments(self.y, self.mean, self.var)


class SiteKernelsStudentT:
    """Powered Student-t sites (panel quadrature per site; outliers in 10 % of the targets)."""
    params = [[1.0, 0.5]]
    param_names = ["power"]

    def setup(self, power):
        from fastep import StudentT
        self.likelihood = StudentT(dof=4.0, scale=0.3)
        rng = np.random.default_rng(2)
        n = 20_000
        self.mean = rng.normal(size=n)
        self.var = rng.uniform(0.01, 3.0, size=n)
        self.y = self.mean + 0.3 * rng.standard_normal(n)
        self.y[rng.random(n) < 0.1] += 5.0

    def time_compiled(self, power):
        self.likelihood.powered_moments(self.y, self.mean, self.var, power)
