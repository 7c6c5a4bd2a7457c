"""The estimators' fit options: frozen, checked when built, derived by ``replace``, saved with the
fitted problems, and migrated from the plain dicts earlier versions saved."""
import dataclasses
import io
import pickle

import numpy as np
import pytest

from fastep import GaussianProcessClassifier, IVMClassifier, SparseGPClassifier, load, save
from fastep._epcore import gp_ep, sparse_ep
from fastep._gp.fit_options import DenseFitOptions, IVMFitOptions, RefineOptions, SparseFitOptions
from fastep.kernels import RBF


def _data(n=40):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, 2))
    return X, np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1, 0)


def test_options_are_frozen_checked_and_replaced_by_checked_copies():
    options = DenseFitOptions(damping=0.5, tol=1e-6, refresh_every=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.tol = 1e-3
    looser = options.replace(tol=1e-3)
    assert (looser.tol, looser.damping, looser.refresh_every, options.tol) == (1e-3, 0.5, 10, 1e-6)
    with pytest.raises(ValueError, match="damping"):
        options.replace(damping=1.5)
    with pytest.raises(ValueError, match="approximation"):
        SparseFitOptions(approximation="vfe")
    with pytest.raises(ValueError, match="n_classes"):
        SparseFitOptions(n_classes=1)
    assert SparseFitOptions(n_classes=3).multinomial and not SparseFitOptions().multinomial


def test_estimators_build_their_family_options_and_fit_derives_variants():
    dense = GaussianProcessClassifier(schedule="parallel", refresh_every=3)._fit_options()
    assert isinstance(dense, DenseFitOptions)
    assert (dense.schedule, dense.damping, dense.refresh_every) == (gp_ep.SCHEDULE_PARALLEL, 0.5, 3)
    sparse = SparseGPClassifier(power=0.5, learning="minibatch")._fit_options()
    assert isinstance(sparse, SparseFitOptions)
    assert (sparse.schedule, sparse.power, sparse.learning, sparse.minibatch) == (sparse_ep.SPARSE_SEQUENTIAL, 0.5,
                                                                                  "minibatch", False)
    X, y = _data()
    model = GaussianProcessClassifier(RBF(1.0, 0.5), multi_class="multinomial", optimizer=None).fit(X, y)
    options = model._problems[0].options
    assert options.adaptive_damping and options.progress is None      # the fit's reporter is dropped
    ivm = IVMClassifier(active_set_size=10, n_iterations=0)._options(X)
    assert isinstance(ivm, IVMFitOptions) and isinstance(ivm.full_data, SparseFitOptions) and ivm.d == 10


def test_legacy_keys_map_and_unknown_keys_are_dropped():
    options = DenseFitOptions.from_dict({"refactor_every": 7, "tol": 1e-5, "model": "gone"})
    assert (options.refresh_every, options.tol, options.schedule) == (7, 1e-5, gp_ep.SCHEDULE_BLOCKED)


def _as_dict(options):
    """The plain dict earlier versions kept in place of ``options``."""
    out = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    if isinstance(options, DenseFitOptions):
        out["refactor_every"] = out.pop("refresh_every")
    del out["progress"]
    return out


@pytest.mark.parametrize("estimator", [GaussianProcessClassifier(RBF(1.0, 0.5), optimizer=None),
                                       SparseGPClassifier(RBF(1.0, 0.5), n_inducing=6, optimizer=None)])
def test_a_model_saved_with_dict_options_loads_them_typed_and_predicts_identically(estimator):
    X, y = _data()
    model = estimator.fit(X, y)
    expected = model.predict_proba(X)
    problem = model._problems[0]
    typed = problem.options
    problem.__dict__.pop("_engine_options_for", None)
    problem.options = _as_dict(typed)                        # the state an earlier version saved
    buffer = io.BytesIO()
    save(model, buffer)
    buffer.seek(0)
    for loaded in (load(buffer), pickle.loads(pickle.dumps(model))):
        options = loaded._problems[0].options
        assert type(options) is type(typed)
        assert all(getattr(options, f.name) == getattr(typed, f.name) for f in dataclasses.fields(typed))
        assert np.array_equal(loaded.predict_proba(X), expected)


def test_an_ivm_saved_with_dict_refinement_settings_loads_them_typed_and_predicts_identically():
    X, y = _data()
    model = IVMClassifier(RBF(1.0, 0.5), active_set_size=10, optimizer=None, refine_sweeps=2).fit(X, y)
    expected = model.predict_proba(X)
    problem = model._problems[0]
    typed = problem.refine
    assert isinstance(typed, RefineOptions) and typed.sweeps == 2
    problem.refine = dataclasses.asdict(typed)               # the state an earlier version saved
    buffer = io.BytesIO()
    save(model, buffer)
    buffer.seek(0)
    for loaded in (load(buffer), pickle.loads(pickle.dumps(model))):
        assert loaded._problems[0].refine == typed
        assert np.array_equal(loaded.predict_proba(X), expected)
