"""Why graph mode compiles a step: what differs between a call's program key and the last one
of the same method (see :meth:`~.runner.GraphRunner._call_key` for what a key holds)."""
from __future__ import annotations

from typing import Hashable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["describe", "signature_text"]

# the parts of a program key, in order, and how a change of each is said
_PARTS = ("method", "training", "argument structure", "arguments", "state", "devices",
          "baked-in values", "float32 matmul precision", "autocast dtype")


def signature_text(entry: Hashable) -> str:
    """One argument of a call's signature as a user reads it: ``f32[32,10]`` for a Tensor or
    array, the value itself for a static argument."""
    if isinstance(entry, tuple) and entry and entry[0] in ("T", "A"):
        shape, dtype = entry[1], entry[2]
        short = np.dtype(dtype).name
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                 "int32": "i32", "int64": "i64", "bool": "bool"}.get(short, short)
        return f"{short}[{','.join(map(str, shape))}]"
    if isinstance(entry, tuple) and len(entry) == 3 and entry[0] == "S":
        return repr(entry[2])
    return repr(entry)


def _arguments(old: Sequence[Hashable], new: Sequence[Hashable]) -> str:
    if len(old) != len(new):
        return f"{len(old)} arguments before, {len(new)} now"
    changed: List[str] = []
    for i, (a, b) in enumerate(zip(old, new)):
        if a == b:
            continue
        what = "input" if isinstance(b, tuple) and b and b[0] in ("T", "A") else "static value"
        detail = f"{signature_text(a)} -> {signature_text(b)}"
        if what == "input" and isinstance(a, tuple) and a[:3] == b[:3]:
            detail = "its autograd flags or device changed"
        changed.append(f"argument {i} ({what}): {detail}")
    return "; ".join(changed[:4]) + ("; ..." if len(changed) > 4 else "")


def describe(previous: Optional[Tuple], key: Tuple, where: str) -> str:
    """What is new in ``key``, the program key of a call of ``where`` that has no program, next
    to ``previous``, the key of the method's last compiled call (None: its first)."""
    if previous is None:
        return f"first call of {where}"
    reasons = []
    for part, old, new in zip(_PARTS, previous, key):
        if old == new:
            continue
        if part == "arguments":
            reasons.append(f"new input shapes/dtypes or static values: {_arguments(old, new)}")
        elif part == "training":
            reasons.append(f"training mode changed ({old} -> {new})")
        elif part == "state":
            reasons.append(f"the state tensors changed ({len(old)} before, {len(new)} now: a "
                           f"parameter or optimizer state was replaced or created)")
        elif part in ("float32 matmul precision", "autocast dtype"):
            reasons.append(f"{part} changed ({old} -> {new})")
        elif part == "baked-in values":
            reasons.append("a baked-in value changed (an optimizer's schedule or switches)")
        else:
            reasons.append(f"{part} changed")
    return "; ".join(reasons) or "its earlier program was dropped (new state was discovered)"
