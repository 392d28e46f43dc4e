"""SINGA's loss operators: softmax cross-entropy, cross-entropy, binary cross-entropy, mean
square error and ranking loss.

As in SINGA, a loss returns a Tensor of shape (1,) and the target-taking losses receive the
target in the constructor (``SoftMaxCrossEntropy(t)(x)``): the target is a constant that gets no
gradient. Forward conventions (normalisation, SINGA's epsilons) are SINGA's; gradients are the
exact derivatives of those forwards times the incoming dy (see docs/autograd_nn.md).
"""
from __future__ import annotations

from typing import Any, Callable, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from singa_jax._src.autodiff.autocast import FLOAT32
from singa_jax._src.autodiff.autocast import declare as declare_autocast
from singa_jax._src.base.checks import check_indices
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.autodiff.function import Function, InvalidInput, as_tensor

__all__ = [
    "SoftMaxCrossEntropy", "softmax_cross_entropy", "CrossEntropy", "cross_entropy",
    "BinaryCrossEntropy", "binary_cross_entropy", "MeanSquareError", "mse_loss",
    "RankingLoss", "ranking_loss",
]


def _as_loss(total, batch: int):
    """SINGA's ``SumAll(...) / batch``: a (1,) tensor."""
    return (total / batch).reshape(1)


def _label_targets(t, batch: int) -> bool:
    """SINGA reads ``t`` as one class index per row when it has exactly ``batch`` elements."""
    return t.size == batch


def _picked(values, t):
    """values[i, t[i]] for integer class indices t (checked in range and integral before the
    kernel runs, see ``_check_labels``)."""
    idx = t.reshape(-1).astype(jnp.int32)
    return jnp.take_along_axis(values, idx[:, None], axis=1)[:, 0]


def _softmax_cross_entropy_kernel(x, t):
    """loss = -(1/N) sum_i sum_j tn[i, j] log softmax(x)[i, j], with tn = t / rowsum(t) for
    distribution targets, or -(1/N) sum_i log softmax(x)[i, t[i]] for index targets."""
    batch = x.shape[0]
    logp = jax.nn.log_softmax(x, axis=1)
    t = lax.stop_gradient(t)
    if _label_targets(t, batch):
        return _as_loss(-jnp.sum(_picked(logp, t)), batch)
    t = t.astype(x.dtype)
    tn = t / jnp.sum(t, axis=1, keepdims=True)
    return _as_loss(-jnp.sum(tn * logp), batch)


def _cross_entropy_kernel(x, t):
    """x holds probabilities: loss = -(1/N) sum t * log(x) (t one-hot / distribution of x's
    shape, or one class index per row)."""
    batch = x.shape[0]
    t = lax.stop_gradient(t)
    if t.shape != x.shape:
        return _as_loss(-jnp.sum(jnp.log(_picked(x, t))), batch)
    return _as_loss(-jnp.sum(t.astype(x.dtype) * jnp.log(x)), batch)


def _binary_cross_entropy_kernel(x, t):
    """loss = -(1/N) sum [t log(x + 1e-4) + (1 - t) log(1.0001 - x)] (SINGA's epsilons)."""
    t = lax.stop_gradient(t).astype(x.dtype)
    total = jnp.sum(t * jnp.log(x + 1e-4)) + jnp.sum((1.0 - t) * jnp.log(1.0001 - x))
    return _as_loss(-total, x.shape[0])


def _mse_kernel(x, t):
    """loss = sum (x - t)^2 / x.size, x - t broadcast as NumPy does (SINGA subtracts with its
    broadcasting ``__sub__`` and divides by the number of elements of x)."""
    err = x - lax.stop_gradient(t).astype(x.dtype)
    return _as_loss(jnp.sum(jnp.square(err)), x.size)


def _ranking_kernel(pos, neg, *, M: float):
    """loss = (1/N) sum max(0, M - pos + neg)."""
    val = M - pos + neg
    return _as_loss(jnp.sum(jnp.where(val > 0, val, 0.0)), pos.shape[0])


# --- shape checks: (x, t) -> error message or None ---------------------------
def _check_class_scores(x, t):
    if x.ndim != 2:
        return f"x must be 2-D (batch, classes), got shape {tuple(x.shape)}"
    if x.shape[0] == 0 or x.shape[1] == 0:
        return (f"x of shape {tuple(x.shape)} is empty: a loss needs at least one example and "
                f"one class")
    if t.ndim > 2:
        return f"t must be at most 2-D, got shape {tuple(t.shape)}"
    if not (_label_targets(t, x.shape[0]) or tuple(t.shape) == tuple(x.shape)):
        return (f"t of shape {tuple(t.shape)} is neither {x.shape[0]} class indices nor a "
                f"target of x's shape {tuple(x.shape)} (batch sizes differ?)")
    return None


def _check_same_shape(x, t):
    if tuple(x.shape) != tuple(t.shape):
        return f"input of shape {tuple(x.shape)} and target of shape {tuple(t.shape)} differ"
    if x.ndim == 0:
        return "input must have a batch axis, got a 0-d array"
    if x.shape[0] == 0:
        return f"input of shape {tuple(x.shape)} is an empty batch"
    return None


def _check_broadcast(x, t):
    """MeanSquareError(t)(x): t must broadcast against x (SINGA's fine-tuning test feeds a
    (2, 1) target to a (2, 4) output)."""
    try:
        np.broadcast_shapes(tuple(x.shape), tuple(t.shape))
    except ValueError:
        return (f"input of shape {tuple(x.shape)} and target of shape {tuple(t.shape)} do not "
                f"broadcast")
    if x.ndim == 0:
        return "input must have a batch axis, got a 0-d array"
    if x.size == 0:
        return f"input of shape {tuple(x.shape)} is empty"
    return None


# --- value checks of class-index targets: (op, x, t) -> None or raises / records ---------
def _check_labels(op: str, x, t) -> None:
    """Class-index targets must be integers in ``[0, classes)`` (eager: ValueError now; graph
    mode: an error at the end of the step, see base.checks). A float label must be
    an exact integer: SINGA would truncate 1.5 to class 1 silently."""
    classes = x.shape[1]
    check_indices(op, "class labels t", t, classes,
                  f"x has shape {tuple(x.shape)}: {classes} classes", require_integers=True)


def _softmax_cross_entropy_labels(x, t) -> None:
    if _label_targets(t, x.shape[0]):  # else one-hot / distribution rows: any values
        _check_labels("SoftMaxCrossEntropy", x, t)


def _cross_entropy_labels(x, t) -> None:
    if tuple(t.shape) != tuple(x.shape):
        _check_labels("CrossEntropy", x, t)


class _TargetLoss(Function):
    """Base of SINGA's losses that take the target ``t`` in the constructor: ``Op(t)(x)``.

    The kernel is ``fn(x, t)``: ``t`` is a declared read (see ``Function.reads``), so it enters
    the kernel without gradient, graph mode sees it, and backward returns x's gradient only,
    as SINGA's losses do.
    """

    check: Callable = None  # (x, t) -> error message or None
    check_values: Callable = None  # (x, t) -> None; raises / records bad target values

    def __init__(self, t: Any):
        super().__init__()
        self.t = as_tensor(t, None)

    def reads(self) -> Tuple[Tensor, ...]:
        return (self.t,)

    replayable = True  # forward checks x's shape only: eager replay may record it

    def forward(self, x):
        t = self.t.array
        msg = type(self).check(x, t)
        if msg is not None:
            raise InvalidInput(f"{type(self).__name__}: {msg}")
        if type(self).check_values is not None:
            type(self).check_values(x, t)
        return super().forward(x)


def _make_loss(name: str, kernel: Callable, check: Callable,
               check_values: Callable = None) -> type:
    return type(name, (_TargetLoss,), {
        "fn": staticmethod(kernel), "check": staticmethod(check),
        "check_values": None if check_values is None else staticmethod(check_values),
        "__doc__": kernel.__doc__, "__module__": __name__})


# name -> (kernel, shape check[, value check]); each entry becomes an Operator class ``name(t)``.
_LOSSES = {
    "SoftMaxCrossEntropy": (_softmax_cross_entropy_kernel, _check_class_scores,
                            _softmax_cross_entropy_labels),
    "CrossEntropy": (_cross_entropy_kernel, _check_class_scores, _cross_entropy_labels),
    "BinaryCrossEntropy": (_binary_cross_entropy_kernel, _check_same_shape),
    "MeanSquareError": (_mse_kernel, _check_broadcast),
}
SoftMaxCrossEntropy, CrossEntropy, BinaryCrossEntropy, MeanSquareError = (
    _make_loss(name, *entry) for name, entry in _LOSSES.items())


def softmax_cross_entropy(x: Tensor, t: Tensor) -> Tensor:
    """Mean over the batch of the cross-entropy of softmax(x) (x: (batch, classes) logits) and
    ``t`` (class indices, or one-hot / distribution rows). Returns a (1,) Tensor."""
    return SoftMaxCrossEntropy(t)(x)[0]


def cross_entropy(x: Tensor, t: Tensor) -> Tensor:
    """Mean over the batch of -sum t * log(x), x holding probabilities. Returns (1,)."""
    return CrossEntropy(t)(x)[0]


def binary_cross_entropy(x: Tensor, t: Tensor) -> Tensor:
    """-(1/batch) sum [t log(x + 1e-4) + (1 - t) log(1.0001 - x)]. Returns (1,)."""
    return BinaryCrossEntropy(t)(x)[0]


def mse_loss(x: Tensor, t: Tensor) -> Tensor:
    """sum (x - t)^2 divided by the number of elements. Returns (1,). x and t must have the
    same shape (SINGA's ``mse_loss`` asserts it; the operator ``MeanSquareError(t)(x)``
    broadcasts)."""
    t = as_tensor(t, None)
    msg = _check_same_shape(x, t)
    if msg is not None:
        raise InvalidInput(f"MeanSquareError (mse_loss): {msg}")
    return MeanSquareError(t)(x)[0]


class RankingLoss(Function):
    """Margin ranking loss (1/N) sum max(0, M - pos + neg) over N = pos.shape[0] rows."""

    fn = staticmethod(_ranking_kernel)

    def __init__(self, M: float = 0.2):
        super().__init__(M=float(M))
        self.M = float(M)

    replayable = True  # forward checks x's shape only: eager replay may record it

    def forward(self, pos, neg):
        msg = _check_same_shape(pos, neg)
        if msg is not None:
            raise InvalidInput(f"RankingLoss: {msg}")
        return super().forward(pos, neg)

    backward_is_pullback = True  # only dy's default differs

    def backward(self, dy=1.0):
        return super().backward(dy)


def ranking_loss(pos: Tensor, neg: Tensor, M: float = 0.2) -> Tensor:
    return RankingLoss(M)(pos, neg)[0]


# what computes in half precision under autograd.autocast (see autocast.declare)
declare_autocast(FLOAT32, SoftMaxCrossEntropy, CrossEntropy, BinaryCrossEntropy, MeanSquareError,
                 RankingLoss)
