"""The cached kernels an operator call runs, and their bookkeeping: the static-argument keys
(interned, so that equal keys are one object), the forward kernel, the forward-with-pullback
kernel and how its pullback is kept (joined now, or left as the kernel returned it while eager
replay records), the declared writes' store, and the pullback as a pure function for a fused
walk. Both the operator kit (:mod:`.function`) and the per-kind recording path (:mod:`.recipes`)
build on these."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.autodiff import residuals
from singa_jax._src.backend.xla_options import kernel
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.eager import replay
from singa_jax._src.eager.replay import Deferred
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["interned", "static_key", "handle_cache", "handle_statics", "forward_kernel",
           "split_state", "forward_vjp", "forward_vjp_kernel", "kept_pullback", "store_writes",
           "FLAT", "Unjoined", "pullback_kernel", "pull", "pull_leaves", "cotangent",
           "fill_like", "InvalidInput", "op_error"]

INTERNED_MAX = 1 << 16  # entries a per-signature cache keeps (beyond: computed each time)

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


def interned(t: Any) -> Any:
    """The interned tuple equal to ``t`` (``t`` itself the first time)."""
    found = _INTERNED.get(t)
    if found is None:
        if len(_INTERNED) >= INTERNED_MAX:
            return t
        found = _INTERNED.setdefault(t, t)
    return found


def static_key(static: Dict[str, Any]) -> Tuple:
    """An op's static arguments as the kernels' cache key: ``(name, frozen value)`` pairs. Most
    ops have only plain values (numbers, None, strings) and tuples of them (a convolution's
    strides and paddings): their items are the key as they are; others are frozen (sorted)."""
    items = tuple(static.items())
    for _, v in items:
        if type(v) not in _PLAIN and not _is_frozen(v):
            return interned(tuple(sorted((k, _freeze(e)) for k, e in items)))
    return interned(items)


def handle_cache(handle: Any, name: str) -> Optional[Dict[Any, Any]]:
    """The dict ``name`` that an op kit keeps on ``handle`` (made on first use), or None for a
    handle without an instance dict (then nothing is kept)."""
    store = getattr(handle, "__dict__", None)
    return None if store is None else store.setdefault(name, {})


def handle_statics(handle: Any, key: Any, make: Callable[[], Dict[str, Any]]
                    ) -> Tuple[Dict[str, Any], Tuple]:
    """``(static arguments, their kernel key)`` of an op configured by ``handle`` -- ``make()``
    the first time for ``key``, then kept on the handle. A handle's configuration is fixed when
    it is made (as SINGA's C++ handles' cuDNN descriptors are), and a layer makes one op per
    call: the arguments and their key are made once per handle and ``key``, not once per op."""
    cache = handle_cache(handle, "_op_statics")
    entry = None if cache is None else cache.get(key)
    if entry is None:
        static = make()
        entry = static, static_key(static)
        if cache is not None:
            cache[key] = entry
    return entry


@kernel(static_argnums=(0, 1))
def forward_kernel(fn: Callable, static: Tuple, *xs):
    """``fn(*xs, **static)`` as one cached kernel (no gradient state: eval mode)."""
    return fn(*xs, **dict(static))


def split_state(out, n_state: int):
    """(outputs, new state arrays) of a kernel that returns ``n_state`` state arrays last."""
    if not n_state:
        return out, ()
    main = out[:-n_state]
    return (main[0] if len(main) == 1 else tuple(main)), tuple(out[-n_state:])


def forward_vjp(fn: Callable, static: Tuple, diff: Tuple[bool, ...], n_state: int, xs: Tuple,
                 device: Any = None, join: bool = True):
    """Forward plus the pullback w.r.t. the inputs marked in ``diff``; returns
    ``(outputs, pullback, new state arrays)`` (recorded by eager replay when it can be: then
    with eager replay's ``Deferred`` leaves). The kernel returns no copy of an input or
    output that the pullback keeps (see :mod:`.residuals`); without ``join`` the pullback is
    returned as the kernel left it, for the caller to join."""
    ys, pullback, new_state = replay.run(forward_vjp_kernel,
                                         interned((fn, static, diff, n_state)), xs, device)
    return ys, (residuals.join(pullback, xs, ys) if join else pullback), new_state


def kept_pullback(pullback: Any, args: Tuple, ys: Any, device: Any) -> Any:
    """What a training-mode forward keeps of the pullback its kernel returned for ``args`` and
    ``ys``: joined now, or -- recorded, or run on recorded inputs (``device``: replay may have
    recorded; the pullback keeps them) -- an :class:`_Unjoined`, whose Deferred leaves are
    computed and joined when a backward first needs them."""
    if device is not None:
        if type(ys[0] if isinstance(ys, tuple) else ys) is Deferred:
            return Unjoined(pullback, *residuals.forwarded(pullback, args, ys))
        for x in args:
            if type(x) is Deferred:
                return Unjoined(pullback, *residuals.forwarded(pullback, args, ys))
    return residuals.join(pullback, args, ys)


def store_writes(writes: Sequence[Tensor], new_state: Sequence[Any]) -> None:
    """Rebind each declared write to its new value (a pending Deferred, or an array)."""
    for t, value in zip(writes, new_state):
        if type(value) is Deferred:
            replay.bind(t, value)
        else:
            t.array = value


FLAT = object()  # Function._pullback: the pullback is held as its leaves only (_flat)


class Unjoined:
    """A recorded forward's pullback, kept as the kernel left it (its residuals pending
    Deferreds, the forwarded ones not yet put back: see :mod:`.residuals`) with the call's
    inputs and outputs it forwards (the others None: :func:`.residuals.forwarded`); joined
    once, when a backward first needs it."""

    __slots__ = ("pullback", "inputs", "outputs")

    def __init__(self, pullback: Any, inputs: Tuple, outputs: Any):
        self.pullback, self.inputs, self.outputs = pullback, inputs, outputs

    def joined(self) -> Any:
        """The pullback with every residual computed and the forwarded ones back in place."""
        pullback = self.pullback
        if type(pullback) is not residuals.Residuals:
            return replay.resolve_tree(pullback)
        leaves, treedef = self.flat()
        return treedef.unflatten(leaves)

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
def forward_vjp_kernel(fn: Callable, static: Tuple, diff: Tuple[bool, ...], n_state: int, *xs):
    """:func:`_forward_vjp`'s kernel: its pullback as :func:`.residuals.split` leaves it (of
    ``fn``'s lean form where it has one: see :func:`.residuals.register_lean`)."""
    f = residuals.lean(fn, static)
    return residuals.vjp(lambda *args: split_state(f(*args), n_state), diff, xs)


@kernel
def pullback_kernel(vjp_fn, dys):
    return vjp_fn(dys)


def pull(spec: Tuple, vjp: Callable, dys: Sequence[Any], apply: Optional[Callable] = None
          ) -> Tuple[Any, ...]:
    """A Function's backward as a pure function: ``vjp`` (the forward's pullback) applied by
    ``apply`` (default: the ``_pullback`` kernel) to the cotangents made from ``dys``; one
    gradient per input, None where ``spec``'s ``diff`` gives none. ``spec`` is ``(diff,
    outputs' (shape, dtype), several outputs)``."""
    diff, out, several = spec
    if several:
        cts = tuple(cotangent(d, *o) for d, o in zip(dys, out))
    else:
        cts = cotangent(dys[0], *out[0])
    grads = (apply or pullback_kernel)(vjp, cts)
    if len(grads) == len(diff):  # every input gets its gradient
        return grads
    grads = iter(grads)
    return tuple(next(grads) if d else None for d in diff)


def pull_leaves(spec: Tuple, leaves: list, dys: Sequence[Any],
                 apply: Optional[Callable] = None) -> Tuple[Any, ...]:
    """:func:`_pull` of the pullback given as its ``leaves``, its treedef last in ``spec``."""
    return pull(spec[:3], spec[3].unflatten(leaves), dys, apply)


def cotangent(dy, shape: Tuple[int, ...], dtype: Any) -> Any:
    """``dy`` made to fit an output of ``shape``/``dtype``: None means zero; integer outputs
    take float0 zeros."""
    if not is_inexact(dtype):
        return np.zeros(shape, jax.dtypes.float0)
    if dy is None:
        return fill_like(0.0, shape, dtype)
    if getattr(dy, "shape", None) != shape or dy.dtype != dtype:
        dy = fill_like(dy, shape, dtype)
    return dy


class InvalidInput(ValueError, AssertionError):
    """An op's inputs or arguments do not fit (shapes, axes, sizes). It is a ValueError; it is
    also an AssertionError because SINGA asserts these preconditions, and SINGA code (its own
    tests included) catches AssertionError."""


def op_error(op: str, xs, static: Dict, e: Exception) -> Exception:
    shapes = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in xs)
    extra = f" with {static}" if static else ""
    cls = TypeError if isinstance(e, TypeError) and "dtype" in str(e) else InvalidInput
    return cls(f"{op}: cannot apply to inputs [{shapes}]{extra}: {e}")


@partial(jax.jit, static_argnums=(1, 2))
def fill_like(value, shape: Tuple[int, ...], dtype) -> jax.Array:
    """``value`` (a number or array) broadcast to ``shape``/``dtype``, as one cached kernel: an
    eager ``jnp`` call here would cost more than the op it feeds."""
    return jnp.broadcast_to(jnp.asarray(value, dtype), shape)
