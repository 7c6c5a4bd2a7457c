"""Fixed problems whose fitted results are recorded in ``tests/golden.npz``.

The golden file guards refactoring: a change that restructures the engines but is
meant to leave the numbers alone must reproduce every array recorded here.  Each
problem fits one estimator configuration on small synthetic data (fixed seeds) and
records its log evidence, site parameters, every other numeric fitted attribute and
its predictions on a held-out grid.

Record (only when a change is *meant* to move the numbers, and say why in the commit)::

    python tests/golden_problems.py            # rewrites tests/golden.npz
    python tests/golden_problems.py --check    # bitwise comparison, prints differences
"""
import sys
import warnings
from pathlib import Path

import numpy as np

GOLDEN_PATH = Path(__file__).with_name('golden.npz')

# Keys that hold wall-clock or otherwise non-deterministic values.
_VOLATILE = ('time', 'seconds', 'elapsed', 'wall')


def _binary(seed=0, n=48, d=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.4 * rng.normal(size=n) > 0).astype(int)
    Xt = rng.normal(size=(15, d))
    return X, y, Xt


def _multiclass(seed=1, n=60, d=2):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 2.0], [-1.8, -1.0], [1.8, -1.0]])
    y = np.repeat(np.arange(3), n // 3)
    X = centres[y] + 0.9 * rng.normal(size=(n, d))
    Xt = 2.0 * rng.normal(size=(12, d))
    return X, y, Xt


def _regression(seed=2, n=50, d=2, outliers=False):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=n)
    if outliers:
        y[::9] += 3.0
    Xt = rng.uniform(-2, 2, size=(12, d))
    return X, y, Xt


def _ordinal(seed=3, n=60, d=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    f = X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.normal(size=n)
    y = np.digitize(f, [-0.6, 0.6])
    Xt = rng.normal(size=(12, d))
    return X, y, Xt


def _stalling(seed, n=60, sort=False):
    """sin(2x) with 20 % gross outliers: parallel fractional EP stalls, the double loop runs."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, n)
    if sort:
        x = np.sort(x)
    y = np.sin(2 * x) + 0.05 * rng.standard_normal(n)
    outlier = rng.random(n) < 0.2
    y[outlier] += rng.choice([-1, 1], outlier.sum()) * rng.uniform(2, 6, outlier.sum())
    return x[:, None], y, np.linspace(-2.8, 2.8, 9)[:, None]


def _sparse_linear(seed=4, n=40, d=8):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.zeros(d)
    w[[0, 3]] = [2.0, -1.5]
    y = X @ w + 0.2 * rng.normal(size=n)
    Xt = rng.normal(size=(10, d))
    return X, y, Xt


def _rank_k(seed=5, n=50, k=2, d=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k, d))
    w = np.array([1.0, -2.0, 0.5])
    Y = np.einsum('nkd,d->nk', X, w) + 0.3 * rng.normal(size=(n, k))
    return X, Y


def problems():
    """Name -> zero-argument callable returning ``(estimator, fit_args, X_test)``."""
    import fastep
    from fastep.kernels import RBF, Linear
    from fastep.likelihoods import StudentT, Logistic

    Xb, yb, Xbt = _binary()
    Xm, ym, Xmt = _multiclass()
    Xr, yr, Xrt = _regression()
    Xo, yo, Xot = _regression(outliers=True)
    Xd, yd, Xdt = _ordinal()
    Xs, ys, Xst = _sparse_linear()
    Xk, Yk = _rank_k()
    rbf = lambda: RBF(variance=2.0, inverse_width=0.7)  # noqa: E731

    out = {}

    def add(name, make, args, Xt):
        out[name] = lambda: (make(), args, Xt)

    GPC = fastep.GaussianProcessClassifier
    GPR = fastep.GaussianProcessRegressor
    SGPC = fastep.SparseGPClassifier
    SGPR = fastep.SparseGPRegressor
    for schedule in ('sequential', 'blocked', 'parallel'):
        add(f'gpc_{schedule}', lambda s=schedule: GPC(kernel=rbf(), optimizer=None, schedule=s),
            (Xb, yb), Xbt)
    add('gpc_logistic_random_order', lambda: GPC(kernel=rbf(), likelihood=Logistic(), optimizer=None,
                                                 order='random', random_state=0), (Xb, yb), Xbt)
    add('gpc_learnt', lambda: GPC(), (Xb, yb), Xbt)
    add('gpc_ovr_multiclass', lambda: GPC(kernel=rbf(), optimizer=None), (Xm, ym), Xmt)
    add('gpc_multinomial', lambda: GPC(kernel=rbf(), optimizer=None, multi_class='multinomial'),
        (Xm, ym), Xmt)
    add('gpc_multinomial_learnt', lambda: GPC(multi_class='multinomial'), (Xm[::2], ym[::2]), Xmt)
    add('gpr_gaussian', lambda: GPR(kernel=rbf(), noise_variance=0.05, optimizer=None), (Xr, yr), Xrt)
    add('gpr_learnt', lambda: GPR(), (Xr, yr), Xrt)
    add('gpr_student_t', lambda: GPR(kernel=rbf(), likelihood=StudentT(4.0, 0.1), optimizer=None),
        (Xo, yo), Xot)
    add('gpr_student_t_power', lambda: GPR(kernel=rbf(), likelihood=StudentT(4.0, 0.1), power=0.5,
                                           optimizer=None), (Xo, yo), Xot)
    add('gpr_student_t_learnt', lambda: GPR(likelihood=StudentT(4.0, 0.1)), (Xo, yo), Xot)
    for approximation in ('fitc', 'dtc'):
        add(f'sgpc_{approximation}', lambda a=approximation: SGPC(kernel=rbf(), n_inducing=12, approximation=a,
                                                                  optimizer=None, random_state=0),
            (Xb, yb), Xbt)
    add('sgpc_power', lambda: SGPC(kernel=rbf(), n_inducing=12, power=0.5, optimizer=None, random_state=0),
        (Xb, yb), Xbt)
    add('sgpc_parallel', lambda: SGPC(kernel=rbf(), n_inducing=12, schedule='parallel', optimizer=None,
                                      random_state=0), (Xb, yb), Xbt)
    Xl, yl, Xlt = _stalling(0)
    add('gpr_double_loop', lambda: GPR(RBF(1.0, 1 / 0.3 ** 2), likelihood=StudentT(dof=10.0, scale=0.01),
                                       optimizer=None, jitter=1e-8, tol=1e-6, max_sweeps=500), (Xl, yl), Xlt)
    Xl, yl, Xlt = _stalling(0, sort=True)
    add('sgpr_double_loop', lambda: SGPR(RBF(1.0, 1 / 0.3 ** 2), likelihood=StudentT(dof=4.0, scale=0.01),
                                         optimizer=None, inducing_init=np.linspace(-3, 3, 30)[:, None],
                                         jitter=1e-8, tol=1e-6, max_sweeps=500), (Xl, yl), Xlt)
    add('sgpc_default', lambda: SGPC(random_state=0), (Xb, yb), Xbt)
    add('sgpc_learn_inducing', lambda: SGPC(n_inducing=8, learn_inducing=True, random_state=0),
        (Xb, yb), Xbt)
    add('sgpr_gaussian', lambda: SGPR(kernel=rbf(), noise_variance=0.05, n_inducing=10, optimizer=None,
                                      random_state=0), (Xr, yr), Xrt)
    add('sgpr_default', lambda: SGPR(random_state=0), (Xr, yr), Xrt)
    add('sgpr_student_t', lambda: SGPR(kernel=rbf(), likelihood=StudentT(4.0, 0.1), n_inducing=10,
                                       optimizer=None, random_state=0), (Xo, yo), Xot)
    add('sgpr_student_t_learnt', lambda: SGPR(likelihood=StudentT(4.0, 0.1), n_inducing=10, random_state=0),
        (Xo, yo), Xot)
    add('ivmc_default', lambda: fastep.IVMClassifier(active_set_size=15, random_state=0), (Xb, yb), Xbt)
    add('ivmc_active_set', lambda: fastep.IVMClassifier(active_set_size=15, kernel_objective='active_set',
                                                        random_state=0), (Xb, yb), Xbt)
    add('ivmc_refine_exchange', lambda: fastep.IVMClassifier(kernel=rbf(), optimizer=None, active_set_size=15,
                                                             refine_sweeps=3, exchange='greedy',
                                                             random_state=0), (Xb, yb), Xbt)
    add('ivmc_multiclass', lambda: fastep.IVMClassifier(active_set_size=15, random_state=0), (Xm, ym), Xmt)
    add('ivmr_default', lambda: fastep.IVMRegressor(active_set_size=15, random_state=0), (Xr, yr), Xrt)
    add('ivm_ordinal', lambda: fastep.IVMOrdinalRegressor(active_set_size=20, random_state=0), (Xd, yd), Xdt)
    add('linear_probit', lambda: fastep.LinearEPClassifier(), (Xb, yb), Xbt)
    add('linear_logistic_intercept', lambda: fastep.LinearEPClassifier(Logistic(), fit_intercept=True,
                                                                       damping=0.7), (Xb, yb), Xbt)
    add('linear_moment_form', lambda: fastep.LinearEPClassifier(update_form='moment'), (Xb, yb), Xbt)
    add('linear_regressor', lambda: fastep.LinearEPRegressor(noise_variance=0.1), (Xr, yr), Xrt)
    add('rank_k_gaussian', lambda: fastep.RankKEP(noise_cov=0.1 * np.eye(2)), (Xk, Yk), None)
    add('rank_k_probit', lambda: fastep.RankKEP(fastep.Probit(), prior_cov=2.0), (Xk, (Yk > 0) * 2 - 1),
        None)
    add('horseshoe', lambda: fastep.HorseshoeRegression(random_state=0, max_iter=200), (Xs, ys), Xst)
    add('horseshoe_dependent', lambda: fastep.HorseshoeRegression(n_components=2, random_state=0,
                                                                  max_iter=200), (Xs, ys), Xst)
    add('horseshoe_multitask', lambda: fastep.MultiTaskHorseshoeRegression(random_state=0, max_iter=100),
        ([Xs[:20], Xs[20:]], [ys[:20], ys[20:]]), Xst)
    return out


def _is_report(value):
    """Whether ``value`` is a compiled report with named fields (the IVM refinement's results)."""
    from fastep._epcore.ivm_refine import ExchangeResult, RefineResult
    return isinstance(value, (RefineResult, ExchangeResult))


def _flatten(prefix, value, out, depth=0):
    if any(v in prefix.lower() for v in _VOLATILE):
        return
    if isinstance(value, (bool, np.bool_)):
        out[prefix] = np.asarray(value)
    elif isinstance(value, (int, float, np.integer, np.floating)):
        out[prefix] = np.asarray(value)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in 'biuf':
            out[prefix] = value.copy()
    elif _is_report(value) and depth < 4:                 # recorded as the dict of its fields
        _flatten(prefix, value.as_dict(), out, depth)
    elif isinstance(value, dict) and depth < 4:
        for key in sorted(value, key=str):
            _flatten(f'{prefix}.{key}', value[key], out, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 4:
        for i, item in enumerate(value):
            _flatten(f'{prefix}[{i}]', item, out, depth + 1)
    elif hasattr(value, 'theta') and hasattr(value, 'bounds') and depth < 4:   # kernels
        _flatten(f'{prefix}.theta', np.asarray(value.theta, dtype=float), out, depth + 1)
        if hasattr(value, 'get_params'):
            params = {k: v for k, v in value.get_params().items()
                      if isinstance(v, (int, float, np.ndarray)) and not isinstance(v, bool)}
            _flatten(f'{prefix}.params', params, out, depth + 1)
    elif type(value).__module__.startswith('fastep') and hasattr(value, '__dict__') and depth < 3:
        for key, item in sorted(vars(value).items()):
            if key.endswith('_') and not key.startswith('_'):
                _flatten(f'{prefix}.{key}', item, out, depth + 1)
        if hasattr(value, 'get_params') and not hasattr(value, 'fit'):
            params = {k: v for k, v in value.get_params().items()
                      if isinstance(v, (int, float, np.ndarray)) and not isinstance(v, bool)}
            _flatten(f'{prefix}.params', params, out, depth + 1)


def snapshot(estimator, X_test):
    """Numeric fitted attributes and predictions of a fitted estimator, by name."""
    out = {}
    for key, value in sorted(vars(estimator).items()):
        if key.endswith('_') and not key.startswith('_'):
            _flatten(key, value, out)
    if X_test is not None:
        if hasattr(estimator, 'predict_proba'):
            out['predict_proba'] = np.asarray(estimator.predict_proba(X_test))
        if hasattr(estimator, 'classes_'):
            out['predict'] = np.asarray(estimator.predict(X_test))
        elif hasattr(estimator, 'predict'):
            task = {'task': 0} if type(estimator).__name__.startswith('MultiTask') else {}
            mean, std = estimator.predict(X_test, return_std=True, **task)
            out['predict_mean'] = np.asarray(mean)
            out['predict_std'] = np.asarray(std)
    return out


def run(name, make):
    from threadpoolctl import threadpool_limits
    estimator, args, X_test = make()
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        estimator.fit(*args)
        return snapshot(estimator, X_test)


def record_all():
    arrays = {}
    for name, make in problems().items():
        for key, value in run(name, make).items():
            arrays[f'{name}/{key}'] = value
    return arrays


def main(argv):
    arrays = record_all()
    if '--check' in argv:
        golden = dict(np.load(GOLDEN_PATH))
        different = sorted(k for k in set(golden) | set(arrays)
                           if k not in golden or k not in arrays
                           or golden[k].shape != arrays[k].shape
                           or not np.array_equal(golden[k], arrays[k]))
        for key in different:
            if key in golden and key in arrays and golden[key].shape == arrays[key].shape:
                diff = np.max(np.abs(golden[key].astype(float) - arrays[key].astype(float)))
                print(f'{key}: max abs difference {diff:.3g}')
            else:
                print(f'{key}: missing or reshaped')
        print(f'{len(arrays)} arrays, {len(different)} not bitwise identical')
        return 1 if different else 0
    np.savez_compressed(GOLDEN_PATH, **arrays)
    print(f'wrote {len(arrays)} arrays to {GOLDEN_PATH}')
    return 0


if __name__ == '__main__':
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main(sys.argv[1:]))
