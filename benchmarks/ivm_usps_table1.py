"""Table 1 of the IVM paper (Lawrence, Seeger & Herbrich, §4.2): USPS digits, one-vs-rest, d = 500.

    python benchmarks/ivm_usps_table1.py                           # the RBF row (about 2 minutes)
    python benchmarks/ivm_usps_table1.py --kernels rbf,mlp,ard --json usps.json
    python benchmarks/ivm_usps_table1.py --kernels rbf --digits 0,3 --iterations 2   # a quick look
    python benchmarks/ivm_usps_table1.py --engine reference --train-size 2000 --digits 0,1

Protocol (the paper's): 7291 training and 2007 test images of 16 x 16 pixels, inputs
mapped from [0, 1] to [-1, 1] (2x - 1). For every digit a binary ``fastep.IVMClassifier``
(probit likelihood, digit against the rest) selects d = 500 active points with Algorithm 1
and runs 5 iterations of Algorithm 2 with the optional noise-parameter step (kernel
parameters by eq 32, then reselection, then the probit bias and slope by eq 34), and a
final selection. Each binary classifier is exactly what ``IVMClassifier`` fits per class
one-vs-rest; fitting them one by one lets the script time each digit. The 10-class
prediction takes the class with the largest latent mean (the paper's rule, and
``IVMClassifier.predict`` for more than two classes). Kernels: the base kernel
Linear + White + Bias plus

* ``rbf``: RBF (process variance, inverse width);
* ``mlp``: MLP (arcsine; variance, weight variance, bias variance);
* ``ard``: RBF-ARD with the 256 input scales tied in 16 blocks of 16 pixels (the
  paper's footnote 4), here the 4 x 4 pixel patches of the image (``--ard-blocks rows``
  ties the 16 image rows instead); tied scales are ``RBFARD(..., ard_groups=g)`` with
  ``g[pixel]`` the block of each pixel.

Starting values (the optimiser moves all of them): variances 1, RBF inverse width 1/256
(so that γ|x - y|²/2 is O(1) for inputs on [-1, 1]^256), Linear variance 1/256, Bias and
White e⁻² (the MATLAB toolbox's defaults for those two), MLP weight variance 1/256 and
bias variance 1, ARD scales 0.5 with inverse width 2/256, probit slope 1 and bias 0.

Each optimisation of eq 32 or eq 34 runs at most ``--max-optimizer-iter`` L-BFGS-B
iterations (default 10; the toolbox ran 100 scaled-conjugate-gradient iterations). With 100,
L-BFGS-B converges in about 20 evaluations per round; a budget of 10 per round halves the
optimisation time and gave the same test errors on the RBF row (every digit and overall
identical: 5.03 %), because the five rounds continue from each other's parameters.

Printed per kernel row: each digit's binary test error (%) beside the paper's, the overall
10-class error, the fit time per digit split into selection (Algorithm 1, including kernel
columns) and optimisation (eqs 32 and 34), the row's total time, and the peak resident
memory of the process (``getrusage`` ``ru_maxrss``; with ``--jobs`` > 1 the largest worker).
BLAS runs on one thread during fitting (the library's policy); ``--jobs 2`` fits two digits
at a time in two worker processes (reported as such: the serial figure is the default).

``--engine reference`` runs the same protocol with the selection replaced by the
plain-numpy twin :func:`fastep.reference.ivm.select` (full n x n kernel and posterior
covariance, probit moments from :mod:`fastep.reference.sites`); the optimisation steps are
unchanged. It needs O(n²) memory (about 3 n x n arrays: 1.3 GB at n = 7291) and O(n²) time
per inclusion, so use it with ``--train-size`` (a seeded, class-stratified subset) and a
few digits; ``benchmarks/ivm_usps_compare.py`` runs both engines side by side.

Measured at commit ad7bcbb (2-core machine shared with other jobs at load average 1-4, so
wall times are pessimistic; CPU time is what one idle core would need; default options; eq 34
maximised in trust regions, see ``fastep.ivm``):

=========  ===============================================================  =======  ==========================
row        binary % error, digits 0-9 (paper in Table 1)                    overall  time, peak memory
=========  ===============================================================  =======  ==========================
RBF        0.797 0.747 1.644 1.196 1.545 1.096 0.698 0.698 1.246 0.847      5.18     67.3 s wall (67.5 s CPU) at
           (0.648 0.698 1.40 1.05 1.49 1.25 0.747 0.598 1.20 0.747)        (4.58)   load 1.5, 79-91 s at load 2-4;
                                                                                     227-228 MB
MLP        1.096 0.698 1.694 1.495 1.844 1.046 0.747 0.747 1.545 0.947      5.38     104 s (83 s CPU), 235 MB
           (0.548 0.698 1.49 1.20 1.64 1.25 0.797 0.598 1.20 0.747)        (4.78)
RBF ARD    0.598 0.648 1.545 1.395 1.844 1.295 0.847 0.797 1.545 0.897      5.23     160 s (156 s CPU), 275 MB
           (0.548 0.598 1.49 1.10 1.79 1.20 0.797 0.498 1.20 0.847)        (4.68)
=========  ===============================================================  =======  ==========================

Every binary error but one is within 0.5 points of the paper's: MLP digit 0 is 0.548 points above
(22 test mistakes against the paper's 11; one test image is 0.05 points). The overall errors miss
the 4.8 % target by 0.4-0.6 points.

Before eq 34 was maximised in trust regions (``fastep._search.optimize.maximize_log_likelihood_trust_region``,
a fix for L-BFGS-B stalling at its start on the ordinal likelihood's widths; it also changes the path
the probit bias and slope take), the same protocol gave (commit 0674451, load 2-9):

=========  ===============================================================  =======  ==========================
RBF        0.797 0.747 1.644 1.196 1.594 1.096 0.698 0.747 1.295 0.847      5.03     112-180 s wall (105-111 s
                                                                                     CPU), 226-236 MB
MLP        1.046 0.698 1.694 1.495 1.794 1.046 0.747 0.747 1.545 0.947      5.53     136-140 s (125-131 s CPU),
                                                                                     237-239 MB
RBF ARD    0.598 0.648 1.594 1.445 1.844 1.295 0.847 0.797 1.495 0.897      5.48     207 s (184-204 s CPU),
                                                                                     272-278 MB
=========  ===============================================================  =======  ==========================

with every binary error within 0.5 points. So an equally valid optimisation path for the noise
parameters moves the overall error by 0.15-0.25 points (3-5 test images) either way, and no path
reaches 4.8 %. ``--max-optimizer-iter 100`` (before the trust regions): RBF identical (5.03 %), MLP
5.38 %, RBF ARD 5.23 % (but 810 s: the 19 ARD parameters use the whole budget every round). The
later toolbox's probit (``--probit-slope inf``: a step, only the bias learnt; its ``sigma2`` is
1e-6) gave 5.08 % on all the training data; that plus the paper's start and optimiser
(``--init toolbox --optimizer SCG --max-optimizer-iter 100``) gave 7.32 %, because the RBF stayed
switched off for digit 4 (9.97 % binary error, every test image called "not 4").

Speed (RBF row): before the kernel-column product cache (``fastep.kernels.ColumnProductCache``)
a digit took 21-23 s CPU at load 9 (digits 3 and 7, 100 L-BFGS-B iterations), 14-15 s with it
(identical fits), 12 s with the default budget of 10 iterations; the row's time is about 80 %
selection (Algorithm 1: the compiled engine's M reads and scoring pass, then kernel columns)
and 20 % optimisation. ``--jobs 2`` on a loaded machine (load 6): 185 s wall, 118 s CPU.
With the bounded scoring pass (commit 6800784 on), on a quiet machine (commit 7effb4d, load 0.3 at
the start): the RBF row in 66.6 s wall, 66.7 s CPU (selection 48.3 s, optimisation 16.4 s), 227 MB,
within the 2-minute target; on the shared machine at load 3-5 it took 122-133 s wall (87-88 s CPU).

Diagnosis of the gap (RBF row, before the eq-34 trust regions; ``benchmarks/ivm_usps_diagnose.py`` runs the variants on data held
out of the training set, so that no choice looks at the test set):

* It is in the binary classifiers, not in their combination: the ten binary errors add up to
  10.66 points against the paper's 9.83 (8 of 10 digits above the paper's), about as many extra
  test mistakes as the 10-class gap (9 images). On 5-fold validation inside the training set
  (7291 held-out images) the paper's rule (largest μ + b) and the largest class probability make
  154 errors each, the raw latent mean 627: the paper's rule stays. (The test set would prefer the
  probability, 4.93 %; it is not used to choose.)
* No implementation error found. The engine's posterior means and variances at all 7291 points
  equal a dense recomputation from the 500 sites to 1e-13 (relative), at learnt-like parameters
  and at extreme ones (White 2.5e-8, slope 7400), and so do the test latents; the eq-32 and eq-34
  gradients agree with central differences at every round on digit 3; eq 32 rises every round
  (digit 3: -894.7, -722.0, -699.8, -677.3, -658.2 after the kernel steps, -640.3 at the end);
  White sits on the training diagonal only (zero test cross-covariances, as the toolbox's
  ``whiteKernCompute``); every selection scores all 7291 points; the ARD blocks are the 4 x 4
  tiles of the toolbox's own USPS demos (``demUspsIvm3``, ``demDigits``: the matrix
  ``a = [ones(4) repmat(2, 4, 4) ...]``), ``--ard-blocks rows`` is the other reading.
* The optimiser is not the cause: L-BFGS-B stops at its 10-iteration budget every round
  (largest gradient component 0.35-0.8), but 100 iterations, and the paper's own scaled
  conjugate gradients (``--optimizer SCG``, 100 iterations), reach the same inverse widths.
  With 100 iterations White falls to ~1e-8 and the learnt probit slope climbs to 10^3.8-10^4.4:
  eq 34 has no finite maximiser in the slope once the posterior means classify the training
  points (``IVMClassifier``, ``learn_likelihood``); the test errors do not move.
* Kernel learning by eq 32 picks wider kernels than the error-optimal ones: γ = 0.004-0.016
  (digit 0: 0.004) in every variant tried -- learnt or infinite slope, cavity or posterior
  marginals in eq 34, EP-refined sites, 10 or 100 iterations, SCG from the paper's start --
  while a fixed RBF(1.5, γ = 0.02) + Linear(1e-5) + White(3e-4) + Bias(1), only the probit
  parameters learnt, makes 142 validation errors against 154 (5-fold). This is why learning
  barely helps here. A larger active set learns wider kernels still (d = 1000: 0.003-0.009).
* The paper's starting values (γ = 1; the median nearest-neighbour squared distance of USPS on
  [-1, 1] is 41, so the RBF starts as white noise) leave the RBF switched off (or at γ ≈ 10) for some digits
  (4, and 7 with the slope fixed at 1, under SCG; 0, 1, 4 and 7 under L-BFGS-B): 5.5-6.1 % test
  error on 80 % of the training set, 6.13 % on all of it.

RBF-row variants on one 20 % hold-out of the training set (``ivm_usps_diagnose.py --holdout 0``
plus the options shown; training on the other 80 %, so the test column is higher than the
full-data row; test errors for the record only):

==============================================================  =======  =========  =======
variant (``ivm_usps_diagnose.py`` options)                      held-out held-out   test
                                                                binary   10-class   10-class
                                                                sum      %          %
==============================================================  =======  =========  =======
(defaults)                                                      5.35     1.92       5.18
``--probit-slope inf`` (only the bias learnt)                   5.01     1.92       5.23
``--marginals posterior``                                       5.21     1.92       5.18
``--refine-sweeps 10``                                          5.21     1.85       5.13
``--max-optimizer-iter 100``                                    5.01     1.92       5.18
``--fix-slope`` (slope 1, the early toolbox's probit)           6.17     2.06       5.53
``--fix-slope --bias-init prop --max-optimizer-iter 100``       6.24     2.19       5.58
``--init toolbox --optimizer SCG --max-optimizer-iter 100
--bias-init prop --marginals posterior --fix-slope``            6.52     2.33       5.68
  same with ``--probit-slope inf`` instead of ``--fix-slope``   6.17     2.19       5.53
``--active-size 1000``                                          5.90     1.92       5.53
``--fixed-gamma 0.006`` / ``0.009`` / ``0.0135``                5.49 /   1.99 /     5.18 /
                                                                5.21 /   1.92 /     5.28 /
                                                                4.73     1.78       5.13
``--fixed-gamma 0.02`` / ``0.03``                               4.66 /   1.71 /     5.03 /
                                                                5.08     1.85       5.13
==============================================================  =======  =========  =======

On all 7291 training images (``--full``), starting γ at half or twice 1/256 (``--gamma-scale 0.5``,
``2``) gives 5.13 % and 5.08 % (largest probability 4.98 and 4.93 %). The MLP row with the paper's
start (w = b = 10, ``--init toolbox``) gives the held-out error of the default start
(``--kernels mlp --validation 0.2``: 2.06 % both; test 6.08 % both on 80 % of the data).
No variant reaches the paper's 4.58 %, nor the 4.8 % target: over every protocol-faithful run
above the RBF row's overall error lies in 5.03-5.18 % (5.08 % with the toolbox's step probit), and
with no implementation error found, the remaining 0.45-0.6 points (9-12 test images) are not
explained by anything we can reproduce.

The data are ``../shared/data/usps.npz`` relative to the repository (``--data`` to
override); the script exits with a message if the file is absent.
"""
import argparse
import json
import os
import pathlib
import platform
import resource
import sys
import time

import numpy as np

import fastep
import fastep.ivm as fivm
from fastep.kernels import MLP, RBF, RBFARD, Bias, Linear, White
from fastep.likelihoods import Probit

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "usps.npz"

# Table 1 of the paper: % test error of each binary classifier (digit vs rest), then overall.
PAPER = {
    "rbf": ([0.648, 0.698, 1.40, 1.05, 1.49, 1.25, 0.747, 0.598, 1.20, 0.747], 4.58),
    "mlp": ([0.548, 0.698, 1.49, 1.20, 1.64, 1.25, 0.797, 0.598, 1.20, 0.747], 4.78),
    "ard": ([0.548, 0.598, 1.49, 1.10, 1.79, 1.20, 0.797, 0.498, 1.20, 0.847], 4.68),
}
ROW_NAMES = {"rbf": "RBF", "mlp": "MLP", "ard": "RBF ARD"}
TARGET_OVERALL = 4.8      # target: overall error <= 4.8 % for every kernel row
TARGET_DIGIT = 0.5        # ... and every binary error within 0.5 points of the paper's
_ARRAYS = ("latent_mean", "latent_var", "proba", "val_latent_mean", "val_latent_var", "val_proba")
VALIDATION = None         # (X_val, y_val) when --validation carves a split from the training set


# --------------------------------------------------------------------------------------------
# data and models
# --------------------------------------------------------------------------------------------
def load_usps(path):
    """(X_train, y_train, X_test, y_test) with inputs mapped to [-1, 1]; exits if the file is absent."""
    path = pathlib.Path(path)
    if not path.is_file():
        print(f"USPS data not found at {path} (expected ../shared/data/usps.npz relative to the "
              "repository; pass --data PATH): nothing to do")
        sys.exit(0)
    with np.load(path) as data:
        X = np.ascontiguousarray(2.0 * data["X_train"] - 1.0)
        Xt = np.ascontiguousarray(2.0 * data["X_test"] - 1.0)
        y = np.asarray(data["y_train"]).astype(int)
        yt = np.asarray(data["y_test"]).astype(int)
    return X, y, Xt, yt


def stratified_subset(y, size, seed=0):
    """Indices of a seeded subset of ``size`` points with (about) the class proportions of y, sorted."""
    if size is None or size >= y.shape[0]:
        return np.arange(y.shape[0])
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    quota = np.floor(counts / y.shape[0] * size).astype(int)
    quota[np.argsort(-(counts / y.shape[0] * size - quota))[: size - quota.sum()]] += 1
    idx = [rng.choice(np.flatnonzero(y == c), q, replace=False) for c, q in zip(classes, quota)]
    return np.sort(np.concatenate(idx))


def ard_groups(mode="patches"):
    """Block index of each of the 256 pixels (row-major 16 x 16 image): 4 x 4 patches or image rows."""
    r, c = np.divmod(np.arange(256), 16)
    if mode == "rows":
        return r
    return (r // 4) * 4 + c // 4


def make_kernel(name, p, blocks="patches", init="scaled"):
    """The row's kernel at its starting values: ``scaled`` (inner products divided by the input
    dimension p, the default) or ``toolbox`` (the paper's §4 and the MATLAB toolbox's defaults:
    every variance and the RBF inverse width 1, MLP weight and bias variances 10, ARD scales
    0.5 with inverse width 2 (the paper: 0.999 and 1), Bias and White e⁻²)."""
    s = 1.0 / p if init == "scaled" else 1.0
    base = Linear(s) + White(np.exp(-2.0)) + Bias(np.exp(-2.0))
    if name == "rbf":
        return RBF(1.0, s) + base
    if name == "mlp":
        if init == "toolbox":     # the paper's (§4) and the toolbox's mlpKernParamInit: w = b = 10
            return MLP(variance=1.0, weight_variance=10.0, bias_variance=10.0) + base
        return MLP(variance=1.0, weight_variance=s, bias_variance=1.0) + base
    if name == "ard":
        groups = ard_groups(blocks)
        n_scales = int(groups.max()) + 1
        return RBFARD(np.full(n_scales, 0.5), variance=1.0, inverse_width=2.0 * s, ard_groups=groups) + base
    raise ValueError(f"unknown kernel {name!r}; choose from rbf, mlp, ard")


# --------------------------------------------------------------------------------------------
# timing hooks (benchmark-only instrumentation of the estimator's private steps)
# --------------------------------------------------------------------------------------------
class _StageTimer:
    """Wall time spent in ``_IVMProblem.select`` (Algorithm 1 incl. kernel columns) and in the optimiser."""

    def __init__(self):
        self.select = 0.0
        self.optimise = 0.0
        self.n_select = 0
        self.n_evals = 0
        self._installed = False

    def install(self):
        if self._installed:
            return
        timer = self
        select, maximize = fivm._IVMProblem.select, fivm._IVMBase._maximize

        def timed_select(problem, *args):
            t0 = time.perf_counter()
            try:
                return select(problem, *args)
            finally:
                timer.select += time.perf_counter() - t0
                timer.n_select += 1

        def timed_maximize(objective, theta0, bounds, options, **kwargs):
            t0 = time.perf_counter()
            try:
                out = maximize(objective, theta0, bounds, options, **kwargs)
                timer.n_evals += int(out[2])
                return out
            finally:
                timer.optimise += time.perf_counter() - t0

        fivm._IVMProblem.select = timed_select
        fivm._IVMBase._maximize = staticmethod(timed_maximize)
        self._installed = True

    def snapshot(self):
        return self.select, self.optimise, self.n_select, self.n_evals


TIMER = _StageTimer()


def install_reference_selection():
    """Replace the compiled selection by the plain-numpy twin (full n x n K and posterior covariance)."""
    from fastep.reference import ivm as ref_ivm
    from fastep.reference import sites as ref_sites

    class _TwinState:
        def __init__(self, out):
            self.post_mean = out["post_mean"]
            self.post_var = np.diag(out["post_cov"]).copy()

    def reference_select(problem, sweep_callback=None):
        lik = problem.likelihood
        if not isinstance(lik, Probit):
            raise TypeError("the reference engine is wired for the probit likelihood only")
        par = lik.get_params()

        def moments(y, mean, var):
            return ref_sites.probit_moments(y, mean, var, slope=par["slope"], bias=par["bias"])

        K = problem.kernel(problem.X)
        out = ref_ivm.select(K, problem.y - problem.offset, moments, problem.d, criterion="entropy")
        del K
        problem.state = _TwinState(out)
        problem.active = out["active"]
        problem.site_mean = out["site_mean"][problem.active]
        problem.site_precision = out["site_precision"][problem.active]
        problem.marginals = None
        return problem.state

    fivm._IVMProblem.select = reference_select


# --------------------------------------------------------------------------------------------
# one binary problem
# --------------------------------------------------------------------------------------------
def fit_digit(X, y, Xt, yt, digit, kernel, args):
    """Fit digit-vs-rest; returns a dict of errors, latent test means and timings."""
    t = np.where(y == digit, 1, -1)
    clf = fastep.IVMClassifier(kernel, Probit(slope=args.probit_slope), active_set_size=args.active_size,
                               n_iterations=args.iterations, learn_likelihood=True, optimizer=args.optimizer,
                               max_optimizer_iter=args.max_optimizer_iter, verbose=args.verbose,
                               refine_sweeps=args.refine_sweeps, kernel_objective=args.objective)
    before = TIMER.snapshot()
    t0 = time.perf_counter()
    c0 = time.process_time()
    clf.fit(X, t)
    fit_time = time.perf_counter() - t0
    cpu_time = time.process_time() - c0
    after = TIMER.snapshot()
    t0 = time.perf_counter()
    mean, var = clf.predict_latent(Xt)               # one pass; predict and predict_proba from it
    bias = float(clf.likelihood_.get_params().get("bias", 0.0))
    pred = clf.classes_[(mean + bias > 0).astype(int)]           # = clf.predict(Xt)
    proba = clf.likelihood_.predictive(mean, var)                # = clf.predict_proba(Xt)[:, 1]
    predict_time = time.perf_counter() - t0
    err = 100.0 * float(np.mean(pred != np.where(yt == digit, 1, -1)))
    val = {}
    if VALIDATION:                                   # a split carved from the training set (--validation)
        Xv, yv = VALIDATION
        vm, vv = clf.predict_latent(Xv)
        val = {"val_error": 100.0 * float(np.mean(np.where(vm + bias > 0, 1, -1) != np.where(yv == digit, 1, -1))),
               "val_latent_mean": vm, "val_latent_var": vv, "val_proba": clf.likelihood_.predictive(vm, vv)}
    return {
        **val,
        "digit": int(digit), "error": err, "latent_mean": mean, "latent_var": var, "proba": proba,
        "bias": bias, "fit_time": fit_time, "cpu_time": cpu_time,
        "predict_time": predict_time,
        "select_time": after[0] - before[0], "optimise_time": after[1] - before[1],
        "n_select": after[2] - before[2], "n_evals": after[3] - before[3],
        "kernel": repr(clf.kernel_), "likelihood": repr(clf.likelihood_),
        "log_likelihood": clf.log_likelihood_, "peak_rss_mb": peak_rss_mb(),
    }


def peak_rss_mb(who=resource.RUSAGE_SELF):
    return resource.getrusage(who).ru_maxrss / 1024.0


_WORKER = {}


def _worker_init(X, y, Xt, yt, args):
    _WORKER.update(X=X, y=y, Xt=Xt, yt=yt, args=args)
    if args.engine == "reference":
        install_reference_selection()          # before the timer, which wraps whichever select is installed
    TIMER.install()


def _worker_fit(job):
    digit, name = job
    w = _WORKER
    kernel = make_kernel(name, w["X"].shape[1], w["args"].ard_blocks, w["args"].init)
    return fit_digit(w["X"], w["y"], w["Xt"], w["yt"], digit, kernel, w["args"])


# --------------------------------------------------------------------------------------------
# a kernel row
# --------------------------------------------------------------------------------------------
def run_row(name, X, y, Xt, yt, args):
    digits = args.digits
    t0 = time.perf_counter()
    if args.jobs > 1:
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        with ctx.Pool(args.jobs, initializer=_worker_init, initargs=(X, y, Xt, yt, args)) as pool:
            results = pool.map(_worker_fit, [(dg, name) for dg in digits], chunksize=1)
    else:
        results = []
        for dg in digits:
            kernel = make_kernel(name, X.shape[1], args.ard_blocks, args.init)
            res = fit_digit(X, y, Xt, yt, dg, kernel, args)
            results.append(res)
            if not args.quiet:
                print(f"  digit {dg}: error {res['error']:.3f} %  fit {res['fit_time']:.1f} s "
                      f"(selection {res['select_time']:.1f} s in {res['n_select']}, optimisation "
                      f"{res['optimise_time']:.1f} s, {res['n_evals']} evaluations)  {res['kernel']}  "
                      f"{res['likelihood']}", flush=True)
    wall = time.perf_counter() - t0
    overall = None
    rules, val_rules = {}, {}
    if sorted(digits) == list(range(10)):
        res = sorted(results, key=lambda r: r["digit"])
        rules = combination_rules(res, yt, "")
        overall = rules["mean+bias"]
        if VALIDATION:
            val_rules = combination_rules(res, VALIDATION[1], "val_")
    peak = max(r["peak_rss_mb"] for r in results)
    return {"kernel": name, "digits": list(digits), "results": results, "overall": overall, "rules": rules,
            "val_rules": val_rules,
            "wall_time": wall, "fit_time": sum(r["fit_time"] for r in results),
            "select_time": sum(r["select_time"] for r in results),
            "optimise_time": sum(r["optimise_time"] for r in results),
            "predict_time": sum(r["predict_time"] for r in results),
            "cpu_time": sum(r["cpu_time"] for r in results), "peak_rss_mb": peak}


def combination_rules(res, labels, prefix):
    """10-class % error of the one-vs-rest rules: the largest latent mean plus probit bias (the
    paper's, ``IVMClassifier.predict``), the largest latent mean, the largest class probability."""
    means = np.column_stack([r[prefix + "latent_mean"] for r in res])
    biases = np.array([r["bias"] for r in res])
    proba = np.column_stack([r[prefix + "proba"] for r in res])
    return {"mean+bias": 100.0 * float(np.mean(np.argmax(means + biases, axis=1) != labels)),
            "mean": 100.0 * float(np.mean(np.argmax(means, axis=1) != labels)),
            "probability": 100.0 * float(np.mean(np.argmax(proba, axis=1) != labels))}


def print_row(row, full_train, label="fastep"):
    name = row["kernel"]
    paper, paper_overall = PAPER[name]
    digits = row["digits"]
    by_digit = {r["digit"]: r for r in row["results"]}
    head = "".join(f"{d:>7}" for d in digits)
    print(f"\n{ROW_NAMES[name]} row: % test error (binary digit-vs-rest; overall = 10-class, largest latent mean)")
    print(f"{'':>10}{head}{'overall':>9}")
    ours = "".join(f"{by_digit[d]['error']:>7.3f}" for d in digits)
    overall = "" if row["overall"] is None else f"{row['overall']:>9.2f}"
    print(f"{label:>10}{ours}{overall}")
    print(f"{'paper':>10}" + "".join(f"{paper[d]:>7.3f}" for d in digits) + f"{paper_overall:>9.2f}")
    diff = [by_digit[d]["error"] - paper[d] for d in digits]
    print(f"{'diff':>10}" + "".join(f"{x:>+7.3f}" for x in diff)
          + ("" if row["overall"] is None else f"{row['overall'] - paper_overall:>+9.2f}"))
    n_test = len(by_digit[digits[0]]["latent_mean"])
    print(f"  (one test error = {100.0 / n_test:.3f} points); sum of the binary errors {sum(by_digit[d]['error'] for d in digits):.3f} "
          f"(paper {sum(paper[d] for d in digits):.3f})")
    if "val_error" in by_digit[digits[0]]:
        n_val = len(by_digit[digits[0]]["val_latent_mean"])
        print(f"{'validation':>10}" + "".join(f"{by_digit[d]['val_error']:>7.3f}" for d in digits)
              + ("" if not row["val_rules"] else f"{row['val_rules']['mean+bias']:>9.2f}")
              + f"   ({n_val} images held out of the training set; one error = {100.0 / n_val:.3f} points; "
              f"sum {sum(by_digit[d]['val_error'] for d in digits):.3f})")
        if row["val_rules"]:
            r = row["val_rules"]
            print(f"  validation overall by rule: mean+bias {r['mean+bias']:.2f} %, mean {r['mean']:.2f} %, "
                  f"probability {r['probability']:.2f} %")
    if row["rules"]:
        r = row["rules"]
        print(f"  overall by other one-vs-rest rules: largest latent mean without the probit bias "
              f"{r['mean']:.2f} %, largest class probability {r['probability']:.2f} %")
    if full_train:
        ok_digits = all(abs(x) <= TARGET_DIGIT for x in diff)
        msg = f"  targets: every digit within {TARGET_DIGIT} points: {'yes' if ok_digits else 'NO'}"
        if row["overall"] is not None:
            msg += f"; overall <= {TARGET_OVERALL} %: {'yes' if row['overall'] <= TARGET_OVERALL else 'NO'}"
        print(msg)
    print(f"  time: {row['wall_time']:.1f} s wall for {len(digits)} digits "
          f"(fits {row['fit_time']:.1f} s: selection {row['select_time']:.1f} s, optimisation "
          f"{row['optimise_time']:.1f} s, other {row['fit_time'] - row['select_time'] - row['optimise_time']:.1f} s; "
          f"prediction {row['predict_time']:.1f} s); CPU {row['cpu_time']:.1f} s; per digit "
          + " ".join(f"{by_digit[d]['fit_time']:.1f}" for d in digits))
    print(f"  peak resident memory: {row['peak_rss_mb']:.0f} MB")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="path of usps.npz")
    parser.add_argument("--kernels", default="rbf", help="comma-separated rows: rbf, mlp, ard")
    parser.add_argument("--digits", default="0,1,2,3,4,5,6,7,8,9")
    parser.add_argument("--iterations", type=int, default=5, help="outer iterations of Algorithm 2")
    parser.add_argument("--active-size", type=int, default=500, help="d")
    parser.add_argument("--max-optimizer-iter", type=int, default=10,
                        help="L-BFGS-B iterations per optimisation (IVMClassifier.max_optimizer_iter; "
                             "default 10, see the module docstring; the estimator's default is 100)")
    parser.add_argument("--ard-blocks", choices=["patches", "rows"], default="patches")
    parser.add_argument("--init", choices=["scaled", "toolbox"], default="scaled",
                        help="kernel starting values (see make_kernel)")
    parser.add_argument("--probit-slope", type=float, default=1.0,
                        help="starting probit slope (learnt with the bias); inf: a step, only the bias learnt")
    parser.add_argument("--optimizer", choices=["L-BFGS-B", "SCG"], default="L-BFGS-B",
                        help="IVMClassifier(optimizer=...); SCG is the paper's (Netlab's scaled conjugate gradients)")
    parser.add_argument("--refine-sweeps", type=int, default=0,
                        help="IVMClassifier(refine_sweeps=...): EP sweeps over the active set after each selection")
    parser.add_argument("--validation", type=float, default=0.0,
                        help="hold out this fraction of the training set (seeded, class-stratified) and report "
                             "validation errors beside the test errors (for choices made without the test set)")
    parser.add_argument("--objective", choices=["active_set", "full_data"], default="active_set",
                        help="IVMClassifier(kernel_objective=...): the paper's eq 32 (default here, the protocol) "
                             "or the EP evidence of all training points with the active set as inducing inputs")
    parser.add_argument("--engine", choices=["fastep", "reference"], default="fastep")
    parser.add_argument("--train-size", type=int, default=None,
                        help="use a seeded class-stratified subset of the training set")
    parser.add_argument("--jobs", type=int, default=1, help="digits fitted at a time (worker processes)")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument("--save-latent", default=None,
                        help="write the test latent means, variances and probabilities to this .npz")
    parser.add_argument("--verbose", action="store_true", help="IVMClassifier(verbose=True)")
    parser.add_argument("--quiet", action="store_true", help="no per-digit lines")
    args = parser.parse_args(argv)
    args.digits = [int(s) for s in args.digits.split(",") if s.strip()]
    kernels = [s.strip() for s in args.kernels.split(",") if s.strip()]
    for k in kernels:
        if k not in PAPER:
            parser.error(f"unknown kernel {k!r}; choose from {', '.join(PAPER)}")

    X, y, Xt, yt = load_usps(args.data)
    sub = stratified_subset(y, args.train_size)
    X, y = np.ascontiguousarray(X[sub]), y[sub]
    if args.validation > 0:
        global VALIDATION
        held = stratified_subset(y, int(round(args.validation * y.shape[0])), seed=1)
        keep = np.setdiff1d(np.arange(y.shape[0]), held)
        VALIDATION = (np.ascontiguousarray(X[held]), y[held])
        X, y = np.ascontiguousarray(X[keep]), y[keep]
    full_train = X.shape[0] == 7291
    if args.engine == "reference":
        install_reference_selection()          # before the timer, which wraps whichever select is installed
    TIMER.install()
    baseline = peak_rss_mb()
    print(f"USPS: {X.shape[0]} training, {Xt.shape[0]} test points, {X.shape[1]} inputs on [-1, 1]; "
          f"engine {args.engine}; d = {args.active_size}, {args.iterations} iterations of Algorithm 2 "
          f"with noise-parameter updates, max {args.max_optimizer_iter} {args.optimizer} iterations per optimisation; "
          f"{'' if VALIDATION is None else f'{VALIDATION[1].shape[0]} training images held out for validation; '}"
          f"jobs {args.jobs}; fastep {fastep.__version__}, load average {os.getloadavg()[0]:.2f}")
    print(f"  resident memory after loading the data: {baseline:.0f} MB")
    rows = []
    for name in kernels:
        print(f"\n== {ROW_NAMES[name]} + Linear + White + Bias ==", flush=True)
        row = run_row(name, X, y, Xt, yt, args)
        rows.append(row)
        print_row(row, full_train, "fastep" if args.engine == "fastep" else "twin")
        sys.stdout.flush()
    if args.json:
        out = {"argv": sys.argv[1:], "args": {k: v for k, v in vars(args).items()},
               "platform": platform.platform(), "fastep": fastep.__version__,
               "n_train": int(X.shape[0]), "baseline_rss_mb": baseline,
               "load_average_end": os.getloadavg(), "rows": []}
        for row in rows:
            r = dict(row)
            r["results"] = [{k: v for k, v in res.items() if k not in _ARRAYS} for res in row["results"]]
            r["paper"] = {"digits": PAPER[row["kernel"]][0], "overall": PAPER[row["kernel"]][1]}
            out["rows"].append(r)
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"\nwrote {args.json}")
    if args.save_latent:
        arrays = {f"{row['kernel']}_{key}_{res['digit']}": res[key]
                  for row in rows for res in row["results"] for key in _ARRAYS if key in res}
        arrays.update({f"{row['kernel']}_bias_{res['digit']}": res["bias"] for row in rows for res in row["results"]})
        np.savez_compressed(args.save_latent, y_test=yt, **({} if VALIDATION is None else {"y_val": VALIDATION[1]}), **arrays)
        print(f"wrote {args.save_latent}")
    return rows


if __name__ == "__main__":
    main()
