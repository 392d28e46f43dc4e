"""What a kernel call returns, known without running it: its outputs' structure and avals.

Eager replay records a kernel call instead of running it, so it must know the call's outputs
-- their number, shapes and dtypes -- before any of them exists. Abstract evaluation (a trace,
which the kernel's first real call reuses) gives them the first time a kernel signature is met:
a kernel that had to run once first would flush the segment around it, and a model with many
kernel signatures (SINGA's ResNet-50 has 50) would then run op by op for its first steps.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import jax

__all__ = ["outputs", "UNKNOWN"]

# what outputs() gives for a kernel whose trace fails: the call then runs at once and raises
# its error where the operator was called
UNKNOWN = object()

# kernel signature (call, statics, input avals) -> (outputs' treedef, leaf avals), or UNKNOWN
_OUTPUTS: Dict[Tuple, Any] = {}


def outputs(call: Callable, statics: Tuple, avals: Tuple) -> Any:
    """``(treedef, leaf avals)`` of ``call(*statics, *args)`` for inputs of ``avals`` (traced
    once per signature), or :data:`UNKNOWN` where the trace fails."""
    signature = (call, statics, avals)
    known = _OUTPUTS.get(signature)
    if known is None:
        known = _OUTPUTS[signature] = _trace(call, statics, avals)
    return known


def _trace(call: Callable, statics: Tuple, avals: Tuple) -> Any:
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    try:
        out = jax.eval_shape(lambda *xs: call(*statics, *xs), *specs)
    except Exception:  # noqa: BLE001  (the real call reports it)
        return UNKNOWN
    leaves, treedef = jax.tree_util.tree_flatten(out)
    return treedef, tuple([jax.core.ShapedArray(leaf.shape, leaf.dtype,
                                                weak_type=leaf.weak_type) for leaf in leaves])
