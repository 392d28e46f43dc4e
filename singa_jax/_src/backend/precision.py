"""The float32 matmul precision policy behind :mod:`singa_jax.precision` (the policy itself is
described there): JAX's ``jax_default_matmul_precision`` read and set, named per backend, and
what a setting means on a device."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import jax

__all__ = ["set_float32_matmul_precision", "float32_matmul_precision",
           "float32_matmul_precision_scope", "float32_matmul_arithmetic", "SETTINGS"]

# Each accepted setting and its class: what XLA computes a float32 product in under it
# ("default" is the backend's own choice; see float32_matmul_arithmetic).
SETTINGS = {
    "default": "default", "fastest": "default", "bfloat16": "default",
    "high": "high", "tensorfloat32": "high", "bfloat16_3x": "high",
    "highest": "highest", "float32": "highest",
}

try:  # the value in force for this thread: a jax.default_matmul_precision block, else global
    from jax._src.config import default_matmul_precision as _state

    def _current() -> Optional[str]:
        return _state.value
except ImportError:  # pragma: no cover -- a JAX without the internal state: the global value
    def _current() -> Optional[str]:
        return jax.config.jax_default_matmul_precision


def _checked(setting: Optional[str], where: str) -> Optional[str]:
    if setting is None:
        return None
    name = str(setting).lower()
    if name not in SETTINGS:
        raise ValueError(f"{where}: unknown float32 matmul precision {setting!r}; expected "
                         f"None or one of {sorted(SETTINGS)}")
    return name


def set_float32_matmul_precision(setting: Optional[str]) -> None:
    """Set the process's float32 matmul/convolution precision (JAX's
    ``jax_default_matmul_precision``): ``"float32"`` for exact float32 on every backend,
    ``"default"`` or None for the backend's choice (TF32 on NVIDIA GPUs)."""
    name = _checked(setting, "set_float32_matmul_precision")
    jax.config.update("jax_default_matmul_precision", None if name == "default" else name)


def float32_matmul_precision() -> str:
    """The setting in force in this thread (``"default"`` when none is set)."""
    return _current() or "default"


@contextlib.contextmanager
def float32_matmul_precision_scope(setting: Optional[str]) -> Iterator[None]:
    """``with float32_matmul_precision_scope("float32"):`` -- the setting for this thread, in the
    block (``jax.default_matmul_precision``)."""
    name = _checked(setting, "float32_matmul_precision_scope")
    with jax.default_matmul_precision(None if name == "default" else name):
        yield


def float32_matmul_arithmetic(device: Any = None, setting: Optional[str] = None) -> str:
    """What a float32 matmul or convolution computes in on ``device`` (a singa_jax Device, a
    jax.Device, a platform name or None for the default backend's first device) under
    ``setting`` (None: the one in force): ``"float32"``, ``"tensorfloat32"``, ``"bfloat16"``
    (one pass) or ``"bfloat16_3x"``."""
    name = _checked(setting, "float32_matmul_arithmetic") or float32_matmul_precision()
    level = SETTINGS.get(name)
    if level is None:  # a dot-algorithm preset set through JAX: it names its own arithmetic
        return name
    if level == "highest":
        return "float32"
    platform, capability = _platform_of(device)
    if platform == "tpu":
        return "bfloat16" if level == "default" else "bfloat16_3x"
    if platform in ("gpu", "cuda") and _has_tf32(capability):
        return "tensorfloat32"
    return "float32"  # XLA:CPU, and GPUs without TF32 units, compute float32 products


def _platform_of(device: Any):
    if device is None:
        device = jax.devices()[0]
    elif isinstance(device, str):
        return device.lower(), None
    device = getattr(device, "jax_device", device)  # a singa_jax Device
    return device.platform, getattr(device, "compute_capability", None)


def _has_tf32(capability: Optional[str]) -> bool:
    """NVIDIA GPUs have TF32 from compute capability 8.0 (Ampere); unknown: assume so."""
    try:
        return float(capability) >= 8.0
    except (TypeError, ValueError):
        return True
