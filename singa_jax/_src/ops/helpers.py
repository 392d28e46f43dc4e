"""Helpers the op families share -- axes, values read on the host -- and SINGA's autograd helper
functions (``axis_helper``, ``back_broadcast``, ``ctensor2numpy``)."""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.runtime.ctensor import CTensor, as_array

__all__ = ["normalize_axis", "host_values", "axis_helper", "back_broadcast", "ctensor2numpy"]


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[0, ndim)`` (negative counts from the end); ValueError when out of range."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim


def host_values(op: str, x: jax.Array) -> np.ndarray:
    """The values of ``x`` on the host, for the few ops whose output SHAPE depends on them."""
    if isinstance(x, jax.core.Tracer):
        raise ValueError(f"{op}: the output shape depends on the input's values, so it cannot run "
                         f"inside a compiled (graph-mode / jit) step")
    return np.asarray(jax.device_get(x))


# --------------------------------------------------------------------------------------------
# SINGA's autograd helper functions
# --------------------------------------------------------------------------------------------
def axis_helper(y_shape: Sequence[int], x_shape: Sequence[int]) -> Tuple[int, ...]:
    """The axes of ``y_shape`` along which an operand of shape ``x_shape`` was broadcast."""
    axes = []
    j = len(x_shape) - 1
    for i in range(len(y_shape) - 1, -1, -1):
        if j < 0 or x_shape[j] != y_shape[i]:
            axes.append(i)
        j -= 1
    return tuple(reversed(axes))


def back_broadcast(y_shape: Sequence[int], x_shape: Sequence[int], x: Any) -> Any:
    """Sum a gradient of shape ``y_shape`` back to the shape ``x_shape`` it was broadcast from
    (a CTensor in, as SINGA passes, gives a CTensor out; an array gives an array)."""
    if tuple(y_shape) == tuple(x_shape):
        return x
    out = jnp.reshape(jnp.sum(as_array(x), axis=axis_helper(y_shape, x_shape)), tuple(x_shape))
    return CTensor.from_array(out) if isinstance(x, CTensor) else out


def ctensor2numpy(x: Any) -> np.ndarray:
    """A host (NumPy) copy of a CTensor or array (SINGA's helper; for host-side code only)."""
    return np.asarray(x)
