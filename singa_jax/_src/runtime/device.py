"""Devices: :class:`Device` (one ``jax.Device`` of this process and its PRNG key) and SINGA's
device functions, public in :mod:`singa_jax.device` (see there for how devices are chosen)."""
from __future__ import annotations

import os
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from singa_jax._src.base import observe, process_state
from singa_jax._src.base import host_prng
from singa_jax._src.base.modes import in_compile_time_eval, in_parameter_initialization, traced_keys

__all__ = [
    "Device", "device_of", "get_default_device", "set_default_device", "create_cpu_device", "create_cpu_devices",
    "create_cuda_gpu", "create_cuda_gpus", "create_cuda_gpu_on", "create_cuda_gpus_on",
    "create_tpu_device", "create_tpu_devices", "create_device", "get_num_gpus", "get_gpu_ids",
    "get_gpu_mem_size", "device_query", "enable_lazy_alloc", "get_num_opencl_platforms",
    "get_num_opencl_devices", "create_opencl_device", "all_devices",
    "set_strict_devices",
]

STRICT_ENV = "SINGA_JAX_STRICT_DEVICES"   # "1": create_cuda_gpu*() raise without accelerators
FALLBACK_ENV = "SINGA_JAX_CUDA_FALLBACK"  # "1" (set by singa_jax.run): always fall back


def _profiling_setting(method: str, what: str, value: Any, bounds: Tuple[int, Any]) -> int:
    """``value`` as the int a time-profiling setting takes, or a TypeError/ValueError naming
    ``method``, the value and what it expects (nothing is set then)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Device.{method}: {what} must be an int, got {type(value).__name__} "
                        f"{value!r}")
    low, high = bounds
    if value < low or (high is not None and value > high):
        expected = f"{low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"Device.{method}: {what} must be {expected}, got {value}")
    return int(value)


class Device:
    """One accelerator (or the host) plus its random state.

    ``key`` is a JAX PRNG key; :meth:`next_key` splits it, so every random draw is reproducible
    after :meth:`SetRandSeed`. In graph mode the key is threaded through the compiled step as state.

    Threads: :meth:`next_key` reads, splits and rebinds the key under a lock, so two threads never
    receive the same key. While graph mode traces a step it sets ``key`` to a tracer; that value
    is kept per thread (``modes.traced_keys``), so other threads keep reading the concrete key.
    """

    def __init__(self, jax_device: jax.Device, seed: Optional[int] = None):
        self.jax_device = jax_device
        self._lock = threading.RLock()  # re-entered by graph mode's run (graph._key_locks)
        # Default seed: the device's index on its host. Distinct devices of a process draw
        # distinct streams, and every process of a data-parallel run (which all build the same
        # model) draws the same initial parameters, as SINGA's ranks do after SetRandSeed(0).
        self._key = jax.device_put(
            jax.random.PRNGKey(_host_index(jax_device) if seed is None else seed), jax_device)
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

    # --- the PRNG key -----------------------------------------------------------------------
    @property
    def key(self) -> jax.Array:
        """This device's PRNG key (inside a graph-mode trace on this thread: its tracer)."""
        traced = traced_keys()
        if traced is not None and self in traced:
            return traced[self][0]
        return self._key

    @key.setter
    def key(self, value: jax.Array) -> None:
        traced = traced_keys(create=isinstance(value, jax.core.Tracer))
        if isinstance(value, jax.core.Tracer):
            # a trace in progress on this thread: remember the tracer (and the concrete key it
            # started from) for this thread only
            base = traced[self][1] if self in traced else self._key
            traced[self] = (value, base)
            return
        if traced is not None and self in traced:
            _, base = traced.pop(self)
            if value is base:
                # the trace's end restoring its starting key: keep whatever other threads drew
                # meanwhile instead of rewinding the shared key (which would repeat keys)
                return
        with self._lock:
            self._key = value

    def next_key(self) -> jax.Array:
        """A fresh PRNG key; advances this device's random state (atomically across threads)."""
        traced = traced_keys()
        if traced is not None and self in traced:
            tracer, base = traced[self]
            tracer, sub = jax.random.split(tracer)
            traced[self] = (tracer, base)
            return sub
        with self._lock:
            if (in_compile_time_eval() or in_parameter_initialization()) \
                    and host_prng.supported(self._key):
                # a layer's initialisation (eager or in compile()): the same split on the host,
                # no XLA program (not elsewhere: reading the key waits for the step that wrote
                # it)
                self._key, sub = host_prng.split(self._key)
            else:
                self._key, sub = jax.random.split(self._key)
        return sub

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
        A computation that failed has finished too: its error is raised where its value is
        read, not here (a failed step's arrays may live on until they are collected).
        """
        arrays = self.jax_device.client.live_arrays()
        try:
            jax.block_until_ready(arrays)
        except jax.errors.JaxRuntimeError:
            for a in arrays:  # one by one, past the failed ones
                try:
                    a.block_until_ready()
                except jax.errors.JaxRuntimeError:
                    pass

    def ResetGraph(self) -> None:
        """SINGA drops its buffered op graph; XLA programs are cached per step, nothing to drop."""

    def RunGraph(self, serial: bool = False) -> None:
        """SINGA runs its buffered graph; here every op has already run (eager) or runs as one
        compiled program per step (graph mode)."""
        self.Sync()

    def SetVerbosity(self, verbosity: int) -> None:
        """SINGA's time profiling of the training steps on this device: 0 (default) off, 1
        forward, backward and update time per step, 2 the time of each operation, 3 of each
        distributed operation; printed by :meth:`PrintTimeProfiling`. The times are the
        device's, read from ``jax.profiler``; see the observability page of the docs."""
        verbosity = _profiling_setting("SetVerbosity", "verbosity", verbosity, (0, 3))
        self._verbosity = verbosity
        observe.notify("verbosity", self)

    def SetSkipIteration(self, skip: int) -> None:
        """Leave the first ``skip`` training steps (default 5: compilation, warm-up) out of
        the time profile."""
        self._skip_iteration = _profiling_setting("SetSkipIteration", "skip", skip, (0, None))

    def verbosity(self) -> int:
        return self._verbosity

    def skip_iteration(self) -> int:
        return self._skip_iteration

    def PrintTimeProfiling(self) -> None:
        """Print the time profile of the steps profiled so far in SINGA's format."""
        print(observe.tool("time profiling").report(self), end="")

    def time_profile(self) -> Dict[str, Any]:
        """The time profile as a dict (a singa_jax extension): ``iterations`` profiled and
        ``skipped``, ``mode`` (``"eager"`` or ``"graph"``: a switch of mode starts the profile
        again), ``forward``/``backward``/``update``/``other`` seconds per step, ``ops`` as
        ``[(name, seconds per step), ...]`` in execution order, and ``source``."""
        return observe.tool("time profiling").profile(self)

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

    def put(self, array, private: bool = False) -> jax.Array:
        """``array`` as a jax.Array on this device (tracers are returned unchanged); a NumPy
        array is copied first unless ``private`` (the caller's own fresh array, which nothing
        else can change)."""
        if isinstance(array, jax.core.Tracer):
            return array
        # Results of ops on this device already live here (committed or not); device_put
        # would cost ~40x the check on every Tensor created.
        if isinstance(array, jax.Array) and array.devices() == {self.jax_device}:
            return array
        if not private and isinstance(array, np.ndarray):
            # jax.device_put may read a NumPy buffer after it returns (the host-to-device copy
            # is asynchronous; on a CPU it may alias the buffer): a Tensor made from an array
            # its caller changes afterwards saw the change in 1 of 3 tries (XLA:CPU). SINGA's
            # Tensors hold copies; the transfer reads a private one.
            array = np.array(array, copy=True)
        return jax.device_put(array, self.jax_device)

    def __repr__(self) -> str:
        return f"Device({self.jax_device.platform}:{self.jax_device.id})"


_devices: Dict[jax.Device, Device] = {}  # one Device (and so one key) per jax.Device
_all: List[Tuple[Device, ...]] = [()]     # the same, as one tuple replaced on each addition
_default: List[Optional[Device]] = [None]
_registry_lock = threading.Lock()         # two threads wrapping one jax.Device get one Device
_strict: List[Optional[bool]] = [None]    # set_strict_devices(); None: follow the environment
_fallback_warned: List[bool] = [False]    # the no-accelerator warning is given once


def _host_index(jd: jax.Device) -> int:
    """The device's index among its host's devices of its kind (0 for the first GPU of every
    process)."""
    index = getattr(jd, "local_hardware_id", None)
    return jd.id if index is None else int(index)


@process_state.register
def _reset_keys() -> None:
    """Every Device's key back to its initial seed (see :mod:`~singa_jax._src.base.process_state`)."""
    for jd, dev in list(_devices.items()):
        dev._key = jax.device_put(jax.random.PRNGKey(_host_index(jd)), jd)


def _wrap(jd: jax.Device) -> Device:
    dev = _devices.get(jd)
    if dev is None:
        with _registry_lock:
            dev = _devices.get(jd)
            if dev is None:
                dev = _devices[jd] = Device(jd)
                _all[0] = tuple(_devices.values())
    return dev


def device_of(array: Any) -> Device:
    """The Device ``array`` lives on: its one jax device's, or the default device for a traced,
    host or multi-device array."""
    if isinstance(array, jax.core.Tracer):
        return get_default_device()
    try:
        devs = array.devices()
    except AttributeError:
        return get_default_device()
    return _wrap(next(iter(devs))) if len(devs) == 1 else get_default_device()


def all_devices() -> Tuple[Device, ...]:
    """Every Device created so far (graph mode threads each one's key). The tuple object stays
    the same until a Device is added, so callers may cache on its identity."""
    return _all[0]


def _platform_devices(platform: str) -> List[jax.Device]:
    """This process's devices of ``platform`` (never another process's)."""
    try:
        return list(jax.local_devices(backend=platform))
    except RuntimeError:
        return []


def _available() -> str:
    try:
        return ", ".join(f"{d.platform}:{d.id}" for d in jax.local_devices())
    except RuntimeError as e:  # pragma: no cover
        return str(e)


def _indexed(found: Sequence[jax.Device], ids: Sequence[int], what: str,
             kind: str) -> List[Device]:
    """The Devices of ``found[i]`` for each i in ``ids``; ValueError naming the missing ones."""
    if any(not 0 <= i < len(found) for i in ids):
        raise ValueError(f"{what}: asked for {kind}(s) {list(ids)} but {len(found)} are present; "
                         f"available devices: {_available()}")
    return [_wrap(found[i]) for i in ids]


def _pick(platform: str, ids: Sequence[int], what: str) -> List[Device]:
    found = _platform_devices(platform)
    if platform == "gpu" and not found:
        found = _platform_devices("cuda") or _platform_devices("rocm")
    return _indexed(found, ids, what, f"{platform} device")


def get_default_device() -> Device:
    """The default device: the first of this process's devices, ``jax.local_devices()[0]`` (an
    accelerator when there is one).

    SINGA's default is the host; XLA's default backend is the fastest one present, which is what a
    SINGA program that never names a device wants. Under several processes each one's default
    is its own first device.
    """
    if _default[0] is None:
        _default[0] = _wrap(jax.local_devices()[0])
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


def set_strict_devices(strict: bool) -> None:
    """``True``: ``create_cuda_gpu*()`` raise when JAX has no accelerator (SINGA's behaviour
    without GPUs); ``False`` (the default, also ``SINGA_JAX_STRICT_DEVICES`` unset or ``0``): they
    fall back to the host's devices with one warning."""
    _strict[0] = bool(strict)


def _strict_devices() -> bool:
    if _strict[0] is not None:
        return _strict[0]
    if os.environ.get(FALLBACK_ENV, "") == "1":
        return False
    return os.environ.get(STRICT_ENV, "") == "1"


def _accelerators() -> List[jax.Device]:
    """This process's GPUs or TPU chips (the default backend's devices unless it is the host)."""
    return [d for d in jax.local_devices() if d.platform != "cpu"]


def _pick_accelerators(ids: Sequence[int], what: str) -> List[Device]:
    """SINGA's GPU ``ids``: the accelerators JAX has; without any (and not strict) the host
    device of each index when there is one, else the default device, with one warning."""
    found = _accelerators()
    if found or _strict_devices():
        return _indexed(found, ids, what, "accelerator (GPU/TPU)")
    if not _fallback_warned[0]:
        _fallback_warned[0] = True
        warnings.warn(f"{what}: JAX has no GPU or TPU; SINGA's GPU devices fall back to the "
                      f"host's (available devices: {_available()}). Call "
                      f"device.set_strict_devices(True) or set {STRICT_ENV}=1 to make this an "
                      f"error.", RuntimeWarning, stacklevel=3)
    host = dict(enumerate(_platform_devices("cpu")))
    return [_wrap(host[i]) if i in host else get_default_device() for i in ids]


def create_cuda_gpu() -> Device:
    """The first accelerator (see :func:`create_cuda_gpu_on`)."""
    return _pick_accelerators([0], "create_cuda_gpu")[0]


def create_cuda_gpus(num: int) -> List[Device]:
    """The first ``num`` accelerators (see :func:`create_cuda_gpu_on`)."""
    return _pick_accelerators(list(range(num)), "create_cuda_gpus")


def create_cuda_gpu_on(device_id: int) -> Device:
    """Accelerator ``device_id`` of this process: a GPU, or a TPU chip on a TPU host. Without
    accelerators: host device ``device_id`` if present, else the default device (one warning;
    an error after ``set_strict_devices(True)``)."""
    return _pick_accelerators([device_id], "create_cuda_gpu_on")[0]


def create_cuda_gpus_on(device_ids: Sequence[int]) -> List[Device]:
    """The accelerators ``device_ids`` (see :func:`create_cuda_gpu_on`)."""
    return _pick_accelerators(list(device_ids), "create_cuda_gpus_on")


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
    """How many accelerators (GPUs or TPU chips) this process has."""
    return len(_accelerators())


def get_gpu_ids() -> List[int]:
    return list(range(get_num_gpus()))


def get_gpu_mem_size(id: int) -> Tuple[int, int]:
    """``(free, total)`` bytes of GPU ``id`` as XLA's allocator reports them (SINGA's pair);
    ``(0, 0)`` when the backend does not report memory statistics."""
    dev = _pick_accelerators([id], "get_gpu_mem_size")[0]
    stats = dev.jax_device.memory_stats() or {}
    total = int(stats.get("bytes_limit", 0))
    return max(total - int(stats.get("bytes_in_use", 0)), 0), total


def device_query(id: int, verbose: bool = False) -> str:
    """A description of GPU ``id``."""
    dev = _pick_accelerators([id], "device_query")[0]
    text = f"{dev.jax_device.device_kind} ({dev})"
    if verbose:
        print(text)
    return text


def enable_lazy_alloc(enable: bool) -> None:
    """SINGA allocates GPU memory lazily on request; XLA always allocates on first use."""


def get_num_opencl_platforms() -> int:
    return 0


def get_num_opencl_devices() -> int:
    return 0


def create_opencl_device() -> Device:
    raise ValueError(f"create_opencl_device: XLA has no OpenCL backend; available devices: "
                     f"{_available()}")

