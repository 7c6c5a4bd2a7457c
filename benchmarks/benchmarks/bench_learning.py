"""asv: learning the hyperparameters with the estimators' defaults, in seconds.

Small versions of the fits of ``benchmarks/learning_stop.py`` and ``learning_speed.py``: the
fit time (``time_``), the number of evidence evaluations of the search and the test error
(``track_``), so that a regression in learning speed or accuracy shows in the history.

- digits (scikit-learn's bundled 8x8 images, pixels / 16), 200 training rows, 10 classes, the
  other rows as test set: one-vs-rest and multinomial;
- the issue-3 toy, n = 300, test on 2000 new points;
- Neal's outlier regression (Student-t noise, 100 points): test RMSE against the noise-free curve.
"""
import warnings

import numpy as np

from fastep import GaussianProcessClassifier, GaussianProcessRegressor


def _digits(n_train=200, seed=0):
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(y.shape[0])
    return X[order[:n_train]] / 16.0, y[order[:n_train]], X[order[n_train:]] / 16.0, y[order[n_train:]]


def _issue3_toy(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    return X, np.where(f + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)


def _fit(model, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(X, y)


class LearnDigits:
    """Digits, 200 training rows: one-vs-rest and the multinomial model with their defaults."""
    params = [["one_vs_rest", "multinomial"]]
    param_names = ["multi_class"]
    timeout = 300
    number = 1
    repeat = (1, 3, 120.0)

    def setup(self, multi_class):
        try:
            self.data = _digits()
        except ImportError:                        # scikit-learn (benchmark requirement) missing
            raise NotImplementedError("scikit-learn is needed for the digits data")
        self.model = _fit(GaussianProcessClassifier(multi_class=multi_class), *self.data[:2])

    def time_fit(self, multi_class):
        _fit(GaussianProcessClassifier(multi_class=multi_class), *self.data[:2])

    def track_evaluations(self, multi_class):
        return int(np.sum(self.model.n_evaluations_))

    def track_test_error_percent(self, multi_class):
        return 100.0 * float(np.mean(self.model.predict(self.data[2]) != self.data[3]))


class LearnIssue3Toy:
    """The dense GP classifier's default fit on the issue-3 toy (n = 300)."""
    number = 1
    repeat = (1, 5, 60.0)

    def setup(self):
        self.X, self.y = _issue3_toy(300, 0)
        self.X_test, self.y_test = _issue3_toy(2000, 1)
        self.model = _fit(GaussianProcessClassifier(), self.X, self.y)

    def time_fit(self):
        _fit(GaussianProcessClassifier(), self.X, self.y)

    def track_evaluations(self):
        return int(self.model.n_evaluations_)

    def track_test_error_percent(self):
        return 100.0 * float(np.mean(self.model.predict(self.X_test) != self.y_test))


class LearnRobustRegression:
    """Student-t GP regression with its defaults on Neal's outlier data (100 points, 15 % outliers)."""
    number = 1
    repeat = (1, 5, 60.0)

    def setup(self):
        rng = np.random.default_rng(0)
        x = rng.uniform(-3, 3, 100)
        f = 0.3 + 0.4 * x + 0.5 * np.sin(2.7 * x) + 1.1 / (1.0 + x ** 2)
        y = f + 0.1 * rng.standard_normal(100)
        out = rng.random(100) < 0.15
        y[out] = f[out] + rng.standard_normal(out.sum())
        self.X, self.y = x[:, None], y
        self.x_test = np.linspace(-3, 3, 500)
        self.f_test = 0.3 + 0.4 * self.x_test + 0.5 * np.sin(2.7 * self.x_test) + 1.1 / (1.0 + self.x_test ** 2)
        self.model = _fit(GaussianProcessRegressor(likelihood="student_t"), self.X, self.y)

    def time_fit(self):
        _fit(GaussianProcessRegressor(likelihood="student_t"), self.X, self.y)

    def track_evaluations(self):
        return int(self.model.n_evaluations_)

    def track_test_rmse(self):
        return float(np.sqrt(np.mean((self.model.predict(self.x_test[:, None]) - self.f_test) ** 2)))
