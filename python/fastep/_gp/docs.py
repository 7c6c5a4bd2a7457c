"""Docstring pieces the GP estimators share (filled in by :func:`fastep._base.fill_doc`)."""
from __future__ import annotations




__all__ = ["N_JOBS_DOC", "HYPERPRIOR_DOC", "LEARNING_ATTRIBUTES", "EP_RUN_ATTRIBUTES", "MIXED_UNITS_DOC", "CLASSIFIER_ATTRIBUTES", "REGRESSOR_ATTRIBUTES"]


#: The ``n_jobs`` parameter of the one-vs-rest classifiers, as their docstrings give it.
N_JOBS_DOC = """n_jobs : int or None, default None
        One-vs-rest problems fitted at once in a thread pool (``-1``: one per core). None
        fits them one after the other with the process's BLAS threads; with an integer,
        including 1, each problem's BLAS calls run on one thread, so the results are
        bitwise identical for every integer ``n_jobs`` (see :func:`fastep.batch.fit_many`)."""


#: The ``hyperprior`` parameter of the GP estimators, as their docstrings give it.
HYPERPRIOR_DOC = """hyperprior : 'auto', None or fastep.hyperpriors.LogNormal, default 'auto'
        What the hyperparameter search maximises. 'auto' (``LogNormal(scale=2.5)``): the log
        posterior of the hyperparameters (MAP-II), ``log Z(θ) + Σ_k log N(log x_k; log x_k⁰, s²)``
        over the learnt positive hyperparameters ``x_k`` (kernel variances and widths, noise
        parameters), with medians ``x_k⁰`` at their starting values. It has a finite maximum on
        separable data, where ``log Z`` alone keeps rising along a growing latent scale
        (:mod:`fastep.hyperpriors`). None: type-II maximum likelihood (``log Z`` alone). The
        search moves the logarithms of the positive parameters and ends at an accepted L-BFGS-B
        step that raised the objective by less than 1e-5 per training point where a further
        Newton step would gain less than that too, or that moved no log-parameter by more than
        1e-3; after five evaluations in a row within one L-BFGS-B iteration that did not raise
        its best value by 1e-5 per point, at that best point; or where L-BFGS-B converges
        (:mod:`fastep._search.space`)."""

#: The fitted attributes of the search, as the GP estimators' docstrings give them.
LEARNING_ATTRIBUTES = """log_hyperposterior_value_ : float
        The objective the search maximised, at the fitted hyperparameters:
        ``log_marginal_likelihood_value_`` plus the hyperprior's log density (equal to it with
        ``hyperprior=None`` or ``optimizer=None``; summed over one-vs-rest problems).
    n_evaluations_ : int or ndarray (n_classes,)
        Evidence evaluations of the search on all training points (0 with ``optimizer=None``;
        the multinomial model's search on a subset first is not counted)."""

#: The final EP runs' attributes (:meth:`GPEstimator._set_ep_summary`), as the docstrings give them.
EP_RUN_ATTRIBUTES = """n_sweeps_ : int or ndarray (n_classes,)
        EP sweeps of the final run.
    converged_ : bool
        Whether every final EP run met ``tol``."""

#: The close of the GP estimators' ``kernel`` entry: the data-aware start on inputs in mixed units.
MIXED_UNITS_DOC = """When the ranges of the input columns differ by more than a factor of 100 (mixed units),
    the RBF of that start becomes ``RBFARD`` with fixed scales 1/range² per column and γ
    from the range-scaled inputs, so that raw and standardised columns give the same model."""

#: The attributes of the one-vs-rest GP classifiers' kernel and likelihood, as their docstrings give them.
CLASSIFIER_ATTRIBUTES = """classes_ : ndarray (n_classes,)
        Sorted class labels; ``classes_[1]`` is the positive class of a binary problem.
    kernel_, likelihood_ : Kernel, Likelihood (lists, one per class, one-vs-rest)
        The fitted kernel and likelihood."""

#: The fitted noise model of the GP regressors with Gaussian or Student-t noise.
REGRESSOR_ATTRIBUTES = """kernel_ : Kernel
        The fitted kernel.
    likelihood_ : Gaussian or StudentT
        The fitted noise model.
    noise_variance_ : float
        The variance of the fitted noise (Student-t: ``ν σ²/(ν - 2)``, ``inf`` for ν <= 2)."""
