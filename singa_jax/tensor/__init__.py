"""SINGA's ``tensor`` module on JAX.

A :class:`Tensor` is a mutable handle over an immutable ``jax.Array`` (``Tensor.array``; SINGA's
``Tensor.data`` is a CTensor over it). In-place operations rebind the handle to a new array.
Besides its value, a Tensor carries SINGA's three autograd attributes: ``creator`` (the operator
that produced it), ``requires_grad`` and ``stores_grad``.

Arithmetic on Tensors here is plain computation (as in SINGA): it does not record the autograd
graph; the functions of :mod:`singa_jax.autograd` do. The exception is PyTorch-style code: the
operators ``+ - * / ** @`` and unary ``-`` record when an operand is tracked (a leaf made by
``requires_grad_()`` or ``tensor(..., requires_grad=True)``, or a result of one); see
:mod:`singa_jax.autograd.torch_style`.

Layout: :mod:`.handle` holds the Tensor class, :mod:`.operands` the arithmetic behind its
operators (and SINGA's ``mult``, ``copy_data_to_from``), :mod:`.functions` SINGA's module
functions; the dtype constants live in :mod:`singa_jax.dtypes`, the random sampling in :mod:`singa_jax.sampling`
and the creator bookkeeping (``Dummy``) in :mod:`singa_jax.creator`. This module re-exports every
public name SINGA's ``tensor`` has. See ``docs/tensors.md`` for the mapping onto JAX and the
differences from SINGA.
"""
from ..ctensor import CTensor
from ..device import get_default_device  # noqa: F401 (SINGA's tensor module imports it too)
from ..dtypes import (bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64,
                      singa_dtype_code, sizeof, to_dtype, uint8)
from ..modes import TraceHook
from .handle import InvalidIndex, PlaceHolder, SharedTensor, Tensor
from .operands import copy_data_to_from, mult
from .functions import _call_singa_func  # noqa: F401 (SINGA's private helper, used by its tests)
from .functions import (
    from_raw_tensor, from_raw_tensors, from_numpy, tensor, from_jax, from_dlpack, to_numpy,
    to_host, copy_from_numpy, zeros, ones, random, zeros_like, ones_like, product, contiguous,
    reshape, transpose, repeat, sum, average, softmax, pow, add, sub, eltwise_mult, div, lt, le,
    gt, ge, eq, abs, exp, ceil, log, sigmoid, sign, sqrt, square, tanh, einsum, tensordot,
    concatenate, axpy, bernoulli, gaussian, uniform, add_column, add_row, sum_columns, sum_rows)

__all__ = [
    # the handle, its aliases and graph mode's hook
    "Tensor", "PlaceHolder", "SharedTensor", "CTensor", "InvalidIndex", "TraceHook",
    # dtypes (from singa_jax.dtypes)
    "float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "bool_", "to_dtype", "singa_dtype_code", "sizeof",
    # creation and conversion
    "from_raw_tensor", "from_raw_tensors", "from_numpy", "tensor", "from_jax", "from_dlpack",
    "to_numpy", "to_host", "copy_from_numpy",
    "copy_data_to_from", "zeros", "ones", "random", "zeros_like", "ones_like", "product",
    # shape
    "contiguous", "reshape", "transpose", "repeat",
    # math
    "sum", "average", "softmax", "pow", "add", "sub", "eltwise_mult", "div", "lt", "le", "gt",
    "ge", "eq", "abs", "exp", "ceil", "log", "sigmoid", "sign", "sqrt", "square", "tanh", "mult",
    "einsum", "tensordot", "concatenate", "axpy",
    # random fills
    "bernoulli", "gaussian", "uniform",
    # SINGA's deprecated row/column functions
    "add_column", "add_row", "sum_columns", "sum_rows",
]
