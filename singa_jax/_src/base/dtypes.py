"""SINGA's dtype constants and the helpers that resolve dtype specs (re-exported by ``tensor``).

The constants are NumPy dtypes, so they compare equal to NumPy and JAX dtypes
(``tensor.float32 == np.float32 == jnp.float32``). Wherever a dtype is taken, SINGA's C++ enum
codes (core.proto ``DataType``) and its words ``'int'``/``'float'`` are accepted too.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict

import jax.numpy as jnp
import numpy as np

__all__ = ["float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
           "bool_", "to_dtype", "singa_dtype_code", "sizeof"]

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
_SINGA_DTYPE_CODES: Dict[int, np.dtype] = {0: float32, 1: float16, 2: int32, 3: int8,
                                           4: float64, 5: int64}
_SINGA_DTYPE_NAMES: Dict[np.dtype, int] = {v: k for k, v in _SINGA_DTYPE_CODES.items()}
# SINGA's as_type/to_type also take the names 'int' and 'float' (its 32-bit types).
_SINGA_DTYPE_WORDS: Dict[str, np.dtype] = {"int": int32, "float": float32}


def to_dtype(dtype: Any) -> np.dtype:
    """Resolve a SINGA dtype code, a NumPy/JAX dtype or a dtype name to a NumPy dtype
    (None means float32)."""
    if dtype is None:
        return float32
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) in _SINGA_DTYPE_CODES:
            return _SINGA_DTYPE_CODES[int(dtype)]
        raise TypeError(f"unknown SINGA dtype code {dtype}; known: {sorted(_SINGA_DTYPE_CODES)}")
    if isinstance(dtype, str) and dtype in _SINGA_DTYPE_WORDS:
        return _SINGA_DTYPE_WORDS[dtype]
    try:
        return jnp.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"unknown dtype {dtype!r}: expected a NumPy/JAX dtype, a dtype name or a "
                        f"SINGA dtype constant") from e


def singa_dtype_code(dtype: Any) -> int:
    """SINGA's C++ enum value of ``dtype`` (for SINGA's checkpoint format; 0 = float32 for dtypes
    SINGA lacks)."""
    return _SINGA_DTYPE_NAMES.get(to_dtype(dtype), 0)


def sizeof(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (a SINGA dtype constant or any dtype spec)."""
    return to_dtype(dtype).itemsize


@lru_cache(maxsize=None)
def is_inexact(dtype: Any) -> bool:  # singa_jax's own helper: not in __all__ (SINGA's surface)
    """Whether ``dtype`` is floating point or complex (what carries a gradient). Cached per
    dtype: ``jnp.issubdtype`` costs about a microsecond, and eager ops and the optimizer ask
    several times per op and parameter."""
    return bool(jnp.issubdtype(dtype, jnp.inexact))
