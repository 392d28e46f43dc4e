"""SINGA's ``tensor`` module on JAX.

A :class:`Tensor` is a mutable handle over an immutable ``jax.Array`` (``Tensor.data``). In-place
operations rebind the handle to a new array. Besides its value, a Tensor carries SINGA's three
autograd attributes: ``creator`` (the operator that produced it), ``requires_grad`` and
``stores_grad``.

Arithmetic on Tensors here is plain computation (as in SINGA): it does not record the autograd
graph; the functions of :mod:`singa_jax.autograd` do.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import device as _device_mod
from .device import Device, get_default_device

# SINGA's dtype constants are NumPy dtypes here, so they compare equal to NumPy and JAX dtypes.
float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
bfloat16 = jnp.dtype(jnp.bfloat16)
int8 = np.dtype("int8")
int16 = np.dtype("int16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
bool_ = np.dtype("bool")

# SINGA's C++ enum values (core.proto DataType), accepted wherever a dtype is.
_SINGA_DTYPE_CODES = {0: float32, 1: float16, 2: int32, 3: int8, 4: float64, 5: int64}
_SINGA_DTYPE_NAMES = {v: k for k, v in _SINGA_DTYPE_CODES.items()}


def to_dtype(dtype: Any) -> np.dtype:
    """Resolve a SINGA dtype code, a NumPy/JAX dtype or a dtype name to a NumPy dtype."""
    if dtype is None:
        return float32
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) in _SINGA_DTYPE_CODES:
            return _SINGA_DTYPE_CODES[int(dtype)]
        raise TypeError(f"unknown SINGA dtype code {dtype}; known: {sorted(_SINGA_DTYPE_CODES)}")
    try:
        return jnp.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"unknown dtype {dtype!r}: expected a NumPy/JAX dtype, a dtype name or a "
                        f"SINGA dtype constant") from e


def singa_dtype_code(dtype: Any) -> int:
    """SINGA's C++ enum value of ``dtype`` (for SINGA's checkpoint format)."""
    return _SINGA_DTYPE_NAMES.get(to_dtype(dtype), 0)


class TraceHook:
    """Observer that graph mode installs while it traces a step (see :mod:`singa_jax.graph`).

    It learns which pre-existing Tensors a step reads and rebinds, and which Tensors it creates,
    so that every piece of state enters and leaves the compiled program as data.
    """

    def read(self, t: "Tensor") -> None: ...

    def write(self, t: "Tensor") -> None: ...

    def created(self, t: "Tensor") -> None: ...


_hook: Optional[TraceHook] = None


def set_trace_hook(hook: Optional[TraceHook]) -> Optional[TraceHook]:
    """Install ``hook`` (None to remove); returns the previous one."""
    global _hook
    prev, _hook = _hook, hook
    return prev


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer))


class Tensor:
    """SINGA's Tensor: a mutable handle over a ``jax.Array``.

    Args:
        shape: shape of a new (zero-filled) tensor when ``data`` is None.
        device: a :class:`~singa_jax.device.Device`; None for the default device.
        dtype: a SINGA dtype constant, NumPy or JAX dtype.
        data: a NumPy array, a ``jax.Array`` or another Tensor's array.
        requires_grad: whether autograd computes a gradient for it.
        stores_grad: whether ``autograd.backward`` yields its gradient (implies requires_grad).
        creator: the operator that produced it (an ``autograd.Dummy`` when None).
        name: a name (``Dummy#N`` when None).
    """

    tensor_count = 0
    __array_priority__ = 100  # make ndarray (op) Tensor defer to Tensor's reflected operators

    def __init__(self, shape: Tuple[int, ...] = (), device: Optional[Device] = None,
                 dtype: Any = float32, data: Any = None, requires_grad: bool = True,
                 stores_grad: bool = False, creator: Any = None, name: Optional[str] = None):
        if device is None:
            device = get_default_device()
        elif not isinstance(device, Device):
            raise TypeError(f"Tensor: device must be a singa_jax Device, got {type(device).__name__}")
        if data is None:
            arr = jnp.zeros(tuple(int(s) for s in shape), to_dtype(dtype))
        elif isinstance(data, Tensor):
            arr = data.data
        elif _is_array(data):
            arr = data
        else:
            arr = np.asarray(data)
            if dtype is not None and data is not None and not isinstance(data, np.ndarray):
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
            from .autograd.engine import Dummy
            creator = Dummy(self, name)
        self.creator = creator
        if _hook is not None:
            _hook.created(self)

    # --- the array behind the handle --------------------------------------------------------
    @property
    def data(self) -> jax.Array:
        if _hook is not None:
            _hook.read(self)
        return self._data

    @data.setter
    def data(self, value) -> None:
        if isinstance(value, Tensor):
            value = value.data
        if not _is_array(value):
            value = self.device.put(np.asarray(value))
        if _hook is not None:
            _hook.write(self)
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
        return int(self._data.size) * self._data.dtype.itemsize

    def is_dummy(self) -> bool:
        return self.name.startswith("Dummy#")

    def is_empty(self) -> bool:
        return self.ndim() == 0

    def is_transpose(self) -> bool:
        return False  # arrays are always materialised in row-major order

    def __len__(self) -> int:
        if self.ndim() == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        if isinstance(self._data, jax.core.Tracer):
            return f"Tensor(traced, shape={self.shape}, dtype={self.dtype})"
        return f"Tensor({np.asarray(self._data)!r}, device={self.device})"

    def __hash__(self) -> int:  # Tensors are compared by identity in dicts/sets (like SINGA)
        return id(self)


def from_raw_tensor(t: jax.Array) -> Tensor:
    """A Tensor over the array ``t`` (SINGA wraps a CTensor)."""
    return Tensor(data=t, device=_device_of(t))


def from_raw_tensors(tt) -> list:
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
    """A Tensor holding a copy of ``np_array`` (float64 becomes float32, int64 int32 as in SINGA)."""
    a = np.asarray(np_array)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    elif a.dtype == np.int64:
        a = a.astype(np.int32)
    return Tensor(data=a, device=dev, dtype=a.dtype)


def to_numpy(t: Tensor) -> np.ndarray:
    """A NumPy copy of ``t``'s value."""
    return np.asarray(t.data)
