"""SINGA's ``Model.compile()`` initialisation: every parameter created from placeholder inputs,
with no program compiled per layer."""
from __future__ import annotations

from typing import Sequence

import jax

from singa_jax._src.graph.layout import tensors_in
from singa_jax._src.layers.base import Layer, concrete_initialization, layer_tree
from singa_jax._src.runtime import device as device_mod
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["initialize"]


def initialize(model: Layer, inputs: Sequence[Tensor]) -> None:
    """Run ``forward`` on the placeholders to create every parameter, as SINGA's compile() does.

    The forward is traced on shapes only (``jax.eval_shape``: no kernel of it is compiled or
    run) while each layer it initialises computes its parameters concretely
    (``modes.compile_time_eval``), drawing from the device keys in the same order as an eager
    forward, so the values are the same for a seed. There, on every backend, fills are made by
    NumPy, key splits and chunk keys by :mod:`.host_prng` and random chunks are cut to shape by
    NumPy: the only XLA program is the shared random draw (one per kind and dtype, compiled by
    a process's first compile()). A forward that needs its inputs' values, or that leaves a
    traced value in the model, runs eagerly instead, from the same keys."""
    devices = device_mod.all_devices()
    keys = [d.key for d in devices]

    def forward(*arrays):
        xs = [Tensor(data=a, device=x.device, requires_grad=x.requires_grad,
                     stores_grad=x.stores_grad, name=x.name) for a, x in zip(arrays, inputs)]
        with concrete_initialization():
            model.forward(*xs)

    try:
        jax.eval_shape(forward, *[x.array for x in inputs])
        traced = [t for t in tensors_in(model) if isinstance(t.array, jax.core.Tracer)]
        if not traced and not any(isinstance(d.key, jax.core.Tracer) for d in devices):
            return
    except Exception:  # noqa: BLE001 -- the eager forward below raises any real error clearly
        pass
    for d, k in zip(devices, keys):
        d.key = k
    for layer in layer_tree(model):
        layer.__dict__["_initialized"] = False
        layer._bump_structure_version()
    model.forward(*inputs)
