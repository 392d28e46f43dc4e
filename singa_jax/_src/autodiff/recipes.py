"""The recording path per operator kind: an operator call shaped like the last call of its kind
is recorded without the generic path's derivations.

An operator *kind* is an op class with fixed configuration: a table's ``ReLU``, a
convolution handle's ``_Conv2d``, a batch-norm handle's ``_BatchNorm2d`` over its running
statistics. The generic path of a call -- the op's constructor, the engine's ``_do_forward``,
``Function.forward`` and its training-mode half -- derives, every call, what depends only on
the call's *signature*: each input's aval, ``requires_grad``, ``stores_grad`` and whether it
is a leaf; the device; the modes (grad, training, autocast). From the same signature come the
same gradient mask, kernel, static key, differentiated inputs and output spec. So the first
call of a kind goes the generic way and leaves a :class:`Recipe` -- the operator's state
that is not per call, and the kernel's replay key -- and a later call with the same
signature builds its operator from the recipe and hands the kernel to :func:`replay.run`
directly: the operator, its graph edges, its pullback and its output Tensor are those the
generic path makes (``tests/test_kinds.py`` compares them field by field). Any other call --
another signature, a mode changed, replay off, a trace running, an input tracked by
PyTorch-style autograd, a kind with a PRNG key or several outputs -- takes the generic path,
which then leaves the recipe for its own signature (one per kind, key and modes: the last).
``SINGA_JAX_KIND_RECIPES=0`` (or :data:`ENABLED` set False) makes every call generic.

On the dispatch-bound network of ``bench_eager.py`` this is most of an operator's host cost
that is not replay's record itself.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, Tuple

import jax

from singa_jax._src.autodiff import graph_log, residuals
from singa_jax._src.autodiff.function import Function, NonDifferentiable
from singa_jax._src.autodiff.kernels import (FLAT, forward_kernel, forward_vjp_kernel, interned,
                                             kept_pullback, op_error, split_state, store_writes)
from singa_jax._src.autodiff.operator import op_numbers
from singa_jax._src.autodiff.residuals import Residuals
from singa_jax._src.base import observe, process_state
from singa_jax._src.base.env import flag
from singa_jax._src.base.modes import operator_modes
from singa_jax._src.base.node import Dummy
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["Recipe", "kind_call", "recorded_by_kind", "new_holder", "ENABLED", "captured"]

# False (``SINGA_JAX_KIND_RECIPES=0``): every call takes the generic path (for comparisons)
ENABLED = flag("SINGA_JAX_KIND_RECIPES")

# an operator's attributes that each call sets (the rest is the kind's, for one signature)
_PER_CALL = frozenset({"name", "src", "y_id2idx", "_pullback", "_flat", "_all_inputs",
                       graph_log.POSITION})
_RECIPES_KEPT = 64  # per holder (a handle, the table's classes): keys beyond these go generic
_SERIALS = itertools.count()


class Recipe:
    """How the last call of one operator kind was recorded, for a call of the same signature.

    ``inputs`` holds per input ``(aval, requires_grad, stores_grad, leaf)``; ``attrs`` the
    operator's state that is not per call (``static``, the kernel key, the handle, the
    gradient mask, the output spec...); ``statics`` the kernel's replay statics; ``keeps``
    whether the call kept a pullback (training mode), ``every`` the mask a direct SINGA-style
    backward needs when the call skipped inputs."""

    __slots__ = ("cls", "fn", "prefix", "attrs", "modes", "inputs", "device", "statics",
                 "keeps", "every", "requires_grad", "stateful", "serial")

    @classmethod
    def learn(cls, op: Function, xs: Sequence[Tensor], modes: Tuple) -> Optional["Recipe"]:
        """The recipe of ``op``'s call on ``xs`` (just made by the generic path), or None for a
        call this path does not take."""
        kind = type(op)
        state = op.__dict__
        if (not isinstance(op, Function) or isinstance(op, NonDifferentiable)
                or not op.replayable or len(op.y_id2idx) != 1 or op.tracked
                or op._several_outputs or (op._declares_state and op.needs_key())
                or state.get("replay_device", 0) is not None or "_static" not in state):
            return None
        device = op.device
        inputs = []
        for x in xs:
            if type(x) is not Tensor or x.device is not device:
                return None
            inputs.append((x._data.aval, x.requires_grad, x.stores_grad,
                           isinstance(x.creator, Dummy)))
        recipe = object.__new__(cls)
        # (what a graph log notes of its operators: a number no other recipe has, which holds
        # nothing alive)
        recipe.serial = next(_SERIALS)
        recipe.cls, recipe.fn, recipe.prefix, recipe.modes = kind, kind.fn, kind.__name__, modes
        recipe.attrs = {k: v for k, v in state.items() if k not in _PER_CALL}
        recipe.inputs, recipe.device = tuple(inputs), device
        recipe.requires_grad = op.requires_grad
        recipe.stateful = op._declares_state
        fn = state.get("_fn", kind.fn)
        n_args = len(xs) + (len(op.reads()) if op._declares_state else 0)
        recipe.keeps = state.get("_pullback") is not None
        if recipe.keeps:
            extras = (False,) * (n_args - len(xs))
            recipe.statics = interned((fn, op._static, op._diff + extras,
                                        len(op.writes()) if op._declares_state else 0))
            every = state.get("_all_inputs")
            recipe.every = None if every is None else every[1]
        else:
            recipe.statics = interned((fn, op._static))
            recipe.every = None
        return recipe

    def record(self, xs: Sequence[Tensor]) -> Optional[Tensor]:
        """The output Tensor of this kind's operator on ``xs`` -- made as the generic path
        makes it -- or None when the call's signature is not this recipe's. The caller found
        replay active (see :func:`kind_call`)."""
        # (the modes are part of the recipe's key in its holder: see kind_call)
        if len(xs) != len(self.inputs) or self.cls.fn is not self.fn:  # (fn replaced since)
            return None
        device = self.device
        src = []
        data = []
        for x, (aval, requires_grad, stores_grad, leaf) in zip(xs, self.inputs):
            if type(x) is not Tensor or x.device is not device or x.tracked or \
                    x.requires_grad != requires_grad or x.stores_grad != stores_grad:
                return None
            creator = x.creator
            a = x._data
            if (type(creator) is Dummy) is not leaf or a.aval != aval:
                return None
            src.append((creator, id(x), x if stores_grad else None, stores_grad))
            data.append(a)
        op = object.__new__(self.cls)
        state = op.__dict__
        state.update(self.attrs)
        n = op_numbers[0]
        op_numbers[0] = n + 1
        state["name"] = name = f"{self.prefix}#{n}"
        state["src"] = src
        writes = ()
        if self.stateful:
            writes = op.writes()
            data += [t._data for t in op.reads()]
        args = tuple(data)
        try:
            if self.keeps:
                outs, step = replay.run_flat(forward_vjp_kernel, self.statics, args, device)
                plan = None
                if step is not None:  # recorded
                    plan = step.memo
                    if plan is None:
                        plan = step.memo = _vjp_plan(step, len(args))
                if plan:
                    # the pullback as the leaves a fused walk takes, gathered now: the walk
                    # reads them as they are
                    ys_at, state_at, layout, positions = plan
                    ys = outs[ys_at]
                    new_state = [outs[i] for i in state_at]
                    state["_pullback"] = FLAT
                    state["_flat"] = (list(map((*args, ys, *outs).__getitem__, positions)),
                                      layout)
                else:
                    ys, pullback, new_state = outs if step is None else \
                        step.treedef.unflatten(outs)
                    state["_pullback"] = kept_pullback(pullback, args, ys, device)
                    state["_flat"] = None
                state["_all_inputs"] = None if self.every is None else (args, self.every)
                if step is not None:  # (noted in the segment's graph log: see graph_log)
                    graph_log.note(outs[0].segment, op, self.serial, src)
            else:
                ys = replay.run(forward_kernel, self.statics, args, device)
                new_state = ()
                if writes:
                    ys, new_state = split_state(ys, len(writes))
        except (TypeError, ValueError) as e:  # (a signature that worked before: not expected)
            raise op_error(self.prefix, args, state.get("static", {}), e) from None
        if writes:
            store_writes(writes, new_state)
        # the output Tensor, as the engine's Operator._output makes it for a recorded value
        # (the trace hook is None: replay is active)
        y = object.__new__(Tensor)
        y._data = ys
        y.device = device
        y.requires_grad = self.requires_grad
        y.stores_grad = False
        y.name = f"{name}:0"
        y.creator = op
        if type(ys) is Deferred:  # (else run at once: a short sequence)
            replay.bind(y, ys)
        state["y_id2idx"] = {id(y): 0}
        return y


def _vjp_plan(step: Any, n_args: int) -> Any:
    """Where a recorded forward_vjp call's flat outputs go: ``(index of the output, indices of
    the new state, the pullback's treedef, each pullback leaf's position in ``(*args, output,
    *flat outputs)``)`` -- what :func:`residuals.leaves` gathers, worked out once per recorded
    call position -- or False for outputs of another form (the generic handling then)."""
    ys, pullback, new_state = step.treedef.unflatten(list(range(len(step.avals))))
    if type(ys) is not int or type(pullback) is not Residuals:
        return False
    state_at = tuple(jax.tree_util.tree_leaves(new_state))
    computed = [n_args + 1 + i for i in pullback.computed]
    positions = tuple(residuals.leaves(Residuals(computed, pullback.layout),
                                       tuple(range(n_args)), (n_args,)))
    return ys, state_at, pullback.layout[0], positions


def recorded_by_kind(cls: type) -> bool:
    """Whether calls of the op class ``cls`` may be recorded from recipes: a
    :class:`~singa_jax.autograd.Function` with a gradient whose forward eager replay may record."""
    return issubclass(cls, Function) and not issubclass(cls, NonDifferentiable) and \
        bool(cls.replayable)


def kind_call(holder: Optional[Dict[Hashable, Any]], key: Hashable, make: Callable[[], Function],
              xs: Sequence[Tensor]) -> Tensor:
    """``make()(*xs)[0]``: the output of the operator of the kind ``holder[key]`` on ``xs`` --
    recorded from the kind's recipe when the call's signature is the last call's, else by the
    generic path, which leaves the recipe of this call. ``holder`` (a handle's or the op
    table's dict; None: the generic path only) keeps one recipe per key and modes (grad,
    training, autocast)."""
    if holder is None or not ENABLED or observe.on or not replay.active():
        return make()(*xs)[0]  # (observers watch the engine's door)
    # one recipe per mode too: a training loop's evaluation in between (or PyTorch-style
    # no_grad) leaves the training call's recipe in place
    modes = operator_modes()
    key = (key, modes)
    recipe = holder.get(key)
    y = None if recipe is None else recipe.record(xs)
    if y is None:
        op = make()
        y = op(*xs)[0]
        if recipe is not None or len(holder) < _RECIPES_KEPT:  # (else recipe is None)
            recipe = holder[key] = Recipe.learn(op, xs, modes)
    calls = captured.calls
    if calls is not None and recipe is not None:
        calls.append((holder, key, modes, xs, y))
    return y


class _Captured(threading.local):
    # while a layer learns its call (see layers.last_call): per call of :func:`kind_call` whose
    # recipe a later call of the same signature records, ``(holder, key with the modes, modes,
    # inputs, output)``
    calls: Optional[list] = None


captured = _Captured()


_HOLDERS: list = []  # the op tables' recipe holders (handles keep theirs on the handle)


def new_holder() -> Dict[Hashable, Any]:
    """A recipe holder for one op table's class (its recipes forgotten by a process reset)."""
    holder: Dict[Hashable, Any] = {}
    _HOLDERS.append(holder)
    return holder


@process_state.register
def _forget_recipes() -> None:
    for holder in _HOLDERS:
        holder.clear()
