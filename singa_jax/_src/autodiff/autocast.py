"""Automatic mixed precision (``autograd.autocast``): which operators compute in bfloat16 / float16,
which in float32.

    with autograd.autocast("bfloat16"):          # or Model.compile(..., autocast="bfloat16")
        out = model(x)
        loss = autograd.softmax_cross_entropy(out, y)
        sgd(loss)

Inside the block an operator of the policy below casts its floating inputs *inside its kernel*
(so the cast is part of the compiled forward and its pullback): the forward computes in the
policy's dtype, and the gradient of each input comes back in that input's own dtype -- a float32
parameter gets a float32 gradient. Nothing outside the kernels changes: parameters, optimizer
slots and checkpoints stay what they are (float32 master weights), and layers created inside
the block make float32 parameters even when their input is a half-precision activation.

The policy, by operator class (:data:`POLICY`, declared by each op family with :func:`declare`):

* ``COMPUTE`` -- the products, where half precision is fast: matmul, Gemm, AddBias (so a Linear
  layer's output, logits included, is in the compute dtype), convolutions, the RNN kernel.
  Floating inputs are cast to the compute dtype; outputs are in it.
* ``FLOAT32`` -- numerically sensitive: softmax, exp/log/pow and their kin, the reductions
  (sum, mean, global average pooling), cosine similarity, every loss. Half-precision inputs
  are cast up; outputs are float32.
* ``NORMALISE`` -- batch normalisation: statistics and normalisation in float32, the output
  back in the input's dtype (the running statistics stay float32).
* any other operator runs in its inputs' dtypes (JAX's promotion: bfloat16 + float32 gives
  float32; ReLU of bfloat16 is bfloat16).

float16 also needs loss scaling (its range ends at 65504; small gradients underflow): an
optimizer called inside a float16 block scales the loss, unscales the gradients and skips the
step when they overflow (see ``singa_jax.opt``: the non-finite guard).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from singa_jax._src.base import modes

__all__ = ["autocast", "COMPUTE", "FLOAT32", "NORMALISE", "POLICY", "compute_dtype",
           "declare", "cast_kernel"]

COMPUTE, FLOAT32, NORMALISE = "compute", "float32", "normalise"

# the compute dtypes autocast accepts, by every name it accepts them under
_DTYPES = {"bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16, "float16": jnp.float16,
           "half": jnp.float16, "fp16": jnp.float16}
_ALLOWED = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))

# category -> names of the operator classes in it (filled by declare)
POLICY: Dict[str, Tuple[str, ...]] = {}


def compute_dtype(value: Any, where: str = "autocast") -> Optional[np.dtype]:
    """``value`` ('bfloat16', 'float16', a NumPy/JAX dtype or SINGA's ``tensor.float16``) as the
    NumPy dtype autocast computes in; None stays None (no autocast). A ValueError names
    ``where`` and what is accepted."""
    if value is None or value is False:
        return None
    try:
        dtype = np.dtype(_DTYPES.get(value, value) if isinstance(value, str) else value)
    except TypeError:
        dtype = None
    if dtype not in _ALLOWED:
        raise ValueError(f"{where}: autocast={value!r} is not a compute dtype; expected "
                         f"'bfloat16', 'float16' or None")
    return dtype


class autocast(modes.autocast_mode):
    """``with autograd.autocast("bfloat16"):`` -- the operators of the policy (see
    :mod:`singa_jax._src.autodiff.autocast`) compute in bfloat16 inside the block (this thread
    only); ``autocast("float16")`` in float16 with loss scaling in the optimizer;
    ``autocast(None)`` turns autocast off inside. Also a decorator."""

    def __init__(self, dtype: Any = "bfloat16"):
        super().__init__(compute_dtype(dtype, "autograd.autocast"))


# --------------------------------------------------------------------------------------------
# the cast kernels
# --------------------------------------------------------------------------------------------
_WRAPPED: Dict[Tuple, Callable] = {}


def cast_kernel(fn: Callable, category: str, dtype: np.dtype, n_inputs: int) -> Callable:
    """``fn`` with its first ``n_inputs`` floating arguments cast as ``category`` says under the
    compute dtype ``dtype`` (the arguments after them -- declared reads, a PRNG key -- pass as
    they are). Cached, so that each wrapper is one stable static argument of the jitted
    kernels."""
    key = (fn, category, dtype, n_inputs)
    wrapped = _WRAPPED.get(key)
    if wrapped is None:
        wrapped = _WRAPPED[key] = _wrap(fn, category, dtype, n_inputs)
    return wrapped


def _is_float(a: Any) -> bool:
    return jnp.issubdtype(a.dtype, jnp.floating)


def _wrap(fn: Callable, category: str, dtype: np.dtype, n: int) -> Callable:
    if category == COMPUTE:
        def cast(a):
            return a.astype(dtype) if _is_float(a) and a.dtype != dtype else a
    else:  # FLOAT32, NORMALISE: half precision up to float32 (float64 stays)
        def cast(a):
            return a.astype(jnp.float32) if _is_float(a) and a.dtype.itemsize < 4 else a

    def run(*args: Any, **static: Any) -> Any:
        out = fn(*[cast(a) if i < n else a for i, a in enumerate(args)], **static)
        if category != NORMALISE or not n or not _is_float(args[0]):
            return out
        back = args[0].dtype  # the normalised output in its input's dtype; state stays float32
        if isinstance(out, tuple):
            return (out[0].astype(back),) + out[1:]
        return out.astype(back)

    run.__name__ = f"{getattr(fn, '__name__', 'kernel')}_autocast_{category}"
    run.autocast = (category, dtype)  # read by the ONNX export (its Cast nodes)
    return run


# --------------------------------------------------------------------------------------------
# the policy, declared beside the op classes
# --------------------------------------------------------------------------------------------
def declare(category: str, *classes: type) -> None:
    """Give each operator class of ``classes`` the autocast ``category`` (its
    ``autocast_policy``, read by the operator kit) and list it in :data:`POLICY`; each op family
    declares its own classes where it defines them."""
    if category not in (COMPUTE, FLOAT32, NORMALISE):
        raise ValueError(f"autocast.declare: category must be one of {COMPUTE!r}, {FLOAT32!r}, "
                         f"{NORMALISE!r}; got {category!r}")
    for cls in classes:
        cls.autocast_policy = category
    POLICY[category] = POLICY.get(category, ()) + tuple(cls.__name__ for cls in classes)
