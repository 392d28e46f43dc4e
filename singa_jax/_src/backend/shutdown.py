"""A clean exit: dispatched work is finished before the interpreter tears JAX down.

JAX dispatches asynchronously, so a training script usually ends (returns, calls
``sys.exit``, raises, is interrupted) while its last step still computes. If a worker thread is
still running a kernel after Python has finalised, the main thread runs jaxlib's C++ static
destructors under it (a core dump showed it freeing oneDNN's JIT code while two other threads
were executing JIT-compiled code) and the finished run dies with SIGSEGV, exit status 139: 2 of
34 runs of a small graph-mode CNN ending right after its third step here, 1 in 3-12 of SINGA
2.0's ``examples/autograd/xceptionnet.py``.

Importing singa_jax therefore registers :func:`wait_for_dispatched_work` with ``atexit``.
singa_jax imports JAX first, so the hook is registered after JAX's own hooks and, as atexit runs
them last-in first-out, runs before them, while JAX's backends still stand. It waits only on
backends already started: a process that never computed pays nothing, and none is started at
exit. What it waits on is every live array: a computation none of whose results is still
referenced has no handle to wait on (a step's results, its parameters, are referenced).
"""
from __future__ import annotations

import atexit
from typing import Any, List

import jax

__all__ = ["wait_for_dispatched_work", "install"]

_installed = False


def _started_backends() -> List[Any]:
    """The backends (XLA clients) this process has started; never starts one."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # JAX moved its internals: nothing is known to be running
        return []
    started = getattr(xla_bridge, "backends_are_initialized", None)
    try:
        if started is not None and not started():
            return []
        backends = getattr(xla_bridge, "_backends", None)
        if isinstance(backends, dict):
            return list(backends.values())
        if started is not None:  # started, but the table moved: the default one, already up
            from jax.extend import backend
            return [backend.get_backend()]
    except Exception:  # noqa: BLE001 -- an exit hook must not raise over the program's own end
        pass
    return []


def wait_for_dispatched_work() -> None:
    """Block until every live array of every started backend is computed (errors ignored: a
    failed computation is finished too), then until JAX's ordered effects are done."""
    backends = _started_backends()
    if not backends:
        return
    for backend in backends:
        try:
            arrays = backend.live_arrays()
        except Exception:  # noqa: BLE001 -- a client without the method: nothing to wait on
            continue
        for array in arrays:
            try:
                array.block_until_ready()
            except Exception:  # noqa: BLE001 -- deleted, or its computation failed: not running
                pass
    try:
        jax.effects_barrier()
    except Exception:  # noqa: BLE001
        pass


def install() -> None:
    """Register :func:`wait_for_dispatched_work` with atexit, once (JAX must be imported first:
    its hooks then run after this one)."""
    global _installed
    if not _installed:
        atexit.register(wait_for_dispatched_work)
        _installed = True
