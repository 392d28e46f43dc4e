"""SINGA's C++ tensor functions (``core_tensor.i``) as SWIG exposes them, on JAX.

Each function takes CTensors or plain ``jax.Array``s and returns a new CTensor, or, for SINGA's
``void f(..., Tensor *out)`` forms, writes into its CTensor output argument (shape and dtype of
the output are kept, as C++ writes into existing memory). Composite functions are one cached
``jax.jit`` kernel each (static arguments such as ``axis`` are part of the cache key), so no call
recompiles once a shape has been seen; single elementwise ops are one ``jnp`` dispatch.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence, Tuple

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

from singa_jax._src.runtime.ctensor import (CTensor, binary_op, comparison, describe, shape_arg,
                                            as_array, out_tensor, store)
from singa_jax._src.runtime.device import device_of

__all__ = [
    # elementwise unary
    "Abs", "Ceil", "Floor", "Round", "RoundE", "Exp", "Erf", "Log", "ReLU", "Sigmoid", "Sign",
    "Sqrt", "Square", "Cos", "Cosh", "Acos", "Acosh", "Sin", "Sinh", "Asin", "Asinh", "Tan",
    "Tanh", "Atan", "Atanh", "ReLUBackward",
    # arithmetic and comparisons
    "__add__", "__sub__", "__mul__", "__div__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__",
    "Add", "Sub", "EltwiseMult", "Div", "AddFloat", "SubFloat", "MultFloat", "DivFloat",
    "AddFloatWithRet", "SubFloatWithRet", "EltwiseMultFloatWithRet", "DivFloatWithRet",
    "LTFloat", "LEFloat", "GTFloat", "GEFloat", "EQFloat", "Pow", "PowWithRet", "PowFloat",
    "PowFloatWithRet",
    # reductions, softmax and losses
    "Sum", "SumAsFloat", "SumAll", "Average", "SoftMax", "SoftMaxBackward", "CrossEntropyFwd",
    "SoftmaxCrossEntropyBwd",
    # shape
    "Reshape", "Contiguous", "Transpose", "DefaultTranspose", "ConcatOn", "SliceOn",
    "CopyDataToFrom",
    # random
    "Bernoulli", "Gaussian", "Uniform",
    # BLAS and matrix (row/column) operations
    "Axpy", "Mult", "MultWithRet", "MultWithScale", "AddColumn", "AddColumnWithScale", "AddRow",
    "AddRowWithScale", "SubColumn", "SubRow", "MultColumn", "MultRow", "DivColumn", "DivRow",
    "SumColumns", "SumRows",
]

CTensorLike = Any  # a CTensor or a jax.Array


def _unary(op: str, fn, t: CTensorLike) -> CTensor:
    return CTensor.from_array(fn(as_array(t, op)))


def _maybe_store(op: str, result: CTensor, ret: Any) -> CTensor:
    """The ``void f(..., Tensor *ret)`` form when ``ret`` is given, else the result."""
    return result if ret is None else store(op, out_tensor(ret, op), result._array)


# ================================================================================================
# Elementwise unary functions
# ================================================================================================
@jax.jit
def _round_half_away(x):
    """std::round: halves go away from zero (jnp.round rounds them to even)."""
    return jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)


def Abs(t: CTensorLike) -> CTensor:
    return _unary("Abs", jnp.abs, t)


def Ceil(t: CTensorLike) -> CTensor:
    return _unary("Ceil", jnp.ceil, t)


def Floor(t: CTensorLike) -> CTensor:
    return _unary("Floor", jnp.floor, t)


def Round(t: CTensorLike) -> CTensor:
    """Round half away from zero (C's ``round``)."""
    return _unary("Round", _round_half_away, t)


def RoundE(t: CTensorLike) -> CTensor:
    """Round half to even (SINGA's ``RoundE``, ONNX's Round)."""
    return _unary("RoundE", jnp.round, t)


def Exp(t: CTensorLike) -> CTensor:
    return _unary("Exp", jnp.exp, t)


def Erf(t: CTensorLike) -> CTensor:
    return _unary("Erf", jsp.erf, t)


def Log(t: CTensorLike) -> CTensor:
    return _unary("Log", jnp.log, t)


def ReLU(t: CTensorLike) -> CTensor:
    return _unary("ReLU", jax.nn.relu, t)


def Sigmoid(t: CTensorLike) -> CTensor:
    return _unary("Sigmoid", jax.nn.sigmoid, t)


def Sign(t: CTensorLike) -> CTensor:
    return _unary("Sign", jnp.sign, t)


def Sqrt(t: CTensorLike) -> CTensor:
    return _unary("Sqrt", jnp.sqrt, t)


def Square(t: CTensorLike) -> CTensor:
    return _unary("Square", jnp.square, t)


def Cos(t: CTensorLike) -> CTensor:
    return _unary("Cos", jnp.cos, t)


def Cosh(t: CTensorLike) -> CTensor:
    return _unary("Cosh", jnp.cosh, t)


def Acos(t: CTensorLike) -> CTensor:
    return _unary("Acos", jnp.arccos, t)


def Acosh(t: CTensorLike) -> CTensor:
    return _unary("Acosh", jnp.arccosh, t)


def Sin(t: CTensorLike) -> CTensor:
    return _unary("Sin", jnp.sin, t)


def Sinh(t: CTensorLike) -> CTensor:
    return _unary("Sinh", jnp.sinh, t)


def Asin(t: CTensorLike) -> CTensor:
    return _unary("Asin", jnp.arcsin, t)


def Asinh(t: CTensorLike) -> CTensor:
    return _unary("Asinh", jnp.arcsinh, t)


def Tan(t: CTensorLike) -> CTensor:
    return _unary("Tan", jnp.tan, t)


def Tanh(t: CTensorLike) -> CTensor:
    return _unary("Tanh", jnp.tanh, t)


def Atan(t: CTensorLike) -> CTensor:
    return _unary("Atan", jnp.arctan, t)


def Atanh(t: CTensorLike) -> CTensor:
    return _unary("Atanh", jnp.arctanh, t)


@jax.jit
def _relu_backward(dy, x):
    return jnp.where(x > 0, dy, jnp.zeros((), dy.dtype))


def ReLUBackward(in1: CTensorLike, in2: CTensorLike) -> CTensor:
    """``in1 * (in2 > 0)``: SINGA passes (dy, x)."""
    return binary_op("ReLUBackward", _relu_backward, in1, in2)


# ================================================================================================
# Arithmetic and comparisons
# ================================================================================================
def __add__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__add__", jnp.add, lhs, rhs)


def __sub__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__sub__", jnp.subtract, lhs, rhs)


def __mul__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__mul__", jnp.multiply, lhs, rhs)


@jax.jit
def _divide(a, b):
    """a / b, correctly rounded as SINGA's C++ division is. XLA rewrites ``x / broadcast(y)`` as
    ``x * broadcast(1 / y)``, an ulp off; behind the barrier the broadcast operand is opaque."""
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    a, b = lax.optimization_barrier((jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)))
    return a / b


def __div__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__div__", _divide, lhs, rhs)


def __lt__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__lt__", comparison(jnp.less), lhs, rhs)


def __le__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__le__", comparison(jnp.less_equal), lhs, rhs)


def __gt__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__gt__", comparison(jnp.greater), lhs, rhs)


def __ge__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__ge__", comparison(jnp.greater_equal), lhs, rhs)


def __eq__(lhs: CTensorLike, rhs: CTensorLike) -> CTensor:
    return binary_op("__eq__", comparison(jnp.equal), lhs, rhs)


def Add(lhs: CTensorLike, rhs: CTensorLike, ret: Any = None) -> CTensor:
    """``lhs + rhs``, written into ``ret`` when given (SINGA's ``void Add(lhs, rhs, ret)``)."""
    return _maybe_store("Add", binary_op("Add", jnp.add, lhs, rhs), ret)


def Sub(lhs: CTensorLike, rhs: CTensorLike, ret: Any = None) -> CTensor:
    return _maybe_store("Sub", binary_op("Sub", jnp.subtract, lhs, rhs), ret)


def EltwiseMult(lhs: CTensorLike, rhs: CTensorLike, ret: Any = None) -> CTensor:
    return _maybe_store("EltwiseMult", binary_op("EltwiseMult", jnp.multiply, lhs, rhs), ret)


def Div(lhs: CTensorLike, rhs: CTensorLike, ret: Any = None) -> CTensor:
    return _maybe_store("Div", binary_op("Div", _divide, lhs, rhs), ret)


def AddFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("AddFloat", jnp.add, t, float(x))


def SubFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("SubFloat", jnp.subtract, t, float(x))


def MultFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("MultFloat", jnp.multiply, t, float(x))


def DivFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("DivFloat", _divide, t, float(x))


def AddFloatWithRet(t: CTensorLike, x: float, ret: CTensor) -> CTensor:
    return _maybe_store("AddFloatWithRet", AddFloat(t, x), ret)


def SubFloatWithRet(t: CTensorLike, x: float, ret: CTensor) -> CTensor:
    return _maybe_store("SubFloatWithRet", SubFloat(t, x), ret)


def EltwiseMultFloatWithRet(t: CTensorLike, x: float, ret: CTensor) -> CTensor:
    return _maybe_store("EltwiseMultFloatWithRet", MultFloat(t, x), ret)


def DivFloatWithRet(t: CTensorLike, x: float, ret: CTensor) -> CTensor:
    return _maybe_store("DivFloatWithRet", DivFloat(t, x), ret)


def LTFloat(t: CTensorLike, x: float) -> CTensor:
    """1 where ``t < x`` else 0, in t's (float) dtype."""
    return binary_op("LTFloat", comparison(jnp.less), t, float(x))


def LEFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("LEFloat", comparison(jnp.less_equal), t, float(x))


def GTFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("GTFloat", comparison(jnp.greater), t, float(x))


def GEFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("GEFloat", comparison(jnp.greater_equal), t, float(x))


def EQFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("EQFloat", comparison(jnp.equal), t, float(x))


def Pow(base: CTensorLike, exp: CTensorLike) -> CTensor:
    return binary_op("Pow", jnp.power, base, exp)


def PowWithRet(base: CTensorLike, exp: CTensorLike, out: CTensor) -> CTensor:
    return _maybe_store("PowWithRet", Pow(base, exp), out)


def PowFloat(t: CTensorLike, x: float) -> CTensor:
    return binary_op("PowFloat", jnp.power, t, float(x))


def PowFloatWithRet(t: CTensorLike, x: float, out: CTensor) -> CTensor:
    return _maybe_store("PowFloatWithRet", PowFloat(t, x), out)


# ================================================================================================
# Reductions, softmax, losses
# ================================================================================================
def _axis(axis: int, ndim: int, op: str) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{op}: axis {axis} is out of range for a {ndim}-D tensor")
    return axis % max(ndim, 1)


@partial(jax.jit, static_argnums=1)
def _sum_axis(a, axis: int):
    return jnp.sum(a, axis=axis)


def Sum(t: CTensorLike, axis: int) -> CTensor:
    """Sum over ``axis`` (SINGA: 0 sums the rows of a matrix, 1 its columns)."""
    a = as_array(t, "Sum")
    return CTensor.from_array(_sum_axis(a, _axis(int(axis), a.ndim, "Sum")))


def SumAsFloat(t: CTensorLike) -> float:
    """The sum of all elements as a Python float (SINGA's ``Sum<float>``)."""
    return float(jnp.sum(as_array(t, "SumAsFloat")))


@jax.jit
def _sum_all(a):
    return jnp.sum(a).reshape(1)


def SumAll(t: CTensorLike) -> CTensor:
    """The sum of all elements as a CTensor of shape (1,)."""
    return _unary("SumAll", _sum_all, t)


def Average(t: CTensorLike, axis: int) -> CTensor:
    a = as_array(t, "Average")
    axis = _axis(int(axis), a.ndim, "Average")
    return CTensor.from_array(_sum_axis(a, axis) / a.shape[axis])


@partial(jax.jit, static_argnums=1)
def _softmax_kernel(a, axis: int):
    """Softmax over the trailing axes from ``axis`` on, flattened (SINGA's coerced 2-D form,
    ONNX opset < 13)."""
    rows = int(np.prod(a.shape[:axis], dtype=np.int64))
    flat = a.reshape(rows, -1)
    return jax.nn.softmax(flat, axis=1).reshape(a.shape)


@partial(jax.jit, static_argnums=1)
def _softmax_backward_kernel(dy, axis: int, y):
    rows = int(np.prod(y.shape[:axis], dtype=np.int64))
    d, s = dy.reshape(rows, -1), y.reshape(rows, -1)
    return (s * (d - jnp.sum(d * s, axis=1, keepdims=True))).reshape(y.shape)


def SoftMax(t: CTensorLike, out_or_axis: Any = None, axis: Any = None) -> CTensor:
    """SINGA's overloads ``SoftMax(in)``, ``SoftMax(in, axis)``, ``SoftMax(in, out)`` and
    ``SoftMax(in, out, axis)``: softmax over the axes from ``axis`` on (default 1, i.e. the rows
    of a matrix), written into ``out`` when given."""
    out = None
    if isinstance(out_or_axis, (int, np.integer)) and not isinstance(out_or_axis, bool):
        axis = int(out_or_axis)
    elif out_or_axis is not None:
        out = out_or_axis
    a = as_array(t, "SoftMax")
    axis = _axis(1 if axis is None and a.ndim > 1 else int(axis or 0), a.ndim, "SoftMax")
    return _maybe_store("SoftMax", CTensor.from_array(_softmax_kernel(a, axis)), out)


def SoftMaxBackward(t: CTensorLike, axis: int, fdout: CTensorLike) -> CTensor:
    """Gradient of softmax: SINGA passes ``(dy, axis, y)`` with ``y`` the softmax output;
    returns ``y * (dy - sum(dy * y))`` over the axes from ``axis`` on."""
    dy, y = as_array(t, "SoftMaxBackward"), as_array(fdout, "SoftMaxBackward")
    if dy.shape != y.shape:
        raise ValueError(f"SoftMaxBackward: dy of shape {tuple(dy.shape)} and the softmax output "
                         f"of shape {tuple(y.shape)} differ")
    return CTensor.from_array(_softmax_backward_kernel(dy, _axis(int(axis), y.ndim,
                                                                 "SoftMaxBackward"), y))


def _target_rows(p, t, op: str):
    """SINGA's two target forms: one int label per row, or a (soft) target per class, each row
    normalised by its sum."""
    batch = p.shape[0] if p.ndim == 2 else 1
    if p.ndim > 2 or t.ndim > 2:
        raise ValueError(f"{op}: p and t must be at most 2-D, got {tuple(p.shape)} and "
                         f"{tuple(t.shape)}")
    if t.size == batch:
        return True, batch
    if t.size != p.size:
        raise ValueError(f"{op}: t of shape {tuple(t.shape)} is neither one label per row nor "
                         f"one target per class of p of shape {tuple(p.shape)}")
    return False, batch


@partial(jax.jit, static_argnums=(2, 3))
def _cross_entropy(p, t, int_target: bool, batch: int):
    p = p.reshape(batch, -1)
    logp = jnp.log(jnp.maximum(p, jnp.finfo(p.dtype).tiny))
    if int_target:
        return -jnp.take_along_axis(logp, t.reshape(batch, 1).astype(jnp.int32), axis=1)[:, 0]
    t = t.reshape(batch, -1).astype(p.dtype)
    return -jnp.sum(t / jnp.sum(t, axis=1, keepdims=True) * logp, axis=1)


@partial(jax.jit, static_argnums=(2, 3))
def _softmax_cross_entropy_bwd(p, t, int_target: bool, batch: int):
    flat = p.reshape(batch, -1)
    if int_target:
        onehot = jax.nn.one_hot(t.reshape(batch).astype(jnp.int32), flat.shape[1],
                                dtype=p.dtype)
    else:
        t = t.reshape(batch, -1).astype(p.dtype)
        onehot = t / jnp.sum(t, axis=1, keepdims=True)
    return (flat - onehot).reshape(p.shape)


def CrossEntropyFwd(p: CTensorLike, t: CTensorLike) -> CTensor:
    """Per-row ``-log p[label]`` (int labels) or ``-sum(t/sum(t) * log p)``; p is clamped at
    the smallest normal float as SINGA's FLT_MIN."""
    pa, ta = as_array(p, "CrossEntropyFwd"), as_array(t, "CrossEntropyFwd")
    int_target, batch = _target_rows(pa, ta, "CrossEntropyFwd")
    return CTensor.from_array(_cross_entropy(pa, ta, int_target, batch))


def SoftmaxCrossEntropyBwd(p: CTensorLike, t: CTensorLike) -> CTensor:
    """Gradient of cross-entropy through softmax w.r.t. the logits: ``p - onehot(t)``."""
    pa, ta = as_array(p, "SoftmaxCrossEntropyBwd"), as_array(t, "SoftmaxCrossEntropyBwd")
    int_target, batch = _target_rows(pa, ta, "SoftmaxCrossEntropyBwd")
    return CTensor.from_array(_softmax_cross_entropy_bwd(pa, ta, int_target, batch))


# ================================================================================================
# Shape functions
# ================================================================================================
def Reshape(t: CTensorLike, shape: Sequence[int]) -> CTensor:
    a = as_array(t, "Reshape")
    new = shape_arg(shape, "Reshape")
    if int(np.prod(new, dtype=np.int64)) != a.size:
        raise ValueError(f"Reshape: cannot reshape {describe(t)} ({a.size} elements) to {new}")
    return CTensor.from_array(a.reshape(new))


def Contiguous(t: CTensorLike) -> CTensor:
    """A copy in row-major layout (every array here already is)."""
    return CTensor.from_array(as_array(t, "Contiguous"))


def Transpose(t: CTensorLike, axes: Sequence[int]) -> CTensor:
    a = as_array(t, "Transpose")
    axes = tuple(int(i) for i in axes)
    if sorted(axes) != list(range(a.ndim)):
        raise ValueError(f"Transpose: axes {axes} are not a permutation of the {a.ndim} axes of "
                         f"{describe(t)}")
    return CTensor.from_array(jnp.transpose(a, axes))


def DefaultTranspose(t: CTensorLike) -> CTensor:
    """All axes reversed (C++ ``Transpose(in)``)."""
    return CTensor.from_array(jnp.transpose(as_array(t, "DefaultTranspose")))


def ConcatOn(tensors: Sequence[CTensorLike], axis: int) -> CTensor:
    arrays = [as_array(t, "ConcatOn") for t in tensors]
    if not arrays:
        raise ValueError("ConcatOn: no tensors to concatenate")
    try:
        return CTensor.from_array(jnp.concatenate(arrays, axis=int(axis)))
    except (TypeError, ValueError) as e:
        shapes = [tuple(a.shape) for a in arrays]
        raise ValueError(f"ConcatOn: cannot concatenate shapes {shapes} on axis {axis}: "
                         f"{e}") from None


def SliceOn(t: CTensorLike, start: int, end: int, axis: int) -> CTensor:
    """Elements ``start:end`` along ``axis``."""
    a = as_array(t, "SliceOn")
    axis = _axis(int(axis), a.ndim, "SliceOn")
    if not 0 <= int(start) <= int(end) <= a.shape[axis]:
        raise ValueError(f"SliceOn: range [{start}, {end}) is outside axis {axis} of size "
                         f"{a.shape[axis]}")
    return CTensor.from_array(lax.slice_in_dim(a, int(start), int(end), axis=axis))


@partial(jax.jit, static_argnums=(2, 3, 4))
def _copy_flat(dst, src, num: int, dst_offset: int, src_offset: int):
    values = lax.slice(src.reshape(-1), (src_offset,), (src_offset + num,))
    flat = lax.dynamic_update_slice(dst.reshape(-1), values.astype(dst.dtype), (dst_offset,))
    return flat.reshape(dst.shape)


def CopyDataToFrom(dst: CTensor, src: CTensorLike, num: int, dst_offset: int = 0,
                   src_offset: int = 0) -> None:
    """Copy ``num`` elements of ``src`` (from ``src_offset``) into ``dst`` (at ``dst_offset``),
    both taken flat in row-major order; ``dst`` may be on another device."""
    out = out_tensor(dst, "CopyDataToFrom")
    s = as_array(src, "CopyDataToFrom")
    num, dst_offset, src_offset = int(num), int(dst_offset), int(src_offset)
    if min(num, dst_offset, src_offset) < 0 or src_offset + num > s.size or \
            dst_offset + num > out._array.size:
        raise ValueError(f"CopyDataToFrom: {num} elements from offset {src_offset} of "
                         f"{describe(src)} to offset {dst_offset} of {describe(dst)} are out "
                         f"of range")
    s = device_of(out._array).put(s) if not isinstance(s, jax.core.Tracer) else s
    out._array = _copy_flat(out._array, s, num, dst_offset, src_offset)


# ================================================================================================
# Random fills (drawn from the output device's PRNG key)
# ================================================================================================
@partial(jax.jit, static_argnums=(2, 3))
def _bernoulli(key, p, shape: Tuple[int, ...], dtype):
    return jax.random.bernoulli(key, p, shape).astype(dtype)


@partial(jax.jit, static_argnums=(3, 4))
def _gaussian(key, mean, std, shape: Tuple[int, ...], dtype):
    return (mean + std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


@partial(jax.jit, static_argnums=(3, 4))
def _uniform(key, low, high, shape: Tuple[int, ...], dtype):
    return jax.random.uniform(key, shape, jnp.float32, low, high).astype(dtype)


def _random_fill(op: str, out: Any, draw, *params: float) -> None:
    t = out_tensor(out, op)
    key = t.device().next_key()
    t._array = draw(key, *params, tuple(t._array.shape), t._array.dtype)


def Bernoulli(p: float, out: CTensor) -> None:
    """Fill ``out`` with 1 (probability ``p``) or 0."""
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"Bernoulli: p must be in [0, 1], got {p}")
    _random_fill("Bernoulli", out, _bernoulli, float(p))


def Gaussian(mean: float, std: float, out: CTensor) -> None:
    if float(std) < 0:
        raise ValueError(f"Gaussian: std must be >= 0, got {std}")
    _random_fill("Gaussian", out, _gaussian, float(mean), float(std))


def Uniform(low: float, high: float, out: CTensor) -> None:
    if float(low) > float(high):
        raise ValueError(f"Uniform: low {low} is above high {high}")
    _random_fill("Uniform", out, _uniform, float(low), float(high))


# ================================================================================================
# BLAS and matrix operations
# ================================================================================================
@jax.jit
def _axpy(alpha, x, y):
    return (alpha * x + y).astype(y.dtype)


def Axpy(alpha: Any, x: CTensorLike, y: CTensor) -> None:
    """``y += alpha * x`` in place; ``alpha`` is a number or a one-element CTensor."""
    out = out_tensor(y, "Axpy")
    a = alpha if isinstance(alpha, (int, float, np.number)) else \
        as_array(alpha, "Axpy").reshape(())
    xa = as_array(x, "Axpy")
    if xa.size != out._array.size:
        raise ValueError(f"Axpy: x {describe(x)} and y {describe(y)} differ in size")
    store("Axpy", out, _axpy(a, xa.reshape(out._array.shape), out._array))


@jax.jit
def _gemm(alpha, a, b, beta, c):
    return alpha * jnp.matmul(a, b) + beta * c


def _matmul(op: str, A: CTensorLike, B: CTensorLike) -> jax.Array:
    a, b = as_array(A, op), as_array(B, op)
    try:
        return jnp.matmul(a, b)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{op}: cannot multiply {describe(A)} by {describe(B)}: {e}") from None


def Mult(*args: Any) -> CTensor:
    """SINGA's overloads: ``Mult(A, B)`` (matrix product, batched for 3-D/4-D), ``Mult(A, B, C)``
    (into C) and the GEMM form ``Mult(alpha, A, B, beta, C)``: C = alpha A B + beta C."""
    if len(args) == 2:
        return CTensor.from_array(_matmul("Mult", *args))
    if len(args) == 3:
        return MultWithRet(*args)
    if len(args) == 5:
        return MultWithScale(*args)
    raise TypeError(f"Mult: expected (A, B), (A, B, C) or (alpha, A, B, beta, C), got "
                    f"{len(args)} arguments")


def MultWithRet(A: CTensorLike, B: CTensorLike, C: CTensor) -> CTensor:
    return store("Mult", out_tensor(C, "Mult"), _matmul("Mult", A, B))


def MultWithScale(alpha: float, A: CTensorLike, B: CTensorLike, beta: float,
                  C: CTensor) -> CTensor:
    out = out_tensor(C, "Mult")
    ab = _matmul("Mult", A, B)
    if ab.size != out._array.size:
        raise ValueError(f"Mult: A B of shape {tuple(ab.shape)} does not fit C {describe(C)}")
    return store("Mult", out, _gemm(float(alpha), as_array(A), as_array(B), float(beta),
                                    out._array.reshape(ab.shape)))


@partial(jax.jit, static_argnums=(0, 1))
def _line_kernel(kind: str, axis: int, alpha, beta, v, m):
    """Combine matrix ``m`` with vector ``v`` broadcast along its rows (axis 1: v has one
    value per column) or columns (axis 0: one value per row)."""
    v = v.reshape((1, -1) if axis == 1 else (-1, 1)).astype(m.dtype)
    if kind == "add":
        return alpha * v + beta * m
    if kind == "mult":
        return m * v
    return m / v


def _line(op: str, kind: str, axis: int, v: CTensorLike, M: CTensor, alpha: float = 1.0,
          beta: float = 1.0) -> None:
    out = out_tensor(M, op)
    m, va = out._array, as_array(v, op)
    if m.ndim != 2:
        raise ValueError(f"{op}: M must be a matrix, got {describe(M)}")
    n = m.shape[1] if axis == 1 else m.shape[0]
    if va.size != n:
        what = "columns" if axis == 1 else "rows"
        raise ValueError(f"{op}: v {describe(v)} must have one value per {what[:-1]} of M "
                         f"{describe(M)} ({n} {what})")
    out._array = _line_kernel(kind, axis, float(alpha), float(beta), va, m).astype(m.dtype)


def AddColumn(*args: Any) -> None:
    """``AddColumn(v, M)``: add v to every column of M; ``AddColumn(alpha, beta, v, M)``:
    M = alpha v + beta M."""
    if len(args) == 4:
        return AddColumnWithScale(*args)
    v, M = args
    _line("AddColumn", "add", 0, v, M)


def AddColumnWithScale(alpha: float, beta: float, v: CTensorLike, M: CTensor) -> None:
    _line("AddColumn", "add", 0, v, M, alpha, beta)


def AddRow(*args: Any) -> None:
    """``AddRow(v, M)``: add v to every row of M; ``AddRow(alpha, beta, v, M)``:
    M = alpha v + beta M."""
    if len(args) == 4:
        return AddRowWithScale(*args)
    v, M = args
    _line("AddRow", "add", 1, v, M)


def AddRowWithScale(alpha: float, beta: float, v: CTensorLike, M: CTensor) -> None:
    _line("AddRow", "add", 1, v, M, alpha, beta)


def SubColumn(v: CTensorLike, M: CTensor) -> None:
    _line("SubColumn", "add", 0, v, M, -1.0, 1.0)


def SubRow(v: CTensorLike, M: CTensor) -> None:
    _line("SubRow", "add", 1, v, M, -1.0, 1.0)


def MultColumn(v: CTensorLike, M: CTensor) -> None:
    _line("MultColumn", "mult", 0, v, M)


def MultRow(v: CTensorLike, M: CTensor) -> None:
    _line("MultRow", "mult", 1, v, M)


def DivColumn(v: CTensorLike, M: CTensor) -> None:
    _line("DivColumn", "div", 0, v, M)


def DivRow(v: CTensorLike, M: CTensor) -> None:
    _line("DivRow", "div", 1, v, M)


def SumColumns(M: CTensorLike, v: CTensor) -> None:
    """``v[i] = sum_j M[i, j]`` (one value per row)."""
    m = as_array(M, "SumColumns")
    if m.ndim != 2:
        raise ValueError(f"SumColumns: M must be a matrix, got {describe(M)}")
    store("SumColumns", out_tensor(v, "SumColumns"), _sum_axis(m, 1))


def SumRows(M: CTensorLike, v: CTensor) -> None:
    """``v[j] = sum_i M[i, j]`` (one value per column)."""
    m = as_array(M, "SumRows")
    if m.ndim != 2:
        raise ValueError(f"SumRows: M must be a matrix, got {describe(M)}")
    store("SumRows", out_tensor(v, "SumRows"), _sum_axis(m, 0))
