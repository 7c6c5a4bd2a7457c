"""PROTOTYPE, not the engine (notes: benchmarks/horseshoe_shared_factor_notes.md).

u/v sites updated sequentially (rank-1 updates of the m x m shared-factor precision inverse), w-sites in parallel; negative u/v site targets scaled by a
common factor beta so that prior + negative sites keep the shared-factor precision >= delta I
(sufficient for every u/v cavity and the posterior to be proper). Run as a script it
patches fastep._horseshoe_engine.run_task_ep and runs benchmarks/horseshoe_synthetic.py with the
given arguments, to measure the effect on the estimators (plain Python loop over features: slow):

    python benchmarks/horseshoe_shared_factor_prototype.py --seed 0 --part fastep

The modified EP is not EP: where beta < 1 the negative u/v sites are not at their EP targets, so
the evidence (eq 27) is a different approximation and its gradients (eqs 36-50) are not exact.
"""
import os
import runpy
import sys

import numpy as np
from fastep import _horseshoe_engine as eng
from fastep._epcore import horseshoe as core

DELTA = 0.01


def _setup(cf, s, pi):
    g = 1.0 + s * cf.a * pi
    c = s * pi / g
    return c, np.linalg.inv((cf.U * c[:, None]).T @ cf.U + np.eye(cf.m))


def run_task_ep(task, sigma2, rho2, gamma2, cf, sites, *, damping=0.5, damping_decay=0.99, min_damping=0.3,
                tol=1e-8, max_iter=1000, negative_precision="clip", w_floor=-0.1, n_threads=None, **_):
    wf = float(w_floor) if negative_precision == "clip" else -np.inf
    state = eng._marginals(task, sigma2, rho2, gamma2, cf, sites)
    if state is None:
        raise ValueError("the starting sites give an improper posterior or cavity")
    U, a, d = cf.U, cf.a, task.d
    scale = {"pi_u": rho2, "pi_v": gamma2}
    beta = {"pi_u": 1.0, "pi_v": 1.0}
    status, it, residual = "max_iter", 0, np.inf
    while True:
        if it >= max_iter:
            break
        eps = max(damping * damping_decay ** it, min_damping)
        cav_m, cav_v = state["w"]["cav_mean"], state["cav_var"]
        lat = {k: _setup(cf, scale[k], sites[k]) for k in scale}
        negc = {k: np.zeros(d) for k in scale}
        tw, th = sites["pi_w"].copy(), sites["h_w"].copy()
        res = 0.0
        saved = {k: v.copy() for k, v in sites.items()}
        for j in range(d):
            Uj = U[j]
            cav, xs = {}, {}
            ok = True
            for k, s in scale.items():
                c, Mi = lat[k]
                x = Mi @ Uj if cf.m else np.zeros(0)
                sj = float(Uj @ x) if cf.m else 0.0
                den = 1.0 - c[j] * sj
                if den <= 0:
                    ok = False
                    break
                cav[k] = s * (a[j] + sj / den)
                xs[k] = (x, sj)
            if not ok:
                res = max(res, 1.0)
                continue
            ls, mean, var, eu2, ev2, t = core.tilted_moments(cav_m[j], cav_v[j], cav["pi_u"], cav["pi_v"])
            tgt = {"pi_u": 1 / eu2[0] - 1 / cav["pi_u"], "pi_v": 1 / ev2[0] - 1 / cav["pi_v"]}
            tpw = 1 / var[0] - 1 / cav_v[j]; thw = mean[0] / var[0] - cav_m[j] / cav_v[j]
            if tpw * cav_v[j] < wf:
                tpw = wf / cav_v[j]; thw = (mean[0] * (1 + wf) - cav_m[j]) / cav_v[j]
            tw[j], th[j] = tpw, thw
            pw = 1 / cav_v[j] + abs(sites["pi_w"][j])
            res = max(res, abs(tpw - sites["pi_w"][j]) / pw, abs(thw - sites["h_w"][j]) / np.sqrt(pw))
            for k, s in scale.items():
                tp = tgt[k]
                ct = s * tp / (1 + s * a[j] * tp)
                if ct < 0:
                    negc[k][j] = ct
                    ct *= beta[k]
                    tp = ct / (s * (1 - a[j] * ct))
                pold = sites[k][j]
                res = max(res, abs(tp - pold) / (1 / cav[k] + abs(pold)))
                pnew = pold + eps * (tp - pold)
                c, Mi = lat[k]
                cnew = s * pnew / (1 + s * a[j] * pnew)
                x, sj = xs[k]
                if cf.m:
                    Mi -= ((cnew - c[j]) / (1 + (cnew - c[j]) * sj)) * np.outer(x, x)
                c[j] = cnew
                sites[k][j] = pnew
        for k in scale:
            if cf.m:
                lam = np.linalg.eigvalsh((U * negc[k][:, None]).T @ U).min()
                beta[k] = min(1.0, (1 - DELTA) / -lam) if lam < 0 else 1.0
        residual = res
        if res < tol:
            for k in sites:
                sites[k][...] = saved[k]   # the state the residual was measured at
            status = "converged"
            break
        e = eps
        base = {k: sites[k].copy() for k in ("pi_w", "h_w")}
        new_state = None
        for _h in range(11):
            sites["pi_w"][...] = base["pi_w"] + e * (tw - base["pi_w"])
            sites["h_w"][...] = base["h_w"] + e * (th - base["h_w"])
            new_state = eng._marginals(task, sigma2, rho2, gamma2, cf, sites)
            if new_state is not None:
                break
            e *= 0.5
        if new_state is None:
            for k in sites:
                sites[k][...] = saved[k]
            status = "stuck"
            break
        state = new_state
        it += 1
    final = eng._marginals(task, sigma2, rho2, gamma2, cf, sites, gradients=True, keep_factors=True)
    st = final
    out, n_bad, n_clipped = core.site_step(
        st["w"]["cav_mean"], st["cav_var"], st["u"]["cav_var"], st["v"]["cav_var"], st["w"]["mean"], st["w"]["var"],
        st["u"]["var"], st["v"]["var"], sites["pi_w"], sites["h_w"], sites["pi_u"], sites["pi_v"], w_floor=wf)
    log_z = float(np.sum(out[4]) + st["w"]["log_z"] + st["u"]["log_z"] + st["v"]["log_z"])
    return {"converged": status == "converged", "status": status, "n_iter": it, "residual": residual,
            "state": final, "site": out, "log_z": log_z, "n_clipped": n_clipped, "n_held": 0, "n_held_iter": 0,
            "min_damping": min_damping, "beta": dict(beta)}


if __name__ == "__main__":
    eng.run_task_ep = run_task_ep
    sys.argv = ["horseshoe_synthetic.py"] + sys.argv[1:]
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "horseshoe_synthetic.py"),
                   run_name="__main__")
