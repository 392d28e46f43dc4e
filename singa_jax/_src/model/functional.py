"""A model as a pure function (``Model.functional()``): ``apply(params, state, *inputs,
training, key) -> (outputs, new_state)`` over the model's own code, for ``jax.jit``,
``jax.grad`` and the rest of JAX; the model's Tensors are bound to the given values for the
call and restored however it ends."""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

import jax

from singa_jax._src.graph.layout import tensors_in
from singa_jax._src.layers.base import Layer
from singa_jax._src.layers.pure import run_forward
from singa_jax._src.runtime import device as device_mod
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["functional"]


def functional(model: Layer) -> Tuple[Callable[..., Tuple[Any, Dict[str, Any]]],
                                       Dict[str, jax.Array], Dict[str, jax.Array]]:
    """:meth:`Model.functional` for any initialised Layer."""
    owner = f"{type(model).__name__}.functional"
    if not model.__dict__.get("_initialized", False):
        raise RuntimeError(f"{owner}: the model is not initialised yet (its parameters are "
                           f"created by the first call); call it once or compile() it first")
    param_tensors = model.get_params()
    state_tensors = {k: t for k, t in model.get_states().items() if k not in param_tensors}
    bound = {**param_tensors, **state_tensors}
    home = next(iter(bound.values())).device if bound else device_mod.get_default_device()
    lock = threading.RLock()  # calls of this apply from several threads take turns

    def apply(params: Dict[str, Any], state: Dict[str, Any], *inputs: Any,
              training: bool = False, key: Optional[jax.Array] = None
              ) -> Tuple[Any, Dict[str, Any]]:
        values = {**_checked_values(owner, "params", params, param_tensors),
                  **_checked_values(owner, "state", state, state_tensors)}
        with lock:
            version = model.structure_version
            outputs, new_state, drew = run_forward(model, bound, values, state_tensors, inputs,
                                                   training, key, home)
            if model.structure_version != version:
                _clear_traced_tensors(owner, model)
        if drew[0] and key is None:
            raise ValueError(f"{owner}: apply drew random numbers (dropout or another random "
                             f"op, training={training}) but no key was given; pass "
                             f"key=jax.random.key(...) (apply is pure, so it does not advance "
                             f"the device's key)")
        return outputs, new_state

    params = {k: t.array for k, t in param_tensors.items()}
    state = {k: t.array for k, t in state_tensors.items()}
    return apply, params, state


def _checked_values(owner: str, what: str, values: Any, tensors: Dict[str, Tensor]
                    ) -> Dict[str, Any]:
    """``values`` must name exactly ``tensors`` with the same shapes (checked before binding)."""
    if not isinstance(values, dict):
        raise TypeError(f"{owner}: apply's {what} must be a dict {{name: array}}, got "
                        f"{type(values).__name__}")
    missing, unknown = sorted(set(tensors) - set(values)), sorted(set(values) - set(tensors))
    if missing or unknown:
        raise ValueError(f"{owner}: apply's {what} must have exactly the model's names; missing "
                         f"{missing}, unknown {unknown}")
    for name, v in values.items():
        if tuple(jax.numpy.shape(v)) != tensors[name].shape:
            raise ValueError(f"{owner}: apply's {what}[{name!r}] has shape "
                             f"{tuple(jax.numpy.shape(v))}, expected {tensors[name].shape}")
    return values


def _clear_traced_tensors(owner: str, model: Layer) -> None:
    """A call that changed the model's structure may have stored Tensors created from the
    given values (tracers under a JAX transformation): reset those to zeros and say so."""
    leaked = [t for t in tensors_in(model) if isinstance(t._data, jax.core.Tracer)]
    if leaked:
        for t in leaked:
            t.array = jax.numpy.zeros(t.shape, t.dtype)
        raise RuntimeError(f"{owner}: apply stored traced values in {[t.name for t in leaked]} "
                           f"(a layer initialised or kept a Tensor during the call); call the "
                           f"model once (or compile it) before functional()")
