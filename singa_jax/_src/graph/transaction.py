"""A model's call as a transaction: when it raises, the state it may have changed is put back.

Tensors are handles over immutable arrays, so remembering a step's state costs one list of
references, and undoing a failed step is rebinding them. What a call can change, and so what is
remembered before it runs:

* the arrays of the model's declared state: parameters, buffers (batch-norm statistics) and, in
  training, every optimizer's tensors (slots, step counter, scheduled values);
* every device's PRNG key (dropout masks and random fills advance it);
* each optimizer's own attributes (a first step creates its slots; undone, they go again);
* the layers a first call initialises (undone, they initialise again on the next call, from the
  restored keys, to the same values).

In graph mode the arrays are NOT remembered here: a failed trace has already put them back
(``graph.GraphRunner._undo_trace``), and holding a reference to a state array would make graph
mode copy it rather than donate its buffer (see ``graph._copy_shared``). There the transaction
restores the optimizers' attributes and the layers only.

A Ctrl-C that arrives once a graph-mode run has been called (its state buffers donated) is held
back until the Model's step -- this transaction included -- has ended (``base.interrupts``):
it never rolls back the attributes of a step whose arrays are bound.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from singa_jax._src.runtime import device as device_mod
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["StepTransaction"]


class StepTransaction:
    """``with StepTransaction(state, optimizers, uninitialised_layers, arrays): step()``;
    ``arrays=False`` (graph mode) remembers no arrays: neither ``state``'s nor the keys.
    ``arrays`` may also be the arrays ``state``'s Tensors hold, read by the caller already."""

    __slots__ = ("_state", "_arrays", "_keys", "_optimizers", "_layers")

    def __init__(self, state: Sequence[Any], optimizers: Sequence[Any],
                 uninitialised_layers: Sequence[Any], arrays: Any = True):
        remember = arrays is not False
        if arrays is True:
            arrays = [t._data for t in state]
        self._state, self._arrays = (state, arrays) if remember else ((), ())
        self._keys = [(d, d.key) for d in device_mod.all_devices()] if remember else []
        self._optimizers = [_remember(o, remember) for o in optimizers]
        self._layers = uninitialised_layers

    def __enter__(self) -> "StepTransaction":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is not None:
            self.rollback()
        return False  # the error propagates

    def rollback(self) -> None:
        for t, array in zip(self._state, self._arrays):
            t._data = array  # the value before the call (no hook: this is no traced step)
        for d, key in self._keys:
            d.key = key
        for o, attrs, arrays in self._optimizers:
            current = vars(o)
            current.clear()
            current.update({k: dict(v) if type(v) is dict else v for k, v in attrs.items()})
            for t, array in arrays:
                t._data = array
        for layer in self._layers:
            layer.__dict__["_initialized"] = False
            layer._bump_structure_version()  # (what caches the layers' state sees it changed)


def _remember(obj: Any, arrays: bool) -> Tuple[Any, Dict[str, Any], List[Tuple[Tensor, Any]]]:
    """``obj``, its attributes with each dict copied (slot dicts gain entries in a first step)
    and, with ``arrays``, the arrays of the Tensors among them (their values before the step)."""
    attrs = {k: dict(v) if type(v) is dict else v for k, v in vars(obj).items()}
    if not arrays:
        return obj, attrs, []
    tensors = [v for v in attrs.values() if isinstance(v, Tensor)]
    for v in attrs.values():
        if type(v) is dict:
            tensors.extend(x for x in v.values() if isinstance(x, Tensor))
    return obj, attrs, [(t, t._data) for t in tensors]
