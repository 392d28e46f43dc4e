"""Every XLA compilation a run causes, counted by kind, and -- with the switch on -- each one
explained: what was compiled, why, from which line of the user's program and in which Layer.

JAX reports every backend compilation to its monitoring listeners with the compiled function's
name; singa_jax names its programs (``graph_step``, ``eager_replay_segment``,
``fused_backward_walk``), so a compilation's kind is known from its name, and an eager kernel is
any other. The engine says why a graph step or a replay program compiles just before it does
(:func:`~singa_jax._src.base.observe.compile_cause`); an eager kernel compiles because it meets
input shapes, dtypes or static arguments it has not been compiled for.

Counting is always on (a listener called only when something compiles). A loop that compiles
on every one of its last :data:`STEPS_BEFORE_WARNING` Model calls is warned about once
(:class:`RecompilationWarning`) without any switch. The switch -- ``SINGA_JAX_EXPLAIN_COMPILES=1``
or :class:`explain_compiles` -- logs each compilation (logger ``singa_jax.compiles``, at WARNING
so that it shows without logging set up) and each eager replay segment a host read ended early
(the step then cannot run as one replayed program).
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import warnings
from typing import Any, Deque, Dict, List, Tuple

import jax

from singa_jax._src.base import observe, process_state
from singa_jax._src.base.env import switched_off
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["RecompilationWarning", "explain_compiles", "explaining", "compile_log",
           "compile_counts", "reset", "STEPS_BEFORE_WARNING", "LOGGER"]

LOGGER = logging.getLogger("singa_jax.compiles")
STEPS_BEFORE_WARNING = 10
_KINDS = (("graph_step", "graph step"), ("eager_replay_segment", "eager replay"),
          ("fused_backward_walk", "fused backward"))
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_LOG_KEPT = 1000


class RecompilationWarning(RuntimeWarning):
    """A training loop compiles on every step (usually: its input shapes keep changing)."""


def plain_name(fun_name: str) -> str:
    """A compiled function's name without JAX's ``jit(...)`` around it."""
    while fun_name.endswith(")") and "(" in fun_name and fun_name.split("(", 1)[0] in (
            "jit", "pjit"):
        fun_name = fun_name.split("(", 1)[1][:-1]
    return fun_name


def kind_of(fun_name: str) -> str:
    fun_name = plain_name(fun_name)
    for prefix, kind in _KINDS:
        if fun_name.startswith(prefix):
            return kind
    return "eager kernel"


class _Compiles:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.counts: Dict[str, List[float]] = {}  # kind -> [compilations, seconds]
        self.log: Deque[Dict[str, Any]] = collections.deque(maxlen=_LOG_KEPT)
        self.seen_names: set = set()
        self.last_step = -1
        self.streak = 0  # consecutive Model calls that compiled (eager)
        self.in_streak = 0  # compilations during the streak
        self.warned = False
        self.reads: Dict[str, int] = {}  # user frame -> segments a host read ended there

    def reset(self) -> None:
        with self.lock:
            self.clear()


_state = _Compiles()


def _on_event(event: str, duration: float, **kwargs: Any) -> None:
    if event != _COMPILE_EVENT:
        return
    name = plain_name(str(kwargs.get("fun_name", "?")))
    kind = kind_of(name)
    with _state.lock:
        entry = _state.counts.setdefault(kind, [0, 0.0])
        entry[0] += 1
        entry[1] += duration
        first = name not in _state.seen_names
        _state.seen_names.add(name)
        if kind == "eager kernel":  # (graph mode tells its own, with the cause; replay and
            _count_streak()         # fused walks compile a sequence once it recurs)
    if _EXPLAINER.on:
        _explain(kind, name, first, duration)


def _count_streak() -> None:
    step = observe.steps
    if step == _state.last_step:
        _state.in_streak += 1
        return
    _state.streak = _state.streak + 1 if step == _state.last_step + 1 else 1
    _state.in_streak = 1 if _state.streak == 1 else _state.in_streak + 1
    _state.last_step = step
    if _state.streak == STEPS_BEFORE_WARNING and not _state.warned:
        _state.warned = True
        where = observe.user_frame()
        warnings.warn(
            f"singa_jax: eager kernels compiled on each of the last {STEPS_BEFORE_WARNING} "
            f"Model calls ({_state.in_streak} compilations), the last from "
            f"{where or 'singa_jax'}: the step keeps meeting new input shapes, dtypes or "
            f"static values (a batch of another size, a Python number that changes). Set "
            f"SINGA_JAX_EXPLAIN_COMPILES=1 (or use singa_jax.debug.explain_compiles()) to see "
            f"each compilation's cause.", RecompilationWarning,
            stacklevel=observe.user_stacklevel())


def _explain(kind: str, name: str, first: bool, seconds: float) -> None:
    said = observe.take_cause(kind) if kind in ("graph step", "eager replay") else None
    layer = observe.layer_path()
    if said is not None:
        what, cause = said
    elif kind == "graph step":  # (no cause said on this thread: tiered compilation's)
        what, cause = "a graph-mode step", "its optimised tier, compiled in the background"
    elif kind == "fused backward":
        what, cause = "a backward walk", "the walk recurred (its plan was seen before)"
    else:
        op, phase = _EXPLAINER.current()
        if op is not None and not layer:  # (a backward runs outside its Layer's call)
            layer = getattr(op, "layer_path", "")
        recorded = observe.running_label()  # (a call eager replay recorded, run at its flush)
        if op is not None:
            what = f"kernel {name!r} of {type(op).__name__}{phase}"
        elif recorded:
            layer, _, op_class = recorded.rpartition("/")
            what = f"kernel {name!r} of {op_class} (recorded by eager replay)"
        else:
            what = f"kernel {name!r}"
        inputs = _EXPLAINER.inputs()
        shapes = f" for inputs {inputs}" if inputs else ""
        cause = ("first call" if first else
                 "new input shapes, dtypes or static arguments") + shapes
    record = {"kind": kind, "what": what, "cause": cause, "seconds": seconds,
              "frame": observe.user_frame(), "layer": layer or None, "step": observe.steps}
    _state.log.append(record)
    at = f"; at {record['frame']}" if record["frame"] else ""
    in_layer = f" in layer {layer}" if layer else ""
    LOGGER.warning("singa_jax compiled (%s) %s%s in %.3f s: %s%s", kind, what, in_layer,
                   seconds, cause, at)


class _Explainer(observe.Observer):
    """Attached while compilations are explained: keeps the Layer path and the running
    operator's inputs known, and reports the host reads that end replay segments early."""

    def __init__(self) -> None:
        self.on = False
        self.depth = 0
        self._local = threading.local()

    def _stack(self) -> List[Tuple[Any, str, Tuple[Any, ...]]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self) -> Tuple[Any, str]:
        """The operator running on this thread (None) and ``""`` or ``" (backward)"``."""
        stack = self._stack()
        return (stack[-1][0], stack[-1][1]) if stack else (None, "")

    def inputs(self) -> str:
        stack = self._stack()
        if not stack or not stack[-1][2]:
            return ""
        return "(" + ", ".join(_aval_text(x) for x in stack[-1][2]) + ")"

    def _running(self, entry: Tuple[Any, str, Tuple[Any, ...]], call: Any) -> Any:
        stack = self._stack()
        stack.append(entry)
        try:
            return call()
        finally:
            stack.pop()

    def op(self, op: Any, xs: Tuple[Any, ...], call: Any) -> Any:
        return self._running((op, "", xs), call)

    def backward(self, op: Any, call: Any) -> Any:
        return self._running((op, " (backward)", ()), call)

    def segment(self, calls: int, reason: str) -> None:
        if reason != "read":
            return
        where = observe.user_frame() or "singa_jax"
        with _state.lock:
            seen = _state.reads.get(where, 0)
            _state.reads[where] = seen + 1
        if seen == 0:
            LOGGER.warning(
                "singa_jax eager replay: a segment of %d kernels ended early at %s: a value was "
                "needed on the host (float(), .to_numpy(), printing, Python control flow on a "
                "value, or an operator that cannot be recorded) before the step ended, so the "
                "step cannot replay as one program", calls, where)


def _aval_text(x: Any) -> str:
    if isinstance(x, Tensor) or hasattr(x, "shape") and hasattr(x, "dtype"):
        dtype = jax.numpy.dtype(x.dtype).name
        return f"{dtype}[{','.join(map(str, x.shape))}]"
    return type(x).__name__


_EXPLAINER = _Explainer()


def explaining() -> bool:
    """Whether compilations are being explained now."""
    return _EXPLAINER.on


class explain_compiles:
    """Log every compilation singa_jax causes with its cause, the user's line and Layer, and
    its time, and every replay segment a host read ends early (see the module docstring).

    ``explain_compiles()`` turns it on for the process at once (``explain_compiles(False)``
    off); as a context manager it is on for the block and restored after. The environment
    variable ``SINGA_JAX_EXPLAIN_COMPILES=1`` turns it on from the start."""

    def __init__(self, enabled: bool = True):
        self._previous = _EXPLAINER.depth > 0
        _set(bool(enabled))

    def __enter__(self) -> "explain_compiles":
        return self

    def __exit__(self, *exc: Any) -> None:
        _set(self._previous)


def _set(enabled: bool) -> None:
    with _state.lock:
        _EXPLAINER.depth = 1 if enabled else 0
        _EXPLAINER.on = enabled
    if enabled:
        observe.attach(_EXPLAINER)
    else:
        observe.detach(_EXPLAINER)


def compile_log() -> List[Dict[str, Any]]:
    """The compilations explained so far (the last 1000), oldest first: dicts with ``kind``,
    ``what``, ``cause``, ``seconds``, ``frame`` (the user's line), ``layer`` and ``step``."""
    with _state.lock:
        return [dict(r) for r in _state.log]


def compile_counts() -> Dict[str, Dict[str, float]]:
    """``{kind: {"count": n, "seconds": s}}`` of every compilation since the start (or
    :func:`reset`)."""
    with _state.lock:
        return {k: {"count": int(n), "seconds": s} for k, (n, s) in _state.counts.items()}


def host_reads() -> Dict[str, int]:
    """``{user's line: replay segments a host read ended there}`` (counted while explaining)."""
    with _state.lock:
        return dict(_state.reads)


@process_state.register
def reset() -> None:
    """Forget the counts, the log and the warning given."""
    _state.reset()


def _listen() -> None:
    try:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
    except AttributeError:  # pragma: no cover -- a JAX without monitoring listeners
        pass


_listen()
_SWITCH = os.environ.get("SINGA_JAX_EXPLAIN_COMPILES", "")
if _SWITCH.strip() and not switched_off(_SWITCH):
    _set(True)
