"""An optimizer's state made before graph mode first traces a training step.

An :class:`~singa_jax.opt.Optimizer` makes its slots (SGD's momentum, Adam's moments) on its
first update, and under ``autograd.autocast('float16')`` its loss scale. A graph-mode trace that
met them as new state had to trace the step a second time with them as inputs. A Model makes
them with :func:`make` before its first trace instead, so the step is traced and XLA-compiled
once; :func:`drop` takes back the slots the traced step does not use (a parameter without
gradient), so ``get_states()`` holds what an eager first step makes, and :func:`settle` ends
the bookkeeping once a traced call has not failed.

A first call that fails is undone with everything it made (see the step's transaction,
which restores the optimizer's attributes). The Tensors made for it are kept aside here, outside
those attributes, and :func:`make` puts the same Tensors back for the next attempt: the program
its trace compiled, over exactly those Tensors, then serves it without a second compilation.
"""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Dict, List, Sequence, Tuple

import numpy as np

from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.optim.optimizers import Optimizer, param_name, state_tensor

__all__ = ["make", "drop", "settle"]

# optimizer -> {(slot kind, key) or ("_loss_scale", ""): Tensor}: what make() made, kept across
# a failed call's rollback until settle()
_KEPT: "weakref.WeakKeyDictionary[Optimizer, Dict[Tuple[str, str], Tensor]]" = \
    weakref.WeakKeyDictionary()


def make(optimizer: Optimizer, params: Sequence[Tensor]) -> List[Tensor]:
    """Make now the state ``optimizer``'s first update would make lazily -- the step counter and
    guard state, each of ``params``' slots (zeros filled by NumPy: ``jnp.zeros`` would compile
    a program per shape) and, under ``autocast('float16')``, the loss scale -- and return the
    Tensors made. Skipped: an optimizer whose update is not the fused rule (a user subclass's
    ``apply``, optax: their state is their own), and a parameter whose slot key would not be
    its plain name (two parameters of one name: the update's order decides their keys)."""
    optimizer.step_counter  # noqa: B018 -- makes the counter, guard state and *_value tensors
    made: List[Tensor] = []
    if not optimizer._uses_fused_update():
        return made
    kinds = optimizer._active_slot_kinds()
    names = [param_name(p) for p in params]
    repeated = {n for n, count in Counter(names).items() if count > 1}
    kept = _KEPT.setdefault(optimizer, {})
    ahead: Dict[int, Tuple[str, str]] = {}  # id(slot) -> (kind, key), for drop()
    for p, name in zip(params, names):
        if name in repeated or not kinds:
            continue
        ref = optimizer._key_owner.get(str(name))
        owner = ref() if ref is not None else None
        if owner is not None and owner is not p:
            continue
        key = optimizer._slot_key(name, p)
        for kind in kinds:
            slots = optimizer._slot_dict(kind)
            if key in slots:
                continue
            slot = kept.get((kind, key))
            zeros = p.device.put(np.zeros(p.shape, p.dtype), private=True)
            if slot is None or slot.shape != p.shape or slot.dtype != p.dtype:
                slot = kept[(kind, key)] = state_tensor(zeros, p.device)
            else:
                slot._data = zeros  # a zero slot again, whatever a failed run left in it
            slots[key] = slot
            ahead[id(slot)] = (kind, key)
            made.append(slot)
    if optimizer._scaling() and "_loss_scale" not in optimizer.__dict__:
        scale = kept.get(("_loss_scale", ""))
        if scale is None:
            scale = kept[("_loss_scale", "")] = optimizer._scale_state()
        else:
            scale._data = scale.device.put(optimizer._initial_scale(), private=True)
            optimizer._loss_scale = scale
        made.append(scale)
    if made:
        optimizer.__dict__.setdefault("_made_ahead", {}).update(ahead)
        optimizer._bump_states_version()
    return made


def drop(optimizer: Optimizer, unused: Sequence[Tensor]) -> None:
    """Take back the slots :func:`make` made that the traced step did not use (``unused``: by
    identity), as if they had never been made; the others are now the optimizer's like any
    slot."""
    ahead = optimizer.__dict__.pop("_made_ahead", {})
    dropped = False
    for t in unused:
        kind_key = ahead.get(id(t))
        if kind_key is None:
            continue
        kind, key = kind_key
        slots = optimizer._slot_dict(kind)
        if slots.get(key) is t:
            del slots[key]
            dropped = True
    if dropped:
        optimizer._bump_states_version()


def settle(optimizer: Optimizer) -> None:
    """A traced call with the state made ahead has not failed: nothing is kept aside any more."""
    _KEPT.pop(optimizer, None)
