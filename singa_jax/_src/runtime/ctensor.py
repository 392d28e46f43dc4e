"""SINGA's C++ ``Tensor`` as its SWIG module shows it to Python: :class:`CTensor`, one mutable
handle over one ``jax.Array``; and :class:`BoundCTensor`, what ``Tensor.data`` returns: a CTensor
whose array IS its Tensor's, so SINGA code that mutates ``t.data`` in place changes ``t``.

This is a core module (it imports only ``device`` and ``dtypes``): ``tensor`` and the autograd
engine use it, and ``singa_wrap`` re-exports it.

SINGA's Python code and its users' operators call methods on ``Tensor.data`` (``shape()``,
``GetFloatValue(n)``, ``CopyData``, ``+=`` ...). A CTensor answers them; every in-place method
rebinds ``_array`` (JAX arrays are immutable), so a CTensor behaves like SINGA's mutable C++
tensor while each value it holds stays a plain ``jax.Array`` that XLA kernels consume.

JAX 0.10 no longer turns ``__jax_array__`` objects into arrays inside ``jnp`` functions or
``jax.jit``; pass ``as_array(x)`` (or ``x._array``) to those. CTensor is registered as a pytree
with its array as the only leaf, so ``jax.jit``/``jax.device_put`` carry CTensors through.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from singa_jax._src.runtime.device import Device, device_of, get_default_device
from singa_jax._src.base.dtypes import (float16, float32, float64, int8, int32, int64, to_dtype,
                                        uint8)

__all__ = ["CTensor", "BoundCTensor", "Tensor", "VecTensor", "as_array", "Shape", "kFloat32", "kFloat16", "kInt", "kChar",
           "kDouble", "kUChar", "kLong", "SizeOf", "Product"]

# SINGA's DataType enum. As in singa_jax.tensor, the constants are NumPy dtypes, so they compare
# equal to ``tensor.float32``, ``Tensor.dtype`` and ``CTensor.data_type()``.
kFloat32, kFloat16, kInt, kChar = float32, float16, int32, int8
kDouble, kUChar, kLong = float64, uint8, int64


def SizeOf(dtype: Any) -> int:
    """Bytes per element of a SINGA dtype."""
    return int(to_dtype(dtype).itemsize)


def Product(shape: Sequence[int], start: int = 0, len: int = 0) -> int:  # noqa: A002 (SINGA's name)
    """Product of ``shape[start:start + len]`` (to the end when ``len`` is 0), as SINGA's."""
    dims = list(shape)[start:] if len == 0 else list(shape)[start:start + len]
    return int(np.prod(dims, dtype=np.int64))


def describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    if isinstance(x, CTensor):
        return f"CTensor{tuple(x._array.shape)} {x._array.dtype}"
    if shape is not None and not callable(shape):
        return f"{type(x).__name__}{tuple(shape)} {getattr(x, 'dtype', '')}"
    return type(x).__name__


def as_array(x: Any, op: str = "singa_wrap") -> jax.Array:
    """The ``jax.Array`` behind ``x``: a CTensor's array, a jax.Array (or tracer) itself, a NumPy
    array or Python number converted. A singa_jax ``Tensor`` is refused with a hint: SINGA's C++
    functions take ``t.data``, not the Python Tensor."""
    if isinstance(x, CTensor):
        return x._array
    if isinstance(x, jax.Array):  # tracers included
        return x
    if isinstance(x, (np.ndarray, np.generic, float, int, bool)):
        return jnp.asarray(x)
    if hasattr(x, "creator") and hasattr(x, "stores_grad"):
        raise TypeError(f"{op}: got a Python Tensor; SINGA's C++ functions take its CTensor "
                        f"(pass t.data)")
    raise TypeError(f"{op}: expected a CTensor or a jax.Array, got {describe(x)}")


def out_tensor(x: Any, op: str) -> "CTensor":
    """``x`` as the output argument of a SINGA function that writes its result in place."""
    if not isinstance(x, CTensor):
        raise TypeError(f"{op}: the output argument must be a CTensor (written in place; a "
                        f"jax.Array is immutable), got {describe(x)}")
    return x


def store(op: str, out: "CTensor", value: jax.Array) -> "CTensor":
    """Write ``value`` into ``out`` as SINGA's C++ does: into out's memory, so out keeps its shape
    (the element counts must match) and its dtype."""
    old = out._array
    if value.shape != old.shape:
        if value.size != old.size:
            raise ValueError(f"{op}: result of shape {tuple(value.shape)} does not fit the output "
                             f"CTensor of shape {tuple(old.shape)}")
        value = value.reshape(old.shape)
    out._array = value if value.dtype == old.dtype else value.astype(old.dtype)
    return out


# --- cached kernels of the methods (one compile per shape/dtype, never per value) -------------
@partial(jax.jit, static_argnums=(1, 2))
def _full(value, shape: Tuple[int, ...], dtype) -> jax.Array:
    return jnp.full(shape, value, dtype)


@jax.jit
def _write_flat(arr: jax.Array, values: jax.Array, offset) -> jax.Array:
    flat = lax.dynamic_update_slice(arr.reshape(-1), values.astype(arr.dtype).reshape(-1),
                                    (offset,))
    return flat.reshape(arr.shape)


@jax.jit
def _copy_into(dst: jax.Array, src: jax.Array) -> jax.Array:
    return src.reshape(dst.shape).astype(dst.dtype)


@jax.jit
def _mean_abs(a: jax.Array) -> jax.Array:
    return jnp.sum(jnp.abs(a.astype(jnp.float32))) / a.size


@jax.jit
def _norm_over_size(a: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(jnp.square(a.astype(jnp.float32)))) / a.size


def _binary_inplace(op: str, fn, self: "CTensor", other: Any) -> "CTensor":
    value = as_array(other, op)
    try:
        result = fn(self._array, value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{op}: cannot combine {describe(self)} with {describe(other)}: "
                         f"{e}") from None
    if result.shape != self._array.shape:
        raise ValueError(f"{op}: in-place result of shape {tuple(result.shape)} differs from "
                         f"the CTensor's shape {tuple(self._array.shape)}")
    self._array = result.astype(self._array.dtype)
    return self


def binary_op(op: str, fn, lhs: Any, rhs: Any) -> "CTensor":
    a, b = as_array(lhs, op), as_array(rhs, op)
    try:
        return CTensor.from_array(fn(a, b))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{op}: cannot combine {describe(lhs)} with {describe(rhs)}: "
                         f"{e}") from None


def shape_arg(shape: Any, op: str) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        return tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"{op}: shape must be a sequence of ints, got {shape!r}") from None


class Shape(tuple):
    """A shape tuple that can also be called as SINGA's ``CTensor.shape()`` / ``shape(idx)``."""

    def __call__(self, idx: Optional[int] = None) -> Union[Tuple[int, ...], int]:
        return tuple(self) if idx is None else int(self[idx])


class CTensor:
    """SINGA's C++ ``singa::Tensor`` (``singa_wrap.Tensor``) over one ``jax.Array``.

    Constructors as SWIG's overloads: ``CTensor()``, ``CTensor(shape, dtype=kFloat32)``,
    ``CTensor(shape, device, dtype=kFloat32)``, ``CTensor(other)`` (a copy). New tensors hold
    zeros (SINGA leaves them uninitialised). :meth:`from_array` wraps an existing array for free.
    """

    __slots__ = ("_array",)
    __array_ufunc__ = None  # NumPy operators defer to the reflected CTensor methods

    def __init__(self, shape: Any = (), device: Any = None, dtype: Any = None):
        if isinstance(shape, CTensor):  # copy constructor
            self._array = shape._array
            return
        if device is not None and not isinstance(device, Device):  # CTensor(shape, dtype)
            device, dtype = None, device
        dev = device if device is not None else get_default_device()
        self._array = dev.put(_full(0, shape_arg(shape, "CTensor"), to_dtype(dtype)))

    @classmethod
    def from_array(cls, array: Any) -> "CTensor":
        """A CTensor over ``array`` (a jax.Array is wrapped without a copy)."""
        obj = object.__new__(cls)
        obj._array = array if isinstance(array, jax.Array) else as_array(array, "from_array")
        return obj

    # --- what JAX and NumPy see ----------------------------------------------------------------
    def __jax_array__(self) -> jax.Array:
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = np.asarray(self._array)
        return arr if dtype is None else arr.astype(dtype)

    def __repr__(self) -> str:
        return f"CTensor(shape={tuple(self._array.shape)}, dtype={self._array.dtype})"

    # --- SINGA's accessors ---------------------------------------------------------------------
    @property
    def shape(self) -> "Shape":
        """The shape: SINGA calls it (``x.shape()``, ``x.shape(i)``), JAX code reads it
        (``x.shape``); a :class:`Shape` is a tuple that answers both."""
        return Shape(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        """The array's dtype (as ``jax.Array.dtype``; SINGA's spelling is ``data_type()``)."""
        return np.dtype(self._array.dtype)

    @property
    def ndim(self) -> int:
        return int(self._array.ndim)

    @property
    def size(self) -> int:
        return int(self._array.size)

    def device(self) -> Device:
        return device_of(self._array)

    def data_type(self) -> np.dtype:
        return np.dtype(self._array.dtype)

    def Size(self) -> int:
        return int(self._array.size)

    def nDim(self) -> int:
        return int(self._array.ndim)

    def MemSize(self) -> int:
        return int(self._array.size) * self._array.dtype.itemsize

    def transpose(self) -> bool:
        """SINGA's "is this a transposed view" flag: arrays here are always materialised."""
        return False

    def initialized(self) -> bool:
        return True

    def is_empty(self) -> bool:
        return self._array.size == 0

    # --- values to and from the host -----------------------------------------------------------
    def _host_values(self, n: int, dtype: Any, op: str) -> np.ndarray:
        if n > self._array.size:
            raise ValueError(f"{op}: asked for {n} values of a CTensor with {self._array.size}")
        return np.asarray(self._array).reshape(-1)[:int(n)].astype(dtype)

    def GetFloatValue(self, n: int) -> np.ndarray:
        """The first ``n`` values (row-major) as a float32 NumPy array, as SINGA's SWIG."""
        return self._host_values(n, np.float32, "GetFloatValue")

    def GetIntValue(self, n: int) -> np.ndarray:
        return self._host_values(n, np.int32, "GetIntValue")

    def GetHalfFloatValue(self, n: int) -> np.ndarray:
        return self._host_values(n, np.float16, "GetHalfFloatValue")

    def _copy_from_host(self, src: Any, offset: int, op: str) -> None:
        values = np.asarray(src).reshape(-1)
        if offset < 0 or offset + values.size > self._array.size:
            raise ValueError(f"{op}: {values.size} values at offset {offset} do not fit a "
                             f"CTensor of {self._array.size} elements")
        if values.size == self._array.size:
            self._array = device_of(self._array).put(
                values.astype(self._array.dtype).reshape(self._array.shape))
        else:
            self._array = _write_flat(self._array, jnp.asarray(values), offset)

    def CopyFloatDataFromHostPtr(self, src: Any, offset: int = 0) -> None:
        self._copy_from_host(np.asarray(src, np.float32), offset, "CopyFloatDataFromHostPtr")

    def CopyIntDataFromHostPtr(self, src: Any, offset: int = 0) -> None:
        self._copy_from_host(np.asarray(src, np.int32), offset, "CopyIntDataFromHostPtr")

    def CopyHalfFloatDataFromHostPtr(self, src: Any, offset: int = 0) -> None:
        self._copy_from_host(np.asarray(src, np.float16), offset, "CopyHalfFloatDataFromHostPtr")

    def SetFloatValue(self, x: float) -> None:
        self._array = _full(x, tuple(self._array.shape), self._array.dtype)

    def CopyData(self, other: Any) -> None:
        """Copy ``other``'s values into this tensor (same number of elements; shape and dtype
        of this tensor are kept)."""
        src = as_array(other, "CopyData")
        if src.size != self._array.size:
            raise ValueError(f"CopyData: source {describe(other)} has {src.size} elements, "
                             f"this CTensor of shape {tuple(self._array.shape)} has "
                             f"{self._array.size}")
        self._array = _copy_into(self._array, src)

    # --- shape, type and placement -------------------------------------------------------------
    def Reshape(self, shape: Sequence[int]) -> "CTensor":
        """Reshape in place (C++ ``Tensor::Reshape``)."""
        new = shape_arg(shape, "Reshape")
        if int(np.prod(new, dtype=np.int64)) != self._array.size:
            raise ValueError(f"Reshape: cannot reshape a CTensor of shape "
                             f"{tuple(self._array.shape)} to {new}")
        self._array = self._array.reshape(new)
        return self

    def ResetLike(self, t: Any) -> None:
        """Become a zero tensor of ``t``'s shape, dtype and device."""
        a = as_array(t, "ResetLike")
        self._array = _full(0, tuple(a.shape), a.dtype)

    def AsType(self, dtype: Any) -> "CTensor":
        return CTensor.from_array(self._array.astype(to_dtype(dtype)))

    def ToType(self, dtype: Any) -> "CTensor":
        self._array = self._array.astype(to_dtype(dtype))
        return self

    def ToDevice(self, dev: Device) -> None:
        if not isinstance(dev, Device):
            raise TypeError(f"ToDevice: expected a singa_jax Device, got {type(dev).__name__}")
        self._array = dev.put(self._array)

    def ToHost(self) -> None:
        self._array = get_default_device().host().put(self._array)

    def Clone(self) -> "CTensor":
        return CTensor.from_array(self._array)  # arrays are immutable: sharing is a copy

    def Repeat(self, repeats: Sequence[int], axis: int) -> "CTensor":
        reps = list(repeats)
        arr = self._array
        if axis is None or axis == 9999:  # SINGA's Noaxis
            return CTensor.from_array(jnp.repeat(arr.reshape(-1), reps[0]))
        return CTensor.from_array(jnp.repeat(arr, reps[0] if len(reps) == 1 else
                                             np.asarray(reps), axis=axis))

    def T(self) -> "CTensor":
        """The transpose (axes reversed)."""
        return CTensor.from_array(self._array.T)

    def L1(self) -> float:
        """SINGA's L1: the mean absolute value (sum |x| / Size())."""
        return float(_mean_abs(self._array))

    def L2(self) -> float:
        """SINGA's L2: sqrt(sum x^2) / Size()."""
        return float(_norm_over_size(self._array))

    # --- arithmetic ------------------------------------------------------------------------------
    def __add__(self, other: Any) -> "CTensor":
        return binary_op("__add__", jnp.add, self, other)

    def __radd__(self, other: Any) -> "CTensor":
        return binary_op("__radd__", jnp.add, other, self)

    def __sub__(self, other: Any) -> "CTensor":
        return binary_op("__sub__", jnp.subtract, self, other)

    def __rsub__(self, other: Any) -> "CTensor":
        return binary_op("__rsub__", jnp.subtract, other, self)

    def __mul__(self, other: Any) -> "CTensor":
        return binary_op("__mul__", jnp.multiply, self, other)

    def __rmul__(self, other: Any) -> "CTensor":
        return binary_op("__rmul__", jnp.multiply, other, self)

    def __truediv__(self, other: Any) -> "CTensor":
        return binary_op("__truediv__", jnp.divide, self, other)

    def __rtruediv__(self, other: Any) -> "CTensor":
        return binary_op("__rtruediv__", jnp.divide, other, self)

    def __neg__(self) -> "CTensor":
        return CTensor.from_array(-self._array)

    def __lt__(self, other: Any) -> "CTensor":
        return binary_op("__lt__", comparison(jnp.less), self, other)

    def __le__(self, other: Any) -> "CTensor":
        return binary_op("__le__", comparison(jnp.less_equal), self, other)

    def __gt__(self, other: Any) -> "CTensor":
        return binary_op("__gt__", comparison(jnp.greater), self, other)

    def __ge__(self, other: Any) -> "CTensor":
        return binary_op("__ge__", comparison(jnp.greater_equal), self, other)

    # in place, as SINGA's C++ operators (the result keeps this tensor's shape and dtype)
    def __iadd__(self, other: Any) -> "CTensor":
        return _binary_inplace("__iadd__", jnp.add, self, other)

    def __isub__(self, other: Any) -> "CTensor":
        return _binary_inplace("__isub__", jnp.subtract, self, other)

    def __imul__(self, other: Any) -> "CTensor":
        return _binary_inplace("__imul__", jnp.multiply, self, other)

    def __itruediv__(self, other: Any) -> "CTensor":
        return _binary_inplace("__itruediv__", jnp.divide, self, other)

    def iAddFloat(self, x: float) -> "CTensor":
        return _binary_inplace("iAddFloat", jnp.add, self, float(x))

    def iSubFloat(self, x: float) -> "CTensor":
        return _binary_inplace("iSubFloat", jnp.subtract, self, float(x))

    def iMulFloat(self, x: float) -> "CTensor":
        return _binary_inplace("iMulFloat", jnp.multiply, self, float(x))

    def iDivFloat(self, x: float) -> "CTensor":
        return _binary_inplace("iDivFloat", jnp.divide, self, float(x))


def comparison(fn):
    """SINGA's comparisons give 1/0 in the left operand's (float) dtype."""
    def compare(a, b):
        dtype = a.dtype if jnp.issubdtype(a.dtype, jnp.inexact) else jnp.float32
        return fn(a, b).astype(dtype)
    return compare


# JAX transformations (jit, device_put, tree_map) carry a CTensor through as its one array.
jax.tree_util.register_pytree_node(
    CTensor,
    lambda t: ((t._array,), None),
    lambda _, leaves: _unflatten(leaves[0]))


def _unflatten(leaf: Any) -> CTensor:
    obj = object.__new__(CTensor)
    obj._array = leaf  # may be a tracer or a JAX placeholder during transformations
    return obj


Tensor = CTensor  # SWIG's name: ``singa_wrap.Tensor``


class BoundCTensor(CTensor):
    """``Tensor.data``: a CTensor whose array is its Tensor's. Reading it reads the Tensor's array
    and every in-place method (``+=``, ``CopyData``, ``SetFloatValue``, SINGA's ``Axpy(...,
    p.data)``) rebinds the Tensor's array, through the Tensor's own door (so graph mode sees it).

    A new one is made on every ``t.data`` access: it holds its Tensor, the Tensor never holds
    it, so no reference cycle keeps a Tensor alive."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Any):  # owner: the singa_jax Tensor
        self._owner = owner

    @property
    def _array(self) -> jax.Array:
        return self._owner.array

    @_array.setter
    def _array(self, value: jax.Array) -> None:
        self._owner.array = value


jax.tree_util.register_pytree_node(
    BoundCTensor,
    lambda t: ((t._array,), None),
    lambda _, leaves: _unflatten(leaves[0]))


class VecTensor(list):
    """SWIG's ``std::vector<Tensor>``: a list of CTensors (jax.Arrays are wrapped)."""

    def __init__(self, items: Iterable[Any] = ()):
        super().__init__(_vec_item(x) for x in items)

    def append(self, x: Any) -> None:
        super().append(_vec_item(x))

    def push_back(self, x: Any) -> None:
        self.append(x)


def _vec_item(x: Any) -> CTensor:
    return x if isinstance(x, CTensor) else CTensor.from_array(as_array(x, "VecTensor"))
