"""An eager update recorded by eager replay into the segment of the step it updates.

An eager training step is a forward (recorded by eager replay, see eager replay),
a backward walk (recorded into the same segment when it is a fused walk that recurs, see
``autodiff.fused.fused_walk``) and the optimizer's fused update. When the gradients an update
gets are pending values of the segment being recorded -- the walk was recorded -- the update's
kernel is recorded there too: from its second occurrence the whole step is ONE compiled
program, whose residuals and gradients never become arrays Python sees, and parameters, slots
and the guard's state are rebound to the program's outputs when it runs (the end of the Model
call, or the first read of one of them); ``Optimizer.step``'s kernel (the counter, the guard's
state, the scheduled values) follows it into the segment (:func:`step_recording_device`).
Everything else -- gradients computed already
(DistOpt sums them first), parameters on several devices, a trace, replay off -- takes the
update kernel of :meth:`Optimizer._update_pairs` at once, as before.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax

from singa_jax._src.eager import replay
from singa_jax._src.runtime.device import Device
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.optim.update import recorded_update_kernel

__all__ = ["recording_device", "record_update", "step_recording_device"]


def recording_device(optimizer: Any, triples: Sequence[Tuple[Any, Tensor, Tensor]]
                     ) -> Optional[Device]:
    """The device whose pending eager-replay segment ``optimizer``'s update of ``triples``
    (``(name, param, grad)``) may join, or None: the params' (see
    :func:`step_recording_device`), when a gradient is a pending value of that segment (a
    backward walk recorded there; gradients computed already gain nothing from joining)."""
    device = step_recording_device([p for _, p, _ in triples])
    if device is not None:
        for _, _, g in triples:
            d = g._data
            if type(d) is Deferred and d.value is None:
                return device
    return None


def step_recording_device(state: Sequence[Tensor]) -> Optional[Device]:
    """The device whose pending eager-replay segment a kernel over ``state`` may join -- replay
    active (so no trace running), every Tensor on that one device, a segment recording there
    -- or None. ``Optimizer.step``'s kernel (the step counter, the guard's state) joins it
    after an update recorded there."""
    device = state[0].device
    if replay.active() and replay.pending(device) and all(t.device is device for t in state):
        return device
    return None


def record_update(optimizer: Any, device: Device, triples: Sequence[Tuple[Any, Tensor, Tensor]],
                  slot_tensors: List[List[Tensor]], schedules: Tuple,
                  hyper: Dict[str, jax.Array], guard: bool, checked: Tuple,
                  scale_state: Optional[Tensor]) -> None:
    """``optimizer._update_pairs``' kernel, validated and prepared by it, handed to eager
    replay on ``device`` (recorded after the walk that computes the gradients, or run at once
    the first time, when its outputs' structure is learnt), and its outputs rebound: params,
    slots (``slot_tensors``, per param), the guard's state and the loss scale."""
    names = tuple(hyper)
    per = len(slot_tensors[0]) if slot_tensors else 0
    arrays = [hyper[k] for k in names] + [optimizer.step_counter._data]
    arrays += [p._data for _, p, _ in triples] + [g._data for _, _, g in triples]
    arrays += [t._data for slots in slot_tensors for t in slots] + list(checked)
    if guard:
        arrays.append(optimizer._skip_state._data)
    if scale_state is not None:
        arrays.append(scale_state._data)
    scaling = scale_state is not None
    spec = (type(optimizer)._rule, optimizer._config(), optimizer._decay_on(), schedules, names,
            len(triples), per, guard, len(checked), scaling,
            optimizer.loss_scale_growth_interval if scaling else 0)
    new_ps, new_slots, new_skip, new_scale = replay.run(recorded_update_kernel, (spec,),
                                                        arrays, device)
    # (a Deferred until the segment runs; an array, on the tensor's device, when run at once)
    replay.bind_all([p for _, p, _ in triples], new_ps)
    replay.bind_all([t for slots in slot_tensors for t in slots],
                    [a for new_ss in new_slots for a in new_ss])
    if guard:
        replay.bind_all([optimizer._skip_state], [new_skip])
        optimizer._watch_skipped_steps()  # (keeps the pending value: nothing waits)
    if scaling:
        replay.bind_all([scale_state], [new_scale])
