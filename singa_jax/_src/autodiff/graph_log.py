"""The log of the autograd graph a recording segment builds: what each operator is and where
its inputs come from -- the graph's structure, without reading its objects again.

A backward walk reads the creator graph from the loss (:class:`.fused._Shape`: a few
microseconds per operator on a CPU); a training step that recurs builds the same graph again,
and its walk is recorded into the step's segment again. While eager replay records a segment,
each operator of a training-mode call is noted in the segment's log as one entry: its kind --
the serial number of its per-kind recipe (:mod:`.recipes`), or for an operator made by the
generic path its type, whether it needs a gradient and its pullback's structure -- and, per
input, where that input comes from:

* ``p`` (or ``(p, j)`` for output ``j`` of an operator of several): the operator noted at
  position ``p`` of this log made it;
* ``-2 - k``: a leaf that keeps its gradient (a parameter), the ``k``-th such tensor met
  (:attr:`GraphLog.kept`; one tensor used twice is one place);
* ``-1``: a plain leaf (the batch), which gets no gradient.

A thread keeps logs only once one of its walks could be recorded again (:func:`want`): a loop
that walks PyTorch-style (``loss.backward()``, which never records its walk) pays nothing.

Two logs with equal entries hold graphs that a walk from the same position takes alike -- the
same operators of the same kinds over the same edges, the same tensors yielded at the same
places -- so a walk recorded over one is recorded again over the other (see
:func:`.fused.fused_walk`). An input made by anything else (an operator of another segment, one
recorded outside training mode, a tensor whose creator was replaced) makes the log ``valid``
False until its segment ends. The log holds its operators only while its segment records:
replay drops it at the flush.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Sequence, Tuple

from singa_jax._src.base import process_state
from singa_jax._src.base.node import Dummy
from singa_jax._src.eager import replay

__all__ = ["GraphLog", "note", "note_operator", "position", "want"]

# the attribute an operator's log position is kept in (per call: a recipe never copies it)
POSITION = "_logged"


class _Local(threading.local):
    wanted = False  # whether this thread's segments keep a log (see want)


_local = _Local()


def want() -> None:
    """Called by a walk that may be recorded again: this thread's segments keep a log from now
    on."""
    _local.wanted = True


@process_state.register
def _forget_wanted() -> None:
    _local.wanted = False


class GraphLog:
    """One segment's log (see the module's docstring). Operators are noted as they are
    recorded (:func:`note`: the operator, its kind and its inputs' sources as it holds them)
    and their entries worked out in one pass when a walk asks (:meth:`settle`): a step's
    forward pays a list append per operator."""

    __slots__ = ("noted", "ops", "entries", "kept", "kept_at", "valid")

    def __init__(self) -> None:
        self.noted: List[Tuple[Any, Any, Sequence]] = []  # (op, kind, src) not settled yet
        self.ops: List[Any] = []  # the operators settled, in order
        self.entries: List[Tuple] = []  # per operator: (kind, the source of each input...)
        self.kept: List[Any] = []  # the input tensors that keep their gradient, in order met
        self.kept_at: Dict[int, int] = {}  # id(tensor) -> its place in ``kept``
        self.valid = True

    def settle(self) -> "GraphLog":
        """Work out the entries of the operators noted since the last call; returns the log."""
        noted = self.noted
        if not noted or not self.valid:
            return self
        self.noted = []
        ops, kept, kept_at, entries = self.ops, self.kept, self.kept_at, self.entries
        for op, kind, src in noted:
            entry = [kind]
            push = entry.append
            for creator, x_id, x, stores_grad in src:
                if stores_grad:  # (a parameter, or an intermediate that keeps its gradient)
                    k = kept_at.get(x_id)
                    if k is None:
                        k = kept_at[x_id] = len(kept)
                        kept.append(x)
                    if type(creator) is Dummy:
                        push(-2 - k)
                        continue
                elif type(creator) is Dummy:
                    push(-1)
                    continue
                p = creator.__dict__.get(POSITION)
                if p is None or p >= len(ops) or ops[p] is not creator:
                    self.valid = False  # (made outside this log: its graph is not known here)
                    return self
                ids = creator.y_id2idx
                push(p if len(ids) == 1 else (p, ids[x_id]))
            op.__dict__[POSITION] = len(ops)
            ops.append(op)
            entries.append(tuple(entry))
        return self


def note(segment: Any, op: Any, kind: Any, src: Sequence[Tuple[Any, int, Any, bool]]) -> None:
    """Note ``op`` (of ``kind``), just recorded into ``segment``, whose inputs are ``src``: one
    ``(creator, id(x), x or None, x.stores_grad)`` per input, as an operator records them."""
    # (a segment that reached its limit has run: the next operators start another)
    if segment.done or not _local.wanted:
        return
    log = segment.graph
    if log is None:
        log = segment.graph = GraphLog()
    log.noted.append((op, kind, src))


def note_operator(op: Any, n_outputs: int) -> None:
    """Note ``op``, just called by the generic path, in the log of the segment recording on its
    device (if any): its kind is its type, whether it needs a gradient and is tracked, its
    outputs, which inputs keep their gradient, and its pullback's structure."""
    segment = replay.recording_segment(op.device) if _local.wanted else None
    if segment is None or (segment.graph is not None and not segment.graph.valid):
        return
    step = op.pullback_step(True)  # (what a walk reads of it, as the walk reads it)
    kind = (type(op), op.requires_grad, op.tracked, n_outputs,
            tuple([stores_grad for _, _, _, stores_grad in op.src]),
            None if step is None else (step[0], step[1], step[3]))
    note(segment, op, kind, op.src)


def position(log: GraphLog, op: Any) -> int:
    """``op``'s position in ``log`` (settled), or -1 when it is not noted there."""
    p = op.__dict__.get(POSITION) if hasattr(op, "__dict__") else None
    if p is None or p >= len(log.ops) or log.ops[p] is not op:
        return -1
    return p
