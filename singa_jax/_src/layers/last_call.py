"""A one-operator layer's call recorded straight from its last call's recipe.

A layer such as ``Conv2d``, ``BatchNorm2d`` or ``ReLU`` makes, per call, one operator from its
input and its own parameters. Before that operator is recorded (see
:mod:`singa_jax._src.autodiff.recipes`), the call passes the layer's ``__call__``, its
``forward`` wrapper (initialisation, remat, observers), ``forward``'s checks of the input's shape,
device and dtype, and the op's functional form -- on a dispatch-bound network about a quarter of
an operator's host cost, and all of it derived from what the recipe checks anyway: the inputs'
avals and devices, the layer's structure and the modes.

So a layer class that promises "my call is one operator of a kind, on my inputs followed by
tensors of mine, as long as my structure does not change" (:func:`one_operator`) learns its
call: :func:`learn` runs ``forward`` once while :data:`recipes.captured` notes the operator
calls made, and keeps a :class:`LastCall` when exactly one operator was made, through its
kind's recipe, on the call's inputs followed by tensors of the layer, and its output was
returned. The next call with the same structure version, number of inputs and modes, with
replay active and no observer, records that recipe on ``(*inputs, *tensors)`` directly; the
recipe checks each input's aval, device and gradient flags, and any mismatch sends the call
down the whole path (which learns again). A subclass is a class of its own: it learns only if
it is itself declared.
"""
from __future__ import annotations

import operator
from typing import Any, Hashable, Optional, Tuple

from singa_jax._src.autodiff import recipes
from singa_jax._src.autodiff.operator import op_numbers
from singa_jax._src.base import observe
from singa_jax._src.base.modes import operator_modes
from singa_jax._src.eager import replay

__all__ = ["LastCall", "learn", "one_operator", "ATTRIBUTE"]

ATTRIBUTE = "_last_call"  # where a layer keeps its LastCall (not copied with the layer)

# an instance attribute of one of these names would change what the call does
_OVERRIDES = ("forward", "initialize", "device_check", "dtype_check")


class LastCall:
    """A layer's last call, as the operator kind it recorded: the recipe holder and key, the
    modes it ran in, the number of inputs and the layer's own tensors that followed them."""

    __slots__ = ("version", "n_inputs", "holder", "key", "modes", "tensors")

    def __init__(self, version: int, n_inputs: int, holder: dict, key: Hashable,
                 modes: Tuple, tensors: Tuple[Any, ...]):
        self.version, self.n_inputs, self.holder, self.key = version, n_inputs, holder, key
        self.modes, self.tensors = modes, tensors

    def again(self, layer: Any, inputs: Tuple[Any, ...]) -> Optional[Any]:
        """The layer's output on ``inputs`` recorded from the recipe, or None: the call goes
        the whole way (another structure, signature or mode; a forward patched onto the class
        since it was declared, which is not vouched for; replay off; an observer)."""
        cls = type(layer)
        if layer.__dict__.get("_structure_version", 0) != self.version or \
                len(inputs) != self.n_inputs or observe.on or not recipes.ENABLED or \
                cls.forward is not cls._one_operator_forward or not replay.active() or \
                operator_modes() != self.modes:
            return None
        recipe = self.holder.get(self.key)
        if recipe is None:
            return None
        return recipe.record(inputs + self.tensors)


def learn(layer: Any, inputs: Tuple[Any, ...]) -> Any:
    """``layer.forward(*inputs)``, keeping the call as the layer's :class:`LastCall` when it
    was one operator recorded from its kind's recipe (else forgetting the last one)."""
    state = layer.__dict__
    outer = recipes.captured.calls
    calls = recipes.captured.calls = []
    made = op_numbers[0]
    try:
        y = layer.forward(*inputs)
    finally:
        recipes.captured.calls = outer
    last = None
    if len(calls) == 1 and op_numbers[0] == made + 1:
        holder, key, modes, xs, out = calls[0]
        n = len(inputs)
        if out is y and len(xs) >= n and all(map(operator.is_, xs, inputs)) and \
                not any(map(state.__contains__, _OVERRIDES)):
            last = LastCall(state.get("_structure_version", 0), n, holder, key, modes,
                            tuple(xs[n:]))
    if outer is not None:  # (a layer around this one learns too: it saw these calls)
        outer += calls
    if last is not None:
        state[ATTRIBUTE] = last
    else:
        state.pop(ATTRIBUTE, None)
    return y


def one_operator(cls: type) -> type:
    """Class decorator: calls of ``cls`` (not of its subclasses), through the ``forward`` it
    defines (not one patched onto it later), make one operator of a kind on their inputs
    followed by tensors of the layer, while its structure does not change -- so a call may be
    recorded from the last one's recipe (see the module's docstring)."""
    cls._one_operator_class = cls
    cls._one_operator_forward = cls.__dict__["forward"]
    return cls
