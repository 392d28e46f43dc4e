"""SINGA's time profiling (``Device.SetVerbosity``, ``SetSkipIteration``, ``PrintTimeProfiling``)
measured on the device.

SINGA times each operation of its buffered graph. Here a profiled training step (a Model call of
``train_one_batch`` after the skipped ones, on a device whose verbosity is above 0) runs inside
a ``jax.profiler`` session, and the device's own record of what it ran is read back
(:mod:`.xspace`):

* **Eager.** The step runs op by op (eager replay and fused backward walks off for it, so that
  every operator is a kernel of its own), each operator's forward, each backward and each
  update inside a host span that waits for its results; a device operation belongs to the span
  it ran in. An operator's time is the device time of its kernels, not the host's dispatch.
* **Graph mode.** The step is one program; each of its device operations is named by the
  program's metadata (the Layer path and operator it was traced under). Where XLA fused several
  operators into one device operation, the operation is named after its root and lists the
  others (``fused with ...``).

Forward, backward and update are told apart by where each operation ran (an operator's
backward, an optimizer's update) or was traced (graph mode names them ``backward/...`` and
``update``). Times are averaged over the profiled steps. When a ``jax.profiler`` session is
already running (JAX allows one), the spans are timed on the host clock instead, which then
includes the host's dispatch, and the report says so.
"""
from __future__ import annotations

import bisect
import itertools
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import jax

from singa_jax._src.base import observe, process_state
from singa_jax._src.base.modes import current_trace_hook, eager_replay, fused_backward
from singa_jax._src.debug import xspace
from singa_jax._src.eager import replay
from singa_jax._src.runtime.device import Device, get_default_device
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["TimeProfiler", "PROFILER", "report", "profile"]

CATEGORIES = ("forward", "backward", "update", "other")
_SPAN = "singa_jax#"  # the host spans' name prefix
# the device operations verbosity 3 lists (SINGA: its distributed operations)
_DISTRIBUTED = ("all-reduce", "all-gather", "reduce-scatter", "collective", "all-to-all",
                "Dist", "psum")


class _Record:
    """A device's profile: steps seen, steps profiled, seconds by category and by operation."""

    def __init__(self) -> None:
        self.seen = 0
        self.profiled = 0
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.ops: Dict[Any, List[Any]] = {}  # key -> [label, seconds]; in first-run order
        self.source = "device (jax.profiler)"
        self.mode = ""  # "eager" or "graph": the kind of step profiled


class _Step:
    """What one profiled step's host spans were: label and category by span number."""

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.spans: Dict[int, Tuple[str, str]] = {}
        self.host_seconds: Dict[int, float] = {}  # the host-clock fallback's durations
        self.programs: List[Any] = []  # graph-mode programs run
        self.phase: List[str] = []  # "backward"/"update" while one runs
        self.timed_on_host = False


class TimeProfiler(observe.Observer):
    """The observer that profiles the training steps of the devices whose verbosity is above 0
    (attached while there are any)."""

    def __init__(self) -> None:
        self._records: Dict[Device, _Record] = {}
        self._verbose: Dict[Device, None] = {}
        self._step: Optional[_Step] = None
        self._numbers = itertools.count()
        self._names: Dict[int, Tuple[Any, Dict[str, xspace.HloNames]]] = {}
        self._lock = threading.Lock()

    # --- settings --------------------------------------------------------------------------
    def verbosity_changed(self, device: Device) -> None:
        with self._lock:
            if device.verbosity() > 0:
                self._verbose[device] = None
            else:
                self._verbose.pop(device, None)
            if self._verbose:
                observe.attach(self)
            else:
                observe.detach(self)

    def forget(self) -> None:
        """Every device back to verbosity 0, every profile forgotten (a process reset)."""
        with self._lock:
            for device in list(self._verbose):
                device._verbosity = 0
            self._verbose.clear()
            self._records.clear()
            self._names.clear()
            observe.detach(self)

    def record(self, device: Device) -> _Record:
        rec = self._records.get(device)
        if rec is None:
            rec = self._records[device] = _Record()
        return rec

    # --- the step --------------------------------------------------------------------------
    def step(self, model: Any, name: str, args: Tuple[Any, ...], call: Any) -> Any:
        device = _device_of(model, args)
        if name != "train_one_batch" or device.verbosity() <= 0 or self._step is not None:
            return call()
        rec = self.record(device)
        rec.seen += 1
        if rec.seen <= device.skip_iteration():
            return call()
        replay.flush()
        device.Sync()  # the step's device time starts with the device idle
        session = xspace.Session.start()
        step = self._step = _Step(threading.get_ident())
        step.timed_on_host = session is None
        start = time.perf_counter()
        try:
            with eager_replay(False), fused_backward(False):
                result = call()
            replay.flush()
            device.Sync()
        finally:
            self._step = None
            data = session.stop() if session is not None else None
        wall = time.perf_counter() - start
        self._account(rec, step, data, wall)
        return result

    def _here(self) -> Optional[_Step]:
        """The profiled step when this thread runs it and no trace is running, else None."""
        step = self._step
        if step is None or step.thread != threading.get_ident() or \
                current_trace_hook() is not None:
            return None
        return step

    def _span(self, step: _Step, label: str, category: str, call: Any, wait: Any) -> Any:
        number = next(self._numbers)
        step.spans[number] = (label, category)
        start = time.perf_counter()
        with jax.profiler.TraceAnnotation(f"{_SPAN}{number}"):
            result = call()
            wait(result)
        step.host_seconds[number] = time.perf_counter() - start
        return result

    def op(self, op: Any, xs: Tuple[Any, ...], call: Any) -> Any:
        step = self._here()
        if step is None or any(isinstance(x, Tensor) and isinstance(x._data, jax.core.Tracer)
                               for x in xs):
            return call()
        category = step.phase[-1] if step.phase else "forward"
        label = observe.op_label(op)
        return self._span(step, label, category, call,
                          lambda ys: jax.block_until_ready([y._data for y in ys]))

    def backward(self, op: Any, call: Any) -> Any:
        step = self._here()
        if step is None:
            return call()
        step.phase.append("backward")
        try:
            return self._span(step, f"{observe.op_label(op)} (backward)", "backward", call,
                              jax.block_until_ready)
        finally:
            step.phase.pop()

    def update(self, optimizer: Any, call: Any) -> Any:
        step = self._here()
        if step is None:
            return call()
        step.phase.append("update")
        try:
            return self._span(step, f"update ({type(optimizer).__name__})", "update", call,
                              lambda _: _sync_all())
        finally:
            step.phase.pop()

    def program(self, kind: str, compiled: Any) -> None:
        step = self._step
        if step is not None and step.thread == threading.get_ident():
            step.programs.append(compiled)

    # --- reading the device's record -------------------------------------------------------
    def _account(self, rec: _Record, step: _Step, data: Any, wall: float) -> None:
        mode = "graph" if step.programs else "eager"
        if rec.mode != mode:
            if rec.mode:  # a switch of mode: the profile starts again, this step skipped
                rec.__init__()  # type: ignore[misc]
                rec.seen, rec.mode = 1, mode
                return
            rec.mode = mode
        rec.profiled += 1
        if data is None:  # host clock: the spans' own durations
            rec.source = "host clock (a jax.profiler session was already running)"
            if step.programs or not step.spans:
                rec.seconds["other"] += wall
                return
            for i, (number, (label, category)) in enumerate(sorted(step.spans.items())):
                self._add(rec, (i, label), label, category, step.host_seconds[number])
            return
        ops = xspace.device_ops(data)
        if step.programs:
            self._account_programs(rec, step, ops)
        else:
            self._account_spans(rec, step, data, ops)

    @staticmethod
    def _add(rec: _Record, key: Any, label: str, category: str, seconds: float) -> None:
        rec.seconds[category] += seconds
        entry = rec.ops.get(key)
        if entry is None:
            rec.ops[key] = [label, seconds]
        else:
            entry[1] += seconds

    def _account_spans(self, rec: _Record, step: _Step, data: Any,
                       ops: List[xspace.DeviceOp]) -> None:
        spans = xspace.host_spans(data, _SPAN)
        order = sorted(((s.start, s.end, int(name[len(_SPAN):])) for name, s in spans.items()))
        starts = [o[0] for o in order]
        position = {number: i for i, (_, _, number) in enumerate(order)}
        for op in ops:
            at = bisect.bisect_right(starts, op.start) - 1
            inside = None
            for j in range(at, max(at - 8, -1), -1):  # the innermost span holding it
                if order[j][1] >= op.start:
                    inside = order[j][2]
                    break
            if inside is not None:
                label, category = step.spans[inside]
                key = (position[inside], label)
            else:  # between operators (a gradient sum, a loss's root gradient)
                category = step.spans[order[at][2]][1] if at >= 0 else "other"
                label, key = f"(between operators, {category})", ("between", category)
            self._add(rec, key, label, category, op.duration * 1e-9)

    def _account_programs(self, rec: _Record, step: _Step, ops: List[xspace.DeviceOp]) -> None:
        names = {}
        for compiled in step.programs:
            names.update(self._hlo_names(compiled))
        for op in ops:
            hlo = names.get(op.module)
            if hlo is None:
                label, category = f"{op.op} ({op.module})", "other"
            else:
                label, category = _graph_label(hlo, op.op)
            self._add(rec, label, label, category, op.duration * 1e-9)

    def _hlo_names(self, compiled: Any) -> Dict[str, xspace.HloNames]:
        held = self._names.get(id(compiled))
        if held is None or held[0] is not compiled:
            texts = {}
            try:
                text = compiled.as_text()
            except Exception:  # noqa: BLE001  (a backend that keeps no HLO text)
                text = ""
            head = text.split(",", 1)[0].split()
            if len(head) >= 2 and head[0] == "HloModule":
                texts[head[1]] = xspace.HloNames(text)
            if len(self._names) > 16:
                self._names.clear()
            held = self._names[id(compiled)] = (compiled, texts)
        return held[1]

    # --- what PrintTimeProfiling prints ----------------------------------------------------
    def profile(self, device: Device) -> Dict[str, Any]:
        rec = self.record(device)
        n = max(rec.profiled, 1)
        return {"iterations": rec.profiled, "skipped": min(rec.seen, device.skip_iteration()),
                "mode": rec.mode,
                **{c: s / n for c, s in rec.seconds.items()},
                "ops": [(label, s / n) for label, s in rec.ops.values()],
                "source": rec.source}

    def report(self, device: Device) -> str:
        verbosity = device.verbosity()
        if verbosity <= 0:
            return ""
        p = self.profile(device)
        lines = ["", "Time Profiling:"]
        if not p["iterations"]:
            lines.append(f"no training step profiled yet ({p['skipped']} skipped of "
                         f"SetSkipIteration({device.skip_iteration()}))")
            return "\n".join(lines) + "\n"
        if verbosity == 1:
            lines += [f"Forward Propagation Time : {p['forward']:g} sec",
                      f"Backward Propagation Time : {p['backward']:g} sec",
                      f"Parameter Update Time : {p['update']:g} sec"]
            if p["other"]:
                lines.append(f"Other Device Time : {p['other']:g} sec")
        else:
            listed = p["ops"] if verbosity == 2 else \
                [(label, s) for label, s in p["ops"] if any(d in label for d in _DISTRIBUTED)]
            lines += [f"OP_ID{i}. {label} : {s:g} sec" for i, (label, s) in enumerate(listed)]
        if not p["source"].startswith("device"):
            lines.append(f"(timed on the {p['source']})")
        return "\n".join(lines) + "\n"


def _graph_label(names: xspace.HloNames, op: str) -> Tuple[str, str]:
    own, inner = names.names(op)
    if own is None and inner:  # (a wrapper XLA made: named by what it wraps)
        own, inner = inner[0], inner[1:]
    if own is None:
        return f"{op} (XLA)", "other"
    scope, transposed = xspace.scope_path(own)
    category = xspace.category_of(scope, transposed)
    label = _scope_label(scope, category) or f"{op} (XLA)"
    others = []
    for op_name in inner:
        s, t = xspace.scope_path(op_name)
        other = _scope_label(s, xspace.category_of(s, t))
        if other and other != label and other not in others:
            others.append(other)
    if others:
        label += " (fused with " + ", ".join(others[:3]) + (", ..." if len(others) > 3 else "") \
            + ")"
    return label, category


def _scope_label(scope: str, category: str) -> str:
    if category == "backward":
        scope = scope[len("backward/"):] if scope.startswith("backward/") else scope
        return f"{scope} (backward)" if scope else "(backward)"
    if category == "update":
        return "update"
    return scope


def _device_of(model: Any, args: Tuple[Any, ...]) -> Device:
    for a in args:
        if isinstance(a, (list, tuple)) and a:
            a = a[0]
        if isinstance(a, Tensor):
            return a.device
    for p in model.get_params().values():
        return p.device
    return get_default_device()


def _sync_all() -> None:
    for device in jax.local_devices():
        jax.block_until_ready(device.client.live_arrays())
        break


PROFILER = TimeProfiler()
observe.listen("verbosity", PROFILER.verbosity_changed)
observe.provide("time profiling", PROFILER)
process_state.register(PROFILER.forget)
report, profile = PROFILER.report, PROFILER.profile
