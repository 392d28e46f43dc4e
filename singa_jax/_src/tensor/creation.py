"""SINGA's tensor functions that make Tensors or read them out: from NumPy, JAX, DLPack and
CTensors, filled tensors, and host copies."""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import jax
import numpy as np

from singa_jax._src.base.dtypes import float32, to_dtype
from singa_jax._src.runtime.ctensor import CTensor
from singa_jax._src.runtime.device import Device, device_of, get_default_device
from singa_jax._src.runtime.mesh import host_value
from singa_jax._src.tensor.operands import check_tensor
from singa_jax._src.tensor.tensor import ShapeLike, Tensor, as_shape, filled

__all__ = ["from_raw_tensor", "from_raw_tensors", "from_numpy", "tensor", "from_jax",
           "from_dlpack", "to_numpy", "to_host", "copy_from_numpy", "zeros", "ones", "random",
           "zeros_like", "ones_like"]


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
