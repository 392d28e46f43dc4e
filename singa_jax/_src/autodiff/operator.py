"""The Operator: the one door into an op.

Every Tensor has a ``creator``: the Operator that produced it, or a
:class:`~singa_jax._src.base.node.Dummy` for a leaf. Calling an Operator on Tensors
(:meth:`Operator._do_forward`) records ``src`` -- one ``(creator, id(x), x or None,
x.stores_grad)`` per input -- and ``y_id2idx`` (which output is which), and decides which
inputs' gradients anyone can use; the backward walk (:mod:`.walk`, :mod:`.backward`) reads
that graph. This module knows nothing about particular ops.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, Optional, Tuple

import jax

from singa_jax._src.autodiff import graph_log
from singa_jax._src.base import observe
from singa_jax._src.base.node import Dummy, Node  # noqa: F401
from singa_jax._src.runtime.ctensor import CTensor, as_array
from singa_jax._src.runtime.device import get_default_device
from singa_jax._src.base.modes import is_grad_enabled
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.tensor.tensor import CountView, result_tensor
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred, ArrayImpl

__all__ = ["Operator", "Operation", "next_name", "op_numbers"]


op_numbers = [0]  # the next operator number (names ``Type#N``; the record path reads it inline)


def next_name(prefix: str) -> str:
    """The next automatic operator name, ``prefix#N`` (SINGA's naming)."""
    n = op_numbers[0]
    op_numbers[0] = n + 1
    return f"{prefix}#{n}"


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

    op_count = CountView(op_numbers)  # SINGA's count of operators named so far
    takes_arrays = False  # True: forward/backward see jax.Arrays instead of CTensors
    # True when an input depends on a PyTorch-style leaf (``Tensor.tracked``): the op then keeps
    # its backward state whatever ``autograd.training`` says (see autograd.torch_style)
    tracked = False
    freed = False  # released by a backward without retain_graph: cannot be passed again
    # per input of the last call: whether anyone can use its gradient (None before a call)
    input_needs_grad: Optional[Tuple[bool, ...]] = None
    replayable = False  # whether eager replay may record it (see eager replay, Function)
    replay_device = None  # during an engine call that may record: the inputs' Device

    def __init__(self, name: Optional[str] = None):
        if name is None:
            name = next_name(type(self).__name__)
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
        if observe.on and not observe.observing(self):  # (a profiler, a trace naming ops, ...)
            return observe.op_call(self, xs, partial(self._do_forward, *xs))
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
        recorded = False
        if self.takes_arrays:
            if one_device and self.replayable and dev is not None and replay.active():
                # the inputs' values may still be pending (Deferred): the op records its kernel
                self.replay_device = dev
                try:
                    ys = self.forward(*[x._data for x in xs])
                finally:
                    self.replay_device = None
                recorded = True
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
        if recorded:  # (its place in the graph, for a walk that recurs: see graph_log)
            graph_log.note_operator(self, len(outs))
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
        if kind is ArrayImpl or isinstance(y, (jax.Array, jax.core.Tracer)):
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


