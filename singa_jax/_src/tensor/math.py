"""SINGA's tensor math functions: shape, elementwise and reductions, products, random fills and
the deprecated row/column functions. Plain computation on Tensors (no autograd graph)."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp

from singa_jax._src.tensor.tensor import ShapeLike, Tensor
from singa_jax._src.tensor.operands import (binary, broadcast_shapes, check_tensor, as_line, result,
                                            same_device, shape_errors, to_scalar)

__all__ = ["product", "contiguous", "reshape", "transpose", "repeat", "sum", "average", "softmax",
           "pow", "add", "sub", "eltwise_mult", "div", "lt", "le", "gt", "ge", "eq",
           "abs", "exp", "ceil", "log", "sigmoid", "sign", "sqrt", "square", "tanh",
           "einsum", "tensordot", "concatenate", "axpy", "bernoulli", "gaussian",
           "uniform", "add_column", "add_row", "sum_columns", "sum_rows"]



def product(shape: Sequence[int]) -> int:
    """Number of elements of ``shape``."""
    return math.prod(int(s) for s in shape)


def contiguous(tensor: Tensor) -> Tensor:
    return tensor.contiguous()


def reshape(tensor: Tensor, shape: ShapeLike) -> Tensor:
    """``tensor``'s values in a new shape (``tensor`` is unchanged)."""
    return tensor.reshape(shape)


def transpose(t: Tensor, axes: Optional[Sequence[int]] = None) -> Tensor:
    return t.transpose(axes)


def repeat(t: Tensor, repeats: Union[int, Sequence[int]], axis: Optional[int] = None) -> Tensor:
    return t.repeat(repeats, axis)


def sum(t: Tensor, axis: Union[None, int, Tuple[int, ...]] = None,
        out: Optional[Tensor] = None) -> Tensor:
    """Sum over ``axis`` (all elements when None: a 0-d tensor), optionally into ``out``."""
    with shape_errors("sum", t):
        arr = jnp.sum(t.array, axis=axis)
    return result("sum", t, arr, out)


def average(t: Tensor, axis: Optional[int] = None) -> Union[float, Tensor]:
    """Mean of all elements as a float (SINGA also does so for 1-d tensors), else the tensor of
    means over ``axis``."""
    if axis is None or t.ndim() <= 1:
        return to_scalar(jnp.mean(t.array))
    with shape_errors("average", t):
        return t._new(jnp.mean(t.array, axis=axis))


def softmax(t: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """Softmax over the last axis (each row of a 2-d tensor):
    ``exp(x - max) / sum(exp(x - max))``."""
    return result("softmax", t, jax.nn.softmax(t.array, axis=-1), out)


def _elementwise(op: str, fn: Callable, lhs: Tensor, rhs: Any, out: Optional[Tensor]) -> Tensor:
    check_tensor(op, "lhs", lhs)
    return result(op, lhs, binary(op, fn, lhs, rhs), out)


def pow(t: Tensor, x: Any, out: Optional[Tensor] = None) -> Tensor:
    """``t ** x`` elementwise (``x`` a number or a broadcastable Tensor)."""
    return _elementwise("pow", jnp.power, t, x, out)


def _make_elementwise(name: str, fn: Callable) -> Callable:
    """SINGA's ``<name>(lhs, rhs, ret=None)``: ``fn`` elementwise, into ``ret`` when given."""
    def elementwise(lhs: Tensor, rhs: Any, ret: Optional[Tensor] = None) -> Tensor:
        return _elementwise(name, fn, lhs, rhs, ret)
    elementwise.__name__ = elementwise.__qualname__ = name
    elementwise.__doc__ = (f"Elementwise ``{fn.__name__}(lhs, rhs)`` with NumPy broadcasting; "
                           f"written into ``ret`` (and returned) when given.")
    return elementwise


def _make_comparison(name: str, fn: Callable) -> Callable:
    """SINGA's ``<name>(t, x)``: the operator ``Tensor.__<name>__`` (which applies ``fn``)."""
    def comparison(t: Tensor, x: Any) -> Tensor:
        result = getattr(check_tensor(name, "t", t), f"__{name}__")(x)
        if result is NotImplemented:
            raise TypeError(f"{name}: cannot compare a Tensor with a {type(x).__name__}")
        return result
    comparison.__name__ = comparison.__qualname__ = name
    comparison.__doc__ = f"Elementwise ``{fn.__name__}(t, x)`` as 0/1 in ``t``'s dtype."
    return comparison


def _make_unary(name: str, fn: Callable, formula: str) -> Callable:
    """SINGA's ``<name>(t)``: a new tensor of ``fn`` of each element (``formula`` documents it)."""
    def unary(t: Tensor) -> Tensor:
        return check_tensor(name, "t", t)._new(fn(t.array))
    unary.__name__ = unary.__qualname__ = name
    unary.__doc__ = f"A new tensor with ``{formula}`` for each element x of ``t``."
    return unary

add = _make_elementwise("add", jnp.add)

sub = _make_elementwise("sub", jnp.subtract)

eltwise_mult = _make_elementwise("eltwise_mult", jnp.multiply)

div = _make_elementwise("div", jnp.true_divide)

lt = _make_comparison("lt", jnp.less)

le = _make_comparison("le", jnp.less_equal)

gt = _make_comparison("gt", jnp.greater)

ge = _make_comparison("ge", jnp.greater_equal)

eq = _make_comparison("eq", jnp.equal)

abs = _make_unary("abs", jnp.abs, "|x|")

exp = _make_unary("exp", jnp.exp, "exp(x)")

ceil = _make_unary("ceil", jnp.ceil, "ceil(x)")

log = _make_unary("log", jnp.log, "log(x)")

sigmoid = _make_unary("sigmoid", jax.nn.sigmoid, "1 / (1 + exp(-x))")

sign = _make_unary("sign", jnp.sign, "sign(x)")

sqrt = _make_unary("sqrt", jnp.sqrt, "sqrt(x)")

square = _make_unary("square", jnp.square, "x * x")

tanh = _make_unary("tanh", jnp.tanh, "tanh(x)")


def einsum(ops: str, *args: Tensor) -> Tensor:
    """``numpy.einsum`` over Tensors, e.g. ``einsum('ki,kj->kij', A, B)``."""
    if not ops:
        raise ValueError("einsum: no subscripts given")
    if not args:
        raise ValueError(f"einsum: no operands for {ops!r}")
    for i, a in enumerate(args):
        check_tensor("einsum", f"operand {i}", a)
    same_device("einsum", *args)
    with shape_errors(f"einsum({ops!r})", *args):
        return args[0]._new(jnp.einsum(ops, *(a.array for a in args)))


def tensordot(A: Tensor, B: Tensor, axes: Any = 2) -> Tensor:
    """``numpy.tensordot``: sum products over the last ``axes`` of A and first of B, or over the
    pair of axis lists ``axes``."""
    check_tensor("tensordot", "A", A)
    check_tensor("tensordot", "B", B)
    same_device("tensordot", A, B)
    if isinstance(axes, (list, tuple)):
        axes = tuple(tuple(a) if isinstance(a, (list, tuple)) else a for a in axes)
    with shape_errors("tensordot", A, B):
        return A._new(jnp.tensordot(A.array, B.array, axes))


def concatenate(tensors: Sequence[Tensor], axis: int) -> Tensor:
    """Join tensors along ``axis`` (all other dimensions equal)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate: no tensors given")
    for i, t in enumerate(tensors):
        check_tensor("concatenate", f"tensor {i}", t)
    same_device("concatenate", *tensors)
    with shape_errors("concatenate", *tensors):
        return tensors[0]._new(jnp.concatenate([t.array for t in tensors], axis=axis))


def axpy(alpha: float, x: Tensor, y: Tensor) -> Tensor:
    """In place ``y += alpha * x``; returns ``y``."""
    check_tensor("axpy", "x", x)
    check_tensor("axpy", "y", y)
    same_device("axpy", x, y)
    if broadcast_shapes("axpy", x.shape, y.shape) != y.shape:
        raise ValueError(f"axpy: x of shape {x.shape} does not broadcast to y of shape {y.shape}")
    y.array = (y.array + alpha * x.array).astype(y.dtype)
    return y


def bernoulli(p: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place with 1 (probability ``p``) or 0; returns ``t``."""
    return check_tensor("bernoulli", "t", t).bernoulli(p)


def gaussian(mean: float, std: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place from N(mean, std**2); returns ``t``."""
    return check_tensor("gaussian", "t", t).gaussian(mean, std)


def uniform(low: float, high: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place from U[low, high); returns ``t``."""
    return check_tensor("uniform", "t", t).uniform(low, high)


def _scaled_line_update(op: str, alpha: float, v: Tensor, beta: float, M: Tensor,
                        axis: int) -> Tensor:
    line = as_line(op, M, v, axis)
    M.array = (alpha * line + beta * M.array).astype(M.dtype)
    return M


def add_column(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """In place, for each column m of the 2-d ``M``: ``m = alpha * v + beta * m``; returns M."""
    return _scaled_line_update("add_column", alpha, v, beta, M, 0)


def add_row(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """In place, for each row m of the 2-d ``M``: ``m = alpha * v + beta * m``; returns M."""
    return _scaled_line_update("add_row", alpha, v, beta, M, 1)


def _sum_keepdims(op: str, M: Tensor, axis: int) -> Tensor:
    if check_tensor(op, "M", M).ndim() != 2:
        raise ValueError(f"{op}: expects a 2-d tensor, got shape {M.shape}")
    return M._new(jnp.sum(M.array, axis=axis, keepdims=True))


def sum_columns(M: Tensor) -> Tensor:
    """Sum of the columns of the 2-d ``M``: a column of shape (rows, 1)."""
    return _sum_keepdims("sum_columns", M, 1)


def sum_rows(M: Tensor) -> Tensor:
    """Sum of the rows of the 2-d ``M``: a row of shape (1, columns)."""
    return _sum_keepdims("sum_rows", M, 0)
