"""SINGA's backward entry points: :func:`backward` and :func:`gradients` (and
:func:`backpropagate`, which PyTorch-style autograd calls with several roots).

A walk runs fused (:mod:`.fused`) when its plan recurs, else op by op (:mod:`.walk`).
Retaining the graph: SINGA's entry points (:func:`backward`, :func:`gradients`, an optimizer's
``opt(loss)``) leave the graph intact, so one graph can be back-propagated twice (SINGA's GAN
example iterates ``autograd.backward(loss)`` and then calls ``optimizer(loss)``); the residuals
die with the graph. PyTorch-style entry points (``Tensor.backward``, ``autograd.grad``) free
every operator they pass unless ``retain_graph=True``; a later backward that meets a freed
operator raises RuntimeError.
"""
from __future__ import annotations

import numbers
from functools import partial
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.autodiff.fused import fused_walk
from singa_jax._src.autodiff.kernels import fill_like
from singa_jax._src.autodiff.operator import Operator
from singa_jax._src.autodiff.walk import walk
from singa_jax._src.backend import gc_tuning
from singa_jax._src.base import observe
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.base.node import Node
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.runtime.ctensor import CTensor
from singa_jax._src.tensor.tensor import Tensor, result_tensor

__all__ = ["backward", "gradients", "backpropagate", "root_grad", "given_root_dy"]


def given_root_dy(dy: Any) -> Optional[float]:
    """What SINGA's ``backward(y, dy)`` hands the loss's creator when that is a user's operator,
    if it is a Python float: 1.0 for ``dy=None``, ``float(dy)`` for a number. None: a CTensor
    of the root gradient (SINGA passes ``dy.data`` for a Tensor). Users' operators are written
    against this (``def backward(self, dy=1.0): ... dx *= dy``, SINGA's msmlp ``SumError``)."""
    if dy is None:
        return 1.0
    if isinstance(dy, numbers.Real) and not isinstance(dy, bool):  # NumPy's scalars included
        return float(dy)
    return None


def root_grad(y: Tensor, dy: Any) -> jax.Array:
    """The gradient fed into ``y.creator``: ``dy`` (default 1.0) broadcast to y's shape."""
    if isinstance(dy, Tensor):
        dy = dy.array
    elif isinstance(dy, CTensor):
        dy = dy._array
    dtype = y.dtype if is_inexact(y.dtype) else jnp.dtype(jnp.float32)
    if dy is None:
        if y.size() == 1 and not isinstance(y._data, jax.core.Tracer):  # an eager loss
            return _unit_gradient(y.shape, dtype)
        dy = 1.0
    try:
        return fill_like(dy, y.shape, dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"backward: dy of shape {jnp.shape(dy)} does not broadcast to y's shape "
                         f"{y.shape}") from e


# ``{(shape, dtype): 1 of that shape and dtype}`` for one-element roots: every backward from a
# loss needs it, and an array is immutable, so one serves them all instead of a kernel call each
_UNIT_GRADIENTS: Dict[Tuple[Tuple[int, ...], Any], jax.Array] = {}


def _unit_gradient(shape: Tuple[int, ...], dtype: Any) -> jax.Array:
    """``fill_like(1.0, shape, dtype)``, made once (a tracer, made when a trace is running, is
    not kept)."""
    g = _UNIT_GRADIENTS.get((shape, dtype))
    if g is None:
        g = fill_like(1.0, shape, dtype)
        if not isinstance(g, jax.core.Tracer) and len(_UNIT_GRADIENTS) < 64:
            _UNIT_GRADIENTS[shape, dtype] = g
    return g


def backpropagate(roots: Sequence[Tuple[Tensor, jax.Array]], retain_graph: bool = True,
                  wanted: Optional[Dict[Tuple[Node, int], Tensor]] = None,
                  root_dy: Optional[float] = None) -> Iterator[Tuple[Tensor, jax.Array, str]]:
    """The engine's walk from one or more ``(tensor, gradient array)`` roots; yields
    ``(tensor, gradient array, gradient name)`` for every tensor with ``stores_grad=True`` and
    every tensor of ``wanted`` (``{(tensor.creator, id(tensor)): tensor}``) as soon as its
    gradient is complete. Without ``retain_graph`` every operator passed is freed (released
    and marked, so that a later walk through it raises). ``root_dy`` (one root only; see
    :func:`given_root_dy`): what the root's creator gets, in place of the root gradient, when it
    is a user's operator; built-in operators and every later operator get arrays as always.

    A walk that recurs (the same operators, shapes and uses as an earlier one; see
    :func:`fused_backward`) runs as one kernel: every pullback and every sum of the walk, then
    the same yields in the same order."""
    for x, g, name, _ in _backpropagate(roots, retain_graph, wanted, root_dy):
        yield x, g, name


def _backpropagate(roots: Sequence[Tuple[Tensor, jax.Array]], retain_graph: bool = True,
                   wanted: Optional[Dict[Tuple[Node, int], Tensor]] = None,
                   root_dy: Optional[float] = None, record: bool = False
                   ) -> Iterator[Tuple[Tensor, Any, str, Any]]:
    """:func:`backpropagate`, each yield with the Device its gradient array is known to live on
    (a fused walk's kernel runs on its operators' one device), or None. With ``record``, a
    fused walk may be recorded by eager replay into the segment of its forward (see
    :func:`_fused_walk`): its gradients are then :class:`~singa_jax._src.eager.replay.Deferred`."""
    wanted = wanted or {}
    gc_tuning.tune()  # an eager training loop keeps each graph until the next step (see there)
    if not record:
        replay.flush()  # the forward's recorded kernels run now (their residuals are needed)
    # (a recorded walk retains the graph: it may be recorded again without its operators)
    fused = fused_walk(roots, wanted, record and retain_graph)
    if fused is not None:
        ops, yields, device = fused
        if not retain_graph:
            for op in ops:
                op.release()
                op.freed = True
        for x, g, name in yields:
            yield x, g, name, device
        return

    replay.flush()  # an op-by-op walk reads the residuals
    given = None
    if root_dy is not None and len(roots) == 1 and \
            not getattr(roots[0][0].creator, "takes_arrays", True):
        given = roots[0]  # (root tensor, its gradient array): the creator runs first, once

    def run(op: Operator, dys: list) -> Tuple[Any, ...]:
        if given is not None and op is given[0].creator:
            dys = [root_dy if d is given[1] else d for d in dys]
        if observe.on:  # (a profiler, anomaly detection, a trace naming backward ops)
            dxs = observe.backward_call(op, partial(op._do_backward, *dys))
        else:
            dxs = op._do_backward(*dys)
        if not retain_graph:
            op.release()
            op.freed = True
        return dxs

    walked = walk(roots, wanted, run)
    if observe.on and observe.whole_walks():  # every gradient checked before the first goes
        walked = list(walked)
    for x, g, name in walked:
        yield x, g, name, None


def backward(y: Tensor, dy: Any = None) -> Iterator[Tuple[Tensor, Tensor]]:
    """Run back-propagation from ``y`` (usually the loss); yield ``(tensor, gradient)`` for every
    tensor with ``stores_grad=True`` as soon as its gradient is complete.

    ``dy`` (a number or Tensor; default 1.0) is the gradient of the objective w.r.t. ``y``. Unlike
    SINGA's, ``y`` may have any size and be produced by any op. The graph is kept (as SINGA's
    is), so it can be back-propagated again. As in SINGA, when ``y``'s creator is a user's
    operator its ``backward`` gets the Python float 1.0 (``dy=None``) or ``float(dy)`` (a number),
    and a CTensor for a Tensor ``dy``.
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"backward: y must be a Tensor, got {type(y).__name__}")
    for x, g, name, device in _backpropagate([(y, root_grad(y, dy))],
                                             root_dy=given_root_dy(dy), record=True):
        # (a gradient known to be on x's device skips the placement check)
        t = result_tensor(g, x.device, name=name, placed=device is x.device)
        if type(g) is Deferred:  # a recorded walk's: computed when its segment runs
            replay.bind(t, g)
        yield x, t


def gradients(y: Tensor, dy: Any = None) -> Dict[int, Tensor]:
    """``{id(tensor): gradient}`` for every tensor with ``stores_grad=True`` (SINGA's helper)."""
    return {id(p): dp for p, dp in backward(y, dy)}
