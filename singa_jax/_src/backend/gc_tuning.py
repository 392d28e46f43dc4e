"""Python's cyclic garbage collector under eager training.

An eager training step keeps its autograd graph (operators, Tensors, pullback states: a few
thousand tracked objects) alive until the next step drops it. CPython starts a young
collection whenever its count of tracked allocations minus deallocations passes the youngest
generation's threshold (700 by default): a step's graph being built while the last one is still
alive crossed it about ten times a step, and each young collection traversed the live graph and
promoted it, so that every ~12 steps a full collection followed -- and a full collection
traverses every tracked object of the process, after the first compiles mostly JAX's own
(~240K objects after a 100-block CNN's first steps, alive for good): 95-170 ms each, ~10 ms a
step on average, plus ~3 ms a step of young and middle collections.

:func:`tune` raises the youngest generation's threshold to :data:`YOUNG_THRESHOLD`. A training
loop's objects come and go by reference counting (the autograd graph has no reference cycles),
so the count stays below it and the collector runs almost never (the 100-block CNN: no
collection at all in 60 steps); cyclic garbage is still collected, after 10,000 net new objects
instead of 700. What an explicit ``gc.collect()`` does is unchanged.

It is called when singa_jax first walks an eager backward (the pattern above), once per
process, and does nothing when:

* ``SINGA_JAX_GC_TUNING=0`` is set (the words :func:`~singa_jax._src.base.env.switched_off`
  accepts), or
* the thresholds are not Python's defaults (the program chose its own), or the collector is
  disabled.

:func:`untune` restores Python's threshold (if it is still singa_jax's).
"""
from __future__ import annotations

import gc
import os
import threading
from typing import Any, Dict

from singa_jax._src.base.env import switched_off

__all__ = ["tune", "untune", "tuned", "YOUNG_THRESHOLD", "GC_TUNING_ENV"]

GC_TUNING_ENV = "SINGA_JAX_GC_TUNING"
# the youngest generation's threshold (Python's default: 700 net tracked allocations)
YOUNG_THRESHOLD = 10_000
_PYTHON_DEFAULT_THRESHOLDS = (700, 10, 10)

_lock = threading.Lock()
_state: Dict[str, Any] = {"decided": False, "thresholds": None}


def tune() -> bool:
    """Raise the young generation's threshold (see the module docstring), once per process.
    Returns whether singa_jax tunes the collector."""
    if _state["decided"]:
        return _state["thresholds"] is not None
    with _lock:
        if not _state["decided"]:
            _state["decided"] = True
            if not switched_off(os.environ.get(GC_TUNING_ENV, "")) and gc.isenabled() and \
                    gc.get_threshold() == _PYTHON_DEFAULT_THRESHOLDS:
                _state["thresholds"] = gc.get_threshold()
                gc.set_threshold(YOUNG_THRESHOLD, *_PYTHON_DEFAULT_THRESHOLDS[1:])
    return _state["thresholds"] is not None


def tuned() -> bool:
    """Whether singa_jax raised the threshold (and has not restored it)."""
    return _state["thresholds"] is not None


def untune() -> None:
    """Restore Python's threshold, if it is still singa_jax's; :func:`tune` then does nothing
    for the rest of the process."""
    with _lock:
        _state["decided"] = True
        old, _state["thresholds"] = _state["thresholds"], None
        if old is not None and gc.get_threshold()[0] == YOUNG_THRESHOLD:
            gc.set_threshold(*old)
