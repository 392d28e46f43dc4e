"""Scoped modes: training mode, grad mode, fused backward walks, eager replay, graph mode's trace hook and
concrete evaluation inside a trace (``compile_time_eval``).

Each is a :class:`contextvars.ContextVar`, so it belongs to the running thread (and asyncio task)
and a ``with`` block restores it on exit, however the block ends. Nothing here is a process-wide
switch that one thread can flip under another.

Training mode also has SINGA's spelling, the module flag ``autograd.training``. SINGA programs are
single-threaded and set that flag directly (``autograd.training = True``), so writing it sets the
writing thread's mode and the *default*: the mode of every thread that never set one of its own.
``Model.train()``/``Model.eval()`` write it the same way, and a Model's step runs inside
:func:`training_mode` with the model's own flag, so two threads training and evaluating two models
do not see each other's mode.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import types
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, TypeVar

import jax

from singa_jax._src.base.env import flag

__all__ = ["is_training", "set_training", "TrainingFlagModule", "training_mode", "is_grad_enabled",
           "set_grad_enabled", "no_grad", "enable_grad", "is_backward_fused", "fused_backward",
           "is_eager_replay", "eager_replay_flag", "eager_replay", "is_replay_speculating",
           "replay_speculation", "is_reproducible", "reproducible", "autocast_dtype",
           "autocast_mode", "operator_modes",
           "TraceHook", "current_trace_hook", "trace_hook", "traced_keys", "compile_time_eval",
           "in_compile_time_eval", "parameter_initialization", "in_parameter_initialization"]

F = TypeVar("F", bound=Callable[..., Any])

# --- training mode ------------------------------------------------------------------------------
_TRAINING: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar(
    "singa_jax.training", default=None)
_training_default = False  # what a thread that never set its own mode reads (SINGA's flag)


def is_training() -> bool:
    """Whether operators keep what backward needs (SINGA's ``autograd.training``)."""
    mode = _TRAINING.get()
    return _training_default if mode is None else mode


def set_training(mode: bool) -> None:
    """SINGA's ``autograd.training = mode``: this thread's mode and the default of the others."""
    global _training_default
    _training_default = bool(mode)
    _TRAINING.set(bool(mode))


class TrainingFlagModule(types.ModuleType):
    """The type of SINGA's ``autograd`` module: its ``training`` attribute is a live view of the
    scoped training mode (reading gives this thread's mode; assigning calls :func:`set_training`),
    so ``autograd.training = True`` works as in SINGA while the mode stays scoped."""

    @property
    def training(self) -> bool:
        return is_training()

    @training.setter
    def training(self, mode: bool) -> None:
        set_training(mode)


@contextlib.contextmanager
def training_mode(mode: bool) -> Iterator[None]:
    """Run the block in training mode ``mode`` (this thread only); restored on exit."""
    token = _TRAINING.set(bool(mode))
    try:
        yield
    finally:
        _TRAINING.reset(token)


# --- grad mode ----------------------------------------------------------------------------------
_GRAD_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.grad_enabled", default=True)


def is_grad_enabled() -> bool:
    """Whether operators record the autograd graph (PyTorch's grad mode; on by default)."""
    return _GRAD_ENABLED.get()


class ScopedFlag:
    """The flag ``var`` set to ``mode`` for the duration of a ``with`` block or of each call of
    a decorated function (this thread only)."""

    var: contextvars.ContextVar  # the flag: set by each subclass
    mode = True

    def __init__(self, mode: Optional[bool] = None):
        if mode is not None:
            self.mode = bool(mode)
        self._tokens: list = []

    def __enter__(self) -> None:
        self._tokens.append(self.var.set(self.mode))

    def __exit__(self, *exc: Any) -> None:
        self.var.reset(self._tokens.pop())

    def __call__(self, fn: F) -> F:
        var, mode = self.var, self.mode

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            token = var.set(mode)
            try:
                return fn(*args, **kwargs)
            finally:
                var.reset(token)
        return wrapped  # type: ignore[return-value]


class _GradMode(ScopedFlag):
    """Grad mode ``mode`` for the duration of a ``with`` block or of each call of a decorated
    function."""

    var = _GRAD_ENABLED


class no_grad(_GradMode):
    """Record no autograd graph inside the block (or the decorated function)."""

    mode = False


class enable_grad(_GradMode):
    """Record the autograd graph inside the block, even within :class:`no_grad`."""

    mode = True


class set_grad_enabled(_GradMode):
    """Grad mode ``mode`` for this thread, as in PyTorch: a plain call sets it at once; as a
    context manager the previous mode comes back on exit; as a decorator it holds per call."""

    def __init__(self, mode: bool):
        super().__init__(mode)
        self._previous = _GRAD_ENABLED.set(self.mode)

    def __enter__(self) -> None:
        pass  # already in effect since construction

    def __exit__(self, *exc: Any) -> None:
        _GRAD_ENABLED.reset(self._previous)


# --- fused backward walks --------------------------------------------------------------------
_FUSED_BACKWARD: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.fused_backward", default=True)


def is_backward_fused() -> bool:
    """Whether a recurring backward walk runs as one kernel (see ``autograd.fused_backward``)."""
    return _FUSED_BACKWARD.get()


class fused_backward(ScopedFlag):
    """Whether a recurring backward walk runs as one kernel (default True) inside the block or
    the decorated function (this thread only). ``fused_backward(False)`` walks op by op, one
    pullback kernel per operator: the same gradients up to rounding."""

    var = _FUSED_BACKWARD

    def __init__(self, enabled: bool = True):
        super().__init__(enabled)


# --- eager replay ------------------------------------------------------------------------------
_EAGER_REPLAY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.eager_replay", default=True)


def is_eager_replay() -> bool:
    """Whether recurring eager operator sequences replay as one program (``autograd.eager_replay``)."""
    return _EAGER_REPLAY.get()


eager_replay_flag = _EAGER_REPLAY.get  # is_eager_replay without a frame (every operator reads it)


class eager_replay(ScopedFlag):
    """Whether a recurring sequence of eager operators runs as one compiled program (default
    True) inside the block or the decorated function (this thread only); ``eager_replay(False)``
    runs every operator at once, one kernel each (see :mod:`singa_jax.autograd.replay`).
    ``SINGA_JAX_EAGER_REPLAY=0`` turns it off for the process."""

    var = _EAGER_REPLAY

    def __init__(self, enabled: bool = True):
        super().__init__(enabled)


_REPLAY_SPECULATION: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.replay_speculation",
    default=flag("SINGA_JAX_REPLAY_SPECULATE"))


def is_replay_speculating() -> bool:
    """Whether a recurring segment's program may start before its recording ends
    (``autograd.replay_speculation``)."""
    return _REPLAY_SPECULATION.get()


class replay_speculation(ScopedFlag):
    """Whether eager replay starts a recurring segment's program before the segment's recording
    ends, where its remaining inputs can be predicted (default True), inside the block or the
    decorated function (this thread only). ``SINGA_JAX_REPLAY_SPECULATE=0`` turns it off for
    the process."""

    var = _REPLAY_SPECULATION

    def __init__(self, enabled: bool = True):
        super().__init__(enabled)


# --- reproducible steps ------------------------------------------------------------------------
_REPRODUCIBLE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.reproducible",
    default=os.environ.get("SINGA_JAX_REPRODUCIBLE", "").strip().lower() in ("1", "true", "on",
                                                                              "yes"))


def is_reproducible() -> bool:
    """Whether a step computes the same bits whatever ran before it
    (``autograd.reproducible``)."""
    return _REPRODUCIBLE.get()


class reproducible(ScopedFlag):
    """Inside the block or the decorated function (this thread only), a training step computes
    the same bits whatever ran before it in the process, so that a run resumed from a
    checkpoint continues exactly as the uninterrupted run would (default False;
    ``SINGA_JAX_REPRODUCIBLE=1`` for the process). Why it is needed: eager mode runs a sequence
    op by op the first time it sees it and as one compiled program when it recurs, and graph
    mode on a CPU may run a step's first calls with a quickly compiled program; the programs
    agree only up to rounding, so a resumed process, whose first step is new to it, would drift
    from the uninterrupted run in the last bits. Here every eager sequence (a replay segment, a
    fused backward walk) is compiled at its first occurrence and graph mode compiles its step
    once, without tiers. Costs: a compilation for sequences that run only once (an evaluation
    forward run a single time, the first step), nothing per step after that."""

    var = _REPRODUCIBLE

    def __init__(self, enabled: bool = True):
        super().__init__(enabled)


# --- autocast ----------------------------------------------------------------------------------
_AUTOCAST: contextvars.ContextVar[Optional[Any]] = contextvars.ContextVar(
    "singa_jax.autocast", default=None)


def autocast_dtype() -> Optional[Any]:
    """The compute dtype of the autocast block in force (a NumPy dtype: bfloat16 or float16), or
    None outside one (see ``singa_jax._src.autodiff.autocast``)."""
    return _AUTOCAST.get()


class autocast_mode(ScopedFlag):
    """The autocast compute dtype ``dtype`` (None: no autocast) inside the block or the decorated
    function (this thread only). ``autograd.autocast`` is the public, validating spelling."""

    var = _AUTOCAST

    def __init__(self, dtype: Optional[Any]):
        super().__init__()
        self.mode = dtype


def operator_modes() -> Tuple[bool, bool, Optional[Any]]:
    """``(is_grad_enabled(), is_training(), autocast_dtype())`` in one call: the modes an
    eager operator's recording depends on (read per operator)."""
    training = _TRAINING.get()
    return (_GRAD_ENABLED.get(), _training_default if training is None else training,
            _AUTOCAST.get())


# --- concrete evaluation inside a trace -------------------------------------------------------
_COMPILE_TIME_EVAL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.compile_time_eval", default=False)
in_compile_time_eval = _COMPILE_TIME_EVAL.get  # whether this thread is in compile_time_eval()


@contextlib.contextmanager
def compile_time_eval() -> Iterator[None]:
    """``jax.ensure_compile_time_eval()``, known to singa_jax: ops on concrete values compute
    inside the block even under a trace (``Model.compile()`` initialises layers so), so code that
    fills new arrays may fill them on the host as it does outside any trace."""
    token = _COMPILE_TIME_EVAL.set(True)
    try:
        with jax.ensure_compile_time_eval():
            yield
    finally:
        _COMPILE_TIME_EVAL.reset(token)


# --- a layer's parameter initialisation -------------------------------------------------------
_PARAMETER_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.parameter_initialization", default=False)
# whether this thread is in parameter_initialization()
in_parameter_initialization = _PARAMETER_INIT.get


@contextlib.contextmanager
def parameter_initialization() -> Iterator[None]:
    """A layer's ``initialize`` (eager first call and ``Model.compile()`` alike): device keys are
    split and random fills drawn on the host (the samplers), so initialising
    parameters compiles and dispatches no XLA program and gives the same values on every
    backend."""
    token = _PARAMETER_INIT.set(True)
    try:
        yield
    finally:
        _PARAMETER_INIT.reset(token)


# --- graph mode's trace hook --------------------------------------------------------------------
class TraceHook:
    """Observer that graph mode installs while it traces a step (see graph mode's runner).

    It learns which pre-existing Tensors a step reads and rebinds, and which Tensors it creates,
    so that every piece of state enters and leaves the compiled program as data.
    """

    def read(self, t: Any) -> None: ...

    def write(self, t: Any) -> None: ...

    def created(self, t: Any) -> None: ...


_TRACE_HOOK: contextvars.ContextVar[Optional[TraceHook]] = contextvars.ContextVar(
    "singa_jax.trace_hook", default=None)
current_trace_hook = _TRACE_HOOK.get  # the hook of this thread's trace, or None


@contextlib.contextmanager
def trace_hook(hook: Optional[TraceHook]) -> Iterator[None]:
    """Install ``hook`` on ``Tensor`` for this thread while the block runs (None: no hook)."""
    token = _TRACE_HOOK.set(hook)
    try:
        yield
    finally:
        _TRACE_HOOK.reset(token)


# --- graph mode's traced PRNG keys ----------------------------------------------------------------
# While a thread traces a step, graph mode sets each Device's ``key`` to a tracer. The Device
# keeps that tracer here, per thread, as ``{device: (tracer, concrete key the trace started
# from)}``, so no other thread can ever read a tracer as a Device's key.
_TRACED_KEYS: contextvars.ContextVar[Optional[Dict[Any, Tuple[Any, Any]]]] = \
    contextvars.ContextVar("singa_jax.traced_keys", default=None)


def traced_keys(create: bool = False) -> Optional[Dict[Any, Tuple[Any, Any]]]:
    """This thread's traced device keys (None when it never traced; with ``create``, a new
    empty dict is installed for it)."""
    keys = _TRACED_KEYS.get()
    if keys is None and create:
        keys = {}
        _TRACED_KEYS.set(keys)
    return keys
