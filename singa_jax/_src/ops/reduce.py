"""Reductions: over several tensors elementwise (SINGA's Sum, Mean, Max, Min, add_all; NumPy
broadcasting) and over axes of one tensor (ReduceSum, ReduceMean).

Max and Min keep SINGA's tie rule: on equal values the earlier input wins and gets the whole
gradient. This module defines ``sum``, ``max`` and ``min`` (SINGA's names), which shadow the
builtins inside it.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax.numpy as jnp

from singa_jax._src.autodiff.autocast import FLOAT32
from singa_jax._src.autodiff.autocast import declare as declare_autocast
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.autodiff.function import Function
from singa_jax._src.ops.declare import declare
from singa_jax._src.ops.helpers import normalize_axis

__all__ = ["Sum", "sum", "Mean", "mean", "Max", "max", "Min", "min", "add_all",
           "ReduceSum", "reduce_sum", "ReduceMean", "reduce_mean"]


def _fold(pairwise):
    """An n-ary function folding ``pairwise`` over its arguments left to right."""
    def fn(*xs):
        if not xs:
            raise ValueError("needs at least one input")
        return functools.reduce(pairwise, xs)
    return fn


_sum = _fold(jnp.add)


def _mean(*xs):
    return _sum(*xs) / len(xs)


Sum, sum = declare("Sum", "sum", ("*l",), _sum, "y = l[0] + l[1] + ... (broadcasting).")
Mean, mean = declare("Mean", "mean", ("*l",), _mean,
                     "y = (l[0] + l[1] + ...) / len(l) (broadcasting).")
Max, max = declare("Max", "max", ("*l",), _fold(lambda a, b: jnp.where(a >= b, a, b)),
                   "y = elementwise maximum of the inputs (broadcasting); ties go to the earlier input.")
Min, min = declare("Min", "min", ("*l",), _fold(lambda a, b: jnp.where(a <= b, a, b)),
                   "y = elementwise minimum of the inputs (broadcasting); ties go to the earlier input.")


def add_all(*xs: Tensor) -> Tensor:
    """y = xs[0] + xs[1] + ... (one :class:`Sum` op; SINGA chains ``add``)."""
    return Sum()(*xs)[0]


def _reduce(reducer):
    def fn(x, *, axes, keepdims):
        if axes is not None:
            axes = tuple(normalize_axis(a, x.ndim) for a in axes)
        return reducer(x, axis=axes, keepdims=bool(keepdims))
    return fn


class _AxesReduction(Function):
    def __init__(self, axes: Optional[Sequence[int]] = None, keepdims: int = 1):
        super().__init__(axes=None if axes is None else tuple(int(a) for a in axes),
                         keepdims=int(keepdims))


class ReduceSum(_AxesReduction):
    """y = sum of x over ``axes`` (all when None); ``keepdims=1`` keeps them with length 1."""

    fn = staticmethod(_reduce(jnp.sum))


class ReduceMean(_AxesReduction):
    """y = mean of x over ``axes`` (all when None); ``keepdims=1`` keeps them with length 1."""

    fn = staticmethod(_reduce(jnp.mean))


def reduce_sum(x: Tensor, axes: Optional[Sequence[int]] = None, keepdims: int = 1) -> Tensor:
    """Sum over axes (see :class:`ReduceSum`)."""
    return ReduceSum(axes, keepdims)(x)[0]


def reduce_mean(x: Tensor, axes: Optional[Sequence[int]] = None, keepdims: int = 1) -> Tensor:
    """Mean over axes (see :class:`ReduceMean`)."""
    return ReduceMean(axes, keepdims)(x)[0]


# what computes in half precision under autograd.autocast (see autocast.declare)
declare_autocast(FLOAT32, ReduceSum, ReduceMean)
