"""PyTorch-style autograd on SINGA tensors: ``requires_grad_``, ``backward``, ``.grad``,
``grad_fn``, ``detach``, recorded Tensor operators and :func:`grad`.

The rule that lets PyTorch-style code and SINGA programs share one engine (docs/torch_style.md):

* A **tracked** tensor (``Tensor.tracked``) is a PyTorch-style leaf -- made by
  ``t.requires_grad_()`` or ``tensor.tensor(..., requires_grad=True)`` -- or a result computed
  from one while grad mode is on. The engine's door (``Operator._do_forward``) propagates the
  flag: an operator is tracked when an input is and it records a gradient.
* Tensor operators ``+ - * / ** @`` and unary ``-`` record autograd operators only when grad mode
  is on and an operand is tracked; otherwise they stay SINGA's plain arithmetic. SINGA's layer
  parameters store their gradient too, but are never tracked unless ``requires_grad_()`` is
  called on them, so SINGA programs never record through operators.
* An operator keeps its backward state (the vjp residuals) when it records a gradient and either
  ``autograd.training`` is True (SINGA's rule) or it is tracked (PyTorch's: whatever the mode).
  So a SINGA program in evaluation mode keeps nothing, and PyTorch-style code works in both.

Backward here follows PyTorch: ``Tensor.backward`` accumulates into ``.grad`` and frees the
graph it passes unless ``retain_graph=True``; :func:`grad` returns gradients without touching
``.grad``. SINGA's ``autograd.backward`` keeps the graph (see :mod:`.engine`).

The Tensor methods (``singa_jax._src.tensor.tensor``) are thin: they call the functions here, which
this module registers with the tensor package on import (tensor sits below autograd).
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.base.node import Dummy, Node
from singa_jax._src.base.modes import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.tensor import tensor as _handle
from singa_jax._src.ops.elementwise import Add, Div, Matmul, Mul, Negative, Pow, Sub
from singa_jax._src.autodiff.backward import backpropagate, root_grad
from singa_jax._src.autodiff.kernels import fill_like

__all__ = ["grad", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled"]

# The operator each recorded Tensor operator runs (``reflected``: the Tensor is the right operand).
_OPERATOR_OPS = {"add": Add, "sub": Sub, "mul": Mul, "truediv": Div, "pow": Pow,
                 "matmul": Matmul}
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "pow": "**", "matmul": "@"}

TensorOrTensors = Union[Tensor, Sequence[Tensor]]


# --------------------------------------------------------------------------------------------
# leaves
# --------------------------------------------------------------------------------------------
def requires_grad_(t: Tensor, requires_grad: bool = True) -> Tensor:
    """``t.requires_grad_()``: make the leaf ``t`` store its gradient in the PyTorch sense (sets
    ``requires_grad``, ``stores_grad`` and ``tracked``), or, with False, clear all three."""
    creator = t.creator
    if not isinstance(creator, Dummy):
        if requires_grad and t.tracked:
            return t  # a result that already requires grad (PyTorch allows this no-op)
        raise RuntimeError(
            f"requires_grad_: {t.name} was computed by {creator.name}; only leaves (tensors no "
            f"operator computed) can change whether they store a gradient. Use "
            f"t.detach().requires_grad_() for a new leaf with its values")
    if requires_grad and not jnp.issubdtype(t.dtype, jnp.inexact):
        raise RuntimeError(f"requires_grad_: only floating-point tensors can require gradients; "
                           f"{t.name} has dtype {t.dtype}")
    flag = bool(requires_grad)
    t.requires_grad = t.stores_grad = t.tracked = flag
    return t


def detach(t: Tensor) -> Tensor:
    """``t.detach()``: a new leaf over the same array (no copy), ``requires_grad=False``."""
    return Tensor(data=t.array, device=t.device, dtype=t.dtype, requires_grad=False)


def check_grad(t: Tensor, value: Optional[Tensor]) -> None:
    """What ``t.grad = value`` accepts: None, or a floating-point Tensor of ``t``'s shape."""
    if value is None:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"{t.name}.grad: expected a Tensor or None, got {type(value).__name__}")
    if value.shape != t.shape or not jnp.issubdtype(value.dtype, jnp.inexact):
        raise ValueError(f"{t.name}.grad: expected a floating-point Tensor of shape {t.shape}, "
                         f"got shape {value.shape} and dtype {value.dtype}")


def zero_grad(t: Tensor) -> None:
    """``t.zero_grad()``: rebind ``t.grad`` to zeros. The gradient Tensor itself is kept, so a
    compiled (graph-mode) step sees persistent state rather than a new Tensor every step."""
    g = t.grad
    if g is not None:
        g.array = fill_like(0.0, g.shape, g.dtype)


def _accumulate(t: Tensor, g: jax.Array) -> None:
    """Add ``g`` to ``t.grad`` (created on the first backward, then rebound: graph mode sees the
    new Tensor, then reads and writes of the same one)."""
    current = t.grad
    if current is None:
        t.grad = Tensor(data=g.astype(t.dtype), device=t.device, requires_grad=False,
                        name=f"{t.name}.grad")
    else:
        current.array = current.array + g.astype(current.dtype)


# --------------------------------------------------------------------------------------------
# backward and grad
# --------------------------------------------------------------------------------------------
def _check_differentiable(where: str, y: Tensor) -> None:
    """``y`` must carry a gradient path: a leaf that stores its gradient, or a recorded op."""
    creator = y.creator
    leaf_with_grad = isinstance(creator, Dummy) and y.stores_grad
    if not (leaf_with_grad or (not isinstance(creator, Dummy) and creator.requires_grad)):
        raise RuntimeError(
            f"{where}: {y.name} does not require grad and has no grad_fn: nothing it was "
            f"computed from stores its gradient, or it was computed under no_grad. Make the "
            f"leaves with requires_grad_() or tensor.tensor(..., requires_grad=True) (Tensor "
            f"operators record only on such tensors), or compute it with autograd operators "
            f"in training mode")
    if not leaf_with_grad and not creator.tracked and not creator.freed and \
            getattr(creator, "_vjp", True) is None:
        raise RuntimeError(
            f"{where}: {y.name} was computed by {creator.name} outside training mode "
            f"(autograd.training False) from tensors autograd does not track, so it kept no "
            f"backward state. Make its leaves with requires_grad_() or tensor.tensor(..., "
            f"requires_grad=True), or set autograd.training = True (Model.train()) first")


def _root(where: str, y: Tensor, g: Any) -> Tuple[Tensor, jax.Array]:
    if not isinstance(y, Tensor):
        raise TypeError(f"{where}: expected a Tensor output, got {type(y).__name__}")
    if g is None and y.size() != 1:
        raise RuntimeError(f"{where}: grad can be implicitly created only for scalar outputs; "
                           f"{y.name} has shape {y.shape}, so pass its gradient (grad=...)")
    _check_differentiable(where, y)
    return y, root_grad(y, g)


def tensor_backward(t: Tensor, grad: Any = None, retain_graph: bool = False) -> None:
    """``t.backward(grad=None, retain_graph=False)``: accumulate d(t)/d(x) (times ``grad``) into
    ``x.grad`` for every tensor ``x`` that stores its gradient; frees the graph it passes unless
    ``retain_graph``."""
    roots = [_root("backward", t, grad)]
    for x, g, _ in backpropagate(roots, retain_graph):
        _accumulate(x, g)


def _as_list(where: str, what: str, value: Any) -> List[Any]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{where}: {what} must be a Tensor or a sequence of Tensors, got "
                    f"{type(value).__name__}")


def grad(outputs: TensorOrTensors, inputs: TensorOrTensors,
         grad_outputs: Optional[Any] = None, retain_graph: bool = False,
         allow_unused: bool = False) -> Tuple[Optional[Tensor], ...]:
    """PyTorch's ``torch.autograd.grad``: the gradients of ``outputs`` (weighted by
    ``grad_outputs``; summed over several outputs) with respect to each of ``inputs``.

    Returns a tuple with one Tensor per input (one element for a single input); ``.grad`` is not
    touched. ``inputs`` may be leaves or intermediate results. An input the outputs do not depend
    on is an error unless ``allow_unused`` (then its entry is None). The graph is freed unless
    ``retain_graph``.
    """
    outs = _as_list("grad", "outputs", outputs)
    ins = _as_list("grad", "inputs", inputs)
    if grad_outputs is None:
        gos: List[Any] = [None] * len(outs)
    else:
        gos = [grad_outputs] if isinstance(outputs, Tensor) else list(grad_outputs)
        if len(gos) != len(outs):
            raise ValueError(f"grad: {len(gos)} grad_outputs for {len(outs)} outputs")
    for i, x in enumerate(ins):
        if not isinstance(x, Tensor):
            raise TypeError(f"grad: input {i} must be a Tensor, got {type(x).__name__}")
        if not x.requires_grad:
            raise RuntimeError(f"grad: input {i} ({x.name}) does not require grad")
        if isinstance(x.creator, Dummy) and not (x.stores_grad or x.tracked):
            # operators compute no gradient for such a leaf (a SINGA input batch)
            raise RuntimeError(f"grad: input {i} ({x.name}) is a leaf that does not store its "
                               f"gradient; make it with requires_grad_() or "
                               f"tensor.tensor(..., requires_grad=True) before using it")
    roots = [_root("grad", y, gy) for y, gy in zip(outs, gos)]
    wanted: Dict[Tuple[Node, int], Tensor] = {(x.creator, id(x)): x for x in ins}
    found: Dict[int, jax.Array] = {}
    for x, g, _ in backpropagate(roots, retain_graph, wanted):
        if (x.creator, id(x)) in wanted:
            found[id(x)] = g
    results = []
    for i, x in enumerate(ins):
        g = found.get(id(x))
        if g is None and not allow_unused:
            raise RuntimeError(f"grad: input {i} ({x.name}) was not used to compute the outputs "
                               f"(pass allow_unused=True to get None for it)")
        results.append(None if g is None else
                       Tensor(data=g, device=x.device, requires_grad=False,
                              name=f"{x.name}.grad"))
    return tuple(results)


# --------------------------------------------------------------------------------------------
# Tensor operators on tracked tensors
# --------------------------------------------------------------------------------------------
def _operand(name: str, t: Tensor, other: Any) -> Any:
    """``other`` as a Tensor operand next to ``t`` (a number takes ``t``'s float dtype, as JAX's
    weak typing would), or NotImplemented for foreign types."""
    if isinstance(other, Tensor):
        if other.device.jax_device != t.device.jax_device:
            raise ValueError(f"Tensor {_SYMBOLS[name]}: operands are on different devices "
                             f"({t.device} and {other.device}); move one with to_device()")
        return other
    if isinstance(other, np.generic):
        other = other.item()
    if isinstance(other, (bool, int, float)):
        dtype = t.dtype if jnp.issubdtype(t.dtype, jnp.inexact) else None
        arr = jnp.asarray(other, dtype)
    elif isinstance(other, (np.ndarray, jax.Array)):
        arr = jnp.asarray(other)
    else:
        return NotImplemented
    return Tensor(data=arr, device=t.device, dtype=arr.dtype, requires_grad=False)


def _run(op: Any, *xs: Tensor) -> Tensor:
    """``op(*xs)`` recorded while grad mode is on; otherwise a plain result that needs no grad
    (PyTorch's ``requires_grad=False`` under no_grad)."""
    if is_grad_enabled():
        return op(*xs)[0]
    return detach(op(*xs)[0])


def tracked_operator(name: str, t: Tensor, other: Any, reflected: bool) -> Any:
    """``t (op) other`` (``other (op) t`` when ``reflected``) with a tracked operand, as the
    autograd operator of ``_OPERATOR_OPS``: the Tensor operator in PyTorch's sense."""
    operand = _operand(name, t, other)
    if operand is NotImplemented:
        return operand
    lhs, rhs = (operand, t) if reflected else (t, operand)
    return _run(_OPERATOR_OPS[name](), lhs, rhs)


def tracked_negative(t: Tensor) -> Tensor:
    """``-t`` for a tracked ``t`` (the autograd operator ``Negative``)."""
    return _run(Negative(), t)


def refuse_inplace(op: str, t: Tensor, other: Any) -> NoReturn:
    """In-place arithmetic would rebind a tensor the recorded graph refers to: refuse it."""
    raise RuntimeError(
        f"{op}: in-place arithmetic on a tensor autograd tracks (or with a tracked operand) "
        f"cannot be recorded; write `x = x {_SYMBOLS.get(op[3:-2], '+')} y` instead, or run the "
        f"update under `with autograd.no_grad():` (e.g. a manual parameter update)")


_handle.register_torch_style(sys.modules[__name__])
