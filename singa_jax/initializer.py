"""SINGA's ``initializer`` module on JAX: fill a parameter Tensor in place.

Every function rebinds ``t.data`` to a new array of the same shape and dtype on ``t``'s device.
Random fills draw from ``t.device.next_key()``, so ``device.SetRandSeed`` makes them reproducible
(and graph mode can thread the key). For the fan-based family, with a weight's fans
``(fan_in, fan_out)`` and ``n`` the fan chosen by the initializer,

* ``normal``:  ``N(0, sqrt(scale / n))``
* ``uniform``: ``U(-sqrt(3 * scale / n), +sqrt(3 * scale / n))``

Fans follow SINGA (Keras' channels-first rule): a 2-D ``(in, out)`` matrix has ``fan_in = in``,
``fan_out = out``; a conv kernel ``(out_c, in_c, kh, kw, ...)`` has
``fan_in = in_c * kh * kw``, ``fan_out = out_c * kh * kw``; other ranks use ``sqrt(size)``.
"""
from singa_jax._src.layers.initializer import (
    eye as eye, orthogonal as orthogonal, lecun_uniform as lecun_uniform,
    lecun_normal as lecun_normal, glorot_normal as glorot_normal, glorot_uniform as glorot_uniform,
    he_normal as he_normal, he_uniform as he_uniform, gaussian as gaussian, xavier as xavier,
    glorot as glorot, msra as msra, gaussian_fill as gaussian_fill, uniform_fill as uniform_fill,
    constant_fill as constant_fill)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "eye", "orthogonal", "lecun_uniform", "lecun_normal", "glorot_normal", "glorot_uniform",
    "he_normal", "he_uniform", "gaussian", "xavier", "glorot", "msra", "gaussian_fill",
    "uniform_fill", "constant_fill"]

_publish(__name__, __all__)
