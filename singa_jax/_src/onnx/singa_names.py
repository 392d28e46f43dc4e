"""SINGA's table of the ONNX operators its backend imports: ``SingaBackend._rename_operators``.

SINGA 5.1's backend maps each ONNX op type it imports to the SINGA operator (an ``autograd``
class name) or layer (``layer.<class>``) that runs it; SINGA's ``test/python/test_onnx_backend.py``
picks onnx's node tests from this table's keys. Here every ONNX op runs through the op table of
:mod:`.catalog` (which covers these and more); the table keeps SINGA's meaning: the
singa_jax operator or layer with the same semantics, each of which exists under that name
(tests/test_sonnx_backend.py checks both).
"""
from __future__ import annotations

from typing import Dict

__all__ = ["RENAME_OPERATORS"]

# ONNX ops whose SINGA operator has the same name
_SAME = (
    'Abs', 'Acos', 'Acosh', 'Add', 'And', 'Asin', 'Asinh', 'Atan', 'Atanh', 'Cast', 'Ceil',
    'Clip', 'Concat', 'ConstantOfShape', 'Cos', 'Cosh', 'DepthToSpace', 'Div', 'Dropout',
    'Elu', 'Equal', 'Erf', 'Expand', 'Flatten', 'Floor', 'Gather', 'GlobalAveragePool',
    'Greater', 'HardSigmoid', 'Identity', 'LeakyRelu', 'Less', 'Log', 'Max', 'Mean', 'Min',
    'Mul', 'NonZero', 'Not', 'OneHot', 'Or', 'PRelu', 'Pad', 'Pow', 'Reciprocal', 'ReduceMean',
    'ReduceSum', 'Reshape', 'ScatterElements', 'Shape', 'Sigmoid', 'Sign', 'Sin', 'Sinh',
    'Slice', 'SpaceToDepth', 'Split', 'Sqrt', 'Squeeze', 'Sub', 'Sum', 'Tan', 'Tanh', 'Tile',
    'Transpose', 'Unsqueeze', 'Where', 'Xor',
)

#: ONNX op type -> SINGA operator (autograd class) or layer ("layer.<class>"), 81 ops
RENAME_OPERATORS: Dict[str, str] = {
    **{name: name for name in _SAME},
    'AveragePool': 'layer.Pooling2d', 'BatchNormalization': 'layer.BatchNorm2d',
    'Conv': 'layer.Conv2d', 'Gemm': 'layer.Gemm', 'MatMul': 'Matmul',
    'MaxPool': 'layer.Pooling2d', 'Neg': 'Negative', 'Relu': 'ReLU', 'Selu': 'SeLU',
    'Softmax': 'SoftMax', 'Softplus': 'SoftPlus', 'Softsign': 'SoftSign',
    'Upsample': 'UpSample',
}
