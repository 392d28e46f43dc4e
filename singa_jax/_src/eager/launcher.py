"""Eager replay's launching thread: a speculated program is called from a thread of its own,
so that the device starts on it while the recording thread goes on recording (see
``xla_options.LAUNCHES_IN_THREAD``)."""
from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
from typing import Any, Callable, List, Optional

__all__ = ["launch_in_thread"]

_launcher: Optional[concurrent.futures.ThreadPoolExecutor] = None
_launcher_lock = threading.Lock()


def _forget_launcher() -> None:
    global _launcher, _launcher_lock
    _launcher, _launcher_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):  # a forked child has no launching thread: it makes its own
    os.register_at_fork(after_in_child=_forget_launcher)


def launch_in_thread(program: Callable, inputs: List[Any]) -> concurrent.futures.Future:
    """``program(*inputs)`` called from replay's launching thread (see
    ``xla_options.LAUNCHES_IN_THREAD``): a Future of its outputs, or of None where that thread
    would not run the very executable this one would (another JAX context: e.g. a matmul
    precision scope) or the call failed."""
    global _launcher
    if _launcher is None:
        with _launcher_lock:
            if _launcher is None:
                _launcher = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="singa_jax-replay-launch")
    # The launching thread needs the GIL to start the call (and to return from it), which the
    # recording thread hands over only every switch interval (5 ms by default): shortened
    # while a launch is pending.
    interval = sys.getswitchinterval()
    if interval > _LAUNCH_SWITCH_INTERVAL:
        sys.setswitchinterval(_LAUNCH_SWITCH_INTERVAL)
    return _launcher.submit(_launch, program.jitted_now(), _jax_context(), inputs, interval)


_LAUNCH_SWITCH_INTERVAL = 0.0002  # seconds


def _launch(jitted: Callable, context: Any, inputs: List[Any], interval: float
            ) -> Optional[Any]:
    try:
        if context is None or _jax_context() != context:
            return None
        return jitted(*inputs)
    except Exception:  # noqa: BLE001  (e.g. a predicted array deleted since: none run)
        return None
    finally:
        if interval > _LAUNCH_SWITCH_INTERVAL:
            sys.setswitchinterval(interval)


try:  # the thread's JAX settings that key jit's executables
    from jax._src.config import trace_context as _jax_context
except ImportError:  # (another JAX layout: never launched from the thread)
    def _jax_context() -> Any:
        return None
