"""SINGA's ``autograd`` module: the operators that record the creator graph, and the engine
that walks it backward.

``training`` is SINGA's module flag: operators keep what backward needs only while it is True.
It is a view of the scoped training mode (reading gives this thread's mode; assigning sets it),
so ``autograd.training = True`` works as in SINGA while :func:`no_grad`-style scopes stay per
thread. Besides SINGA's operators and layers (``autograd.Linear`` and the rest of SINGA 3.0's
``autograd.Layer`` family) this module holds singa_jax's extensions: PyTorch-style autograd
(:func:`grad`, :func:`no_grad`, ``Tensor.backward``), :class:`autocast` for mixed precision,
the switches of eager replay (:class:`eager_replay`, :class:`replay_speculation`,
:func:`replay_stats`) and :class:`reproducible` (steps whose bits do not depend on what ran
before them, for runs that resume from checkpoints). A custom operator subclasses :class:`Function` (see the guide).
"""
import sys as _sys
from singa_jax._src.autodiff.operator import Operator as Operator, Operation as Operation
from singa_jax._src.autodiff.walk import infer_dependency as infer_dependency
from singa_jax._src.autodiff.backward import gradients as gradients, backward as backward
from singa_jax._src.base.node import Dummy as Dummy
from singa_jax._src.base.modes import (
    fused_backward as fused_backward, is_training as is_training, eager_replay as eager_replay,
    replay_speculation as replay_speculation, reproducible as reproducible,
    no_grad as no_grad, enable_grad as enable_grad,
    set_grad_enabled as set_grad_enabled, is_grad_enabled as is_grad_enabled)
from singa_jax._src.eager.replay import stats as replay_stats
from singa_jax._src.autodiff.function import Function as Function, InvalidInput as InvalidInput
from singa_jax._src.ops.declare import make_function as make_function
from singa_jax._src.ops.helpers import (
    axis_helper as axis_helper, back_broadcast as back_broadcast, ctensor2numpy as ctensor2numpy)
from singa_jax._src.runtime.ctensor import CTensor as CTensor
from singa_jax._src.ops.elementwise import (
    ReLU as ReLU, relu as relu, Identity as Identity, identity as identity, Tanh as Tanh,
    tanh as tanh, Cos as Cos, cos as cos, Cosh as Cosh, cosh as cosh, Acos as Acos, acos as acos,
    Acosh as Acosh, acosh as acosh, Sin as Sin, sin as sin, Sinh as Sinh, sinh as sinh,
    Asin as Asin, asin as asin, Asinh as Asinh, asinh as asinh, Tan as Tan, tan as tan,
    Atan as Atan, atan as atan, Atanh as Atanh, atanh as atanh, Sigmoid as Sigmoid,
    sigmoid as sigmoid, Abs as Abs, abs as abs, Exp as Exp, exp as exp, Log as Log, log as log,
    Sqrt as Sqrt, sqrt as sqrt, Sign as Sign, sign as sign, SoftSign as SoftSign,
    softsign as softsign, SoftPlus as SoftPlus, softplus as softplus, Negative as Negative,
    negative as negative, Reciprocal as Reciprocal, reciprocal as reciprocal, Ceil as Ceil,
    ceil as ceil, Floor as Floor, floor as floor, Round as Round, round as round, Rounde as Rounde,
    rounde as rounde, Erf as Erf, erf as erf, Not as Not, Add as Add, add as add, Sub as Sub,
    sub as sub, Mul as Mul, mul as mul, Div as Div, div as div, Pow as Pow, pow as pow,
    PRelu as PRelu, prelu as prelu, Less as Less, less as less, Greater as Greater,
    greater as greater, Equal as Equal, equal as equal, And as And, Or as Or, Xor as Xor,
    Clip as Clip, clip as clip, Elu as Elu, elu as elu, SeLU as SeLU, selu as selu,
    LeakyRelu as LeakyRelu, leakyrelu as leakyrelu, HardSigmoid as HardSigmoid,
    hardsigmoid as hardsigmoid, SoftMax as SoftMax, softmax as softmax, Cast as Cast,
    Where as Where, where as where, Matmul as Matmul, matmul as matmul, AddBias as AddBias,
    add_bias as add_bias, Gemm as Gemm, gemm as gemm, cast as cast)
from singa_jax._src.ops.shape import (
    shape as shape, Reshape as Reshape, reshape as reshape, Flatten as Flatten, flatten as flatten,
    Transpose as Transpose, transpose as transpose, Unsqueeze as Unsqueeze, unsqueeze as unsqueeze,
    Squeeze as Squeeze, squeeze as squeeze, Concat as Concat, cat as cat, Split as Split,
    split as split, Slice as Slice, slice as slice, Gather as Gather, gather as gather,
    Tile as Tile, tile as tile, Expand as Expand, expand as expand, Pad as Pad, pad as pad,
    UpSample as UpSample, upsample as upsample, DepthToSpace as DepthToSpace,
    depth_to_space as depth_to_space, SpaceToDepth as SpaceToDepth,
    space_to_depth as space_to_depth, ScatterElements as ScatterElements,
    scatter_elements as scatter_elements, OneHot as OneHot, onehot as onehot, Shape as Shape,
    NonZero as NonZero, nonzero as nonzero, ConstantOfShape as ConstantOfShape,
    constant_of_shape as constant_of_shape)
from singa_jax._src.ops.reduce import (
    Sum as Sum, sum as sum, Mean as Mean, mean as mean, Max as Max, max as max, Min as Min,
    min as min, add_all as add_all, ReduceSum as ReduceSum, reduce_sum as reduce_sum,
    ReduceMean as ReduceMean, reduce_mean as reduce_mean)
from singa_jax._src.ops.handles import (
    ConvHandle as ConvHandle, CudnnConvHandle as CudnnConvHandle, PoolingHandle as PoolingHandle,
    CudnnPoolingHandle as CudnnPoolingHandle, BatchNormHandle as BatchNormHandle,
    CudnnBatchNormHandle as CudnnBatchNormHandle, RNNHandle as RNNHandle,
    CudnnRNNHandle as CudnnRNNHandle)
from singa_jax._src.ops.nn import (
    conv2d as conv2d, batchnorm_2d as batchnorm_2d, pooling_2d as pooling_2d,
    GlobalAveragePool as GlobalAveragePool, globalaveragepool as globalaveragepool,
    Dropout as Dropout, dropout as dropout, Embedding as Embedding, embedding as embedding,
    CosSim as CosSim, cossim as cossim, _BatchNorm2d as _BatchNorm2d, _Conv2d as _Conv2d,
    _Pooling2d as _Pooling2d, _RNN as _RNN)
from singa_jax._src.ops.loss import (
    SoftMaxCrossEntropy as SoftMaxCrossEntropy, softmax_cross_entropy as softmax_cross_entropy,
    CrossEntropy as CrossEntropy, cross_entropy as cross_entropy,
    BinaryCrossEntropy as BinaryCrossEntropy, binary_cross_entropy as binary_cross_entropy,
    MeanSquareError as MeanSquareError, mse_loss as mse_loss, RankingLoss as RankingLoss,
    ranking_loss as ranking_loss)
from singa_jax._src.ops.torch_style import grad as grad
from singa_jax._src.autodiff.autocast import autocast as autocast
from singa_jax._src.debug.anomaly import (
    AnomalyError as AnomalyError, detect_anomaly as detect_anomaly,
    is_anomaly_enabled as is_anomaly_enabled)
from singa_jax._src.layers.legacy import (
    AvgPool1d as AvgPool1d, AvgPool2d as AvgPool2d, BatchNorm2d as BatchNorm2d, Conv2d as Conv2d,
    LSTM as LSTM, Layer as Layer, Linear as Linear, MaxPool1d as MaxPool1d, MaxPool2d as MaxPool2d,
    Pooling2d as Pooling2d, RNN as RNN, RNN_Base as RNN_Base, SeparableConv2d as SeparableConv2d)
# SINGA's functional forms of the logical ops, private there too
from singa_jax._src.ops.elementwise import _and as _and, _not as _not, _or as _or, _xor as _xor
from singa_jax._src.base.modes import TrainingFlagModule as _TrainingFlagModule
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Operator", "Operation", "Dummy", "infer_dependency", "gradients", "backward",
    "fused_backward", "is_training", "eager_replay", "replay_speculation", "replay_stats",
    "reproducible",
    "Function", "InvalidInput", "make_function", "CTensor", "axis_helper", "back_broadcast",
    "ctensor2numpy", "ReLU", "relu", "Identity", "identity", "Tanh", "tanh", "Cos", "cos",
    "Cosh", "cosh", "Acos", "acos", "Acosh", "acosh", "Sin", "sin", "Sinh", "sinh", "Asin",
    "asin", "Asinh", "asinh", "Tan", "tan", "Atan", "atan", "Atanh", "atanh", "Sigmoid",
    "sigmoid", "Abs", "abs", "Exp", "exp", "Log", "log", "Sqrt", "sqrt", "Sign", "sign",
    "SoftSign", "softsign", "SoftPlus", "softplus", "Negative", "negative", "Reciprocal",
    "reciprocal", "Ceil", "ceil", "Floor", "floor", "Round", "round", "Rounde", "rounde",
    "Erf", "erf", "Not", "Add", "add", "Sub", "sub", "Mul", "mul", "Div", "div", "Pow", "pow",
    "PRelu", "prelu", "Less", "less", "Greater", "greater", "Equal", "equal", "And", "Or",
    "Xor", "Clip", "clip", "Elu", "elu", "SeLU", "selu", "LeakyRelu", "leakyrelu",
    "HardSigmoid", "hardsigmoid", "SoftMax", "softmax", "Cast", "Where", "where", "Matmul",
    "matmul", "AddBias", "add_bias", "Gemm", "gemm", "shape", "Reshape", "reshape", "Flatten",
    "flatten", "Transpose", "transpose", "Unsqueeze", "unsqueeze", "Squeeze", "squeeze",
    "Concat", "cat", "Split", "split", "Slice", "slice", "Gather", "gather", "Tile", "tile",
    "Expand", "expand", "Pad", "pad", "UpSample", "upsample", "DepthToSpace",
    "depth_to_space", "SpaceToDepth", "space_to_depth", "ScatterElements", "scatter_elements",
    "OneHot", "onehot", "Shape", "NonZero", "nonzero", "ConstantOfShape", "constant_of_shape",
    "Sum", "sum", "Mean", "mean", "Max", "max", "Min", "min", "add_all", "ReduceSum",
    "reduce_sum", "ReduceMean", "reduce_mean", "ConvHandle", "CudnnConvHandle",
    "PoolingHandle", "CudnnPoolingHandle", "BatchNormHandle", "CudnnBatchNormHandle",
    "RNNHandle", "CudnnRNNHandle", "conv2d", "batchnorm_2d", "pooling_2d",
    "GlobalAveragePool", "globalaveragepool", "Dropout", "dropout", "Embedding", "embedding",
    "CosSim", "cossim", "SoftMaxCrossEntropy", "softmax_cross_entropy", "CrossEntropy",
    "cross_entropy", "BinaryCrossEntropy", "binary_cross_entropy", "MeanSquareError",
    "mse_loss", "RankingLoss", "ranking_loss", "grad", "no_grad", "enable_grad",
    "set_grad_enabled", "is_grad_enabled", "autocast", "AvgPool1d", "AvgPool2d",
    "BatchNorm2d", "Conv2d", "LSTM", "Layer", "Linear", "MaxPool1d", "MaxPool2d", "Pooling2d",
    "RNN", "RNN_Base", "SeparableConv2d", "cast", "detect_anomaly", "is_anomaly_enabled",
    "AnomalyError"]

_publish(__name__, __all__)


class _AutogradModule(_TrainingFlagModule):
    """This module's type (``training``: a live view of the scoped training mode)."""


_sys.modules[__name__].__class__ = _AutogradModule
