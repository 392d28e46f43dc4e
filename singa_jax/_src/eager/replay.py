"""Eager replay: a recurring sequence of eager operators runs as one compiled program.

An eager operator costs the host tens of microseconds between the user's call and the kernel's
dispatch; on an accelerator that, not the arithmetic, sets the speed of a dispatch-bound model.
Replay removes the per-kernel dispatch from a sequence that recurs (an evaluation forward; a
training step's forward, fused backward walk and update), keeping eager semantics whole:

* **Record.** An operator whose kernel's outputs are known for its static arguments and input
  shapes/dtypes (traced once per signature, :mod:`.abstract`; a kernel whose trace
  fails runs at once and raises there) is not run: its kernel call is appended to the
  thread's pending *segment* and its outputs are :class:`Deferred` placeholders with their
  shape and dtype. Tensors hold them as their ``_data``; a Tensor's shape, dtype and creator
  graph are there at once.
* **Flush.** The segment runs when a value is needed: a Tensor's ``array`` is read (``to_numpy``,
  ``scalar``, printing, a NumPy call, an operator that is not replayable, Python control flow on
  a value), a backward pass or an optimizer update starts that is not recorded itself (a fused
  walk and the update that follows it are: see :func:`soften`), an optimizer's call ends, a
  Model call ends, graph mode or a transaction begins, another device is used, or the segment
  reaches :data:`MAX_RECORDS` -- on an accelerator, a piece of
  ``xla_options.REPLAY_PIECE_CALLS`` calls: the device runs each piece while the
  host records the next. Every output still referenced is computed and every Tensor
  rebound to its array, so after a flush no Tensor holds a placeholder.
* **Soft outputs.** A recorded backward walk marks the pullback states it read *soft*: a soft
  output no Tensor holds is not computed at the flush (only pullbacks hold it, and the walk has
  used it), so a training step's residuals never leave its program; the segment keeps the
  calls and inputs they are computed from (the forward's: the parameters, not the optimizer
  slots), and a later read of such a value (a second backward through the same graph) reruns
  those calls op by op (:meth:`_Segment.recompute`).
* **Only long sequences.** A thread records only while its last sequence (the kernels between
  two flushes) had at least :data:`MIN_RECORDS` kernels; shorter ones run op by op, which on a
  CPU overlaps each kernel with the Python of the next op.
* **Replay.** A flushed segment is keyed by its kernels, static arguments, input shapes/dtypes
  and dataflow. The first time a key is seen the kernels run one by one; when it recurs it is
  compiled into ONE program (each kernel inlined, returning the outputs still referenced) that
  later flushes of the same key call with the new inputs. A changed sequence (another branch,
  another shape) is another key: it runs op by op and, if it recurs, gets its own program. A
  segment that cannot be compiled (a kernel reading values on the host) runs op by op from
  then on.
* **Speculation.** Where a recurring segment's remaining outside inputs can be predicted (see
  :mod:`.speculation`), its program is called before the recording ends -- in a Model call,
  right after its first kernel -- and the device runs it while the host records the rest; its
  outputs are used only if every input turned out to be the predicted array.

``autograd.eager_replay(False)`` (a scope or decorator) or ``SINGA_JAX_EAGER_REPLAY=0`` runs
every operator at once, op by op; ``autograd.replay_speculation(False)`` (a scope or decorator)
or ``SINGA_JAX_REPLAY_SPECULATE=0`` turns speculation off. Results equal op-by-op execution up
to XLA's fusion rounding (identical float32 results on the CPU in the tests). This module knows
no operators: callers hand it a kernel ``call`` and its static arguments.
"""
from __future__ import annotations

import collections
import concurrent.futures
import math
import operator
import sys
import threading
from itertools import compress, repeat
from weakref import ref as _weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import jax

try:  # the concrete jax.Array class: an exact type test is the cheapest per-input check
    from jax._src.array import ArrayImpl as ArrayImpl
except ImportError:  # another JAX layout: nothing is recorded (every op runs at once)
    class ArrayImpl:  # type: ignore[no-redef]
        pass

from singa_jax._src.base import observe, process_state
from singa_jax._src.eager import abstract
from singa_jax._src.eager.launcher import launch_in_thread
from singa_jax._src.eager.recompute import FLUSHED, recompute_cone, soft_missing
from singa_jax._src.eager.speculation import Plan, learn_plan, missed, predict
from singa_jax._src.base.env import flag
from singa_jax._src.base.modes import (current_trace_hook, eager_replay_flag,
                                       in_compile_time_eval, is_grad_enabled,
                                       is_replay_speculating, is_reproducible, is_training)
from singa_jax._src.backend.xla_options import (kernel, launches_in_thread, no_trace_running,
                                                replay_piece_calls)

__all__ = ["Deferred", "run", "run_flat", "flush", "bind", "bind_all", "pending", "soften",
           "recording_segment", "record_again", "resolve_tree", "call_arguments", "stats",
           "MAX_RECORDS", "MIN_RECORDS", "COMPILE_ON"]

# Loops over every output or input of a step (a thousand and more) run as C-level maps
_AVAL = operator.attrgetter("aval")
_VALUE = operator.attrgetter("value")
_INDEX = operator.attrgetter("index")
_SEGMENT = operator.attrgetter("segment")
_exhaust = collections.deque(maxlen=0).extend  # runs an iterator to its end


def _set_each(objects: Any, name: str, values: Any) -> None:
    """``setattr(o, name, v)`` for each pair of ``objects`` and ``values``."""
    _exhaust(map(setattr, objects, repeat(name), values))


# a segment is flushed when it holds this many kernel calls (a loop that never reads a value
# would otherwise record without end)
MAX_RECORDS = 4096
# Sequences (the kernels between two flushes: a model call's forward, an evaluation) shorter
# than this are not recorded: the next one runs op by op. On the CPU each op-by-op kernel runs
# on the second core while Python builds the next op; a short recorded sequence gives that
# overlap up and saves few dispatches (SINGA's eager MLP step, 6 forward kernels: 1.24x slower
# recorded, measured in one run); a long one saves a dispatch per kernel (the 100-block network,
# 303). Decided per thread at each flush from the sequence that just ended.
MIN_RECORDS = 32
# a segment key is compiled on this occurrence (the first runs op by op: most sequences that
# occur once never recur, and compiling them would only cost)
COMPILE_ON = 2


class Deferred:
    """The value of a recorded kernel output: its aval now, its array once its segment flushed."""

    __slots__ = ("aval", "shape", "dtype", "segment", "index", "value")

    def __init__(self, aval: Any, segment: "_Segment", index: int):
        # (the aval's own size/ndim properties are slow: hundreds of us for a pullback's avals)
        self.aval, self.shape, self.dtype = aval, aval.shape, aval.dtype
        self.segment, self.index, self.value = segment, index, None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def weak_type(self) -> bool:
        return self.aval.weak_type

    def get(self) -> jax.Array:
        """The array (flushing the segment that computes it if it has not run; a soft value
        its segment's program did not return is recomputed)."""
        if self.value is None:
            segment = self.segment
            if not segment.done:  # a value needed before its step ended: the segment ends here
                _stats["reads"] += 1
                if observe.on:
                    observe.segment_ended(len(segment.calls), "read")
            segment.flush()
            if self.value is None:
                self.value = self.segment.recompute()[self.index]
        return self.value

    def __repr__(self) -> str:
        state = "pending" if self.value is None else "computed"
        return f"Deferred({self.aval.str_short()}, {state})"


class _Step:
    """A node of the tree of every recorded sequence: the sequence of kernel calls that leads to
    it from the root, one edge per call, keyed by ``(call, statics, inputs)`` -- each input an
    index into the segment's outputs (the dataflow) or the aval of an outside input. A segment
    walks down the tree as it records, so at its flush the node it reached IS its key: nothing is
    rebuilt or hashed per flush, and a call recorded again at a position seen before finds its
    outputs' structure on the edge."""

    __slots__ = ("key", "parent", "next", "treedef", "avals", "single", "programs", "plan",
                 "speculate", "last", "fails", "wait", "memo", "kept")

    def __init__(self, key: Optional[Tuple], known: Optional[Tuple[Any, Tuple]],
                 parent: Optional["_Step"] = None):
        self.key = key  # (call, statics, inputs) of the call that leads here
        self.parent = parent
        self.next: Dict[Tuple, "_Step"] = {}
        # the outputs of the call that leads here: treedef, leaf avals, and whether it is one leaf
        self.treedef, self.avals = known if known is not None else (None, ())
        self.single = known is not None and self.treedef.num_leaves == 1 and \
            self.treedef.num_nodes == 1
        # for a segment that ends here, by the outputs still referenced at its flush: the
        # flushes so far (an int), then the compiled program (after COMPILE_ON), or _UNCOMPILABLE
        self.programs: Dict[Optional[Tuple[int, ...]], Any] = {}
        # speculation (see .speculation): on a node where segments end, the plan that predicts
        # their outside inputs, what the last flush here saw (to learn one), the attempts that
        # failed since the last hit and the flushes to wait before the next; on the node
        # where a plan's predictions begin, that plan
        self.plan: Optional[Plan] = None
        self.speculate: Optional[Plan] = None
        self.last: Optional[Tuple] = None
        self.fails = self.wait = 0
        # what the caller of run_flat derived from the outputs' structure (None: nothing yet)
        self.memo: Any = None
        # for a segment that ends here with soft outputs left uncomputed: by those outputs,
        # the calls and inputs a recompute of them needs (see _Segment.keep_for_recompute)
        self.kept: Dict[Tuple[int, ...], Tuple[Tuple[bool, ...], Tuple[bool, ...],
                                                Tuple[int, ...]]] = {}


_ROOT = _Step(None, None)


class _Segment:
    """The pending kernel calls of one thread on one device."""

    __slots__ = ("device", "limit", "calls", "step", "externals", "leaves", "tensors", "bound",
                 "done", "soft", "recomputed", "arguments", "spec", "names", "needed", "graph")

    def __init__(self, device: Any):
        self.device = device
        # calls after which it is dispatched: on an accelerator, a piece of a sequence that
        # keeps no backward state (an evaluation forward), which runs while the host records
        # the next (see xla_options.REPLAY_PIECE_CALLS); else MAX_RECORDS
        piece = None if is_training() and is_grad_enabled() else \
            replay_piece_calls(getattr(device, "platform", "cpu"))
        self.limit = MAX_RECORDS if piece is None else min(piece, MAX_RECORDS)
        # (call, statics, inputs): each input an int (an earlier output's index in ``leaves``)
        # or, for an outside input, its aval (the array itself is the next of ``externals``)
        self.calls: List[Tuple[Callable, Tuple, Tuple]] = []
        self.step = _ROOT  # where the calls so far lead in the tree of sequences
        self.externals: List[jax.Array] = []
        self.leaves: List[Deferred] = []
        # Tensors to rebind at the flush (weakly held) and the outputs they hold
        self.tensors: List[Any] = []
        self.bound: List[int] = []
        self.done = False
        # the indices of its soft outputs: inputs of later kernels of this segment held only
        # for a backward that may come again (a pullback's residuals, see soften), computed at
        # the flush only when a Tensor still holds one, else on demand (recompute)
        self.soft: List[int] = []
        self.recomputed: Optional[List[jax.Array]] = None  # every output, once recomputed
        # after the flush, with soft outputs left uncomputed: which calls a recompute runs
        # and the output count of each (the others' inputs are let go, see keep_for_recompute)
        self.needed: Optional[Tuple[Tuple[bool, ...], Tuple[int, ...]]] = None
        # the arrays of the Model call that records this segment (see call_arguments), and
        # the program run ahead on predicted inputs (see _speculate): (plan, inputs, outputs)
        self.arguments, _local.arguments = _local.arguments, ()
        self.spec: Optional[Tuple[Plan, List[Any], Any]] = None
        # {call index: "layer path/Operator"} of the calls recorded while observed: its
        # program names them (a profile of the replayed step shows the Layers and operators)
        self.names: Optional[Dict[int, str]] = None
        # what the engine above notes about the operators recorded here while the segment
        # records (the autograd graph's log, see autodiff.graph_log); dropped at the flush
        self.graph: Any = None

    def flush(self, full: bool = False) -> None:
        """Run the recorded calls and rebind the Tensors holding their outputs; ``full``: the
        segment reached its :attr:`limit`, the sequence goes on (recording stays on)."""
        if self.done:
            return
        self.done = True
        self.graph = None
        _stats["recorded"] += len(self.calls)  # (counted here, not per call)
        if _local.segment is self:
            _local.segment = None
            if not full:
                _sequence_ended(len(self.calls))
        if not self.calls:
            return
        leaves = self.leaves
        programs = self.step.programs
        # the Tensors still holding an output of this segment (not rebound since, e.g. by a
        # rolled-back step restoring its old array), with the output each holds
        tensors = list(map(operator.call, self.tensors))
        outputs = list(map(leaves.__getitem__, self.bound))
        holds = list(map(operator.is_, map(getattr, tensors, repeat("_data"), repeat(None)),
                         outputs))
        held_tensors = list(compress(tensors, holds))
        held_outputs = list(compress(outputs, holds))
        del tensors, outputs
        live = _referenced(leaves)
        if self.soft and live is not None:
            # less the soft outputs no Tensor holds (only pullbacks, which the recorded
            # backward walk of this segment has served)
            kept = set(compress(self.bound, holds))
            soft = set(self.soft)
            live = tuple(compress(live, map(operator.or_,
                                            map(operator.not_, map(soft.__contains__, live)),
                                            map(kept.__contains__, live))))
        if live not in programs and len(programs) >= _OUTPUT_SETS:
            live = None  # (this sequence ends with ever other outputs referenced: all of them)
        program = programs.get(live)
        if program is None or type(program) is int:
            seen = (program or 0) + 1
            program = _compile(self, live) if seen >= COMPILE_ON or is_reproducible() else None
            programs[live] = seen if program is None else program
        # the program already running on predicted inputs, if they were the inputs after all
        values = _speculated(self, live) if self.spec is not None else None
        if values is None and program is not None and program is not _UNCOMPILABLE:
            try:
                values = program(*self.externals)
            except Exception:  # noqa: BLE001  (e.g. a kernel that reads values on the host)
                programs[live] = _UNCOMPILABLE
                values = None
        if values is not None:
            _stats["replayed"] += 1
            _learn(self, live, values)
            if live is not None:  # only what is referenced came back
                _set_each(map(leaves.__getitem__, live), "value", values)
                values = ()
        if values is None:
            values = _op_by_op(self.calls, self.externals, self.names)
            _stats["op_by_op"] += 1
        _set_each(leaves, "value", values)
        _set_each(held_tensors, "_data", map(_VALUE, held_outputs))
        # the Tensors this flush rebound (see Plan: a later segment's input that one of them
        # still holds is predicted as that Tensor's array then); read only when a plan is
        # learnt, so kept as the list of weak references it is
        _local.rebound = self.tensors
        # the inputs are dropped now, unless a soft output was not computed: then those it
        # is computed from are kept while the segment lives, for recompute
        missing = soft_missing(leaves, self.soft) if self.soft and live is not None else ()
        if missing:
            self.keep_for_recompute(missing, map(leaves.__getitem__, live))
        else:
            self.calls = self.externals = ()
        self.tensors = self.bound = self.leaves = self.arguments = ()
        self.names = None

    def keep_for_recompute(self, missing: Tuple[int, ...], computed: Iterable[Deferred]
                           ) -> None:
        """After a flush that left the soft outputs ``missing`` uncomputed (``computed``: the
        outputs something references): keep only the calls and outside inputs they are
        computed from (a training step's forward and its inputs, not the update's: the old
        optimizer slots are let go at once), and cut each computed output's link to the
        segment, so that only the uncomputed ones -- held by the pullbacks of the step's graph
        -- keep these inputs alive."""
        kept = self.step.kept.get(missing)
        if kept is None:
            kept = self.step.kept[missing] = recompute_cone(self.step, self.calls, missing)
        needed, outside, counts = kept
        self.externals = list(compress(self.externals, outside))
        self.needed = (needed, counts)
        _set_each(computed, "segment", repeat(FLUSHED))

    def recompute(self) -> List[Optional[jax.Array]]:
        """The outputs of the flushed segment, run op by op from its inputs again: for a soft
        output its program did not return (a second backward through a graph whose first
        walk was recorded); only the calls it needs run (None for the others' outputs). Kept
        while the segment lives."""
        if self.recomputed is None:
            if not self.calls:
                raise RuntimeError("eager replay: a value of a flushed segment was asked for "
                                   "that its program did not compute")
            self.recomputed = _op_by_op(self.calls, self.externals, needed=self.needed)
            _stats["recomputed"] += 1
        return self.recomputed


# the sets of referenced outputs a sequence gets programs for; then one returning every output
_OUTPUT_SETS = 4
_refcount = getattr(sys, "getrefcount", None)
_probe = [object()]
# what sys.getrefcount reports, mapped over a list as in _referenced, for an object that only
# the list holds
_UNREFERENCED = list(map(_refcount, _probe))[0] if _refcount is not None else 0
del _probe


def _referenced(leaves: List["Deferred"]) -> Optional[Tuple[int, ...]]:
    """The indices of the outputs something outside the segment still references (a Tensor, a
    pullback's residuals, a caller), or None (every output) where reference counts are not
    known. Nothing can read the others: the segment's program need not return them, and XLA
    need not even materialise them (an evaluation forward's intermediates)."""
    if _refcount is None:
        return None
    return tuple(compress(range(len(leaves)),
                          map(operator.gt, map(_refcount, leaves), repeat(_UNREFERENCED))))


_UNCOMPILABLE = object()


# ---------------------------------------------------------------------------------------------
# Speculation (see .speculation): a recurring segment's program starts before its recording
# ends, on inputs predicted by a Plan learnt from two flushes of the same sequence.


def call_arguments(values: Sequence[Any]) -> None:
    """The arrays a Model call starts with -- its arguments (the batch), then its declared
    state (parameters, buffers, optimizer state) -- by position: the segment it records next
    may find its inputs among them (see :class:`.speculation.Plan`). ``()`` forgets them."""
    _local.arguments = tuple(values)


def _speculate(segment: _Segment, plan: Plan) -> None:
    """Call ``plan``'s program on the segment's inputs so far and the predicted rest."""
    program = plan.end.programs.get(plan.live)
    if program is None or type(program) is int or program is _UNCOMPILABLE:
        return
    predicted = predict(plan, segment.externals, segment.arguments)
    if predicted is None:
        return
    if launches_in_thread(getattr(segment.device, "platform", "cpu")):
        outputs = launch_in_thread(program, predicted)
    else:
        try:
            outputs = program(*predicted)
        except Exception:  # noqa: BLE001  (e.g. a predicted array deleted since: none run)
            return
    segment.spec = (plan, predicted, outputs)


def _speculated(segment: _Segment, live: Optional[Tuple[int, ...]]) -> Optional[List[Any]]:
    """The outputs of the segment's speculated program if its predictions held, else None."""
    plan, predicted, outputs = segment.spec
    segment.spec = None
    externals = segment.externals
    if segment.step is plan.end and live == plan.live and len(externals) == len(predicted) \
            and all(map(operator.is_, externals, predicted)):
        if type(outputs) is concurrent.futures.Future:
            outputs = outputs.result()  # (launched by now, as a rule)
            if outputs is None:  # (not run there: the program runs now)
                return None
        plan.misses = plan.end.fails = 0
        _stats["speculated"] += 1
        return outputs
    _stats["mispredicted"] += 1
    missed(plan)
    return None


def _learn(segment: _Segment, live: Optional[Tuple[int, ...]], values: List[Any]) -> None:
    """After a segment's program ran: keep its outputs for its plan's predictions, or learn a
    plan from this run and the last of the same sequence."""
    end = segment.step
    plan = end.plan
    if plan is not None and plan.trigger.speculate is plan:
        if plan.live == live:
            plan.values = values
        return
    end.plan = None
    if not is_replay_speculating():
        return
    if end.wait > 1:
        end.wait -= 1
        return
    externals = segment.externals
    last, end.last = end.last, (live, [id(e) for e in externals], values)
    if end.wait == 1 or last is None or last[0] != live:
        end.wait = 0
        return
    learn_plan(end, live, last, values, externals, segment.arguments, segment.calls,
               _local.rebound)


_stats = {"recorded": 0, "replayed": 0, "op_by_op": 0, "compiled": 0, "recomputed": 0,
          "speculated": 0, "mispredicted": 0, "reads": 0, "recorded_again": 0}


class _Local(threading.local):
    segment: Optional[_Segment] = None
    arguments: Tuple = ()  # see call_arguments
    rebound: Sequence[Any] = ()  # the Tensors the last flush rebound (weak references)
    recording = True  # whether the last sequence between two flushes was long (MIN_RECORDS)
    ran = 0  # kernels run at once since the last flush


def _sequence_ended(recorded: int) -> None:
    """At a flush: decide from the sequence just ended (its kernels recorded and run at once)
    whether the next one is recorded."""
    total = recorded + _local.ran
    if total:
        _local.recording = total >= MIN_RECORDS
        _local.ran = 0


_local = _Local()
_ENV_OFF = not flag("SINGA_JAX_EAGER_REPLAY")


@process_state.register
def _forget_sequences() -> None:
    """Forget every recorded sequence, its programs and plans (this thread's pending segment
    runs first): the next sequences are recorded as if for the first time."""
    global _ROOT
    flush()
    _ROOT = _Step(None, None)
    _local.arguments, _local.rebound, _local.recording, _local.ran = (), (), True, 0


def active() -> bool:
    """Whether an operator called now may be recorded (replay on, no trace running)."""
    return (not _ENV_OFF and eager_replay_flag() and current_trace_hook() is None
            and not in_compile_time_eval() and no_trace_running())


def _op_by_op(calls: Sequence[Tuple], externals: Sequence[jax.Array],
              names: Optional[Dict[int, str]] = None,
              needed: Optional[Tuple[Tuple[bool, ...], Tuple[int, ...]]] = None
              ) -> List[Any]:
    """The calls' output leaves, run one by one on ``externals`` (the outside inputs in order);
    with ``needed`` (per call whether to run it, per call its output count), only those calls
    run, ``externals`` holds only their outside inputs, and the others' outputs are None."""
    values: List[Any] = []
    outside = iter(externals)
    for i, (call, statics, inputs) in enumerate(calls):
        if needed is not None and not needed[0][i]:
            values += repeat(None, needed[1][i])
            continue
        args = [values[r] if type(r) is int else next(outside) for r in inputs]
        if names and i in names:  # (an observed run: the call's Layer and operator, as a
            with jax.named_scope(names[i]), observe.labelled(names[i]):  # scope when traced)
                values.extend(jax.tree_util.tree_leaves(call(*statics, *args)))
        else:
            values.extend(jax.tree_util.tree_leaves(call(*statics, *args)))
    return values


def _compile(segment: _Segment, live: Optional[Tuple[int, ...]]) -> Any:
    """The segment's kernels as one jitted program of its external inputs, returning the output
    leaves numbered in ``live`` (every output leaf of every kernel, in order, for None)."""
    calls = list(segment.calls)
    names = dict(segment.names) if segment.names else None

    def eager_replay_segment(*externals):
        values = _op_by_op(calls, externals, names)
        return values if live is None else [values[i] for i in live]

    observe.compile_cause("eager replay", f"a sequence of {len(calls)} kernels",
                          f"the sequence recurred ({COMPILE_ON} times)")
    _stats["compiled"] += 1
    # (compiled as every eager kernel is: a recorded walk's convolution gradients then run
    # in the same forms as op by op)
    program = kernel(eager_replay_segment)
    # (debug.stats reads its memory analysis, for the inputs it is about to run on)
    observe.notify("replay_compiled", len(calls), segment.device, program, segment.externals)
    return program


def run(call: Callable, statics: Tuple, args: Sequence[Any], device: Any) -> Any:
    """``call(*statics, *args)``, or its recording when the same kernel has run before on inputs
    of the same shapes and dtypes. ``args`` are arrays or :class:`Deferred` values; ``statics``
    are hashable; ``device`` is the inputs' Device when the caller found replay :func:`active`
    (the engine asks once per operator), None to run at once. Returns the kernel's output
    pytree, with Deferred leaves when recorded."""
    outs, step = run_flat(call, statics, args, device)
    if step is None:
        return outs
    return outs[0] if step.single else step.treedef.unflatten(outs)


def run_flat(call: Callable, statics: Tuple, args: Sequence[Any], device: Any
             ) -> Tuple[Any, Optional[_Step]]:
    """:func:`run` with the outputs as they are: ``(the output leaves, a list of Deferred, and
    the recorded call's node)`` when recorded -- the node's :attr:`_Step.treedef` orders the
    leaves and its :attr:`_Step.memo` keeps what a caller derives from that structure, once --
    else ``(the output pytree, None)``, run at once."""
    if device is None:
        return call(*statics, *resolve_all(args)), None
    local = _local
    if not local.recording:  # short sequences run at once (see MIN_RECORDS)
        local.ran += 1
        return call(*statics, *resolve_all(args)), None
    segment = local.segment
    own = segment if segment is not None and segment.device is device else None
    if len(args) > _FEW:
        inputs, outside, foreign = _many_inputs(args, own)
        if inputs is None:  # (a tracer, a NumPy array, a host value: not replayable)
            return call(*statics, *resolve_all(args)), None
    else:
        inputs = []  # per input: an output index of this segment, or an outside value's aval
        outside = []  # the outside inputs
        foreign = False  # whether one is a Deferred of another segment (resolved below)
        for a in args:
            kind = type(a)
            if kind is Deferred:
                if a.segment is own:
                    inputs.append(a.index)
                else:
                    inputs.append(a.aval)
                    outside.append(a)
                    foreign = True
            elif kind is ArrayImpl:
                inputs.append(a.aval)
                outside.append(a)
            else:  # a tracer, a NumPy array, a host value: not replayable
                return call(*statics, *resolve_all(args)), None
    key = (call, statics, tuple(inputs))
    parent = _ROOT if own is None else own.step
    step = parent.next.get(key)
    if step is None:  # a call not recorded at this point of a sequence before
        known = abstract.outputs(call, statics, tuple([a.aval for a in args]))
        if known is abstract.UNKNOWN:  # (its trace failed: run at once, the call raises it)
            local.ran += 1
            return call(*statics, *resolve_all(args)), None
        step = parent.next.setdefault(key, _Step(key, known, parent))
    if own is None:
        if segment is not None:
            segment.flush()
        segment = local.segment = _Segment(device)
    segment.externals += resolve_all(outside) if foreign else outside
    return _append(segment, step), step


def _append(segment: _Segment, step: _Step) -> List[Deferred]:
    """Append the call that leads to ``step`` (its outside inputs appended already) to
    ``segment``: its outputs' Deferred values."""
    leaves = segment.leaves
    start = len(leaves)
    if step.single:
        outs = [Deferred(step.avals[0], segment, start)]
    else:
        avals = step.avals
        outs = list(map(Deferred, avals, repeat(segment), range(start, start + len(avals))))
    leaves += outs
    # the node's own key (the one just built for the lookup is dropped: less for the GC)
    calls = segment.calls
    calls.append(step.key)
    segment.step = step
    if observe.on:
        _name_call(segment)
    if step.speculate is not None and segment.spec is None and is_replay_speculating() and \
            segment.limit == MAX_RECORDS:  # (a piece runs while the next is recorded already)
        _speculate(segment, step.speculate)
    if len(calls) >= segment.limit:
        segment.flush(full=True)
    return outs


def recording_segment(device: Any) -> Optional[_Segment]:
    """This thread's segment being recorded on ``device`` now, or None. Its ``step`` is the
    position its calls have reached in the tree of sequences, its ``graph`` what the layers
    above note about it (see :class:`_Segment`)."""
    segment = _local.segment
    if segment is not None and segment.device is device and _local.recording and \
            not segment.done:
        return segment
    return None


def record_again(segment: _Segment, step: _Step, externals: List[Any],
                 soft: Sequence[int]) -> Optional[List[Deferred]]:
    """Record again the call that leads to ``step`` -- a child of the position ``segment`` has
    reached (the same call recorded at the same point of the same sequence before) -- on the
    outside inputs ``externals`` (arrays, in the order of its inputs that are not outputs of the
    segment), marking its inputs numbered ``soft`` soft (see :func:`soften`): its outputs, as
    :func:`run_flat` gives them, without looking at an input. None (nothing recorded) when
    ``segment`` is no longer recording at that position."""
    if segment is not _local.segment or segment.done or step.parent is not segment.step or \
            not _local.recording:
        return None
    segment.soft += soft
    segment.externals += externals
    _stats["recorded_again"] += 1
    return _append(segment, step)


_FEW = 8  # inputs a call's loop takes one by one (a backward walk, an update: maps)
_INPUT_FIELD = ("aval", "index")  # per input: by whether it is an output of the segment
_RECORDABLE = frozenset({Deferred, ArrayImpl})


def _many_inputs(args: Sequence[Any], own: Optional[_Segment]
                 ) -> Tuple[Optional[List[Any]], List[Any], bool]:
    """:func:`run_flat`'s loop over the inputs, for a call of many: ``(per input its output
    index in ``own`` or its aval, the outside inputs, whether one is a Deferred of another
    segment)``; ``(None, [], False)`` when an input is neither an array nor a Deferred."""
    kinds = set(map(type, args))
    if not kinds <= _RECORDABLE:
        return None, [], False
    if own is None or Deferred not in kinds:
        return list(map(_AVAL, args)), list(args), Deferred in kinds
    mine = list(map(operator.is_, map(getattr, args, repeat("segment"), repeat(None)),
                    repeat(own)))
    inputs = list(map(getattr, args, map(_INPUT_FIELD.__getitem__, mine)))
    outside = list(compress(args, map(operator.not_, mine)))
    return inputs, outside, Deferred in set(map(type, outside))


def _name_call(segment: _Segment) -> None:
    """Remember the Layer and operator of the call just recorded (an observed run)."""
    op = observe.current_op()
    if op is not None:
        if segment.names is None:
            segment.names = {}
        segment.names[len(segment.calls) - 1] = observe.op_label(op)


def bind(tensor: Any, value: Deferred) -> None:
    """Make ``tensor`` hold ``value`` until its segment flushes (then its array). The segment
    holds the Tensor weakly: one nobody keeps (an intermediate result) dies, and then so does
    the need to compute its value."""
    if value.value is None:
        tensor._data = value
        segment = value.segment
        segment.tensors.append(_weakref(tensor))
        segment.bound.append(value.index)
    else:
        tensor._data = value.value


def bind_all(tensors: Sequence[Any], values: Sequence[Any]) -> None:
    """:func:`bind` each of ``tensors`` to its value of ``values`` -- a :class:`Deferred` or,
    for a kernel run at once, an array -- in one pass (an update rebinds every parameter and
    slot of a model)."""
    segment = values[0].segment if values and type(values[0]) is Deferred else None
    if segment is not None and len(tensors) == len(values) and \
            all(map(operator.is_, map(type, values), repeat(Deferred))) and \
            all(map(operator.is_, map(_SEGMENT, values), repeat(segment))) and \
            all(map(operator.is_, map(_VALUE, values), repeat(None))):
        # (the usual case -- every value pending in one segment -- without a loop in Python)
        _set_each(tensors, "_data", values)
        segment.tensors += map(_weakref, tensors)
        segment.bound += map(_INDEX, values)
        return
    for t, v in zip(tensors, values):
        if type(v) is Deferred:
            bind(t, v)
        else:
            t._data = v


def pending(device: Any) -> bool:
    """Whether this thread is recording a segment on ``device`` now (a kernel handed to
    :func:`run` with it may join it)."""
    return recording_segment(device) is not None


def soften(values: Sequence[Any]) -> None:
    """Mark the pending :class:`Deferred` values among ``values`` soft: inputs of a kernel just
    recorded in their own segment (a backward walk's pullback states) that nothing but
    pullbacks will read, unless a second backward comes. The segment's program then does not
    return them (unless a Tensor holds one); a later read recomputes them (see
    :meth:`_Segment.recompute`)."""
    segment = _local.segment
    if segment is None:
        return
    pending = list(compress(values, map(operator.is_, map(getattr, values, repeat("segment"),
                                                          repeat(None)), repeat(segment))))
    segment.soft += map(_INDEX, compress(pending, map(operator.is_, map(_VALUE, pending),
                                                      repeat(None))))


def flush() -> None:
    """Run this thread's pending segment, if any (every Tensor then holds an array)."""
    segment = _local.segment
    if segment is not None:
        segment.flush()
    else:
        _sequence_ended(0)


def resolve_all(args: Sequence[Any]) -> List[Any]:
    """``args`` with every Deferred replaced by its array (flushing as needed)."""
    return [a.get() if type(a) is Deferred else a for a in args]


def resolve_tree(tree: Any) -> Any:
    """``tree`` with every Deferred leaf replaced by its array (flushing as needed)."""
    return jax.tree_util.tree_map(lambda a: a.get() if type(a) is Deferred else a, tree)


def stats() -> Dict[str, int]:
    """Counters since start: kernel calls recorded, segments replayed by a compiled program or
    run op by op, programs compiled, flushed segments rerun for a soft output (recomputed),
    programs started ahead on predicted inputs (speculated, mispredicted), segments a value
    read before their step ended (reads), and calls recorded again at a known point of a
    sequence without reading their inputs (recorded_again: a training step's backward walk)."""
    counts = dict(_stats)
    segment = _local.segment
    if segment is not None and not segment.done:  # (this thread's calls not flushed yet)
        counts["recorded"] += len(segment.calls)
    return counts
