"""Tolerances per backend and precision, and TF32 emulated on the CPU.

A float32 matmul or convolution computes in float32 on CPU, in TF32 on NVIDIA GPUs by default
and in bfloat16 on TPU (``singa_jax.precision``). A test comparing such a result with an exact
reference states its float32 tolerance and takes it through :func:`matmul_tolerance`, which
widens it to what the arithmetic in force can reach -- the tests then hold on every backend at
the default precision, and stay tight where the arithmetic is float32.

``SINGA_JAX_EMULATE_TF32=1`` makes XLA:CPU compute every float32 dot and convolution the way an
NVIDIA GPU's TF32 units do (each operand rounded to 10 mantissa bits, products summed in
float32), unless the program asked for ``highest`` precision: the CPU proxy for a GPU run of
the suite (conftest.py installs it; ``tests/test_precision.py`` runs a part of the suite so).
"""
from __future__ import annotations

import os
from typing import Dict

import jax
import jax.numpy as jnp
from jax import lax

from singa_jax import precision

EMULATE_TF32_ENV = "SINGA_JAX_EMULATE_TF32"

# (rtol, atol) floors for a comparison with an exact reference after a few products and sums,
# per arithmetic: TF32 rounds each operand to 2^-11 relative, bfloat16 to 2^-8.
_FLOORS = {"float32": (0.0, 0.0), "tensorfloat32": (1e-2, 1e-2), "bfloat16_3x": (1e-4, 1e-4),
           "bfloat16": (5e-2, 5e-2)}


def emulating_tf32() -> bool:
    return os.environ.get(EMULATE_TF32_ENV, "") not in ("", "0")


def arithmetic() -> str:
    """What a float32 product computes in for this test run (the emulation included)."""
    found = precision.float32_matmul_arithmetic()
    if found == "float32" and emulating_tf32() and precision.float32_matmul_precision() not in (
            "highest", "float32"):
        return "tensorfloat32"
    return found


def matmul_tolerance(rtol: float, atol: float = 0.0) -> Dict[str, float]:
    """``dict(rtol=, atol=)`` for a float32 result through matmuls/convolutions compared with
    an exact reference: the float32 ``rtol``/``atol`` given, widened to the arithmetic in
    force (TF32: 1e-2; one bfloat16 pass: 5e-2)."""
    floor_r, floor_a = _FLOORS.get(arithmetic(), _FLOORS["bfloat16"])
    return {"rtol": max(rtol, floor_r), "atol": max(atol, floor_a)}


def two_programs_tolerance(rtol: float, atol: float = 0.0) -> Dict[str, float]:
    """``dict(rtol=, atol=)`` for two float32 results of the SAME computation by two different
    programs (eager vs graph mode, a replayed step vs op by op, a quick vs an optimised
    compilation, a wrapping optimizer vs the wrapped one): the float32 ``rtol``/``atol`` given
    where float32 products are float32 (the programs then differ by rounding order alone);
    widened like :func:`matmul_tolerance` on a reduced-precision backend, where each program's
    products are rounded on their own (XLA:GPU picks a dot/convolution algorithm per program
    and shape and may fold a small product into an exact float32 fusion), so that the two
    differ by up to the arithmetic's error, compounded over the few steps compared."""
    return matmul_tolerance(rtol, atol)


def reduced_precision() -> bool:
    """Whether float32 products are computed with fewer mantissa bits than float32's."""
    return arithmetic() != "float32"


# --- TF32 on XLA:CPU -------------------------------------------------------------------------
_HIGHEST = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
_installed = False


def to_tf32(x: jax.Array) -> jax.Array:
    """``x`` (float32) rounded to TF32's 10 mantissa bits, to nearest even."""
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    half_ulp = jnp.uint32(0xFFF) + ((bits >> 13) & 1)
    rounded = lax.bitcast_convert_type((bits + half_ulp) & jnp.uint32(0xFFFFE000), jnp.float32)
    return jnp.where(jnp.isfinite(x), rounded, x)


def _uses_tf32(precision_param) -> bool:
    if precision_param is None:
        return True
    if isinstance(precision_param, tuple) and all(isinstance(p, lax.Precision)
                                                  for p in precision_param):
        return any(p != lax.Precision.HIGHEST for p in precision_param)
    return False  # an explicit dot algorithm: computed as it says


def install_tf32_emulation() -> None:
    """Lower every float32 dot_general and conv_general_dilated on CPU as TF32 does (see the
    module docstring). Uses JAX's lowering registry (internal): call before anything compiles."""
    global _installed
    if _installed:
        return
    from jax._src.interpreters import mlir
    from jax._src.lax import convolution
    from jax._src.lax import lax as lax_internal

    for prim in (lax_internal.dot_general_p, convolution.conv_general_dilated_p):
        entry = mlir._platform_specific_lowerings["cpu"].get(prim) or mlir._lowerings[prim]
        exact_rule = entry.rule

        def rounded(lhs, rhs, _prim=prim, **params):
            # HIGHEST: the inner primitive lowers with the exact rule (no recursion)
            return _prim.bind(to_tf32(lhs), to_tf32(rhs), **dict(params, precision=_HIGHEST))

        def rule(ctx, lhs, rhs, _exact=exact_rule, _rounded=mlir.lower_fun(
                rounded, multiple_results=False), **params):
            if (_uses_tf32(params.get("precision"))
                    and all(a.dtype == jnp.float32 for a in ctx.avals_in)):
                return _rounded(ctx, lhs, rhs, **params)
            return _exact(ctx, lhs, rhs, **params)

        mlir.register_lowering(prim, rule, platform="cpu")
    _installed = True
