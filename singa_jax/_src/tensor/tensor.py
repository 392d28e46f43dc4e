"""The :class:`Tensor` handle: a mutable SINGA Tensor over an immutable ``jax.Array``.

The array is ``Tensor.array`` (reads and writes report to graph mode's trace hook of the current
thread); SINGA's ``Tensor.data`` is a ``BoundCTensor`` over it. In-place
operations rebind the handle to a new array. Besides its value, a Tensor carries SINGA's three
autograd attributes: ``creator``, ``requires_grad`` and ``stores_grad``. Operators and row/column
methods are made by small factories, one name per line in the class body.
"""
from __future__ import annotations

import builtins
import math
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.runtime import device as _device_mod
from singa_jax._src.runtime import sampling
from singa_jax._src.base.node import Dummy
from singa_jax._src.runtime.ctensor import BoundCTensor, CTensor
from singa_jax._src.base.modes import current_trace_hook as _current_hook
from singa_jax._src.base.modes import in_compile_time_eval, is_grad_enabled
from singa_jax._src.runtime.device import Device, get_default_device
from singa_jax._src.base.dtypes import float32, to_dtype
from singa_jax._src.backend.xla_options import kernel, no_trace_running
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.tensor.base import TensorBase, is_array
from singa_jax._src.tensor.operands import (binary, broadcast_shapes, as_line, operand, to_scalar,
                                            write_flat, copy_data_to_from, mult)


ShapeLike = Union[int, Sequence[int]]


def filled(shape: Tuple[int, ...], value: Any, dtype: Any, device: Device) -> jax.Array:
    """A new array of ``shape`` filled with ``value``, created directly on ``device``. With a
    concrete value on a CPU device outside any trace, or on any device in
    :func:`modes.compile_time_eval` (where ``Model.compile()`` builds parameters), NumPy fills
    it: ``jnp.full`` lowers and compiles a program for every new shape (0.3 s of a ResNet-50's
    ``Model.compile()``: 374 fills). Elsewhere the device fills it (no host copy to transfer;
    inside a trace, no constant baked in)."""
    jd, dtype = device.jax_device, to_dtype(dtype)
    if not isinstance(value, jax.core.Tracer) and (
            (jd.platform == "cpu" and no_trace_running()) or in_compile_time_eval()):
        return jax.device_put(np.full(shape, value, dtype), jd)
    return jnp.full(shape, value, dtype, device=jd)


def as_shape(shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


_tensor_names = [0]  # the next automatic tensor number (names ``Dummy#N``)


class CountView:
    """A read-only class attribute showing a module's counter (a one-element list): SINGA's
    ``Tensor.tensor_count`` and ``Operator.op_count``, kept outside the class because writing a
    class attribute per object would invalidate the interpreter's attribute caches of it."""

    def __init__(self, counter: list):
        self.counter = counter

    def __get__(self, obj: Any, cls: Any = None) -> int:
        return self.counter[0]


class InvalidIndex(IndexError, ValueError):
    """A bad index. SINGA raises ValueError; being an IndexError too ends ``for row in t``."""


# --- PyTorch-style autograd ---------------------------------------------------------------
# It lives in singa_jax._src.ops.torch_style, which sits above this module (it needs the engine
# and the operators) and plugs itself in here when imported; singa_jax's __init__ imports it.
_torch_style: Any = None

# Operators that run as autograd operators when an operand is tracked (``Tensor.tracked``).
_RECORDED_OPERATORS = frozenset({"add", "sub", "mul", "truediv", "pow", "matmul"})


def register_torch_style(module: Any) -> None:
    """Called by :mod:`singa_jax._src.ops.torch_style` on import: the implementation of the
    PyTorch-style methods (``backward``, ``requires_grad_``, recorded operators...)."""
    global _torch_style
    _torch_style = module


def _autograd() -> Any:
    if _torch_style is None:  # pragma: no cover - singa_jax's __init__ imports autograd
        raise RuntimeError("PyTorch-style autograd needs singa_jax.autograd; import it first")
    return _torch_style


def _tracked(lhs: "Tensor", other: Any) -> bool:
    """Whether an operand of ``lhs (op) other`` is tracked (depends on a PyTorch-style leaf):
    then the operator is PyTorch's (recorded while grad mode is on); otherwise it is SINGA's
    plain arithmetic."""
    return lhs.tracked or (isinstance(other, Tensor) and other.tracked)


# --- factories of Tensor's operator and row/column methods, bound by name in the class body ---

def _method(fn: Callable, name: str, doc: str) -> Callable:
    fn.__name__, fn.__qualname__, fn.__doc__ = name, f"Tensor.{name}", doc
    return fn


# Array methods that Tensor methods apply with one hashable argument (a shape, axes, a dtype,
# basic slices), as one cached kernel per (method, argument): eagerly JAX's reshape,
# transpose, astype and slicing run ~35-150 us of Python before their dispatch (an (8, 8)
# array, 2-core CPU), a jitted call ~10.
_LAYOUT_OPS = {"reshape": lambda x, shape: x.reshape(shape),
               "transpose": jnp.transpose,
               "astype": lambda x, dtype: x.astype(dtype),
               "getitem": lambda x, key: x[_slices(key)]}


@partial(kernel, static_argnums=(0, 1))
def _layout(name: str, arg: Any, x: jax.Array) -> jax.Array:
    """``x``'s ``name`` of :data:`_LAYOUT_OPS` with ``arg``, as one cached kernel."""
    return _LAYOUT_OPS[name](x, arg)


def _static_slices(index: Tuple[slice, ...]) -> Optional[Tuple[Tuple[Any, Any, Any], ...]]:
    """``index`` (slices) as a hashable key of ``(start, stop, step)`` ints or Nones, or None
    where a bound is something else."""
    key = []
    for s in index:
        bounds = (s.start, s.stop, s.step)
        if not all([b is None or type(b) is int for b in bounds]):
            if not all([b is None or isinstance(b, (int, np.integer)) for b in bounds]):
                return None
            bounds = tuple([None if b is None else int(b) for b in bounds])
        key.append(bounds)
    return tuple(key)


def _slices(key: Tuple[Tuple[Any, Any, Any], ...]) -> Tuple[slice, ...]:
    return tuple([slice(*bounds) for bounds in key])


@partial(kernel, static_argnums=0)
def _set_slices(key: Tuple[Tuple[Any, Any, Any], ...], x: jax.Array, value: Any) -> jax.Array:
    """``x`` with its region ``key`` (see :func:`_static_slices`) set to ``value`` in ``x``'s
    dtype, as one cached kernel (a Python scalar value an argument)."""
    return x.at[_slices(key)].set(jnp.asarray(value).astype(x.dtype))


def _operator(name: str, fn: Callable, reflected: bool = False) -> Callable:
    """``__<name>__``: ``fn(self, other)`` as a new tensor (NotImplemented for foreign types);
    with ``reflected``, ``__r<name>__``: ``fn(other, self)``."""
    op = f"__r{name}__" if reflected else f"__{name}__"
    recorded = name in _RECORDED_OPERATORS

    def forward(self, other):
        if recorded and _tracked(self, other):
            return _autograd().tracked_operator(name, self, other, reflected=reflected)
        arr = binary(op, fn, self, other, reflected=reflected)
        return arr if arr is NotImplemented else self._new(arr)
    return _method(forward, op, f"Elementwise ``{fn.__name__}`` with NumPy broadcasting.")


def _inplace_operator(name: str, fn: Callable) -> Callable:
    """``__i<name>__``: rebind to ``fn(self, other)``, keeping this tensor's shape and dtype."""
    op = f"__i{name}__"

    def inplace(self, other):
        if _tracked(self, other) and is_grad_enabled():
            _autograd().refuse_inplace(op, self, other)
        # The handle keeps its shape and dtype (SINGA updates its buffer); the array is rebound.
        arr = binary(op, fn, self, other, dtype=self.dtype)
        if arr is NotImplemented:
            return arr
        if tuple(arr.shape) != self.shape:
            raise ValueError(f"{op}: result of shape {tuple(arr.shape)} cannot be stored "
                             f"in place in a tensor of shape {self.shape}")
        self.array = arr
        return self
    return _method(inplace, op, f"Elementwise ``{fn.__name__}`` with NumPy broadcasting.")


def _comparison(name: str, fn: Callable) -> Callable:
    """``__<name>__``: ``fn(self, other)`` as 0/1 in this tensor's dtype."""
    op = f"__{name}__"

    def compare(self, other):
        if other is None:  # SINGA: ``t == None`` is False
            return name == "ne"
        arr = binary(op, fn, self, other, dtype=self.dtype)
        return arr if arr is NotImplemented else self._new(arr)
    return _method(compare, op, f"Elementwise ``{fn.__name__}``: 0/1 in this tensor's dtype.")


def _line_method(name: str, fn: Callable, axis: int) -> Callable:
    """In place ``M = fn(M, v)`` with ``v`` a column (axis 0) or row (axis 1) of the 2-d M."""
    def update(self, v: "Tensor") -> "Tensor":
        self.array = fn(self.array, as_line(name, self, v, axis)).astype(self.dtype)
        return self
    what = "column" if axis == 0 else "row"
    return _method(update, name,
                   f"In place: ``{fn.__name__}`` ``v`` with each {what} of this 2-d tensor.")


class Tensor(TensorBase):
    """SINGA's Tensor: a mutable handle over a ``jax.Array``.

    Args:
        shape: shape of a new (zero-filled) tensor when ``data`` is None.
        device: a :class:`~singa_jax.device.Device`; None for the default device.
        dtype: a SINGA dtype constant, NumPy or JAX dtype.
        data: a NumPy array, a ``jax.Array`` or another Tensor's array.
        requires_grad: whether autograd computes a gradient for it.
        stores_grad: whether ``autograd.backward`` yields its gradient (implies requires_grad).
        creator: the operator that produced it (a :class:`~singa_jax.autograd.Dummy` when None).
        name: a name (``Dummy#N`` when None).

    Operators (``+ - * / // ** @``, reflected and in-place forms, ``< <= > >= == !=``) follow
    NumPy broadcasting; comparisons give 0/1 in the left operand's dtype, as SINGA's do.
    """

    tensor_count = CountView(_tensor_names)  # SINGA's count of automatically named tensors
    __array_priority__ = 100  # make ndarray (op) Tensor defer to Tensor's reflected operators
    __array_ufunc__ = None    # ... for every NumPy operator, ufuncs included
    # PyTorch-style autograd (see singa_jax._src.ops.torch_style): True for a leaf made by
    # requires_grad_() / tensor.tensor(..., requires_grad=True) and for every result computed
    # from one with grad mode on. Only tracked tensors make Tensor operators record autograd
    # operators and make operators keep backward state outside training mode.
    tracked = False

    def __init__(self, shape: Tuple[int, ...] = (), device: Optional[Device] = None,
                 dtype: Any = float32, data: Any = None, requires_grad: bool = True,
                 stores_grad: bool = False, creator: Any = None, name: Optional[str] = None):
        if device is None:
            device = get_default_device()
        elif not isinstance(device, Device):
            raise TypeError(f"Tensor: device must be a singa_jax Device, got "
                            f"{type(device).__name__}")
        if data is None:
            shape = as_shape(shape)
            if any(s < 0 for s in shape):
                raise ValueError(f"Tensor: shape must have sizes >= 0, got {shape}")
            arr = filled(shape, 0, dtype, device)
        elif isinstance(data, Tensor):
            arr = data.array
        elif isinstance(data, CTensor):
            arr = data._array
        elif type(data) is Deferred:  # a value eager replay recorded: computed now
            arr = data.get()
        elif is_array(data):
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
            n = _tensor_names[0]
            _tensor_names[0] = n + 1
            self.name = f"Dummy#{n}"
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
    def array(self) -> jax.Array:
        """The ``jax.Array`` behind the handle. Every read and write of a Tensor's value goes
        through here (or through ``data``, which uses it), so graph mode's trace hook sees it."""
        hook = _current_hook()
        if hook is not None:
            hook.read(self)
        data = self._data
        if type(data) is Deferred:  # recorded by eager replay: its segment runs now
            data = self._data = data.get()
        return data

    @array.setter
    def array(self, value: Any) -> None:
        if isinstance(value, Tensor):
            value = value.array
        elif isinstance(value, CTensor):
            value = value._array
        if not is_array(value):
            value = self.device.put(np.asarray(value))
        hook = _current_hook()
        if hook is not None:
            hook.write(self)
        self._data = value

    @property
    def data(self) -> BoundCTensor:
        """SINGA's ``Tensor.data``: the C++ tensor, here a CTensor over this Tensor's array
        (``BoundCTensor``: in-place CTensor methods, ``singa_wrap``
        functions writing into it and ``t.data = ...`` all rebind this Tensor's array). JAX code
        wants ``t.array`` (or ``jnp.asarray(t.data)``) instead."""
        return BoundCTensor(self)

    @data.setter
    def data(self, value: Any) -> None:
        self.array = value

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self._data.shape)

    @shape.setter
    def shape(self, value: Sequence[int]) -> None:
        # SINGA keeps shape as a plain attribute that code re-assigns after rebinding ``data``
        # (``t.data = ctensor; t.shape = tuple(t.data.shape())``). Here it is the array's shape,
        # so an assignment may only restate it; anything else would describe a different tensor.
        if tuple(value) != self.shape:
            raise ValueError(f"Tensor {self.name}: cannot set shape {tuple(value)} on a tensor of "
                             f"shape {self.shape}; use reshape() or rebind .data")

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @dtype.setter
    def dtype(self, value: Any) -> None:
        if to_dtype(value) != self.dtype:  # as for shape: an assignment may only restate it
            raise ValueError(f"Tensor {self.name}: cannot set dtype {to_dtype(value)} on a "
                             f"{self.dtype} tensor; use as_type()")

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
        # SINGA's Tensor defines no truth value, so any Tensor is truthy (``if t:`` in SINGA code
        # means "if t is set"). Read a value with ``float(t)`` or ``tensor.to_numpy(t)``.
        return True

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        # a writable copy, as before; ``np.asarray(t, copy=False)`` (or ``np.from_dlpack(t)``)
        # gives a read-only view of the array without copying
        if copy is False:
            arr = np.asarray(self.array)
            if dtype is not None and arr.dtype != np.dtype(dtype):
                raise ValueError(f"Tensor.__array__: converting {arr.dtype} to {np.dtype(dtype)} "
                                 f"needs a copy, but copy=False was asked")
            return arr
        arr = np.array(self.array)
        return arr if dtype is None else arr.astype(dtype)

    # --- JAX interop: zero-copy exchange (see docs/jax_interop.md) ---------------------------
    def __jax_array__(self) -> jax.Array:
        """``jnp.asarray(t)``: the array behind the handle, without a copy."""
        return self.array

    def to_jax(self) -> jax.Array:
        """The ``jax.Array`` behind the handle (no copy; arrays are immutable, so later in-place
        operations on this tensor rebind it and leave the returned array unchanged)."""
        return self.array

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """DLPack export of the array (``np.from_dlpack(t)``, ``torch.from_dlpack(t)``)."""
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.array.__dlpack_device__()

    # --- PyTorch-style autograd: thin methods over singa_jax._src.ops.torch_style -------------
    @property
    def grad(self) -> Optional["Tensor"]:
        """The accumulated gradient (PyTorch's ``.grad``): None until a ``backward`` reaches this
        tensor; every later one adds to it. Assignable (a Tensor of this shape, or None)."""
        return self.__dict__.get("_grad")

    @grad.setter
    def grad(self, value: Optional["Tensor"]) -> None:
        _autograd().check_grad(self, value)
        self.__dict__["_grad"] = value

    @property
    def grad_fn(self) -> Any:
        """The operator that computed this tensor (its creator), or None for a leaf."""
        creator = self.creator
        return None if isinstance(creator, Dummy) else creator

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Make this leaf a PyTorch-style leaf whose gradient ``backward`` stores in ``.grad``
        (sets ``requires_grad``, ``stores_grad`` and ``tracked``), or undo it; returns self."""
        return _autograd().requires_grad_(self, requires_grad)

    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """PyTorch's ``backward``: accumulate the gradient of this tensor into the ``.grad`` of
        every tensor that stores its gradient; frees the graph unless ``retain_graph``."""
        _autograd().tensor_backward(self, grad, retain_graph)

    def detach(self) -> "Tensor":
        """A new leaf over the same array: no creator, ``requires_grad=False``."""
        return _autograd().detach(self)

    def zero_grad(self) -> None:
        """Set ``.grad`` to zeros (the same Tensor, rebound: graph mode keeps it as state)."""
        _autograd().zero_grad(self)

    def __repr__(self) -> str:
        """SINGA's form: the values as NumPy prints them, then the dtype's name
        (``[[1. 0.]\n [0. 1.]], float32``); the shape is ``t.shape``, the device
        ``t.device``. A value being traced (graph mode, ``jax.jit``) prints as such."""
        if isinstance(self._data, jax.core.Tracer):
            return f"<traced {self.shape}>, {np.dtype(self.dtype).name}"
        return f"{np.array2string(np.asarray(self.array))}, {np.dtype(self.dtype).name}"

    def __hash__(self) -> int:  # Tensors are compared by identity in dicts/sets (like SINGA)
        return id(self)

    def _new(self, arr: jax.Array) -> "Tensor":
        """A fresh Tensor over ``arr`` on this tensor's device (SINGA's default flags)."""
        return result_tensor(arr, self.device)

    # --- shape ------------------------------------------------------------------------------
    def reshape(self, shape: ShapeLike) -> "Tensor":
        """A new tensor with this tensor's values in ``shape`` (one entry may be -1)."""
        shape = as_shape(shape)
        known = math.prod(s for s in shape if s != -1)
        fits = (known == self.size() if -1 not in shape
                else shape.count(-1) == 1 and known and self.size() % known == 0)
        if not fits:
            raise ValueError(f"reshape: cannot reshape a tensor of shape {self.shape} "
                             f"({self.size()} elements) to {shape}")
        return self._new(_layout("reshape", shape, self.array))

    def transpose(self, axes: Optional[Sequence[int]] = None) -> "Tensor":
        """A new tensor with permuted axes (reversed when ``axes`` is None)."""
        if axes is not None:
            axes = tuple(int(a) % builtins.max(self.ndim(), 1) for a in axes)
            if sorted(axes) != list(range(self.ndim())):
                raise ValueError(f"transpose: axes {axes} are not a permutation of the "
                                 f"{self.ndim()} axes of a tensor of shape {self.shape}")
        return self._new(_layout("transpose", axes, self.array))

    def T(self) -> "Tensor":
        """The transpose (all axes reversed); SINGA's shallow transposed view."""
        return self.transpose()

    def contiguous(self) -> "Tensor":
        return self._new(self.array)

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
        return self._new(jnp.repeat(self.array, reps, axis=axis))

    def reset_like(self, t: "Tensor") -> None:
        """Make this tensor a zero tensor with ``t``'s shape, dtype and device."""
        self.device = t.device
        self.array = filled(t.shape, 0, t.dtype, t.device)

    # --- dtype and device -------------------------------------------------------------------
    def as_type(self, dtype: Any) -> "Tensor":
        """A new tensor with this tensor's values converted to ``dtype``."""
        return self._new(_layout("astype", to_dtype(dtype), self.array))

    def to_type(self, dtype: Any) -> "Tensor":
        """Convert this tensor to ``dtype`` in place; returns it."""
        self.array = _layout("astype", to_dtype(dtype), self.array)
        return self

    def to_device(self, device: Device) -> "Tensor":
        """Move this tensor's data onto ``device`` (in place); returns it."""
        if not isinstance(device, Device):
            raise TypeError(f"to_device: expected a singa_jax Device, got {type(device).__name__}")
        self.array = device.put(self.array)
        self.device = device
        return self

    def to_host(self) -> "Tensor":
        """Move this tensor's data onto the host (CPU) device; returns it."""
        return self.to_device(_device_mod.create_cpu_device())

    # --- norms ------------------------------------------------------------------------------
    def l1(self) -> float:
        """SINGA's L1: ``sum(|x|) / size``."""
        return to_scalar(jnp.sum(jnp.abs(self.array)) / self.size())

    def l2(self) -> float:
        """SINGA's L2: ``sqrt(sum(x**2)) / size`` (SINGA divides the norm by the size)."""
        return to_scalar(jnp.linalg.norm(self.array.ravel()) / self.size())

    # --- writing values ---------------------------------------------------------------------
    def set_value(self, x: Any, inplace: bool = True) -> "Tensor":
        """Fill with ``x``: this tensor (returned) if ``inplace``, else a new tensor."""
        if isinstance(x, Tensor):
            x = x.array
        return self._fill(filled(self.shape, x, self.dtype, self.device), inplace)

    def _fill(self, arr: jax.Array, inplace: bool) -> "Tensor":
        """Rebind this tensor to ``arr`` and return it, or (not inplace) a new tensor over it."""
        if not inplace:
            return self._new(arr)
        self.array = arr
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
        values = self.device.put(src.astype(self.dtype).reshape(-1), private=True)  # (a copy)
        self.array = write_flat(self.array, offset, values)

    def copy_data(self, t: "Tensor") -> None:
        """Copy ``t``'s values (same number of elements, any device) into this tensor."""
        if not isinstance(t, Tensor):
            raise TypeError(f"copy_data: expected a Tensor, got {type(t).__name__}")
        if t.size() != self.size():
            raise ValueError(f"copy_data: source of shape {t.shape} ({t.size()} elements) does not "
                             f"match this tensor of shape {self.shape} ({self.size()} elements)")
        self.array = self.device.put(t.array.reshape(self.shape).astype(self.dtype))

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
    # values, dtype and device, but SINGA's default flags and a fresh ``Dummy#N`` name; copy()
    # shares the storage (as C++ tensors share a memory block), clone()/deepcopy() do not.
    # Python's copy.copy/copy.deepcopy duplicate THIS object, flags and name included (what
    # copying a model or an optimizer state needs), with storage of its own.
    def clone(self) -> "Tensor":
        """A new tensor with this tensor's values, dtype and device, SINGA's default flags
        (``requires_grad=True``, ``stores_grad=False``) and a fresh automatic name."""
        return self._new(self.array)

    def copy(self) -> "Tensor":
        """SINGA's shallow copy: a new tensor (default flags, fresh name) sharing this tensor's
        storage, so an in-place op on either (``t += 1``) shows in both, as in SINGA."""
        view = self.clone()
        view.__class__ = SharedTensor
        view._storage = self._storage if isinstance(self, SharedTensor) else self
        del view.__dict__["_data"]
        return view

    def deepcopy(self) -> "Tensor":
        """SINGA's ``deepcopy``, "same as clone()": a new tensor with default flags and a fresh
        name. ``copy.deepcopy(t)`` instead keeps ``t``'s flags and name."""
        return self.clone()

    def _duplicate(self) -> "Tensor":
        """This tensor as another handle: same values, device, flags and name."""
        return Tensor(data=self.array, device=self.device, requires_grad=self.requires_grad,
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
        index = self._index(keys, "__getitem__")
        key = _static_slices(index)
        if key is None:  # (a slice of other than ints and None)
            return self._new(self.array[index])
        return self._new(_layout("getitem", key, self.array))

    def __setitem__(self, keys: Any, value: Any) -> None:
        index = self._index(keys, "__setitem__")
        target = tuple(len(range(*s.indices(n))) for s, n in zip(index, self.shape))
        target += self.shape[len(index):]
        v = operand("__setitem__", self, value)
        if v is NotImplemented:
            raise TypeError(f"__setitem__: cannot assign a {type(value).__name__}")
        if broadcast_shapes("__setitem__", target, jnp.shape(v)) != target:
            raise ValueError(f"__setitem__: value of shape {jnp.shape(v)} does not fit the "
                             f"selected region of shape {target}")
        key = _static_slices(index)
        self.array = (self.array.at[index].set(jnp.asarray(v).astype(self.dtype))
                      if key is None else _set_slices(key, self.array, v))

    # --- operators: NumPy broadcasting; NotImplemented for foreign types (see _binary) --------
    __add__ = _operator("add", jnp.add)
    __radd__ = _operator("add", jnp.add, reflected=True)
    __iadd__ = _inplace_operator("add", jnp.add)
    __sub__ = _operator("sub", jnp.subtract)
    __rsub__ = _operator("sub", jnp.subtract, reflected=True)
    __isub__ = _inplace_operator("sub", jnp.subtract)
    __mul__ = _operator("mul", jnp.multiply)
    __rmul__ = _operator("mul", jnp.multiply, reflected=True)
    __imul__ = _inplace_operator("mul", jnp.multiply)
    __truediv__ = _operator("truediv", jnp.true_divide)
    __rtruediv__ = _operator("truediv", jnp.true_divide, reflected=True)
    __itruediv__ = _inplace_operator("truediv", jnp.true_divide)
    __floordiv__ = _operator("floordiv", jnp.floor_divide)
    __rfloordiv__ = _operator("floordiv", jnp.floor_divide, reflected=True)
    __ifloordiv__ = _inplace_operator("floordiv", jnp.floor_divide)
    __pow__ = _operator("pow", jnp.power)
    __rpow__ = _operator("pow", jnp.power, reflected=True)
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
        if self.tracked:
            return _autograd().tracked_negative(self)
        return self._new(jnp.negative(self.array))

    def __pos__(self) -> "Tensor":
        return self._new(self.array)

    def __abs__(self) -> "Tensor":
        return self._new(jnp.abs(self.array))

    def __matmul__(self, other: "Tensor") -> "Tensor":
        if _tracked(self, other):
            return _autograd().tracked_operator("matmul", self, other, reflected=False)
        return mult(self, other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        if _tracked(self, other):
            return _autograd().tracked_operator("matmul", self, other, reflected=True)
        if not isinstance(other, Tensor):
            other = Tensor(data=jnp.asarray(other), device=self.device)
        return mult(other, self)

    # --- SINGA's deprecated row/column updates (in place; v has one entry per row/column) -----
    # v may have shape (n,), (n, 1) or (1, n)
    add_column = _line_method("add_column", jnp.add, axis=0)
    add_row = _line_method("add_row", jnp.add, axis=1)
    div_column = _line_method("div_column", jnp.true_divide, axis=0)
    div_row = _line_method("div_row", jnp.true_divide, axis=1)
    mult_column = _line_method("mult_column", jnp.multiply, axis=0)
    mult_row = _line_method("mult_row", jnp.multiply, axis=1)


class SharedTensor(Tensor):
    """What :meth:`Tensor.copy` returns: a Tensor whose array is its storage tensor's, read and
    rebound through it (a SINGA shallow copy shares the C++ memory block)."""

    @property
    def _data(self) -> jax.Array:
        return self._storage._data

    @_data.setter
    def _data(self, value: jax.Array) -> None:
        self._storage._data = value


def result_tensor(array: jax.Array, device: Device, requires_grad: bool = True,
                  creator: Any = None, name: Optional[str] = None,
                  placed: bool = False) -> Tensor:
    """``Tensor(data=array, device=device, requires_grad=..., creator=..., name=...)`` for an
    array an op or a pullback just computed (or a tracer), without the general constructor's
    argument parsing (autograd makes one per op output and per gradient). ``placed`` says the
    array is on ``device`` already (a kernel's output from inputs all on it: a Tensor's array
    lives on its device), which skips the check that would move it. A leaf's Dummy creator is
    made when first asked for, as for graph mode's results."""
    t = object.__new__(Tensor)
    if name is None:
        n = _tensor_names[0]
        _tensor_names[0] = n + 1
        name = f"Dummy#{n}"
    # (one attribute at a time, in __init__'s order: the values stay in the instance's
    # shared-key storage, no dict object is made)
    t._data = array if placed else device.put(array)
    t.device = device
    t.requires_grad = bool(requires_grad)
    t.stores_grad = False
    t.name = name
    if creator is not None:
        t.creator = creator
    hook = _current_hook()
    if hook is not None:
        hook.created(t)
    return t


PlaceHolder = Tensor  # SINGA's alias

