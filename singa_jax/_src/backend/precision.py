"""The float32 matrix-product precision policy: what a float32 convolution or matmul computes in.

XLA decides, per backend, how a float32 ``dot`` or convolution is computed when the program
does not say: exact float32 on CPU, TF32 on NVIDIA GPUs from Ampere on (a 10-bit mantissa for
the products, float32 sums -- what PyTorch's cuDNN convolutions do by default), one bfloat16
pass on TPU. singa_jax keeps that default -- it is what makes GPU and TPU fast -- and has ONE
switch for it, which is JAX's own ``jax_default_matmul_precision`` (so a JAX user's setting,
``JAX_DEFAULT_MATMUL_PRECISION=highest`` or ``with jax.default_matmul_precision('float32'):``,
is honoured as it is):

    from singa_jax import precision
    precision.set_float32_matmul_precision("float32")   # full float32 everywhere, this process
    with precision.float32_matmul_precision_scope("float32"):   # ... or in a block (this thread)
        ...

Every operator, eager kernel and graph-mode step traced while a setting is in force uses it;
a compiled graph-mode step is keyed by it, so changing it compiles the step again. Eager
kernels are ``jax.jit`` functions, whose own cache is keyed by it too.

Values (JAX's names): ``"default"`` (or None) the backend's choice; ``"float32"`` /
``"highest"`` exact float32; ``"tensorfloat32"`` / ``"high"`` TF32 on NVIDIA GPUs, three
bfloat16 passes on TPU; ``"bfloat16"`` one bfloat16 pass (TPU's default). On CPU every value
computes float32. :func:`float32_matmul_arithmetic` says what a setting means on a device.
"""
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
