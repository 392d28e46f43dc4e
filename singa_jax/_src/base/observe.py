"""Where the engine tells observers what runs: operators, Layer calls, backward steps, updates,
Model steps, compiled programs and eager replay's segment ends.

The tools of :mod:`singa_jax._src.debug` (time profiling, named scopes in traces, compile
explanations, anomaly detection) are :class:`Observer` objects attached here. Each place in the
engine reads the module flag :data:`on` first and calls in only when it is set, so a run that
nobody observes pays one attribute read per operator and per Layer call.

Observers are process-wide (a profiler watches every thread); what is per thread is the stack
of Layer calls running (:func:`layer_path`) and whether this thread's trace wants named scopes
(:func:`naming`).
"""
from __future__ import annotations

import contextlib
import sys
import threading
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax

__all__ = ["on", "steps", "Observer", "attach", "detach", "attached", "observers", "op_call",
           "observing", "current_op", "op_label", "layer_call", "in_layer", "scope_of",
           "layer_path", "current_layer", "backward_call", "update_call", "step_call",
           "inside", "whole_walks", "eager_steps", "program_ran", "segment_ended",
           "compile_cause", "take_cause", "labelled", "running_label", "naming", "is_naming",
           "user_frame", "user_stacklevel", "listen", "notify", "provide", "tool"]

on = False  # whether any observer is attached: the engine's places call in only then
steps = 0  # Model calls so far (what "every step" means when a loop keeps compiling)

_observers: Tuple["Observer", ...] = ()  # replaced whole on a change: readers never lock
_lock = threading.RLock()


class Observer:
    """Base of an observer. The wrapping methods get the event and ``call`` (which runs it and
    returns its result) and must return what ``call()`` returns; the notes return nothing. The
    defaults do nothing, so an observer overrides only what it watches."""

    whole_walks = False  # see whole_walks()
    eager_steps = False  # see eager_steps()

    def op(self, op: Any, xs: Tuple[Any, ...], call: Callable[[], Any]) -> Any:
        """An operator's forward on the Tensors ``xs`` (``op._do_forward``)."""
        return call()

    def layer(self, layer: Any, call: Callable[[], Any]) -> Any:
        """A Layer's ``forward`` (the Layer is on the :func:`layer_path` stack meanwhile)."""
        return call()

    def backward(self, op: Any, call: Callable[[], Any]) -> Any:
        """An operator's backward in an op-by-op walk; the result is its input gradients."""
        return call()

    def update(self, optimizer: Any, call: Callable[[], Any]) -> Any:
        """An optimizer's parameter update."""
        return call()

    def step(self, model: Any, name: str, args: Tuple[Any, ...], call: Callable[[], Any]) -> Any:
        """A Model's call of ``train_one_batch`` (``name``) or ``forward`` on ``args``."""
        return call()

    def program(self, kind: str, compiled: Any) -> None:
        """A compiled program ran: ``kind`` ``"graph"`` (a graph-mode step)."""

    def segment(self, calls: int, reason: str) -> None:
        """Eager replay's segment of ``calls`` kernels ends early; ``reason`` ``"read"``: a
        value was needed on the host before its step ended."""


def attach(observer: Observer) -> None:
    """Attach ``observer`` (once; attaching it again is a no-op)."""
    global on, _observers
    with _lock:
        if observer not in _observers:
            _observers = (*_observers, observer)
        on = True


def detach(observer: Observer) -> None:
    """Detach ``observer`` (a no-op when it is not attached)."""
    global on, _observers
    with _lock:
        if observer in _observers:
            _observers = tuple(o for o in _observers if o is not observer)
        on = bool(_observers)


@contextlib.contextmanager
def attached(observer: Observer) -> Iterator[Observer]:
    """``observer`` attached for the block."""
    attach(observer)
    try:
        yield observer
    finally:
        detach(observer)


def observers() -> Tuple["Observer", ...]:
    return _observers


def _chain(method: str, args: Tuple, call: Callable[[], Any]) -> Any:
    for observer in reversed(_observers):
        if getattr(type(observer), method) is not getattr(Observer, method):
            call = partial(getattr(observer, method), *args, call)
    return call()


# --- rare events, always told: listeners are plain functions ------------------------------
_listeners: Dict[str, List[Callable[..., None]]] = {}


def listen(event: str, listener: Callable[..., None]) -> None:
    """Call ``listener(*args)`` whenever :func:`notify` tells ``event``: ``"compiled"``
    (``where, compiled``: graph mode compiled a step), ``"replay_compiled"`` (``kernels,
    device, program, inputs``: eager replay made the program of a recurring sequence, about to
    run on ``inputs``), ``"verbosity"`` (``device``: a Device's time-profiling verbosity
    changed)."""
    _listeners.setdefault(event, []).append(listener)


def notify(event: str, *args: Any) -> None:
    for listener in tuple(_listeners.get(event, ())):
        listener(*args)


_tools: Dict[str, Any] = {}


def provide(name: str, tool: Any) -> None:
    """Make ``tool`` the implementation the engine reaches as :func:`tool` ``(name)`` (the
    observation tools sit above the engine, which cannot import them)."""
    _tools[name] = tool


def tool(name: str) -> Any:
    try:
        return _tools[name]
    except KeyError:
        raise RuntimeError(f"singa_jax: the {name} tool is not loaded (import singa_jax)") \
            from None


class _Local(threading.local):
    def __init__(self) -> None:
        self.layers: List[Tuple[Any, str]] = []  # the Layer calls running: (layer, scope)
        self.in_op: List[Any] = []  # the operators whose observed forward is running
        self.naming = 0  # > 0: this thread's trace wants named scopes
        self.inside: set = set()  # the kinds of observed calls running ("step", "update")
        self.cause: Optional[Tuple[str, str, str]] = None  # see compile_cause
        self.label = ""  # the "layer path/Operator" of a recorded call running (see labelled)


_local = _Local()


def op_call(op: Any, xs: Tuple[Any, ...], call: Callable[[], Any]) -> Any:
    """Run an operator's forward ``call`` on the Tensors ``xs`` through the attached observers.
    An operator whose forward calls back into the door (re-entry) runs unobserved the second
    time."""
    local = _local
    local.in_op.append(op)
    op.layer_path = layer_path()  # (where the op was called: its backward is named by it)
    try:
        if local.naming:
            with jax.named_scope(type(op).__name__):
                return _chain("op", (op, xs), call)
        return _chain("op", (op, xs), call)
    finally:
        local.in_op.pop()


def observing(op: Any) -> bool:
    """Whether ``op``'s forward is already being observed on this thread (a re-entry)."""
    in_op = _local.in_op
    return bool(in_op) and in_op[-1] is op


def in_layer(layer: Any) -> bool:
    """Whether ``layer``'s forward is the innermost Layer call on this thread (a subclass's
    forward calling its base's)."""
    layers = _local.layers
    return bool(layers) and layers[-1][0] is layer


def current_op() -> Any:
    """The operator whose observed forward runs on this thread now, or None."""
    in_op = _local.in_op
    return in_op[-1] if in_op else None


def scope_of(layer: Any) -> Optional[str]:
    """The scope name of ``layer``: the last part of its hierarchical name, its class name when
    it has no name, None for a Model (a model's own scope adds nothing to its layers' paths)."""
    name = layer.__dict__.get("name")
    if name:
        return str(name).rsplit(".", 1)[-1]
    if getattr(layer, "_scope_is_model", False):
        return None
    return type(layer).__name__


def layer_call(layer: Any, call: Callable[[], Any]) -> Any:
    """Run a Layer's forward ``call`` with the Layer on this thread's path (a subclass's forward
    calling its base's runs in one scope)."""
    layers = _local.layers
    scope = scope_of(layer)
    layers.append((layer, scope))
    try:
        if _local.naming and scope is not None:
            with jax.named_scope(scope):
                return _chain("layer", (layer,), call)
        return _chain("layer", (layer,), call)
    finally:
        layers.pop()


def op_label(op: Any) -> str:
    """``layer path/OpClass`` of an operator called while observed (``OpClass`` otherwise)."""
    path = getattr(op, "layer_path", "")
    return f"{path}/{type(op).__name__}" if path else type(op).__name__


def backward_call(op: Any, call: Callable[[], Any]) -> Any:
    """Run an operator's backward ``call`` (op-by-op walks) through the attached observers;
    a trace names it ``backward/<layer path>/<OpClass>``."""
    if _local.naming:
        with jax.named_scope(f"backward/{op_label(op)}"):
            return _chain("backward", (op,), call)
    return _chain("backward", (op,), call)


def inside(kind: str) -> bool:
    """Whether an observed call of ``kind`` (``"step"``, ``"update"``) runs on this thread."""
    return kind in _local.inside


def _once(kind: str, method: str, args: Tuple, call: Callable[[], Any]) -> Any:
    inside_now = _local.inside
    inside_now.add(kind)
    try:
        return _chain(method, args, call)
    finally:
        inside_now.discard(kind)


def update_call(optimizer: Any, call: Callable[[], Any]) -> Any:
    """Run an optimizer's update ``call`` through the attached observers (a trace names it
    ``update``); an update inside it runs unobserved."""
    if _local.naming:
        with jax.named_scope("update"):
            return _once("update", "update", (optimizer,), call)
    return _once("update", "update", (optimizer,), call)


def step_call(model: Any, name: str, args: Tuple[Any, ...], call: Callable[[], Any]) -> Any:
    """Run a Model's call on ``args`` through the attached observers; a Model call inside it
    runs unobserved."""
    return _once("step", "step", (model, name, args), call)


def whole_walks() -> bool:
    """Whether an attached observer wants every backward walk finished before its first
    gradient is handed out (anomaly detection: no update may start before the walk is
    checked)."""
    return any(o.whole_walks for o in _observers)


def eager_steps() -> bool:
    """Whether an attached observer wants graph-mode Model calls run eagerly (anomaly
    detection checks every operator)."""
    return any(o.eager_steps for o in _observers)


def program_ran(kind: str, compiled: Any) -> None:
    for observer in _observers:
        observer.program(kind, compiled)


def segment_ended(calls: int, reason: str) -> None:
    for observer in _observers:
        observer.segment(calls, reason)



def compile_cause(kind: str, what: str, cause: str) -> None:
    """Say why this thread's next compilation of ``kind`` (``"graph step"``, ``"eager
    replay"``) happens: ``what`` is compiled because of ``cause``. Whoever reports
    compilations takes it (:func:`take_cause`)."""
    _local.cause = (kind, what, cause)


def take_cause(kind: str) -> Optional[Tuple[str, str]]:
    """``(what, cause)`` said for this thread's compilation of ``kind``, once; else None."""
    said = _local.cause
    if said is None or said[0] != kind:
        return None
    _local.cause = None
    return said[1], said[2]


@contextlib.contextmanager
def labelled(label: str) -> Iterator[None]:
    """Run the block as the recorded call ``label`` (``"layer path/Operator"``): eager replay
    runs its recorded calls after their operators returned, so an observer that needs to know
    whose kernel runs (a compile explanation) reads it here (:func:`running_label`)."""
    previous, _local.label = _local.label, label
    try:
        yield
    finally:
        _local.label = previous


def running_label() -> str:
    return _local.label


def layer_path() -> str:
    """The Layer calls running on this thread as a path, ``"block1/conv"`` ("" outside)."""
    return "/".join(scope for _, scope in _local.layers if scope is not None)


def current_layer() -> Any:
    """The innermost Layer whose forward is running on this thread, or None."""
    layers = _local.layers
    return layers[-1][0] if layers else None


class naming:
    """Named scopes (the Layer path and operator names) for the traces this thread runs inside
    the block: what graph mode's step and eager replay's programs are traced with."""

    _observer = Observer()  # attached while any thread names: turns the engine's places on
    _threads = 0  # threads inside a naming block

    def __enter__(self) -> None:
        _local.naming += 1
        with _lock:
            naming._threads += 1
            attach(self._observer)

    def __exit__(self, *exc: Any) -> None:
        _local.naming -= 1
        with _lock:
            naming._threads -= 1
            if naming._threads == 0:
                detach(self._observer)


def is_naming() -> bool:
    """Whether this thread's traces get named scopes now."""
    return _local.naming > 0


# the files whose frames are not the user's: singa_jax's own, JAX's, the standard library's
_NOT_USER = ("singa_jax/_src/", "singa_jax\\_src\\", "/jax/", "\\jax\\", "/jaxlib/",
             "/contextlib.py", "/functools.py", "/threading.py", "singa_jax/run.py",
             "/runpy.py")


def _users(filename: str, skip: Sequence[str] = ()) -> bool:
    return not any(part in filename for part in (*_NOT_USER, *skip)) and \
        not filename.startswith("<frozen")


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller point at the user's line
    (the innermost frame that is not singa_jax's or JAX's)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and not _users(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


def user_frame(skip: Sequence[str] = ()) -> Optional[str]:
    """``file:line (function)`` of the innermost frame that is not singa_jax's or JAX's: the
    user's line that led here (None when there is none)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if _users(filename, skip):
            return f"{filename}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return None
