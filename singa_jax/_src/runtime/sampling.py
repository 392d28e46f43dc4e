"""Random sampling behind SINGA's random fills (``Tensor.bernoulli/gaussian/uniform``,
``tensor.random`` and the initializers built on them).

It works on arrays and keys only and imports nothing from :mod:`singa_jax.tensor`, so the Tensor
methods can use it without an import cycle. Every fill passes a fresh key from
``device.next_key()``, so ``device.SetRandSeed`` makes the fills reproducible.

Two samplers, one per purpose:

* a layer's parameters (its ``initialize``, eager or in ``Model.compile()``:
  :func:`modes.parameter_initialization`) are drawn on the HOST by NumPy's PCG64 generator
  seeded with the fill's key, and put on the device: no XLA program is compiled or run to
  initialise a model (a cold ``compile()`` compiled and ran one draw program, ~0.3 s and
  ~0.45 s of ResNet-18's on a CPU), and a seed gives the same parameters on every backend;
* every other fill (a Tensor's ``gaussian`` in a training loop, dropout-style noise) is drawn
  by ``jax.random`` where the Tensor lives, the device's own generator.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.base import host_prng
from singa_jax._src.base.dtypes import float32, float64
from singa_jax._src.base.modes import in_compile_time_eval, in_parameter_initialization

__all__ = ["SAMPLE_KINDS", "check_params", "draw"]


def _check_probability(op: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: p must be in [0, 1], got {p}")


def _check_std(op: str, mean: float, std: float) -> None:
    if std < 0:
        raise ValueError(f"{op}: std must be non-negative, got {std}")


def _check_bounds(op: str, low: float, high: float) -> None:
    if low > high:
        raise ValueError(f"{op}: low ({low}) must not exceed high ({high})")


# kind -> (sampler(key, shape, dtype, *params), parameter check(op, *params))
_SAMPLERS: Dict[str, Tuple[Callable, Callable]] = {
    "bernoulli": (lambda key, shape, dt, p: jax.random.bernoulli(key, p, shape),
                  _check_probability),
    "gaussian": (lambda key, shape, dt, mean, std: mean + std * jax.random.normal(key, shape, dt),
                 _check_std),
    "uniform": (lambda key, shape, dt, low, high: jax.random.uniform(key, shape, dt, low, high),
                _check_bounds),
}
SAMPLE_KINDS: Tuple[str, ...] = tuple(_SAMPLERS)  # ("bernoulli", "gaussian", "uniform")

# the same kinds drawn by NumPy, (generator, count, dtype, *params) -> samples; the formulas
# are jax.random's (uniform: ``max(low, u * (high - low) + low)``, bernoulli: ``u < p``)
_HOST_SAMPLERS: Dict[str, Callable] = {
    "bernoulli": lambda rng, n, dt, p: rng.random(n, dtype=dt) < dt.type(p),
    "gaussian": lambda rng, n, dt, mean, std: (dt.type(mean)
                                               + dt.type(std) * rng.standard_normal(n, dtype=dt)),
    "uniform": lambda rng, n, dt, low, high: np.maximum(
        dt.type(low), rng.random(n, dtype=dt) * (dt.type(high) - dt.type(low)) + dt.type(low)),
}

_DRAW_CHUNK = 1 << 16  # samples per compiled draw


def check_params(kind: str, params: Sequence[float]) -> None:
    """Raise ValueError naming ``kind`` unless ``params`` suit it: ``(p,)`` with p in [0, 1] for
    bernoulli, ``(mean, std)`` with std >= 0 for gaussian, ``(low, high)`` with low <= high for
    uniform."""
    if kind not in _SAMPLERS:
        raise ValueError(f"unknown sample kind {kind!r}; expected one of {SAMPLE_KINDS}")
    _SAMPLERS[kind][1](kind, *params)


def draw(kind: str, key: jax.Array, params: Sequence[float], shape: Tuple[int, ...],
         dtype: np.dtype) -> jax.Array:
    """Samples of ``kind`` (one of :data:`SAMPLE_KINDS`) in ``shape`` and ``dtype``, drawn with
    ``key``; ``params`` are ``(p,)``, ``(mean, std)`` or ``(low, high)`` (checked first, see
    :func:`check_params`)."""
    check_params(kind, params)
    params = tuple(float(p) for p in params)
    shape = tuple(shape)
    if in_parameter_initialization():
        if host_prng.supported(key):
            values = _host_samples(key, params, kind, shape, dtype)
            return (jax.device_put(values, key.sharding) if isinstance(key, jax.Array)
                    else values)
        if isinstance(key, jax.core.Tracer) and host_prng.raw_key_layout(key):
            # a layer built inside a traced step (graph mode's first call): the same host
            # samples, drawn when the program runs with the key's value
            return jax.pure_callback(
                functools.partial(_host_samples, params=params, kind=kind, shape=shape,
                                  dtype=dtype),
                jax.ShapeDtypeStruct(shape, dtype), key)
    return _draw(key, params, kind, shape, dtype)


def _host_samples(key: np.ndarray, params: Tuple[float, ...], kind: str, shape: Tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray:
    """:func:`draw` for a layer's parameters, in NumPy: PCG64 seeded with the raw key's two
    words draws the samples (float32, float64 for float64)."""
    rng = np.random.Generator(np.random.PCG64(np.asarray(key, np.uint32)))
    sample_dtype = np.dtype(np.float64 if dtype == float64 else np.float32)
    flat = _HOST_SAMPLERS[kind](rng, math.prod(shape), sample_dtype, *params)
    return flat.reshape(shape).astype(dtype)


def _draw(key: jax.Array, params: Tuple[float, ...], kind: str, shape: Tuple[int, ...],
          dtype: np.dtype) -> jax.Array:
    """Samples of ``kind`` in ``shape`` and ``dtype``.

    XLA compiles the random-bit generator anew for every shape (about 0.5 s on a CPU, whatever
    the size), which costs far more than drawing: samples are therefore always drawn in chunks
    of ``_DRAW_CHUNK`` by ONE compiled program per kind and dtype (chunk i from
    ``fold_in(key, i)``), concatenated and cut to size — a prefix of i.i.d. samples is i.i.d.
    Concrete samples on a CPU -- and on any device in ``Model.compile()``'s initialisation
    (:func:`modes.compile_time_eval`), whose chunk keys are folded on the host too
    (:mod:`.host_prng`) -- are concatenated and cut by NumPy: each jnp concatenate, slice and
    reshape of a new shape would compile a program too (0.5 s of a ResNet-50's compile()).
    """
    size = math.prod(shape)
    # float32 samples for every dtype but float64 (converted after), so dtypes share programs
    sample_dtype = float64 if dtype == float64 else float32
    chunks = max(1, -(-size // _DRAW_CHUNK))
    on_host = in_compile_time_eval() and host_prng.supported(key)
    fold_in = host_prng.fold_in if on_host else jax.random.fold_in
    keys = [key] if chunks == 1 else [fold_in(key, i) for i in range(chunks)]
    parts = [_draw_flat(k, params, kind=kind, count=_DRAW_CHUNK, dtype=sample_dtype)
             for k in keys]
    if not isinstance(parts[0], jax.core.Tracer):
        (where,) = parts[0].devices()
        if where.platform == "cpu" or on_host:
            flat = np.concatenate([np.asarray(p) for p in parts])
            return jax.device_put(flat[:size].reshape(shape).astype(dtype), where)
    flat = parts[0] if chunks == 1 else jnp.concatenate(parts)
    return flat[:size].reshape(shape).astype(dtype)


@functools.partial(jax.jit, static_argnames=("kind", "count", "dtype"))
def _draw_flat(key: jax.Array, params: Tuple[float, ...], *, kind: str, count: int,
               dtype: np.dtype) -> jax.Array:
    # parameter values are traced, so changing them does not recompile
    return _SAMPLERS[kind][0](key, (count,), dtype, *params).astype(dtype)
