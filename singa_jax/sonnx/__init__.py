"""SINGA's ``sonnx`` module on singa_jax: ONNX export and import.

Needs the optional extra ``pip install 'singa-jax[onnx]'`` (onnx; onnxruntime to check exported
models). Export: :func:`to_onnx` (``SingaFrontend.singa_to_onnx_model``). Import:
:func:`prepare` (``SingaBackend.prepare``) gives a :class:`SingaRep` to ``run``; :class:`SONNXModel`
is a trainable Model around an ONNX graph. See docs/onnx.md.
"""
from __future__ import annotations

import collections

try:
    import onnx
except ImportError as e:  # the extra is optional: say how to get it
    raise ImportError("singa_jax.sonnx needs the 'onnx' package: pip install "
                      "'singa-jax[onnx]'") from e

from .. import device as _device
from .backend import (NP_TYPE_TO_SINGA_SUPPORT_TYPE, GraphOp, GraphProgram, OnnxAttributes,
                      OnnxNode, SingaBackend, SingaRep, onnx_type_to_singa_type)
from .frontend import DEFAULT_OPSET, EXPORTERS, RUNTIME_MAX_OPSET, SingaFrontend
from .ops import OPS, UnsupportedOnnx, op_table_markdown
from .sonnx_model import SONNXModel

__all__ = ["SingaFrontend", "SingaBackend", "SingaRep", "SONNXModel", "OnnxNode",
           "OnnxAttributes", "GraphOp", "GraphProgram", "UnsupportedOnnx", "OPS", "EXPORTERS",
           "DEFAULT_OPSET", "RUNTIME_MAX_OPSET", "NP_TYPE_TO_SINGA_SUPPORT_TYPE",
           "onnx_type_to_singa_type", "op_table_markdown", "OrderedDict", "namedtuple", "cpu_dev",
           "gpu_dev", "prepare", "run_node", "get_op", "to_onnx", "save", "load"]

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
