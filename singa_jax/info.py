"""What to paste into a bug report: ``python -m singa_jax.info``.

Prints, as aligned ``name: value`` lines in short sections, the versions of singa_jax, Python,
JAX, jaxlib, NumPy and the optional packages singa_jax uses; the operating system; JAX's
backends with every local device (and its memory, where the backend reports it); the float32
matmul precision in force and what it computes in on each backend; the persistent compilation
cache folder; every singa_jax switch (its value, or its default when unset); and the environment
variables that change how JAX, XLA or singa_jax behave.

Nothing here may fail: a backend that cannot start (``JAX_PLATFORMS=cuda`` without a GPU, a
broken plugin) is reported as its error line, since that is exactly when a report is wanted.
Versions are read from the installed distributions' metadata, so no heavy package (torch) is
imported to learn its version.
"""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any, Iterable, List, Optional, Sequence, Tuple

__all__ = ["report", "main", "OPTIONAL_PACKAGES", "ENV_PREFIXES", "ENV_NAMES"]

Row = Tuple[str, str]

# name shown -> distributions that provide it, first found wins (onnxruntime's GPU build is a
# distribution of its own name)
OPTIONAL_PACKAGES = {
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "optax": ("optax",),
    "torch": ("torch",),
    "scikit-learn": ("scikit-learn",),
    "tqdm": ("tqdm",),
}
# JAX's accelerator plugins are separate distributions (jax-cuda12-plugin, libtpu, ...); which
# one is installed, and its version, is the first thing to check when a GPU or TPU is not seen
_PLUGIN_PREFIXES = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu", "jax-tpu")

# environment variables worth reporting: JAX's and XLA's settings (XLA_PYTHON_CLIENT_* is the
# GPU memory preallocation), singa_jax's switches, which accelerators are visible, and the
# allocator and thread settings that change CPU timings
ENV_PREFIXES = ("JAX_", "XLA_", "SINGA_JAX_", "TPU_", "MALLOC_", "OPENBLAS_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")

NOT_INSTALLED = "not installed"


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except Exception as e:  # a broken installation's metadata: say so, go on
            return f"unreadable ({type(e).__name__}: {e})"
    return NOT_INSTALLED


def _error(e: BaseException) -> str:
    """An exception as one line (backend errors run to several paragraphs)."""
    text = str(e).strip().splitlines()
    return f"error: {type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _section(title: str, rows: Sequence[Row]) -> str:
    width = max((len(name) for name, _ in rows), default=0) + 1
    lines = [title]
    lines += [f"  {name + ':':{width}s} {value}".rstrip() for name, value in rows]
    return "\n".join(lines)


def _plugins() -> List[Row]:
    rows = {}
    try:
        for dist in metadata.distributions():
            name = dist.metadata["Name"] or ""
            if name.lower().startswith(_PLUGIN_PREFIXES):
                rows[name] = dist.version
    except Exception as e:
        return [("plugins", _error(e))]
    return sorted(rows.items())


def _versions() -> List[Row]:
    from singa_jax import __version__
    rows = [("singa_jax", f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})"),
            ("python", f"{platform.python_version()} ({platform.python_implementation()}, "
                       f"{sys.executable})"),
            ("jax", _version("jax")), ("jaxlib", _version("jaxlib")),
            ("numpy", _version("numpy"))]
    rows += _plugins()
    rows += [(shown, _version(*names)) for shown, names in OPTIONAL_PACKAGES.items()]
    return rows


def _cpu_count() -> str:
    total = os.cpu_count()
    try:  # the cores this process may run on (a container's or taskset's share)
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return str(total)
    return str(total) if usable == total else f"{usable} usable of {total}"


def _platform() -> List[Row]:
    return [("os", platform.platform()), ("machine", platform.machine()),
            ("cpu cores", _cpu_count())]


def _memory(device: Any) -> Optional[str]:
    """``in use / limit`` from the device's allocator (GPU, TPU); None where the backend keeps
    no such statistics (CPU returns None)."""
    try:
        stats = device.memory_stats()
    except Exception as e:  # some backends raise instead of returning None
        return _error(e)
    if not stats:
        return None
    gib = 1024 ** 3
    limit, used = stats.get("bytes_limit"), stats.get("bytes_in_use")
    if limit is None:
        return None
    return f"{(used or 0) / gib:.2f} GiB in use of {limit / gib:.2f} GiB"


def _device_row(device: Any) -> Row:
    parts = [f"kind {device.device_kind}"]
    capability = getattr(device, "compute_capability", None)
    if capability:  # NVIDIA: decides TF32 (see singa_jax.precision)
        parts.append(f"compute capability {capability}")
    if _process_count() > 1:
        parts.append(f"process {device.process_index}")
    memory = _memory(device)
    if memory:
        parts.append(memory)
    return f"{device.platform}:{device.id}", ", ".join(parts)


def _process_count() -> int:
    import jax
    try:
        return jax.process_count()
    except Exception:
        return 1


def _backends() -> Tuple[List[Row], dict]:
    """Rows for JAX's backends and devices, and platform -> first device (for the precision
    section); a backend that fails to start gives its error line."""
    import jax
    rows: List[Row] = []
    clients: dict = {}
    try:
        from jax.extend.backend import backends
    except ImportError:  # pragma: no cover -- an older JAX
        from jax._src.xla_bridge import backends
    try:  # which platforms were asked for: the context of a backend's start-up error
        rows.append(("platforms asked", jax.config.jax_platforms or "any (JAX's choice)"))
    except Exception as e:
        rows.append(("platforms asked", _error(e)))
    try:
        clients = dict(backends())
    except Exception as e:
        rows.append(("backends", _error(e)))
    default = None
    try:
        default = jax.default_backend()
        rows.append(("default backend", default))
    except Exception as e:
        rows.append(("default backend", _error(e)))
    try:
        rows.append(("process", f"{jax.process_index()} of {jax.process_count()}"))
    except Exception as e:
        rows.append(("process", _error(e)))
    first = {}
    # the default backend first (its key may be "cuda" where its platform is "gpu")
    for name, client in sorted(clients.items(),
                               key=lambda item: getattr(item[1], "platform", item[0]) != default):
        try:
            version = getattr(client, "platform_version", "") or ""
            devices = client.local_devices()
            label = f"{len(devices)} local device(s)"
            if version and version.strip().lower() not in (name, "<unknown>"):
                label += f", {' '.join(version.split())}"  # the CUDA/driver or TPU runtime
            rows.append((f"{name} backend", label))
            for device in devices:
                rows.append(_device_row(device))
            if devices:  # named as the devices are ("gpu" for the "cuda" backend)
                first.setdefault(devices[0].platform, devices[0])
        except Exception as e:
            rows.append((f"{name} backend", _error(e)))
    return rows, first


def _precision(first_devices: dict) -> List[Row]:
    try:
        from singa_jax._src.backend import precision
        rows = [("setting", precision.float32_matmul_precision())]
        for name, device in first_devices.items():
            try:
                rows.append((f"{name} arithmetic", precision.float32_matmul_arithmetic(device)))
            except Exception as e:
                rows.append((f"{name} arithmetic", _error(e)))
        return rows
    except Exception as e:
        return [("setting", _error(e))]


def _compilation_cache() -> List[Row]:
    import jax
    try:
        folder = jax.config.jax_compilation_cache_dir
        rows = [("folder", folder or "off")]
        if folder:
            rows.append(("min compile time",
                         f"{jax.config.jax_persistent_cache_min_compile_time_secs} s"))
        return rows
    except Exception as e:
        return [("folder", _error(e))]


def _environment(environ: Optional[dict] = None) -> List[Row]:
    environ = os.environ if environ is None else environ
    return sorted((k, v) for k, v in environ.items()
                  if k.startswith(ENV_PREFIXES) or k in ENV_NAMES)


def _switches() -> List[Row]:
    try:
        from singa_jax._src.base.switches import in_force
        return in_force()
    except Exception as e:
        return [("switches", _error(e))]


def report() -> str:
    """The report as text: sections of aligned ``name: value`` lines. Never raises for a
    backend that fails to start (its error is a line of the report)."""
    backend_rows, first_devices = _backends()
    sections: Iterable[Tuple[str, List[Row]]] = [
        ("Versions", _versions()),
        ("Platform", _platform()),
        ("JAX backends", backend_rows),
        ("float32 matmul precision", _precision(first_devices)),
        ("Persistent compilation cache", _compilation_cache()),
        ("Environment", _environment() or [("none set", "")]),
        ("singa_jax switches", _switches()),
    ]
    return "\n\n".join(_section(title, rows) for title, rows in sections)


def main() -> None:
    """``python -m singa_jax.info``: print the report."""
    print(report())


if __name__ == "__main__":
    main()
