"""The module-level names of SINGA's ``sonnx``: its devices, made at import as SINGA makes them,
and the entry points it binds from the backend and the frontend."""
from __future__ import annotations

import collections

import onnx

from singa_jax._src.onnx.backend import SingaBackend
from singa_jax._src.onnx.frontend import SingaFrontend
from singa_jax._src.runtime import device as _device

__all__ = ["OrderedDict", "namedtuple", "cpu_dev", "gpu_dev", "prepare", "run_node", "get_op",
           "to_onnx", "save", "load"]

OrderedDict = collections.OrderedDict
namedtuple = collections.namedtuple

#: the host device, and the first GPU when JAX has one (else None), as in SINGA
cpu_dev = _device.create_cpu_device()
gpu_dev = _device.create_cuda_gpu() if _device.get_num_gpus() > 0 else None

prepare = SingaBackend.prepare
run_node = SingaBackend.run_node
get_op = SingaBackend._onnx_node_to_singa_op
to_onnx = SingaFrontend.singa_to_onnx_model
save = onnx.save
load = onnx.load
