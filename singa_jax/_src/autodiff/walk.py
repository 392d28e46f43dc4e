"""The backward walk over the creator graph, for any gradient values.

:func:`walk` visits the graph from its roots in dependency order: an operator runs its backward
once all of its outputs' gradients have arrived, gradients of a tensor used by several
operators are summed, and every tensor with ``stores_grad=True`` (or wanted) is yielded with its
gradient as soon as it is complete. The same walk runs on arrays (op by op, :mod:`.backward`)
and on value numbers (the symbolic walk that plans a fused walk, :mod:`.fused`).
"""
from __future__ import annotations

import operator
from collections import Counter
from typing import Any, Callable, Dict, Iterator, Sequence, Tuple

from singa_jax._src.autodiff.operator import Operator
from singa_jax._src.base.node import Dummy, Node
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["infer_dependency", "walks_into", "walk"]


def infer_dependency(op: Operator) -> Tuple[Counter, Counter]:
    """For the graph ending at ``op``: how many uses each operator's outputs have
    (``op_count``) and how many uses each tensor has (``tensor_count``).

    SINGA keys ``tensor_count`` by ``id(tensor)``; here the key is ``(creator, id(tensor))``.
    An intermediate Tensor nobody keeps is freed during the forward pass (``src`` records only
    its id), and CPython may give its id to a Tensor made later, say a parameter a layer builds
    lazily: keyed by id alone, the two would share one count and the parameter's gradient would
    never be yielded. The creator (alive while the graph is) tells them apart."""
    op_count, tensor_count = _uses([op], every_tensor=True)
    return Counter(op_count), Counter(tensor_count)


def _uses(ops: Sequence[Operator], every_tensor: bool = False, tracked_walk: bool = False
          ) -> Tuple[Dict[Node, int], Dict[Tuple[Node, int], int]]:
    """For the graph ending at ``ops``: how many uses each node's outputs have, and how many
    uses each output ``(node, id(tensor))`` has -- only outputs of nodes with several outputs
    unless ``every_tensor`` (the uses of a node's only output are the node's). RuntimeError when
    the walk meets an operator freed by an earlier backward (before any gradient is computed)."""
    node_uses: Dict[Node, int] = {}
    tensor_uses: Dict[Tuple[Node, int], int] = {}
    found = list(ops)
    seen = set(found)
    for cur in found:  # grows while it is read: a breadth-first walk
        if cur.freed:
            raise RuntimeError(
                f"backward: the graph through {cur.name} was already freed by an earlier "
                f"backward (Tensor.backward / autograd.grad free the graph they pass); call the "
                f"first backward with retain_graph=True to back-propagate through it again")
        for src_op, xid, _, _ in cur.src:
            # an op needing no grad never runs backward: its inputs get nothing through it, so
            # counting them would leave their gradients waiting forever
            if src_op not in seen and walks_into(src_op, tracked_walk):
                seen.add(src_op)
                found.append(src_op)
            node_uses[src_op] = node_uses.get(src_op, 0) + 1
            if every_tensor or len(src_op.y_id2idx) > 1:
                tensor_uses[src_op, xid] = tensor_uses.get((src_op, xid), 0) + 1
    return node_uses, tensor_uses


def walks_into(creator: Node, tracked_walk: bool = False) -> bool:
    """Whether backward runs ``creator``'s backward (an operator that recorded a gradient). In a
    walk from a PyTorch-style (tracked) root, PyTorch's rule: an operator that no tracked tensor
    depends on and that kept no backward state (it ran outside training mode, e.g. a reshape of
    a plain input) is not entered -- its inputs get no gradient through it, as in PyTorch."""
    if not creator.requires_grad or isinstance(creator, Dummy):
        return False
    return not tracked_walk or creator.tracked or creator.keeps_backward_state()


def walk(roots: Sequence[Tuple[Tensor, Any]], wanted: Dict[Tuple[Node, int], Tensor],
          run: Callable[[Operator, list], Tuple[Any, ...]],
          add: Callable[[Any, Any], Any] = operator.add) -> Iterator[Tuple[Tensor, Any, str]]:
    """The walk itself, for any gradient values: ``run(op, dys)`` returns op's input gradients
    (None where there is none) for its outputs' gradients ``dys``; ``add`` sums two."""
    tracked = any(y.tracked for y, _ in roots)  # a PyTorch-style walk (see _walks_into)
    ops = list({y.creator: None for y, _ in roots if walks_into(y.creator, tracked)})
    node_uses, tensor_uses = _uses(ops, tracked_walk=tracked)
    not_ready: Dict[Node, list] = {}  # node -> gradients of its outputs summed so far
    for y, g in roots:  # a root may also be used by another root's graph: sum, then wait
        grads = not_ready.setdefault(y.creator, [None] * len(y.creator.y_id2idx))
        idx = y.creator.y_id2idx[id(y)]
        grads[idx] = g if grads[idx] is None else add(grads[idx], g)
    ready = []
    yielded = set()
    for y, _ in roots:
        key = (y.creator, id(y))
        uses = (tensor_uses.get(key, 0) if len(y.creator.y_id2idx) > 1
                else node_uses.get(y.creator, 0))
        if uses == 0 and key not in yielded and (y.stores_grad or key in wanted):
            yielded.add(key)
            yield y, not_ready[y.creator][y.creator.y_id2idx[id(y)]], \
                y.creator.grad_name(y.creator.y_id2idx[id(y)])
    for creator in list(not_ready):
        if node_uses.get(creator, 0) == 0:
            if walks_into(creator, tracked):
                ready.append((creator, not_ready[creator]))
            del not_ready[creator]
    while ready:
        op, dys = ready.pop()
        src = op.src  # read first: run may release the op
        dxs = run(op, dys)
        if len(dxs) != len(src):
            raise RuntimeError(f"{op.name}: backward returned {len(dxs)} gradients for "
                               f"{len(src)} inputs")
        for (src_op, x_id, x, x_stores_grad), dx in zip(src, dxs):
            if not x_stores_grad and isinstance(src_op, Dummy) and \
                    not (wanted and (src_op, x_id) in wanted):
                continue  # a leaf nobody keeps the gradient of
            grads = not_ready.get(src_op)
            if grads is None:
                grads = not_ready[src_op] = [None] * len(src_op.y_id2idx)
            y_idx = src_op.y_id2idx[x_id]
            node_left = node_uses[src_op] - 1
            node_uses[src_op] = node_left
            if len(grads) == 1:  # the node's only output: its uses are the node's
                tensor_left = node_left
            else:
                tensor_left = tensor_uses[src_op, x_id] - 1
                tensor_uses[src_op, x_id] = tensor_left
            if dx is not None:
                grads[y_idx] = dx if grads[y_idx] is None else add(grads[y_idx], dx)
            if tensor_left == 0 and grads[y_idx] is not None:
                if x_stores_grad:
                    yield x, grads[y_idx], src_op.grad_name(y_idx)
                elif wanted and (src_op, x_id) in wanted:
                    yield wanted[src_op, x_id], grads[y_idx], src_op.grad_name(y_idx)
            if node_left == 0:
                if walks_into(src_op, tracked):
                    ready.append((src_op, grads))
                del not_ready[src_op]
