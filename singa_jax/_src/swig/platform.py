"""SINGA's build flags, ``Platform``/``Device`` and the distributed-training handles of its SWIG
module (``config.i``, ``core_device.i``, ``dist_communicator.i``), on JAX."""
from __future__ import annotations

import socket
from typing import List, Sequence, Tuple

import jax

from singa_jax._src.runtime import device as _device
from singa_jax._src.runtime.device import Device

__all__ = ["USE_CUDA", "USE_CUDNN", "USE_OPENCL", "USE_PYTHON", "USE_PYTHON3", "USE_DNNL",
           "USE_JAVA", "USE_DIST", "Device", "Platform", "NcclIdHolder", "Communicator",
           "InitLogging"]


def _has_gpu() -> bool:
    """Whether JAX can run on GPUs: a CUDA/ROCm plugin is installed and JAX_PLATFORMS allows it.

    Decided without starting a JAX backend (``opt.DistOpt`` must call
    ``jax.distributed.initialize`` first), like SINGA's build-time switch it stands for."""
    import importlib.util
    platforms = (jax.config.jax_platforms or "").lower()
    if platforms and not any(p in platforms for p in ("cuda", "rocm", "gpu")):
        return False
    return any(importlib.util.find_spec(name) is not None
               for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                            "jax_rocm7_plugin"))


# SINGA's compile-time switches. USE_CUDA/USE_CUDNN say whether a GPU is present (SINGA's tests
# run their GPU cases then); DNNL's CPU kernels (Cpu*Pooling*, Cpu*BatchNorm*) always exist here.
USE_CUDA = _has_gpu()
USE_CUDNN = USE_CUDA
USE_OPENCL = False
USE_PYTHON = True
USE_PYTHON3 = True
USE_DNNL = True
USE_JAVA = False
# Multi-process training (SINGA's NCCL Communicator) is not provided yet: DistOpt's issue turns
# this on when it lands. NcclIdHolder already exists for it.
USE_DIST = False


class Platform:
    """SINGA's ``Platform`` static methods over singa_jax.device."""

    @staticmethod
    def GetDefaultDevice() -> Device:
        return _device.get_default_device()

    @staticmethod
    def GetNumGPUs() -> int:
        return _device.get_num_gpus()

    @staticmethod
    def GetGPUIDs() -> List[int]:
        return _device.get_gpu_ids()

    @staticmethod
    def GetGPUMemSize(device: int) -> Tuple[int, int]:
        return _device.get_gpu_mem_size(device)

    @staticmethod
    def DeviceQuery(id: int, verbose: bool = False) -> str:  # noqa: A002 (SINGA's name)
        return _device.device_query(id, verbose)

    @staticmethod
    def CreateCudaGPUs(num_devices: int, init_size: int = 0) -> List[Device]:
        return _device.create_cuda_gpus(num_devices)

    @staticmethod
    def CreateCudaGPUsOn(devices: Sequence[int], init_size: int = 0) -> List[Device]:
        return _device.create_cuda_gpus_on(devices)

    @staticmethod
    def GetNumOpenclPlatforms() -> int:
        return _device.get_num_opencl_platforms()

    @staticmethod
    def GetNumOpenclDevices() -> int:
        return _device.get_num_opencl_devices()

    @staticmethod
    def GetDefaultOpenclDevice() -> Device:
        return _device.create_opencl_device()


def _free_local_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NcclIdHolder:
    """SINGA's NCCL unique id, made once in the parent process and handed to every worker.

    Here it is the address of a ``jax.distributed`` coordinator on this host
    (``127.0.0.1:<free port>``), chosen at construction without starting any JAX backend; it
    pickles, so ``multiprocessing`` can pass it to the workers, which give ``address`` to
    ``jax.distributed.initialize(coordinator_address=...)``.
    """

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = _free_local_port()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def id(self) -> str:
        """SINGA's field name for the rendezvous token."""
        return self.address

    def __repr__(self) -> str:
        return f"NcclIdHolder({self.address})"


class Communicator:
    """SINGA's NCCL communicator: not provided (``USE_DIST`` is False); data-parallel training
    goes through ``opt.DistOpt``."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "singa_wrap.Communicator: SINGA's NCCL communicator is not provided by singa_jax "
            "(singa_wrap.USE_DIST is False); use singa_jax.opt.DistOpt for data-parallel training")


def InitLogging(argv: str) -> None:
    """SINGA initialises glog here; singa_jax logs through Python's ``logging``/warnings."""
