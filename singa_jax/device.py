"""SINGA's ``device`` module on JAX.

A :class:`Device` is one ``jax.Device`` plus the PRNG key that every random fill and every dropout
mask on that device draws from. Devices come from ``jax.local_devices()`` -- this process's own
devices, so that under several processes (``opt.DistOpt``) every rank creates its Tensors on its
own devices -- and the same program runs on CPU, GPU or TPU. SINGA's graph-buffering switches
(``EnableGraph``, ``RunGraph``, ...) are accepted; whole-step compilation is a
:class:`~singa_jax.model.Model`'s graph mode instead.

SINGA's ``create_cuda_gpu*()`` give the accelerators JAX has (GPUs or TPU chips). On a host
without any they fall back to the host's devices with one warning, so SINGA programs run
unchanged on a laptop; :func:`set_strict_devices` (or ``SINGA_JAX_STRICT_DEVICES=1``) makes
that an error instead.
"""
from singa_jax._src.runtime.device import (
    Device as Device, device_of as device_of, get_default_device as get_default_device,
    set_default_device as set_default_device, create_cpu_device as create_cpu_device,
    create_cpu_devices as create_cpu_devices, create_cuda_gpu as create_cuda_gpu,
    create_cuda_gpus as create_cuda_gpus, create_cuda_gpu_on as create_cuda_gpu_on,
    create_cuda_gpus_on as create_cuda_gpus_on, create_tpu_device as create_tpu_device,
    create_tpu_devices as create_tpu_devices, create_device as create_device,
    get_num_gpus as get_num_gpus, get_gpu_ids as get_gpu_ids, get_gpu_mem_size as get_gpu_mem_size,
    device_query as device_query, enable_lazy_alloc as enable_lazy_alloc,
    get_num_opencl_platforms as get_num_opencl_platforms,
    get_num_opencl_devices as get_num_opencl_devices, create_opencl_device as create_opencl_device,
    all_devices as all_devices, set_strict_devices as set_strict_devices)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Device", "device_of", "get_default_device", "set_default_device", "create_cpu_device",
    "create_cpu_devices", "create_cuda_gpu", "create_cuda_gpus", "create_cuda_gpu_on",
    "create_cuda_gpus_on", "create_tpu_device", "create_tpu_devices", "create_device",
    "get_num_gpus", "get_gpu_ids", "get_gpu_mem_size", "device_query", "enable_lazy_alloc",
    "get_num_opencl_platforms", "get_num_opencl_devices", "create_opencl_device",
    "all_devices", "set_strict_devices"]

_publish(__name__, __all__)


def __getattr__(name: str):
    # SINGA's module attribute ``default_device``, read when asked for: importing this module
    # starts no XLA backend, and the value follows set_default_device
    if name == "default_device":
        return get_default_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
