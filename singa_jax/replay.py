"""Eager replay: a recurring sequence of eager operators runs as one compiled program.

An eager operator costs the host tens of microseconds between the user's call and the kernel's
dispatch; on an accelerator that, not the arithmetic, sets the speed of a dispatch-bound model.
Replay removes the per-kernel dispatch from a sequence that recurs (a training step's forward,
an evaluation forward), keeping eager semantics whole:

* **Record.** An operator whose kernel has run before with the same static arguments and input
  shapes/dtypes (so its outputs' structure is known, and it is known to succeed) is not run: its
  kernel call is appended to the thread's pending *segment* and its outputs are
  :class:`Deferred` placeholders with their shape and dtype. Tensors hold them as their
  ``_data``; a Tensor's shape, dtype and creator graph are there at once.
* **Flush.** The segment runs when a value is needed: a Tensor's ``array`` is read (``to_numpy``,
  ``scalar``, printing, a NumPy call, an operator that is not replayable, Python control flow on
  a value), a backward pass or an optimizer update starts, a Model call ends, graph mode or a
  transaction begins, another device is used, or the segment reaches :data:`MAX_RECORDS`. Every
  output of every recorded kernel is computed and every Tensor rebound to its array, so after a
  flush no Tensor holds a placeholder.
* **Only long sequences.** A thread records only while its last sequence (the kernels between
  two flushes) had at least :data:`MIN_RECORDS` kernels; shorter ones run op by op, which on a
  CPU overlaps each kernel with the Python of the next op.
* **Replay.** A flushed segment is keyed by its kernels, static arguments, input shapes/dtypes
  and dataflow. The first time a key is seen the kernels run one by one; when it recurs it is
  compiled into ONE program (each kernel inlined, every output returned) that later flushes of
  the same key call with the new inputs. A changed sequence (another branch, another shape) is
  another key: it runs op by op and, if it recurs, gets its own program. A segment that cannot be
  compiled (a kernel reading values on the host) runs op by op from then on.

``autograd.eager_replay(False)`` (a scope or decorator) or ``SINGA_JAX_EAGER_REPLAY=0`` runs
every operator at once, op by op. Results equal op-by-op execution up to XLA's fusion rounding
(identical float32 results on the CPU in the tests). This module knows no operators: callers hand
it a kernel ``call`` and its static arguments.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from weakref import ref as _weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax

try:  # the concrete jax.Array class: an exact type test is the cheapest per-input check
    from jax._src.array import ArrayImpl as _ArrayImpl
except ImportError:  # another JAX layout: nothing is recorded (every op runs at once)
    class _ArrayImpl:  # type: ignore[no-redef]
        pass

from .modes import current_trace_hook, in_compile_time_eval, is_eager_replay
from .xla_options import no_trace_running

__all__ = ["Deferred", "run", "flush", "bind", "resolve_tree", "stats", "MAX_RECORDS",
           "MIN_RECORDS", "COMPILE_ON"]

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
        """The array (flushing the segment that computes it if it has not run)."""
        if self.value is None:
            self.segment.flush()
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

    __slots__ = ("key", "next", "treedef", "avals", "single", "programs")

    def __init__(self, key: Optional[Tuple], known: Optional[Tuple[Any, Tuple]]):
        self.key = key  # (call, statics, inputs) of the call that leads here
        self.next: Dict[Tuple, "_Step"] = {}
        # the outputs of the call that leads here: treedef, leaf avals, and whether it is one leaf
        self.treedef, self.avals = known if known is not None else (None, ())
        self.single = known is not None and self.treedef.num_leaves == 1 and \
            self.treedef.num_nodes == 1
        # for a segment that ends here, by the outputs still referenced at its flush: the
        # flushes so far (an int), then the compiled program (after COMPILE_ON), or _UNCOMPILABLE
        self.programs: Dict[Optional[Tuple[int, ...]], Any] = {}


_ROOT = _Step(None, None)


class _Segment:
    """The pending kernel calls of one thread on one device."""

    __slots__ = ("device", "calls", "step", "externals", "leaves", "tensors", "bound", "done")

    def __init__(self, device: Any):
        self.device = device
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

    def flush(self) -> None:
        if self.done:
            return
        self.done = True
        if _local.segment is self:
            _local.segment = None
            _sequence_ended(len(self.calls))
        if not self.calls:
            return
        leaves = self.leaves
        programs = self.step.programs
        live = _referenced(leaves)
        if live not in programs and len(programs) >= _OUTPUT_SETS:
            live = None  # (this sequence ends with ever other outputs referenced: all of them)
        program = programs.get(live)
        if program is None or type(program) is int:
            seen = (program or 0) + 1
            program = _compile(self, live) if seen >= COMPILE_ON else None
            programs[live] = seen if program is None else program
        values = None
        if program is not None and program is not _UNCOMPILABLE:
            try:
                values = program(*self.externals)
                _stats["replayed"] += 1
            except Exception:  # noqa: BLE001  (e.g. a kernel that reads values on the host)
                programs[live] = _UNCOMPILABLE
                values = None
            else:
                if live is not None:  # only what is referenced came back
                    for i, v in zip(live, values):
                        leaves[i].value = v
                    values = ()
        if values is None:
            values = _op_by_op(self.calls, self.externals)
            _stats["op_by_op"] += 1
        for d, v in zip(leaves, values):
            d.value = v
        for ref, i in zip(self.tensors, self.bound):
            t = ref()
            if t is not None and t._data is leaves[i]:
                # (else rebound since: e.g. a rolled-back step restored its old array)
                t._data = leaves[i].value
        self.calls = self.externals = self.tensors = self.bound = ()  # drop the inputs now
        self.leaves = ()


# the sets of referenced outputs a sequence gets programs for; then one returning every output
_OUTPUT_SETS = 4
_refcount = getattr(sys, "getrefcount", None)
_probe = [object()]
# what sys.getrefcount reports, in _referenced's comprehension, for an object that only the
# segment's list of outputs holds
_UNREFERENCED = [_refcount(d) for d in _probe][0] if _refcount is not None else 0
del _probe


def _referenced(leaves: List["Deferred"]) -> Optional[Tuple[int, ...]]:
    """The indices of the outputs something outside the segment still references (a Tensor, a
    pullback's residuals, a caller), or None (every output) where reference counts are not
    known. Nothing can read the others: the segment's program need not return them, and XLA
    need not even materialise them (an evaluation forward's intermediates)."""
    if _refcount is None:
        return None
    counts = [_refcount(d) for d in leaves]
    return tuple([i for i, c in enumerate(counts) if c > _UNREFERENCED])


_UNCOMPILABLE = object()
# kernel signature (call, statics, input avals) -> (outputs' treedef, leaf avals), known once
# the kernel ran eagerly with those inputs
_OUTPUTS: Dict[Tuple, Tuple[Any, Tuple]] = {}
_stats = {"recorded": 0, "replayed": 0, "op_by_op": 0, "compiled": 0}


class _Local(threading.local):
    segment: Optional[_Segment] = None
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
_ENV_OFF = os.environ.get("SINGA_JAX_EAGER_REPLAY", "1").lower() in ("0", "false", "off", "no")


def active() -> bool:
    """Whether an operator called now may be recorded (replay on, no trace running)."""
    return (not _ENV_OFF and is_eager_replay() and current_trace_hook() is None
            and not in_compile_time_eval() and no_trace_running())


def _op_by_op(calls: Sequence[Tuple], externals: Sequence[jax.Array]) -> List[jax.Array]:
    values: List[jax.Array] = []
    outside = iter(externals)
    for call, statics, inputs in calls:
        args = [values[r] if type(r) is int else next(outside) for r in inputs]
        values.extend(jax.tree_util.tree_leaves(call(*statics, *args)))
    return values


def _compile(segment: _Segment, live: Optional[Tuple[int, ...]]) -> Any:
    """The segment's kernels as one jitted program of its external inputs, returning the output
    leaves numbered in ``live`` (every output leaf of every kernel, in order, for None)."""
    calls = list(segment.calls)

    def program(*externals):
        values = _op_by_op(calls, externals)
        return values if live is None else [values[i] for i in live]

    _stats["compiled"] += 1
    return jax.jit(program)


def run(call: Callable, statics: Tuple, args: Sequence[Any], device: Any) -> Any:
    """``call(*statics, *args)``, or its recording when the same kernel has run before on inputs
    of the same shapes and dtypes. ``args`` are arrays or :class:`Deferred` values; ``statics``
    are hashable; ``device`` is the inputs' Device when the caller found replay :func:`active`
    (the engine asks once per operator), None to run at once. Returns the kernel's output
    pytree, with Deferred leaves when recorded."""
    if device is None:
        return call(*statics, *resolve_all(args))
    local = _local
    if not local.recording:  # short sequences run at once (see MIN_RECORDS)
        local.ran += 1
        return call(*statics, *resolve_all(args))
    segment = local.segment
    own = segment if segment is not None and segment.device is device else None
    inputs = []  # per input: an output index of this segment, or the aval of an outside value
    for a in args:
        kind = type(a)
        if kind is Deferred:
            inputs.append(a.index if a.segment is own else a.aval)
        elif kind is _ArrayImpl:
            inputs.append(a.aval)
        else:  # a tracer, a NumPy array, a host value: not replayable
            return call(*statics, *resolve_all(args))
    inputs = tuple(inputs)
    key = (call, statics, inputs)
    parent = _ROOT if own is None else own.step
    step = parent.next.get(key)
    if step is None:  # a call not recorded at this point of a sequence before
        known = _OUTPUTS.get((call, statics, tuple([a.aval for a in args])))
        if known is None:  # first time: run it now and learn its outputs' structure
            local.ran += 1
            out = call(*statics, *resolve_all(args))
            leaves, treedef = jax.tree_util.tree_flatten(out)
            if all(type(leaf) is _ArrayImpl for leaf in leaves):
                _OUTPUTS[call, statics, tuple([a.aval for a in args])] = (
                    treedef, tuple(leaf.aval for leaf in leaves))
            return out
        step = parent.next.setdefault(key, _Step(key, known))
    if own is None:
        if segment is not None:
            segment.flush()
        segment = local.segment = _Segment(device)
    externals = segment.externals
    for a, r in zip(args, inputs):
        if type(r) is not int:
            externals.append(a.get() if type(a) is Deferred else a)
    leaves = segment.leaves
    start = len(leaves)
    if step.single:
        out = Deferred(step.avals[0], segment, start)
        leaves.append(out)
    else:
        outs = [Deferred(aval, segment, start + i) for i, aval in enumerate(step.avals)]
        leaves.extend(outs)
        out = step.treedef.unflatten(outs)
    # the node's own key (the one just built for the lookup is dropped: less for the GC)
    segment.calls.append(step.key)
    segment.step = step
    _stats["recorded"] += 1
    if len(segment.calls) >= MAX_RECORDS:
        segment.flush()
    return out


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
    run op by op, programs compiled."""
    return dict(_stats)
