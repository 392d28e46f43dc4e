"""Tiered compilation of graph mode's step: the first call runs a quickly compiled program while
the optimised one compiles on a background thread.

A cold first training step is mostly XLA compiling the step's program (ResNet-18 at batch 2 on
a 2-core CPU: 7-10 s of its 9-14 s). The same lowered program compiled with the backend's
cheap options (:func:`.xla_options.quick_options`: on CPU XLA's backend optimisation level 0,
no expensive LLVM passes and no library fusions) compiles in about half the time on CPU and
runs 2-2.5x slower there. Only on CPU: on an NVIDIA H200, SINGA's ResNet-50 step (batch 64)
compiled without autotuning took as long as with it (the first call 10.88 s tiered, 10.78 s
not) and ran far slower, so GPU/TPU steps are never tiered. With tiers, graph mode compiles that quick
program, runs the first call with it, and hands the optimised compilation to a background
thread; the first call after the optimised program is ready runs it instead. Both are ONE
lowered module -- the same inputs, donation, outputs and state -- compiled with different
options, so they compute the same values up to rounding (tested; on CPU the quick program is
the closer of the two to a float64 evaluation: it sums without YNNPACK's reductions).

Where the background compile and the quick steps share a CPU's few cores
(:func:`.xla_options.quick_steps_while_compiling`) they slow each other down badly (2 cores:
7 quick ResNet-18 steps ran while the optimised compile took 18 s instead of 7), so there the
optimised compile starts once the first call's quick run has finished and the SECOND call
waits for it: the first call comes sooner, the N-th later by about the quick compile's time.
On a CPU with cores to spare the compile starts at once and the quick program serves every
call until it is ready.

Modes (:class:`tiered_compilation` for a block or a decorated function, this thread;
``SINGA_JAX_TIERED_COMPILE`` = 0 / 1 / auto / always for the process):

* ``"auto"`` (the default): tiers where the quick program can serve calls while the optimised
  one compiles, for a program where they pay (below);
* ``True``: also where the two compete (a CPU of few cores: the first step first);
* ``False``: never -- the first call waits for the optimised program, as before;
* ``"always"``: every step that can be, whatever it saves or the cache holds (a test; under
  ``jax_disable_most_optimizations`` the optimised tier then takes the options it would get
  without that flag, so that two different programs are compiled).

A step is compiled in tiers (:func:`plan`) only when it pays and is safe:

* it is a step about to run (not one compiled ahead: ``Model.compile_step`` promises a first
  call at steady speed), kept for later calls (not a one-off program, already compiled
  quickly), and not DistOpt's SPMD step;
* the quick options differ from the step's own (under ``jax_disable_most_optimizations`` they
  are the same: the test suite's programs are compiled quickly anyway);
* the quick tier is expected to take :data:`MIN_SECONDS_SAVED` off the first call
  (:func:`.xla_options.quick_tier_saving` of :func:`program_size`: compile time saved per
  operation, less the quick program's slower run per byte its operations output; on CPU a
  large step whose run dominates, ResNet-50 at batch 8, gains nothing);
* the optimised program is not already in the persistent compilation cache: a warm run loads
  it and should not pay a quick compile. JAX does not say what its cache holds without
  compiling, so this module keeps its own record next to the cache (:func:`_marker_path`): a
  file named by a hash of the lowered module, the options, the platform, the devices, the
  versions and ``XLA_FLAGS``, written when an optimised step program compiled (and was handed
  to JAX's cache). A record without the cache entry (JAX's files deleted alone) only means
  one compilation without tiers, as before. The quick program itself is not cached.

A process that exits while an optimised program is still compiling waits for it (an XLA
compile cannot be stopped, and a thread still running at exit makes JAX's teardown crash;
see :mod:`._shutdown`); the program is then in the persistent cache for the next run.
Compilations queued behind it are dropped.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import os
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import jax
import jax.extend.core as jex_core

from singa_jax._src.backend import xla_options
from singa_jax._src.base.env import switched_off
from singa_jax._src.base.modes import ScopedFlag, is_reproducible

__all__ = ["tiered_compilation", "tiers_mode", "plan", "Pending", "MIN_SECONDS_SAVED", "ENV",
           "program_size"]

ENV = "SINGA_JAX_TIERED_COMPILE"

# A step is compiled in tiers only when the quick tier is expected to take at least this many
# seconds off its first call (xla_options.quick_tier_saving: the compile time saved, from the
# number of operations of its traced program, less the quick program's slower run, from the
# bytes they output). The MLP's step (136 operations) gains ~0.1 s; LeNet's at batch 64 (604)
# ~0.5 by the estimate, 2 s measured; ResNet-18's at batch 2 ~2.3, ResNet-50's at batch 8 none
# (its quick program runs 7 s longer, the compile is 6.6 s shorter).
MIN_SECONDS_SAVED = 0.5

Mode = Union[bool, str]
_MODE: contextvars.ContextVar[Optional[Mode]] = contextvars.ContextVar(
    "singa_jax.tiered_compilation", default=None)


MODES = (False, "auto", True, "always")


class tiered_compilation(ScopedFlag):
    """Whether graph mode compiles a step in two tiers (see :mod:`singa_jax._src.backend.tiers`)
    inside the block or the decorated function (this thread only): ``"auto"`` (the default:
    where the quick program can serve calls while the optimised one compiles), ``True`` (also
    where the two compete for a CPU's few cores: a faster first call, a later N-th), ``False``
    (never: the first call waits for the optimised program) or ``"always"`` (every step that
    can be, whatever its size or the cache holds: a test)."""

    var = _MODE

    def __init__(self, mode: Mode = True):
        if not any(mode is m or (isinstance(m, str) and mode == m) for m in MODES):
            raise ValueError(f"tiered_compilation: mode must be one of {MODES}, got {mode!r}")
        super().__init__()
        self.mode = mode


def tiers_mode() -> Mode:
    """The mode in force: the innermost :class:`tiered_compilation` block's, else
    ``SINGA_JAX_TIERED_COMPILE``'s (0/false/off/no: False; 1/true/on/yes: True; always;
    anything else, or unset: "auto")."""
    mode = _MODE.get()
    if mode is not None:
        return mode
    setting = os.environ.get(ENV, "auto").strip().lower()
    if switched_off(setting):
        return False
    if setting in ("1", "true", "on", "yes"):
        return True
    return "always" if setting == "always" else "auto"


# --- the background compiler -------------------------------------------------------------------
_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()
_queued: "set[Future]" = set()


def _background() -> ThreadPoolExecutor:
    """One worker thread for every runner: compilations share the cores anyway. Its thread is
    joined at exit (see the module docstring); compilations not yet started are dropped."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1,
                                           thread_name_prefix="singa_jax-compile")
            register = getattr(threading, "_register_atexit", None)
            if register is not None:  # runs before the worker is joined
                register(_drop_queued)
        return _executor


def _drop_queued() -> None:
    for future in list(_queued):
        future.cancel()


class Pending:
    """The optimised program of a step compiled in tiers, compiling in the background, and when
    a call takes it.

    ``wait`` (the quick program and the compiler share a CPU's few cores): the compilation
    starts once the quick program's first run has finished (:meth:`start` with one of its
    outputs), so that the first call does not compete with it, and every later call waits for
    it. Otherwise it starts at once, and each call takes it once it is ready."""

    def __init__(self, lowered: Any, options: Dict[str, Any], where: str, wait: bool,
                 marker: Optional[str]):
        self.options = options
        self.where = where
        self.wait = wait
        self.seconds = 0.0  # how long the background compilation took
        self._marker = marker
        self._lowered: Optional[Any] = lowered
        self.future: Optional[Future] = None
        if not wait:
            self.start()

    @property
    def started(self) -> bool:
        return self.future is not None

    def start(self, after: Sequence[Any] = ()) -> None:
        """Hand the compilation to the background thread, which first waits until the arrays
        of ``after`` (outputs of the quick program's first run) are computed. The thread keeps
        no reference to them once they are (a state array still referenced there would be
        copied before the next call donates it)."""
        lowered, self._lowered = self._lowered, None
        holder = list(after[:1])
        try:
            self.future = _background().submit(self._compile, lowered, holder)
        except RuntimeError:  # the interpreter is exiting: no new threads; compile it here
            self.future = Future()
            try:
                self.future.set_result(self._compile(lowered, []))
            except Exception as e:  # noqa: BLE001 -- reported where the program is taken
                self.future.set_exception(e)
            return
        _queued.add(self.future)
        self.future.add_done_callback(_queued.discard)

    def _compile(self, lowered: Any, after: List[Any]) -> Any:
        while after:
            try:
                after.pop().block_until_ready()
            except Exception:  # noqa: BLE001 -- failed or deleted: that run is over anyway
                pass
        start = time.perf_counter()
        compiled = lowered.compile(self.options or None)
        self.seconds = time.perf_counter() - start
        _write_marker(self._marker)
        return compiled

    def ready(self) -> bool:
        """Whether the compilation has ended (compiled, failed or dropped)."""
        return self.future is not None and self.future.done()

    def result(self) -> Optional[Any]:
        """The optimised program, waiting for it (starting it first if it has not started);
        None when its compilation failed (warned: the quick program, which computes the same,
        keeps serving the step)."""
        if self.future is None:
            self.start()
        try:
            return self.future.result()
        except Exception as e:  # noqa: BLE001 -- any failure (or a dropped compile): keep quick
            first = str(e).splitlines()[0] if str(e) else ""
            warnings.warn(f"graph mode: the optimised compilation of {self.where} failed "
                          f"({type(e).__name__}: {first}); its quickly compiled program keeps "
                          f"serving it", RuntimeWarning, stacklevel=4)
            return None

    def cancel(self) -> None:
        """Drop the compilation if it has not started (its program is no longer needed)."""
        if self.future is None:
            self._lowered = None
            self.future = Future()
        self.future.cancel()


# --- when to compile in tiers -----------------------------------------------------------------
class Plan:
    """How a step program is compiled: ``quick`` (its quick tier's options, None: compiled
    once, with ``optimised``), ``optimised`` (the program that serves it from then on), whether
    calls after the first wait for the optimised program, and the record of its compilation
    into the persistent cache (written by :meth:`compiled` or by the background compile)."""

    def __init__(self, quick: Optional[Dict[str, Any]], optimised: Dict[str, Any], wait: bool,
                 marker: Optional[str]):
        self.quick = quick
        self.optimised = optimised
        self.wait = wait
        self.marker = marker

    def compile_quick(self, lowered: Any) -> Any:
        """The quick program, compiled now. It is not written to the persistent cache (no
        later run loads it: a run that finds the optimised one recorded loads that), which
        saves serialising and writing it on the way to the first call."""
        with _not_cached():
            return lowered.compile(self.quick or None)

    def start(self, lowered: Any, where: str) -> Pending:
        """Compile the optimised program in the background."""
        return Pending(lowered, self.optimised, where, self.wait, self.marker)

    def compiled(self) -> None:
        """The optimised program was compiled in the foreground: record it (a later run then
        loads it rather than compiling in tiers)."""
        _write_marker(self.marker)


def plan(lowered: Any, closed: Any, platform: str, options: Dict[str, Any],
         ahead: bool = False) -> Optional[Plan]:
    """How to compile the step ``lowered`` (traced as ``closed``; its options ``options`` on
    ``platform``): in tiers when it pays (see the module docstring; never when ``ahead``, a
    program compiled before its first call), else once; None for a program too small to
    matter (compiled once, nothing recorded). The caller leaves out one-off programs and SPMD
    steps."""
    mode = False if ahead or is_reproducible() else tiers_mode()  # (one program per step)
    always = mode == "always"
    if not always and xla_options.quick_tier_saving(
            platform, *program_size(closed.jaxpr)) < MIN_SECONDS_SAVED:
        return None
    optimised = options
    if always and xla_options.compile_time_first():
        optimised = xla_options.compile_options(platform, program=lowered,
                                                for_compile_time=False)
    wait = not xla_options.quick_steps_while_compiling(platform)
    quick = None
    if mode and not (mode == "auto" and wait):
        quick = xla_options.quick_options(platform, optimised)
    marker = _marker_path(lowered, platform, optimised)
    if quick is not None and not always and marker is not None and os.path.exists(marker):
        quick = None  # the optimised program is in the persistent cache: load it
    return Plan(quick, optimised, wait, marker)


def _not_cached() -> Any:
    """A block whose compilations (in this thread) JAX does not write to its persistent cache:
    JAX's minimum compile time for an entry, raised past any (a thread-local setting); a JAX
    without it: an empty block."""
    try:
        from jax._src import config as jax_config
        return jax_config.persistent_cache_min_compile_time_secs(float("inf"))
    except (ImportError, AttributeError, TypeError):
        return contextlib.nullcontext()


def program_size(jaxpr: Any) -> Tuple[int, int]:
    """``(operations, output bytes)`` of ``jaxpr``: its equations and the bytes of their
    outputs, those of nested programs (a jitted kernel's, a cond's branches) counted instead
    of the equation that calls them."""
    operations = output_bytes = 0
    for eqn in jaxpr.eqns:
        nested = [sub.jaxpr if isinstance(sub, jex_core.ClosedJaxpr) else sub
                  for value in eqn.params.values()
                  for sub in (value if isinstance(value, (tuple, list)) else (value,))
                  if isinstance(sub, (jex_core.ClosedJaxpr, jex_core.Jaxpr))]
        if nested:
            for sub in nested:
                ops, size = program_size(sub)
                operations, output_bytes = operations + ops, output_bytes + size
            continue
        operations += 1
        for var in eqn.outvars:
            aval = var.aval  # (a PRNG key's dtype is JAX's own: it has an itemsize too)
            shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
            if shape is not None:
                output_bytes += math.prod(shape) * getattr(dtype, "itemsize", 0)
    return operations, output_bytes


# --- what the persistent cache holds ----------------------------------------------------------
def _marker_path(lowered: Any, platform: str, options: Dict[str, Any]) -> Optional[str]:
    """The record that the optimised program of ``lowered`` was compiled into the persistent
    cache (see the module docstring), or None when no persistent cache is in use."""
    folder = _records_folder()
    if folder is None:
        return None
    digest = hashlib.sha256()
    devices = jax.devices(platform)
    for part in (jax.__version__, _JAXLIB_VERSION, platform,
                 devices[0].device_kind, str(len(devices)), os.environ.get("XLA_FLAGS", ""),
                 repr(sorted(options.items())), lowered.as_text()):
        digest.update(part.encode())
        digest.update(b"\0")
    return os.path.join(folder, digest.hexdigest())


def _records_folder() -> Optional[str]:
    """Where the records of compiled step programs go: next to JAX's persistent compilation
    cache (in its folder), None when no persistent cache is in use."""
    folder = getattr(jax.config, "jax_compilation_cache_dir", None)
    if not folder or not getattr(jax.config, "jax_enable_compilation_cache", True):
        return None
    return os.path.join(folder, "singa_jax_tiers")


try:
    import jaxlib
    _JAXLIB_VERSION = str(jaxlib.__version__)
except (ImportError, AttributeError):
    _JAXLIB_VERSION = ""


def _write_marker(path: Optional[str]) -> None:
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w"):
            pass
    except OSError:  # a read-only cache: the next run compiles in tiers again
        pass
