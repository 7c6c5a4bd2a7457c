"""Side-by-side speed ratios of the compiled kernels against their reference twins and bare BLAS, measured in one run.

    python benchmarks/compare_reference.py [--quick]

1. Site kernels: compiled vs the ``fastep.reference.sites`` twin on 10^6 sites
   (target: >= 10x the twin's throughput). The "ceiling" column divides the
   twin's time by a memory floor -- reading the three inputs and writing three
   fresh outputs with no special function at all -- i.e. the largest ratio any
   implementation that returns new arrays can reach on this machine.
2. One EP sweep over n = 10 000 sites at d = 10: compiled vs the
   ``fastep.reference.linear_ep`` twin (target: >= 20x).
3. One EP sweep over n = 10 000 sites at d = 1000 vs n bare rank-1 BLAS updates
   (dsyr) of a d x d matrix (target: <= 1.5x).
Sections 2-3 run with one BLAS thread and with the default number of threads
(threadpoolctl). Times are medians of repeats; the machine is noisy, so read
ratios, not absolute times.
"""
import argparse
import platform
import time

import numpy as np

from fastep import Gaussian, Logistic, OrderedCategorical, Probit, Step
from fastep._epcore import _bench, linear_ep, sites
from fastep.reference import linear_ep as ref_linear_ep
from fastep.reference import sites as ref_sites

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # pragma: no cover
    raise SystemExit("benchmarks need threadpoolctl: pip install -r benchmarks/requirements.txt")


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def site_kernel_cases(n):
    rng = np.random.default_rng(0)
    mean = rng.normal(scale=2.0, size=n)
    var = rng.uniform(0.05, 3.0, size=n)
    ypm = np.where(rng.uniform(size=n) < 0.5, -1.0, 1.0)
    yreal = rng.normal(size=n)
    yord = rng.integers(0, 5, size=n).astype(float)
    widths = [0.7, 0.6, 0.8]
    return [
        ("probit", Probit(slope=2.0, bias=0.1), ypm, lambda: ref_sites.probit_moments(ypm, mean, var, 2.0, 0.1)),
        ("step eps=0.05", Step(flip_noise=0.05), ypm, lambda: ref_sites.step_moments(ypm, mean, var, 0.05)),
        ("logistic MacKay", Logistic(method="mackay"), ypm,
         lambda: ref_sites.logistic_mackay_moments(ypm, mean, var)),
        ("logistic GH-20", Logistic(method="gauss-hermite", n_nodes=20), ypm,
         lambda: ref_sites.logistic_gh_moments(ypm, mean, var, 20)),
        ("gaussian", Gaussian(noise_variance=0.5), yreal,
         lambda: ref_sites.gaussian_moments(yreal, mean, var, 0.5)),
        ("ordinal C=5", OrderedCategorical(5, slope=2.0, bias=-1.0, widths=widths), yord,
         lambda: ref_sites.ordinal_moments(yord, mean, var, 2.0, -1.0, widths)),
    ], mean, var


def _streaming_floor(y, mean, var):
    """What every site kernel must do at least: read y, mean, var once and write
    three freshly allocated output arrays (one cheap flop per element)."""
    log_z = np.add(mean, var)
    alpha = np.subtract(y, mean)
    beta = np.multiply(var, y)
    return log_z, alpha, beta


def bench_sites(n, repeats):
    threads = sites.max_threads()
    print(f"\n## 1. Site kernels on {n:,} sites (median of {repeats}); target >= 10x")
    print(f"compiled: {threads} OpenMP thread(s) (built with OpenMP: {sites.OPENMP}); "
          f"'1 thread' limits OpenMP to one")
    cases, mean, var = site_kernel_cases(n)
    ypm = cases[0][2]
    t_floor = median_time(lambda: _streaming_floor(ypm, mean, var), repeats)
    print(f"memory floor (read 3 inputs, write 3 new outputs, no special functions): "
          f"{t_floor:.4f} s; 'ceiling' = reference / floor, the largest ratio any kernel "
          f"returning fresh arrays could reach on this machine")
    print(f"{'likelihood':<18}{'compiled s':>12}{'reference s':>13}{'ratio':>9}{'1 thread s':>12}"
          f"{'ratio':>9}{'ceiling':>9}")
    with np.errstate(all="ignore"):
        for name, lik, y, ref in cases:
            lik.moments(y[:10], mean[:10], var[:10])  # warm the spec cache
            t_c = median_time(lambda: lik.moments(y, mean, var), repeats)
            t_r = median_time(ref, max(1, repeats // 2))
            with threadpool_limits(1, "openmp"):
                t_1 = median_time(lambda: lik.moments(y, mean, var), repeats)
            print(f"{name:<18}{t_c:>12.4f}{t_r:>13.4f}{t_r / t_c:>8.1f}x{t_1:>12.4f}{t_r / t_1:>8.1f}x"
                  f"{t_r / t_floor:>8.1f}x")


def _problem(n, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    y = np.where(X @ rng.normal(size=d) + 0.1 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def one_sweep(X, y, spec, algorithm=linear_ep.ALGORITHM_AUTO):
    n, d = X.shape
    tau, nu = np.zeros(n), np.zeros(n)
    m, V = np.empty(d), np.empty((d, d))
    # refresh_every > max_sweeps: the sweep alone, no refactorisation from the invariant
    options = linear_ep.LinearEPOptions(max_sweeps=1, refresh_every=2, algorithm=algorithm)
    linear_ep.LinearEP(X, y, np.zeros(d), np.eye(d), spec, options).run(tau, nu, m, V)


def one_sweep_with_refresh(X, y, spec):
    n, d = X.shape
    tau, nu = np.zeros(n), np.zeros(n)
    m, V = np.empty(d), np.empty((d, d))
    options = linear_ep.LinearEPOptions(max_sweeps=1, refresh_every=1)
    linear_ep.LinearEP(X, y, np.zeros(d), np.eye(d), spec, options).run(tau, nu, m, V)


def bench_sweep_vs_reference(n, d, repeats, threads):
    X, y = _problem(n, d)
    lik = Probit()
    spec = lik.site_spec()

    def moments(yy, mm, vv):
        out = ref_sites.probit_moments(np.atleast_1d(yy), np.atleast_1d(mm), np.atleast_1d(vv))
        return tuple(float(o[0]) for o in out)

    with threadpool_limits(threads, "blas") if threads else _nothing():
        t_c = median_time(lambda: one_sweep(X, y, spec), repeats)
        t_r = median_time(lambda: ref_linear_ep.run_linear_ep(X, y, np.zeros(d), np.eye(d), moments,
                                                              max_sweeps=1, refresh_every=2), 1)
    return t_c, t_r


def bench_sweep_vs_blas(n, d, repeats, threads):
    X, y = _problem(n, d)
    spec = Probit().site_spec()
    with threadpool_limits(threads, "blas") if threads else _nothing():
        t_bare = median_time(lambda: _bench.bare_rank1_updates(np.eye(d), X, -1e-6), repeats)
        t_sweep = median_time(lambda: one_sweep(X, y, spec), repeats)
        t_rank1 = median_time(lambda: one_sweep(X, y, spec, linear_ep.ALGORITHM_RANK1), repeats)
        t_refresh = median_time(lambda: one_sweep_with_refresh(X, y, spec), repeats)
    return t_bare, t_sweep, t_rank1, t_refresh


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and smaller n (a smoke run)")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    n_sites = 100_000 if args.quick else 1_000_000
    n = 2_000 if args.quick else 10_000
    blas = [(i.get("internal_api"), i.get("num_threads"), i.get("architecture")) for i in threadpool_info()
            if i.get("user_api") == "blas"]
    print(f"# fastep compiled/reference ratios  ({platform.processor() or platform.machine()}, BLAS {blas})")
    bench_sites(n_sites, repeats)

    print(f"\n## 2. One EP sweep, n = {n:,}, d = 10, probit: compiled vs reference (target >= 20x)")
    print(f"{'BLAS threads':<14}{'compiled s':>12}{'reference s':>13}{'ratio':>9}")
    for threads in (1, None):
        t_c, t_r = bench_sweep_vs_reference(n, 10, repeats, threads)
        print(f"{threads or 'default':<14}{t_c:>12.5f}{t_r:>13.3f}{t_r / t_c:>8.0f}x")

    d = 1000
    print(f"\n## 3. One EP sweep, n = {n:,}, d = {d}, probit vs n bare dsyr (target <= 1.5x)")
    print(f"{'BLAS threads':<14}{'bare dsyr s':>12}{'sweep s':>10}{'ratio':>8}"
          f"{'rank-1 path s':>15}{'ratio':>8}{'sweep+refresh s':>17}{'ratio':>8}")
    for threads in (1, None):
        t_bare, t_sweep, t_rank1, t_refresh = bench_sweep_vs_blas(n, d, max(3, repeats // 2), threads)
        print(f"{threads or 'default':<14}{t_bare:>12.3f}{t_sweep:>10.3f}{t_sweep / t_bare:>7.2f}x"
              f"{t_rank1:>15.3f}{t_rank1 / t_bare:>7.2f}x{t_refresh:>17.3f}{t_refresh / t_bare:>7.2f}x")


if __name__ == "__main__":
    main()
