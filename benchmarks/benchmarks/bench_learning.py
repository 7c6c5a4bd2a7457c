"""asv: learning the hyperparameters with the estimators' defaults, in seconds.

Small versions of the fits of ``benchmarks/learning_stop.py`` and ``learning_speed.py``: the
fit time (``time_``), the number of evidence evaluations of the search and the test error
(``track_``), so that a regression in learning speed or accuracy shows in the history.

- digits (scikit-learn's bundled 8x8 images, pixels / 16), 200 training rows, 10 classes, the
  other rows as test set: one-vs-rest and multinomial;
- the dense-GP toy, n = 300, test on 2000 new points;
- a small 3-class problem with two irrelevant inputs, learnt with an ARD kernel by the
  multinomial model (n = 200);
- Neal's outlier regression (Student-t noise, 100 points): test RMSE against the noise-free curve.
"""
import warnings

import numpy as np

from fastep import GaussianProcessClassifier, GaussianProcessRegressor, SparseGPClassifier


def _digits(n_train=200, seed=0):
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(y.shape[0])
    return X[order[:n_train]] / 16.0, y[order[:n_train]], X[order[n_train:]] / 16.0, y[order[n_train:]]


def _dense_gp_toy(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    return X, np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)


def _fit(model, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(X, y)


class LearnDigits:
    """Digits, 200 training rows: one-vs-rest and the multinomial model with their defaults.

    The ``track_`` figures come from one fit per model made once for the class
    (``setup_cache``); ``time_fit`` fits again.
    """
    params = [["one_vs_rest", "multinomial"]]
    param_names = ["multi_class"]
    timeout = 600
    number = 1
    repeat = (1, 3, 120.0)

    def setup_cache(self):
        try:
            data = _digits()
        except ImportError:                        # scikit-learn (benchmark requirement) missing
            return None
        tracked = {}
        for multi_class in self.params[0]:
            model = _fit(GaussianProcessClassifier(multi_class=multi_class), *data[:2])
            tracked[multi_class] = (int(np.sum(model.n_evaluations_)),
                                    100.0 * float(np.mean(model.predict(data[2]) != data[3])))
        return data, tracked

    setup_cache.timeout = 900                      # two fits (asv's default is the class timeout)

    def setup(self, cache, multi_class):
        if cache is None:
            raise NotImplementedError("scikit-learn is needed for the digits data")

    def time_fit(self, cache, multi_class):
        data, _ = cache
        _fit(GaussianProcessClassifier(multi_class=multi_class), *data[:2])

    def track_evaluations(self, cache, multi_class):
        return cache[1][multi_class][0]

    def track_test_error_percent(self, cache, multi_class):
        return cache[1][multi_class][1]


class LearnDenseGPToy:
    """The dense GP classifier's default fit on the dense-GP toy (n = 300)."""
    number = 1
    repeat = (1, 5, 60.0)

    def setup_cache(self):
        X, y = _dense_gp_toy(300, 0)
        X_test, y_test = _dense_gp_toy(2000, 1)
        model = _fit(GaussianProcessClassifier(), X, y)
        return X, y, int(model.n_evaluations_), 100.0 * float(np.mean(model.predict(X_test) != y_test))

    def time_fit(self, cache):
        _fit(GaussianProcessClassifier(), cache[0], cache[1])

    def track_evaluations(self, cache):
        return cache[2]

    def track_test_error_percent(self, cache):
        return cache[3]


def _small_ard_multinomial(n, seed):
    """3 classes on 4 inputs uniform on [-2, 2], of which the last two are irrelevant: the class
    is the argmax of 2 sin(w_k . x[:2]) plus noise of sd 0.7, w_k unit vectors 120 degrees apart."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 4))
    angles = np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3])
    W = np.c_[np.cos(angles), np.sin(angles)]
    f = 2.0 * np.sin(X[:, :2] @ W.T) + 0.7 * rng.standard_normal((n, 3))
    return X, np.argmax(f, axis=1)


class LearnSmallARDMultinomial:
    """The multinomial model with an ARD kernel on a small 3-class problem (n = 200, two of its
    four inputs irrelevant), default damping: the fit whose nested-EP damping rule decides its
    time (each evaluation's outer iterations), test error on 2000 new points."""
    number = 1
    repeat = (1, 5, 60.0)

    @staticmethod
    def _model():
        from fastep.kernels import RBFARD
        return GaussianProcessClassifier(RBFARD([0.5] * 4, 1.0, 1.0), multi_class="multinomial")

    def setup_cache(self):
        X, y = _small_ard_multinomial(200, 0)
        X_test, y_test = _small_ard_multinomial(2000, 1)
        model = _fit(self._model(), X, y)
        return X, y, int(model.n_evaluations_), 100.0 * float(np.mean(model.predict(X_test) != y_test))

    def time_fit(self, cache):
        _fit(self._model(), cache[0], cache[1])

    def track_evaluations(self, cache):
        return cache[2]

    def track_test_error_percent(self, cache):
        return cache[3]


class LearnJointSparseMultinomial:
    """The joint multiclass sparse GP (``SparseGPClassifier(multi_class='multinomial')``, 16
    inducing inputs, the kernel learnt) on the small 3-class ARD problem above (n = 200): the
    full-batch path of the joint model, test error on 2000 new points."""
    number = 1
    repeat = (1, 5, 60.0)

    @staticmethod
    def _model():
        return SparseGPClassifier(multi_class="multinomial", n_inducing=16, random_state=0)

    def setup_cache(self):
        X, y = _small_ard_multinomial(200, 0)
        X_test, y_test = _small_ard_multinomial(2000, 1)
        model = _fit(self._model(), X, y)
        return X, y, int(model.n_evaluations_), 100.0 * float(np.mean(model.predict(X_test) != y_test))

    def time_fit(self, cache):
        _fit(self._model(), cache[0], cache[1])

    def track_evaluations(self, cache):
        return cache[2]

    def track_test_error_percent(self, cache):
        return cache[3]


class LearnRobustRegression:
    """Student-t GP regression with its defaults on Neal's outlier data (100 points, 15 % outliers)."""
    number = 1
    repeat = (1, 5, 60.0)

    def setup_cache(self):
        rng = np.random.default_rng(0)
        x = rng.uniform(-3, 3, 100)
        f = 0.3 + 0.4 * x + 0.5 * np.sin(2.7 * x) + 1.1 / (1.0 + x ** 2)
        y = f + 0.1 * rng.standard_normal(100)
        out = rng.random(100) < 0.15
        y[out] = f[out] + rng.standard_normal(out.sum())
        X = x[:, None]
        x_test = np.linspace(-3, 3, 500)
        f_test = 0.3 + 0.4 * x_test + 0.5 * np.sin(2.7 * x_test) + 1.1 / (1.0 + x_test ** 2)
        model = _fit(GaussianProcessRegressor(likelihood="student_t"), X, y)
        rmse = float(np.sqrt(np.mean((model.predict(x_test[:, None]) - f_test) ** 2)))
        return X, y, int(model.n_evaluations_), rmse

    def time_fit(self, cache):
        _fit(GaussianProcessRegressor(likelihood="student_t"), cache[0], cache[1])

    def track_evaluations(self, cache):
        return cache[2]

    def track_test_rmse(self, cache):
        return cache[3]
