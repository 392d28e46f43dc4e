"""SINGA's reverse-mode engine: Operator, Dummy, infer_dependency, backward, gradients.

Every Tensor has a ``creator``: the Operator that produced it, or a :class:`Dummy` for a leaf.
Calling an Operator records ``src`` — one ``(creator, id(x), x or None, x.stores_grad)`` per input —
and ``y_id2idx`` (which output is which). :func:`backward` walks that graph from the loss in
dependency order: an operator runs its backward once all of its outputs' gradients have arrived,
gradients of a tensor used by several operators are summed, and every tensor with
``stores_grad=True`` is yielded with its gradient. This module knows nothing about particular ops.
"""
from __future__ import annotations

from collections import Counter, deque
from functools import partial
from typing import Any, Dict, Iterator, Optional, Tuple

import jax
import jax.numpy as jnp

from ..creator import Dummy, Node  # noqa: F401
from ..modes import is_grad_enabled, is_training
from ..tensor import Tensor

__all__ = ["Operator", "Operation", "Dummy", "infer_dependency", "gradients", "backward",
           "is_training"]


class Operator(Node):
    """Base of every differentiable operation.

    Subclasses implement ``forward(*arrays)`` returning an array or a tuple of arrays and
    ``backward(*dys)`` returning one gradient (or None) per input. Both work on ``jax.Array``s
    (``Tensor.data``), never on Tensors. Calling the operator on Tensors (``_do_forward``, the
    engine's only door into an op) records the graph and the inputs' device, then calls
    ``forward`` on their arrays; an op needing more than its inputs declares it (see
    :class:`~singa_jax.autograd.function.Function`).
    """

    op_count = 0

    def __init__(self, name: Optional[str] = None):
        if name is None:
            name = f"{type(self).__name__}#{Operator.op_count}"
            Operator.op_count += 1
        super().__init__(name)
        self.requires_grad = True  # until a call decides: a direct ``forward`` keeps its vjp
        self.device = None

    def __call__(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        return self._do_forward(*xs)

    def _do_forward(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        for i, x in enumerate(xs):
            if not isinstance(x, Tensor):
                raise TypeError(f"{type(self).__name__}: input {i} must be a Tensor, got "
                                f"{type(x).__name__}")
        self.requires_grad = any(x.requires_grad for x in xs) and is_grad_enabled()
        self.src = [(x.creator, id(x), x if x.stores_grad else None, x.stores_grad) for x in xs]
        self.device = dev = xs[0].device if xs else None
        ys = self.forward(*(x.data for x in xs))
        if not isinstance(ys, tuple):
            ys = (ys,)
        outs = tuple(Tensor(device=dev, data=y, requires_grad=self.requires_grad, creator=self,
                            name=self.output_name(i)) for i, y in enumerate(ys))
        self.y_id2idx = {id(y): i for i, y in enumerate(outs)}
        return outs

    def _do_backward(self, *dys) -> Tuple[Any, ...]:
        dxs = self.backward(*dys)
        if not isinstance(dxs, (tuple, list)):
            dxs = (dxs,)
        return tuple(dxs)

    def forward(self, *xs):
        raise NotImplementedError

    def backward(self, *dys):
        raise NotImplementedError


Operation = Operator  # SINGA 2.x name


def infer_dependency(op: Operator) -> Tuple[Counter, Counter]:
    """For the graph ending at ``op``: how many uses each operator's outputs have
    (``op_count``) and how many uses each tensor has (``tensor_count``).

    SINGA keys ``tensor_count`` by ``id(tensor)``; here the key is ``(creator, id(tensor))``.
    An intermediate Tensor nobody keeps is freed during the forward pass (``src`` records only
    its id), and CPython may give its id to a Tensor made later, say a parameter a layer builds
    lazily: keyed by id alone, the two would share one count and the parameter's gradient would
    never be yielded. The creator (alive while the graph is) tells them apart."""
    op_count: Counter = Counter()
    tensor_count: Counter = Counter()
    queue = deque([op])
    while queue:
        cur = queue.pop()
        for src_op, xid, _, _ in cur.src:
            # an op needing no grad never runs backward: its inputs get nothing through it, so
            # counting them would leave their gradients waiting forever
            if src_op not in op_count and src_op.requires_grad:
                queue.append(src_op)
            op_count[src_op] += 1
            tensor_count[src_op, xid] += 1
    return op_count, tensor_count


@partial(jax.jit, static_argnums=(1, 2))
def fill_like(value, shape: Tuple[int, ...], dtype) -> jax.Array:
    """``value`` (a number or array) broadcast to ``shape``/``dtype``, as one cached kernel: an
    eager ``jnp`` call here would cost more than the op it feeds."""
    return jnp.broadcast_to(jnp.asarray(value, dtype), shape)


def _root_grad(y: Tensor, dy) -> jax.Array:
    """The gradient fed into ``y.creator``: ``dy`` (default 1.0) broadcast to y's shape."""
    if isinstance(dy, Tensor):
        dy = dy.data
    if dy is None:
        dy = 1.0
    dtype = y.dtype if jnp.issubdtype(y.dtype, jnp.inexact) else jnp.dtype(jnp.float32)
    try:
        return fill_like(dy, y.shape, dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"backward: dy of shape {jnp.shape(dy)} does not broadcast to y's shape "
                         f"{y.shape}") from e


def backward(y: Tensor, dy: Any = None) -> Iterator[Tuple[Tensor, Tensor]]:
    """Run back-propagation from ``y`` (usually the loss); yield ``(tensor, gradient)`` for every
    tensor with ``stores_grad=True`` as soon as its gradient is complete.

    ``dy`` (a number or Tensor; default 1.0) is the gradient of the objective w.r.t. ``y``. Unlike
    SINGA's, ``y`` may have any size and be produced by any op.
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"backward: y must be a Tensor, got {type(y).__name__}")
    g = _root_grad(y, dy)
    if y.stores_grad:
        yield y, Tensor(device=y.device, data=g, name=y.creator.grad_name(0))
    if isinstance(y.creator, Dummy) or not y.creator.requires_grad:
        return
    op_dep, tensor_dep = infer_dependency(y.creator)
    root_dys = [None] * len(y.creator.y_id2idx)  # y may be any output of a multi-output op
    root_dys[y.creator.y_id2idx[id(y)]] = g
    ready = deque([(y.creator, root_dys)])
    not_ready: Dict[Operator, list] = {}
    while ready:
        op, dys = ready.pop()
        dxs = op._do_backward(*dys)
        if len(dxs) != len(op.src):
            raise RuntimeError(f"{op.name}: backward returned {len(dxs)} gradients for "
                               f"{len(op.src)} inputs")
        for (src_op, x_id, x, x_stores_grad), dx in zip(op.src, dxs):
            if isinstance(src_op, Dummy) and not x_stores_grad:
                continue
            grads = not_ready.get(src_op)
            if grads is None:
                grads = not_ready[src_op] = [None] * len(src_op.y_id2idx)
            y_idx = src_op.y_id2idx[x_id]
            if dx is not None:
                grads[y_idx] = dx if grads[y_idx] is None else grads[y_idx] + dx
            op_dep[src_op] -= 1
            tensor_dep[src_op, x_id] -= 1
            if x_stores_grad and tensor_dep[src_op, x_id] == 0 and grads[y_idx] is not None:
                gx = grads[y_idx]
                yield x, Tensor(device=x.device, data=gx, name=src_op.grad_name(y_idx))
            if op_dep[src_op] == 0:
                if src_op.requires_grad and not isinstance(src_op, Dummy):
                    ready.append((src_op, grads))
                del not_ready[src_op]
        op.release()


def gradients(y: Tensor, dy: Any = None) -> Dict[int, Tensor]:
    """``{id(tensor): gradient}`` for every tensor with ``stores_grad=True`` (SINGA's helper)."""
    return {id(p): dp for p, dp in backward(y, dy)}
