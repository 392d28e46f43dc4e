"""SINGA's reverse-mode engine: Operator, Dummy, infer_dependency, backward, gradients.

Every Tensor has a ``creator``: the Operator that produced it, or a :class:`Dummy` for a leaf.
Calling an Operator records ``src`` — one ``(creator, id(x), x or None, x.stores_grad)`` per input —
and ``y_id2idx`` (which output is which). :func:`backward` walks that graph from the loss in
dependency order: an operator runs its backward once all of its outputs' gradients have arrived,
gradients of a tensor used by several operators are summed, and every tensor with
``stores_grad=True`` is yielded with its gradient. A walk that recurs (same operators, shapes and
uses) runs as one kernel: every op's backward as data (:meth:`Operator.pullback_step`), replayed
in one jitted program (see "Fused walks" below; :class:`fused_backward` turns it off). This
module knows nothing about particular ops.

Retaining the graph. SINGA's entry points (:func:`backward`, :func:`gradients`, an optimizer's
``opt(loss)``) leave the graph intact, so one graph can be back-propagated twice (SINGA's GAN
example iterates ``autograd.backward(loss)`` and then calls ``optimizer(loss)``); the residuals die
with the graph. PyTorch-style entry points (``Tensor.backward``, ``autograd.grad``, see
:mod:`~singa_jax._src.ops.torch_style`) free every operator they pass unless
``retain_graph=True``; a later backward that meets a freed operator raises RuntimeError.
"""
from __future__ import annotations

import numbers
import operator
import threading
from collections import Counter
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.base.node import Dummy, Node  # noqa: F401
from singa_jax._src.runtime.ctensor import CTensor, as_array
from singa_jax._src.runtime.device import get_default_device
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.base.modes import (fused_backward, is_backward_fused, is_grad_enabled,
                                       is_training)  # noqa: F401
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.tensor.tensor import CountView, result_tensor
from singa_jax._src.backend.xla_options import fuses_heavy_walks, kernel
from singa_jax._src.backend import gc_tuning
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred, _ArrayImpl

__all__ = ["Operator", "Operation", "Dummy", "infer_dependency", "gradients", "backward",
           "fused_backward", "is_training"]


_op_names = [0]  # the next operator number (names ``Type#N``)
_NEEDS: Dict[Tuple[bool, ...], Tuple[bool, ...]] = {}  # interned input_needs_grad masks


class Operator(Node):
    """Base of every differentiable operation.

    Subclasses implement ``forward(*xs)`` returning one value or a tuple and ``backward(*dys)``
    returning one gradient (or None) per input, never on Tensors. As in SINGA, a user's operator
    gets CTensors (``Tensor.data``) and may return CTensors, arrays or Tensors; the built-in
    operators (``takes_arrays = True``) get and return plain ``jax.Array``s, which is cheaper.
    Calling the operator on Tensors (``_do_forward``, the engine's only door into an op) records
    the graph and the inputs' device, then calls ``forward``; an op needing more than its inputs
    declares it (see :class:`~singa_jax.autograd.Function`).
    """

    op_count = CountView(_op_names)  # SINGA's count of operators named so far
    takes_arrays = False  # True: forward/backward see jax.Arrays instead of CTensors
    # True when an input depends on a PyTorch-style leaf (``Tensor.tracked``): the op then keeps
    # its backward state whatever ``autograd.training`` says (see autograd.torch_style)
    tracked = False
    freed = False  # released by a backward without retain_graph: cannot be passed again
    # per input of the last call: whether anyone can use its gradient (None before a call)
    input_needs_grad: Optional[Tuple[bool, ...]] = None
    replayable = False  # whether eager replay may record it (see singa_jax._src.eager.replay, Function)
    replay_device = None  # during an engine call that may record: the inputs' Device

    def __init__(self, name: Optional[str] = None):
        if name is None:
            n = _op_names[0]
            _op_names[0] = n + 1
            name = f"{type(self).__name__}#{n}"
        # Node's attributes, set here without its __init__ (one call fewer per op)
        self.name = name
        self.src = []
        self.y_id2idx = {}
        self.requires_grad = True  # until a call decides: a direct ``forward`` keeps its vjp
        self.device = None

    def __call__(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        return self._do_forward(*xs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} operator {self.name!r}>"

    def _do_forward(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        src, needs = [], []
        requires_grad = tracked = False
        dev = None
        if xs:
            dev = xs[0].device if isinstance(xs[0], Tensor) else None
        one_device = True  # every input on dev: the kernel's outputs are there too
        for x in xs:  # one pass: check, record src, find who needs a gradient
            if not isinstance(x, Tensor):
                raise self._not_a_tensor(xs)
            if x.device is not dev:
                one_device = False
            creator, stores_grad = x.creator, x.stores_grad
            src.append((creator, id(x), x if stores_grad else None, stores_grad))
            # which inputs' gradients anyone can use: one that requires grad and is kept
            # (stores_grad), tracked (PyTorch-style) or made by an op; a plain leaf such as the
            # input batch gets none (eager mode then skips e.g. the first convolution's input
            # gradient)
            if x.requires_grad:
                requires_grad = True
                if x.tracked:
                    tracked = True
                    needs.append(True)
                else:
                    needs.append(bool(stores_grad) or not isinstance(creator, Dummy))
            else:
                needs.append(False)
        self.requires_grad = requires_grad and is_grad_enabled()
        # read back: a NonDifferentiable op pins requires_grad to False (and is never tracked)
        requires_grad = self.requires_grad
        self.tracked = tracked = tracked and requires_grad
        self.src = src
        needs = tuple(needs)
        # (one shared tuple per mask: fewer objects for the garbage collector)
        self.input_needs_grad = _NEEDS.get(needs) or (
            _NEEDS.setdefault(needs, needs) if len(_NEEDS) < 4096 else needs)
        self.device = dev
        if self.takes_arrays:
            if one_device and self.replayable and dev is not None and replay.active():
                # the inputs' values may still be pending (Deferred): the op records its kernel
                self.replay_device = dev
                try:
                    ys = self.forward(*[x._data for x in xs])
                finally:
                    self.replay_device = None
            else:
                ys = self.forward(*[x.array for x in xs])
        else:
            ys = self.forward(*[x.data for x in xs])
        if dev is None:
            dev, one_device = get_default_device(), False
        if isinstance(ys, tuple):
            outs = tuple([self._output(y, i, dev, requires_grad, one_device)
                          for i, y in enumerate(ys)])
            self.y_id2idx = {id(y): i for i, y in enumerate(outs)}
        else:
            y = self._output(ys, 0, dev, requires_grad, one_device)
            outs = (y,)
            self.y_id2idx = {id(y): 0}
        if tracked:
            for y in outs:
                y.tracked = True
        return outs

    def _not_a_tensor(self, xs: tuple) -> TypeError:
        i, x = next((i, x) for i, x in enumerate(xs) if not isinstance(x, Tensor))
        return TypeError(f"{type(self).__name__}: input {i} must be a Tensor, got "
                         f"{type(x).__name__}")

    def _output(self, y: Any, idx: int, device: Any, requires_grad: bool,
                placed: bool) -> Tensor:
        """Output ``idx`` of this op as a Tensor; an array (what built-in ops return) skips the
        general constructor's argument parsing, and its placement check when ``placed`` (every
        input lives on ``device``, so the kernel ran there)."""
        kind = type(y)
        if kind is Deferred:  # recorded by eager replay: computed when its segment runs
            t = result_tensor(y, device, requires_grad, self, self.output_name(idx), True)
            replay.bind(t, y)
            return t
        if kind is _ArrayImpl or isinstance(y, (jax.Array, jax.core.Tracer)):
            return result_tensor(y, device, requires_grad, self, self.output_name(idx), placed)
        return Tensor(device=device, data=y, requires_grad=requires_grad, creator=self,
                      name=self.output_name(idx))

    def _do_backward(self, *dys) -> Tuple[Any, ...]:
        if self.takes_arrays:
            dxs = self.backward(*dys)
            return tuple(dxs) if isinstance(dxs, (tuple, list)) else (dxs,)
        dxs = self.backward(*(d if d is None or isinstance(d, float) else CTensor.from_array(d)
                              for d in dys))
        if not isinstance(dxs, (tuple, list)):
            dxs = (dxs,)
        return tuple(None if d is None else _gradient_array(self, d) for d in dxs)

    def forward(self, *xs):
        raise NotImplementedError

    def backward(self, *dys):
        raise NotImplementedError

    def keeps_backward_state(self) -> bool:
        """Whether ``backward`` can run from what the forward kept (True unless an op says
        otherwise: a Function that ran outside training mode kept no pullback)."""
        return True

    def output_elements(self) -> Optional[int]:
        """How many elements this op's last call output in all (None: not known)."""
        return None

    def pullback_step(self, pending: bool = False
                      ) -> Optional[Tuple[Callable, Any, Any, Tuple[bool, ...]]]:
        """This op's backward as data, for a fused walk: ``(pull, spec, state, gives)`` where
        ``pull(spec, state, dys, apply)`` is a pure function (``spec`` hashable, ``state`` a
        list of arrays -- with ``pending``, eager replay's Deferred values where they are not
        computed yet --, ``apply(state, cotangents)`` the call of the pullback) returning what
        ``backward(*dys)`` returns, and ``gives`` says which inputs get a gradient. None (the
        default, e.g. a user's operator): the engine calls ``backward`` and walks op by op."""
        return None


Operation = Operator  # SINGA 2.x name


def _gradient_array(op: Operator, dx: Any) -> jax.Array:
    """A user operator's gradient (a Tensor, CTensor or array) as the array the engine sums."""
    if isinstance(dx, Tensor):
        return dx.array
    return as_array(dx, f"{op.name}.backward")


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
            if src_op not in seen and _walks_into(src_op, tracked_walk):
                seen.add(src_op)
                found.append(src_op)
            node_uses[src_op] = node_uses.get(src_op, 0) + 1
            if every_tensor or len(src_op.y_id2idx) > 1:
                tensor_uses[src_op, xid] = tensor_uses.get((src_op, xid), 0) + 1
    return node_uses, tensor_uses


@partial(jax.jit, static_argnums=(1, 2))
def fill_like(value, shape: Tuple[int, ...], dtype) -> jax.Array:
    """``value`` (a number or array) broadcast to ``shape``/``dtype``, as one cached kernel: an
    eager ``jnp`` call here would cost more than the op it feeds."""
    return jnp.broadcast_to(jnp.asarray(value, dtype), shape)


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


def _walks_into(creator: Node, tracked_walk: bool = False) -> bool:
    """Whether backward runs ``creator``'s backward (an operator that recorded a gradient). In a
    walk from a PyTorch-style (tracked) root, PyTorch's rule: an operator that no tracked tensor
    depends on and that kept no backward state (it ran outside training mode, e.g. a reshape of
    a plain input) is not entered -- its inputs get no gradient through it, as in PyTorch."""
    if not creator.requires_grad or isinstance(creator, Dummy):
        return False
    return not tracked_walk or creator.tracked or creator.keeps_backward_state()


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
    fused = _fused_walk(roots, wanted, record)
    if fused is not None:
        ops, yields = fused
        if not retain_graph:
            for op in ops:
                op.release()
                op.freed = True
        device = ops[0].device
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
        dxs = op._do_backward(*dys)
        if not retain_graph:
            op.release()
            op.freed = True
        return dxs

    for x, g, name in _walk(roots, wanted, run):
        yield x, g, name, None


def _walk(roots: Sequence[Tuple[Tensor, Any]], wanted: Dict[Tuple[Node, int], Tensor],
          run: Callable[[Operator, list], Tuple[Any, ...]],
          add: Callable[[Any, Any], Any] = operator.add) -> Iterator[Tuple[Tensor, Any, str]]:
    """The walk itself, for any gradient values: ``run(op, dys)`` returns op's input gradients
    (None where there is none) for its outputs' gradients ``dys``; ``add`` sums two."""
    tracked = any(y.tracked for y, _ in roots)  # a PyTorch-style walk (see _walks_into)
    ops = list({y.creator: None for y, _ in roots if _walks_into(y.creator, tracked)})
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
            if _walks_into(creator, tracked):
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
                if _walks_into(src_op, tracked):
                    ready.append((src_op, grads))
                del not_ready[src_op]


# --------------------------------------------------------------------------------------------
# Fused walks: a recurring walk as one kernel
# --------------------------------------------------------------------------------------------
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


def _fused_walk(roots: Sequence[Tuple[Tensor, Any]], wanted: Dict[Tuple[Node, int], Tensor],
                record: bool = False) -> Optional[Tuple[list, list]]:
    """(operators walked, the walk's yields) computed by one replay kernel, or None when this
    walk goes op by op: inside a trace (already one program), fused walks off, an operator
    without a pure pullback, several devices, or a plan not seen before.

    With ``record``, while eager replay records the forward's segment on the walk's device,
    the replay kernel is recorded into it too (its yields are Deferred) and the pullback
    states it reads are marked soft (:func:`~singa_jax._src.eager.replay.soften`): a training step's
    residuals then never leave the segment's program. Otherwise the pullback states are
    computed first (a flush)."""
    if not is_backward_fused() or any(isinstance(g, jax.core.Tracer) for _, g in roots):
        return None
    heavy = fuses_heavy_walks(roots[0][0].device.platform)
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
            yields = list(_walk([(y, i) for i, (y, _) in enumerate(roots)], wanted, plan.run,
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
    values = replay.run(_replay, (plan_id, sizes), leaves + [g for _, g in roots], at)
    if at is not None:
        replay.soften(leaves)
    return ops, [(x, v, name) for (x, _, name), v in zip(yields, values)]


def _plan_id(key: Tuple) -> Optional[int]:
    """The id in ``_plan_table`` of the plan ``key`` (its steps and outputs) -- given on its
    second walk -- or None the first time (then remembered, while fewer than _PLANS_KEPT)."""
    plan_id = _seen_plans.get(key)
    if plan_id is None or plan_id < 0:
        with _plans_lock:  # threads walking at once must not share an id
            plan_id = _seen_plans.get(key)
            if plan_id is None:
                if len(_seen_plans) < _PLANS_KEPT:
                    _seen_plans[key] = -1
                return None
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
    walk of a signature planned before skips the symbolic walk (:func:`_fused_walk`)."""

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
                walks = _walks_into(node, tracked)
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
                                                          _walks_into(src_op, True))
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
def _replay(plan_id: int, sizes: Tuple[int, ...], *leaves: jax.Array) -> list:
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
