"""SINGA's ``tensor`` module on JAX.

A :class:`Tensor` is a mutable handle over an immutable ``jax.Array`` (``Tensor.array``; SINGA's
``Tensor.data`` is a CTensor over it). In-place operations rebind the handle to a new array.
Besides its value, a Tensor carries SINGA's three autograd attributes: ``creator`` (the operator
that produced it), ``requires_grad`` and ``stores_grad``.

Arithmetic on Tensors here is plain computation (as in SINGA): it does not record the autograd
graph; the functions of :mod:`singa_jax.autograd` do. The exception is PyTorch-style code: the
operators ``+ - * / ** @`` and unary ``-`` record when an operand is tracked (a leaf made by
``requires_grad_()`` or ``tensor(..., requires_grad=True)``, or a result of one).

This module has every public name SINGA's ``tensor`` has. See ``docs/tensors.md`` for the
mapping onto JAX and the differences from SINGA.
"""
from singa_jax._src.tensor.tensor import (
    Tensor as Tensor, PlaceHolder as PlaceHolder, SharedTensor as SharedTensor,
    InvalidIndex as InvalidIndex)
from singa_jax._src.runtime.ctensor import CTensor as CTensor
from singa_jax._src.base.modes import TraceHook as TraceHook
from singa_jax._src.base.dtypes import (
    float16 as float16, float32 as float32, float64 as float64, bfloat16 as bfloat16, int8 as int8,
    int16 as int16, int32 as int32, int64 as int64, uint8 as uint8, bool_ as bool_,
    to_dtype as to_dtype, singa_dtype_code as singa_dtype_code, sizeof as sizeof)
from singa_jax._src.tensor.creation import (
    from_raw_tensor, from_raw_tensors, from_numpy, tensor, from_jax, from_dlpack, to_numpy, to_host,
    copy_from_numpy, zeros, ones, random, zeros_like, ones_like)
from singa_jax._src.tensor.math import (
    product, contiguous, reshape, transpose, repeat, sum, average, softmax, pow, add, sub,
    eltwise_mult, div, lt, le, gt, ge, eq, abs, exp, ceil, log, sigmoid, sign, sqrt, square, tanh,
    einsum, tensordot, concatenate, axpy, bernoulli, gaussian, uniform, add_column, add_row,
    sum_columns, sum_rows)
from singa_jax._src.tensor.operands import copy_data_to_from as copy_data_to_from, mult as mult
from singa_jax._src.runtime.device import get_default_device as get_default_device
# SINGA's private helper, which its own tests call
from singa_jax._src.tensor.creation import _call_singa_func as _call_singa_func  # noqa: F401
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Tensor", "PlaceHolder", "SharedTensor", "CTensor", "InvalidIndex", "TraceHook",
    "float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "bool_", "to_dtype", "singa_dtype_code", "sizeof", "from_raw_tensor", "from_raw_tensors",
    "from_numpy", "tensor", "from_jax", "from_dlpack", "to_numpy", "to_host",
    "copy_from_numpy", "copy_data_to_from", "zeros", "ones", "random", "zeros_like",
    "ones_like", "product", "contiguous", "reshape", "transpose", "repeat", "sum", "average",
    "softmax", "pow", "add", "sub", "eltwise_mult", "div", "lt", "le", "gt", "ge", "eq",
    "abs", "exp", "ceil", "log", "sigmoid", "sign", "sqrt", "square", "tanh", "mult",
    "einsum", "tensordot", "concatenate", "axpy", "bernoulli", "gaussian", "uniform",
    "add_column", "add_row", "sum_columns", "sum_rows", "get_default_device"]

_publish(__name__, __all__)
