"""Reading the command line's data files: CSV with a header row, or ``.npz`` with ``X`` and ``y``.

Every problem a user can make in a file gets a ``ValueError`` that names the file, the line
and the column: a missing column, a cell that is not a number, a missing or non-finite value,
ragged rows, a duplicated column name, an empty file.
"""
import csv
import math
import os

import numpy as np

__all__ = ["Table", "read_table", "write_csv", "parse_labels"]


class Table:
    """Inputs (and targets) read from a file.

    Attributes
    ----------
    X : ndarray (n_samples, n_features) float64
    y : ndarray (n_samples,) or None
        Targets as read: strings from a CSV (see :func:`parse_labels`), the array from a ``.npz``.
    feature_names : list of str
    target_name : str or None
    """

    def __init__(self, X, y, feature_names, target_name):
        self.X, self.y, self.feature_names, self.target_name = X, y, feature_names, target_name


def _number(cell, where):
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {cell!r} is not a finite number (NaN and infinity are not accepted; remove "
                         "or impute the row)")
    return value


def _read_csv(path, target, features, need_target):
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.reader(handle))
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        raise ValueError(f"{path}: the file is empty (a header row naming the columns is needed)")
    header = [name.strip() for name in rows[0]]
    duplicated = sorted({name for name in header if header.count(name) > 1})
    if duplicated:
        raise ValueError(f"{path}: the header names column(s) {duplicated} more than once")
    if "" in header:
        raise ValueError(f"{path}: the header has an empty column name (column {header.index('') + 1})")
    body = rows[1:]
    if not body:
        raise ValueError(f"{path}: no data rows after the header")
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"{path} line {number}: {len(row)} cells, but the header has {len(header)} columns")

    def column(name, what):
        if name not in header:
            raise ValueError(f"{path}: no column {name!r} ({what}); the columns are {header}")
        return header.index(name)

    target_index = None
    if target is not None and (need_target or target in header):
        target_index = column(target, "--target")
    elif need_target:
        raise ValueError("--target is required: name the column that holds the labels or values")
    if features is None:
        feature_names = [name for i, name in enumerate(header) if i != target_index]
    else:
        feature_names = list(features)
        if target is not None and target in feature_names:
            raise ValueError(f"--features names the target column {target!r}")
    if not feature_names:
        raise ValueError(f"{path}: no feature columns (the file has only the target column)")
    indices = [column(name, "--features" if features is not None else "feature") for name in feature_names]
    X = np.empty((len(body), len(indices)))
    for r, row in enumerate(body):
        for c, index in enumerate(indices):
            cell = row[index].strip()
            if cell == "":
                raise ValueError(f"{path} line {r + 2}, column {header[index]!r}: missing value")
            X[r, c] = _number(cell, f"{path} line {r + 2}, column {header[index]!r}")
    y = None
    if target_index is not None:
        y = [row[target_index].strip() for row in body]
        for r, cell in enumerate(y):
            if cell == "":
                raise ValueError(f"{path} line {r + 2}, column {target!r}: missing target value")
    return Table(X, y, feature_names, target if target_index is not None else None)


def _read_npz(path, target, features, need_target):
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as error:            # noqa: BLE001 - any unreadable file is the user's error here
        raise ValueError(f"{path}: not a readable .npz file ({error})") from None
    with archive:
        if "X" not in archive.files:
            raise ValueError(f"{path}: an .npz data file needs an array 'X' (inputs); it has {archive.files}")
        X = np.asarray(archive["X"])
        target_key = target if target is not None else "y"
        y = archive[target_key] if target_key in archive.files else None
    if X.ndim != 2 or X.dtype.kind not in "biuf":
        raise ValueError(f"{path}: 'X' must be a 2-D numeric array, got shape {X.shape} dtype {X.dtype}")
    X = X.astype(np.float64)
    names = [f"x{j}" for j in range(X.shape[1])]
    if features is not None:
        unknown = [name for name in features if name not in names]
        if unknown:
            raise ValueError(f"{path}: no feature(s) {unknown}; the columns of X are named {names[0]} .. {names[-1]}")
        X = X[:, [names.index(name) for name in features]]
        names = list(features)
    bad = np.argwhere(~np.isfinite(X))
    if bad.size:
        i, j = bad[0]
        raise ValueError(f"{path}: X[{i}, {j}] = {X[i, j]} is not finite")
    if need_target and y is None:
        raise ValueError(f"{path}: no target array {target_key!r}")
    if y is not None and (y.ndim != 1 or y.shape[0] != X.shape[0]):
        raise ValueError(f"{path}: the target array {target_key!r} must have shape ({X.shape[0]},), got {y.shape}")
    return Table(X, y, names, target_key if y is not None else None)


def read_table(path, *, target=None, features=None, need_target=True):
    """Read a CSV (header row, numeric feature columns) or ``.npz`` (``X``, ``y``) data file.

    Parameters
    ----------
    path : str
    target : str, optional
        The target column (CSV) or array name (``.npz``, default ``'y'``).
    features : list of str, optional
        Feature columns, in order (default: every column but the target; ``.npz``: ``x0, x1, ...``).
    need_target : bool, default True
        Whether a missing target is an error (``predict`` does not need one).

    Returns
    -------
    Table
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if str(path).endswith(".npz"):
        return _read_npz(path, target, features, need_target)
    return _read_csv(path, target, features, need_target)


def parse_labels(values, *, regression):
    """Targets read as text: floats for regression (an error names the first bad row); labels for
    classification, as integers when every label is an integer, else as strings."""
    values = np.asarray(values)
    if values.dtype.kind in "biuf":
        if regression:
            values = values.astype(np.float64)
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                raise ValueError(f"target row {bad[0]}: {values[bad[0]]} is not finite")
        return values
    if regression:
        out = np.empty(values.shape[0])
        for i, cell in enumerate(values):
            out[i] = _number(str(cell), f"target row {i + 1}")
        return out
    try:
        as_int = np.array([int(str(cell)) for cell in values], dtype=np.int64)
        return as_int
    except ValueError:
        return values.astype(str)


def write_csv(path_or_stream, columns):
    """Write ``{name: 1-D array}`` as a CSV with a header (floats with full precision)."""
    names = list(columns)
    data = [np.asarray(columns[name]) for name in names]
    handle = open(path_or_stream, "w", newline="", encoding="utf-8") if isinstance(path_or_stream, str) \
        else path_or_stream
    try:
        writer = csv.writer(handle)
        writer.writerow(names)
        for row in zip(*data):
            writer.writerow([repr(float(cell)) if isinstance(cell, (float, np.floating)) else str(cell)
                             for cell in row])
    finally:
        if isinstance(path_or_stream, str):
            handle.close()
