"""Anomaly detection: the first operator, forward or backward, whose output is not finite.

Inside :class:`detect_anomaly` every operator runs at once, op by op (eager replay and fused
backward walks are off on the thread), and each operator's outputs -- and in a backward pass
each operator's input gradients -- are checked for NaN and infinity as they are made. The first
non-finite one raises :class:`AnomalyError` naming the operator, the Layer it was called in, the
numbers of NaN and inf values, and the chain of operators that led to it. A backward pass is
checked whole before it hands out its first gradient, so no optimizer update starts; a Model
call (compiled or not) runs eagerly and, as every Model call, puts back each parameter, buffer
and optimizer state when it raises.

Checking reads a flag from the device after every operator: a run inside the scope is slow.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.base import observe
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.base.modes import eager_replay, fused_backward
from singa_jax._src.base.node import Dummy
from singa_jax._src.eager import replay
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["AnomalyError", "detect_anomaly", "is_anomaly_enabled"]

F = TypeVar("F", bound=Callable[..., Any])
_CHAIN = 8  # operators of the chain shown


class AnomalyError(FloatingPointError):
    """An operator's forward output or backward gradient holds NaN or infinity (raised inside
    :class:`detect_anomaly`); ``op`` is the operator, ``layer`` the Layer path it ran in,
    ``phase`` ``"forward"`` or ``"backward"``."""

    def __init__(self, message: str, op: Any = None, layer: str = "", phase: str = ""):
        super().__init__(message)
        self.op, self.layer, self.phase = op, layer, phase


_local = threading.local()


def is_anomaly_enabled() -> bool:
    """Whether this thread runs inside :class:`detect_anomaly`."""
    return getattr(_local, "depth", 0) > 0


def _bad(a: Any) -> Optional[Tuple[int, int]]:
    """``(NaN count, inf count)`` of an inexact array holding any, else None."""
    if a is None or isinstance(a, (float, int)) or isinstance(a, jax.core.Tracer):
        return None
    dtype = getattr(a, "dtype", None)
    if dtype is None or not is_inexact(dtype):
        return None
    if bool(jnp.all(jnp.isfinite(a))):
        return None
    host = np.asarray(a)
    return int(np.isnan(host).sum()), int(np.isinf(host).sum())


def _describe(a: Any, counts: Tuple[int, int]) -> str:
    return (f"shape {tuple(a.shape)} {jnp.dtype(a.dtype).name}: {counts[0]} NaN, {counts[1]} "
            f"inf of {int(np.prod(a.shape))} values")


def _chain(op: Any) -> str:
    """The operators that led to ``op``, oldest first, following each one's first input made
    by an operator."""
    ops = [op]
    seen = {id(op)}
    while len(ops) <= _CHAIN:
        nxt = next((src for src, _, _, _ in getattr(ops[-1], "src", ())
                    if not isinstance(src, Dummy) and id(src) not in seen), None)
        if nxt is None:
            break
        seen.add(id(nxt))
        ops.append(nxt)
    names = [f"{observe.op_label(o)} ({o.name})" for o in reversed(ops)]
    more = "... -> " if len(ops) > _CHAIN else "input -> "
    return more + " -> ".join(names)


def _where(op: Any) -> str:
    path = getattr(op, "layer_path", "")
    return f"in layer {path!r}" if path else "outside any named Layer"


class _Detector(observe.Observer):
    whole_walks = True
    eager_steps = True

    def op(self, op: Any, xs: Tuple[Any, ...], call: Any) -> Any:
        ys = call()
        if not is_anomaly_enabled():
            return ys
        for i, y in enumerate(ys):
            a = y._data if isinstance(y, Tensor) else y
            counts = _bad(a)
            if counts is None:
                continue
            inputs = [j for j, x in enumerate(xs) if isinstance(x, Tensor) and
                      _bad(x._data) is not None]
            why = (f"its input(s) {inputs} already held non-finite values (made outside any "
                   f"checked operator: the data fed in, or a parameter)" if inputs else
                   "every input was finite")
            raise AnomalyError(
                f"detect_anomaly: the forward of {type(op).__name__} {op.name!r} "
                f"{_where(op)} made a non-finite output {i} ({_describe(a, counts)}); {why}. "
                f"Operators that led there: {_chain(op)}", op, getattr(op, "layer_path", ""),
                "forward")
        return ys

    def backward(self, op: Any, call: Any) -> Any:
        dxs = call()
        if not is_anomaly_enabled():
            return dxs
        for i, dx in enumerate(dxs):
            counts = _bad(dx)
            if counts is None:
                continue
            raise AnomalyError(
                f"detect_anomaly: the backward of {type(op).__name__} {op.name!r} "
                f"{_where(op)} returned a non-finite gradient for its input {i} "
                f"({_describe(dx, counts)}); the forward's operators that led to it: "
                f"{_chain(op)}", op, getattr(op, "layer_path", ""), "backward")
        return dxs


_DETECTOR = _Detector()
_attach_lock = threading.Lock()
_threads = [0]  # threads inside a detect_anomaly block


class detect_anomaly:
    """Check every operator's outputs and gradients for NaN and inf inside the block (or each
    call of a decorated function), on this thread; the first non-finite one raises
    :class:`AnomalyError` (see the module docstring). PyTorch's
    ``torch.autograd.detect_anomaly``, for singa_jax's operators, Layers and Models."""

    def __init__(self, check_nan: bool = True):
        self.check_nan = bool(check_nan)
        self._scopes: List[Tuple[Any, Any]] = []

    def __enter__(self) -> "detect_anomaly":
        if not self.check_nan:
            self._scopes.append((None, None))
            return self
        replay.flush()
        scopes = (eager_replay(False), fused_backward(False))
        for scope in scopes:
            scope.__enter__()
        _local.depth = getattr(_local, "depth", 0) + 1
        with _attach_lock:
            _threads[0] += 1
            observe.attach(_DETECTOR)
        self._scopes.append(scopes)
        return self

    def __exit__(self, *exc: Any) -> None:
        scopes = self._scopes.pop()
        if scopes[0] is None:
            return
        _local.depth -= 1
        with _attach_lock:
            _threads[0] -= 1
            if _threads[0] == 0:
                observe.detach(_DETECTOR)
        for scope in reversed(scopes):
            scope.__exit__(None, None, None)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)
        return checked  # type: ignore[return-value]
