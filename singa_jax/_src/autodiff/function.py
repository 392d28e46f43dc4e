"""The operator kit: everything an op declaration needs, and nothing an op family owns.

A :class:`Function` is an Operator given by one pure JAX function ``fn(*arrays, **static)``. Its
forward is ``jax.jit(fn)`` and its backward the pullback of ``jax.vjp(fn)``, both compiled once per
(function, static arguments, input shapes/dtypes) and cached by JAX. In training mode the forward
kernel returns the pullback's residuals with the output, so backward does not recompute forward.
Override ``backward`` only where SINGA's gradient convention differs.

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
arguments. Also here: the bases for ops with tensor-valued constructor arguments and for ops
without gradient, the declaration helpers the op tables use, and SINGA's autograd helpers
(``axis_helper``, ``back_broadcast``, ``ctensor2numpy``).
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.runtime.ctensor import CTensor, as_array
from singa_jax._src.runtime.device import get_default_device
from singa_jax._src.base.modes import autocast_dtype, is_training
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.backend.xla_options import kernel
from singa_jax._src.autodiff import residuals
from singa_jax._src.autodiff.autocast import cast_kernel
from singa_jax._src.autodiff.engine import Operator, fill_like

__all__ = ["Function", "InvalidInput", "TensorArgsOp", "NonDifferentiable", "make_function", "functional",
           "declare", "as_tensor", "normalize_axis", "host_values", "CTensor", "axis_helper",
           "back_broadcast", "ctensor2numpy"]



# --------------------------------------------------------------------------------------------
# cached kernels
# --------------------------------------------------------------------------------------------
_PLAIN = frozenset({int, float, bool, str, type(None)})  # static values hashable as they are


def _freeze(v: Any) -> Any:
    """A hashable version of a static argument (lists become tuples)."""
    if type(v) in _PLAIN:
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(e) for e in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(e)) for k, e in v.items()))
    if isinstance(v, np.ndarray):
        return tuple(_freeze(e) for e in v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    return v


def _is_frozen(v: Any) -> bool:
    """Whether ``v`` is its own frozen form: a plain value, or a tuple of such (nested)."""
    if type(v) in _PLAIN:
        return True
    if type(v) is not tuple:
        return False
    for e in v:
        if not _is_frozen(e):
            return False
    return True


# Interned tuples an eager op keeps (static keys, kernel statics, gradient masks, output specs):
# equal ones are one object, so an op holds a shared tuple instead of allocating its own (fewer
# objects for Python's garbage collector to traverse while a graph is alive). Equal keys select
# the same cached kernel anyway (jax.jit compares static arguments by equality).
_INTERNED: Dict[Any, Any] = {}
_INTERNED_MAX = 1 << 16


def _interned(t: Any) -> Any:
    """The interned tuple equal to ``t`` (``t`` itself the first time)."""
    found = _INTERNED.get(t)
    if found is None:
        if len(_INTERNED) >= _INTERNED_MAX:
            return t
        found = _INTERNED.setdefault(t, t)
    return found


def _static_key(static: Dict[str, Any]) -> Tuple:
    """An op's static arguments as the kernels' cache key: ``(name, frozen value)`` pairs. Most
    ops have only plain values (numbers, None, strings) and tuples of them (a convolution's
    strides and paddings): their items are the key as they are; others are frozen (sorted)."""
    items = tuple(static.items())
    for _, v in items:
        if type(v) not in _PLAIN and not _is_frozen(v):
            return _interned(tuple(sorted((k, _freeze(e)) for k, e in items)))
    return _interned(items)


def _handle_cache(handle: Any, name: str) -> Optional[Dict[Any, Any]]:
    """The dict ``name`` that an op kit keeps on ``handle`` (made on first use), or None for a
    handle without an instance dict (then nothing is kept)."""
    store = getattr(handle, "__dict__", None)
    return None if store is None else store.setdefault(name, {})


def _handle_statics(handle: Any, key: Any, make: Callable[[], Dict[str, Any]]
                    ) -> Tuple[Dict[str, Any], Tuple]:
    """``(static arguments, their kernel key)`` of an op configured by ``handle`` -- ``make()``
    the first time for ``key``, then kept on the handle. A handle's configuration is fixed when
    it is made (as SINGA's C++ handles' cuDNN descriptors are), and a layer makes one op per
    call: the arguments and their key are made once per handle and ``key``, not once per op."""
    cache = _handle_cache(handle, "_op_statics")
    entry = None if cache is None else cache.get(key)
    if entry is None:
        static = make()
        entry = static, _static_key(static)
        if cache is not None:
            cache[key] = entry
    return entry


@kernel(static_argnums=(0, 1))
def _forward(fn: Callable, static: Tuple, *xs):
    """``fn(*xs, **static)`` as one cached kernel (no gradient state: eval mode)."""
    return fn(*xs, **dict(static))


# (the engine's input_needs_grad, input dtypes...) -> Function._differentiated's answer
_DIFFERENTIATED: Dict[Tuple, Tuple[Tuple[bool, ...], Optional[Tuple[bool, ...]]]] = {}
_OUTPUT_SPECS: Dict[Any, Tuple] = {}  # aval -> ((shape, dtype),): one output's spec
_ELEMENTS: Dict[Tuple, int] = {}  # outputs' spec -> their number of elements in all


def _output_spec(aval: Any) -> Tuple[Tuple[Tuple[int, ...], Any]]:
    """``((shape, dtype),)`` of a single output of ``aval`` (one shared tuple per aval)."""
    spec = _OUTPUT_SPECS.get(aval)
    if spec is None:
        spec = ((aval.shape, aval.dtype),)
        if len(_OUTPUT_SPECS) < _INTERNED_MAX:
            _OUTPUT_SPECS[aval] = spec
    return spec


def _split_state(out, n_state: int):
    """(outputs, new state arrays) of a kernel that returns ``n_state`` state arrays last."""
    if not n_state:
        return out, ()
    main = out[:-n_state]
    return (main[0] if len(main) == 1 else tuple(main)), tuple(out[-n_state:])


def _forward_vjp(fn: Callable, static: Tuple, diff: Tuple[bool, ...], n_state: int, xs: Tuple,
                 device: Any = None, join: bool = True):
    """Forward plus the pullback w.r.t. the inputs marked in ``diff``; returns
    ``(outputs, pullback, new state arrays)`` (recorded by eager replay when it can be: then
    with :class:`~singa_jax._src.eager.replay.Deferred` leaves). The kernel returns no copy of an input or
    output that the pullback keeps (see :mod:`.residuals`); without ``join`` the pullback is
    returned as the kernel left it, for the caller to join."""
    ys, pullback, new_state = replay.run(_forward_vjp_kernel,
                                         _interned((fn, static, diff, n_state)), xs, device)
    return ys, (residuals.join(pullback, xs, ys) if join else pullback), new_state


def _kept_pullback(pullback: Any, args: Tuple, ys: Any, device: Any) -> Any:
    """What a training-mode forward keeps of the pullback its kernel returned for ``args`` and
    ``ys``: joined now, or -- recorded, or run on recorded inputs (``device``: replay may have
    recorded; the pullback keeps them) -- an :class:`_Unjoined`, whose Deferred leaves are
    computed and joined when a backward first needs them."""
    if device is not None:
        if type(ys[0] if isinstance(ys, tuple) else ys) is Deferred:
            return _Unjoined(pullback, args, ys)
        for x in args:
            if type(x) is Deferred:
                return _Unjoined(pullback, args, ys)
    return residuals.join(pullback, args, ys)


def _store_writes(writes: Sequence[Tensor], new_state: Sequence[Any]) -> None:
    """Rebind each declared write to its new value (a pending Deferred, or an array)."""
    for t, value in zip(writes, new_state):
        if type(value) is Deferred:
            replay.bind(t, value)
        else:
            t.array = value


_FLAT = object()  # Function._pullback: the pullback is held as its leaves only (_flat)


class _Unjoined:
    """A recorded forward's pullback, kept as the kernel left it (its residuals pending
    Deferreds, the forwarded ones not yet put back: see :mod:`.residuals`) with the call's
    inputs and outputs; joined once, when a backward first needs it."""

    __slots__ = ("pullback", "inputs", "outputs")

    def __init__(self, pullback: Any, inputs: Tuple, outputs: Any):
        self.pullback, self.inputs, self.outputs = pullback, inputs, outputs

    def joined(self) -> Any:
        """The pullback with every residual computed and the forwarded ones back in place."""
        pullback = self.pullback
        if type(pullback) is residuals.Residuals:
            pullback = residuals.Residuals(replay.resolve_all(pullback.computed),
                                           pullback.layout)
        else:
            pullback = replay.resolve_tree(pullback)
        outputs = self.outputs
        outputs = (tuple(replay.resolve_all(outputs)) if isinstance(outputs, tuple)
                   else replay.resolve_all((outputs,))[0])
        return residuals.join(pullback, replay.resolve_all(self.inputs), outputs)

    def flat(self, pending: bool = False) -> Tuple[list, Any]:
        """``(leaves, treedef)`` of the joined pullback, its residuals computed (or, with
        ``pending``, possibly still Deferred), made without building the joined pytree (from
        the layout, when the kernel forwarded residuals)."""
        pullback = self.pullback
        if type(pullback) is not residuals.Residuals:
            leaves, treedef = jax.tree_util.tree_flatten(pullback)
            return (leaves if pending else replay.resolve_all(leaves)), treedef
        outputs = self.outputs
        leaves = residuals.leaves(pullback, self.inputs,
                                  outputs if isinstance(outputs, tuple) else (outputs,))
        return (leaves if pending else replay.resolve_all(leaves)), pullback.layout[0]


@kernel(static_argnums=(0, 1, 2, 3))
def _forward_vjp_kernel(fn: Callable, static: Tuple, diff: Tuple[bool, ...], n_state: int, *xs):
    """:func:`_forward_vjp`'s kernel: its pullback as :func:`.residuals.split` leaves it (of
    ``fn``'s lean form where it has one: see :func:`.residuals.register_lean`)."""
    f = residuals.lean(fn, static)
    return residuals.vjp(lambda *args: _split_state(f(*args), n_state), diff, xs)


@kernel
def _pullback(vjp_fn, dys):
    return vjp_fn(dys)


def _pull(spec: Tuple, vjp: Callable, dys: Sequence[Any], apply: Optional[Callable] = None
          ) -> Tuple[Any, ...]:
    """A Function's backward as a pure function: ``vjp`` (the forward's pullback) applied by
    ``apply`` (default: the ``_pullback`` kernel) to the cotangents made from ``dys``; one
    gradient per input, None where ``spec``'s ``diff`` gives none. ``spec`` is ``(diff,
    outputs' (shape, dtype), several outputs)``."""
    diff, out, several = spec
    if several:
        cts = tuple(_cotangent(d, *o) for d, o in zip(dys, out))
    else:
        cts = _cotangent(dys[0], *out[0])
    grads = (apply or _pullback)(vjp, cts)
    if len(grads) == len(diff):  # every input gets its gradient
        return grads
    grads = iter(grads)
    return tuple(next(grads) if d else None for d in diff)


def _pull_leaves(spec: Tuple, leaves: list, dys: Sequence[Any],
                 apply: Optional[Callable] = None) -> Tuple[Any, ...]:
    """:func:`_pull` of the pullback given as its ``leaves``, its treedef last in ``spec``."""
    return _pull(spec[:3], spec[3].unflatten(leaves), dys, apply)


def _cotangent(dy, shape: Tuple[int, ...], dtype: Any) -> Any:
    """``dy`` made to fit an output of ``shape``/``dtype``: None means zero; integer outputs
    take float0 zeros."""
    if not is_inexact(dtype):
        return np.zeros(shape, jax.dtypes.float0)
    if dy is None:
        return fill_like(0.0, shape, dtype)
    if getattr(dy, "shape", None) != shape or dy.dtype != dtype:
        dy = fill_like(dy, shape, dtype)
    return dy


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
    # singa_jax._src.eager.replay); False for a class with its own forward, which may compute on arrays
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
            static = self._static = _static_key(self.static)
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
                ys, new_state = _split_state(
                    replay.run(_forward, _interned((fn, static)), args, device), len(writes))
            else:
                ys = replay.run(_forward, _interned((fn, static)), args, device)
        except (TypeError, ValueError) as e:
            raise _op_error(type(self).__name__, args, self.static, e) from None
        _store_writes(writes, new_state)
        return ys

    def _forward_keeping_pullback(self, fn: Callable, static: Tuple, xs: tuple, args: tuple,
                                  n_state: int, device: Any) -> Tuple[Any, Tuple]:
        """The training-mode forward: outputs and new state, the pullback kept for backward."""
        diff, every = self._differentiated(xs)
        extras = (False,) * (len(args) - len(xs)) if len(args) > len(xs) else ()
        ys, pullback, new_state = _forward_vjp(fn, static, diff + extras, n_state, args, device,
                                               join=False)
        several = isinstance(ys, tuple)
        self._pullback = _kept_pullback(pullback, args, ys, device)
        self._diff, self._flat = diff, None
        # a direct SINGA-style backward may still ask for the skipped inputs' gradients
        self._all_inputs = None if every is None else (args, every + extras)
        if not all(diff):  # shapes of the inputs that get no gradient
            self._no_grad_shapes = {i: x.shape for i, x in enumerate(xs) if not diff[i]}
        if several:
            self._out = _interned(tuple([(y.shape, y.dtype) for y in ys]))
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
        if type(pullback) is _Unjoined:
            pullback = self._pullback = pullback.joined()
        elif pullback is _FLAT:
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
            if type(pullback) is _Unjoined:
                flat = pullback.flat(pending)
                # the recorded structure (and its Deferred placeholders) can go: a pytree, if
                # ever needed, is rebuilt from the leaves
                self._pullback = _FLAT
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
            if len(_DIFFERENTIATED) < _INTERNED_MAX:
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
        return _pull((self._diff, self._out, self._several_outputs), vjp, dys)

    def keeps_backward_state(self) -> bool:
        return self._pullback is not None or type(self).backward is not Function.backward

    def output_elements(self) -> Optional[int]:
        out = self._out
        if not out:
            return None
        size = _ELEMENTS.get(out)  # (a walk asks for every operator: counted once per spec)
        if size is None:
            size = sum([math.prod(shape) for shape, _ in out])
            if len(_ELEMENTS) < _INTERNED_MAX:
                _ELEMENTS[out] = size
        return size

    def pullback_step(self, pending: bool = False):
        if self._pullback is None or not self.backward_is_pullback:
            return None
        # the pullback as its leaves (its structure in the step's spec): a fused walk's kernel
        # then takes plain lists of arrays, which jit flattens without calling back into Python
        leaves, treedef = self._pullback_leaves(pending)
        return (_pull_leaves, (self._diff, self._out, self._several_outputs, treedef), leaves,
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
            _, self._vjp, _ = _forward_vjp(fn, self._static, diff,
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


class InvalidInput(ValueError, AssertionError):
    """An op's inputs or arguments do not fit (shapes, axes, sizes). It is a ValueError; it is
    also an AssertionError because SINGA asserts these preconditions, and SINGA code (its own
    tests included) catches AssertionError."""


def _op_error(op: str, xs, static: Dict, e: Exception) -> Exception:
    shapes = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in xs)
    extra = f" with {static}" if static else ""
    cls = TypeError if isinstance(e, TypeError) and "dtype" in str(e) else InvalidInput
    return cls(f"{op}: cannot apply to inputs [{shapes}]{extra}: {e}")


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


# --------------------------------------------------------------------------------------------
# declaration helpers used by the op tables
# --------------------------------------------------------------------------------------------
def make_function(name: str, fn: Callable, doc: str = "") -> type:
    """A Function subclass called ``name`` computing ``fn``."""
    return type(name, (Function,), {"fn": staticmethod(fn), "__doc__": doc or fn.__doc__,
                                    "__module__": "singa_jax.autograd"})


def functional(op_cls: type, name: str, params: Sequence[str], doc: str = "") -> Callable:
    """SINGA's functional form of a parameterless op: ``name(*params) == op_cls()(*params)[0]``
    with the signature SINGA declares (``params``; ``"*l"`` means variadic)."""
    sig = inspect.Signature([
        inspect.Parameter(p.lstrip("*"), inspect.Parameter.VAR_POSITIONAL if p.startswith("*")
                          else inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])

    variadic = any(p.startswith("*") for p in params)
    # the kind's recipes (see .kinds), one per input avals: a table's op is called on tensors
    # of several shapes in one model (a ResNet's relu), and each keeps its recipe
    recipes: Optional[Dict[Any, Any]] = {} if recorded_by_kind(op_cls) else None

    def f(*args, **kwargs):
        if kwargs or variadic or len(args) != len(params):  # the usual call skips the binding
            try:
                args = sig.bind(*args, **kwargs).args
            except TypeError as e:
                raise TypeError(f"{name}(): {e}") from None
            return op_cls()(*args)[0]
        if recipes is None:
            return op_cls()(*args)[0]
        try:
            key = tuple([x._data.aval for x in args])
        except AttributeError:  # (not Tensors: the engine says what is wrong)
            return op_cls()(*args)[0]
        return kind_call(recipes, key, op_cls, args)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc or op_cls.__doc__
    f.__signature__ = sig
    f.__module__ = "singa_jax.autograd"
    return f


def declare(cls_name: str, func_name: str, params: Sequence[str], fn: Callable, doc: str,
            differentiable: bool = True) -> Tuple[type, Callable]:
    """One table row: the op class ``cls_name`` computing ``fn`` and its functional form
    ``func_name(*params)``; bind both by name: ``Exp, exp = declare("Exp", "exp", ...)``."""
    bases = (Function,) if differentiable else (NonDifferentiable, Function)
    cls = type(cls_name, bases, {"fn": staticmethod(fn), "__doc__": doc,
                                 "__module__": "singa_jax.autograd"})
    return cls, functional(cls, func_name, params, doc)


def as_tensor(value: Any, device) -> Tensor:
    """``value`` (a Tensor, list or array: a host-side constant) as a Tensor that needs no grad."""
    if isinstance(value, Tensor):
        return value
    arr = value if isinstance(value, jax.Array) else np.asarray(value)
    return Tensor(data=arr, device=device, dtype=arr.dtype, requires_grad=False)


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[0, ndim)`` (negative counts from the end); ValueError when out of range."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim


def host_values(op: str, x: jax.Array) -> np.ndarray:
    """The values of ``x`` on the host, for the few ops whose output SHAPE depends on them."""
    if isinstance(x, jax.core.Tracer):
        raise ValueError(f"{op}: the output shape depends on the input's values, so it cannot run "
                         f"inside a compiled (graph-mode / jit) step")
    return np.asarray(jax.device_get(x))


# --------------------------------------------------------------------------------------------
# SINGA's autograd helper functions
# --------------------------------------------------------------------------------------------
def axis_helper(y_shape: Sequence[int], x_shape: Sequence[int]) -> Tuple[int, ...]:
    """The axes of ``y_shape`` along which an operand of shape ``x_shape`` was broadcast."""
    axes = []
    j = len(x_shape) - 1
    for i in range(len(y_shape) - 1, -1, -1):
        if j < 0 or x_shape[j] != y_shape[i]:
            axes.append(i)
        j -= 1
    return tuple(reversed(axes))


def back_broadcast(y_shape: Sequence[int], x_shape: Sequence[int], x: Any) -> Any:
    """Sum a gradient of shape ``y_shape`` back to the shape ``x_shape`` it was broadcast from
    (a CTensor in, as SINGA passes, gives a CTensor out; an array gives an array)."""
    if tuple(y_shape) == tuple(x_shape):
        return x
    out = jnp.reshape(jnp.sum(as_array(x), axis=axis_helper(y_shape, x_shape)), tuple(x_shape))
    return CTensor.from_array(out) if isinstance(x, CTensor) else out


def ctensor2numpy(x: Any) -> np.ndarray:
    """A host (NumPy) copy of a CTensor or array (SINGA's helper; for host-side code only)."""
    return np.asarray(x)


from singa_jax._src.autodiff.recipes import kind_call, recorded_by_kind  # noqa: E402  (kinds builds on this kit)
