"""The joint multiclass sparse GP (``SparseGPClassifier(multi_class='multinomial')``) beside its peers.

Every model is fitted in its own process (its peak RSS is its own) and scored on held-out rows:
test error and test log loss (mean negative log probability of the true class).

``synthetic``  the 10-class problem of :mod:`synthetic_multiclass` (10 inputs, 4 relevant; Bayes
               error and log loss known) at the sizes given. fastep default-constructed
               (minibatch learning from 50 000 rows on). The peer, GPflow's ``SVGP`` with the
               robust-max ``MultiClass`` likelihood (the variational model of the same shape: c
               latent GPs sharing one ARD RBF kernel and one set of M inducing inputs, M = fastep's
               m, by k-means++ on up to 10⁵ rows; Adam on minibatches of 512, whitened), runs in
               the environment of ``--peer-python`` (``--peer-likelihood softmax``: GPflow's Monte
               Carlo ``Softmax`` instead); it records its test log loss every 200 steps
               until 2000 steps have not improved it by 1e-3 (or 20 000 steps); its best point is
               reported with the trace, so its time to any log loss can be read off.
``usps``       USPS, 10 classes (7291 training, 2007 test images; pixels mapped to [-1, 1] as in
               the IVM benchmarks). fastep joint default; scikit-learn's ``SVC(probability=True)``;
               GPflow ``SVGP`` (robust-max, M = 200 shared inducing inputs by k-means++, minibatch
               256, 1500 Adam steps: the peer configuration the USPS targets refer to) with ``--peer-python``;
               ``--ovr`` adds fastep's one-vs-rest ``SparseGPClassifier()`` (about 9 minutes).
``usps-ivm``   the IVM on USPS: one-vs-rest with d = 200 per class (the paper's setting), and one
               shared budget (``multi_class='shared_budget'``) of d = 200 and of d = 1000 points.
``digits``     scikit-learn's 8x8 digits, 600 random training rows (seed 0) and the other 1197 for
               testing (the split of ``learning_stop.py``): fastep's dense ``GaussianProcessClassifier(multi_class='multinomial')`` and
               the joint sparse default.

Usage::

    python benchmarks/multiclass_sparse.py synthetic --sizes 1e5 1e6 [--peer-python /work/svgpvenv/bin/python]
    python benchmarks/multiclass_sparse.py usps [--peer-python ...] [--ovr]
    python benchmarks/multiclass_sparse.py digits
    python benchmarks/multiclass_sparse.py usps-ivm      # the IVM's multiclass modes on USPS
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synthetic_multiclass as sm  # noqa: E402

USPS = HERE.parent.parent / "shared" / "data" / "usps.npz"


def _scores(proba, y):
    return float(np.mean(np.argmax(proba, axis=1) != y)), sm.log_loss(proba, y)


def _data(problem, n):
    if problem == "synthetic":
        return (*sm.make(n), *sm.test_set())
    if problem == "usps":
        data = np.load(USPS)
        return (2 * data["X_train"] - 1, data["y_train"].astype(int), 2 * data["X_test"] - 1,
                data["y_test"].astype(int))
    from learning_stop import load
    return load("digits", 600, 0)


def child_fastep(problem, n, model):
    from fastep import GaussianProcessClassifier, SparseGPClassifier
    X, y, Xt, yt = _data(problem, n)
    windows = []

    def record(r):
        if r.stage == "minibatch":
            windows.append((r.elapsed, -r.log_marginal_likelihood / X.shape[0]))

    from fastep import IVMClassifier
    est = {"joint": lambda: SparseGPClassifier(multi_class="multinomial", callback=record),
           "ovr": lambda: SparseGPClassifier(),
           "dense": lambda: GaussianProcessClassifier(multi_class="multinomial"),
           "ivm_ovr": lambda: IVMClassifier(active_set_size=200),
           "ivm_shared": lambda: IVMClassifier(active_set_size=200, multi_class="shared_budget"),
           "ivm_shared_1000": lambda: IVMClassifier(active_set_size=1000, multi_class="shared_budget")}[model]()
    start = time.perf_counter()
    est.fit(X, y)
    fit = time.perf_counter() - start
    err, ll = _scores(est.predict_proba(Xt), yt)
    out = {"fit": fit, "error": err, "log_loss": ll, "kernel": repr(est.kernel_)[:300]}
    if model.startswith("ivm"):
        out.update(m=np.asarray(est.active_set_.shape).tolist(), learning="Algorithm 2", epochs=0, steps=0)
    elif model != "dense":
        out.update(m=np.asarray(est.n_inducing_).tolist(), learning=est.learning_,
                   epochs=np.asarray(est.n_sweeps_).tolist(), steps=np.asarray(est.n_evaluations_).tolist(),
                   windows=windows)
    return out


def child_svc(problem, n):
    from sklearn.svm import SVC
    X, y, Xt, yt = _data(problem, n)
    start = time.perf_counter()
    est = SVC(probability=True, random_state=0).fit(X, y)
    fit = time.perf_counter() - start
    err, ll = _scores(est.predict_proba(Xt), yt)
    return {"fit": fit, "error": err, "log_loss": ll}


def child_svgp(problem, n, m, batch, max_steps, fixed_steps=None, likelihood="robustmax"):
    import gpflow
    import tensorflow as tf
    from scipy.cluster.vq import kmeans2
    X, y, Xt, yt = _data(problem, n)
    c = int(y.max()) + 1
    rng = np.random.default_rng(0)
    sample = X[rng.choice(X.shape[0], size=min(X.shape[0], 100_000), replace=False)]
    Z, _ = kmeans2(sample, m, minit="++", seed=0)
    lengthscales = np.ones(X.shape[1]) if problem == "synthetic" else float(np.sqrt(X.shape[1]))
    kernel = gpflow.kernels.SquaredExponential(lengthscales=lengthscales)
    likelihood = (gpflow.likelihoods.Softmax(c) if likelihood == "softmax" else gpflow.likelihoods.MultiClass(c))
    model = gpflow.models.SVGP(kernel, likelihood, Z, num_latent_gps=c, num_data=X.shape[0], whiten=True)
    data = tf.data.Dataset.from_tensor_slices((X, y[:, None].astype(np.float64))).repeat().shuffle(10_000, seed=0)
    batches = iter(data.batch(batch))
    loss = model.training_loss_closure(batches, compile=False)
    opt = tf.optimizers.Adam(0.01)

    @tf.function
    def adam_step():
        with tf.GradientTape() as tape:
            value = loss()
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(value, variables), variables))

    def evaluate():
        proba = model.predict_y(Xt)[0].numpy()
        return _scores(proba / proba.sum(axis=1, keepdims=True), yt)

    trace, start = [], time.perf_counter()
    best, best_at = np.inf, 0
    for step in range(1, (fixed_steps or max_steps) + 1):
        adam_step()
        if step % 200 == 0 or step == fixed_steps:
            elapsed = time.perf_counter() - start
            err, ll = evaluate()
            trace.append((step, elapsed, err, ll))
            if fixed_steps:
                continue
            if ll < best - 1e-3:
                best, best_at = ll, len(trace)
            elif len(trace) - best_at >= 10:
                break
    row = trace[-1] if fixed_steps else min(trace, key=lambda t: t[3])
    return {"fit": row[1], "error": row[2], "log_loss": row[3], "trace": trace}


def run(args, python):
    proc = subprocess.run([python, __file__, "--child", json.dumps(args)], capture_output=True, text=True)
    line = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        print(f"{args}: failed\n{proc.stderr[-3000:]}")
        return None
    return json.loads(line[0][len("RESULT "):])


def _child(spec):
    kind = spec["kind"]
    if kind == "fastep":
        out = child_fastep(spec["problem"], spec["n"], spec["model"])
    elif kind == "svc":
        out = child_svc(spec["problem"], spec["n"])
    else:
        out = child_svgp(spec["problem"], spec["n"], spec["m"], spec["batch"], spec.get("max_steps", 20000),
                         spec.get("fixed_steps"), spec.get("likelihood", "robustmax"))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out))


def _report(name, r):
    if r is None:
        return
    extra = ""
    if "learning" in r:
        extra = f"({r['learning']}, m={r['m']}, {r['epochs']} passes/sweeps, {r['steps']} steps/evaluations)"
    print(f"  {name:44s} fit {r['fit']:7.1f} s  error {100 * r['error']:5.2f} %  log loss {r['log_loss']:.4f}  "
          f"peak RSS {r['peak_rss_mb']:.0f} MB {extra}", flush=True)
    if r.get("kernel"):
        print(f"      kernel {r['kernel']}")
    if r.get("windows"):
        print("      fastep running log loss per window (s, loss): "
              + "; ".join(f"{t:.0f} {v:.4f}" for t, v in r["windows"]))
    if r.get("trace"):
        print("      SVGP trace (step, s, error %, log loss): "
              + "; ".join(f"{t[0]} {t[1]:.0f} {100 * t[2]:.2f} {t[3]:.4f}" for t in r["trace"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("problem", nargs="?", choices=["synthetic", "usps", "digits", "usps-ivm"])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5])
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--ovr", action="store_true")
    parser.add_argument("--peer-likelihood", choices=["robustmax", "softmax"], default="robustmax",
                        help="SVGP's likelihood: GPflow's robust-max MultiClass (default) or its Monte Carlo Softmax")
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        _child(json.loads(args.child))
        return
    py = sys.executable
    if args.problem == "synthetic":
        print("Bayes: error {:.2f} %, log loss {:.4f}".format(100 * sm.bayes(sm.test_set()[0])[0],
                                                            sm.bayes(sm.test_set()[0])[1]))
        for n in map(int, args.sizes):
            print(f"n = {n}")
            ours = run({"kind": "fastep", "problem": "synthetic", "n": n, "model": "joint"}, py)
            _report("fastep SparseGPClassifier(multi_class='multinomial')", ours)
            if args.peer_python and ours is not None:
                peer = run({"kind": "svgp", "problem": "synthetic", "n": n, "m": int(ours["m"]), "batch": 512,
                            "likelihood": args.peer_likelihood}, args.peer_python)
                _report(f"GPflow SVGP {args.peer_likelihood} (M={ours['m']}, Adam, 512)", peer)
                if peer is not None:
                    reached = [t for t in peer["trace"] if t[3] <= ours["log_loss"]]
                    if reached:
                        print(f"      SVGP reaches fastep's log loss {ours['log_loss']:.4f} at step {reached[0][0]}, "
                              f"{reached[0][1]:.0f} s: fastep's time is {ours['fit'] / reached[0][1]:.2f}x SVGP's")
                    else:
                        print(f"      SVGP never reaches fastep's log loss {ours['log_loss']:.4f} (its best "
                              f"{peer['log_loss']:.4f} at {peer['fit']:.0f} s)")
        return
    if args.problem == "usps-ivm":
        if not USPS.exists():
            print(f"USPS data not found at {USPS}; skipped")
            return
        for name, model in (("fastep IVMClassifier(active_set_size=200) one-vs-rest", "ivm_ovr"),
                            ("fastep IVMClassifier(200, multi_class='shared_budget')", "ivm_shared"),
                            ("fastep IVMClassifier(1000, multi_class='shared_budget')", "ivm_shared_1000")):
            _report(name, run({"kind": "fastep", "problem": "usps", "n": 0, "model": model}, py))
        return
    if args.problem == "usps" and not USPS.exists():
        print(f"USPS data not found at {USPS}; skipped")
        return
    rows = [("fastep SparseGPClassifier(multi_class='multinomial')",
             {"kind": "fastep", "problem": args.problem, "n": 0, "model": "joint"}, py)]
    if args.problem == "digits":
        rows.append(("fastep GaussianProcessClassifier(multi_class='multinomial')",
                     {"kind": "fastep", "problem": "digits", "n": 0, "model": "dense"}, py))
    else:
        rows.append(("scikit-learn SVC(probability=True)", {"kind": "svc", "problem": "usps", "n": 0}, py))
        if args.ovr:
            rows.append(("fastep SparseGPClassifier() one-vs-rest",
                         {"kind": "fastep", "problem": "usps", "n": 0, "model": "ovr"}, py))
        if args.peer_python:
            rows.append((f"GPflow SVGP {args.peer_likelihood} (M=200, 256, 1500 steps)",
                         {"kind": "svgp", "problem": "usps", "n": 0, "m": 200, "batch": 256, "fixed_steps": 1500,
                          "likelihood": args.peer_likelihood}, args.peer_python))
    for name, spec, python in rows:
        _report(name, run(spec, python))


if __name__ == "__main__":
    main()
