"""Dense GP classification with EP: fastep side by side with its peers.

    python benchmarks/compare_gpc_peers.py [--sizes 500,1000,2000,4000] [--quick] [--skip-slow]

Run it with the interpreter of the benchmark environment, the one where the peers are
installed (see benchmarks/README.md: GPy, pyGPs and scikit-learn are benchmark-only).

Problem: the dense-GP toy (:func:`benchmark_problem`), RBF kernel with variance 1 and
length-scale 1 (k = exp(-r^2/2)), probit likelihood, hyperparameters fixed. Every
configuration runs in a fresh process (``--worker``) so that its peak memory can be read
from ``getrusage(RUSAGE_SELF).ru_maxrss``: a small warm-up fit first (lazy imports and
first-call costs), then the baseline, then the timed fits. Time is the median over
repeats (stopping early once ``--budget`` seconds are spent); memory is the peak resident
size above the baseline, also shown as a count of n x n float64 arrays.

Configurations:

* ``fastep-<schedule>``: ``fastep.GaussianProcessClassifier(kernel=RBF(variance=1,
  inverse_width=1), likelihood=Probit(), optimizer=None, schedule=<schedule>)`` for the
  sequential, blocked and parallel schedules, with one BLAS thread and with the default
  (threadpoolctl). Printed as 'unavailable' while ``fastep.GaussianProcessClassifier``
  does not exist.
* ``gpy-sequential`` / ``gpy-parallel``: ``GPy.core.GP`` with ``GPy.likelihoods.Bernoulli()``
  (probit link) and ``GPy.inference.latent_function_inference.EP(ep_mode='nested',
  parallel_updates=...)``; parallel with damping ``delta=0.5``. GPy's own defaults
  otherwise (convergence: mean squared site change < epsilon = 1e-6, random site order,
  seeded here). Building the model runs EP and the evidence gradients (GPy does both in
  ``parameters_changed``); that is what is timed.
* ``sklearn-laplace``: ``sklearn.gaussian_process.GaussianProcessClassifier`` with
  ``1.0 * RBF(1.0)`` fixed and ``optimizer=None``: Laplace's approximation with the
  *logistic* likelihood, so its log Z is a different number by construction (the
  baseline users would pick instead, not an EP implementation).
* ``pygps-ep``: ``pyGPs.GPC`` with a zero mean (pyGPs' GPC otherwise uses a constant
  mean equal to mean(y), a different model), ``cov.RBF(log_ell=0, log_sigma=0)``,
  ``getPosterior(der=False)``; pyGPs' EP is hard-coded to |d nlZ| < 1e-4, 2 to 10 sweeps.

Time is wall-clock; the cpu column is the process CPU time (all threads), which helps on a
shared machine: with one BLAS thread it is close to what the fit costs on an idle core.
Every configuration runs with one BLAS thread and with the default (``--peer-threads``
for the peers): when other work shares the 2 cores, OpenBLAS's default threads can be
more than ten times slower than one thread (measured here: scikit-learn at n = 1000,
0.66 s vs 10.5 s at load 3), so a single figure per peer would mostly measure the load.
The ratio column is the peer's time over the fastest fastep schedule at the same BLAS
setting and n; the target line at n = 2000 compares each side at its best setting. Figures
skipped with ``--skip-slow`` are replaced by the peer's figure measured earlier on this kind of
machine (:data:`QUOTED_FIGURES_N2000`) where there is one (marked 'quoted', on the
default-threads row). The machine is 2-core and noisy: read
ratios measured in one run, and the load printed with each configuration.
"""
import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

#: Log marginal likelihoods that GPML, GPy and pyGPs give on the benchmark problem.
EXPECTED_LOG_Z = {200: -63.81317, 1000: -237.4227, 2000: -407.0945}

#: Peer figures measured at n = 2000 on this kind of machine (2 cores), in seconds; quoted for the
#: configurations that ``--skip-slow`` skips.
QUOTED_FIGURES_N2000 = {"gpy-sequential": 345.0, "gpy-parallel": 7.0, "sklearn-laplace": 3.0, "gpml": 402.0}

#: Speed targets at n = 2000: peer time / fastest fastep time must reach these.
TARGETS_N2000 = {"gpy-sequential": 100.0, "gpy-parallel": 3.0, "sklearn-laplace": 1.0}

FASTEP_SCHEDULES = ("sequential", "blocked", "parallel")
PEERS = ("gpy-sequential", "gpy-parallel", "sklearn-laplace", "pygps-ep")
METHODS = tuple(f"fastep-{s}" for s in FASTEP_SCHEDULES) + PEERS

#: --skip-slow skips these above the given n (O(n^3) per sweep with large constants).
SLOW_ABOVE = {"gpy-sequential": 1000, "pygps-ep": 2000}

WARMUP_N = 40


def benchmark_problem(n):
    """The dense-GP toy: inputs uniform on [-3, 3]^2, labels of sin(1.5 x1) + 0.5 x2 plus noise, in {-1, +1}."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


# --------------------------------------------------------------------------- fit functions
# Each returns a callable fit(X, y) -> dict(log_z=..., sweeps=..., converged=...).

def _fastep_fitter(schedule):
    import fastep
    from fastep.kernels import RBF

    if not hasattr(fastep, "GaussianProcessClassifier"):
        raise _Unavailable("fastep.GaussianProcessClassifier does not exist yet")

    def fit(X, y):
        gpc = fastep.GaussianProcessClassifier(kernel=RBF(variance=1.0, inverse_width=1.0),
                                               likelihood=fastep.Probit(), optimizer=None, schedule=schedule)
        gpc.fit(X, y)
        return {"log_z": float(gpc.log_marginal_likelihood_value_), "sweeps": int(gpc.n_sweeps_),
                "converged": bool(gpc.converged_)}
    return fit


def _gpy_fitter(parallel, epsilon):
    import GPy
    from GPy.inference.latent_function_inference import EP

    class CountingEP(EP):
        # GPy keeps the sweep count local to expectation_propagation; count the sweeps here.
        sweeps = 0

        def _local_updates(self, *args, **kwargs):
            CountingEP.sweeps += 1
            return super()._local_updates(*args, **kwargs)

    def fit(X, y):
        np.random.seed(0)  # GPy visits the sites in np.random.permutation order every sweep
        CountingEP.sweeps = 0
        ep = CountingEP(epsilon=epsilon, ep_mode="nested", parallel_updates=parallel,
                        delta=0.5 if parallel else 1.0)
        model = GPy.core.GP(X, ((y + 1.0) / 2.0)[:, None],  # Bernoulli wants {0, 1}
                            kernel=GPy.kern.RBF(input_dim=X.shape[1], variance=1.0, lengthscale=1.0),
                            likelihood=GPy.likelihoods.Bernoulli(), inference_method=ep)
        return {"log_z": float(model.log_likelihood()), "sweeps": CountingEP.sweeps, "converged": None}
    return fit


def _sklearn_fitter():
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    def fit(X, y):
        gpc = GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(1.0), optimizer=None)
        gpc.fit(X, y)
        return {"log_z": float(gpc.log_marginal_likelihood_value_), "sweeps": None, "converged": None}
    return fit


def _pygps_fitter():
    import pyGPs

    def fit(X, y):
        model = pyGPs.GPC()
        model.setPrior(mean=pyGPs.mean.Zero(), kernel=pyGPs.cov.RBF(log_ell=0.0, log_sigma=0.0))
        model.setData(X, y[:, None])
        inf = model.inffunc
        count = [0]
        compute = inf._epComputeParams  # called once per sweep from a cold start

        def counting(*args, **kwargs):
            count[0] += 1
            return compute(*args, **kwargs)
        inf._epComputeParams = counting
        model.getPosterior(der=False)
        return {"log_z": -float(np.ravel(model.nlZ)[0]), "sweeps": count[0], "converged": None}
    return fit


class _Unavailable(Exception):
    pass


def make_fitter(method, gpy_epsilon=1e-6):
    if method.startswith("fastep-"):
        return _fastep_fitter(method[len("fastep-"):])
    if method in ("gpy-sequential", "gpy-parallel"):
        return _gpy_fitter(method == "gpy-parallel", gpy_epsilon)
    if method == "sklearn-laplace":
        return _sklearn_fitter()
    if method == "pygps-ep":
        return _pygps_fitter()
    raise ValueError(f"unknown method {method!r}")


# --------------------------------------------------------------------------- worker process

def _current_rss_kb():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_rss_kb():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024.0 if sys.platform == "darwin" else float(peak)  # bytes on macOS, KiB on Linux


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_worker(cfg):
    """One configuration in this (fresh) process; returns a JSON-able dict."""
    import warnings

    from threadpoolctl import threadpool_limits

    method, n, threads = cfg["method"], cfg["n"], cfg["threads"]
    out = {"method": method, "n": n, "threads": threads}
    try:
        fit = make_fitter(method, cfg.get("gpy_epsilon", 1e-6))
    except _Unavailable as exc:
        return dict(out, status="unavailable", reason=str(exc))
    except ModuleNotFoundError as exc:
        return dict(out, status="unavailable", reason=f"not installed: {exc}")
    except ImportError as exc:  # e.g. the editable fastep install failed to rebuild
        return dict(out, status="error", reason=f"import failed: {exc}")
    X, y = benchmark_problem(n)
    Xw, yw = benchmark_problem(WARMUP_N)
    limit = threadpool_limits(threads, "blas") if threads else _nothing()
    with limit, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(Xw, yw)
        gc.collect()
        baseline_kb = _current_rss_kb() or _peak_rss_kb()
        out["baseline_peak_mb"] = _peak_rss_kb() / 1024.0
        times, cpu_times, result = [], [], None
        spent = 0.0
        while len(times) < cfg["repeats"]:
            result = None
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            result = fit(X, y)
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            spent += times[-1]
            if spent > cfg["budget"]:
                break
    out.update(result)
    out.update(status="ok", time=float(np.median(times)), times=times, cpu_time=float(np.median(cpu_times)),
               peak_mb=max(0.0, _peak_rss_kb() - baseline_kb) / 1024.0)
    out["nxn_arrays"] = out["peak_mb"] * 1024.0 ** 2 / (8.0 * n * n)
    if hasattr(os, "getloadavg"):
        out["load1"] = os.getloadavg()[0]  # 1-minute load at the end: > 2 means the cores were shared
    return out


def spawn(cfg, timeout=None):
    """Run one configuration in a fresh interpreter (this one) and return its result dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(cfg, status="timeout", reason=f"over {timeout:.0f} s")
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return dict(cfg, status="error", reason=" | ".join(tail))


# --------------------------------------------------------------------------- reporting

def _fmt_time(r):
    if r.get("status") != "ok":
        return r.get("status", "?")
    return f"{r['time']:.3f}" if r["time"] < 100 else f"{r['time']:.1f}"


def _fmt(x, spec, missing="-"):
    return missing if x is None else format(x, spec)


def _versions():
    out = {}
    for name, mod in (("numpy", "numpy"), ("scipy", "scipy"), ("fastep", "fastep"), ("GPy", "GPy"),
                      ("pyGPs", "pyGPs"), ("scikit-learn", "sklearn")):
        try:
            from importlib.metadata import version
            out[name] = version(name)
        except Exception:
            out[name] = "not installed"
    return out


def print_header():
    from threadpoolctl import threadpool_info
    blas = [(i.get("internal_api"), i.get("num_threads"), i.get("architecture")) for i in threadpool_info()
            if i.get("user_api") == "blas"]
    print("# fastep dense GP peers: dense GP classification, probit, RBF(1, 1) fixed")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
          f" BLAS {blas}")
    print("# " + ", ".join(f"{k} {v}" for k, v in _versions().items()))
    if hasattr(os, "getloadavg"):  # other work on the 2 cores inflates every time below
        print("# load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


def _fastest_fastep(rows, threads="any"):
    fast = [r for r in rows if r["method"].startswith("fastep-") and r.get("status") == "ok"
            and (threads == "any" or (r["threads"] or None) == threads)]
    return min(fast, key=lambda r: r["time"]) if fast else None


def print_peer_table(n, rows):
    best_any = _fastest_fastep(rows)
    expected = EXPECTED_LOG_Z.get(n)
    print(f"\n## n = {n}" + (f"  (expected EP log Z {expected})" if expected is not None else ""))
    print(f"{'method':<18}{'BLAS':>8}{'time s':>10}{'cpu s':>9}{'reps':>5}{'log Z':>14}{'|dlogZ|':>10}{'sweeps':>7}"
          f"{'peak MB':>9}{'n x n':>7}{'peer/fastep':>15}")
    for r in rows:
        threads = r["threads"] or "default"
        best = _fastest_fastep(rows, r["threads"] or None)
        if r.get("status") == "ok":
            dz = abs(r["log_z"] - expected) if (expected is not None and not r["method"].startswith("sklearn")) \
                else None
            ratio = ""
            if best is not None and not r["method"].startswith("fastep-"):
                ratio = f"{r['time'] / best['time']:.1f}x"
            elif best is not None and r is best:
                ratio = "(fastest)" if r is best_any else "(fastest " + ("1)" if r["threads"] else "dflt)")
            cpu = r.get("cpu_time")
            cpu_spec = ".2f" if cpu is not None and cpu < 100 else ".0f"
            print(f"{r['method']:<18}{threads:>8}{_fmt_time(r):>10}{_fmt(cpu, cpu_spec):>9}"
                  f"{len(r['times']):>5}{r['log_z']:>14.6f}"
                  f"{_fmt(dz, '.1e'):>10}{_fmt(r.get('sweeps'), 'd'):>7}{r['peak_mb']:>9.1f}"
                  f"{r['nxn_arrays']:>7.1f}{ratio:>15}")
        elif r.get("status") == "skipped":
            quoted = r.get("quoted")
            note = "skipped (--skip-slow)"
            if quoted is not None:
                ratio = f"{quoted / best['time']:.0f}x" if best is not None else ""
                print(f"{r['method']:<18}{threads:>8}{quoted:>10.1f}{'':>14}{'quoted: earlier figure':>38}"
                      f"{'':>16}{ratio:>15}")
            else:
                print(f"{r['method']:<18}{threads:>8}  {note}")
        else:
            print(f"{r['method']:<18}{threads:>8}  {r.get('status')}: {r.get('reason', '')}")
    if n == 2000:
        notes = []
        for peer, target in TARGETS_N2000.items():
            times = [x["time"] if x.get("status") == "ok" else x.get("quoted") for x in rows if x["method"] == peer]
            times = [t for t in times if t is not None]
            if not times or best_any is None:
                continue
            ratio = min(times) / best_any["time"]
            notes.append(f"{peer} {ratio:.1f}x (target >= {target:g}x: {'met' if ratio >= target else 'NOT met'})")
        if notes:
            print("targets at n = 2000: " + "; ".join(notes))
        print("quoted peer figures at n = 2000 (2 cores): " +
              ", ".join(f"{k} {v:g} s" for k, v in QUOTED_FIGURES_N2000.items()))


def print_scaling(sizes, results, schedules=FASTEP_SCHEDULES):
    print(f"\n## fastep scaling (fit time s / sweeps / peak MB), n = {', '.join(map(str, sizes))}")
    print(f"{'schedule':<12}{'BLAS':>8}" + "".join(f"{'n=' + str(n):>24}" for n in sizes) + f"{'slope':>8}")
    for schedule in schedules:
        for threads in (1, None):
            cells, pts = [], []
            for n in sizes:
                r = results.get((f"fastep-{schedule}", n, threads))
                if r is None:
                    cells.append("-")
                elif r.get("status") == "ok":
                    cells.append(f"{_fmt_time(r)} / {r['sweeps']} / {r['peak_mb']:.0f}")
                    pts.append((n, r["time"]))
                else:
                    cells.append(r.get("status", "?"))
            slope = ""
            if len(pts) >= 2:  # log-log slope of time vs n over the measured sizes
                slope = f"{np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0]:.2f}"
            print(f"{schedule:<12}{threads or 'default':>8}" + "".join(f"{c:>24}" for c in cells) + f"{slope:>8}")


# --------------------------------------------------------------------------- main

def _parse_sizes(text):
    return sorted({int(s) for s in text.split(",") if s.strip()})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_parse_sizes, default=None,
                        help="comma-separated n for the side-by-side tables (default 500,1000,2000,4000)")
    parser.add_argument("--scaling-sizes", type=_parse_sizes, default=None,
                        help="n for the fastep scaling table (default 500,1000,2000,4000)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: n = 200, 500; 2 repeats; implies --skip-slow")
    parser.add_argument("--skip-slow", action="store_true",
                        help=f"skip GPy sequential EP above n = {SLOW_ABOVE['gpy-sequential']} and pyGPs above "
                             f"n = {SLOW_ABOVE['pygps-ep']} (quoting the earlier figure where there is one)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--no-peers", action="store_true", help="fastep rows and the scaling table only")
    parser.add_argument("--no-scaling", action="store_true", help="skip the fastep scaling table")
    parser.add_argument("--peer-threads", default="1,default",
                        help="BLAS thread settings for the peers: '1', 'default' or '1,default'")
    parser.add_argument("--repeats", type=int, default=5, help="maximum timed fits per configuration (median)")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="stop repeating a configuration once this many seconds are spent on it")
    parser.add_argument("--timeout", type=float, default=None, help="kill a configuration after this many s")
    parser.add_argument("--gpy-epsilon", type=float, default=1e-6,
                        help="GPy EP convergence threshold (GPy's default 1e-6)")
    parser.add_argument("--json", default=None, help="also write every result to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker is not None:
        print("RESULT " + json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return

    if args.quick:
        args.skip_slow = True
        args.repeats = min(args.repeats, 2)
    sizes = args.sizes or ([200, 500] if args.quick else [500, 1000, 2000, 4000])
    scaling_sizes = [] if args.no_scaling else (args.scaling_sizes or ([200, 500] if args.quick
                                                                      else [500, 1000, 2000, 4000]))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {','.join(METHODS)}")
    peer_threads = tuple(None if t.strip() == "default" else int(t) for t in args.peer_threads.split(","))
    if args.no_peers:
        methods = [m for m in methods if m.startswith("fastep-")]

    print_header()
    results = {}

    def run(method, n, threads):
        key = (method, n, threads)
        if key not in results:
            cfg = {"method": method, "n": n, "threads": threads, "repeats": args.repeats, "budget": args.budget,
                   "gpy_epsilon": args.gpy_epsilon}
            if args.skip_slow and n > SLOW_ABOVE.get(method, n):
                r = dict(cfg, status="skipped")
                if n == 2000 and method in QUOTED_FIGURES_N2000 and threads is None:
                    r["quoted"] = QUOTED_FIGURES_N2000[method]
            else:
                r = spawn(cfg, args.timeout)
            results[key] = r
            print(f"  ... {method} n={n} BLAS={threads or 'default'}: {_fmt_time(r)}"
                  + (f" s, log Z {r['log_z']:.6f}, load {r.get('load1', float('nan')):.1f}" if r.get("status") == "ok"
                     else ""), file=sys.stderr, flush=True)
        return results[key]

    for n in sizes:
        rows = []
        for method in methods:
            thread_settings = (1, None) if method.startswith("fastep-") else peer_threads
            for threads in thread_settings:
                rows.append(run(method, n, threads))
        print_peer_table(n, rows)

    fastep_methods = [m for m in methods if m.startswith("fastep-")]
    if scaling_sizes and fastep_methods:
        for n in scaling_sizes:
            for method in fastep_methods:
                for threads in (1, None):
                    run(method, n, threads)
        print_scaling(scaling_sizes, results, [m[len("fastep-"):] for m in fastep_methods])

    if args.json:
        with open(args.json, "w") as fh:
            json.dump([dict(r, key=list(k)) for k, r in results.items()], fh, indent=1)


if __name__ == "__main__":
    main()
