"""SINGA's ``sonnx`` module on singa_jax: ONNX export and import.

Needs the optional extra ``pip install 'singa-jax[onnx]'`` (onnx; onnxruntime to check exported
models). Export: :func:`to_onnx` (``SingaFrontend.singa_to_onnx_model``). Import:
:func:`prepare` (``SingaBackend.prepare``) gives a :class:`SingaRep` to ``run``; :class:`SONNXModel`
is a trainable Model around an ONNX graph. See docs/onnx.md.
"""
from singa_jax._src.onnx.frontend import (
    SingaFrontend as SingaFrontend, EXPORTERS as EXPORTERS, DEFAULT_OPSET as DEFAULT_OPSET,
    RUNTIME_MAX_OPSET as RUNTIME_MAX_OPSET)
from singa_jax._src.onnx.backend import (
    SingaBackend as SingaBackend, SingaRep as SingaRep, GraphOp as GraphOp,
    NP_TYPE_TO_SINGA_SUPPORT_TYPE as NP_TYPE_TO_SINGA_SUPPORT_TYPE,
    onnx_type_to_singa_type as onnx_type_to_singa_type)
from singa_jax._src.onnx.sonnx_model import SONNXModel as SONNXModel
from singa_jax._src.onnx.program import (
    OnnxNode as OnnxNode, OnnxAttributes as OnnxAttributes, GraphProgram as GraphProgram)
from singa_jax._src.onnx.registry import UnsupportedOnnx as UnsupportedOnnx, OPS as OPS
from singa_jax._src.onnx.catalog import op_table_markdown as op_table_markdown
from singa_jax._src.onnx.api import (
    OrderedDict as OrderedDict, namedtuple as namedtuple, cpu_dev as cpu_dev, gpu_dev as gpu_dev,
    prepare as prepare, run_node as run_node, get_op as get_op, to_onnx as to_onnx, save as save,
    load as load)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "SingaFrontend", "SingaBackend", "SingaRep", "SONNXModel", "OnnxNode", "OnnxAttributes",
    "GraphOp", "GraphProgram", "UnsupportedOnnx", "OPS", "EXPORTERS", "DEFAULT_OPSET",
    "RUNTIME_MAX_OPSET", "NP_TYPE_TO_SINGA_SUPPORT_TYPE", "onnx_type_to_singa_type",
    "op_table_markdown", "OrderedDict", "namedtuple", "cpu_dev", "gpu_dev", "prepare",
    "run_node", "get_op", "to_onnx", "save", "load"]

_publish(__name__, __all__)
