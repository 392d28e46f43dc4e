"""JAX's threefry key operations computed by NumPy on the host, bit for bit as ``jax.random``.

``Model.compile()`` initialises a model's parameters by splitting a device's key once per
random fill and folding a chunk index into it per chunk of samples (see
the samplers). Done by ``jax.random`` each of these compiles a small XLA program
the first time (``_threefry_split``, ``unstack``, ``iota_2x32_shape``, ``_threefry_fold_in``,
a conversion: ~0.3 s of a cold ``compile()`` on a CPU) and dispatches one per call; the
Threefry-2x32 hash is integer arithmetic, so NumPy computes the same bits at once.

Raw ``uint32[2]`` keys (``jax.random.PRNGKey``, what a Device holds) with JAX's default
``jax_threefry_partitionable`` (true since JAX 0.5) are what this reproduces;
:func:`supported` says whether a key is one (otherwise callers use ``jax.random``).
"""
from __future__ import annotations

from typing import Any, Tuple

import jax
import numpy as np

__all__ = ["supported", "raw_key_layout", "split", "fold_in", "threefry2x32"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotate_left(x: np.ndarray, d: int) -> np.ndarray:
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(key: np.ndarray, x1: np.ndarray, x2: np.ndarray
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds) of the counter pairs ``(x1, x2)`` under the raw key
    ``key`` (two uint32), as XLA computes JAX's ``threefry2x32_p``."""
    k1, k2 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as XLA's does
        x = [np.asarray(x1, np.uint32) + ks[0], np.asarray(x2, np.uint32) + ks[1]]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x[0] = x[0] + x[1]
                x[1] = _rotate_left(x[1], r)
                x[1] = x[0] ^ x[1]
            x[0] = x[0] + ks[(i + 1) % 3]
            x[1] = x[1] + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x[0], x[1]


def raw_key_layout(key: Any) -> bool:
    """Whether ``key`` (an array or a tracer) is laid out as a raw key: two uint32 words."""
    return key.shape == (2,) and key.dtype == np.uint32


def supported(key: Any) -> bool:
    """Whether ``key`` is a concrete raw threefry key whose operations this module reproduces
    (JAX's default key settings)."""
    return (isinstance(key, (jax.Array, np.ndarray)) and not isinstance(key, jax.core.Tracer)
            and raw_key_layout(key)
            and jax.config.jax_threefry_partitionable
            and jax.config.jax_default_prng_impl == "threefry2x32")


def _place(bits: np.ndarray, like: Any) -> Any:
    """``bits`` where ``like`` lives: a jax.Array on its device (a NumPy key stays NumPy)."""
    if isinstance(like, jax.Array):
        return jax.device_put(bits, like.sharding)
    return bits


def split(key: Any) -> Tuple[Any, Any]:
    """``jax.random.split(key)``'s two keys, as ``(new key, subkey)`` on ``key``'s device."""
    k = np.asarray(key, np.uint32)
    hi, lo = threefry2x32(k, np.zeros(2, np.uint32), np.arange(2, dtype=np.uint32))
    return _place(np.array([hi[0], lo[0]], np.uint32), key), \
        _place(np.array([hi[1], lo[1]], np.uint32), key)


def fold_in(key: Any, data: int) -> Any:
    """``jax.random.fold_in(key, data)`` (``data`` taken as uint32) on ``key``'s device."""
    k = np.asarray(key, np.uint32)
    hi, lo = threefry2x32(k, np.zeros(1, np.uint32), np.array([data], np.uint32))
    return _place(np.array([hi[0], lo[0]], np.uint32), key)
