"""The engines' options objects: one frozen, validated object per engine family, and the
engines built from them."""
import pickle

import numpy as np
import pytest

from fastep import Probit, StudentT
from fastep._epcore import gp_ep, ivm, linear_ep, rank_k_ep, sparse_ep, student_t_ep

#: (options class, a field, a value out of range) per engine family.
_BAD_FIELDS = [
    (gp_ep.DenseEPOptions, "schedule", 7), (gp_ep.DenseEPOptions, "order", -1),
    (gp_ep.DenseEPOptions, "damping", 0.0), (gp_ep.DenseEPOptions, "tol", 0.0),
    (gp_ep.DenseEPOptions, "max_sweeps", 0), (gp_ep.DenseEPOptions, "negative_precision", 2),
    (gp_ep.DenseEPOptions, "block_size", -1), (gp_ep.DenseEPOptions, "refresh_every", 0),
    (sparse_ep.SparseEPOptions, "power", 1.5), (sparse_ep.SparseEPOptions, "n_quadrature", 0),
    (sparse_ep.SparseEPOptions, "schedule", 2), (sparse_ep.SparseEPOptions, "order", 2),
    (sparse_ep.SparseEPOptions, "damping", 1.5), (sparse_ep.SparseEPOptions, "tol", -1.0),
    (sparse_ep.SparseEPOptions, "max_sweeps", 0), (sparse_ep.SparseEPOptions, "negative_precision", 5),
    (linear_ep.LinearEPOptions, "update_form", 3), (linear_ep.LinearEPOptions, "damping", np.nan),
    (linear_ep.LinearEPOptions, "tol", -1e-3), (linear_ep.LinearEPOptions, "max_sweeps", -1),
    (linear_ep.LinearEPOptions, "negative_precision", 3), (linear_ep.LinearEPOptions, "algorithm", 9),
    (linear_ep.LinearEPOptions, "block_size", -2),
    (rank_k_ep.RankKEPOptions, "damping", 0.0), (rank_k_ep.RankKEPOptions, "tol", -1.0),
    (rank_k_ep.RankKEPOptions, "max_sweeps", -1), (rank_k_ep.RankKEPOptions, "refresh_every", -1),
    (student_t_ep.StudentTEPOptions, "power", 0.0), (student_t_ep.StudentTEPOptions, "n_quadrature", 1000),
    (student_t_ep.StudentTEPOptions, "damping", 2.0), (student_t_ep.StudentTEPOptions, "tol", 0.0),
    (student_t_ep.StudentTEPOptions, "max_sweeps", 0), (student_t_ep.StudentTEPOptions, "max_halvings", -1),
]
_FAMILIES = [gp_ep.DenseEPOptions, sparse_ep.SparseEPOptions, linear_ep.LinearEPOptions,
             rank_k_ep.RankKEPOptions, student_t_ep.StudentTEPOptions]


@pytest.mark.parametrize("cls, field, value", _BAD_FIELDS,
                         ids=[f"{c.__name__}-{f}" for c, f, _ in _BAD_FIELDS])
def test_a_field_out_of_range_raises_naming_it(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})
    with pytest.raises(ValueError, match=field):
        cls().replace(**{field: value})


@pytest.mark.parametrize("cls", _FAMILIES)
def test_options_are_frozen_keyword_only_and_compare_by_value(cls):
    options = cls()
    field = cls._FIELDS[-1]
    with pytest.raises(AttributeError):
        setattr(options, field, getattr(options, field))
    with pytest.raises(AttributeError):
        options.anything = 1
    with pytest.raises(TypeError):
        cls(1.0)
    with pytest.raises(TypeError, match="unknown"):
        options.replace(no_such_field=1)
    assert len(cls._FIELDS) <= 8
    assert options == cls(**options.as_dict()) and hash(options) == hash(cls(**options.as_dict()))
    changed = options.replace(damping=0.375)
    assert changed.damping == 0.375 and options.damping == cls().damping != 0.375
    assert changed != options and changed == cls(**dict(options.as_dict(), damping=0.375))
    assert repr(changed).startswith(f"{cls.__name__}(") and "damping=0.375" in repr(changed)


@pytest.mark.parametrize("cls", _FAMILIES)
def test_options_pickle_round_trip(cls):
    options = cls(damping=0.75, max_sweeps=7)
    back = pickle.loads(pickle.dumps(options))
    assert type(back) is cls and back == options and back.as_dict() == options.as_dict()


def _rbf(a, b):
    return np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2)


def _same(run_a, run_b):
    (info_a, *arrays_a), (info_b, *arrays_b) = run_a, run_b
    assert info_a == info_b
    for a, b in zip(arrays_a, arrays_b, strict=True):
        assert np.array_equal(a, b)


def test_engines_with_default_options_are_bitwise_those_with_explicit_defaults():
    x = np.linspace(-2, 2, 15)
    y = np.sign(x + 0.1)
    spec = Probit().site_spec()
    K = _rbf(x, x) + 1e-8 * np.eye(15)

    def dense(*options):
        arrays = np.zeros(15), np.zeros(15), np.empty((15, 15)), np.empty(15)
        return (gp_ep.DenseEP(K, y, spec, *options).run(*arrays), *arrays)

    _same(dense(), dense(gp_ep.DenseEPOptions(**gp_ep.DenseEPOptions().as_dict())))
    engine = gp_ep.DenseEP(K, y, spec)
    assert engine.options == gp_ep.DenseEPOptions() and engine.refactor_every == engine.options.refresh_every

    _, Vt, d = sparse_ep.sparse_projection(_rbf(x[::3], x[::3]), _rbf(x, x[::3]), np.ones(15), jitter=1e-8)

    def sparse(*options):
        arrays = np.zeros(15), np.zeros(15), np.empty((5, 5)), np.empty(5)
        return (sparse_ep.SparseEP(Vt, d, y, spec, *options).run(*arrays), *arrays)

    _same(sparse(), sparse(sparse_ep.SparseEPOptions(power=1.0, schedule=sparse_ep.SPARSE_SEQUENTIAL)))

    X = np.column_stack([x, np.ones(15)])

    def linear(*options):
        arrays = np.zeros(15), np.zeros(15), np.empty(2), np.empty((2, 2))
        return (linear_ep.LinearEP(X, y, np.zeros(2), np.eye(2), spec, *options).run(*arrays), *arrays)

    _same(linear(), linear(linear_ep.LinearEPOptions(update_form=linear_ep.UPDATE_NATURAL)))

    Y = np.column_stack([x, -x]) + 0.1
    lik = rank_k_ep.RankKLikelihood.mvgaussian(0.1 * np.eye(2))
    a = rank_k_ep.RankKEP(X[:, None, :].repeat(2, axis=1), Y, np.zeros(2), np.eye(2), lik)
    b = rank_k_ep.RankKEP(X[:, None, :].repeat(2, axis=1), Y, np.zeros(2), np.eye(2), lik,
                          rank_k_ep.RankKEPOptions(refresh_every=1))
    _same((a.run(), a.post_mean, a.post_cov), (b.run(), b.post_mean, b.post_cov))

    yt = np.sin(x)

    def student_t(*options):
        arrays = np.zeros(15), np.zeros(15), np.empty(15), np.empty(15)
        return (student_t_ep.DenseStudentTEP(K + 1e-6 * np.eye(15), yt, 4.0, 0.1, *options).run(*arrays), *arrays)

    _same(student_t(), student_t(student_t_ep.StudentTEPOptions(power=0.5, damping=0.5)))
    engine = student_t_ep.SparseStudentTEP(Vt, d, yt, StudentT(4.0, 0.1).site_spec())
    assert engine.options == student_t_ep.StudentTEPOptions() and engine.n_quadrature == engine.options.n_quadrature


def test_the_engines_former_names_are_deprecated_aliases():
    with pytest.warns(FutureWarning, match="RankKState is deprecated.*use RankKEP"):
        assert rank_k_ep.RankKState is rank_k_ep.RankKEP
    with pytest.warns(FutureWarning, match="IVMState is deprecated.*use IVMEP"):
        assert ivm.IVMState is ivm.IVMEP
    with pytest.raises(AttributeError, match="no attribute 'IVMStat'"):
        ivm.IVMStat
