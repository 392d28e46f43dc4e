"""Operators defined by one pure JAX function.

A :class:`Function` subclass names a pure function ``fn(*arrays, **static)``; its forward is
``jax.jit(fn)`` and its backward is the pullback of ``jax.vjp(fn)``, both compiled once per
(function, static arguments, input shapes/dtypes) and cached by JAX. In training mode the forward
kernel returns the pullback's residuals with the output, so backward does not recompute forward.
Override ``backward`` only where SINGA's gradient convention differs or a hand-written one is
cheaper.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .engine import Operator, fill_like, is_training

__all__ = ["Function", "make_function"]


def _freeze(v: Any) -> Any:
    """A hashable version of a static argument (lists become tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(e) for e in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(e)) for k, e in v.items()))
    if isinstance(v, np.ndarray):
        return tuple(_freeze(e) for e in v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    return v


@partial(jax.jit, static_argnums=(0, 1))
def _forward(fn: Callable, static: Tuple, *xs):
    """``fn(*xs, **static)`` as one cached kernel (no gradient state: eval mode)."""
    return fn(*xs, **dict(static))


@partial(jax.jit, static_argnums=(0, 1, 2))
def _forward_vjp(fn: Callable, static: Tuple, diff: Tuple[bool, ...], *xs):
    """Forward plus the pullback w.r.t. the inputs marked differentiable in ``diff``."""
    fixed = [x for d, x in zip(diff, xs) if not d]

    def f(*dxs):
        it_d, it_f = iter(dxs), iter(fixed)
        return fn(*[next(it_d) if d else next(it_f) for d in diff], **dict(static))

    return jax.vjp(f, *[x for d, x in zip(diff, xs) if d])


@jax.jit
def _pullback(vjp_fn, dys):
    return vjp_fn(dys)


def _aval(y: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(y.shape, y.dtype)


def _differentiable(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _cotangent(dy, aval) -> Any:
    """``dy`` made to fit an output: None means zero; integer outputs take float0 zeros."""
    if not jnp.issubdtype(aval.dtype, jnp.inexact):
        return np.zeros(aval.shape, jax.dtypes.float0)
    if dy is None:
        return fill_like(0.0, aval.shape, aval.dtype)
    if getattr(dy, "shape", None) != aval.shape or dy.dtype != aval.dtype:
        dy = fill_like(dy, aval.shape, aval.dtype)
    return dy


class Function(Operator):
    """An Operator given by the pure function ``fn``; ``static`` holds its non-array arguments."""

    fn: Callable = None  # pure: (*arrays, **static) -> array | tuple of arrays

    def __init__(self, name: Optional[str] = None, **static):
        super().__init__(name)
        self.static = static
        self._vjp = None

    def forward(self, *xs):
        static = _freeze(self.static)
        fn = type(self).fn
        try:
            if is_training() and self.requires_grad:
                diff = tuple(_differentiable(x) for x in xs)
                ys, self._vjp = _forward_vjp(fn, static, diff, *xs)
                self._diff = diff
                self._out = (tuple(map(_aval, ys)) if isinstance(ys, tuple) else _aval(ys))
            else:
                ys = _forward(fn, static, *xs)
        except (TypeError, ValueError) as e:
            raise _op_error(type(self).__name__, xs, self.static, e) from None
        return ys

    def backward(self, *dys):
        if self._vjp is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward: no forward state; run the forward pass with "
                f"autograd.training = True (and an input that requires grad) before backward")
        if isinstance(self._out, tuple):
            cts = tuple(_cotangent(d, a) for d, a in zip(dys, self._out))
        else:
            cts = _cotangent(dys[0], self._out)
        grads = iter(_pullback(self._vjp, cts))
        self._vjp = None
        return tuple(next(grads) if d else None for d in self._diff)

    def release(self) -> None:
        super().release()
        self._vjp = None


def _op_error(op: str, xs, static: Dict, e: Exception) -> Exception:
    shapes = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in xs)
    extra = f" with {static}" if static else ""
    cls = TypeError if isinstance(e, TypeError) and "dtype" in str(e) else ValueError
    return cls(f"{op}: cannot apply to inputs [{shapes}]{extra}: {e}")


def make_function(name: str, fn: Callable, doc: str = "") -> type:
    """A Function subclass called ``name`` computing ``fn`` (used by the op tables)."""
    return type(name, (Function,), {"fn": staticmethod(fn), "__doc__": doc or fn.__doc__,
                                    "__module__": "singa_jax.autograd"})
