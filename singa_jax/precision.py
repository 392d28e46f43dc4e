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
from singa_jax._src.backend.precision import (
    set_float32_matmul_precision as set_float32_matmul_precision,
    float32_matmul_precision as float32_matmul_precision,
    float32_matmul_precision_scope as float32_matmul_precision_scope,
    float32_matmul_arithmetic as float32_matmul_arithmetic, SETTINGS as SETTINGS)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "set_float32_matmul_precision", "float32_matmul_precision",
    "float32_matmul_precision_scope", "float32_matmul_arithmetic", "SETTINGS"]

_publish(__name__, __all__)
