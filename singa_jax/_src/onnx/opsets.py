"""ONNX operator-set versions: the opsets the exporter writes, the IR version each needs, and
the default opset a model imports."""
from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from singa_jax._src.onnx.registry import UnsupportedOnnx

__all__ = ["RUNTIME_MAX_OPSET", "DEFAULT_OPSET", "MIN_OPSET", "ir_version_for",
           "make_model_at_opset", "default_opset"]

#: The newest opset (21, ONNX IR version 10) that onnxruntime 1.18 -- the floor of the ``onnx``
#: extra -- loads. An export at onnx's newest opset carries onnx's newest IR version (14 with
#: onnx 1.23), which an older onnxruntime refuses ("Unsupported model IR version").
RUNTIME_MAX_OPSET = 21
#: the default export opset: RUNTIME_MAX_OPSET, or onnx's newest when that is older (onnx 1.16,
#: the extra's floor, defines 21); ``opset_version=`` asks for another
DEFAULT_OPSET = min(onnx.defs.onnx_opset_version(), RUNTIME_MAX_OPSET)
MIN_OPSET = 11  # SINGA's


def ir_version_for(opset: int) -> int:
    """The ONNX IR version a model importing the default domain at ``opset`` needs (the oldest
    that defines it: 10 for opset 21), not onnx's newest -- so that a runtime which reads that
    opset also loads the file."""
    return helper.find_min_ir_version_for([helper.make_opsetid("", opset)])


def make_model_at_opset(graph: onnx.GraphProto, opset: int, **kwargs: Any) -> onnx.ModelProto:
    """``helper.make_model`` importing the default domain at ``opset``, with the IR version that
    opset needs (``helper.make_model`` alone writes onnx's newest)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kwargs)
    model.ir_version = ir_version_for(opset)
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default ONNX operator set ``model`` imports."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise UnsupportedOnnx("the model imports no version of the default ONNX operator set")
