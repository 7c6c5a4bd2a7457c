"""How fast type-II ML learns, beside scikit-learn, on the dense-GP toy (n = 2000 by default).

Runs in one process, one after another:

- fastep ``GaussianProcessClassifier()`` (data-aware RBF start, the default hyperprior, EP to
  ``tol`` during the search), the same with ``hyperprior=None`` (type-II ML), with the search's
  EP at 1e-2 (the behaviour before), and started from ``RBF(1, 1)``: fit time, evidence
  evaluations, EP sweeps, time per evaluation, learnt kernel, log evidence, test error on 2000
  new points;
- scikit-learn ``GaussianProcessClassifier(C(1.0) * RBF(1.0))`` (Laplace, learnt);
- fastep ``SparseGPClassifier()`` (m = 50, fixed k-means++ inducing inputs: the default) and
  with ``learn_inducing=True``.

    python benchmarks/learning_speed.py
    python benchmarks/learning_speed.py --n 1000 --skip-sklearn
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_gpc_peers import benchmark_problem  # noqa: E402

from fastep import GaussianProcessClassifier, SparseGPClassifier  # noqa: E402
from fastep._dense import problem as _dense  # noqa: E402
from fastep.kernels import RBF  # noqa: E402


class CountingEvaluations:
    """Counts the dense problem's evidence evaluations, their EP sweeps and time."""

    def __enter__(self):
        self.evaluations, self.sweeps, self.seconds = 0, 0, 0.0
        self._original = _dense.DenseGPProblem.evaluate
        counter = self

        def evaluate(problem, params, **kwargs):
            start = time.perf_counter()
            result = counter._original(problem, params, **kwargs)
            counter.seconds += time.perf_counter() - start
            counter.evaluations += 1
            counter.sweeps += result[2].n_sweeps
            return result

        _dense.DenseGPProblem.evaluate = evaluate
        return self

    def __exit__(self, *exc):
        _dense.DenseGPProblem.evaluate = self._original


def timed_fit(model, X, y, Xt, yt):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        model.fit(X, y)
        seconds = time.perf_counter() - start
    return seconds, float(np.mean(model.predict(Xt) != yt)), [str(w.message)[:100] for w in caught]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--skip-sklearn", action="store_true")
    args = parser.parse_args()
    X_all, y_all = benchmark_problem(args.n + 2000)
    X, y = benchmark_problem(args.n)
    Xt, yt = X_all[args.n:], y_all[args.n:]
    print(f"dense-GP toy, n = {args.n}, test on 2000 new points")
    variants = [("fastep GPC default", {}, _dense.DenseGPProblem.search_tol),
                ("fastep GPC, hyperprior=None", {"hyperprior": None}, _dense.DenseGPProblem.search_tol),
                ("fastep GPC, search EP to 1e-2", {}, 1e-2),
                ("fastep GPC, RBF(1, 1) start", {"kernel": RBF(1.0, 1.0)}, _dense.DenseGPProblem.search_tol)]
    default_search_tol = _dense.DenseGPProblem.search_tol
    for label, kwargs, search_tol in variants:
        _dense.DenseGPProblem.search_tol = search_tol
        try:
            with CountingEvaluations() as count:
                model = GaussianProcessClassifier(**kwargs)
                seconds, error, notes = timed_fit(model, X, y, Xt, yt)
        finally:
            _dense.DenseGPProblem.search_tol = default_search_tol
        print(f"{label:32s} fit {seconds:6.1f} s, {count.evaluations} evaluations, {count.sweeps} sweeps, "
              f"{count.seconds / max(count.evaluations, 1):.2f} s/evaluation, {model.kernel_}, "
              f"log evidence {model.log_marginal_likelihood_value_:.4f}, test error {100 * error:.2f} % {notes}",
              flush=True)
    if not args.skip_sklearn:
        from sklearn.gaussian_process import GaussianProcessClassifier as SklearnGPC
        from sklearn.gaussian_process.kernels import RBF as SklearnRBF, ConstantKernel
        model = SklearnGPC(ConstantKernel(1.0) * SklearnRBF(1.0))
        seconds, error, notes = timed_fit(model, X, y, Xt, yt)
        print(f"{'sklearn GPC C(1) * RBF(1)':32s} fit {seconds:6.1f} s, {model.kernel_}, "
              f"test error {100 * error:.2f} % {notes}", flush=True)
    for label, kwargs in [("fastep SparseGPClassifier()", {}),
                          ("... learn_inducing=True", {"learn_inducing": True})]:
        model = SparseGPClassifier(**kwargs)
        seconds, error, notes = timed_fit(model, X, y, Xt, yt)
        print(f"{label:32s} fit {seconds:6.1f} s, {model.kernel_}, log evidence "
              f"{model.log_marginal_likelihood_value_:.4f}, test error {100 * error:.2f} % {notes}", flush=True)


if __name__ == "__main__":
    main()
