"""Memory estimates (``fastep._memory``: dense, Student-t, sparse, IVM) against measured peak RSS.

Each fit runs in a fresh process (Linux); the peak resident memory it adds (the peak ``VmHWM``,
reset through ``/proc/self/clear_refs`` just before the fit, less the resident size then, the
data already in memory) is compared with the estimate the estimator checks before allocating.
Prints the model, n, the width (m inducing inputs or d active points), measured and estimated
MiB and their ratio.

    python benchmarks/memory_estimate.py                       # dense: fixed and learnt kernels
    python benchmarks/memory_estimate.py --sizes 1500 2500 3500 --models fixed
    python benchmarks/memory_estimate.py --models sparse "sparse learnt" ivm "ivm learnt" \
        --sizes 10000 20000 --width 200

``--refusal`` measures instead how long a dense fit far beyond the memory limit takes to be
refused (``tests/test_memory.py`` checks that it is refused with ``MemoryLimitError`` before
anything is allocated; it no longer times it): ``GaussianProcessClassifier().fit`` at
n = 40 000 (5 features) under a 4 GiB address-space limit (``RLIMIT_AS``), a fresh process per
run; prints the median, smallest and largest seconds from the call of ``fit`` to the
``MemoryLimitError`` and the peak resident memory the refused fit added.

    python benchmarks/memory_estimate.py --refusal --repeats 9
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys, warnings
import numpy as np, fastep
from fastep import _memory


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


n, width, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
X = rng.normal(size=(n, 5)); f = np.sin(X[:, 0]) + X[:, 1]
yb = np.where(f + 0.3 * rng.normal(size=n) > 0, 1, 0)
y3 = np.digitize(f, [-0.5, 0.5])
dense = _memory.dense_gp_bytes
make = {
    "fixed": (lambda: fastep.GaussianProcessClassifier(optimizer=None), yb, lambda: dense(n, learning=False)),
    "learnt": (lambda: fastep.GaussianProcessClassifier(), yb, lambda: dense(n, learning=True)),
    "regressor": (lambda: fastep.GaussianProcessRegressor(), f, lambda: dense(n, learning=True)),
    "3-class multinomial fixed": (
        lambda: fastep.GaussianProcessClassifier(multi_class="multinomial", optimizer=None), y3,
        lambda: dense(n, learning=False, n_classes_multinomial=3)),
    "3-class ovr fixed": (lambda: fastep.GaussianProcessClassifier(optimizer=None), y3,
                          lambda: dense(n, learning=False, n_problems=3)),
    "student_t": (lambda: fastep.GaussianProcessRegressor(likelihood="student_t", optimizer=None), f,
                  lambda: _memory.student_t_gp_bytes(n, learning=False)),
    "student_t learnt": (lambda: fastep.GaussianProcessRegressor(likelihood="student_t"), f,
                         lambda: _memory.student_t_gp_bytes(n, learning=True)),
    "sparse": (lambda: fastep.SparseGPClassifier(n_inducing=width, optimizer=None), yb,
               lambda: _memory.sparse_gp_bytes(n, width, learning=False, kmeans=False)),
    "sparse learnt": (lambda: fastep.SparseGPClassifier(n_inducing=width), yb,
                      lambda: _memory.sparse_gp_bytes(n, width, learning=True)),
    "ivm": (lambda: fastep.IVMClassifier(active_set_size=width, optimizer=None), yb,
            lambda: _memory.ivm_bytes(n, width, learning=False)),
    "ivm learnt": (lambda: fastep.IVMClassifier(active_set_size=width, n_iterations=1), yb,
                   lambda: _memory.ivm_bytes(n, width, learning=True)),
}
build, y, estimate = make[model]
estimator = build()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    estimator.fit(X, y)
print(json.dumps({"used": status("VmHWM") - before, "estimate": estimate()}))
"""


REFUSAL = """
import json, resource, time, numpy as np, fastep


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


resource.setrlimit(resource.RLIMIT_AS, (4 * 1024 ** 3, 4 * 1024 ** 3))
X = np.random.default_rng(0).normal(size=(40000, 5)); y = (X[:, 0] > 0).astype(int)
model = fastep.GaussianProcessClassifier()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
start = time.perf_counter()
try:
    model.fit(X, y)
except fastep.MemoryLimitError as error:
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "added": status("VmHWM") - before, "estimate": error.estimate,
                      "limit": error.limit}))
"""


def refusal(repeats):
    seconds, added = [], []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", REFUSAL], check=True, capture_output=True, text=True).stdout
        record = json.loads(out.strip().splitlines()[-1])
        seconds.append(record["seconds"])
        added.append(record["added"])
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"GaussianProcessClassifier().fit, n = 40000, RLIMIT_AS 4 GiB: MemoryLimitError after "
          f"{statistics.median(seconds) * 1e3:.1f} ms (median of {repeats}; {min(seconds) * 1e3:.1f}-"
          f"{max(seconds) * 1e3:.1f} ms); estimate {record['estimate'] / 2 ** 30:.1f} GiB, limit "
          f"{record['limit'] / 2 ** 30:.1f} GiB; peak RSS added {statistics.median(added) / 2 ** 20:.1f} MiB (median)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 3000])
    parser.add_argument("--models", nargs="+", default=["fixed", "learnt", "regressor", "3-class ovr fixed"])
    parser.add_argument("--width", type=int, default=200, help="m inducing inputs / d active points")
    parser.add_argument("--refusal", action="store_true", help="time the refusal of a fit beyond the limit instead")
    parser.add_argument("--repeats", type=int, default=9, help="fresh processes for --refusal")
    args = parser.parse_args()
    if args.refusal:
        refusal(args.repeats)
        return
    print(f"{'model':26s} {'n':>6s} {'width':>6s} {'measured MiB':>13s} {'estimate MiB':>13s} {'estimate/measured':>18s}")
    for model in args.models:
        for n in args.sizes:
            out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(args.width), model], check=True,
                                 capture_output=True, text=True).stdout
            record = json.loads(out.strip().splitlines()[-1])
            print(f"{model:26s} {n:6d} {args.width:6d} {record['used'] / 2 ** 20:13.1f} {record['estimate'] / 2 ** 20:13.1f} "
                  f"{record['estimate'] / record['used']:18.2f}", flush=True)


if __name__ == "__main__":
    main()
