"""A run's summary: compilations and their seconds by kind, eager replay's hits and misses,
host reads per step, and memory -- the device's peak where its backend reports one, and each
compiled graph-mode step's own memory analysis (what XLA planned for it)."""
from __future__ import annotations

import threading
from typing import Any, Dict

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
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # noqa: BLE001  (a backend without it)
        analysis = None
    if analysis is None:
        return
    fields = {f.replace("_size_in_bytes", "_bytes"): int(getattr(analysis, f, 0) or 0)
              for f in _MEMORY_FIELDS}
    with _lock:
        _graph_steps[where] = fields


observe.listen("compiled", _compiled)


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
    * ``device_memory``: per device whose backend reports it (GPU, TPU), ``bytes_in_use``,
      ``peak_bytes_in_use`` (since the process started) and ``bytes_limit``.
    """
    steps = observe.steps
    counters = replay.stats()
    with _lock:
        graph_steps = {k: dict(v) for k, v in _graph_steps.items()}
    return {"steps": steps, "compilations": compiles.compile_counts(), "replay": counters,
            "host_reads_per_step": counters.get("reads", 0) / steps if steps else 0.0,
            "graph_steps": graph_steps, "device_memory": _device_memory()}


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
    for device, m in s["device_memory"].items():
        lines.append(f"{device}: peak {_bytes(m.get('peak_bytes_in_use', 0))}, in use "
                     f"{_bytes(m.get('bytes_in_use', 0))} of {_bytes(m.get('bytes_limit', 0))}")
    print("\n".join(lines))


def reset_stats() -> None:
    """Forget the compilations counted and explained, and the graph steps' analyses."""
    compiles.reset()
    with _lock:
        _graph_steps.clear()
