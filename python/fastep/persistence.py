"""Save and load fitted estimators without pickle: :func:`save` and :func:`load`.

A model is one ``.npz`` file (a zip of ``.npy`` arrays, read with ``allow_pickle=False``):
every array of the estimator's state is one member, and one member holds a JSON document
(UTF-8 bytes) that describes the rest:

- ``format`` (``"fastep-model"``) and ``format_version`` (:data:`FORMAT_VERSION`);
- ``fastep_version``: the version that wrote the file;
- ``estimator``: the estimator's class name; ``params``: its constructor parameters
  (``get_params(deep=False)``; numbers and strings as they are, anything else as its ``repr``);
  ``summary``: kernel, likelihood and evidence, for ``fastep info``; both are for reading only;
- ``state``: the estimator's whole state as a tree of JSON values (numbers, strings, lists,
  dicts), references to the array members, and tagged nodes for tuples, numpy scalars and the
  fastep objects it holds (kernels, likelihoods, fitted sub-problems);
- ``checksum``: SHA-256 over the JSON document (without the checksum) and every array's name,
  dtype, shape and bytes.

Loading never imports or calls anything the file names: a class must be one of fastep's own
(looked up in a table built from the modules fastep has already imported), an object is
rebuilt by setting the saved attributes on ``cls.__new__(cls)`` (or, for the compiled site
model ``SiteSpec``, by calling it with the saved numbers and arrays). A file that is not a
fastep model, comes from an unknown format version, fails its checksum (truncated, modified),
or names anything else raises ``ValueError``. An estimator from a file written by an earlier
release gets the constructor parameters added since then at their defaults.

Floats are stored exactly (JSON floats as Python writes them, ``repr`` round-trip; arrays
byte for byte), so a loaded model predicts bitwise identically to the one saved.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
import numbers
import os
import warnings
import zipfile
from typing import TYPE_CHECKING

import numpy as np

from ._base import BaseEstimator
from ._version import version as _fastep_version

if TYPE_CHECKING:
    from typing import IO, Any, TypeAlias

    #: Where a model is written or read: a path, or a binary file object.
    _File: TypeAlias = str | os.PathLike[str] | IO[bytes]

__all__ = ["save", "load", "read_metadata", "FORMAT_VERSION"]

#: Version of the file layout; files from another version are refused.
FORMAT_VERSION = 1
_FORMAT = "fastep-model"
_METADATA = "__fastep_model__"
_TAG = "__fastep__"                          # key of a tagged node in the state tree


# -- the classes a file may name ----------------------------------------------------------------

#: The modules of the public estimators: ``import fastep`` leaves them to first use; reading a
#: model file imports them (and with them every module whose classes a file may name).
_ESTIMATOR_MODULES = ("fastep.gp", "fastep.sparse", "fastep.ivm", "fastep.linear", "fastep.horseshoe")


def _class_table():
    """``{qualified name: class}`` for every class defined in fastep's own modules."""
    import sys
    from importlib import import_module
    for module_name in _ESTIMATOR_MODULES:
        import_module(module_name)
    table = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "fastep" or name.startswith("fastep.")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                table[f"{name}.{value.__qualname__}"] = value
    for old_module, new_module in _MOVED_MODULES.items():
        prefix = new_module + "."
        for name in [name for name in table if name.startswith(prefix)]:
            table.setdefault(old_module + "." + name[len(prefix):], table[name])
    for old_name, new_name in _MOVED_CLASSES.items():
        if new_name in table:
            table.setdefault(old_name, table[new_name])
    return table


#: Modules that moved into a package of their model family: a file naming a class of the old
#: module loads it from the new one.
_MOVED_MODULES = {
    "fastep._dense_problem": "fastep._dense.problem",
    "fastep._multiclass_gp": "fastep._dense.multiclass",
    "fastep._student_t_gp": "fastep._student_t.problem",
    "fastep._double_loop_ep": "fastep._student_t.double_loop",
    "fastep._sparse_problem": "fastep._sparse.problem",
    "fastep._sparse_blocks": "fastep._sparse.blocks",
    "fastep._sparse_distributed": "fastep._sparse.distributed",
    "fastep._inducing": "fastep._sparse.inducing",
    "fastep._ivm_problem": "fastep._ivm.problem",
    "fastep._horseshoe_parallel_ep": "fastep._horseshoe.parallel_ep",
    "fastep._horseshoe_search": "fastep._horseshoe.search",
    "fastep._learning": "fastep._search.space",
    "fastep._learning_checks": "fastep._search.checks",
    "fastep._optimize": "fastep._search.optimize",
    "fastep._defaults": "fastep._search.start",
}

#: Classes that moved to another module since files were first written: a file naming the old
#: place loads the class from the new one.
_MOVED_CLASSES = {
    "fastep._progress.Progress": "fastep.progress.Progress",
    "fastep._progress.ProgressRecord": "fastep.progress.ProgressRecord",
    "fastep._progress.StopRequested": "fastep.progress.StopRequested",
    "fastep.gp._BinaryGPEP": "fastep._dense.problem.DenseGPProblem",
    "fastep.ivm._IVMProblem": "fastep._ivm.problem._IVMProblem",
    "fastep.sparse._BinarySparseEP": "fastep._sparse.problem._BinarySparseEP",
    "fastep.sparse._StudentTSparseEP": "fastep._sparse.problem._StudentTSparseEP",
    "fastep._gp_base.Hyperparameters": "fastep._gp.hyperparameters.Hyperparameters",
    "fastep._gp_base.SiteProblem": "fastep._gp.problem.SiteProblem",
    "fastep._gp_base.DensePredictor": "fastep._gp.predictor.DensePredictor",
    "fastep.multioutput.RankKEP": "fastep.linear.LinearEPRankK",
    "fastep.multioutput.LinearEPRankK": "fastep.linear.LinearEPRankK",
}


def _sweep_result(*args):
    """A :class:`~fastep._epcore._common.SweepResult` from the constructor arguments a file holds.

    Files written before the engine families had result types of their own hold every family's
    fields in ``counts`` (``block_size``, ``n_rebuilds``, ``n_halvings``, ``stuck``,
    ``algorithm``): such a result loads as the family result whose fields it sets
    (:class:`~fastep._epcore.student_t_ep.StudentTEPResult`,
    :class:`~fastep._epcore.sparse_ep.SparseEPResult` or
    :class:`~fastep._epcore.gp_ep.DenseEPResult`; with all of them at their defaults, as a plain
    SweepResult). ``algorithm`` is dropped: the problem that held the result keeps it.
    """
    from ._epcore import gp_ep, sparse_ep, student_t_ep
    from ._epcore._common import SweepResult
    args = list(args)
    counts = dict(args[6]) if len(args) > 6 and args[6] else {}
    family = {name: counts.pop(name) for name in list(counts) if name not in SweepResult._COUNTS}
    family.pop("algorithm", None)
    if len(args) > 6:
        args[6] = counts
    result = SweepResult(*args)
    for cls in (student_t_ep.StudentTEPResult, sparse_ep.SparseEPResult, gp_ep.DenseEPResult):
        if any(family.get(name) for name in cls._OWN):
            return cls(result, **{name: family[name] for name in cls._OWN if name in family})
    return result


#: Classes whose saved constructor arguments changed since files were first written: an object of
#: the class named is built by the function given, which reads every form.
_SAVED_CONSTRUCTORS = {
    "fastep._epcore._common.SweepResult": _sweep_result,
}


def _qualified_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_fastep_class(cls):
    module = getattr(cls, "__module__", "") or ""
    return module == "fastep" or module.startswith("fastep.")


# -- encoding -----------------------------------------------------------------------------------

class _Encoder:
    """Turns an estimator's state into a JSON tree plus a dict of named arrays."""

    def __init__(self):
        self.arrays = {}
        self._array_names = {}
        self._seen = {}
        self._keep = []                                   # keeps encoded temporaries alive (ids stay unique)

    def array(self, value):
        if value.dtype.hasobject:
            items = value.ravel().tolist()
            if not all(isinstance(item, (str, bool, numbers.Integral, numbers.Real)) or item is None
                       for item in items):
                kinds = sorted({type(item).__name__ for item in items})
                raise TypeError(f"cannot save an object array holding {kinds} without pickle; labels and "
                                "arrays must hold numbers, strings or booleans")
            return {_TAG: "object_array", "shape": list(value.shape),
                    "items": [self.encode(item, "object array item") for item in items]}
        if value.dtype.kind not in "biufcUSMm":
            raise TypeError(f"cannot save an array of dtype {value.dtype}")
        if id(value) in self._array_names:                   # the same array object twice: one member
            return {_TAG: "array", "name": self._array_names[id(value)]}
        name = f"a{len(self.arrays)}"
        self.arrays[name] = value
        self._array_names[id(value)] = name
        self._keep.append(value)
        return {_TAG: "array", "name": name}

    def encode(self, value, where):
        if value is None or isinstance(value, (bool, str)):
            return value
        if type(value) is int:
            return value
        if type(value) is float:
            if np.isfinite(value):
                return value
            return {_TAG: "float", "repr": repr(value)}
        if isinstance(value, np.ndarray):
            return self.array(value)
        if isinstance(value, np.generic):
            scalar = np.asarray(value)
            self._keep.append(scalar)
            return {_TAG: "numpy_scalar", "value": self.array(scalar)}
        if type(value) is list:
            return [self.encode(item, where) for item in value]
        if type(value) is tuple:
            return {_TAG: "tuple", "items": [self.encode(item, where) for item in value]}
        if type(value) is dict:
            if all(type(key) is str for key in value) and _TAG not in value:
                return {key: self.encode(item, f"{where}[{key!r}]") for key, item in value.items()}
            return {_TAG: "dict", "items": [[self.encode(key, where), self.encode(item, f"{where}[{key!r}]")]
                                           for key, item in value.items()]}
        if _is_dask_array(value):
            computed = np.asarray(value)                      # the model file holds its numbers
            self._keep.append(computed)
            return self.array(computed)
        if _is_fastep_class(type(value)):
            return self.fastep_object(value, where)
        raise TypeError(f"cannot save {where}: a {type(value).__module__}.{type(value).__qualname__} "
                        "(fastep saves numbers, strings, arrays and fastep's own objects, without pickle)")

    def fastep_object(self, value, where):
        cls = type(value)
        key = id(value)
        if key in self._seen:                               # shared references stay shared
            return {_TAG: "ref", "id": self._seen[key]}
        self._seen[key] = len(self._seen)
        self._keep.append(value)
        node = {_TAG: "object", "id": self._seen[key], "class": _qualified_name(cls)}
        if hasattr(value, "__dict__"):
            state = value.__getstate__() if _defines(cls, "__getstate__") else vars(value)
            node["state"] = self.encode(dict(state), f"{where}.{cls.__name__}")
            return node
        reduced = value.__reduce__()
        if not (isinstance(reduced, tuple) and len(reduced) == 2 and reduced[0] is cls):
            raise TypeError(f"cannot save {where}: {_qualified_name(cls)} does not reduce to its own constructor")
        node["args"] = self.encode(list(reduced[1]), f"{where}.{cls.__name__}")
        return node


def _defines(cls, method):
    """Whether a class in ``cls``'s hierarchy below ``object`` defines ``method``."""
    for base in cls.__mro__:
        if method in vars(base):
            return base is not object
    return False


def _is_dask_array(value):
    return type(value).__module__.split(".")[0] == "dask" and hasattr(value, "map_blocks")


# -- decoding -----------------------------------------------------------------------------------

class _Decoder:
    def __init__(self, arrays, classes):
        self.arrays = arrays
        self.classes = classes
        self.objects = {}

    def decode(self, node):
        if node is None or isinstance(node, (bool, str, int, float)):
            return node
        if isinstance(node, list):
            return [self.decode(item) for item in node]
        if not isinstance(node, dict):
            raise ValueError(f"unexpected {type(node).__name__} in the model's state")
        tag = node.get(_TAG)
        if tag is None:
            return {key: self.decode(item) for key, item in node.items()}
        if tag == "array":
            array = self.arrays.get(node.get("name"))
            if array is None:
                raise ValueError(f"the model's state refers to a missing array {node.get('name')!r}")
            return array
        if tag == "object_array":
            items = [self.decode(item) for item in node["items"]]
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out.reshape(node["shape"])
        if tag == "numpy_scalar":
            return self.decode(node["value"])[()]
        if tag == "float":
            if node.get("repr") not in ("inf", "-inf", "nan"):
                raise ValueError(f"bad float {node.get('repr')!r} in the model's state")
            return float(node["repr"])
        if tag == "tuple":
            return tuple(self.decode(item) for item in node["items"])
        if tag == "dict":
            return {_hashable(self.decode(key)): self.decode(item) for key, item in node["items"]}
        if tag == "ref":
            if node.get("id") not in self.objects:
                raise ValueError("the model's state refers to an object before it is defined")
            return self.objects[node["id"]]
        if tag == "object":
            return self.fastep_object(node)
        raise ValueError(f"unknown node {tag!r} in the model's state")

    def fastep_object(self, node):
        name = node.get("class")
        cls = self.classes.get(name)
        if cls is None:
            raise ValueError(f"the model file names {name!r}, which is not one of fastep's classes; "
                             "fastep loads only its own objects")
        if "args" in node:
            value = _SAVED_CONSTRUCTORS.get(name, cls)(*self.decode(node["args"]))
        else:
            value = cls.__new__(cls)
            self.objects[node["id"]] = value                  # before its state: cycles resolve to it
            state = self.decode(node["state"])
            if not isinstance(state, dict):
                raise ValueError(f"bad state for {name}")
            if _defines(cls, "__setstate__"):
                value.__setstate__(state)
            else:
                value.__dict__.update(state)
            if isinstance(value, BaseEstimator):
                _rename_attributes(value)
                _add_new_parameters(value)
        self.objects[node["id"]] = value
        return value


def _rename_attributes(estimator):
    """Fitted attributes a file written by an earlier release holds under a name since renamed
    (the class's ``_renamed_attributes``) take the new name."""
    state = vars(estimator)
    for old, new in type(estimator)._renamed_attributes.items():
        if old in state and new not in state:
            state[new] = state.pop(old)
    for old, new in getattr(type(estimator), "_renamed_parameters", {}).items():
        if old in state and new not in state:          # the deprecated parameter takes its default (below)
            state[new] = state.pop(old)


def _add_new_parameters(estimator):
    """Constructor parameters that a file written by an earlier release does not hold take their
    defaults (the file's model was fitted before they existed; a refit uses this release's defaults)."""
    import inspect
    signature = inspect.signature(type(estimator).__init__)
    for name in type(estimator)._param_names():
        if name not in vars(estimator):
            setattr(estimator, name, signature.parameters[name].default)


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


# -- checksum and file I/O ----------------------------------------------------------------------

def _checksum(document, arrays):
    digest = hashlib.sha256()
    digest.update(json.dumps(document, sort_keys=True, allow_nan=False).encode("utf-8"))
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode("utf-8"))
        digest.update(array.tobytes())
    return digest.hexdigest()


def _summary(estimator):
    summary = {}
    for attribute in ("kernel_", "likelihood_", "log_marginal_likelihood_value_", "log_evidence_",
                      "n_features_in_", "classes_", "fit_time_"):
        if attribute in type(estimator)._renamed_attributes:
            continue                                   # a deprecated alias of another entry
        value = getattr(estimator, attribute, None)
        if value is None:
            continue
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, (np.generic, numbers.Number)):
            value = float(value) if not isinstance(value, (int, np.integer)) else int(value)
        else:
            value = repr(value)
        summary[attribute] = value
    return summary


def save(estimator: BaseEstimator, path: _File, *, metadata: dict[str, Any] | None = None) -> None:
    """Save a fastep estimator (fitted or not) to ``path``, one ``.npz`` file, without pickle.

    Parameters
    ----------
    estimator : fastep estimator
        Any of fastep's estimators. An estimator fitted on a dask array is saved with its
        site parameters computed into the file.
    path : str or os.PathLike or file object
        Where to write. A path without the ``.npz`` suffix is used as given.
    metadata : dict, optional
        Extra description to store with the model (JSON values: strings, numbers, lists, dicts),
        returned by :func:`read_metadata` under ``'metadata'`` (the command line keeps the
        feature and target names and the training time there).

    Raises
    ------
    TypeError
        ``estimator`` is not a fastep estimator, or holds something that cannot be stored
        without pickle (for example an object array of tuples as class labels).

    Warns
    -----
    UserWarning
        The estimator has a ``callback``: a function is not stored (the saved model has
        ``callback=None``).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> import fastep
    >>> X = np.array([[0.0], [1.0], [2.0], [3.0]]); y = np.array([0, 0, 1, 1])
    >>> model = fastep.GaussianProcessClassifier(optimizer=None).fit(X, y)
    >>> path = os.path.join(tempfile.mkdtemp(), "model.npz")
    >>> fastep.save(model, path)
    >>> again = fastep.load(path)
    >>> bool(np.array_equal(again.predict_proba(X), model.predict_proba(X)))
    True
    """
    if not isinstance(estimator, BaseEstimator) or not _is_fastep_class(type(estimator)):
        raise TypeError(f"estimator must be a fastep estimator, got {type(estimator).__name__}")
    encoder = _Encoder()
    if getattr(estimator, "callback", None) is not None:
        # a function cannot be stored without pickle: the saved model has no callback
        warnings.warn(f"{type(estimator).__name__}.callback ({estimator.callback!r}) is not saved; the loaded model "
                      "has callback=None", UserWarning, stacklevel=2)
        estimator = copy.copy(estimator)
        estimator.callback = None
    state = encoder.fastep_object(estimator, "estimator")
    params = {name: (value if value is None or isinstance(value, (bool, str, int)) or
                     (type(value) is float and np.isfinite(value)) else repr(value))
              for name, value in estimator.get_params(deep=False).items()}
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        try:
            metadata = json.loads(json.dumps(metadata, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise TypeError(f"metadata must hold JSON values only: {error}") from None
    document = {"format": _FORMAT, "format_version": FORMAT_VERSION, "fastep_version": _fastep_version(),
                "estimator": type(estimator).__name__, "params": params, "summary": _summary(estimator),
                "metadata": metadata or {}, "state": state}
    document["checksum"] = _checksum(document, encoder.arrays)
    members = dict(encoder.arrays)
    members[_METADATA] = np.frombuffer(json.dumps(document, allow_nan=False).encode("utf-8"), dtype=np.uint8)
    if isinstance(path, (str, os.PathLike)):
        with open(path, "wb") as handle:
            np.savez(handle, **members)
    else:
        np.savez(path, **members)


def _read(path):
    """(document, arrays) of a model file, checked; ``ValueError`` for anything else."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            members = {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"{path!r} is not a readable fastep model file (truncated or not an .npz archive): "
                         f"{error}") from None
    raw = members.pop(_METADATA, None)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"{path!r} is not a fastep model file (no {_METADATA} member)")
    try:
        document = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r}: the model description is not valid JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ValueError(f"{path!r} is not a fastep model file")
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path!r} has model format version {version!r}; this fastep reads version "
                         f"{FORMAT_VERSION} only")
    expected = document.pop("checksum", None)
    if expected != _checksum(document, members):
        raise ValueError(f"{path!r} fails its checksum: the file was modified or damaged after it was saved")
    return document, members


def load(path: _File) -> BaseEstimator:
    """Load an estimator saved by :func:`save`.

    Nothing named in the file is imported or executed: the classes it names must be fastep's
    own, and arrays are read with ``allow_pickle=False``.

    Parameters
    ----------
    path : str or os.PathLike or file object

    Returns
    -------
    estimator
        The estimator as saved; fitted models predict bitwise identically.

    Raises
    ------
    ValueError
        The file is not a fastep model, has another format version, fails its checksum
        (truncated or modified), or names a class that is not fastep's.
    FileNotFoundError
        No such file.

    Warns
    -----
    UserWarning
        The file was written by another fastep version (the model is loaded; its internal state
        may not match this version's code).

    Examples
    --------
    >>> import io
    >>> import numpy as np
    >>> import fastep
    >>> X = np.arange(8.0)[:, None]; y = X[:, 0] ** 2
    >>> buffer = io.BytesIO()
    >>> fastep.save(fastep.LinearEPRegressor(noise_variance=0.5).fit(X, y), buffer)
    >>> _ = buffer.seek(0)
    >>> model = fastep.load(buffer)
    >>> type(model).__name__, model.predict(X[:2]).shape
    ('LinearEPRegressor', (2,))
    """
    document, arrays = _read(path)
    decoder = _Decoder(arrays, _class_table())
    estimator = decoder.decode(document["state"])
    if not isinstance(estimator, BaseEstimator):
        raise ValueError(f"{path!r} does not hold a fastep estimator")
    if document.get("fastep_version") != _fastep_version():
        warnings.warn(f"{path!r} was saved by fastep {document.get('fastep_version')}, loaded by fastep "
                      f"{_fastep_version()}; refit if predictions look wrong", UserWarning, stacklevel=2)
    return estimator


def read_metadata(path: _File) -> dict[str, Any]:
    """The checked description of a model file, without building the estimator.

    Parameters
    ----------
    path : str or os.PathLike or file object

    Returns
    -------
    dict
        ``format``, ``format_version``, ``fastep_version``, ``estimator`` (class name),
        ``params``, ``summary`` (kernel, likelihood, log evidence, classes as text and numbers)
        and ``metadata`` (what :func:`save` was given).

    Examples
    --------
    >>> import io
    >>> import numpy as np
    >>> import fastep
    >>> from fastep.persistence import read_metadata
    >>> X = np.arange(6.0)[:, None]; y = 2.0 * X[:, 0]
    >>> buffer = io.BytesIO()
    >>> fastep.save(fastep.LinearEPRegressor().fit(X, y), buffer, metadata={"target": "price"})
    >>> _ = buffer.seek(0)
    >>> info = read_metadata(buffer)
    >>> info["estimator"], info["metadata"]
    ('LinearEPRegressor', {'target': 'price'})
    """
    document, _ = _read(path)
    return {key: value for key, value in document.items() if key != "state"}


def _roundtrip_bytes(estimator):
    """Save to memory and load again (tests)."""
    buffer = io.BytesIO()
    save(estimator, buffer)
    buffer.seek(0)
    return load(buffer)
