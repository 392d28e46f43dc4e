"""An update remembered by its layout: the per-parameter checks and slot lookups of an update
whose parameters, names, avals, devices, slot kinds and states version equal the last checked
update's are skipped (an eager loop's every update after its first)."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from singa_jax._src.tensor.tensor import Tensor

if TYPE_CHECKING:
    from singa_jax._src.optim.optimizers import Optimizer

__all__ = ["UpdateLayout", "aval_of", "device_of"]


_param_of, _grad_of, _name_of = (operator.itemgetter(i) for i in (1, 2, 0))


aval_of = operator.attrgetter("_data.aval")


device_of = operator.attrgetter("device")


class UpdateLayout:
    """What an update's checks and slot lookup depend on, read in C-level passes over its
    ``(name, param, grad)`` triples: the params (by identity), their names, avals and devices,
    the grads' avals (the params' own: the usual pairs), the slot kinds and the optimizer's
    states version. An update whose layout equals the last checked one's takes that one's slot
    Tensors with its checks skipped, since nothing they read has changed -- a param's or
    grad's shape or dtype, a name, a device, a slot made or replaced (the version), or a slot
    holding an array of another aval or device (:meth:`Optimizer._remembered_slots` reads those
    each time): an eager loop's every update after its first. Only for a class that keeps
    Optimizer's own checks and slots."""

    __slots__ = ("key", "params", "slot_tensors", "flat_slots", "slot_avals", "slot_devices")

    @classmethod
    def of(cls, optimizer: "Optimizer", triples: Sequence[Tuple[Any, Tensor, Tensor]],
           kinds: Sequence[str]) -> Optional["UpdateLayout"]:
        """The layout of an update of ``triples``, or None where it is not remembered (pairs
        that are not two Tensors of one aval). The caller's class keeps Optimizer's own checks
        and slots."""
        params, grads = list(map(_param_of, triples)), list(map(_grad_of, triples))
        types = set(map(type, params))
        types.update(map(type, grads))
        if types != {Tensor}:
            return None
        avals = list(map(aval_of, params))
        if list(map(aval_of, grads)) != avals:
            return None
        layout = object.__new__(cls)
        layout.key = (list(map(id, params)), list(map(_name_of, triples)), avals,
                      list(map(device_of, params)), tuple(kinds), optimizer.states_version)
        layout.params = params  # (held, so that their ids stay theirs)
        return layout

    def remember(self, optimizer: "Optimizer", slot_tensors: List[List[Tensor]]) -> None:
        """Keep this layout, checked, with its slot Tensors as ``optimizer``'s last."""
        self.key = self.key[:-1] + (optimizer.states_version,)  # (after slots were made)
        self.slot_tensors = slot_tensors
        self.flat_slots = [t for slots in slot_tensors for t in slots]
        self.slot_avals = list(map(aval_of, self.flat_slots))
        self.slot_devices = list(map(device_of, self.flat_slots))
        # (not an attribute assignment, which would bump the states version)
        optimizer.__dict__["_update_layout"] = self
