"""SINGA's initializers, public in :mod:`singa_jax.initializer` (the distributions and fans
are described there): each fill rebinds the Tensor's array, drawing from its device's key."""
from __future__ import annotations

import math
import warnings
from typing import Callable, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.tensor.tensor import Tensor

__all__ = ["eye", "orthogonal", "lecun_uniform", "lecun_normal", "glorot_normal", "glorot_uniform",
           "he_normal", "he_uniform", "gaussian", "xavier", "glorot", "msra"]


# --- primitive fills (also used by the layers) ----------------------------------------------

def _check_tensor(fn: str, t) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"initializer.{fn}: expected a Tensor, got {type(t).__name__}")
    if not jnp.issubdtype(t.dtype, jnp.floating):
        raise TypeError(f"initializer.{fn}: cannot fill a tensor of dtype {t.dtype} with random "
                        f"values; expected a floating dtype")


def gaussian_fill(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill ``t`` in place with samples of ``N(mean, std)`` drawn from its device's key."""
    _check_tensor("gaussian_fill", t)
    # Tensor.gaussian draws in fixed-size chunks: one compiled sampler serves every shape
    # (a sampler per parameter shape made Model.compile of LeNet take seconds)
    return t.gaussian(mean, std)


def uniform_fill(t: Tensor, low: float = 0.0, high: float = 1.0) -> Tensor:
    """Fill ``t`` in place with samples of ``U(low, high)`` drawn from its device's key."""
    _check_tensor("uniform_fill", t)
    return t.uniform(low, high)


def constant_fill(t: Tensor, value: float) -> Tensor:
    """Fill ``t`` in place with ``value`` (SINGA's ``set_value``)."""
    return t.set_value(value)


# --- SINGA's initializers ------------------------------------------------------------------

def _require_matrix(fn: str, t: Tensor) -> None:
    if len(t.shape) != 2:
        raise ValueError(f"initializer.{fn}: only 2-D tensors are supported, got shape {t.shape}")


def eye(t: Tensor) -> None:
    """Ones on the diagonal, zeros elsewhere (``t`` must be 2-D)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"initializer.eye: expected a Tensor, got {type(t).__name__}")
    _require_matrix("eye", t)
    # NumPy builds it: jnp.eye compiles a program per shape (compile()'s initialisation
    # compiles none per layer)
    t.array = t.device.put(np.eye(t.shape[0], t.shape[1], dtype=t.dtype), private=True)


def orthogonal(t: Tensor, gain: float = 1.0) -> None:
    """A random orthogonal matrix times ``gain`` (Saxe et al. 2013): the ``U`` or ``V`` factor
    of the SVD of a standard normal matrix, whichever has ``t``'s shape."""
    _check_tensor("orthogonal", t)
    _require_matrix("orthogonal", t)
    a = jax.random.normal(t.device.next_key(), t.shape, jnp.float32)
    u, _, vt = jnp.linalg.svd(a, full_matrices=False)
    q = u if u.shape == t.shape else vt
    t.array = t.device.put((q * gain).astype(t.dtype), private=True)


def _compute_fans(shape: Tuple[int, ...]) -> Tuple[float, float]:
    """``(fan_in, fan_out)`` of a weight shape (channels-first convention, as SINGA)."""
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    if len(shape) in (3, 4, 5):
        receptive = float(math.prod(shape[2:]))
        return shape[1] * receptive, shape[0] * receptive
    side = math.sqrt(float(math.prod(shape)))  # 1 for a scalar
    return side, side


def _fan_fill(t: Tensor, scale: float, mode: str, distribution: str) -> None:
    """SINGA's ``_random_fill``: variance ``scale / n`` with ``n`` = fan_in, fan_out or their mean."""
    fan_in, fan_out = _compute_fans(t.shape)
    n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
    variance = scale / max(1.0, n)
    if distribution == "normal":
        gaussian_fill(t, 0.0, math.sqrt(variance))
    else:
        limit = math.sqrt(3.0 * variance)
        uniform_fill(t, -limit, limit)


def _fan_initializer(name: str, scale: float, mode: str, distribution: str,
                     ref: str) -> Callable[[Tensor], None]:
    """The initializer ``name``: variance ``scale / n``, ``n`` the fan picked by ``mode``
    (``fan_in``, ``fan_out`` or ``fan_avg``), from a ``normal`` or ``uniform`` distribution."""
    def init(t: Tensor) -> None:
        _check_tensor(name, t)
        _fan_fill(t, scale, mode, distribution)

    formula = (f"N(0, sqrt({scale:g} / {mode}))" if distribution == "normal"
               else f"U(-limit, limit), limit = sqrt({3 * scale:g} / {mode})")
    init.__name__ = init.__qualname__ = name
    init.__doc__ = (f"Fill ``t`` in place with {formula} ({ref}). "
                    f"``fan_avg`` = (fan_in + fan_out) / 2.")
    return init


lecun_uniform = _fan_initializer("lecun_uniform", 1.0, "fan_in", "uniform",
                                 "LeCun et al. 1998, Efficient BackProp")
lecun_normal = _fan_initializer("lecun_normal", 1.0, "fan_in", "normal",
                                "Klambauer et al. 2017, Self-Normalizing Networks")
glorot_uniform = _fan_initializer("glorot_uniform", 1.0, "fan_avg", "uniform",
                                  "Glorot & Bengio 2010 (Xavier uniform)")
glorot_normal = _fan_initializer("glorot_normal", 1.0, "fan_avg", "normal",
                                 "Glorot & Bengio 2010 (Xavier normal)")
he_uniform = _fan_initializer("he_uniform", 2.0, "fan_in", "uniform",
                              "He et al. 2015, Delving Deep into Rectifiers")
he_normal = _fan_initializer("he_normal", 2.0, "fan_in", "normal",
                             "He et al. 2015, Delving Deep into Rectifiers")


def _deprecated(fn: str, use: str) -> None:
    warnings.warn(f"initializer.{fn} is deprecated: use {use}", DeprecationWarning, stacklevel=3)


def gaussian(t: Tensor, fan_in: int = 0, fan_out: int = 0) -> None:
    """Deprecated (use he_normal/glorot_normal): ``N(0, sqrt(2 * avg / (fan_in + fan_out)))`` with
    ``avg = 2`` when both fans are given, else 1."""
    _deprecated("gaussian", "he_normal or glorot_normal")
    if fan_in <= 0 and fan_out <= 0:
        raise ValueError("initializer.gaussian: fan_in and fan_out cannot both be 0")
    avg = 1 if fan_in * fan_out == 0 else 2
    gaussian_fill(t, 0.0, math.sqrt(2.0 * avg / (fan_in + fan_out)))


def xavier(t: Tensor) -> None:
    """Deprecated (use glorot_uniform): ``U(-s, s)``, ``s = sqrt(6 / (rows + cols))``."""
    _deprecated("xavier", "glorot_uniform")
    limit = math.sqrt(6.0 / (t.shape[0] + t.shape[1]))
    uniform_fill(t, -limit, limit)


def glorot(t: Tensor) -> None:
    """Deprecated (use glorot_normal): ``N(0, sqrt(2 / (rows + cols)))``."""
    _deprecated("glorot", "glorot_uniform")
    gaussian_fill(t, 0.0, math.sqrt(2.0 / (t.shape[0] + t.shape[1])))


def msra(t: Tensor) -> None:
    """Deprecated (use he_normal): ``N(0, sqrt(2 / rows))`` (He et al. 2015)."""
    _deprecated("msra", "he_normal")
    gaussian_fill(t, 0.0, math.sqrt(2.0 / t.shape[0]))
