"""Why horseshoe EP gets 'stuck' when C = ΔDΔ + ΔPPᵀΔ has a strong low-rank part: a diagnosis,
not a fix (notes and measurements in benchmarks/horseshoe_shared_factor_notes.md).

Notation (supplement eqs 5-13; fastep._epcore.horseshoe_marginals): u = √s(√a∘z + Uζ)
with z ~ N(0, I_d), ζ ~ N(0, I_m) (same for v with s = γ²). A u-site of precision π_j acts on
ζ through c_j = sπ_j/(1 + s a_j π_j); the posterior precision of the shared factor ζ is
M = I + Σ_j c_j U_jᵀU_j (m x m), and the cavity of u_j is proper iff 1 - c_j U_j M⁻¹ U_jᵀ > 0,
i.e. iff M_{-j} = M - c_j U_jᵀU_j ≻ 0. Write M_neg = I + Σ_{c_j < 0} c_j U_jᵀU_j (prior plus the
negative sites): M_neg ≻ 0 implies that the posterior and every cavity are proper.

Modes:

    python benchmarks/horseshoe_shared_factor_diagnosis.py engine --d 1000 --m 10
        the engine's parallel EP (HorseshoeEP) on the scaling benchmark's random-P problem
        (n = 100, P = 0.3 N(0, 1), σ² = 0.25, ρ² = 1e-3, γ² = 1): its step halvings and held
        iterations, and λ_min(M) and λ_min(M_neg) of the accepted states along the run (read
        from the engine's sites by the sweep callback). The compiled engine does not expose
        the proposals it rejects; the classification of each by reason (shared-factor M not
        ≻ 0 / cavity of a positive site with M_neg indefinite) in the notes was made with
        the numpy loop that preceded it.
    python benchmarks/horseshoe_shared_factor_diagnosis.py sequential --d 1000 --m 10 [--delta 0.01]
        plain-numpy prototype (w-marginals and cavities from the reference twin,
        fastep.reference.horseshoe): w-sites in parallel, u/v-sites one at a time (Gauss-Seidel,
        rank-1 updates of M⁻¹; a damped rank-1 step from a proper cavity keeps the posterior
        proper by construction); features whose cavity is improper are skipped. With --delta,
        negative u/v targets are scaled by a common β so that M_neg(targets) ≽ δI
        (this changes EP's fixed point; see the notes)
    python benchmarks/horseshoe_shared_factor_diagnosis.py synthetic --seed 0
        the learnt-C fit of benchmarks/horseshoe_synthetic.py with the statuses, step halvings
        and held iterations of all its EP runs
"""
import argparse
import collections
import os
import sys
import time
import warnings

import numpy as np

from fastep._epcore import horseshoe as core
from fastep._epcore.horseshoe_ep import HorseshoeEP, HorseshoeOptions, HorseshoePrior
from fastep._horseshoe.search import EvidenceSearch
from fastep.reference import horseshoe as ref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def shared_precisions(prior, s, pi):
    """(λ_min(M), λ_min(M_neg), min g) for one of the latent vectors (module docstring)."""
    g = 1.0 + s * prior.a * pi
    c = s * pi / g
    M = (prior.U * c[:, None]).T @ prior.U + np.eye(prior.m)
    Mn = (prior.U * np.minimum(c, 0.0)[:, None]).T @ prior.U + np.eye(prior.m)
    return np.linalg.eigvalsh(M).min(), np.linalg.eigvalsh(Mn).min(), g.min()


def spy_search(record):
    """Patch EvidenceSearch.run_ep to record the statuses, halvings and held iterations of every EP run."""
    original = EvidenceSearch.run_ep

    def run_ep(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        for res in (out[0] if out is not None else []):
            record["status"][res.status] += 1
            record["halvings"] += res.n_halvings
            record["held"] += res.n_held_iter
            if res.status != "converged":
                record["stopped"].append((res.status, res.n_sweeps, res.residual))
        if out is None:
            record["status"]["not used (None)"] += 1
        return out

    EvidenceSearch.run_ep = run_ep
    return lambda: setattr(EvidenceSearch, "run_ep", original)


def new_record():
    return {"status": collections.Counter(), "halvings": 0, "held": 0, "stopped": []}


def report(record):
    print(f"EP statuses {dict(record['status'])}; step halvings {record['halvings']}, "
          f"held iterations {record['held']}")
    for st, it, res in record["stopped"][:10]:
        print(f"  stopped ({st}) after {it} iterations, residual {res:.3g}")


def random_p_problem(d, m, n=100, seed=0):
    from horseshoe_scaling import make
    return make(n, d, m, seed=seed)


def _w_state(X, y, s2, pi_w, h_w):
    """The twin's w-marginals and cavities (eq 14), or None if the posterior or a cavity is improper."""
    wm = ref.w_marginals(X, y, s2, pi_w, h_w)
    if not wm["ok"]:
        return None
    cav_var, cav_mean = ref.cavities(wm["var"], pi_w, wm["mean"], h_w)
    return None if not np.all(np.isfinite(cav_var)) else (cav_mean, cav_var)


def sequential_ep(X, y, s2, r2, g2, prior, *, delta=None, damping=0.5, damping_decay=0.99, floor=0.3,
                  tol=1e-8, max_iter=500, w_floor=-0.1, verbose=True):
    """Prototype schedule (module docstring); returns sites, iterations, residual, skipped features, β."""
    d = X.shape[1]
    sites = ref.initial_sites(d, r2, g2)
    U, a = prior.U, prior.a
    scale = {"pi_u": r2, "pi_v": g2}
    beta = {"pi_u": 1.0, "pi_v": 1.0}
    skipped = set()
    res = np.inf
    for it in range(max_iter):
        cav_m, cav_v = _w_state(X, y, s2, sites["pi_w"], sites["h_w"])
        eps = max(damping * damping_decay ** it, floor)
        lat = {}
        for k, s in scale.items():
            c = s * sites[k] / (1.0 + s * a * sites[k])
            lat[k] = (c, np.linalg.inv((U * c[:, None]).T @ U + np.eye(prior.m)))
        negc = {k: np.zeros(d) for k in scale}
        tw, th = sites["pi_w"].copy(), sites["h_w"].copy()
        res, skipped_now = 0.0, []
        for j in range(d):
            cav, xs = {}, {}
            for k, s in scale.items():
                c, Mi = lat[k]
                x = Mi @ U[j]
                sj = float(U[j] @ x)
                den = 1.0 - c[j] * sj
                if den <= 0:
                    break
                cav[k], xs[k] = s * (a[j] + sj / den), (x, sj)
            else:
                _, mean, var, eu2, ev2, _ = core.tilted_moments(cav_m[j], cav_v[j], cav["pi_u"], cav["pi_v"])
                tgt = {"pi_u": 1 / eu2[0] - 1 / cav["pi_u"], "pi_v": 1 / ev2[0] - 1 / cav["pi_v"]}
                tpw, thw = 1 / var[0] - 1 / cav_v[j], mean[0] / var[0] - cav_m[j] / cav_v[j]
                if tpw * cav_v[j] < w_floor:
                    tpw, thw = w_floor / cav_v[j], (mean[0] * (1 + w_floor) - cav_m[j]) / cav_v[j]
                tw[j], th[j] = tpw, thw
                pw = 1 / cav_v[j] + abs(sites["pi_w"][j])
                res = max(res, abs(tpw - sites["pi_w"][j]) / pw, abs(thw - sites["h_w"][j]) / np.sqrt(pw))
                for k, s in scale.items():
                    tp = tgt[k]
                    ct = s * tp / (1 + s * a[j] * tp)
                    if delta is not None and ct < 0:
                        negc[k][j] = ct
                        ct *= beta[k]
                        tp = ct / (s * (1 - a[j] * ct))
                    pold = sites[k][j]
                    res = max(res, abs(tp - pold) / (1 / cav[k] + abs(pold)))
                    pnew = pold + eps * (tp - pold)
                    c, Mi = lat[k]
                    cnew = s * pnew / (1 + s * a[j] * pnew)
                    x, sj = xs[k]
                    Mi -= ((cnew - c[j]) / (1 + (cnew - c[j]) * sj)) * np.outer(x, x)
                    c[j] = cnew
                    sites[k][j] = pnew
                continue
            skipped_now.append(j)
        if delta is not None:
            for k in scale:
                lam = np.linalg.eigvalsh((U * negc[k][:, None]).T @ U).min()
                beta[k] = min(1.0, (1 - delta) / -lam) if lam < 0 else 1.0
        e = eps
        for _ in range(11):
            npw, nhw = sites["pi_w"] + e * (tw - sites["pi_w"]), sites["h_w"] + e * (th - sites["h_w"])
            if _w_state(X, y, s2, npw, nhw) is not None:
                break
            e *= 0.5
        sites["pi_w"], sites["h_w"] = npw, nhw
        skipped = set(skipped_now)
        if verbose and (it % 10 == 0 or res < tol):
            lu = shared_precisions(prior, r2, sites["pi_u"])
            lv = shared_precisions(prior, g2, sites["pi_v"])
            print(f"  it {it:>4} residual {res:.3g} step {eps:.3g} skipped {len(skipped_now)} "
                  f"β u {beta['pi_u']:.3g} v {beta['pi_v']:.3g}; λ_min(M) u {lu[0]:.3g} v {lv[0]:.3g}; "
                  f"λ_min(M_neg) u {lu[1]:.3g} v {lv[1]:.3g}", flush=True)
        if res < tol and not skipped_now:
            return sites, it, res, skipped, beta
        if res < tol:
            break
    return sites, it, res, skipped, beta


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["engine", "sequential", "synthetic"])
    parser.add_argument("--d", type=int, default=1000)
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delta", type=float, default=None)
    parser.add_argument("--max-iter", type=int, default=1000)
    args = parser.parse_args()
    s2, r2, g2 = 0.25, 1e-3, 1.0
    if args.mode == "engine":
        X, y, P = random_p_problem(args.d, args.m)
        prior = HorseshoePrior(r2, g2, P, np.ones(args.d))
        engine = HorseshoeEP(X, y, s2, prior, HorseshoeOptions(max_sweeps=args.max_iter))
        trace = []

        def accepted_state(iteration, residual, log_z):
            trace.append((shared_precisions(prior, r2, engine.pi_u)[:2], shared_precisions(prior, g2, engine.pi_v)[:2]))

        t0 = time.perf_counter()
        res = engine.run(sweep_callback=accepted_state)
        print(f"d = {args.d}, m = {args.m}: status {res.status} after {res.n_sweeps} iterations "
              f"({time.perf_counter() - t0:.1f} s), residual {res.residual:.3g}, step halvings {res.n_halvings}, "
              f"held iterations {res.n_held_iter}, damping floor {res.damping_floor}")
        print("accepted states (index among them): λ_min(M) u / v and λ_min(M_neg) u / v:")
        for i in range(0, len(trace), max(1, len(trace) // 12)):
            (mu, nu_), (mv, nv) = trace[i]
            print(f"  {i:>5}: M {mu:9.3g} {mv:9.3g}   M_neg {nu_:9.3g} {nv:9.3g}")
    elif args.mode == "sequential":
        X, y, P = random_p_problem(args.d, args.m)
        prior = HorseshoePrior(r2, g2, P, np.ones(args.d))
        t0 = time.perf_counter()
        sites, it, res, skipped, beta = sequential_ep(X, y, s2, r2, g2, prior, delta=args.delta,
                                                      max_iter=args.max_iter)
        print(f"sequential u/v schedule (delta {args.delta}): {it} iterations, residual {res:.3g}, "
              f"{time.perf_counter() - t0:.1f} s; features with an improper cavity at the end: "
              f"{sorted(skipped)} (the relevant ones are 0..9); β {beta}")
        try:
            state = HorseshoeEP(X, y, s2, prior, HorseshoeOptions(max_sweeps=0), sites).run()
        except ValueError:
            state = None
        print("final state passes the engine's validity check (posterior and every cavity proper):",
              state is not None)
        if state is not None:
            print(f"distance to the unmodified EP targets at the final state (residual): {state.residual:.3g}")
    else:
        import fastep
        from horseshoe_synthetic import make_data
        tasks, _ = make_data(args.seed, 8, 64, 1000, 2, 0.5)
        record = new_record()
        restore = spy_search(record)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", fastep.ConvergenceWarning)
                model = fastep.MultiTaskHorseshoeRegression(n_components=16, random_state=args.seed).fit(
                    [t["X"] for t in tasks], [t["y"] for t in tasks])
        finally:
            restore()
        print(f"seed {args.seed}: learnt-C fit {time.perf_counter() - t0:.0f} s, {model.n_evaluations_} evaluations; "
              f"warnings: {sorted({str(w.message).split(':')[0] for w in caught})}")
        report(record)


if __name__ == "__main__":
    main()
