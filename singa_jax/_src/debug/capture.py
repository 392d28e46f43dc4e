"""Capturing a run into a ``jax.profiler`` trace folder with SINGA's names on it.

``with debug.trace(folder, skip=2, steps=3): train()`` records the Model calls 3 to 5 of the
block (all of the block without ``steps``) into ``folder``, for TensorBoard's profile plugin or
Perfetto (``folder/plugins/profile/<run>/*.xplane.pb`` and ``*.trace.json.gz``). While it
records:

* every Model call is a step (``jax.profiler.StepTraceAnnotation``: TensorBoard's step view),
* every Layer call, operator, operator backward and optimizer update is a host span named by
  its Layer path and operator (``block1/conv/_Conv2d``, ``... (backward)``, ``update``), and
* eager replay's programs compiled meanwhile name each recorded operator the same way.

Graph mode's programs always carry the names (they are traced under named scopes, which costs
nothing per step), so on a GPU or TPU the device's operations in the trace are named by Layer
and operator; on the CPU, XLA's trace names each operation by its HLO instruction.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Optional, Tuple

import jax

from singa_jax._src.base import observe
from singa_jax._src.debug import xspace
from singa_jax._src.eager import replay

__all__ = ["trace"]


class trace(observe.Observer):
    """Record Model calls into the trace folder ``log_dir``: the ``steps`` calls (all, for
    None) after the first ``skip`` calls made inside the block. A context manager, or
    :meth:`start` and :meth:`stop` around the calls."""

    def __init__(self, log_dir: str, *, skip: int = 0, steps: Optional[int] = None):
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"debug.trace: log_dir must be a folder path, got "
                            f"{type(log_dir).__name__}")
        for what, value in (("skip", skip), ("steps", steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"debug.trace: {what} must be an int >= 0, got {value!r}")
        self.log_dir = os.fspath(log_dir)
        self.skip, self.steps = skip, steps
        self.calls = 0  # Model calls seen in the block
        self.recorded = 0  # of them, recorded
        self._session: Optional[xspace.Session] = None
        self._done = False
        self._thread = threading.get_ident()

    # --- the block -------------------------------------------------------------------------
    def __enter__(self) -> "trace":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Start watching (recording at once when ``skip`` is 0)."""
        self._thread = threading.get_ident()
        observe.attach(self)
        if self.skip == 0:
            self._begin()

    def stop(self) -> None:
        """Stop recording and watching; the trace is written to the folder."""
        observe.detach(self)
        self._end()

    @property
    def recording(self) -> bool:
        return self._session is not None

    def _begin(self) -> None:
        if self._session is None and not self._done:
            os.makedirs(self.log_dir, exist_ok=True)
            replay.flush()  # (the work before the trace is not in it)
            self._session = xspace.Session.start(self.log_dir)
            if self._session is None:
                raise RuntimeError("debug.trace: a jax.profiler trace is running already "
                                   "(JAX records one at a time); stop it first")

    def _end(self) -> None:
        if self._session is not None:
            replay.flush()
            for device in jax.local_devices()[:1]:
                jax.block_until_ready(device.client.live_arrays())
            self._session.stop(read=False)
            self._session = None
            self._done = True

    # --- what it watches -------------------------------------------------------------------
    def step(self, model: Any, name: str, args: Tuple[Any, ...], call: Any) -> Any:
        if threading.get_ident() != self._thread:
            return call()
        self.calls += 1
        if self.calls == self.skip + 1:
            self._begin()
        if self._session is None:
            return call()
        try:
            with jax.profiler.StepTraceAnnotation(f"{type(model).__name__}.{name}",
                                                  step_num=self.calls):
                return call()
        finally:
            self.recorded += 1
            if self.steps is not None and self.recorded >= self.steps:
                self._end()

    def _annotated(self, label: str, call: Any) -> Any:
        if self._session is None:
            return call()
        with jax.profiler.TraceAnnotation(label):
            return call()

    def op(self, op: Any, xs: Tuple[Any, ...], call: Any) -> Any:
        return self._annotated(observe.op_label(op), call)

    def layer(self, layer: Any, call: Any) -> Any:
        return self._annotated(observe.layer_path() or type(layer).__name__, call)

    def backward(self, op: Any, call: Any) -> Any:
        return self._annotated(f"{observe.op_label(op)} (backward)", call)

    def update(self, optimizer: Any, call: Any) -> Any:
        return self._annotated(f"update ({type(optimizer).__name__})", call)
