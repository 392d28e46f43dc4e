"""SINGA's ``tensor`` module on JAX.

A :class:`Tensor` is a mutable handle over an immutable ``jax.Array`` (``Tensor.data``). In-place
operations rebind the handle to a new array. Besides its value, a Tensor carries SINGA's three
autograd attributes: ``creator`` (the operator that produced it), ``requires_grad`` and
``stores_grad``.

Arithmetic on Tensors here is plain computation (as in SINGA): it does not record the autograd
graph; the functions of :mod:`singa_jax.autograd` do. Families of operations (operators, unary math
functions, row/column updates) are made by small factories, one name per line.

The dtype constants and helpers live in :mod:`singa_jax.dtypes`, the random sampling in
:mod:`singa_jax.sampling` and the creator bookkeeping (``Dummy``) in :mod:`singa_jax.creator`;
this module re-exports the public names SINGA's ``tensor`` has. See ``docs/tensors.md`` for the
mapping onto JAX and the differences from SINGA.
"""
from __future__ import annotations

import builtins
import contextlib
import math
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from . import device as _device_mod
from . import sampling
from .creator import Dummy
from .modes import TraceHook, current_trace_hook as _current_hook
from .device import Device, get_default_device
from .dtypes import (bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64,
                     singa_dtype_code, sizeof, to_dtype, uint8)

__all__ = [
    # the handle, its aliases and graph mode's hook
    "Tensor", "PlaceHolder", "CTensor", "InvalidIndex", "TraceHook",
    # dtypes (from singa_jax.dtypes)
    "float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "bool_", "to_dtype", "singa_dtype_code", "sizeof",
    # creation and conversion
    "from_raw_tensor", "from_raw_tensors", "from_numpy", "to_numpy", "to_host", "copy_from_numpy",
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

CTensor = jax.Array  # what SINGA's Tensor wraps (a C++ tensor there, a jax.Array here)
ShapeLike = Union[int, Sequence[int]]


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer))


def _filled(shape: Tuple[int, ...], value: Any, dtype: Any, device: Device) -> jax.Array:
    """A new array of ``shape`` filled with ``value``, created directly on ``device``."""
    return jnp.full(shape, value, to_dtype(dtype), device=device.jax_device)


def _as_shape(shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


class InvalidIndex(IndexError, ValueError):
    """A bad index. SINGA raises ValueError; being an IndexError too ends ``for row in t``."""


# --- factories of Tensor's operator and row/column methods, bound by name in the class body ---
def _method(fn: Callable, name: str, doc: str) -> Callable:
    fn.__name__, fn.__qualname__, fn.__doc__ = name, f"Tensor.{name}", doc
    return fn


def _operator(name: str, fn: Callable) -> Callable:
    """``__<name>__``: ``fn(self, other)`` as a new tensor (NotImplemented for foreign types)."""
    op = f"__{name}__"

    def forward(self, other):
        arr = _binary(op, fn, self, other)
        return arr if arr is NotImplemented else self._new(arr)
    return _method(forward, op, f"Elementwise ``{fn.__name__}`` with NumPy broadcasting.")


def _reflected_operator(name: str, fn: Callable) -> Callable:
    """``__r<name>__``: ``fn(other, self)`` as a new tensor."""
    op = f"__r{name}__"

    def reflected(self, other):
        arr = _binary(op, fn, self, other, reflected=True)
        return arr if arr is NotImplemented else self._new(arr)
    return _method(reflected, op, f"Elementwise ``{fn.__name__}`` with NumPy broadcasting.")


def _inplace_operator(name: str, fn: Callable) -> Callable:
    """``__i<name>__``: rebind to ``fn(self, other)``, keeping this tensor's shape and dtype."""
    op = f"__i{name}__"

    def inplace(self, other):
        # The handle keeps its shape and dtype (SINGA updates its buffer); the array is rebound.
        arr = _binary(op, fn, self, other)
        if arr is NotImplemented:
            return arr
        if tuple(arr.shape) != self.shape:
            raise ValueError(f"{op}: result of shape {tuple(arr.shape)} cannot be stored "
                             f"in place in a tensor of shape {self.shape}")
        self.data = arr.astype(self.dtype)
        return self
    return _method(inplace, op, f"Elementwise ``{fn.__name__}`` with NumPy broadcasting.")


def _comparison(name: str, fn: Callable) -> Callable:
    """``__<name>__``: ``fn(self, other)`` as 0/1 in this tensor's dtype."""
    op = f"__{name}__"

    def compare(self, other):
        if other is None:  # SINGA: ``t == None`` is False
            return name == "ne"
        arr = _binary(op, fn, self, other)
        return arr if arr is NotImplemented else self._new(arr.astype(self.dtype))
    return _method(compare, op, f"Elementwise ``{fn.__name__}``: 0/1 in this tensor's dtype.")


def _line_method(name: str, fn: Callable, axis: int) -> Callable:
    """In place ``M = fn(M, v)`` with ``v`` a column (axis 0) or row (axis 1) of the 2-d M."""
    def update(self, v: "Tensor") -> "Tensor":
        self.data = fn(self.data, _line(name, self, v, axis)).astype(self.dtype)
        return self
    what = "column" if axis == 0 else "row"
    return _method(update, name,
                   f"In place: ``{fn.__name__}`` ``v`` with each {what} of this 2-d tensor.")


class Tensor:
    """SINGA's Tensor: a mutable handle over a ``jax.Array``.

    Args:
        shape: shape of a new (zero-filled) tensor when ``data`` is None.
        device: a :class:`~singa_jax.device.Device`; None for the default device.
        dtype: a SINGA dtype constant, NumPy or JAX dtype.
        data: a NumPy array, a ``jax.Array`` or another Tensor's array.
        requires_grad: whether autograd computes a gradient for it.
        stores_grad: whether ``autograd.backward`` yields its gradient (implies requires_grad).
        creator: the operator that produced it (a :class:`~singa_jax.creator.Dummy` when None).
        name: a name (``Dummy#N`` when None).

    Operators (``+ - * / // ** @``, reflected and in-place forms, ``< <= > >= == !=``) follow
    NumPy broadcasting; comparisons give 0/1 in the left operand's dtype, as SINGA's do.
    """

    tensor_count = 0
    __array_priority__ = 100  # make ndarray (op) Tensor defer to Tensor's reflected operators
    __array_ufunc__ = None    # ... for every NumPy operator, ufuncs included

    def __init__(self, shape: Tuple[int, ...] = (), device: Optional[Device] = None,
                 dtype: Any = float32, data: Any = None, requires_grad: bool = True,
                 stores_grad: bool = False, creator: Any = None, name: Optional[str] = None):
        if device is None:
            device = get_default_device()
        elif not isinstance(device, Device):
            raise TypeError(f"Tensor: device must be a singa_jax Device, got "
                            f"{type(device).__name__}")
        if data is None:
            shape = _as_shape(shape)
            if any(s < 0 for s in shape):
                raise ValueError(f"Tensor: shape must have sizes >= 0, got {shape}")
            arr = _filled(shape, 0, dtype, device)
        elif isinstance(data, Tensor):
            arr = data.data
        elif _is_array(data):
            arr = data
        else:
            arr = np.asarray(data)
            if dtype is not None and not isinstance(data, np.ndarray):
                arr = arr.astype(to_dtype(dtype))
            if arr.dtype == np.float64:  # SINGA has no double tensors by default
                arr = arr.astype(np.float32)
        self._data = device.put(arr)
        self.device = device
        self.requires_grad = bool(requires_grad or stores_grad)
        self.stores_grad = bool(stores_grad)
        if name is None:
            self.name = f"Dummy#{Tensor.tensor_count}"
            Tensor.tensor_count += 1
        else:
            self.name = name
        if creator is None:
            creator = Dummy(self, name)
        self.creator = creator
        hook = _current_hook()
        if hook is not None:
            hook.created(self)

    def __getattr__(self, name: str) -> Any:
        # Reached only when normal lookup fails. A Tensor built without __init__ (graph mode's
        # results, made in bulk on every compiled step) gets its Dummy creator when first used.
        if name == "creator":
            creator = self.__dict__["creator"] = Dummy(self)
            return creator
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    # --- the array behind the handle --------------------------------------------------------
    @property
    def data(self) -> jax.Array:
        hook = _current_hook()
        if hook is not None:
            hook.read(self)
        return self._data

    @data.setter
    def data(self, value) -> None:
        if isinstance(value, Tensor):
            value = value.data
        if not _is_array(value):
            value = self.device.put(np.asarray(value))
        hook = _current_hook()
        if hook is not None:
            hook.write(self)
        self._data = value

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    def ndim(self) -> int:
        return self._data.ndim

    def size(self) -> int:
        return int(self._data.size)

    def memsize(self) -> int:
        """Bytes held by the array."""
        return int(self._data.size) * self._data.dtype.itemsize

    def is_dummy(self) -> bool:
        """True when the tensor still has its automatic name ``Dummy#N`` (no ``name`` was given).

        SINGA's name: layers use it to rename the tensors they own after their attributes."""
        return self.name.startswith("Dummy#")

    def is_empty(self) -> bool:
        return self.ndim() == 0

    def is_transpose(self) -> bool:
        return False  # arrays are always materialised in row-major order

    def __len__(self) -> int:
        if self.ndim() == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        # NumPy's rule: only a one-element tensor has a truth value (``t in list`` would otherwise
        # silently be True, since == is elementwise).
        if self.size() != 1:
            raise ValueError(f"the truth value of a Tensor of shape {self.shape} is ambiguous; "
                             f"use `is None` tests or reduce it first")
        return bool(self.data.reshape(()))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        arr = np.array(self.data)
        return arr if dtype is None else arr.astype(dtype)

    def __repr__(self) -> str:
        if isinstance(self._data, jax.core.Tracer):
            return f"Tensor(traced, shape={self.shape}, dtype={self.dtype})"
        return f"Tensor({np.asarray(self._data)!r}, device={self.device})"

    def __hash__(self) -> int:  # Tensors are compared by identity in dicts/sets (like SINGA)
        return id(self)

    def _new(self, arr: jax.Array) -> "Tensor":
        """A fresh Tensor over ``arr`` on this tensor's device (SINGA's default flags)."""
        return Tensor(data=arr, device=self.device)

    # --- shape ------------------------------------------------------------------------------
    def reshape(self, shape: ShapeLike) -> "Tensor":
        """A new tensor with this tensor's values in ``shape`` (one entry may be -1)."""
        shape = _as_shape(shape)
        known = math.prod(s for s in shape if s != -1)
        fits = (known == self.size() if -1 not in shape
                else shape.count(-1) == 1 and known and self.size() % known == 0)
        if not fits:
            raise ValueError(f"reshape: cannot reshape a tensor of shape {self.shape} "
                             f"({self.size()} elements) to {shape}")
        return self._new(self.data.reshape(shape))

    def transpose(self, axes: Optional[Sequence[int]] = None) -> "Tensor":
        """A new tensor with permuted axes (reversed when ``axes`` is None)."""
        if axes is not None:
            axes = tuple(int(a) % builtins.max(self.ndim(), 1) for a in axes)
            if sorted(axes) != list(range(self.ndim())):
                raise ValueError(f"transpose: axes {axes} are not a permutation of the "
                                 f"{self.ndim()} axes of a tensor of shape {self.shape}")
        return self._new(jnp.transpose(self.data, axes))

    def T(self) -> "Tensor":
        """The transpose (all axes reversed); SINGA's shallow transposed view."""
        return self.transpose()

    def contiguous(self) -> "Tensor":
        return self._new(self.data)

    def repeat(self, repeats: Union[int, Sequence[int]], axis: Optional[int] = None) -> "Tensor":
        """``numpy.repeat``: each element ``repeats`` times along ``axis`` (flattened if None)."""
        counts = [repeats] if isinstance(repeats, (int, np.integer)) else list(repeats)
        if builtins.any(int(r) < 0 for r in counts):
            raise ValueError(f"repeat: repeats must be non-negative, got {repeats}")
        if len(counts) > 1:
            if axis is None:
                raise ValueError(f"repeat: with axis=None, repeats must be an int, got {repeats}")
            if len(counts) != self.shape[axis]:
                raise ValueError(f"repeat: {len(counts)} repeats for axis {axis} of size "
                                 f"{self.shape[axis]} (shape {self.shape})")
        reps = int(counts[0]) if len(counts) == 1 else np.asarray(counts)
        return self._new(jnp.repeat(self.data, reps, axis=axis))

    def reset_like(self, t: "Tensor") -> None:
        """Make this tensor a zero tensor with ``t``'s shape, dtype and device."""
        self.device = t.device
        self.data = _filled(t.shape, 0, t.dtype, t.device)

    # --- dtype and device -------------------------------------------------------------------
    def as_type(self, dtype: Any) -> "Tensor":
        """A new tensor with this tensor's values converted to ``dtype``."""
        return self._new(self.data.astype(to_dtype(dtype)))

    def to_type(self, dtype: Any) -> "Tensor":
        """Convert this tensor to ``dtype`` in place; returns it."""
        self.data = self.data.astype(to_dtype(dtype))
        return self

    def to_device(self, device: Device) -> "Tensor":
        """Move this tensor's data onto ``device`` (in place); returns it."""
        if not isinstance(device, Device):
            raise TypeError(f"to_device: expected a singa_jax Device, got {type(device).__name__}")
        self.data = device.put(self.data)
        self.device = device
        return self

    def to_host(self) -> "Tensor":
        """Move this tensor's data onto the host (CPU) device; returns it."""
        return self.to_device(_device_mod.create_cpu_device())

    # --- norms ------------------------------------------------------------------------------
    def l1(self) -> float:
        """SINGA's L1: ``sum(|x|) / size``."""
        return _to_scalar(jnp.sum(jnp.abs(self.data)) / self.size())

    def l2(self) -> float:
        """SINGA's L2: ``sqrt(sum(x**2)) / size`` (SINGA divides the norm by the size)."""
        return _to_scalar(jnp.linalg.norm(self.data.ravel()) / self.size())

    # --- writing values ---------------------------------------------------------------------
    def set_value(self, x: Any, inplace: bool = True) -> "Tensor":
        """Fill with ``x``: this tensor (returned) if ``inplace``, else a new tensor."""
        if isinstance(x, Tensor):
            x = x.data
        return self._fill(_filled(self.shape, x, self.dtype, self.device), inplace)

    def _fill(self, arr: jax.Array, inplace: bool) -> "Tensor":
        """Rebind this tensor to ``arr`` and return it, or (not inplace) a new tensor over it."""
        if not inplace:
            return self._new(arr)
        self.data = arr
        return self

    def copy_from_numpy(self, np_array: np.ndarray, offset: int = 0) -> None:
        """Copy a NumPy array's values (flattened, converted to this dtype) in, from element
        ``offset`` of this tensor on. With ``offset=0`` the sizes must be equal (as in SINGA)."""
        src = np.asarray(np_array)
        if src.dtype.kind not in "biuf":
            raise TypeError(f"copy_from_numpy: cannot copy a NumPy array of dtype {src.dtype} into "
                            f"a {self.dtype} tensor")
        if (src.size != self.size()) if offset == 0 else (offset < 0 or
                                                          offset + src.size > self.size()):
            raise ValueError(f"copy_from_numpy: a NumPy array of shape {src.shape} ({src.size} "
                             f"elements) does not fit a tensor of shape {self.shape} "
                             f"({self.size()} elements) at offset {offset}")
        values = self.device.put(src.astype(self.dtype).reshape(-1))
        self.data = _write_flat(self.data, offset, values)

    def copy_data(self, t: "Tensor") -> None:
        """Copy ``t``'s values (same number of elements, any device) into this tensor."""
        if not isinstance(t, Tensor):
            raise TypeError(f"copy_data: expected a Tensor, got {type(t).__name__}")
        if t.size() != self.size():
            raise ValueError(f"copy_data: source of shape {t.shape} ({t.size()} elements) does not "
                             f"match this tensor of shape {self.shape} ({self.size()} elements)")
        self.data = self.device.put(t.data.reshape(self.shape).astype(self.dtype))

    def copy_from(self, t: Union["Tensor", np.ndarray], offset: int = 0) -> None:
        """Copy from a Tensor or a NumPy array (to element ``offset`` on)."""
        if isinstance(t, Tensor):
            if offset == 0:
                self.copy_data(t)
            else:
                copy_data_to_from(self, t, t.size(), offset, 0)
        elif isinstance(t, np.ndarray):
            self.copy_from_numpy(t, offset)
        else:
            raise TypeError(f"copy_from: t should be a Tensor or a NumPy array, got "
                            f"{type(t).__name__}")

    # Two kinds of copy, on purpose. SINGA's methods clone/copy/deepcopy make a NEW tensor: same
    # values, dtype and device, but SINGA's default flags and a fresh ``Dummy#N`` name. Python's
    # copy.copy/copy.deepcopy duplicate THIS object, flags and name included (what copying a
    # model or an optimizer state needs). Arrays are immutable, so every copy may share the
    # array: a later in-place op on either rebinds only that handle.
    def clone(self) -> "Tensor":
        """A new tensor with this tensor's values, dtype and device, SINGA's default flags
        (``requires_grad=True``, ``stores_grad=False``) and a fresh automatic name."""
        return self._new(self.data)

    def copy(self) -> "Tensor":
        """SINGA's shallow copy; the same as :meth:`clone` (sharing is invisible with immutable
        arrays)."""
        return self.clone()

    def deepcopy(self) -> "Tensor":
        """SINGA's ``deepcopy``, "same as clone()": a new tensor with default flags and a fresh
        name. ``copy.deepcopy(t)`` instead keeps ``t``'s flags and name."""
        return self.clone()

    def _duplicate(self) -> "Tensor":
        """This tensor as another handle: same values, device, flags and name."""
        return Tensor(data=self.data, device=self.device, requires_grad=self.requires_grad,
                      stores_grad=self.stores_grad, name=self.name)

    def __copy__(self) -> "Tensor":
        """``copy.copy(t)``: keeps the flags and name (see :meth:`_duplicate`)."""
        return self._duplicate()

    def __deepcopy__(self, memo: dict) -> "Tensor":
        """``copy.deepcopy(t)``: keeps the flags and name and shares the Device."""
        return self._duplicate()

    # --- random fills: every draw splits the device's key (reproducible after SetRandSeed) ----
    def _fill_random(self, kind: str, inplace: bool, *params: float) -> "Tensor":
        sampling.check_params(kind, params)  # before next_key(): a bad call leaves the key alone
        arr = sampling.draw(kind, self.device.next_key(), params, self.shape, self.dtype)
        return self._fill(arr, inplace)

    def bernoulli(self, p: float, inplace: bool = True) -> "Tensor":
        """Each element 1 with probability ``p``, else 0."""
        return self._fill_random("bernoulli", inplace, p)

    def gaussian(self, mean: float, std: float, inplace: bool = True) -> "Tensor":
        """Each element drawn from N(mean, std**2)."""
        return self._fill_random("gaussian", inplace, mean, std)

    def uniform(self, low: float, high: float, inplace: bool = True) -> "Tensor":
        """Each element drawn from U[low, high)."""
        return self._fill_random("uniform", inplace, low, high)

    # --- indexing (SINGA: ints and slices only; an int index keeps its axis with size 1) ------
    def _index(self, keys: Any, op: str) -> Tuple[slice, ...]:
        keys = keys if isinstance(keys, tuple) else (keys,)
        if len(keys) > self.ndim():
            raise InvalidIndex(f"{op}: {len(keys)} indices for a tensor of shape {self.shape}")
        index = []
        for axis, key in enumerate(keys):
            n = self.shape[axis]
            if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                k = int(key) + (n if key < 0 else 0)
                if not 0 <= k < n:
                    raise InvalidIndex(f"{op}: index {key} is out of range for axis {axis} of "
                                       f"size {n} (shape {self.shape})")
                index.append(slice(k, k + 1))
            elif isinstance(key, slice):
                index.append(key)
            else:
                raise InvalidIndex(f"{op}: index {key!r} on axis {axis}: only ints and slices are "
                                   f"supported")
        return tuple(index)

    def __getitem__(self, keys: Any) -> "Tensor":
        return self._new(self.data[self._index(keys, "__getitem__")])

    def __setitem__(self, keys: Any, value: Any) -> None:
        index = self._index(keys, "__setitem__")
        target = tuple(len(range(*s.indices(n))) for s, n in zip(index, self.shape))
        target += self.shape[len(index):]
        v = _operand("__setitem__", self, value)
        if v is NotImplemented:
            raise TypeError(f"__setitem__: cannot assign a {type(value).__name__}")
        if _broadcast("__setitem__", target, jnp.shape(v)) != target:
            raise ValueError(f"__setitem__: value of shape {jnp.shape(v)} does not fit the "
                             f"selected region of shape {target}")
        self.data = self.data.at[index].set(jnp.asarray(v).astype(self.dtype))

    # --- operators: NumPy broadcasting; NotImplemented for foreign types (see _binary) --------
    __add__ = _operator("add", jnp.add)
    __radd__ = _reflected_operator("add", jnp.add)
    __iadd__ = _inplace_operator("add", jnp.add)
    __sub__ = _operator("sub", jnp.subtract)
    __rsub__ = _reflected_operator("sub", jnp.subtract)
    __isub__ = _inplace_operator("sub", jnp.subtract)
    __mul__ = _operator("mul", jnp.multiply)
    __rmul__ = _reflected_operator("mul", jnp.multiply)
    __imul__ = _inplace_operator("mul", jnp.multiply)
    __truediv__ = _operator("truediv", jnp.true_divide)
    __rtruediv__ = _reflected_operator("truediv", jnp.true_divide)
    __itruediv__ = _inplace_operator("truediv", jnp.true_divide)
    __floordiv__ = _operator("floordiv", jnp.floor_divide)
    __rfloordiv__ = _reflected_operator("floordiv", jnp.floor_divide)
    __ifloordiv__ = _inplace_operator("floordiv", jnp.floor_divide)
    __pow__ = _operator("pow", jnp.power)
    __rpow__ = _reflected_operator("pow", jnp.power)
    __ipow__ = _inplace_operator("pow", jnp.power)
    # Python 2 names SINGA still defines
    __div__, __rdiv__, __idiv__ = __truediv__, __rtruediv__, __itruediv__

    # Comparisons give 0/1 in the left operand's dtype (SINGA: ``t[i] < x ? 1.0f : 0.0f``).
    __lt__ = _comparison("lt", jnp.less)
    __le__ = _comparison("le", jnp.less_equal)
    __gt__ = _comparison("gt", jnp.greater)
    __ge__ = _comparison("ge", jnp.greater_equal)
    __eq__ = _comparison("eq", jnp.equal)
    __ne__ = _comparison("ne", jnp.not_equal)

    def __neg__(self) -> "Tensor":
        return self._new(jnp.negative(self.data))

    def __pos__(self) -> "Tensor":
        return self._new(self.data)

    def __abs__(self) -> "Tensor":
        return self._new(jnp.abs(self.data))

    def __matmul__(self, other: "Tensor") -> "Tensor":
        return mult(self, other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        return mult(_as_tensor_like(other, self), self)

    # --- SINGA's deprecated row/column updates (in place; v has one entry per row/column) -----
    # v may have shape (n,), (n, 1) or (1, n)
    add_column = _line_method("add_column", jnp.add, axis=0)
    add_row = _line_method("add_row", jnp.add, axis=1)
    div_column = _line_method("div_column", jnp.true_divide, axis=0)
    div_row = _line_method("div_row", jnp.true_divide, axis=1)
    mult_column = _line_method("mult_column", jnp.multiply, axis=0)
    mult_row = _line_method("mult_row", jnp.multiply, axis=1)


def _to_scalar(x: jax.Array):
    """A Python float of a 0-d result (SINGA returns floats); the array itself while tracing."""
    return x if isinstance(x, jax.core.Tracer) else float(x)


def _write_flat(arr: jax.Array, offset: int, values: jax.Array) -> jax.Array:
    """``arr`` with its flattened elements ``offset ...`` replaced by ``values``."""
    if offset == 0 and values.size == arr.size:
        return values.reshape(arr.shape)
    return arr.reshape(-1).at[offset:offset + values.size].set(values).reshape(arr.shape)


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"Tensor of shape {x.shape}, dtype {x.dtype} on {x.device}"
    return f"{type(x).__name__} of shape {np.shape(x)}"


def _same_device(op: str, *tensors: Tensor) -> None:
    first = tensors[0]
    for t in tensors[1:]:
        if t.device.jax_device != first.device.jax_device:
            raise ValueError(f"{op}: operands are on different devices: {_describe(first)} and "
                             f"{_describe(t)}; move one with Tensor.to_device()")


def _check_tensor(op: str, name: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    return x


def _operand(op: str, t: Tensor, x: Any):
    """``x`` as an operand of ``t`` in ``op``: its array (same device enforced) or a scalar/array;
    NotImplemented for other types, so Python can try the other operand's operator."""
    if isinstance(x, Tensor):
        _same_device(op, t, x)
        return x.data
    if isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, np.generic):
        return x.item()  # a Python scalar stays weakly typed: it does not promote t's dtype
    if isinstance(x, np.ndarray) or _is_array(x):
        return x
    return NotImplemented


def _broadcast(op: str, a: Tuple[int, ...], b: Tuple[int, ...]) -> Tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise ValueError(f"{op}: shapes {tuple(a)} and {tuple(b)} do not broadcast together "
                         f"(NumPy broadcasting rules)") from None


@contextlib.contextmanager
def _shape_errors(op: str, *operands: Any) -> Iterator[None]:
    """Re-raise JAX's complaints about operand shapes (TypeError or ValueError there) as a
    ValueError naming ``op`` and the operands."""
    try:
        yield
    except jax.errors.ConcretizationTypeError:
        raise
    except (TypeError, ValueError) as e:
        described = "; ".join(_describe(x) for x in operands)
        raise ValueError(f"{op}: {e} (operands: {described})") from e


def _binary(op: str, fn: Callable, lhs: Tensor, rhs: Any, reflected: bool = False):
    """``fn(lhs, rhs)`` on arrays (``fn(rhs, lhs)`` if reflected) with NumPy broadcasting."""
    b = _operand(op, lhs, rhs)
    if b is NotImplemented:
        return b
    _broadcast(op, lhs.shape, jnp.shape(b))
    return fn(b, lhs.data) if reflected else fn(lhs.data, b)


def _store(op: str, out: Tensor, arr: jax.Array) -> Tensor:
    """Write ``arr`` into ``out`` (SINGA's ``ret=``/``out=``/``C=``): same shape, out's dtype."""
    _check_tensor(op, "the output", out)
    if tuple(arr.shape) != out.shape:
        raise ValueError(f"{op}: result of shape {tuple(arr.shape)} does not fit the output "
                         f"tensor of shape {out.shape}")
    out.data = out.device.put(arr.astype(out.dtype))
    return out


def _result(op: str, like: Tensor, arr: Any, out: Optional[Tensor]) -> Tensor:
    if arr is NotImplemented:
        raise TypeError(f"{op}: unsupported operand; expected a Tensor, a number or an array")
    return like._new(arr) if out is None else _store(op, out, arr)


def _as_tensor_like(x: Any, like: Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    return Tensor(data=jnp.asarray(x), device=like.device)


def _line(op: str, M: Tensor, v: Any, axis: int) -> jax.Array:
    """``v`` as a column (axis 0) or row (axis 1) of the 2-d tensor ``M``, for broadcasting."""
    _check_tensor(op, "M", M)
    _check_tensor(op, "v", v)
    if M.ndim() != 2:
        raise ValueError(f"{op}: expects a 2-d tensor, got shape {M.shape}")
    _same_device(op, M, v)
    n = M.shape[axis]
    if v.size() != n:
        kind = "column" if axis == 0 else "row"
        raise ValueError(f"{op}: v of shape {v.shape} must have {n} elements to be a {kind} of a "
                         f"tensor of shape {M.shape}")
    return v.data.reshape((n, 1) if axis == 0 else (1, n))


PlaceHolder = Tensor  # SINGA's alias


# --- module functions --------------------------------------------------------------------------
def from_raw_tensor(t: jax.Array) -> Tensor:
    """A Tensor over the array ``t`` (SINGA wraps a CTensor)."""
    return Tensor(data=t, device=_device_of(t))


def from_raw_tensors(tt) -> List[Tensor]:
    return [from_raw_tensor(t) for t in tt]


def _device_of(arr) -> Device:
    if isinstance(arr, jax.core.Tracer):
        return get_default_device()
    try:
        devs = arr.devices()
    except AttributeError:
        return get_default_device()
    if len(devs) == 1:
        return _device_mod._wrap(next(iter(devs)))
    return get_default_device()


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


def to_numpy(t: Tensor) -> np.ndarray:
    """A (writable) NumPy copy of ``t``'s value."""
    return np.array(_check_tensor("to_numpy", "t", t).data)


def to_host(t: Tensor) -> Tensor:
    """A copy of ``t`` on the host (CPU) device."""
    return t.clone().to_host()


def copy_from_numpy(data: Tensor, np_array: np.ndarray) -> None:
    """Copy ``np_array`` into the tensor ``data`` (SINGA passes its C++ tensor)."""
    _check_tensor("copy_from_numpy", "data", data).copy_from_numpy(np_array)


def copy_data_to_from(dst: Tensor, src: Tensor, size: int, dst_offset: int = 0,
                      src_offset: int = 0) -> None:
    """Copy ``size`` elements of ``src`` (from flat position ``src_offset``) into ``dst`` (from
    ``dst_offset``); the tensors may be on different devices."""
    op = "copy_data_to_from"
    _check_tensor(op, "dst", dst)
    _check_tensor(op, "src", src)
    if (builtins.min(size, dst_offset, src_offset) < 0 or src_offset + size > src.size()
            or dst_offset + size > dst.size()):
        raise ValueError(f"{op}: cannot copy {size} elements from offset {src_offset} of a tensor "
                         f"of shape {src.shape} to offset {dst_offset} of a tensor of shape "
                         f"{dst.shape}")
    values = src.data.reshape(-1)[src_offset:src_offset + size].astype(dst.dtype)
    dst.data = _write_flat(dst.data, dst_offset, dst.device.put(values))


def _constant(shape: ShapeLike, value: float, device: Optional[Device]) -> Tensor:
    device = get_default_device() if device is None else device
    return Tensor(data=_filled(_as_shape(shape), value, float32, device), device=device)


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
    with _shape_errors("sum", t):
        arr = jnp.sum(t.data, axis=axis)
    return _result("sum", t, arr, out)


def average(t: Tensor, axis: Optional[int] = None) -> Union[float, Tensor]:
    """Mean of all elements as a float (SINGA also does so for 1-d tensors), else the tensor of
    means over ``axis``."""
    if axis is None or t.ndim() <= 1:
        return _to_scalar(jnp.mean(t.data))
    with _shape_errors("average", t):
        return t._new(jnp.mean(t.data, axis=axis))


def softmax(t: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """Softmax over the last axis (each row of a 2-d tensor):
    ``exp(x - max) / sum(exp(x - max))``."""
    return _result("softmax", t, jax.nn.softmax(t.data, axis=-1), out)


def _elementwise(op: str, fn: Callable, lhs: Tensor, rhs: Any, out: Optional[Tensor]) -> Tensor:
    _check_tensor(op, "lhs", lhs)
    return _result(op, lhs, _binary(op, fn, lhs, rhs), out)


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
        result = getattr(_check_tensor(name, "t", t), f"__{name}__")(x)
        if result is NotImplemented:
            raise TypeError(f"{name}: cannot compare a Tensor with a {type(x).__name__}")
        return result
    comparison.__name__ = comparison.__qualname__ = name
    comparison.__doc__ = f"Elementwise ``{fn.__name__}(t, x)`` as 0/1 in ``t``'s dtype."
    return comparison


def _make_unary(name: str, fn: Callable, formula: str) -> Callable:
    """SINGA's ``<name>(t)``: a new tensor of ``fn`` of each element (``formula`` documents it)."""
    def unary(t: Tensor) -> Tensor:
        return _check_tensor(name, "t", t)._new(fn(t.data))
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


def mult(A: Tensor, B: Tensor, C: Optional[Tensor] = None, alpha: float = 1.0,
         beta: float = 0.0) -> Tensor:
    """``alpha * A @ B`` (matrix-matrix, matrix-vector or batched), or in place
    ``C = alpha * A @ B + beta * C`` when ``C`` is given (then returned)."""
    _check_tensor("mult", "A", A)
    _check_tensor("mult", "B", B)
    _same_device("mult", A, B)
    with _shape_errors("mult", A, B):
        prod = jnp.matmul(A.data, B.data)
    if alpha != 1.0:
        prod = alpha * prod
    if C is None:
        return A._new(prod)
    _same_device("mult", A, _check_tensor("mult", "C", C))
    # BLAS ignores C when beta is 0, so NaNs in C do not leak in
    return _store("mult", C, prod if beta == 0 else prod + beta * C.data)


def einsum(ops: str, *args: Tensor) -> Tensor:
    """``numpy.einsum`` over Tensors, e.g. ``einsum('ki,kj->kij', A, B)``."""
    if not ops:
        raise ValueError("einsum: no subscripts given")
    if not args:
        raise ValueError(f"einsum: no operands for {ops!r}")
    for i, a in enumerate(args):
        _check_tensor("einsum", f"operand {i}", a)
    _same_device("einsum", *args)
    with _shape_errors(f"einsum({ops!r})", *args):
        return args[0]._new(jnp.einsum(ops, *(a.data for a in args)))


def tensordot(A: Tensor, B: Tensor, axes: Any = 2) -> Tensor:
    """``numpy.tensordot``: sum products over the last ``axes`` of A and first of B, or over the
    pair of axis lists ``axes``."""
    _check_tensor("tensordot", "A", A)
    _check_tensor("tensordot", "B", B)
    _same_device("tensordot", A, B)
    if isinstance(axes, (list, tuple)):
        axes = tuple(tuple(a) if isinstance(a, (list, tuple)) else a for a in axes)
    with _shape_errors("tensordot", A, B):
        return A._new(jnp.tensordot(A.data, B.data, axes))


def concatenate(tensors: Sequence[Tensor], axis: int) -> Tensor:
    """Join tensors along ``axis`` (all other dimensions equal)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate: no tensors given")
    for i, t in enumerate(tensors):
        _check_tensor("concatenate", f"tensor {i}", t)
    _same_device("concatenate", *tensors)
    with _shape_errors("concatenate", *tensors):
        return tensors[0]._new(jnp.concatenate([t.data for t in tensors], axis=axis))


def axpy(alpha: float, x: Tensor, y: Tensor) -> Tensor:
    """In place ``y += alpha * x``; returns ``y``."""
    _check_tensor("axpy", "x", x)
    _check_tensor("axpy", "y", y)
    _same_device("axpy", x, y)
    if _broadcast("axpy", x.shape, y.shape) != y.shape:
        raise ValueError(f"axpy: x of shape {x.shape} does not broadcast to y of shape {y.shape}")
    y.data = (y.data + alpha * x.data).astype(y.dtype)
    return y


def bernoulli(p: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place with 1 (probability ``p``) or 0; returns ``t``."""
    return _check_tensor("bernoulli", "t", t).bernoulli(p)


def gaussian(mean: float, std: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place from N(mean, std**2); returns ``t``."""
    return _check_tensor("gaussian", "t", t).gaussian(mean, std)


def uniform(low: float, high: float, t: Tensor) -> Tensor:
    """Fill ``t`` in place from U[low, high); returns ``t``."""
    return _check_tensor("uniform", "t", t).uniform(low, high)


def _scaled_line_update(op: str, alpha: float, v: Tensor, beta: float, M: Tensor,
                        axis: int) -> Tensor:
    line = _line(op, M, v, axis)
    M.data = (alpha * line + beta * M.data).astype(M.dtype)
    return M


def add_column(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """In place, for each column m of the 2-d ``M``: ``m = alpha * v + beta * m``; returns M."""
    return _scaled_line_update("add_column", alpha, v, beta, M, 0)


def add_row(alpha: float, v: Tensor, beta: float, M: Tensor) -> Tensor:
    """In place, for each row m of the 2-d ``M``: ``m = alpha * v + beta * m``; returns M."""
    return _scaled_line_update("add_row", alpha, v, beta, M, 1)


def _sum_keepdims(op: str, M: Tensor, axis: int) -> Tensor:
    if _check_tensor(op, "M", M).ndim() != 2:
        raise ValueError(f"{op}: expects a 2-d tensor, got shape {M.shape}")
    return M._new(jnp.sum(M.data, axis=axis, keepdims=True))


def sum_columns(M: Tensor) -> Tensor:
    """Sum of the columns of the 2-d ``M``: a column of shape (rows, 1)."""
    return _sum_keepdims("sum_columns", M, 1)


def sum_rows(M: Tensor) -> Tensor:
    """Sum of the rows of the 2-d ``M``: a row of shape (1, columns)."""
    return _sum_keepdims("sum_rows", M, 0)

