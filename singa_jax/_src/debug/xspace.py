"""Reading what ``jax.profiler`` recorded: the device's executed operations, host spans, and the
names a compiled program's metadata gives its operations.

A trace session writes an XSpace (``*.xplane.pb``): planes of lines of timed events. An XLA
operation the device ran is an event with the stats ``hlo_module`` (its program) and ``hlo_op``
(the instruction): on a GPU or TPU on the device's plane, on the CPU on the host plane's thread
that ran it. The instruction's ``metadata={op_name=...}`` in the program's HLO text is the name
stack it was traced under -- for singa_jax's programs the Layer path and operator (see
``singa_jax._src.base.observe``), e.g. ``jit(graph_step)/block1/conv/_Conv2d/conv_general_dilated``.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import jax

__all__ = ["Session", "DeviceOp", "HostSpan", "device_ops", "host_spans", "HloNames",
           "scope_path", "category_of"]


@dataclass(frozen=True)
class DeviceOp:
    """One operation the device ran: start and duration (ns, the session's clock), program and
    instruction."""
    start: float
    duration: float
    module: str
    op: str


@dataclass(frozen=True)
class HostSpan:
    name: str
    start: float
    end: float


class Session:
    """One ``jax.profiler`` trace session into a folder of its own (a temporary one unless
    ``folder``); :meth:`stop` ends it and returns the recorded data. ``Session.start`` returns
    None when a session is running already (JAX allows one at a time)."""

    def __init__(self, folder: str, temporary: bool):
        self.folder, self.temporary = folder, temporary

    @classmethod
    def start(cls, folder: Optional[str] = None) -> Optional["Session"]:
        temporary = folder is None
        folder = tempfile.mkdtemp(prefix="singa_jax_profile_") if temporary else folder
        try:
            jax.profiler.start_trace(folder)
        except RuntimeError:  # a session is running already (the user's, or a capture)
            if temporary:
                shutil.rmtree(folder, ignore_errors=True)
            return None
        return cls(folder, temporary)

    def stop(self, read: bool = True) -> Any:
        """End the session; with ``read``, its data (``jax.profiler.ProfileData``) or None."""
        jax.profiler.stop_trace()
        try:
            if not read:
                return None
            files = sorted(glob.glob(os.path.join(self.folder, "**", "*.xplane.pb"),
                                     recursive=True), key=os.path.getmtime)
            return jax.profiler.ProfileData.from_file(files[-1]) if files else None
        finally:
            if self.temporary:
                shutil.rmtree(self.folder, ignore_errors=True)


def _stats(event: Any) -> Dict[str, Any]:
    try:
        return dict(event.stats)
    except Exception:  # noqa: BLE001  (a stat of a type the reader does not know)
        return {}


def device_ops(data: Any) -> List[DeviceOp]:
    """Every XLA operation the device(s) ran, in start order. The device's planes where they
    hold operations (GPU, TPU; an ``XLA Ops`` line alone where there is one, which holds each
    operation once), else the host's threads (the CPU)."""
    device_planes = [p for p in data.planes if p.name.startswith("/device:")]
    ops = []
    for plane in device_planes:
        lines = list(plane.lines)
        xla_ops = [line for line in lines if line.name == "XLA Ops"]
        ops += _ops_in(xla_ops or lines)
    if not ops:
        for plane in data.planes:
            if plane.name.startswith("/host:"):
                ops += _ops_in(plane.lines)
    return sorted(ops, key=lambda op: op.start)


def _ops_in(lines: Any) -> List[DeviceOp]:
    """The operations on ``lines``, leaves only: a control-flow operation (``cond``,
    ``while``) is recorded around the operations of its body on the same line, and counting
    both would count that time twice."""
    ops = []
    for line in lines:
        found = []
        for event in line.events:
            if event.name.startswith("end: "):
                continue
            stats = _stats(event)
            op, module = stats.get("hlo_op"), stats.get("hlo_module")
            if op is None or module is None:
                continue
            found.append(DeviceOp(float(event.start_ns), float(event.duration_ns),
                                  str(module), str(op)))
        found.sort(key=lambda o: (o.start, -o.duration))
        for i, op in enumerate(found):
            end = op.start + op.duration
            nxt = found[i + 1] if i + 1 < len(found) else None
            if nxt is not None and nxt.start < end and nxt.start + nxt.duration <= end:
                continue  # (it holds the next: a parent)
            ops.append(op)
    return ops


def host_spans(data: Any, prefix: str) -> Dict[str, HostSpan]:
    """The host events (``jax.profiler.TraceAnnotation``) whose names start with ``prefix``."""
    spans = {}
    for plane in data.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for event in line.events:
                if event.name.startswith(prefix):
                    start = float(event.start_ns)
                    spans[event.name] = HostSpan(event.name, start,
                                                 start + float(event.duration_ns))
    return spans


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")


class HloNames:
    """The op_name metadata of a compiled program's instructions: for an instruction (an
    ``hlo_op``), its own name stack and those of the instructions of the computations it calls
    (what XLA fused into it)."""

    def __init__(self, hlo_text: str):
        self._own: Dict[str, str] = {}
        self._calls: Dict[str, List[str]] = {}
        self._inside: Dict[str, List[str]] = {}
        computation = None
        for line in hlo_text.splitlines():
            if line.startswith(("HloModule", "//")) or not line.strip():
                continue
            heading = _COMPUTATION.match(line)
            if heading and "=" not in line.split("{")[0]:
                computation = heading.group(1)
                self._inside.setdefault(computation, [])
                continue
            found = _INSTRUCTION.match(line)
            if not found:
                continue
            name = found.group(1)
            op_name = _OP_NAME.search(line)
            if op_name:
                self._own[name] = op_name.group(1)
                if computation is not None:
                    self._inside[computation].append(op_name.group(1))
            calls = _CALLS.findall(line)
            if calls:
                self._calls[name] = calls

    def names(self, op: str) -> Tuple[Optional[str], List[str]]:
        """``(the instruction's op_name, the op_names of what it calls)``."""
        inner: List[str] = []
        todo = list(self._calls.get(op, ()))
        seen = set()
        while todo:
            computation = todo.pop()
            if computation in seen:
                continue
            seen.add(computation)
            inner += self._inside.get(computation, [])
        return self._own.get(op), inner


_WRAPPER = re.compile(r"^[\w\-]+\(.*\)$")  # jit(f), pjit(f), jvp(...), transpose(jvp(f)), ...


def scope_path(op_name: str) -> Tuple[str, bool]:
    """``(scope, transposed)`` of an op_name: the named scopes it was traced under (transform
    and jit wrappers and the primitive dropped) and whether it comes from a transpose (a
    backward pass)."""
    parts = op_name.split(";", 1)[0].split("/")  # (XLA joins the names of merged ops by ";")
    transposed = any(p.startswith("transpose(") for p in parts)
    kept = [p for p in parts[:-1] if p and not _WRAPPER.match(p)]
    return "/".join(kept), transposed


def category_of(scope: str, transposed: bool) -> str:
    """``forward``, ``backward`` or ``update`` for an operation traced under ``scope``."""
    head = scope.split("/", 1)[0]
    if head == "update":
        return "update"
    if head == "backward" or transposed:
        return "backward"
    return "forward"
