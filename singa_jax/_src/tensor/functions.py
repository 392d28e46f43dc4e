"""SINGA's module-level tensor functions: creation and conversion, shape, math, random fills and
the deprecated row/column functions. Plain computation on Tensors (no autograd graph)."""
from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.runtime.ctensor import CTensor
from singa_jax._src.base.dtypes import float32, to_dtype
from singa_jax._src.runtime.mesh import host_value
from singa_jax._src.runtime.device import Device, device_of, get_default_device
from singa_jax._src.tensor.tensor import ShapeLike, Tensor, as_shape, filled
from singa_jax._src.tensor.operands import (binary, broadcast_shapes, check_tensor, as_line, result,
                                            same_device, shape_errors, to_scalar)


def from_raw_tensor(t: Any) -> Tensor:
    """A Tensor over the CTensor or array ``t`` (SINGA wraps a CTensor)."""
    arr = t._array if isinstance(t, CTensor) else t
    return Tensor(data=arr, device=device_of(arr))


def from_raw_tensors(tt) -> List[Tensor]:
    return [from_raw_tensor(t) for t in tt]


def _call_singa_func(_singa_func: Callable, *args: Any) -> Tensor:
    """``_singa_func(*args)`` (a ``singa_wrap`` function returning a CTensor) as a Tensor: SINGA's
    private helper, which its own tests call."""
    return from_raw_tensor(_singa_func(*args))


def from_numpy(np_array: np.ndarray, dev: Optional[Device] = None) -> Tensor:
    """A Tensor holding a copy of ``np_array`` (float64 becomes float32 and int64 int32, as in
    SINGA)."""
    a = np.asarray(np_array)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    elif a.dtype == np.int64:
        a = a.astype(np.int32)
    elif a.dtype.kind not in "biuf":
        raise TypeError(f"from_numpy: cannot make a tensor from a NumPy array of dtype {a.dtype}")
    return Tensor(data=a, device=dev, dtype=a.dtype)


def tensor(data: Any, dtype: Any = None, device: Optional[Device] = None,
           requires_grad: bool = False) -> Tensor:
    """PyTorch's ``torch.tensor``: a new leaf holding ``data`` (a Python number, nested list,
    NumPy or JAX array, or Tensor). Python floats and float64 give float32, Python ints and int64
    int32 (as in SINGA) unless ``dtype`` says otherwise. ``requires_grad=True`` makes it a
    PyTorch-style leaf whose gradient ``backward`` stores in ``.grad`` (see
    :meth:`Tensor.requires_grad_`); otherwise it needs no gradient."""
    if isinstance(data, Tensor):
        arr = data.array
    elif isinstance(data, jax.Array):
        arr = data
    else:
        arr = np.asarray(data)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"tensor: cannot make a tensor from {type(data).__name__} data of "
                            f"dtype {arr.dtype}; expected numbers")
        if dtype is None and arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        elif dtype is None and arr.dtype == np.int64:
            arr = arr.astype(np.int32)
    if dtype is not None:
        arr = arr.astype(to_dtype(dtype))
    t = Tensor(data=arr, device=device, dtype=arr.dtype, requires_grad=False)
    return t.requires_grad_() if requires_grad else t


def from_jax(array: jax.Array) -> Tensor:
    """A Tensor over the ``jax.Array`` ``array``, without a copy (on the array's device; an array
    sharded over several devices is placed on the default device). ``Tensor.to_jax()`` is the
    way back."""
    if not isinstance(array, (jax.Array, jax.core.Tracer)):
        raise TypeError(f"from_jax: expected a jax.Array, got {type(array).__name__}")
    return Tensor(data=array, device=device_of(array), dtype=array.dtype)


def from_dlpack(x: Any) -> Tensor:
    """A Tensor over a DLPack-exporting array (NumPy, PyTorch, CuPy, JAX...), without a copy
    where the producer's device and layout allow it."""
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ (a NumPy, PyTorch, "
                        f"CuPy or JAX array), got {type(x).__name__}")
    return from_jax(jax.dlpack.from_dlpack(x))


def to_numpy(t: Tensor) -> np.ndarray:
    """A (writable) NumPy copy of ``t``'s value."""
    a = check_tensor("to_numpy", "t", t).array
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and \
            not a.is_fully_addressable:  # DistOpt's state sharded over several processes
        return host_value(a)
    return np.array(a)


def to_host(t: Tensor) -> Tensor:
    """A copy of ``t`` on the host (CPU) device."""
    return t.clone().to_host()


def copy_from_numpy(data: Tensor, np_array: np.ndarray) -> None:
    """Copy ``np_array`` into the tensor ``data`` (SINGA passes its C++ tensor)."""
    check_tensor("copy_from_numpy", "data", data).copy_from_numpy(np_array)


def _constant(shape: ShapeLike, value: float, device: Optional[Device]) -> Tensor:
    device = get_default_device() if device is None else device
    return Tensor(data=filled(as_shape(shape), value, float32, device), device=device)


def zeros(shape: ShapeLike, device: Optional[Device] = None) -> Tensor:
    """A float32 tensor of zeros (on the default device if ``device`` is None)."""
    return _constant(shape, 0.0, device)


def ones(shape: ShapeLike, device: Optional[Device] = None) -> Tensor:
    """A float32 tensor of ones."""
    return _constant(shape, 1.0, device)


def random(shape: ShapeLike, device: Optional[Device] = None) -> Tensor:
    """A float32 tensor drawn from U[0, 1) with the device's key."""
    return _constant(shape, 0.0, device).uniform(0.0, 1.0)


def zeros_like(t: Tensor) -> Tensor:
    """Zeros with ``t``'s shape, dtype and device."""
    return t.set_value(0, inplace=False)


def ones_like(t: Tensor) -> Tensor:
    """Ones with ``t``'s shape, dtype and device."""
    return t.set_value(1, inplace=False)


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
