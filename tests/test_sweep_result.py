"""What an EP run reports: SweepResult, the fields every engine has, and the result of each
engine family, which adds the family's own fields; equality, replace, repr, pickling and model
files (including those written when SweepResult held every family's fields)."""
import pickle

import numpy as np
import pytest

from fastep import Probit, StudentT, persistence
from fastep._epcore import gp_ep, sparse_ep, student_t_ep
from fastep._epcore._common import SweepResult
from fastep._student_t.double_loop import DenseDoubleLoopEP

#: Each family's result class and values of its own fields.
FAMILIES = [(gp_ep.DenseEPResult, {"block_size": 4}), (sparse_ep.SparseEPResult, {"n_rebuilds": 3}),
            (student_t_ep.StudentTEPResult, {"n_halvings": 5, "stuck": True})]
_IDS = [cls.__name__ for cls, _ in FAMILIES]


def _common():
    return SweepResult(3, True, 0.5, -1.25, 0.0, counts={"n_skipped": 2, "n_failed": 1},
                       diagnostics={"energy": [1.0]})


def _decoded(result):
    """``result`` written to and read from a model file's state tree."""
    encoder = persistence._Encoder()
    node = encoder.encode(result, "result")
    return persistence._Decoder(encoder.arrays, persistence._class_table()).decode(node)


def test_sweep_result_counts_replace_and_pickle():
    result = _common()
    assert (result.n_skipped, result.n_clipped, result.n_failed) == (2, 0, 1)
    assert list(result.as_dict()) == list(SweepResult._FIELDS) and not hasattr(result, "block_size")
    changed = result.replace(n_clipped=1, log_z=-2.0)
    assert type(changed) is SweepResult and (changed.n_clipped, changed.log_z, changed.n_skipped) == (1, -2.0, 2)
    assert result.n_clipped == 0 and changed != result
    assert pickle.loads(pickle.dumps(changed)) == changed and _decoded(changed) == changed
    assert repr(result) == "SweepResult(n_sweeps=3, converged=True, log_z=-1.25, max_change=0.5)"
    assert SweepResult() == SweepResult()                     # NaN log_z equals NaN
    for family_field in ("block_size", "n_rebuilds", "n_halvings", "stuck", "algorithm"):
        with pytest.raises(TypeError, match="unknown"):
            SweepResult(counts={family_field: 1})
        with pytest.raises(TypeError, match="unknown"):
            result.replace(**{family_field: 1})
    with pytest.raises(AttributeError):
        result.n_skipped = 0


@pytest.mark.parametrize("cls, own", FAMILIES, ids=_IDS)
def test_a_family_result_adds_its_fields_to_the_common_ones(cls, own):
    result = cls(_common(), **own)
    assert isinstance(result, SweepResult) and cls._FIELDS == SweepResult._FIELDS + tuple(own)
    assert type(result.common()) is SweepResult and result.common() == _common()
    assert result.as_dict() == dict(_common().as_dict(), **own)
    fields = "".join(f", {name}={value!r}" for name, value in own.items())
    assert repr(result) == f"{cls.__name__}(n_sweeps=3, converged=True, log_z=-1.25, max_change=0.5{fields})"
    for again in (pickle.loads(pickle.dumps(result)), _decoded(result)):
        assert type(again) is cls and again == result and again.as_dict() == result.as_dict()
    changed = result.replace(n_sweeps=4)
    assert type(changed) is cls and changed.n_sweeps == 4 and changed != result
    assert {name: getattr(changed, name) for name in own} == own
    assert result.replace(**{name: type(value)() for name, value in own.items()}) == cls(_common())
    # results of different classes differ, whatever their fields
    assert result.common() != result and result != result.common()
    assert cls() == cls(SweepResult()) and cls() != SweepResult()
    with pytest.raises(AttributeError):
        setattr(result, next(iter(own)), 0)


def test_every_engine_returns_its_familys_result():
    x = np.linspace(-2, 2, 12)
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(12)
    y, yt = np.sign(x + 0.1), np.sin(x)
    dense = gp_ep.DenseEP(K, y, Probit().site_spec()).run(np.zeros(12), np.zeros(12), np.empty((12, 12)),
                                                          np.empty(12))
    assert type(dense) is gp_ep.DenseEPResult and dense.converged and dense.block_size >= 1
    _, Vt, d = sparse_ep.sparse_projection(np.ascontiguousarray(K[::3, ::3]), np.ascontiguousarray(K[:, ::3]),
                                           np.diag(K).copy(), jitter=1e-8)
    sparse = sparse_ep.SparseEP(Vt, d, y, Probit().site_spec()).run(np.zeros(12), np.zeros(12),
                                                                    np.empty((4, 4)), np.empty(4))
    assert type(sparse) is sparse_ep.SparseEPResult and sparse.converged and sparse.n_rebuilds >= 0
    outputs = [np.zeros(12), np.zeros(12), np.empty(12), np.empty(12)]
    fractional = student_t_ep.DenseStudentTEP(K, yt, 4.0, 0.1).run(*outputs)
    assert type(fractional) is student_t_ep.StudentTEPResult and not fractional.stuck
    double_loop = DenseDoubleLoopEP(K, yt, 4.0, 0.1, max_outer=3).run(np.zeros(12), np.zeros(12), np.empty(12),
                                                                      np.empty(12))
    assert type(double_loop) is student_t_ep.StudentTEPResult and double_loop.n_halvings == 0
    sparse_t = student_t_ep.SparseStudentTEP(Vt, d, yt, StudentT(4.0, 0.1).site_spec()).run(
        np.zeros(12), np.zeros(12), np.empty((4, 4)), np.empty(4))
    assert type(sparse_t) is student_t_ep.StudentTEPResult


_OLD_COUNTS = dict(n_skipped=2, n_clipped=0, n_failed=1, block_size=0, n_rebuilds=0, n_halvings=0, stuck=False,
                   algorithm="")


@pytest.mark.parametrize("family, cls", [
    ({"block_size": 4}, gp_ep.DenseEPResult), ({"n_rebuilds": 3}, sparse_ep.SparseEPResult),
    ({"n_halvings": 5, "algorithm": "fractional EP"}, student_t_ep.StudentTEPResult),
    ({"stuck": True, "algorithm": "fractional EP (double-loop fallback)"}, student_t_ep.StudentTEPResult),
    ({}, SweepResult)], ids=["dense", "sparse", "halvings", "stuck", "none"])
def test_a_saved_result_with_every_familys_fields_loads_as_its_familys(family, cls):
    """Model files written when SweepResult held every engine family's fields in ``counts``."""
    node = {"__fastep__": "object", "id": 0, "class": "fastep._epcore._common.SweepResult",
            "args": [3, True, 0.5, -1.25, 0.0, False, dict(_OLD_COUNTS, **family), {"energy": [1.0]}]}
    loaded = persistence._Decoder({}, persistence._class_table()).decode(node)
    assert type(loaded) is cls and loaded.common() == _common()
    assert {name: getattr(loaded, name) for name in cls._OWN} == {
        name: family.get(name, _OLD_COUNTS[name]) for name in cls._OWN}
