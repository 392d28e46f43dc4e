"""SINGA's ``device`` module on JAX.

A :class:`Device` is one ``jax.Device`` plus the PRNG key that every random fill and every dropout
mask on that device draws from. Devices come from ``jax.devices()``, so the same program runs on
CPU, GPU or TPU. SINGA's graph-buffering switches (``EnableGraph``, ``RunGraph``, ...) are
accepted; whole-step compilation is done by :mod:`singa_jax.graph` instead.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import jax

__all__ = [
    "Device", "get_default_device", "set_default_device", "create_cpu_device", "create_cpu_devices",
    "create_cuda_gpu", "create_cuda_gpus", "create_cuda_gpu_on", "create_cuda_gpus_on",
    "create_tpu_device", "create_tpu_devices", "create_device", "get_num_gpus", "get_gpu_ids",
    "get_gpu_mem_size", "device_query", "enable_lazy_alloc", "get_num_opencl_platforms",
    "get_num_opencl_devices", "create_opencl_device", "all_devices", "default_device",
]


class Device:
    """One accelerator (or the host) plus its random state.

    ``key`` is a JAX PRNG key; :meth:`next_key` splits it, so every random draw is reproducible
    after :meth:`SetRandSeed`. In graph mode the key is threaded through the compiled step as state.
    """

    def __init__(self, jax_device: jax.Device, seed: Optional[int] = None):
        self.jax_device = jax_device
        # Distinct default seeds per device, so replicas of a data-parallel step do not draw
        # identical dropout masks unless the program seeds them alike.
        self.key = jax.device_put(jax.random.PRNGKey(jax_device.id if seed is None else seed),
                                  jax_device)
        self._graph_enabled = False
        self._verbosity = 0
        self._skip_iteration = 5

    # --- SINGA's Device methods -------------------------------------------------------------
    def id(self) -> int:
        """SINGA's device id: -1 for the host, else the accelerator's index on its platform."""
        return -1 if self.platform == "cpu" else self.jax_device.id

    def SetRandSeed(self, seed: int) -> None:
        """Reset this device's PRNG key: every random fill after it is reproducible."""
        self.key = jax.device_put(jax.random.PRNGKey(int(seed)), self.jax_device)

    def EnableGraph(self, enable: bool) -> None:
        self._graph_enabled = bool(enable)

    def graph_enabled(self) -> bool:
        return self._graph_enabled

    def Sync(self) -> None:
        """Wait until all work queued on this device has finished.

        XLA has no per-device barrier, and its CPU runtime may run independent programs
        concurrently, so waiting on the newest result is not enough: this waits on every live array
        of the device's backend (one C++ call, no per-array Python work). Waiting on sibling
        devices of the same backend as well is harmless for SINGA's uses (timing, step ends).
        """
        jax.block_until_ready(self.jax_device.client.live_arrays())

    def ResetGraph(self) -> None:
        """SINGA drops its buffered op graph; XLA programs are cached per step, nothing to drop."""

    def RunGraph(self, serial: bool = False) -> None:
        """SINGA runs its buffered graph; here every op has already run (eager) or runs as one
        compiled program per step (graph mode)."""
        self.Sync()

    def SetVerbosity(self, verbosity: int) -> None:
        self._verbosity = int(verbosity)

    def SetSkipIteration(self, skip: int) -> None:
        self._skip_iteration = int(skip)

    def PrintTimeProfiling(self) -> None:
        print(f"{self}: per-op time profiling is done with jax.profiler on XLA backends")

    def lang(self) -> str:
        return self.platform

    def host(self) -> "Device":
        """The host (CPU) device that stages this device's transfers."""
        return create_cpu_device()

    def Reset(self) -> None:
        """SINGA frees the device's memory pool; XLA frees buffers when their arrays die."""
        self.ResetGraph()

    # --- JAX side ---------------------------------------------------------------------------
    @property
    def platform(self) -> str:
        return self.jax_device.platform

    def next_key(self) -> jax.Array:
        """A fresh PRNG key; advances this device's random state."""
        self.key, sub = jax.random.split(self.key)
        return sub

    def put(self, array) -> jax.Array:
        """``array`` as a jax.Array on this device (tracers are returned unchanged)."""
        if isinstance(array, jax.core.Tracer):
            return array
        # Results of ops on this device already live here (committed or not); device_put
        # would cost ~40x the check on every Tensor created.
        if isinstance(array, jax.Array) and array.devices() == {self.jax_device}:
            return array
        return jax.device_put(array, self.jax_device)

    def __repr__(self) -> str:
        return f"Device({self.jax_device.platform}:{self.jax_device.id})"


_devices: Dict[jax.Device, Device] = {}  # one Device (and so one key) per jax.Device
_all: List[Tuple[Device, ...]] = [()]     # the same, as one tuple replaced on each addition
_default: List[Optional[Device]] = [None]


def _wrap(jd: jax.Device) -> Device:
    dev = _devices.get(jd)
    if dev is None:
        dev = _devices[jd] = Device(jd)
        _all[0] = tuple(_devices.values())
    return dev


def all_devices() -> Tuple[Device, ...]:
    """Every Device created so far (graph mode threads each one's key). The tuple object stays
    the same until a Device is added, so callers may cache on its identity."""
    return _all[0]


def _platform_devices(platform: str) -> List[jax.Device]:
    try:
        return list(jax.devices(platform))
    except RuntimeError:
        return []


def _available() -> str:
    try:
        return ", ".join(f"{d.platform}:{d.id}" for d in jax.devices())
    except RuntimeError as e:  # pragma: no cover
        return str(e)


def _pick(platform: str, ids: Sequence[int], what: str) -> List[Device]:
    found = _platform_devices(platform)
    if platform == "gpu" and not found:
        found = _platform_devices("cuda") or _platform_devices("rocm")
    by_index = dict(enumerate(found))
    missing = [i for i in ids if i not in by_index]
    if missing:
        raise ValueError(
            f"{what}: asked for {platform} device(s) {list(ids)} but {len(found)} {platform} "
            f"device(s) are present; available devices: {_available()}")
    return [_wrap(by_index[i]) for i in ids]


def get_default_device() -> Device:
    """The default device: the first of ``jax.devices()`` (an accelerator when there is one).

    SINGA's default is the host; XLA's default backend is the fastest one present, which is what a
    SINGA program that never names a device wants.
    """
    if _default[0] is None:
        _default[0] = _wrap(jax.devices()[0])
    return _default[0]


def set_default_device(dev: Device) -> None:
    if not isinstance(dev, Device):
        raise TypeError(f"set_default_device: expected a Device, got {type(dev).__name__}")
    _default[0] = dev


def create_cpu_device() -> Device:
    """The host device (``jax.devices('cpu')[0]``)."""
    return _pick("cpu", [0], "create_cpu_device")[0]


def create_cpu_devices(num: int) -> List[Device]:
    """``num`` host devices (set XLA_FLAGS=--xla_force_host_platform_device_count=N first)."""
    return _pick("cpu", list(range(num)), "create_cpu_devices")


def create_cuda_gpu() -> Device:
    return create_cuda_gpu_on(0)


def create_cuda_gpus(num: int) -> List[Device]:
    return _pick("gpu", list(range(num)), "create_cuda_gpus")


def create_cuda_gpu_on(device_id: int) -> Device:
    return _pick("gpu", [device_id], "create_cuda_gpu_on")[0]


def create_cuda_gpus_on(device_ids: Sequence[int]) -> List[Device]:
    return _pick("gpu", list(device_ids), "create_cuda_gpus_on")


def create_tpu_device(device_id: int = 0) -> Device:
    return _pick("tpu", [device_id], "create_tpu_device")[0]


def create_tpu_devices(num: int) -> List[Device]:
    return _pick("tpu", list(range(num)), "create_tpu_devices")


def create_device(platform: str = None, device_id: int = 0) -> Device:
    """A device of any XLA backend (``'cpu'``, ``'gpu'``, ``'tpu'``; None: the default backend)."""
    if platform is None:
        platform = jax.default_backend()
    return _pick(platform, [device_id], "create_device")[0]


def get_num_gpus() -> int:
    return len(_platform_devices("gpu"))


def get_gpu_ids() -> List[int]:
    return list(range(get_num_gpus()))


def get_gpu_mem_size(id: int) -> Tuple[int, int]:
    """``(free, total)`` bytes of GPU ``id`` as XLA's allocator reports them (SINGA's pair);
    ``(0, 0)`` when the backend does not report memory statistics."""
    dev = create_cuda_gpu_on(id)
    stats = dev.jax_device.memory_stats() or {}
    total = int(stats.get("bytes_limit", 0))
    return max(total - int(stats.get("bytes_in_use", 0)), 0), total


def device_query(id: int, verbose: bool = False) -> str:
    """A description of GPU ``id``."""
    dev = create_cuda_gpu_on(id)
    text = f"{dev.jax_device.device_kind} ({dev})"
    if verbose:
        print(text)
    return text


def __getattr__(name: str):
    # SINGA's module attribute ``default_device``, resolved lazily so that importing this module
    # does not start an XLA backend, and so that it follows set_default_device.
    if name == "default_device":
        return get_default_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def enable_lazy_alloc(enable: bool) -> None:
    """SINGA allocates GPU memory lazily on request; XLA always allocates on first use."""


def get_num_opencl_platforms() -> int:
    return 0


def get_num_opencl_devices() -> int:
    return 0


def create_opencl_device() -> Device:
    raise ValueError(f"create_opencl_device: XLA has no OpenCL backend; available devices: "
                     f"{_available()}")

