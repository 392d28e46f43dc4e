"""Fused walks: a recurring backward walk as one kernel.

Eagerly every operator's pullback is its own kernel call, and every sum of two gradients a
``jnp`` call: a small model's backward pays a dispatch per op. A walk is a fixed recipe once
its operators, their shapes and their uses are known, so it is first walked symbolically (the
same :func:`~.walk.walk` over value numbers instead of arrays), which writes the recipe as a
plan; a plan seen before runs as one jitted replay over the operators' pullback states (their
residuals, :meth:`Operator.pullback_step`): the same operations in the same order, so the same
gradients up to rounding (XLA fuses across operators, and may then sum in another order). A
graph shaped as one planned before finds its plan by its signature (:class:`_Shape`) without
the symbolic walk. ``autograd.fused_backward(False)`` turns fused walks off.
"""
from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax

from singa_jax._src.autodiff import graph_log
from singa_jax._src.autodiff.operator import Operator
from singa_jax._src.autodiff.walk import walk, walks_into
from singa_jax._src.backend.xla_options import fuses_heavy_walks, kernel
from singa_jax._src.base import observe, process_state
from singa_jax._src.base.modes import is_backward_fused, is_reproducible
from singa_jax._src.base.node import Dummy, Node
from singa_jax._src.eager import replay
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["fused_walk", "fused_backward_walk", "FUSED_WALK_MAX_OPS", "FUSED_WALK_MAX_SMALL_OPS", "FUSED_WALK_SMALL_OP"]

# Eagerly every operator's pullback is its own kernel call, and every sum of two gradients a
# jnp call: a small model's backward pays a dispatch per op. A walk is a fixed recipe once its
# operators, their shapes and their uses are known, so it is first walked symbolically (the
# same _walk over value numbers instead of arrays), which writes the recipe as a plan; a plan
# seen before runs as one jitted replay over the operators' pullback states (their residuals):
# the same operations in the same order, so the same gradients up to rounding (XLA fuses
# across operators, and may then sum in another order).
FUSED_WALK_MAX_OPS = 64  # on a CPU a larger walk compiles for seconds and saves little: its ops


# are heavy (an accelerator fuses it all the same: xla_options.fuses_heavy_walks)
# ... unless every operator is small (outputs of at most FUSED_WALK_SMALL_OP elements): then
# the walk's time is one dispatch per pullback (and on a CPU the wake-up of XLA's worker threads
# after the walk's Python), which the fused kernel removes; such a walk is fused up to this many
FUSED_WALK_MAX_SMALL_OPS = 1024


FUSED_WALK_SMALL_OP = 1 << 15


_PLANS_KEPT = 512  # plans remembered (then fused on recurrence); others walk op by op


_seen_plans: Dict[Tuple, int] = {}  # plan -> -1 when seen once, then its id in _plan_table


_plan_table: list = []  # (steps, outputs) of every plan replayed


_plans_lock = threading.Lock()


class _NotReplayable(Exception):
    """An operator of the walk has no pure pullback (a user's operator, SINGA's conventions)."""


_ADD = "+"


def _small(op: Operator) -> bool:
    """Whether ``op``'s outputs have at most FUSED_WALK_SMALL_OP elements in all."""
    size = op.output_elements()
    return size is not None and size <= FUSED_WALK_SMALL_OP


class _Plan:
    """What a symbolic walk records: ``steps`` (``(_ADD, a, b)`` or ``(k, pull, spec, dy refs)``
    for the k-th operator), ``states`` (each operator's pullback state) and the number of
    values so far (roots first, then each step's results in order)."""

    def __init__(self, n_roots: int, pending: bool = False, heavy: bool = False):
        self.steps: list = []
        self.states: list = []
        self.ops: list = []
        self.n_values = n_roots
        self.small = True  # every operator small (see FUSED_WALK_SMALL_OP; known from op 64 on)
        self.pending = pending  # whether the states may stay pending (Deferred leaves)
        self.heavy = heavy  # whether heavy operators are fused too (xla_options.fuses_heavy_walks)

    def new(self) -> int:
        self.n_values += 1
        return self.n_values - 1

    def add(self, a: int, b: int) -> int:
        self.steps.append((_ADD, a, b))
        return self.new()

    def run(self, op: Operator, dys: list) -> Tuple[Any, ...]:
        n = len(self.ops)
        if n >= FUSED_WALK_MAX_OPS:  # only a walk of small operators goes on (on a CPU)
            if n >= FUSED_WALK_MAX_SMALL_OPS:
                raise _NotReplayable
            if not self.heavy:
                if n == FUSED_WALK_MAX_OPS:
                    self.small = all(map(_small, self.ops))
                if not self.small or not _small(op):
                    raise _NotReplayable
        step = op.pullback_step(True) if self.pending else op.pullback_step()
        if step is None:
            raise _NotReplayable
        pull, spec, state, gives = step
        self.steps.append((len(self.ops), pull, spec, tuple(dys)))
        self.states.append(state)
        self.ops.append(op)
        return tuple(self.new() if g else None for g in gives)


def fused_walk(roots: Sequence[Tuple[Tensor, Any]], wanted: Dict[Tuple[Node, int], Tensor],
                record: bool = False) -> Optional[Tuple[list, list, Any]]:
    """(operators walked, the walk's yields, their device) computed by one replay kernel, or
    None when this walk goes op by op: inside a trace (already one program), fused walks off,
    an operator without a pure pullback, several devices, or a plan not seen before.

    With ``record`` (a walk that retains the graph), while eager replay records the forward's
    segment on the walk's device, the replay kernel is recorded into it too (its yields are
    Deferred) and the pullback states it reads are marked soft
    (:func:`~singa_jax._src.eager.replay.soften`): a training step's residuals then never
    leave the segment's program. Otherwise the pullback states are computed first (a flush).
    A recorded walk from one root at a point of a recurring sequence where the same walk was
    recorded over a graph of the same log (:mod:`.graph_log`) is recorded again without
    reading the graph (no operators are returned then: nothing to release)."""
    if not is_backward_fused() or any(isinstance(g, jax.core.Tracer) for _, g in roots):
        return None
    heavy = fuses_heavy_walks(roots[0][0].device.platform)
    again = None
    if record and len(roots) == 1 and not wanted and not observe.on:
        graph_log.want()  # (this thread's next steps keep the log it needs)
        again = _WalkAgain.find(roots[0], heavy)
        if again is not None and again.walk is not None:
            yields = again.walk.record(again.segment, roots[0])
            if yields is not None:
                return [], yields, again.segment.device
    shape = _Shape.of(roots, wanted, record, heavy)
    known = None if shape is None else _known_shapes.get(shape.signature)
    if known is not None:  # a walk of a graph shaped as one planned before: no symbolic walk
        plan_id, order, places = known
        ops = [shape.ops[k] for k in order]
        states = [shape.states[k] for k in order]
        yields = [shape.tensor_at(place, roots, wanted) for place in places]
    else:
        plan = _Plan(len(roots), pending=record, heavy=heavy)
        try:
            yields = list(walk([(y, i) for i, (y, _) in enumerate(roots)], wanted, plan.run,
                                plan.add))
        except _NotReplayable:
            return None
        if not plan.ops:
            return None
        ops, states = plan.ops, plan.states
    device = ops[0].device
    if any(op.device is not device for op in ops):
        return None
    if known is None:
        plan_id = _plan_id((tuple(plan.steps), tuple(ref for _, ref, _ in yields)))
        if plan_id is None:  # first seen: op by op, and remembered
            return None
        if shape is not None and len(_known_shapes) < _PLANS_KEPT:
            _known_shapes[shape.signature] = (plan_id, shape.order_of(ops),
                                              shape.places_of([x for x, _, _ in yields], roots,
                                                              wanted))
    leaves = [leaf for state in states for leaf in state]
    sizes = tuple([len(state) for state in states])
    at = device if record and replay.pending(device) else None
    if at is not None and again is not None:
        again.before(replay.recording_segment(at))
    values = replay.run(fused_backward_walk, (plan_id, sizes), leaves + [g for _, g in roots],
                        at)
    if at is not None:
        replay.soften(leaves)
        if again is not None:
            again.learn(roots[0], [x for x, _, _ in yields])
    return ops, [(x, v, name) for (x, _, name), v in zip(yields, values)], device


class _RecordedWalk:
    """A walk recorded at one point of a recurring sequence, as it is recorded there again:
    the node of replay's tree its call leads to, where its outside inputs are among the
    segment's (all but the last: the root's gradient), which of its inputs it marked soft, and
    per yield the place of its tensor in the log's ``kept`` (-1: the root)."""

    __slots__ = ("node", "outside", "soft", "yields")

    def __init__(self, node: Any, outside: Tuple[int, ...], soft: Tuple[int, ...],
                 yields: Tuple[int, ...]):
        self.node, self.outside, self.soft, self.yields = node, outside, soft, yields

    def record(self, segment: Any, root: Tuple[Tensor, Any]) -> Optional[list]:
        """Record this walk into ``segment`` again, from ``root``: its yields, or None."""
        y, g = root
        externals = segment.externals
        values = replay.record_again(segment, self.node,
                                     [externals[i] for i in self.outside] + [g], self.soft)
        if values is None:
            return None
        kept = segment.graph.kept
        yields = []
        for k, v in zip(self.yields, values):
            x = y if k < 0 else kept[k]
            creator = x.creator
            yields.append((x, v, creator.grad_name(creator.y_id2idx[id(x)])))
        return yields


_walks_again: Dict[Tuple, _RecordedWalk] = {}


class _WalkAgain:
    """A recorded walk's key in :data:`_walks_again` -- the log's entries, the root's place in
    it, the point of the sequence, the limits a plan is accepted under -- and what learning it
    needs (see :func:`fused_walk`)."""

    __slots__ = ("segment", "key", "walk", "start")

    @classmethod
    def find(cls, root: Tuple[Tensor, Any], heavy: bool) -> Optional["_WalkAgain"]:
        """The key of a walk from ``root`` (and the walk recorded under it before, if any), or
        None when this walk cannot be recorded again: no segment recording, its log not
        valid, the root not made in it, a root gradient that is not an array."""
        y, g = root
        if type(g) is not replay.ArrayImpl:
            return None
        segment = replay.recording_segment(y.device)
        log = None if segment is None else segment.graph
        if log is None or not log.settle().valid:
            return None
        creator = y.creator
        p = graph_log.position(log, creator)
        if p < 0:
            return None
        found = object.__new__(cls)
        found.segment = segment
        found.key = (tuple(log.entries), p, creator.y_id2idx[id(y)], segment.step, heavy,
                     FUSED_WALK_MAX_OPS, FUSED_WALK_MAX_SMALL_OPS, FUSED_WALK_SMALL_OP)
        found.walk = _walks_again.get(found.key)
        found.start = None
        return found

    def before(self, segment: Any) -> None:
        """Called just before the walk's call is recorded into ``segment``."""
        if segment is self.segment:
            self.start = (segment.step, len(segment.externals), len(segment.soft))

    def learn(self, root: Tuple[Tensor, Any], xs: Sequence[Tensor]) -> None:
        """After the walk from ``root`` yielding ``xs`` was recorded: remember it, if its call
        is the segment's last and every input it took from outside the segment is one that
        exactly one call of the segment took before (a forward's input: the array at that
        place of the segment's inputs next time)."""
        segment, start = self.segment, self.start
        if start is None or segment.done or segment.graph is None or \
                len(_walks_again) >= _PLANS_KEPT:
            return
        node, n_outside, n_soft = start
        if segment.step.parent is not node:  # (not the walk's call alone since)
            return
        externals = segment.externals
        if len(externals) <= n_outside or externals[-1] is not root[1]:
            return
        at: Dict[int, Optional[int]] = {}
        for i, a in enumerate(externals[:n_outside]):
            at[id(a)] = None if id(a) in at else i  # (an array taken twice: no one place)
        outside = [at.get(id(a)) for a in externals[n_outside:-1]]
        kept_at = segment.graph.settle().kept_at
        places = [-1 if x is root[0] else kept_at.get(id(x)) for x in xs]
        if None in outside or None in places:
            return
        _walks_again[self.key] = _RecordedWalk(segment.step, tuple(outside),
                                               tuple(segment.soft[n_soft:]), tuple(places))


def _plan_id(key: Tuple) -> Optional[int]:
    """The id in ``_plan_table`` of the plan ``key`` (its steps and outputs) -- given on its
    second walk (on its first under ``reproducible``) -- or None the first time (then
    remembered, while fewer than _PLANS_KEPT)."""
    plan_id = _seen_plans.get(key)
    if plan_id is None or plan_id < 0:
        with _plans_lock:  # threads walking at once must not share an id
            plan_id = _seen_plans.get(key)
            if plan_id is None:
                if len(_seen_plans) < _PLANS_KEPT:
                    _seen_plans[key] = -1
                if not is_reproducible():  # (reproducible: fused from the first walk)
                    return None
                plan_id = -1
            if plan_id < 0:
                plan_id = _seen_plans[key] = len(_plan_table)
                _plan_table.append(key)
    return plan_id


# A planned walk's signature (see _Shape) -> (plan id, its operators' order in the walk as
# numbers of _Shape.ops, where each yielded tensor is found): a walk of the same signature
# finds its plan here without walking symbolically.
_known_shapes: Dict[Tuple, Tuple[int, Tuple[int, ...], list]] = {}


class _Shape:
    """The shape of the graph a walk would take, read in one breadth-first pass: everything
    :func:`_walk` decides by -- each node met (numbered in the order met), each operator's
    pullback step (function, spec, which inputs get a gradient), each edge (the node it comes
    from, which of its outputs, whether that tensor stores its gradient or is wanted, whether
    the node is a leaf, is walked into, has several outputs) -- in one flat ``signature``. Two
    graphs of one signature give the same plan and the same yields in the same places, so a
    walk of a signature planned before skips the symbolic walk (:func:`fused_walk`)."""

    __slots__ = ("signature", "ops", "states")

    @classmethod
    def of(cls, roots: Sequence[Tuple[Tensor, Any]], wanted: Dict[Tuple[Node, int], Tensor],
           pending: bool, heavy: bool) -> Optional["_Shape"]:
        """The shape of the walk from ``roots``, or None where it cannot be a fused walk (an
        operator without a pure pullback, a freed one, more than a fused walk takes)."""
        tracked = any(y.tracked for y, _ in roots)
        numbers: Dict[Node, int] = {}
        ops: list = []
        # (with the limits a plan is accepted under: tests change them)
        sig: list = [tracked, heavy, pending, len(roots), bool(wanted), FUSED_WALK_MAX_OPS,
                     FUSED_WALK_MAX_SMALL_OPS, FUSED_WALK_SMALL_OP]
        add = sig.append
        for y, _ in roots:
            node = y.creator
            n = numbers.get(node)
            if n is None:
                n = numbers[node] = len(numbers)
                walks = walks_into(node, tracked)
                if walks:
                    ops.append(node)
                add(walks)
            ids = node.y_id2idx
            add(n)
            add(ids[id(y)])
            add(len(ids))
            add(y.stores_grad)
            add(bool(wanted) and (node, id(y)) in wanted)
        states = []
        extend = sig.extend
        for op in ops:  # grows while it is read
            if op.freed or len(ops) > FUSED_WALK_MAX_SMALL_OPS:
                return None
            step = op.pullback_step(pending)
            if step is None:
                return None
            pull, spec, state, gives = step
            states.append(state)
            src = op.src
            extend((pull, spec, gives, len(src)))
            for src_op, x_id, _, stores_grad in src:
                ids = src_op.y_id2idx
                n = numbers.get(src_op)
                if n is None:  # a node met first: whether it is a leaf or walked into, too
                    n = numbers[src_op] = len(numbers)
                    if isinstance(src_op, Dummy):
                        extend((False, True, n, ids.get(x_id, -1), len(ids), stores_grad))
                    else:
                        # (_walks_into's test, its first half inline: most nodes are ops)
                        walks = src_op.requires_grad and (not tracked or
                                                          walks_into(src_op, True))
                        if walks:
                            ops.append(src_op)
                        extend((walks, False, n, ids.get(x_id, -1), len(ids), stores_grad))
                else:
                    extend((n, ids.get(x_id, -1), len(ids), stores_grad))
                if wanted:
                    add((src_op, x_id) in wanted)
        shape = object.__new__(cls)
        shape.signature, shape.ops, shape.states = tuple(sig), ops, states
        return shape

    def order_of(self, ops: Sequence[Operator]) -> Tuple[int, ...]:
        """The numbers (in :attr:`ops`) of ``ops``, a walk's operators in its order."""
        number = {op: k for k, op in enumerate(self.ops)}
        return tuple([number[op] for op in ops])

    def places_of(self, xs: Sequence[Tensor], roots: Sequence[Tuple[Tensor, Any]],
                  wanted: Dict[Tuple[Node, int], Tensor]) -> List[Tuple[int, int]]:
        """Where a walk finds each yielded tensor of ``xs``: ``(-1, i)`` the i-th root, ``(k,
        j)`` the j-th input of operator ``k`` (held there as a tensor that stores its gradient,
        or wanted). Two places of one signature that hold one tensor hold one tensor in every
        graph of that signature (an edge's node and output are in the signature)."""
        places: Dict[int, Tuple[int, int]] = {}
        for i, (y, _) in enumerate(roots):
            places.setdefault(id(y), (-1, i))
        for k, op in enumerate(self.ops):
            for j, (src_op, x_id, kept, stores_grad) in enumerate(op.src):
                x = kept if stores_grad else wanted.get((src_op, x_id))
                if x is not None and id(x) == x_id:
                    places.setdefault(x_id, (k, j))
        return [places[id(x)] for x in xs]

    def tensor_at(self, place: Tuple[int, int], roots: Sequence[Tuple[Tensor, Any]],
                  wanted: Dict[Tuple[Node, int], Tensor]) -> Tuple[Tensor, None, str]:
        """``(tensor, None, its gradient's name)`` for the tensor at ``place`` (see
        :meth:`places_of`), as :func:`_walk` yields it (the value comes from the plan)."""
        k, j = place
        if k < 0:
            y = roots[j][0]
            return y, None, y.creator.grad_name(y.creator.y_id2idx[id(y)])
        src_op, x_id, x, stores_grad = self.ops[k].src[j]
        return (x if stores_grad else wanted[src_op, x_id]), None, \
            src_op.grad_name(src_op.y_id2idx[x_id])


def _apply_pullback(vjp: Callable, cotangents: Any) -> Any:
    return vjp(cotangents)


@partial(kernel, static_argnums=(0, 1))
def fused_backward_walk(plan_id: int, sizes: Tuple[int, ...], *leaves: jax.Array) -> list:
    """Plan ``plan_id`` (its steps and outputs in ``_plan_table``: the id keeps the kernel's
    cache key short) run on the pullback states -- the first ``sum(sizes)`` of ``leaves``,
    ``sizes[k]`` for the k-th operator -- from the roots' gradients (the rest). Flat leaves, so
    that eager replay can record the call like any kernel's."""
    steps, outs = _plan_table[plan_id]
    states, at = [], 0
    for n in sizes:
        states.append(list(leaves[at:at + n]))
        at += n
    values = list(leaves[at:])
    for step in steps:
        if step[0] is _ADD:
            values.append(values[step[1]] + values[step[2]])
        else:
            k, pull, spec, refs = step
            dxs = pull(spec, states[k], [None if r is None else values[r] for r in refs],
                       _apply_pullback)
            values.extend(d for d in dxs if d is not None)
    return [values[r] for r in outs]


@process_state.register
def _forget_plans() -> None:
    """Forget which walks were seen and planned (plan ids stay unique: each id keys a compiled
    kernel), so the next walks are planned as if for the first time."""
    with _plans_lock:
        _seen_plans.clear()
        _known_shapes.clear()
        _walks_again.clear()
