"""The operator kit: :class:`Function`, an Operator given by one pure JAX function
``fn(*arrays, **static)``, and the bases an op declaration builds on.

A Function's forward is ``jax.jit(fn)`` and its backward the pullback of ``jax.vjp(fn)``, both
compiled once per (function, static arguments, input shapes/dtypes) and cached by JAX (the
kernels: :mod:`.kernels`). In training mode the forward kernel returns the pullback's residuals
with the output, so backward does not recompute forward. Override ``backward`` only where
SINGA's gradient convention differs.

The one door for state. ``forward``/``backward`` see arrays and return arrays. An op that needs
more DECLARES it, and :meth:`Function.forward` (here, once for every op) fetches and stores it:

* ``reads()``  -> Tensors whose arrays the kernel takes after the inputs, without gradient
  (BatchNorm's running statistics, RNN sequence lengths);
* ``writes()`` -> Tensors the kernel rewrites: it returns one new array for each after its
  outputs, and the kit rebinds ``t.data`` (so graph mode and the transactional step see every
  write through ``Tensor.data``, the same door as every read);
* ``needs_key()`` -> True when the kernel takes a fresh PRNG key last, drawn from the device of
  the op's inputs (Dropout, RNN dropout).

No op overrides the engine's ``_do_forward``, touches ``Tensor.data`` or rewrites its static
arguments. Also here: the bases for ops with tensor-valued constructor arguments
(:class:`TensorArgsOp`) and for ops without gradient (:class:`NonDifferentiable`).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.autodiff.autocast import cast_kernel
from singa_jax._src.autodiff.kernels import (FLAT, INTERNED_MAX, InvalidInput, Unjoined,
                                             forward_kernel, forward_vjp, interned, kept_pullback,
                                             op_error, pull, pull_leaves, split_state,
                                             static_key, store_writes)
from singa_jax._src.autodiff.operator import Operator
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.base.modes import autocast_dtype, is_training
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.runtime.ctensor import CTensor, as_array
from singa_jax._src.runtime.device import get_default_device
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["Function", "InvalidInput", "TensorArgsOp", "NonDifferentiable", "as_tensor"]


# (the engine's input_needs_grad, input dtypes...) -> Function._differentiated's answer
_DIFFERENTIATED: Dict[Tuple, Tuple[Tuple[bool, ...], Optional[Tuple[bool, ...]]]] = {}
_OUTPUT_SPECS: Dict[Any, Tuple] = {}  # aval -> ((shape, dtype),): one output's spec
_ELEMENTS: Dict[Tuple, int] = {}  # outputs' spec -> their number of elements in all


def _output_spec(aval: Any) -> Tuple[Tuple[Tuple[int, ...], Any]]:
    """``((shape, dtype),)`` of a single output of ``aval`` (one shared tuple per aval)."""
    spec = _OUTPUT_SPECS.get(aval)
    if spec is None:
        spec = ((aval.shape, aval.dtype),)
        if len(_OUTPUT_SPECS) < INTERNED_MAX:
            _OUTPUT_SPECS[aval] = spec
    return spec


# --------------------------------------------------------------------------------------------
# Function: an Operator given by one pure function
# --------------------------------------------------------------------------------------------
class Function(Operator):
    """An Operator given by the pure function ``fn``; ``static`` holds its non-array arguments,
    readable as attributes (``op.axis``) as SINGA's operators expose them."""

    fn: Callable = None  # pure: (*inputs, *reads, [key], **static) -> outputs (+ new state)
    takes_arrays = True  # the engine passes arrays; a direct SINGA-style call may pass CTensors
    # what the kernels' cache key holds of ``static``: frozen on the first forward (ops never
    # rewrite their static arguments), so a call does not re-freeze them
    _static: Optional[Tuple] = None
    # per forward in training mode: which inputs get a gradient; the outputs' (shape, dtype)
    # and whether there are several; the inputs' arguments when the engine's call skipped some
    _diff: Tuple[bool, ...] = ()
    _out: Tuple[Tuple[Tuple[int, ...], Any], ...] = ()
    _several_outputs = False
    _all_inputs = None
    # the forward's pullback: a pytree; an _Unjoined (recorded by eager replay, its residuals
    # pending); _FLAT (held as ``_flat`` only); or None (no backward state)
    _pullback: Any = None
    _flat = None  # (leaves, treedef) of the computed pullback, once a fused walk asked for it
    # whether the engine may hand ``forward`` Deferred inputs and have its kernel recorded (see
    # eager replay); False for a class with its own forward, which may compute on arrays
    replayable = True

    # whether the class declares state (overrides reads, writes or needs_key); set per class
    _declares_state = False
    # the class's autocast category (see .mixed_precision; None: its inputs' dtypes, always)
    autocast_policy: Optional[str] = None
    # whether ``backward`` is the forward's pullback, so a fused walk may run it as data
    # (``pullback_step``); a class overriding backward with another gradient is not, unless
    # it says so
    backward_is_pullback = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._declares_state = any(getattr(cls, m) is not getattr(Function, m)
                                  for m in ("reads", "writes", "needs_key"))
        if "backward" in cls.__dict__ and "backward_is_pullback" not in cls.__dict__:
            cls.backward_is_pullback = False
        if "forward" in cls.__dict__ and "replayable" not in cls.__dict__:
            cls.replayable = False  # its own forward may compute on the arrays

    def __init__(self, name: Optional[str] = None, **static):
        super().__init__(name)
        self.static = static
        if not static:  # (most elementwise ops: the key is known)
            self._static = ()

    def __getattr__(self, name: str) -> Any:
        for store in ("static", "tensor_args"):
            values = self.__dict__.get(store)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # --- what the op declares beyond its inputs (see the module docstring) --------------------
    def reads(self) -> Tuple[Tensor, ...]:
        return ()

    def writes(self) -> Tuple[Tensor, ...]:
        return ()

    def needs_key(self) -> bool:
        return False

    # --- the door: fetch declared state, run the kernel, store declared state ----------------
    def forward(self, *xs):
        if xs and isinstance(xs[0], CTensor):  # called directly, SINGA style: CTensors in and out
            return _as_ctensors(self.forward(*map(as_array, xs)))
        device = self.replay_device  # set by the engine's call when eager replay may record
        if self._declares_state:
            writes = self.writes()
            # (eager replay may record: a state Tensor's value may be a pending Deferred)
            args = xs + tuple([t.array if device is None else t._data for t in self.reads()])
            if self.needs_key():
                args += ((getattr(self, "device", None) or get_default_device()).next_key(),)
        else:
            args, writes = xs, ()
        static = self._static
        if static is None:
            static = self._static = static_key(self.static)
        fn = type(self).fn
        if self.autocast_policy is not None:
            compute = autocast_dtype()
            if compute is not None:  # the kernel casts its inputs (see .mixed_precision)
                fn = cast_kernel(fn, self.autocast_policy, compute, len(xs))
            self._fn = fn  # what the pullback and an export of this call see
        new_state = ()
        try:
            # backward state is kept in training mode, or whatever the mode when an input
            # depends on a PyTorch-style leaf (``self.tracked``, see autograd.torch_style)
            if self.requires_grad and (self.tracked or is_training()):
                ys, new_state = self._forward_keeping_pullback(fn, static, xs, args,
                                                               len(writes), device)
            elif writes:
                ys, new_state = split_state(
                    replay.run(forward_kernel, interned((fn, static)), args, device), len(writes))
            else:
                ys = replay.run(forward_kernel, interned((fn, static)), args, device)
        except (TypeError, ValueError) as e:
            raise op_error(type(self).__name__, args, self.static, e) from None
        store_writes(writes, new_state)
        return ys

    def _forward_keeping_pullback(self, fn: Callable, static: Tuple, xs: tuple, args: tuple,
                                  n_state: int, device: Any) -> Tuple[Any, Tuple]:
        """The training-mode forward: outputs and new state, the pullback kept for backward."""
        diff, every = self._differentiated(xs)
        extras = (False,) * (len(args) - len(xs)) if len(args) > len(xs) else ()
        ys, pullback, new_state = forward_vjp(fn, static, diff + extras, n_state, args, device,
                                               join=False)
        several = isinstance(ys, tuple)
        self._pullback = kept_pullback(pullback, args, ys, device)
        self._diff, self._flat = diff, None
        # a direct SINGA-style backward may still ask for the skipped inputs' gradients
        self._all_inputs = None if every is None else (args, every + extras)
        if not all(diff):  # shapes of the inputs that get no gradient
            self._no_grad_shapes = {i: x.shape for i, x in enumerate(xs) if not diff[i]}
        if several:
            self._out = interned(tuple([(y.shape, y.dtype) for y in ys]))
            self._several_outputs = True
        else:
            self._out, self._several_outputs = _output_spec(ys.aval), False
        return ys, new_state

    @property
    def _vjp(self) -> Any:
        """The forward's pullback (``jax.vjp``'s, its residuals computed), or None."""
        return None if self._pullback is None else self._resolved_vjp()

    @_vjp.setter
    def _vjp(self, pullback: Any) -> None:
        self._pullback, self._flat = pullback, None

    def _resolved_vjp(self) -> Any:
        """The pullback, its recorded (Deferred) residuals computed."""
        pullback = self._pullback
        if type(pullback) is Unjoined:
            pullback = self._pullback = pullback.joined()
        elif pullback is FLAT:
            leaves, treedef = self._pullback_leaves()
            pullback = self._pullback = treedef.unflatten(leaves)
        return pullback

    def _pullback_leaves(self, pending: bool = False) -> Tuple[list, Any]:
        """``(leaves, treedef)`` of the pullback, its residuals computed -- or, with
        ``pending``, as they are (Deferred while their segment has not run: a walk recorded
        into that segment takes them so) -- kept: a retained graph may be walked again."""
        flat = self._flat
        if flat is None:
            pullback = self._pullback
            if type(pullback) is Unjoined:
                flat = pullback.flat(pending)
                # the recorded structure (and its Deferred placeholders) can go: a pytree, if
                # ever needed, is rebuilt from the leaves
                self._pullback = FLAT
            else:
                flat = jax.tree_util.tree_flatten(pullback)
            self._flat = flat
        elif not pending:
            leaves = flat[0]
            for leaf in leaves:
                if type(leaf) is Deferred:  # left pending by a recorded walk: computed now
                    flat = self._flat = (replay.resolve_all(leaves), flat[1])
                    break
        return flat

    def _differentiated(self, xs: tuple) -> Tuple[Tuple[bool, ...], Optional[Tuple[bool, ...]]]:
        """Which inputs the pullback differentiates: those of a floating dtype whose gradient
        someone can use (the engine's ``input_needs_grad``); and, when that skips some
        differentiable input, every differentiable input (else None). Known per (needs, input
        dtypes) after the first time."""
        needs = self.input_needs_grad  # set by the engine's call; None for a direct call
        key = (needs, *[x.dtype for x in xs])
        known = _DIFFERENTIATED.get(key)
        if known is None:
            every = tuple([is_inexact(x.dtype) for x in xs])
            if needs is None or len(needs) != len(xs) or all(needs):
                known = (every, None)
            else:
                diff = tuple([d and n for d, n in zip(every, needs)])
                known = (diff, (None if diff == every else every))
            if len(_DIFFERENTIATED) < INTERNED_MAX:
                _DIFFERENTIATED[key] = known
        return known

    def backward(self, *dys):
        if not dys or isinstance(dys[0], CTensor):
            return self._singa_backward(dys)
        vjp = None if self._pullback is None else self._resolved_vjp()
        if vjp is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward: no forward state; run the forward pass with "
                f"autograd.training = True (and an input that requires grad) before backward")
        # the pullback is kept: the graph may be back-propagated again (release() drops it)
        return pull((self._diff, self._out, self._several_outputs), vjp, dys)

    def keeps_backward_state(self) -> bool:
        return self._pullback is not None or type(self).backward is not Function.backward

    def output_elements(self) -> Optional[int]:
        out = self._out
        if not out:
            return None
        size = _ELEMENTS.get(out)  # (a walk asks for every operator: counted once per spec)
        if size is None:
            size = sum([math.prod(shape) for shape, _ in out])
            if len(_ELEMENTS) < INTERNED_MAX:
                _ELEMENTS[out] = size
        return size

    def pullback_step(self, pending: bool = False):
        if self._pullback is None or not self.backward_is_pullback:
            return None
        # the pullback as its leaves (its structure in the step's spec): a fused walk's kernel
        # then takes plain lists of arrays, which jit flattens without calling back into Python
        leaves, treedef = self._pullback_leaves(pending)
        return (pull_leaves, (self._diff, self._out, self._several_outputs, treedef), leaves,
                self._diff)

    def _singa_backward(self, dys: tuple):
        """``backward`` called directly, SINGA style (``y.creator.backward(dy.data)``; a loss's
        dy defaults to 1): CTensors in, CTensors out -- one per input of the op as SINGA built it
        (not the tensor arguments appended to it), zeros for an input without gradient (integer
        indices), and a single CTensor for a single input."""
        if self._all_inputs is not None and self._pullback is not None:
            # the engine's call skipped inputs nobody needed a gradient for; SINGA's direct
            # call wants them all: redo the forward's vjp over every differentiable input
            args, diff = self._all_inputs
            fn = self.__dict__.get("_fn", type(self).fn)  # the forward's (autocast) kernel
            _, self._vjp, _ = forward_vjp(fn, self._static, diff,
                                           len(self.writes()), tuple(replay.resolve_all(args)))
            self._diff, self._all_inputs = diff[:len(self._diff)], None
        dxs = self.backward(*(map(as_array, dys) if dys else (1.0,)))  # overrides answer too
        dxs = (dxs if isinstance(dxs, tuple) else (dxs,))[:self._singa_inputs()]
        shapes = getattr(self, "_no_grad_shapes", {})
        dxs = tuple(CTensor.from_array(jnp.zeros(shapes[i], jnp.float32))
                    if d is None and i in shapes else _as_ctensors(d) for i, d in enumerate(dxs))
        return dxs[0] if len(dxs) == 1 else dxs

    def _singa_inputs(self) -> int:
        return len(self._diff)

    def release(self) -> None:
        super().release()
        self._pullback = self._all_inputs = self._flat = None


def _as_ctensors(values: Any) -> Any:
    """Arrays (one or a tuple; None stays None) as CTensors, for SINGA-style direct calls."""
    if isinstance(values, tuple):
        return tuple(map(_as_ctensors, values))
    return None if values is None else CTensor.from_array(values)


class TensorArgsOp(Function):
    """An op whose constructor takes array-valued arguments (SINGA's ``Where(condition)``,
    ``Gather(axis, indices)``...). They are appended to the inputs as Tensors so that changing
    their values never recompiles; integer ones get no gradient."""

    tensor_arg_names: Tuple[str, ...] = ()

    def __init__(self, tensor_args: Dict[str, Any], **static):
        super().__init__(**static)
        self.tensor_args = tensor_args

    def __call__(self, *xs: Tensor) -> Tuple[Tensor, ...]:
        if not xs or not isinstance(xs[0], Tensor):
            return super().__call__(*xs)  # let the engine raise its TypeError
        extra = tuple(as_tensor(self.tensor_args[n], xs[0].device) for n in self.tensor_arg_names)
        return super().__call__(*xs, *extra)

    def _singa_inputs(self) -> int:
        return len(self._diff) - len(self.tensor_arg_names)


class NonDifferentiable:
    """Mixin for ops whose outputs carry no gradient (comparisons, logic, indices, shapes).

    ``requires_grad`` is pinned to False, so the forward keeps no backward state, the outputs do
    not require grad and ``backward`` never walks into the op.
    """

    requires_grad = property(lambda self: False, lambda self, value: None)

    def backward(self, *dys):
        return (None,) * len(self.src)


def as_tensor(value: Any, device) -> Tensor:
    """``value`` (a Tensor, list or array: a host-side constant) as a Tensor that needs no grad."""
    if isinstance(value, Tensor):
        return value
    arr = value if isinstance(value, jax.Array) else np.asarray(value)
    return Tensor(data=arr, device=device, dtype=arr.dtype, requires_grad=False)

