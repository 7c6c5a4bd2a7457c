"""Covariance functions (kernels) with exact gradients in an unconstrained parameter space.

Kernels (IVM §4, Lawrence, Seeger & Herbrich)
---------------------------------------------
=============  ==============================================================  =========================
class          k(x, y)                                                         hyperparameters
=============  ==============================================================  =========================
``Linear``     v xᵀy                                                           variance
``RBF``        v exp(-γ/2 |x - y|²)                                            variance, inverse_width
``MLP``        v (2/π) asin((w xᵀy + b) / sqrt((w xᵀx + b + 1)(w yᵀy + b + 1)))  variance, weight_variance,
                                                                               bias_variance
``White``      v δ(x, y)  (see below)                                          variance
``Bias``       v                                                               variance
``LinearARD``  ``Linear`` with xᵀy replaced by xᵀAy                            + scales
``RBFARD``     ``RBF`` with |x - y|² replaced by (x - y)ᵀA(x - y)              + scales
``MLPARD``     ``MLP`` with every inner product xᵀy replaced by xᵀAy           + scales
=============  ==============================================================  =========================

``A = diag(α)`` holds one input scale per column (IVM §4: "automatic relevance
determination"); ``ard_groups`` ties columns to a shared scale (``α_col =
scales[ard_groups[col]]``), as the IVM paper does for blocks of USPS pixels.
Sums and products of kernels are kernels: ``k1 + k2``, ``k1 * k2``,
``Sum([...])``, ``Product([...])``.

Conventions worth knowing:

* ``MLP`` carries the factor 2/π of Williams (1997) so that ``v`` bounds the
  process variance (|k| < v); the IVM paper's θ_mlp equals ``(2/π) v`` here.
* ``White`` is a noise process attached to the *training sample*: ``K(X, X) =
  v I`` but every cross-covariance ``K(X*, X)`` is zero, even if rows of ``X*``
  coincide with rows of ``X`` (new observations get new, independent noise).
  ``diag(X*)`` is ``v`` (the marginal variance of a fresh noisy observation).
* ``RBF`` uses the IVM inverse width γ; a length-scale ℓ corresponds to
  γ = 1/ℓ² (``RBF.lengthscale`` reports it).

Parameters and transforms
-------------------------
Every hyperparameter has a *constrained* value x (what the formulas use,
reported by ``get_params``) and an *unconstrained* value t (``kernel.theta``,
what an optimiser moves) linked by a transform x = g(t):

=============  ==========================  ========================  ==========================
transform      x = g(t)                    dx/dt                     t = g⁻¹(x)
=============  ==========================  ========================  ==========================
``softplus``   log(1 + eᵗ)  (IVM §4)       σ(t) = 1/(1 + e⁻ᵗ)        x + log(1 - e⁻ˣ)
``log``        eᵗ                          eᵗ = x                    log x
``sigmoid``    σ(t)  (IVM §4, ARD scales)  σ(t) σ(-t) = x (1 - x)    log x - log(1 - x)
=============  ==========================  ========================  ==========================

``softplus`` is the default for every positive parameter, ``sigmoid`` for ARD
scales (which then lie in (0, 1): the overall scale is carried by the variance,
the inverse width or the weight variance). They are evaluated stably:
``softplus`` as ``logaddexp(0, t)``, its inverse as ``x + log(-expm1(-x))``
(no overflow for large x, full precision for tiny x), ``σ`` with
``scipy.special.expit`` and σ(t)σ(-t) for its derivative. A parameter can also
be marked ``'fixed'``: it keeps its value and is left out of ``theta`` and of
the gradients. Choose per parameter with ``transforms={'variance': 'log'}``.

Gradients are exact derivatives of K with respect to the unconstrained
parameters, dK/dt = dK/dx · dx/dt, in ``theta`` order
(``kernel.hyperparameter_names``).

Memory
------
``kernel(X)`` forms one n×n result (plus at most a few n×n temporaries);
``kernel.diag(X)`` works in O(n d) without forming any n×n array;
``kernel(X, eval_gradient=True)`` returns the full (n, n, n_theta) array; for
O(n²) memory use ``kernel.gradient(X, i)`` (one parameter) or
``kernel.gradient_iter(X)`` (one n×n derivative at a time). ``kernel.columns(X)``
returns an oracle for single columns of K(X, X) (O(n d) each, no n×n array;
used by the IVM). Peak n×n arrays
alive, besides the result: about 2 for K of RBF/Linear, 4 for K of MLP; while
differentiating, 3 for RBF and 7 for MLP (shared intermediates P = XAXᵀ,
sqrt(N), atan2 argument, scale factor, two work buffers), plus, for a product
of kernels, the product of the other factors.

Sparse GPs (inducing inputs Z) need derivatives of cross-covariances and of the
diagonal: ``kernel.cross_gradient_iter(Z, X)`` yields ∂K(Z, X)/∂θ_i one (m, n) array at a
time, ``kernel.diag_gradient(X)`` is the (n, n_theta) array of ∂k(x_i, x_i)/∂θ_j, and
``kernel.input_gradient(Z, X, W)`` is the (m, d) gradient of Σ_ij W_ij k(z_i, x_j) with respect
to Z (X fixed): for RBF/RBFARD ``G_i = -γ a ∘ Σ_j W_ij k(z_i, x_j) (z_i - x_j)``, for
Linear/LinearARD ``G = v (W X) A``, for MLP/MLPARD ``G_i = w A Σ_j R_ij (x_j - (a_ij/d_i) z_i)``
with ``R = (2/π) v W / sqrt(N)`` (notation of ``MLP``), zero for White and Bias, and by the sum
and product rules for composites. Every kernel here provides all three.

Squared distances are computed as |x|² + |y|² - 2 XYᵀ with BLAS (``X Xᵀ`` by ``syrk``,
exactly symmetric), after subtracting the mean
of ``X`` from both inputs (distances are translation invariant; centring removes
the cancellation for data far from the origin), and clamped at 0.

Modules
-------
``transforms`` (parameter transforms), ``base`` (the :class:`Kernel` API and the parameter
framework), ``stationary`` (RBF, RBFARD, White, Bias), ``dot_product`` (Linear, LinearARD,
MLP, MLPARD), ``combinators`` (Sum, Product) and ``columns`` (the column oracle of the IVM).
Every public name is importable from ``fastep.kernels``.
"""
from .base import Kernel
from .columns import ColumnProductCache, KernelColumns
from .combinators import Product, Sum
from .dot_product import MLP, Linear, LinearARD, MLPARD
from .stationary import RBF, RBFARD, Bias, White
from .transforms import TRANSFORMS, Transform

__all__ = [
    "Kernel", "Linear", "RBF", "MLP", "White", "Bias", "LinearARD", "RBFARD", "MLPARD",
    "Sum", "Product", "Transform", "TRANSFORMS", "KernelColumns", "ColumnProductCache",
]
