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
import threading
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


class _Segment:
    """The pending kernel calls of one thread on one device."""

    __slots__ = ("device", "calls", "keys", "externals", "leaves", "tensors", "done")

    def __init__(self, device: Any):
        self.device = device
        self.calls: List[Tuple[Callable, Tuple, Tuple]] = []  # (call, statics, input refs)
        self.keys: List[Tuple] = []
        self.externals: List[jax.Array] = []
        self.leaves: List[Deferred] = []
        self.tensors: List[Tuple[Any, Deferred]] = []  # Tensors to rebind at the flush
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
        key = tuple(self.keys)
        program = _PROGRAMS.get(key)
        if program is None or type(program) is int:
            seen = (program or 0) + 1
            _PROGRAMS[key] = seen
            program = _compile(self) if seen >= COMPILE_ON else None
            if program is not None:
                _PROGRAMS[key] = program
        values = None
        if program is not None and program is not _UNCOMPILABLE:
            try:
                values = program(*self.externals)
                _stats["replayed"] += 1
            except Exception:  # noqa: BLE001  (e.g. a kernel that reads values on the host)
                _PROGRAMS[key] = program = _UNCOMPILABLE
        if values is None:
            values = _op_by_op(self.calls, self.externals)
            _stats["op_by_op"] += 1
        for d, v in zip(self.leaves, values):
            d.value = v
        for t, d in self.tensors:
            if t._data is d:  # (not rebound since: a rolled-back step restored its old array)
                t._data = d.value
        self.calls = self.keys = self.externals = self.tensors = ()  # drop the inputs now


_UNCOMPILABLE = object()
_PROGRAMS: Dict[Tuple, Any] = {}  # segment key -> occurrences so far (int) or its program
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
    for call, statics, refs in calls:
        args = [externals[r] if r >= 0 else values[~r] for r in refs]
        values.extend(jax.tree_util.tree_leaves(call(*statics, *args)))
    return values


def _compile(segment: _Segment) -> Any:
    """The segment's kernels as one jitted program of its external inputs, returning every
    output leaf of every kernel in order."""
    calls = list(segment.calls)

    def program(*externals):
        return _op_by_op(calls, externals)

    _stats["compiled"] += 1
    return jax.jit(program)


def run(call: Callable, statics: Tuple, args: Sequence[Any], device: Any) -> Any:
    """``call(*statics, *args)``, or its recording when replay is active and the same kernel has
    run before on inputs of the same shapes and dtypes. ``args`` are arrays or
    :class:`Deferred` values; ``statics`` are hashable; ``device`` is the inputs' Device (None:
    never record). Returns the kernel's output pytree, with Deferred leaves when recorded."""
    if device is None or not active():
        return call(*statics, *resolve_all(args))
    if not _local.recording:  # short sequences run at once (see MIN_RECORDS)
        _local.ran += 1
        return call(*statics, *resolve_all(args))
    avals = []
    for a in args:
        kind = type(a)
        if kind is Deferred or kind is _ArrayImpl:
            avals.append(a.aval)
        else:  # a tracer, a NumPy array, a host value: not replayable
            return call(*statics, *resolve_all(args))
    avals = tuple(avals)
    known = _OUTPUTS.get((call, statics, avals))
    if known is None:  # first time: run it now and learn its outputs' structure
        _local.ran += 1
        out = call(*statics, *resolve_all(args))
        leaves, treedef = jax.tree_util.tree_flatten(out)
        if all(type(leaf) is _ArrayImpl for leaf in leaves):
            _OUTPUTS[call, statics, avals] = (treedef, tuple(leaf.aval for leaf in leaves))
        return out
    segment = _local.segment
    if segment is None or segment.device is not device:
        if segment is not None:
            segment.flush()
        segment = _local.segment = _Segment(device)
    refs = []
    ref_key = []
    externals = segment.externals
    for a, aval in zip(args, avals):
        if type(a) is Deferred:
            if a.segment is segment:
                refs.append(~a.index)
                ref_key.append(a.index)
                continue
            a = a.get()
        refs.append(len(externals))
        externals.append(a)
        ref_key.append(aval)
    treedef, out_avals = known
    leaves = segment.leaves
    start = len(leaves)
    outs = [Deferred(aval, segment, start + i) for i, aval in enumerate(out_avals)]
    leaves.extend(outs)
    segment.calls.append((call, statics, tuple(refs)))
    segment.keys.append((call, statics, tuple(ref_key)))
    _stats["recorded"] += 1
    if len(segment.calls) >= MAX_RECORDS:
        segment.flush()
    return treedef.unflatten(outs)


def bind(tensor: Any, value: Deferred) -> None:
    """Make ``tensor`` hold ``value`` until its segment flushes (then its array)."""
    tensor._data = value
    if value.value is None:
        value.segment.tensors.append((tensor, value))
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
