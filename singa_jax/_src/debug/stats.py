"""A run's summary: compilations and their seconds by kind, eager replay's hits and misses,
host reads per step, and memory -- the device's peak where its backend reports one, and each
compiled graph-mode step's and eager replay program's own memory analysis (what XLA planned
for it)."""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Dict, List, Optional, Sequence

import jax

from singa_jax._src.base import observe
from singa_jax._src.debug import compiles
from singa_jax._src.eager import replay

__all__ = ["stats", "print_stats", "reset_stats"]

_graph_steps: Dict[str, Dict[str, int]] = {}
_lock = threading.Lock()
_MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                  "alias_size_in_bytes", "generated_code_size_in_bytes")


def _compiled(where: str, compiled: Any) -> None:
    fields = _analysis(compiled)
    if fields is not None:
        with _lock:
            _graph_steps[where] = fields


observe.listen("compiled", _compiled)

# Eager replay's programs, newest last: [kernels, device, program, input specs, analysis]. The
# analysis is XLA's, asked for when stats() first reads the entry: lowering the program again
# for the inputs it ran on finds the executable JAX compiled at its first run.
_REPLAY_KEPT = 32
_replay_programs: Deque[List[Any]] = collections.deque(maxlen=_REPLAY_KEPT)


def _replay_compiled(kernels: int, device: Any, program: Any, inputs: Sequence[Any]) -> None:
    # (an uncommitted input's spec has no sharding, or the lowering would not be the one run)
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding if a.committed else None,
                                  weak_type=a.aval.weak_type) for a in inputs]
    with _lock:
        _replay_programs.append([kernels, str(device), program, specs, None])


observe.listen("replay_compiled", _replay_compiled)


def _analysis(compiled: Any) -> Optional[Dict[str, int]]:
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # noqa: BLE001  (a backend without it)
        analysis = None
    if analysis is None:
        return None
    return {f.replace("_size_in_bytes", "_bytes"): int(getattr(analysis, f, 0) or 0)
            for f in _MEMORY_FIELDS}


def _replay_analyses() -> List[Dict[str, Any]]:
    with _lock:
        entries = list(_replay_programs)
    found = []
    for entry in entries:
        kernels, device, program, specs, analysis = entry
        if analysis is None:
            try:
                analysis = _analysis(program.jitted_now().lower(*specs).compile())
            except Exception:  # noqa: BLE001  (one that never compiled: it ran op by op)
                analysis = None
            entry[4] = analysis if analysis is not None else {}
        if analysis:
            found.append({"kernels": kernels, "device": device, **analysis})
    return found


def _device_memory() -> Dict[str, Dict[str, int]]:
    memory = {}
    for device in jax.local_devices():
        try:
            found = device.memory_stats()
        except Exception:  # noqa: BLE001  (the CPU raises or returns None)
            found = None
        if found:
            memory[str(device)] = {k: int(found[k]) for k in
                                   ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
                                   if k in found}
    return memory


def stats() -> Dict[str, Any]:
    """The run so far as a dict:

    * ``steps``: Model calls;
    * ``compilations``: ``{kind: {"count", "seconds"}}`` for ``graph step``, ``eager kernel``,
      ``eager replay`` and ``fused backward`` (seconds of XLA compilation, or of loading a
      program from the persistent compilation cache);
    * ``replay``: eager replay's counters -- segments ``replayed`` by a compiled program (hits)
      and run ``op_by_op`` (misses), kernel calls ``recorded``, programs ``compiled``,
      ``speculated``/``mispredicted`` starts, and ``reads``: segments a host read ended early;
    * ``host_reads_per_step``: those reads per Model call;
    * ``graph_steps``: per compiled step (``"Model.method"``), XLA's memory analysis in bytes
      (``argument``, ``output``, ``temp``, ``alias``, ``generated_code``);
    * ``replay_programs``: eager replay's programs (the newest 32), oldest first, each with the
      ``kernels`` it runs, its ``device`` and XLA's memory analysis as above (a replayed
      training step is one such program, or a few in a row for a long one);
    * ``device_memory``: per device whose backend reports it (GPU, TPU), ``bytes_in_use``,
      ``peak_bytes_in_use`` (since the process started) and ``bytes_limit``.
    """
    steps = observe.steps
    counters = replay.stats()
    with _lock:
        graph_steps = {k: dict(v) for k, v in _graph_steps.items()}
    return {"steps": steps, "compilations": compiles.compile_counts(), "replay": counters,
            "host_reads_per_step": counters.get("reads", 0) / steps if steps else 0.0,
            "graph_steps": graph_steps, "replay_programs": _replay_analyses(),
            "device_memory": _device_memory()}


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def print_stats() -> None:
    """Print :func:`stats` as a short table."""
    s = stats()
    lines = [f"singa_jax run summary: {s['steps']} Model calls", "compilations:"]
    for kind, c in sorted(s["compilations"].items()):
        lines.append(f"  {kind:15s} {c['count']:6d}  {c['seconds']:8.2f} s")
    if not s["compilations"]:
        lines.append("  none")
    r = s["replay"]
    lines.append(f"eager replay: {r.get('replayed', 0)} segments replayed, "
                 f"{r.get('op_by_op', 0)} run op by op, {r.get('compiled', 0)} programs "
                 f"compiled, {r.get('reads', 0)} ended early by a host read "
                 f"({s['host_reads_per_step']:.2f} per step)")
    for where, m in s["graph_steps"].items():
        lines.append(f"graph step {where}: arguments {_bytes(m['argument_bytes'])}, outputs "
                     f"{_bytes(m['output_bytes'])}, temporaries {_bytes(m['temp_bytes'])}")
    programs = s["replay_programs"]
    for m in sorted(programs, key=_held, reverse=True)[:3]:
        lines.append(f"eager replay program of {m['kernels']} kernels ({m['device']}): "
                     f"arguments {_bytes(m['argument_bytes'])}, outputs "
                     f"{_bytes(m['output_bytes'])}, temporaries {_bytes(m['temp_bytes'])}")
    if len(programs) > 3:
        lines.append(f"  (and {len(programs) - 3} smaller eager replay programs)")
    for device, m in s["device_memory"].items():
        lines.append(f"{device}: peak {_bytes(m.get('peak_bytes_in_use', 0))}, in use "
                     f"{_bytes(m.get('bytes_in_use', 0))} of {_bytes(m.get('bytes_limit', 0))}")
    print("\n".join(lines))


def _held(m: Dict[str, Any]) -> int:
    """What a program's run holds at once, by its analysis (arguments, outputs, temporaries)."""
    return m["argument_bytes"] + m["output_bytes"] + m["temp_bytes"]


def reset_stats() -> None:
    """Forget the compilations counted and explained, and the graph steps' and eager replay
    programs' analyses."""
    compiles.reset()
    with _lock:
        _graph_steps.clear()
        _replay_programs.clear()
