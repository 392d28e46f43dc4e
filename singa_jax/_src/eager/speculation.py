"""Speculation: a recurring replay segment's program starts before its recording ends.

A replayed program is dispatched at the flush, once the host has recorded the whole sequence:
on an accelerator the device idles for all of the step's Python (SINGA's ResNet-50 on an H200:
~12 ms of a 35 ms step). But the inputs of a recurring training step are mostly known early:
parameters, buffers and optimizer slots are the outputs of the previous step's program,
hyperparameters are the same arrays as last time, and the batch is the Model call's arguments.
So when a segment reaches the point after which every outside input can be predicted (a
:class:`Plan`, learnt from two flushes of the same sequence), the program is called there on
the predicted inputs, and runs on the device while the host records the rest. At the flush its
outputs are used only if the segment recorded exactly that sequence and every outside input IS
(identity, not equality) the predicted array: the outputs are then those the program would
have computed from those very arrays. Otherwise they are dropped, and the program runs on the
recorded inputs as before. A plan that keeps missing is dropped.

This module holds the plans: how one is learnt (:func:`learn_plan`), how it predicts
(:func:`predict`) and how it is dropped. Eager replay (:mod:`.replay`) calls the programs.
"""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:  # the concrete jax.Array class (see .replay)
    from jax._src.array import ArrayImpl as ArrayImpl
except ImportError:
    class ArrayImpl:  # type: ignore[no-redef]
        pass

__all__ = ["Plan", "learn_plan", "predict", "missed"]

# where a predicted input comes from (see Plan)
_AGAIN, _OUTPUT, _SAME, _ARGUMENT, _HELD = range(5)
# mispredictions in a row that drop a plan
_MISSES = 2
# the longest wait, in flushes, before learning again after failed attempts (it doubles with
# each: a sequence whose inputs cannot be predicted costs little)
_LONGEST_WAIT = 64
# calls that must be left to record after a plan's trigger: one (a user's loop's loss reads the
# batch's labels, and after it come only the walk, the update and the step: three calls, but
# most of the step's Python after the forward)
_MIN_AHEAD = 1
_AVAL = operator.attrgetter("aval")


class Plan:
    """How to predict the outside inputs of a segment ending at the sequence node ``end`` from
    the point (the node ``trigger``, after the call that binds the last unpredictable input,
    ``start`` inputs bound) onwards. Per later input, its source: ``(_AGAIN, k)`` the segment's
    input ``k`` again, ``(_OUTPUT, j)`` output ``j`` of the program's last run (``values``),
    ``(_SAME, array)`` the same array as last time, ``(_ARGUMENT, (i, aval))`` array ``i`` the
    Model call started with (see ``replay.call_arguments``), if it still has that aval,
    ``(_HELD, ref)`` the array the Tensor ``ref()`` holds (a parameter another segment's
    program updated: an evaluation forward after training steps).

    The sources are kept as one gather (a step's thousand inputs are predicted without a
    Python loop over them): ``gather`` indexes the pool ``(*the inputs bound, *same arrays,
    *held Tensors' arrays, *arguments, *values)``."""

    __slots__ = ("end", "trigger", "live", "start", "values", "misses", "same", "held",
                 "arguments", "avals", "gather")

    def __init__(self, end: Any, trigger: Any, live: Optional[Tuple[int, ...]], start: int,
                 sources: List[Tuple[int, Any]], values: List[Any]):
        self.end, self.trigger, self.live, self.start = end, trigger, live, start
        self.values = values
        self.misses = 0  # in a row
        same, held, arguments = [], [], []
        for kind, x in sources:
            if kind == _SAME:
                same.append(x)
            elif kind == _HELD:
                held.append(x)
            elif kind == _ARGUMENT:
                arguments.append(x)
        self.same, self.held = tuple(same), tuple(held)
        self.arguments = tuple([i for i, _ in arguments])
        self.avals = [aval for _, aval in arguments]
        at = {_SAME: start, _HELD: start + len(same)}
        at[_ARGUMENT] = at[_HELD] + len(held)
        at[_OUTPUT] = at[_ARGUMENT] + len(arguments)
        gather: List[int] = []
        for kind, x in sources:
            if kind == _AGAIN:  # (an input bound before the trigger, or an earlier source's)
                gather.append(x if x < start else gather[x - start])
            elif kind == _OUTPUT:
                gather.append(at[_OUTPUT] + x)
            else:
                gather.append(at[kind])
                at[kind] += 1
        self.gather = tuple(gather)


def predict(plan: Plan, bound: List[Any], arguments: Sequence[Any]) -> Optional[List[Any]]:
    """The inputs ``plan`` predicts for its segment: ``bound`` (the inputs recorded so far),
    then the rest; None when a prediction cannot be made now (counted as a miss where a
    source is gone: a held Tensor's array, a Model call's argument of another shape)."""
    if len(bound) != plan.start:
        return None
    held = [None if t is None else t._data for t in map(operator.call, plan.held)]
    if plan.arguments:
        if max(plan.arguments) >= len(arguments):
            missed(plan)  # (a loop that makes no Model call would need another plan)
            return None
        arguments = list(map(arguments.__getitem__, plan.arguments))
        # (e.g. a smaller last batch: a second time in a row drops the plan)
        if not all(map(operator.is_, map(type, arguments), repeat(ArrayImpl))) or \
                list(map(_AVAL, arguments)) != plan.avals:
            missed(plan)
            return None
    else:
        arguments = ()
    if not all(map(operator.is_, map(type, held), repeat(ArrayImpl))):
        missed(plan)
        return None
    pool = (*bound, *plan.same, *held, *arguments, *plan.values)
    return [*bound, *map(pool.__getitem__, plan.gather)]


def missed(plan: Plan) -> None:
    """A prediction of ``plan`` failed: one miss (e.g. where the training loop's phase changed
    -- an evaluation, a checkpoint loaded) keeps the plan; a second in a row drops it."""
    plan.misses += 1
    if plan.misses >= _MISSES:
        _drop(plan)


def _drop(plan: Plan) -> None:
    if plan.trigger.speculate is plan:
        plan.trigger.speculate = None
    end = plan.end
    if end.plan is plan:
        end.plan = None
        _failed(end)


def _failed(end: Any) -> None:
    end.fails += 1
    end.wait = min(2 ** end.fails, _LONGEST_WAIT)
    end.last = None


def _holders(refs: Sequence[Any]) -> Dict[int, Any]:
    """id of the array each live Tensor of ``refs`` (weak references) holds -> its reference."""
    holders = {}
    for ref in refs:
        t = ref()
        if t is not None:
            holders[id(t._data)] = ref
    return holders


def learn_plan(end: Any, live: Optional[Tuple[int, ...]], last: Tuple, values: List[Any],
               externals: List[Any], arguments: Sequence[Any], calls: Sequence[Tuple],
               rebound: Sequence[Any]) -> None:
    """Learn the plan of the sequence ending at ``end`` from its flush just run (outside inputs
    ``externals``, outputs ``values``, the Model call's ``arguments``, the ``calls`` recorded)
    and the last one (``last``: its live outputs, its inputs' ids, its outputs), with the
    Tensors the flush before rebound (``rebound``, weak references); set it on ``end`` and on
    its trigger node, or count a failure."""
    _, last_ids, last_values = last
    outputs = {id(v): j for j, v in enumerate(last_values)}
    argument_at = {id(a): i for i, a in enumerate(arguments)}
    holders = _holders(rebound)
    first: Dict[int, int] = {}
    sources: List[Any] = []
    unknown = -1
    for k, e in enumerate(externals):
        i = id(e)
        holder = holders.get(i)
        if first.setdefault(i, k) != k:
            sources.append((_AGAIN, first[i]))
        elif i in argument_at:
            sources.append((_ARGUMENT, (argument_at[i], e.aval)))
        elif i in outputs:
            sources.append((_OUTPUT, outputs[i]))
        elif holder is not None and getattr(holder(), "_data", None) is e:
            sources.append((_HELD, holder))
        elif k < len(last_ids) and last_ids[k] == i:
            sources.append((_SAME, e))
        else:
            sources.append(None)
            unknown = k
    # the trigger: the call that binds the last unpredictable input (or the first call)
    bound = 0
    for depth, (_, _, inputs) in enumerate(calls, 1):
        bound += sum([type(r) is not int for r in inputs])
        if bound > unknown:
            break
    if len(calls) - depth < _MIN_AHEAD:  # (nothing much would run ahead)
        _failed(end)
        return
    trigger = end
    for _ in range(len(calls) - depth):
        trigger = trigger.parent
    end.last = None
    end.plan = trigger.speculate = Plan(end, trigger, live, bound, sources[bound:], values)
