"""Input validation and estimator plumbing (no compiled code needed)."""
import numpy as np
import pytest

from fastep import _validation as v
from fastep._base import BaseEstimator


def test_as_float_matrix_rejects_nan_inf_and_bad_shapes():
    with pytest.raises(ValueError, match="X must be finite"):
        v.as_float_matrix([[1.0, np.nan]], "X")
    with pytest.raises(ValueError, match="X must be finite"):
        v.as_float_matrix([[1.0, np.inf]], "X")
    with pytest.raises(ValueError, match="X must be a 2-D array"):
        v.as_float_matrix([1.0, 2.0], "X")
    with pytest.raises(ValueError, match="at least 1 row"):
        v.as_float_matrix(np.empty((0, 3)), "X")
    with pytest.raises(TypeError, match="X must hold real numbers"):
        v.as_float_matrix([["a", "b"]], "X")
    with pytest.raises(TypeError, match="complex"):
        v.as_float_matrix(np.ones((2, 2), dtype=complex), "X")


def test_as_float_matrix_does_not_modify_input():
    X = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    out = v.as_float_matrix(X, "X")
    assert out.flags.c_contiguous
    out[0, 0] = 99.0
    assert X[0, 0] == 0.0


def test_check_X_y_length_mismatch_and_label_encoding():
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        v.check_X_y(np.ones((3, 2)), [1, 2])
    with pytest.raises(ValueError, match="y must be a 1-D"):
        v.check_X_y(np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="y must be finite"):
        v.check_X_y(np.ones((2, 2)), [0.0, np.nan])
    classes, ypm = v.encode_binary_labels(np.array(["b", "a", "b"]))
    assert classes.tolist() == ["a", "b"]
    assert ypm.tolist() == [1.0, -1.0, 1.0]
    with pytest.raises(ValueError, match="only one class"):
        v.encode_binary_labels([3, 3, 3])
    with pytest.raises(ValueError, match="exactly two classes"):
        v.encode_binary_labels([0, 1, 2])


def test_check_prior_forms_and_errors():
    m, C = v.check_prior(None, 2.0, 3)
    np.testing.assert_array_equal(m, np.zeros(3))
    np.testing.assert_array_equal(C, 2.0 * np.eye(3))
    m, C = v.check_prior(1.5, [1.0, 2.0, 3.0], 3)
    np.testing.assert_array_equal(np.diag(C), [1.0, 2.0, 3.0])
    assert np.all(m == 1.5)
    with pytest.raises(ValueError, match="positive definite"):
        v.check_prior(None, np.array([[1.0, 2.0], [2.0, 1.0]]), 2)
    with pytest.raises(ValueError, match="symmetric"):
        v.check_prior(None, np.array([[1.0, 0.5], [0.0, 1.0]]), 2)
    with pytest.raises(ValueError, match=r"shape \(3, 3\)"):
        v.check_prior(None, np.eye(2), 3)
    with pytest.raises(ValueError, match="prior_cov must be finite and > 0"):
        v.check_prior(None, -1.0, 2)
    with pytest.raises(ValueError, match="prior_mean must have length 2"):
        v.check_prior([0.0, 0.0, 0.0], 1.0, 2)
    with pytest.raises(ValueError, match="variances must be > 0"):
        v.check_prior(None, [1.0, 0.0], 2)


def test_scalar_checks():
    with pytest.raises(ValueError, match="tol must be finite and > 0"):
        v.check_positive(0.0, "tol")
    with pytest.raises(TypeError, match="tol must be a real number"):
        v.check_positive("1", "tol")
    with pytest.raises(ValueError, match="must not be NaN"):
        v.check_positive(float("nan"), "tol")
    assert v.check_positive(np.inf, "slope", allow_inf=True) == np.inf
    with pytest.raises(ValueError, match=r"damping must be in \(0.0, 1.0\]"):
        v.check_in_range(0.0, "damping", 0.0, 1.0, low_inclusive=False)
    with pytest.raises(TypeError, match="max_sweeps must be an integer"):
        v.check_int(2.0, "max_sweeps")
    with pytest.raises(TypeError, match="max_sweeps must be an integer"):
        v.check_int(True, "max_sweeps")
    with pytest.raises(ValueError, match="max_sweeps must be >= 1"):
        v.check_int(0, "max_sweeps", minimum=1)
    with pytest.raises(ValueError, match="update_form must be one of"):
        v.check_choice("fast", "update_form", {"natural", "moment"})


class _Toy(BaseEstimator):
    def __init__(self, a=1, *, b="x", inner=None):
        self.a = a
        self.b = b
        self.inner = inner


def test_base_estimator_params_roundtrip():
    est = _Toy(a=2, inner=_Toy(a=3))
    params = est.get_params()
    assert params["a"] == 2 and params["b"] == "x" and params["inner__a"] == 3
    est.set_params(a=5, inner__b="y")
    assert est.a == 5 and est.inner.b == "y"
    with pytest.raises(ValueError, match="invalid parameter 'zzz'"):
        est.set_params(zzz=1)
    assert repr(_Toy()) == "_Toy()"
    assert "a=5" in repr(est)
