"""Prediction of the sparse GP estimators in row blocks (on a Dask cluster for a dask ``X``)."""
from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING

import numpy as np

from . import distributed as _chunked
from .._base import check_is_fitted
from .._gp.estimator import GPClassifierMixin, GPEstimator

if TYPE_CHECKING:
    from typing import Any

    from numpy.typing import ArrayLike, NDArray

    from .._typing import MeanStd

__all__ = ["_ChunkedClassifierMixin", "_ChunkedRegressorMixin"]


class _ChunkedPredictMixin:
    """Predictions on a dask array: the same method mapped over its row chunks (a dask array back).

    The workers receive a copy of the estimator that holds only the m-sized prediction state.
    """

    def _map_chunks(self, X, method, n_cols, dtype, **kwargs):
        check_is_fitted(self, "_problems")
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[-1] if X.ndim else 0} features, but {type(self).__name__} "
                             f"is expecting {self.n_features_in_} features as input (shape {X.shape})")
        light = copy.copy(self)
        light.__dict__ = {key: val for key, val in self.__dict__.items()
                          if key not in ("site_precision_", "site_natural_mean_", "_problems")}
        light._problems = [p.predictor for p in self._problems]
        X = X.rechunk({1: -1})
        apply = functools.partial(_predict_chunk, light, method, kwargs)
        if n_cols is None:
            return X.map_blocks(apply, drop_axis=1, dtype=dtype)
        return X.map_blocks(apply, chunks=(X.chunks[0], (n_cols,)), dtype=dtype)

    _problems: list[Any]
    n_features_in_: int
    classes_: NDArray[Any]

    def predict_latent(self, X: ArrayLike) -> MeanStd:
        if _chunked.is_dask_array(X):
            both = self._map_chunks(X, "_latent_columns", 2 * len(self._problems), np.float64)
            k = len(self._problems)
            if k == 1:
                return both[:, 0], both[:, 1]
            return both[:, :k], both[:, k:]
        return super().predict_latent(X)  # type: ignore[misc]  # the GP mixin's

    def _latent_columns(self, X):
        mean, var = self.predict_latent(X)
        return np.column_stack([mean, var])

    predict_latent.__doc__ = GPEstimator.predict_latent.__doc__


def _predict_chunk(estimator, method, kwargs, block):
    return getattr(estimator, method)(block, **kwargs)


class _ChunkedClassifierMixin(_ChunkedPredictMixin):
    def predict_proba(self, X: ArrayLike) -> NDArray[np.float64]:
        if _chunked.is_dask_array(X):
            return self._map_chunks(X, "predict_proba", len(self.classes_), np.float64)
        return super().predict_proba(X)  # type: ignore[misc]  # the GP mixin's

    def decision_function(self, X: ArrayLike) -> NDArray[np.float64]:
        if _chunked.is_dask_array(X):
            k = len(self._problems)
            return self._map_chunks(X, "decision_function", None if k == 1 else k, np.float64)
        return super().decision_function(X)  # type: ignore[misc]  # the GP mixin's

    def predict(self, X: ArrayLike) -> NDArray[Any]:
        if _chunked.is_dask_array(X):
            check_is_fitted(self, "_problems")
            return self._map_chunks(X, "predict", None, self.classes_.dtype)
        return super().predict(X)  # type: ignore[misc]  # the GP mixin's

    predict_proba.__doc__ = GPClassifierMixin.predict_proba.__doc__
    decision_function.__doc__ = GPClassifierMixin.decision_function.__doc__
    predict.__doc__ = GPClassifierMixin.predict.__doc__


class _ChunkedRegressorMixin(_ChunkedPredictMixin):
    def _predict_mean_std(self, X: ArrayLike, return_std: bool) -> NDArray[np.float64] | MeanStd:
        if _chunked.is_dask_array(X):
            if return_std:
                both = self._map_chunks(X, "_mean_std_columns", 2, np.float64)
                return both[:, 0], both[:, 1]
            return self._map_chunks(X, "predict", None, np.float64)
        return super()._predict_mean_std(X, return_std)  # type: ignore[misc]  # the GP mixin's

    def _mean_std_columns(self, X):
        return np.column_stack(self.predict(X, return_std=True))  # type: ignore[attr-defined]
