"""What a flushed replay segment keeps for a recompute of its soft outputs.

A replayed training step's program does not return the forward's residuals (soft outputs: its
own recorded backward walk has used them); a second backward through the step's graph reruns
the calls that compute them, from the step's inputs. Only those calls and inputs are kept --
the dataflow cone of the uncomputed outputs: a training step's forward and the parameters it
read, not the update and the optimizer slots -- and a computed output no longer points at its
segment, so that only the uncomputed ones, which the graph's pullbacks hold, keep the inputs
alive (:meth:`.replay._Segment.keep_for_recompute`).
"""
from __future__ import annotations

import operator
from itertools import compress, repeat
from typing import Any, List, Sequence, Tuple

__all__ = ["FLUSHED", "soft_missing", "recompute_cone"]

_VALUE = operator.attrgetter("value")


class _Flushed:
    """What a computed Deferred points to once its segment kept inputs for a recompute: no
    segment (its value is known; a segment held by it would keep those inputs alive)."""

    __slots__ = ()
    done = True

    def flush(self, full: bool = False) -> None:
        return None


FLUSHED = _Flushed()


def soft_missing(leaves: List[Any], soft: List[int]) -> Tuple[int, ...]:
    """The indices of the soft outputs (``soft``, of the Deferred ``leaves``) not computed."""
    return tuple(compress(soft, map(operator.is_, map(_VALUE, map(leaves.__getitem__, soft)),
                                    repeat(None))))


def recompute_cone(end: Any, calls: Sequence[Tuple], missing: Tuple[int, ...]
                   ) -> Tuple[Tuple[bool, ...], Tuple[bool, ...], Tuple[int, ...]]:
    """For the sequence ending at the node ``end`` of replay's tree (its ``calls``, each
    ``(call, statics, inputs)`` with an int input naming an earlier output): ``(per call
    whether computing the outputs ``missing`` needs it, per outside input whether it does, per
    call its output count)``, by one walk backwards over the dataflow."""
    counts = []
    node = end
    while node.parent is not None:  # (the calls' nodes, from the last up to the root)
        counts.append(len(node.avals))
        node = node.parent
    counts.reverse()
    starts = [0]
    for count in counts:
        starts.append(starts[-1] + count)
    wanted = bytearray(starts[-1])
    for i in missing:
        wanted[i] = 1
    needed = [False] * len(calls)
    for c in range(len(calls) - 1, -1, -1):
        if any(wanted[starts[c]:starts[c + 1]]):
            needed[c] = True
            for r in calls[c][2]:
                if type(r) is int:
                    wanted[r] = 1
    outside = [needed[c] for c, (_, _, inputs) in enumerate(calls)
               for r in inputs if type(r) is not int]
    return tuple(needed), tuple(outside), tuple(counts)
