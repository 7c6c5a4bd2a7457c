"""Why horseshoe EP gets 'stuck' when C = ΔDΔ + ΔPPᵀΔ has a strong low-rank part: a diagnosis,
not a fix (notes and measurements in benchmarks/horseshoe_shared_factor_notes.md).

Notation (supplement eqs 5-13; fastep._horseshoe.parallel_ep.latent_marginals): u = √s(√a∘z + Uζ)
with z ~ N(0, I_d), ζ ~ N(0, I_m) (same for v with s = γ²). A u-site of precision π_j acts on
ζ through c_j = sπ_j/(1 + s a_j π_j); the posterior precision of the shared factor ζ is
M = I + Σ_j c_j U_jᵀU_j (m x m), and the cavity of u_j is proper iff 1 - c_j U_j M⁻¹ U_jᵀ > 0,
i.e. iff M_{-j} = M - c_j U_jᵀU_j ≻ 0. Write M_neg = I + Σ_{c_j < 0} c_j U_jᵀU_j (prior plus the
negative sites): M_neg ≻ 0 implies that the posterior and every cavity are proper.

Modes:

    python benchmarks/horseshoe_shared_factor_diagnosis.py engine --d 1000 --m 10
        the engine's parallel EP on the scaling benchmark's random-P problem
        (n = 100, P = 0.3 N(0, 1), σ² = 0.25, ρ² = 1e-3, γ² = 1): every rejected proposal
        classified (shared-factor posterior M not ≻ 0 / cavity of a positive site with
        M_neg indefinite / other), λ_min(M) and λ_min(M_neg) along the run
    python benchmarks/horseshoe_shared_factor_diagnosis.py sequential --d 1000 --m 10 [--delta 0.01]
        plain-numpy prototype: w-sites in parallel, u/v-sites one at a time (Gauss-Seidel,
        rank-1 updates of M⁻¹; a damped rank-1 step from a proper cavity keeps the posterior
        proper by construction); features whose cavity is improper are skipped. With --delta,
        negative u/v targets are scaled by a common β so that M_neg(targets) ≽ δI
        (this changes EP's fixed point; see the notes)
    python benchmarks/horseshoe_shared_factor_diagnosis.py synthetic --seed 0
        the learnt-C fit of benchmarks/horseshoe_synthetic.py with every rejected proposal
        classified and the statuses of all EP runs
"""
import argparse
import collections
import os
import sys
import time
import warnings

import numpy as np

from fastep._horseshoe import parallel_ep as eng
from fastep._epcore import horseshoe as core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def shared_precisions(cf, s, pi):
    """(λ_min(M), λ_min(M_neg), min g) for one of the latent vectors (module docstring)."""
    g = 1.0 + s * cf.a * pi
    c = s * pi / g
    M = (cf.U * c[:, None]).T @ cf.U + np.eye(cf.m)
    Mn = (cf.U * np.minimum(c, 0.0)[:, None]).T @ cf.U + np.eye(cf.m)
    return np.linalg.eigvalsh(M).min(), np.linalg.eigvalsh(Mn).min(), g.min()


def classify(task, s2, r2, g2, cf, sites, counter):
    """Why a site configuration is invalid (adds to ``counter``)."""
    wm = eng.w_marginals(task, s2, sites["pi_w"], sites["h_w"])
    if wm is None:
        counter["w posterior"] += 1
    elif not np.all(wm["cav_prec"] > 0):
        counter["w cavity"] += 1
    for name, s, pi in (("u", r2, sites["pi_u"]), ("v", g2, sites["pi_v"])):
        lm = eng.latent_marginals(cf, s, pi)
        lam, lam_neg, gmin = shared_precisions(cf, s, pi)
        if lm is None:
            counter[f"{name}: posterior improper (every g_j > 0, shared-factor M not PD)"
                    if gmin > 0 else f"{name}: posterior improper (some g_j <= 0)"] += 1
        elif not np.all(lm["cav_var"] > 0):
            bad = ~(lm["cav_var"] > 0)
            kind = "positive" if np.all(pi[bad] > 0) else "some non-positive"
            counter[f"{name}: cavity improper ({kind} sites; M_neg {'indefinite' if lam_neg <= 0 else 'PD'})"] += 1


def spy_engine(record):
    """Patch eng._marginals and eng.run_task_ep to classify rejections and record statuses."""
    orig_m, orig_run = eng._marginals, eng.run_task_ep

    def marginals(task, s2, r2, g2, cf, sites, **kw):
        out = orig_m(task, s2, r2, g2, cf, sites, **kw)
        record["calls"] += 1
        if out is None:
            classify(task, s2, r2, g2, cf, sites, record["reasons"])
        else:
            record["trace"].append((shared_precisions(cf, r2, sites["pi_u"])[:2],
                                    shared_precisions(cf, g2, sites["pi_v"])[:2]))
        return out

    def run(task, s2, r2, g2, cf, sites, **kw):
        res = orig_run(task, s2, r2, g2, cf, sites, **kw)
        record["status"][res["status"]] += 1
        if res["status"] != "converged":
            record["stopped"].append((res["status"], res["n_iter"], res["residual"],
                                      shared_precisions(cf, r2, sites["pi_u"])[1],
                                      shared_precisions(cf, g2, sites["pi_v"])[1]))
        return res

    eng._marginals, eng.run_task_ep = marginals, run
    return lambda: setattr(eng, "_marginals", orig_m) or setattr(eng, "run_task_ep", orig_run)


def new_record():
    return {"calls": 0, "reasons": collections.Counter(), "trace": [], "status": collections.Counter(),
            "stopped": []}


def report(record):
    print(f"marginal evaluations {record['calls']}; EP statuses {dict(record['status'])}")
    print("rejected proposals by reason:")
    for k, v in record["reasons"].most_common():
        print(f"  {v:>7}  {k}")
    for st, it, res, lu, lv in record["stopped"][:10]:
        print(f"  stopped ({st}) after {it} iterations, residual {res:.3g}: λ_min(M_neg) u {lu:.3g}, v {lv:.3g}")


def random_p_problem(d, m, n=100, seed=0):
    from horseshoe_scaling import make
    return make(n, d, m, seed=seed)


def sequential_ep(task, s2, r2, g2, cf, *, delta=None, damping=0.5, damping_decay=0.99, floor=0.3,
                  tol=1e-8, max_iter=500, w_floor=-0.1, verbose=True):
    """Prototype schedule (module docstring); returns sites, iterations, residual, skipped features, β."""
    sites = eng.initial_sites(task.d, r2, g2)
    U, a, d = cf.U, cf.a, task.d
    scale = {"pi_u": r2, "pi_v": g2}
    beta = {"pi_u": 1.0, "pi_v": 1.0}
    skipped = set()
    res = np.inf
    for it in range(max_iter):
        wm = eng.w_marginals(task, s2, sites["pi_w"], sites["h_w"])
        cav_m, cav_v = wm["cav_mean"], 1.0 / wm["cav_prec"]
        eps = max(damping * damping_decay ** it, floor)
        lat = {}
        for k, s in scale.items():
            c = s * sites[k] / (1.0 + s * a * sites[k])
            lat[k] = (c, np.linalg.inv((U * c[:, None]).T @ U + np.eye(cf.m)))
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
            w_new = eng.w_marginals(task, s2, npw, nhw)
            if w_new is not None and np.all(w_new["cav_prec"] > 0):
                break
            e *= 0.5
        sites["pi_w"], sites["h_w"] = npw, nhw
        skipped = set(skipped_now)
        if verbose and (it % 10 == 0 or res < tol):
            lu = shared_precisions(cf, r2, sites["pi_u"])
            lv = shared_precisions(cf, g2, sites["pi_v"])
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
        task, cf = random_p_problem(args.d, args.m)
        record = new_record()
        restore = spy_engine(record)
        t0 = time.perf_counter()
        try:
            res = eng.run_task_ep(task, s2, r2, g2, cf, eng.initial_sites(task.d, r2, g2), max_iter=args.max_iter)
        finally:
            restore()
        print(f"d = {args.d}, m = {args.m}: status {res['status']} after {res['n_iter']} iterations "
              f"({time.perf_counter() - t0:.1f} s), residual {res['residual']:.3g}, held iterations "
              f"{res['n_held_iter']}, damping floor {res['min_damping']}")
        report(record)
        tr = record["trace"]
        print("accepted states (index among them): λ_min(M) u / v and λ_min(M_neg) u / v:")
        for i in range(0, len(tr), max(1, len(tr) // 12)):
            (mu, nu_), (mv, nv) = tr[i]
            print(f"  {i:>5}: M {mu:9.3g} {mv:9.3g}   M_neg {nu_:9.3g} {nv:9.3g}")
    elif args.mode == "sequential":
        task, cf = random_p_problem(args.d, args.m)
        t0 = time.perf_counter()
        sites, it, res, skipped, beta = sequential_ep(task, s2, r2, g2, cf, delta=args.delta, max_iter=args.max_iter)
        print(f"sequential u/v schedule (delta {args.delta}): {it} iterations, residual {res:.3g}, "
              f"{time.perf_counter() - t0:.1f} s; features with an improper cavity at the end: "
              f"{sorted(skipped)} (the relevant ones are 0..9); β {beta}")
        state = eng._marginals(task, s2, r2, g2, cf, sites)
        print("final state passes the engine's validity check (posterior and every cavity proper):",
              state is not None)
        if state is not None:
            out = core.site_step(state["w"]["cav_mean"], state["cav_var"], state["u"]["cav_var"],
                                 state["v"]["cav_var"], state["w"]["mean"], state["w"]["var"], state["u"]["var"],
                                 state["v"]["var"], sites["pi_w"], sites["h_w"], sites["pi_u"], sites["pi_v"])[0]
            print(f"distance to the unmodified EP targets at the final state (residual): {out[5].max():.3g}")
    else:
        import fastep
        from horseshoe_synthetic import make_data
        tasks, _ = make_data(args.seed, 8, 64, 1000, 2, 0.5)
        record = new_record()
        restore = spy_engine(record)
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
