"""A Layer's forward run on given arrays: its Tensors bound to them for the call (and restored
however it ends), every device drawing from a given key. The pieces of ``Model.functional`` and
of rematerialised layer calls (:mod:`.remat`)."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import jax
import numpy as np

from singa_jax._src.base import modes
from singa_jax._src.runtime import device as device_mod
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["run_forward", "bound_arrays", "bound_keys", "as_input", "as_output", "is_tensor"]


def run_forward(layer: Any, bound: Dict[str, Tensor], values: Dict[str, Any],
                state: Dict[str, Tensor], inputs: Tuple, training: bool, key: Optional[jax.Array],
                home: Any) -> Tuple[Any, Dict[str, Any], List[bool]]:
    """``layer.forward`` on arrays, nothing recorded: the ``bound`` Tensors hold ``values`` and
    every device draws from ``key`` for the call. Returns the outputs (arrays, in the forward's
    structure), the ``state`` Tensors' values after it, and whether it drew random numbers."""
    with modes.trace_hook(None), modes.training_mode(training), modes.no_grad(), \
            bound_arrays(bound, values), bound_keys(key) as drew:
        args = jax.tree_util.tree_map(lambda v: as_input(v, home), inputs, is_leaf=is_tensor)
        out = layer.forward(*args)
        outputs = jax.tree_util.tree_map(as_output, out, is_leaf=is_tensor)
        new_state = {k: t.array for k, t in state.items()}
    return outputs, new_state, drew


def is_tensor(v: Any) -> bool:
    return isinstance(v, Tensor)


def as_input(v: Any, device: Any) -> Any:
    """An input leaf as the layer sees it: arrays become Tensors (no copy)."""
    if isinstance(v, (jax.Array, jax.core.Tracer, np.ndarray)):
        return Tensor(data=v, device=device, requires_grad=False)
    return v


def as_output(v: Any) -> Any:
    return v.array if isinstance(v, Tensor) else v


@contextlib.contextmanager
def bound_arrays(tensors: Dict[str, Tensor], values: Dict[str, Any]) -> Iterator[None]:
    """Bind each Tensor to its given value for the block; the original arrays come back however
    it ends, so no tracer is ever left in the model (as graph mode's ``_restore``)."""
    originals = {name: t.array for name, t in tensors.items()}
    try:
        for name, t in tensors.items():
            t.array = values[name]
        yield
    finally:
        for name, t in tensors.items():
            t.array = originals[name]


@contextlib.contextmanager
def bound_keys(key: Optional[jax.Array]) -> Iterator[List[bool]]:
    """Every Device draws from ``key`` (folded with the device's index) in this thread for the
    block, without touching the devices' own keys (graph mode's per-thread keys, see
    ``modes.traced_keys``). With ``key=None`` the devices' current keys are lent and not
    advanced. Yields a list that receives, on exit, whether anything was drawn."""
    devices = device_mod.all_devices()
    keys = modes.traced_keys(create=True)
    saved = {d: keys[d] for d in devices if d in keys}
    start = {}
    for i, d in enumerate(devices):
        current = d.key
        start[d] = current if key is None else (jax.random.fold_in(key, i) if i else key)
        keys[d] = (start[d], current)
    drew: List[bool] = []
    try:
        yield drew
    finally:
        drew.append(any(keys[d][0] is not start[d] for d in devices if d in keys))
        for d in devices:
            if d in saved:
                keys[d] = saved[d]
            else:
                keys.pop(d, None)
