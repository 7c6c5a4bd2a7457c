"""Time of ``import fastep`` against ``import numpy, scipy.linalg`` in fresh processes.

Each statement runs in a new interpreter (``python -c``), alternating, ``--repeat`` times; the
medians and their ratio are printed. The target is fastep ≤ 1.3× numpy + scipy.linalg (fastep's
own import is then its compiled site modules and Python modules; the estimators' modules with
their compiled engines, threadpoolctl, scipy.optimize, scipy.special, dask, matplotlib and pandas
load on first use). The fourth row, an estimator imported from fastep, is what a script that
fits a model pays before fitting. The last two rows time fastep's own share alone, after numpy
and scipy.linalg are loaded in the same process: on a busy machine the difference between two
whole imports drowns in the noise, this share does not.

Measure a wheel install (an editable install adds meson's rebuild check to every import);
``--python`` times another interpreter's fastep:

    python benchmarks/import_time.py --repeat 10
    python benchmarks/import_time.py --repeat 10 --python /path/to/wheel-venv/bin/python
"""
import argparse
import os
import statistics
import subprocess
import sys

#: name -> (untimed setup, timed statement), each run in a fresh interpreter
STATEMENTS = {"numpy + scipy.linalg": ("pass", "import numpy, scipy.linalg"),
              "numpy + scipy.linalg + threadpoolctl": ("pass", "import numpy, scipy.linalg, threadpoolctl"),
              "fastep": ("pass", "import fastep"),
              "fastep + GaussianProcessClassifier": ("pass", "from fastep import GaussianProcessClassifier"),
              # fastep's own share: timed after numpy and scipy.linalg are loaded (less noisy on a
              # busy machine than the difference of two whole imports)
              "fastep's own (numpy, scipy.linalg loaded)": ("import numpy, scipy.linalg", "import fastep"),
              "same + GaussianProcessClassifier": ("import numpy, scipy.linalg",
                                                   "from fastep import GaussianProcessClassifier")}
BASE = "numpy + scipy.linalg"
TARGET = 1.3
TIMER = ("{setup}; import time; t = time.perf_counter(); {statement}; "
         "print(time.perf_counter() - t)")


def measure(repeat, python=sys.executable):
    """``{name: [seconds of each round]}``: every statement once per round, in fresh processes."""
    times = {name: [] for name in STATEMENTS}
    for setup, statement in STATEMENTS.values():       # warm the file cache once
        subprocess.run([python, "-c", f"{setup}; {statement}"], check=True)
    for _ in range(repeat):
        for name, (setup, statement) in STATEMENTS.items():
            out = subprocess.run([python, "-c", TIMER.format(setup=setup, statement=statement)],
                                 check=True, capture_output=True, text=True).stdout
            times[name].append(float(out))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="fresh processes per statement (default 10)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time (default: this one)")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    times = measure(args.repeat, python=args.python)
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians[BASE]
    print(f"medians of {args.repeat} fresh processes ({args.python}; load average {load:.1f} before)")
    for name, value in medians.items():
        print(f"{name:42s} {1e3 * value:8.1f} ms   {value / base:5.2f}x")
    ratio = medians["fastep"] / base
    per_round = statistics.median(f / b for f, b in zip(times["fastep"], times[BASE]))
    own = 1.0 + medians["fastep's own (numpy, scipy.linalg loaded)"] / base
    print(f"import fastep / import numpy, scipy.linalg = {ratio:.2f} "
          f"({'within' if ratio <= TARGET else 'above'} the target {TARGET}); median of the rounds' "
          f"ratios {per_round:.2f}; 1 + own share / numpy + scipy.linalg = {own:.2f}")


if __name__ == "__main__":
    main()
