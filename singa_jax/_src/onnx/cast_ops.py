"""The import op table, casting family: Cast and CastLike, ONNX's 8-, 4- and 2-bit element
types included. Same calling convention as :mod:`.registry`.

JAX holds every one of these types as an array type (``ml_dtypes``: float8_e4m3fn,
float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu, float4_e2m1fn, int4, uint4, int2,
uint2), unpacked one element a byte on the host, which is how ``onnx.numpy_helper.to_array``
hands them over. A plain ``astype`` already rounds to nearest even like ml_dtypes (onnx's
reference casts with ml_dtypes); what ONNX adds, and this file implements:

* ``saturate`` (default 1) for the four float8 types: out-of-range values and +/-Inf clamp to
  the type's largest finite value (NaN stays NaN); ``saturate=0`` is the plain conversion
  (E4M3FN, E4M3FNUZ and E5M2FNUZ overflow to NaN, E5M2 to +/-Inf).
* float8e8m0 (a power of two, 2**(e - 127)): ONNX's own rounding of the float32 exponent by
  ``round_mode`` (``up``, ``down``, ``nearest``) and ``saturate``, bit for bit as
  ``onnx.numpy_helper.to_float8e8m0``.
* int4, uint4, int2, uint2 from floats: truncate to an integer, then keep the low bits (two's
  complement), as ml_dtypes converts; XLA alone would clamp to the type's range.
"""
from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from onnx import helper

from singa_jax._src.onnx.registry import NodeCall, jax_dtype, register

__all__ = ["LOW_BIT_TYPES", "FLOAT8_TYPES", "ROUND_MODES", "cast_to"]

#: float8 types that ONNX Cast's ``saturate`` clamps (E8M0 has its own rule, see _to_e8m0)
FLOAT8_TYPES = frozenset(np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                               ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz))
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)
SUB_BYTE_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
                                                ml_dtypes.uint2))
#: ONNX's 8-, 4- and 2-bit element types other than (u)int8: singa_jax holds them as they are
LOW_BIT_TYPES = FLOAT8_TYPES | SUB_BYTE_INTS | {E8M0, FLOAT4}
ROUND_MODES = ("up", "down", "nearest")


def cast_to(x: Any, dtype: Any, saturate: bool = True, round_mode: str = "up") -> Any:
    """``x`` converted to ``dtype`` by ONNX Cast's rules (onnx/reference/ops/op_cast.py):

    * to float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ) with ``saturate``:
      ``clip(x, -max, max)`` then round to nearest even (NaN stays NaN);
    * to float8e8m0: :func:`_to_e8m0` (``saturate``, ``round_mode``);
    * to int4/uint4/int2/uint2 from a float: :func:`_float_to_sub_byte_int`;
    * anything else, float4e2m1 included: the plain conversion (``astype``), which XLA rounds
      as ml_dtypes does.
    """
    dtype = np.dtype(dtype)
    if dtype in FLOAT8_TYPES and saturate:
        return _saturate_float8(x, dtype)
    if dtype == E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if dtype in SUB_BYTE_INTS and jnp.issubdtype(x.dtype, jnp.floating):
        return _float_to_sub_byte_int(x, dtype)
    # float4e2m1 included: the plain conversion rounds to nearest even and saturates at +/-6
    # (no Inf); NaN gives -0 here, a zero in the reference too (ml_dtypes: -0 for +NaN, +0 for
    # -NaN), which the node tests check, though onnx's float4 notes say 6
    return x.astype(dtype)


def _wide(x: Any) -> Any:
    """``x`` as float32 (float64 stays): a float8 or float4 source could not hold another
    float8 type's limit (240 is no E5M2 value), and E8M0's rounding reads float32 bits. Exact
    for every narrower type, so rounding once from here equals rounding from the source."""
    return x if x.dtype == np.float64 else x.astype(jnp.float32)


def _saturate_float8(x: Any, dtype: np.dtype) -> Any:
    """Saturating float8 conversion: ``round_to_nearest_even(clip(x, -max, max))``; Inf ->
    +/-max, NaN -> NaN (``onnx.numpy_helper.saturate_cast``)."""
    limit = float(ml_dtypes.finfo(dtype).max)
    return jnp.clip(_wide(x), -limit, limit).astype(dtype)


def _to_e8m0(x: Any, saturate: bool, round_mode: str) -> Any:
    """float8e8m0 (value ``2**(e - 127)``, no sign, no zero; 0xFF is NaN) from the float32
    exponent field ``e`` of ``x``, bit for bit as ``onnx.numpy_helper.to_float8e8m0``:

    * Inf and NaN -> 0xFF (NaN) -- the reference's result, which the node tests check; the
      spec's table says E8M0_MAX for Inf with saturate;
    * ``up``: ``e + 1`` when the mantissa is not zero; ``down``: ``e``; ``nearest``:
      ``e + 1`` when mantissa bit 22 is set and (bit 21, bits 0-20 or ``e > 0``) is too;
    * ``saturate``: no rounding up from 0xFE (2**127), else it gives 0xFF (NaN);
    * the sign is ignored (ONNX: negative inputs are undefined) and 0 gives 0x00 (2**-127).
    """
    bits = lax.bitcast_convert_type(_wide(x).astype(jnp.float32), jnp.uint32)
    exponent = (bits >> 23) & 0xFF
    special = exponent == 0xFF
    if round_mode == "up":
        round_up = (bits & 0x7FFFFF) != 0
    elif round_mode == "nearest":
        guard = (bits & 0x400000) != 0
        round_up = guard & (((bits & 0x200000) != 0) | ((bits & 0x1FFFFF) != 0) | (exponent > 0))
    elif round_mode == "down":
        round_up = jnp.zeros(bits.shape, jnp.bool_)
    else:  # _check_cast rejects it before running; kept for direct callers
        raise ValueError(f"round_mode {round_mode!r}: expected one of {ROUND_MODES}")
    if saturate:
        round_up = round_up & (exponent != 0xFE)
    exponent = exponent + round_up.astype(jnp.uint32)  # at most 0xFE + 1: fits the byte
    out = jnp.where(special, jnp.uint32(0xFF), exponent).astype(jnp.uint8)
    return lax.bitcast_convert_type(out, E8M0)


def _float_to_sub_byte_int(x: Any, dtype: np.dtype) -> Any:
    """int4/uint4/int2/uint2 from a float as ml_dtypes converts: truncate toward zero to an
    int32, keep the low 4 (2) bits, two's complement (-9 -> int4 7, uint4 7). NaN, +/-Inf and
    values beyond int32 give 0: ONNX leaves out-of-range conversions undefined, and 0 is what
    the reference (ml_dtypes' C++ cast on x86) returns; XLA's float->int4 would clamp."""
    wide = _wide(x)
    in_range = jnp.abs(wide) < 2.0 ** 31  # False for NaN too
    return jnp.where(in_range, wide, 0).astype(jnp.int32).astype(dtype)


def _cast(call: NodeCall, x: Any) -> Any:
    """Cast: ``x`` converted to the element type ``to`` by :func:`cast_to` (``saturate``
    default 1, ``round_mode`` default ``up``)."""
    onnx_to = call.attr("to")
    host = np.dtype(helper.tensor_dtype_to_np_dtype(onnx_to))
    if isinstance(x, np.ndarray) and host not in LOW_BIT_TYPES:
        return x.astype(host)  # a constant keeps 64-bit ints (shape arithmetic)
    return cast_to(x, jax_dtype(onnx_to), bool(call.attr("saturate", 1)),
                   call.attr("round_mode", "up"))


def _castlike(call: NodeCall, x: Any, like: Any) -> Any:
    """CastLike: ``x`` converted to the element type of ``like`` (Cast's rules, its
    ``saturate`` and ``round_mode``)."""
    return cast_to(x, like.dtype, bool(call.attr("saturate", 1)), call.attr("round_mode", "up"))


def _check_cast(call: NodeCall) -> Optional[str]:
    if call.op_type == "Cast":
        to = call.attr("to")
        try:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(to))
        except Exception:  # noqa: BLE001 (onnx raises several kinds for unknown types)
            return f"target type {to}"
        if dt.kind in "OSU":
            return f"target type {dt} (strings are not supported)"
    mode = call.attr("round_mode", "up")
    return None if mode in ROUND_MODES else f"round_mode {mode!r}"


register("Cast", _cast, attrs=("to", "saturate", "round_mode"), check=_check_cast,
         doc="convert the element type (float8/e8m0 saturate and round_mode, 4/2-bit types)")
register("CastLike", _castlike, attrs=("saturate", "round_mode"), check=_check_cast,
         doc="cast to another's type (Cast's rules)")
