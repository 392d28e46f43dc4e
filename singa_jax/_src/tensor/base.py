"""What the arithmetic behind a Tensor's operators (:mod:`.operands`) knows of a Tensor, so
that it can sit below the Tensor class."""
from __future__ import annotations

from typing import Any

import jax

__all__ = ["TensorBase", "is_array"]


class TensorBase:
    """The base of :class:`~singa_jax.tensor.Tensor`: a handle with ``array``, ``shape``,
    ``dtype``, ``device``, ``size()``, ``ndim()`` and ``_new(array)`` (a fresh Tensor over an
    array on the same device)."""

    __slots__ = ()


def is_array(x: Any) -> bool:
    """Whether ``x`` is a ``jax.Array`` or a tracer of one."""
    return isinstance(x, (jax.Array, jax.core.Tracer))
