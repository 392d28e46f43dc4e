"""The ONNX import op registry: :data:`OPS` maps each supported ONNX op type to an
:class:`OpSpec` -- a small pure function on arrays (``jax.numpy``/``jax.lax``) plus what the op
accepts (its attributes, which inputs must be known before running, which carry state). The op
families (:mod:`.tensor_ops`, :mod:`.nn_ops`, :mod:`.cast_ops`, :mod:`.sequence_ops`) register
their ops here; :mod:`.catalog` gathers them.

Calling convention: ``fn(call, *inputs)`` where ``call`` is the :class:`NodeCall` (attributes,
opset, training flag, PRNG key) and ``inputs`` are arrays (``None`` for an omitted optional
input; a sequence is a tuple of arrays, an empty optional None: see :mod:`.sequence_ops`).
Inputs listed in ``static`` arrive as NumPy arrays (shapes, axes, pads...): their values decide
output shapes, which XLA must know while compiling. The function returns one array or a tuple
(one per ONNX output; so a sequence output comes back as ``(seq,)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from onnx import helper

__all__ = ["UnsupportedOnnx", "NodeCall", "OpSpec", "OPS", "register", "jax_dtype",
           "static_ints", "static_floats", "checked_axis"]


class UnsupportedOnnx(ValueError):
    """An ONNX node this backend cannot run (unknown op type, attribute or attribute value)."""


@dataclass
class NodeCall:
    """One node as its function sees it: type, attributes, opset and the run's mode."""

    name: str
    op_type: str
    opset: int
    attrs: Dict[str, Any]
    n_outputs: int = 1
    training: bool = False
    key: Any = None
    state_updates: Dict[int, Any] = field(default_factory=dict)  # input position -> new value

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def describe(self) -> str:
        return f"node '{self.name}' ({self.op_type}, opset {self.opset})"

    def fail(self, what: str) -> UnsupportedOnnx:
        return UnsupportedOnnx(f"{self.describe()}: {what}")


@dataclass(frozen=True)
class OpSpec:
    """How one ONNX op type runs. ``static``: input positions whose VALUES must be known before
    running (they shape the output). ``const``: positions whose initializers stay fixed (not
    trainable) though a computed value is fine too. ``state``: positions holding non-trainable
    state (batch-norm running statistics). ``check(call)`` returns why a node cannot run (an
    unsupported attribute value) or None."""

    op_type: str
    fn: Callable
    attrs: Tuple[str, ...] = ()
    static: Tuple[int, ...] = ()
    const: Tuple[int, ...] = ()
    state: Tuple[int, ...] = ()
    check: Optional[Callable[[NodeCall], Optional[str]]] = None
    needs_key: bool = False
    value_dependent: bool = False  # output shape depends on input values (runs unjitted)
    doc: str = ""


OPS: Dict[str, OpSpec] = {}


def register(op_type: str, fn: Callable, attrs: Sequence[str] = (), static: Sequence[int] = (),
             const: Sequence[int] = (), state: Sequence[int] = (),
             check: Optional[Callable] = None, needs_key: bool = False,
             value_dependent: bool = False, doc: str = "") -> OpSpec:
    """Add one row to :data:`OPS` (and return it)."""
    spec = OpSpec(op_type, fn, tuple(attrs), tuple(static), tuple(const), tuple(state), check,
                  needs_key, value_dependent, doc or (fn.__doc__ or "").strip().split("\n")[0])
    OPS[op_type] = spec
    return spec


_NP_TO_JAX = {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32),
              np.dtype(np.uint64): np.dtype(np.uint32),
              np.dtype(np.complex128): np.dtype(np.complex64)}


def jax_dtype(onnx_type: int) -> np.dtype:
    """The dtype an ONNX element type has inside singa_jax (64-bit types are 32-bit in JAX
    unless x64 is enabled)."""
    dt = np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))
    return _NP_TO_JAX.get(dt, dt) if not jax.config.jax_enable_x64 else dt


def _static_values(call: NodeCall, value: Any, what: str, cast: Any) -> Optional[Tuple[Any, ...]]:
    """A static input (NumPy array) as a tuple of ``cast`` values, None when omitted/empty."""
    if value is None:
        return None
    if not isinstance(value, np.ndarray):
        raise call.fail(f"input '{what}' must be known before running (an initializer, a Constant "
                        f"or a shape computation), but it depends on the graph's inputs")
    return tuple(cast(v) for v in value.reshape(-1))


def static_ints(call: NodeCall, value: Any, what: str) -> Optional[Tuple[int, ...]]:
    """A static input as a tuple of Python ints (see :func:`_static_values`)."""
    return _static_values(call, value, what, int)


def static_floats(call: NodeCall, value: Any, what: str) -> Optional[Tuple[float, ...]]:
    """A static input as a tuple of Python floats (see :func:`_static_values`)."""
    return _static_values(call, value, what, float)


def checked_axis(call: NodeCall, axis: int, ndim: int) -> int:
    """``axis`` in ``[0, ndim)``; UnsupportedOnnx naming the node when it is out of range."""
    if not -ndim <= axis < ndim:
        raise call.fail(f"axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim
