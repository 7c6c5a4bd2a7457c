"""scikit-learn's estimator protocol, checked by scikit-learn itself.

scikit-learn is a test extra, never a runtime dependency: the last test imports and fits
fastep with scikit-learn made unimportable.
"""
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
pd = pytest.importorskip("pandas")

from sklearn.base import clone  # noqa: E402
from sklearn.calibration import CalibratedClassifierCV  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import fastep  # noqa: E402
from fastep.kernels import RBF  # noqa: E402
from support import ESTIMATORS as REGISTRY  # noqa: E402

# Every estimator as a user first meets it (default-constructed), plus the variants that take
# another engine path; the checks fit each a few dozen times on tiny data sets (some with fewer
# rows than any default size, e.g. n_inducing, must clip).
VARIANTS = [
    fastep.GaussianProcessClassifier(multi_class="multinomial"),
    fastep.GaussianProcessRegressor(likelihood="student_t"),
    fastep.SparseGPRegressor(likelihood="student_t"),
    fastep.SparseGPClassifier(multi_class="multinomial"),
    fastep.IVMClassifier(multi_class="shared_budget"),
]
ESTIMATORS = [spec.cls() for spec in REGISTRY.values() if spec.fit_shape == "Xy"] + VARIANTS
# the registered estimators that scikit-learn's checks cannot drive (their fit takes other shapes)
NOT_CHECKED = {spec.name for spec in REGISTRY.values() if spec.fit_shape != "Xy"}


def test_every_estimator_with_a_scikit_learn_fit_is_checked():
    assert NOT_CHECKED == {"MultiTaskHorseshoeRegression", "LinearEPRankK"}
    assert {type(e).__name__ for e in ESTIMATORS} == set(REGISTRY) - NOT_CHECKED


def _mark_repeats_slow(parametrization):
    """``parametrize_with_checks``' cases, with the training checks' repeats on read-only
    memory maps and float32 copies, and every check of the variants (multinomial, Student-t), in the slow
    tier: the default tier runs every check on each default-constructed estimator once."""
    argnames, cases = parametrization.args
    ids = parametrization.kwargs["ids"]
    params = []
    for case in cases:
        values, marks = (tuple(case.values), list(case.marks)) if hasattr(case, "marks") else (case, [])
        name = ids(values[1])
        if name.startswith(("check_classifiers_train(", "check_regressors_train(")) and "readonly_memmap=True" in name:
            marks.append(pytest.mark.slow)
        elif repr(values[0]) in {repr(variant) for variant in VARIANTS}:
            marks.append(pytest.mark.slow)       # the variants (nested EP, Student-t) have the longest fits
        params.append(pytest.param(*values, marks=marks))
    return pytest.mark.parametrize(argnames, params, ids=ids)


@_mark_repeats_slow(parametrize_with_checks(ESTIMATORS))
def test_scikit_learn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        check(estimator)


def _classification(n=120, seed=0, labels=("no", "yes")):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * np.array([1.0, 50.0, 0.01]) + np.array([0.0, 200.0, 5.0])
    score = X[:, 0] + (X[:, 1] - 200.0) / 50.0 + 0.3 * rng.normal(size=n)
    return X, np.where(score > 0, labels[1], labels[0])


def test_clone_copies_kernel_and_likelihood_parameters():
    est = fastep.GaussianProcessClassifier(RBF(2.0, 0.5), fastep.Probit(slope=3.0), tol=1e-5)
    copy = clone(est)
    assert copy is not est and copy.kernel is not est.kernel and copy.likelihood is not est.likelihood
    assert repr(copy) == repr(est)
    X, y = _classification()
    est.fit(X, y)
    assert not hasattr(clone(est), "classes_")          # clone is unfitted
    assert repr(est.kernel) == "RBF(variance=2.0, inverse_width=0.5)"  # fit does not change the parameter


def test_pipeline_with_standard_scaler_and_pandas_input():
    X, y = _classification()
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    labels = pd.Series(y, name="label")
    pipe = make_pipeline(StandardScaler(), fastep.GaussianProcessClassifier()).fit(frame, labels)
    assert list(pipe.classes_) == ["no", "yes"]
    assert pipe.score(frame, labels) > 0.85
    proba = pipe.predict_proba(frame.iloc[:5])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


def test_grid_search_over_a_kernel_hyperparameter():
    X, y = _classification(seed=1)
    X = StandardScaler().fit_transform(X)
    search = GridSearchCV(fastep.GaussianProcessClassifier(RBF(), optimizer=None),
                          {"kernel__inverse_width": [0.01, 0.3, 3.0]}, cv=3).fit(X, y)
    assert search.best_params_["kernel__inverse_width"] in (0.01, 0.3, 3.0)
    assert search.best_estimator_.kernel.get_params()["inverse_width"] == search.best_params_["kernel__inverse_width"]
    assert search.score(X, y) > 0.8


@pytest.mark.parametrize("make", [
    lambda: fastep.SparseGPClassifier(n_inducing=10),
    lambda: fastep.IVMClassifier(active_set_size=30, n_iterations=1),
    lambda: fastep.LinearEPClassifier(),
], ids=["sparse", "ivm", "linear"])
def test_cross_val_score_with_string_labels(make):
    X, y = _classification(seed=2, labels=("cat", "dog"))
    X = StandardScaler().fit_transform(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastep.ConvergenceWarning)
        scores = cross_val_score(make(), X, y, cv=3)
    assert scores.shape == (3,) and np.all(scores > 0.7)


def test_calibrated_classifier_cv_wraps_a_fastep_classifier():
    X, y = _classification(seed=3)
    X = StandardScaler().fit_transform(X)
    calibrated = CalibratedClassifierCV(fastep.GaussianProcessClassifier(optimizer=None), cv=3).fit(X, y)
    proba = calibrated.predict_proba(X)
    assert proba.shape == (X.shape[0], 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert calibrated.score(X, y) > 0.85


def test_sklearn_recognises_fastep_errors_and_warnings():
    from sklearn.exceptions import DataConversionWarning, NotFittedError

    with pytest.raises(NotFittedError):
        fastep.GaussianProcessClassifier().predict(np.ones((2, 2)))
    with pytest.raises(fastep.NotFittedError):                  # still fastep's own class too
        fastep.IVMRegressor().predict(np.ones((2, 2)))
    X, y = _classification(40)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        fastep.LinearEPClassifier().fit(X, y.reshape(-1, 1))


def test_fastep_imports_and_fits_without_scikit_learn():
    script = textwrap.dedent("""
        import sys

        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "sklearn" or name.startswith("sklearn."):
                    raise ImportError("scikit-learn is blocked in this test")

        sys.meta_path.insert(0, _Block())
        import numpy as np
        import fastep

        rng = np.random.default_rng(0)
        X = rng.normal(size=(40, 2))
        y = np.where(X[:, 0] > 0, "a", "b")
        clf = fastep.GaussianProcessClassifier().fit(X, y)
        assert clf.score(X, y) > 0.8
        try:
            fastep.GaussianProcessClassifier().predict(X)
        except fastep.NotFittedError:
            pass
        assert "sklearn" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# LinearEPRankK takes a (n, k, d) design (one k x d block per sample) and MultiTaskHorseshoeRegression a
# list of tasks: scikit-learn's checks (2-D X) cannot express either input, so they are not run
# through check_estimator; they still take part in the parameter protocol (clone, set_params).
@pytest.mark.parametrize("make", [
    lambda: fastep.LinearEPRankK(noise_cov=0.5 * np.eye(2), tol=1e-9),
    lambda: fastep.MultiTaskHorseshoeRegression(n_components=1, max_optimizer_iter=3, random_state=0),
], ids=["LinearEPRankK", "MultiTaskHorseshoeRegression"])
def test_estimators_with_structured_inputs_follow_the_parameter_protocol(make):
    est = make()
    copy = clone(est)
    assert type(copy) is type(est) and repr(copy) == repr(est)
    params = est.get_params()
    for name, value in params.items():
        if isinstance(value, np.ndarray):
            assert copy.get_params()[name] is not value and np.array_equal(copy.get_params()[name], value)
    assert est.set_params(tol=1e-7) is est and est.tol == 1e-7
    with pytest.raises(ValueError, match="invalid parameter"):
        est.set_params(not_a_parameter=1)
