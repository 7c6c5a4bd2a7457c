"""Time of ``import fastep`` against ``import numpy, scipy.linalg`` in fresh processes.

Each statement runs in a new interpreter (``python -c``), alternating, ``--repeat`` times; the
medians and their ratio are printed. The target is fastep ≤ 1.3× numpy + scipy.linalg (fastep's
own import is then its compiled modules and Python modules; scipy.optimize, scipy.special,
dask, matplotlib and pandas load on first use).

    python benchmarks/import_time.py --repeat 10
"""
import argparse
import statistics
import subprocess
import sys

STATEMENTS = {"numpy + scipy.linalg": "import numpy, scipy.linalg",
              "numpy + scipy.linalg + threadpoolctl": "import numpy, scipy.linalg, threadpoolctl",
              "fastep": "import fastep"}
TIMER = ("import time; t = time.perf_counter(); {statement}; "
         "print(time.perf_counter() - t)")


def measure(repeat, python=sys.executable):
    times = {name: [] for name in STATEMENTS}
    for name, statement in STATEMENTS.items():        # warm the file cache once
        subprocess.run([python, "-c", statement], check=True)
    for _ in range(repeat):
        for name, statement in STATEMENTS.items():
            out = subprocess.run([python, "-c", TIMER.format(statement=statement)], check=True,
                                 capture_output=True, text=True).stdout
            times[name].append(float(out))
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    medians = measure(args.repeat)
    base = medians["numpy + scipy.linalg"]
    for name, value in medians.items():
        print(f"{name:40s} {1e3 * value:8.1f} ms   {value / base:5.2f}x")


if __name__ == "__main__":
    main()
