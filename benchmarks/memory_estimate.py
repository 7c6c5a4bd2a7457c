"""The dense GP's memory estimate (``fastep._memory.dense_gp_bytes``) against measured peak RSS.

Each fit runs in a fresh process; the peak resident memory it adds (``ru_maxrss`` after the fit
less before it, the data already in memory) is compared with the estimate the estimator checks
before allocating. Prints n, the model, measured and estimated MiB and their ratio.

    python benchmarks/memory_estimate.py                       # fixed and learnt kernels
    python benchmarks/memory_estimate.py --sizes 1500 2500 3500 --models fixed
"""
import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, warnings
import numpy as np, fastep
from fastep import _memory
n, model = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
X = rng.normal(size=(n, 5)); f = np.sin(X[:, 0]) + X[:, 1]
yb = np.where(f + 0.3 * rng.normal(size=n) > 0, 1, 0)
y3 = np.digitize(f, [-0.5, 0.5])
make = {
    "fixed": (lambda: fastep.GaussianProcessClassifier(optimizer=None), yb, dict(learning=False)),
    "learnt": (lambda: fastep.GaussianProcessClassifier(), yb, dict(learning=True)),
    "regressor": (lambda: fastep.GaussianProcessRegressor(), f, dict(learning=True)),
    "3-class multinomial fixed": (lambda: fastep.GaussianProcessClassifier(multi_class="multinomial",
                                                                           optimizer=None), y3,
                                  dict(learning=False, n_classes_multinomial=3)),
    "3-class ovr fixed": (lambda: fastep.GaussianProcessClassifier(optimizer=None), y3,
                          dict(learning=False, n_problems=3)),
}
build, y, shape = make[model]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    build().fit(X, y)
used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(json.dumps({"used": used, "estimate": _memory.dense_gp_bytes(n, **shape)}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 3000])
    parser.add_argument("--models", nargs="+", default=["fixed", "learnt", "regressor", "3-class ovr fixed"])
    args = parser.parse_args()
    print(f"{'model':20s} {'n':>6s} {'measured MiB':>13s} {'estimate MiB':>13s} {'estimate/measured':>18s}")
    for model in args.models:
        for n in args.sizes:
            out = subprocess.run([sys.executable, "-c", CHILD, str(n), model], check=True,
                                 capture_output=True, text=True).stdout
            record = json.loads(out.strip().splitlines()[-1])
            print(f"{model:20s} {n:6d} {record['used'] / 2 ** 20:13.1f} {record['estimate'] / 2 ** 20:13.1f} "
                  f"{record['estimate'] / record['used']:18.2f}", flush=True)


if __name__ == "__main__":
    main()
