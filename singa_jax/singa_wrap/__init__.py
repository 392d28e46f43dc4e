"""``singa_wrap``: SINGA's SWIG module (its C++ layer as Python sees it) on JAX.

SINGA's Python code, its tests and its users' custom operators call this layer directly:
``Tensor.data`` is a C++ tensor (here :class:`CTensor`, one mutable handle over a ``jax.Array``),
and ``singa_wrap`` functions (``Add``, ``ReLU``, ``SoftMax``, ``CpuConvForward``, ...) take and
return such tensors. Every function here also accepts plain ``jax.Array``s; ``as_array(x)`` gives
the array behind either. Besides the tensor class, its dtypes and ``VecTensor``: SINGA's free
tensor functions (``core_tensor.i``), the conv/pooling/batch-norm/RNN handle operations, the
build flags with ``Platform`` and ``NcclIdHolder``, and the binary ``Snapshot``.
"""
from singa_jax._src.runtime.ctensor import (
    CTensor as CTensor, Tensor as Tensor, VecTensor as VecTensor, as_array as as_array,
    kFloat32 as kFloat32, kFloat16 as kFloat16, kInt as kInt, kChar as kChar, kDouble as kDouble,
    kUChar as kUChar, kLong as kLong, SizeOf as SizeOf, Product as Product)
from singa_jax._src.swig.tensor_math import (
    Abs as Abs, Ceil as Ceil, Floor as Floor, Round as Round, RoundE as RoundE, Exp as Exp,
    Erf as Erf, Log as Log, ReLU as ReLU, Sigmoid as Sigmoid, Sign as Sign, Sqrt as Sqrt,
    Square as Square, Cos as Cos, Cosh as Cosh, Acos as Acos, Acosh as Acosh, Sin as Sin,
    Sinh as Sinh, Asin as Asin, Asinh as Asinh, Tan as Tan, Tanh as Tanh, Atan as Atan,
    Atanh as Atanh, ReLUBackward as ReLUBackward, Add as Add, Sub as Sub,
    EltwiseMult as EltwiseMult, Div as Div, AddFloat as AddFloat, SubFloat as SubFloat,
    MultFloat as MultFloat, DivFloat as DivFloat, AddFloatWithRet as AddFloatWithRet,
    SubFloatWithRet as SubFloatWithRet, EltwiseMultFloatWithRet as EltwiseMultFloatWithRet,
    DivFloatWithRet as DivFloatWithRet, LTFloat as LTFloat, LEFloat as LEFloat, GTFloat as GTFloat,
    GEFloat as GEFloat, EQFloat as EQFloat, Pow as Pow, PowWithRet as PowWithRet,
    PowFloat as PowFloat, PowFloatWithRet as PowFloatWithRet, Sum as Sum, SumAsFloat as SumAsFloat,
    SumAll as SumAll, Average as Average, SoftMax as SoftMax, SoftMaxBackward as SoftMaxBackward,
    CrossEntropyFwd as CrossEntropyFwd, SoftmaxCrossEntropyBwd as SoftmaxCrossEntropyBwd,
    Reshape as Reshape, Contiguous as Contiguous, Transpose as Transpose,
    DefaultTranspose as DefaultTranspose, ConcatOn as ConcatOn, SliceOn as SliceOn,
    CopyDataToFrom as CopyDataToFrom, Bernoulli as Bernoulli, Gaussian as Gaussian,
    Uniform as Uniform, Axpy as Axpy, Mult as Mult, MultWithRet as MultWithRet,
    MultWithScale as MultWithScale, AddColumn as AddColumn,
    AddColumnWithScale as AddColumnWithScale, AddRow as AddRow, AddRowWithScale as AddRowWithScale,
    SubColumn as SubColumn, SubRow as SubRow, MultColumn as MultColumn, MultRow as MultRow,
    DivColumn as DivColumn, DivRow as DivRow, SumColumns as SumColumns, SumRows as SumRows)
from singa_jax._src.ops.handles import (
    ConvHandle as ConvHandle, CudnnConvHandle as CudnnConvHandle, PoolingHandle as PoolingHandle,
    CudnnPoolingHandle as CudnnPoolingHandle, BatchNormHandle as BatchNormHandle,
    CudnnBatchNormHandle as CudnnBatchNormHandle, CudnnRNNHandle as CudnnRNNHandle)
from singa_jax._src.swig.operations import (
    CpuConvForward as CpuConvForward, CpuConvBackwardx as CpuConvBackwardx,
    CpuConvBackwardW as CpuConvBackwardW, CpuConvBackwardb as CpuConvBackwardb,
    GpuConvForward as GpuConvForward, GpuConvBackwardx as GpuConvBackwardx,
    GpuConvBackwardW as GpuConvBackwardW, GpuConvBackwardb as GpuConvBackwardb,
    CpuPoolingForward as CpuPoolingForward, CpuPoolingBackward as CpuPoolingBackward,
    GpuPoolingForward as GpuPoolingForward, GpuPoolingBackward as GpuPoolingBackward,
    CpuBatchNormForwardTraining as CpuBatchNormForwardTraining,
    CpuBatchNormForwardInference as CpuBatchNormForwardInference,
    CpuBatchNormBackwardx as CpuBatchNormBackwardx,
    GpuBatchNormForwardTraining as GpuBatchNormForwardTraining,
    GpuBatchNormForwardInference as GpuBatchNormForwardInference,
    GpuBatchNormBackward as GpuBatchNormBackward, GpuRNNForwardTraining as GpuRNNForwardTraining,
    GpuRNNForwardInference as GpuRNNForwardInference, GpuRNNBackwardx as GpuRNNBackwardx,
    GpuRNNBackwardW as GpuRNNBackwardW, GpuRNNForwardTrainingEx as GpuRNNForwardTrainingEx,
    GpuRNNForwardInferenceEx as GpuRNNForwardInferenceEx, GpuRNNBackwardxEx as GpuRNNBackwardxEx,
    GpuRNNBackwardWEx as GpuRNNBackwardWEx)
from singa_jax._src.swig.platform import (
    USE_CUDA as USE_CUDA, USE_CUDNN as USE_CUDNN, USE_OPENCL as USE_OPENCL,
    USE_PYTHON as USE_PYTHON, USE_PYTHON3 as USE_PYTHON3, USE_DNNL as USE_DNNL,
    USE_JAVA as USE_JAVA, USE_DIST as USE_DIST, Platform as Platform, NcclIdHolder as NcclIdHolder,
    Communicator as Communicator, InitLogging as InitLogging)
from singa_jax._src.runtime.device import Device as Device
from singa_jax._src.swig.io import Snapshot as Snapshot
# SWIG's names for the C++ operators of Tensor (``singa_wrap.__add__(a, b)``)
from singa_jax._src.swig.tensor_math import (
    __add__ as __add__, __div__ as __div__, __eq__ as __eq__, __ge__ as __ge__, __gt__ as __gt__,
    __le__ as __le__, __lt__ as __lt__, __mul__ as __mul__, __sub__ as __sub__)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "CTensor", "Tensor", "VecTensor", "as_array", "kFloat32", "kFloat16", "kInt", "kChar",
    "kDouble", "kUChar", "kLong", "SizeOf", "Product", "Abs", "Ceil", "Floor", "Round",
    "RoundE", "Exp", "Erf", "Log", "ReLU", "Sigmoid", "Sign", "Sqrt", "Square", "Cos", "Cosh",
    "Acos", "Acosh", "Sin", "Sinh", "Asin", "Asinh", "Tan", "Tanh", "Atan", "Atanh",
    "ReLUBackward", "Add", "Sub", "EltwiseMult", "Div", "AddFloat", "SubFloat", "MultFloat",
    "DivFloat", "AddFloatWithRet", "SubFloatWithRet", "EltwiseMultFloatWithRet",
    "DivFloatWithRet", "LTFloat", "LEFloat", "GTFloat", "GEFloat", "EQFloat", "Pow",
    "PowWithRet", "PowFloat", "PowFloatWithRet", "Sum", "SumAsFloat", "SumAll", "Average",
    "SoftMax", "SoftMaxBackward", "CrossEntropyFwd", "SoftmaxCrossEntropyBwd", "Reshape",
    "Contiguous", "Transpose", "DefaultTranspose", "ConcatOn", "SliceOn", "CopyDataToFrom",
    "Bernoulli", "Gaussian", "Uniform", "Axpy", "Mult", "MultWithRet", "MultWithScale",
    "AddColumn", "AddColumnWithScale", "AddRow", "AddRowWithScale", "SubColumn", "SubRow",
    "MultColumn", "MultRow", "DivColumn", "DivRow", "SumColumns", "SumRows", "ConvHandle",
    "CudnnConvHandle", "PoolingHandle", "CudnnPoolingHandle", "BatchNormHandle",
    "CudnnBatchNormHandle", "CudnnRNNHandle", "CpuConvForward", "CpuConvBackwardx",
    "CpuConvBackwardW", "CpuConvBackwardb", "GpuConvForward", "GpuConvBackwardx",
    "GpuConvBackwardW", "GpuConvBackwardb", "CpuPoolingForward", "CpuPoolingBackward",
    "GpuPoolingForward", "GpuPoolingBackward", "CpuBatchNormForwardTraining",
    "CpuBatchNormForwardInference", "CpuBatchNormBackwardx", "GpuBatchNormForwardTraining",
    "GpuBatchNormForwardInference", "GpuBatchNormBackward", "GpuRNNForwardTraining",
    "GpuRNNForwardInference", "GpuRNNBackwardx", "GpuRNNBackwardW", "GpuRNNForwardTrainingEx",
    "GpuRNNForwardInferenceEx", "GpuRNNBackwardxEx", "GpuRNNBackwardWEx", "USE_CUDA",
    "USE_CUDNN", "USE_OPENCL", "USE_PYTHON", "USE_PYTHON3", "USE_DNNL", "USE_JAVA",
    "USE_DIST", "Device", "Platform", "NcclIdHolder", "Communicator", "InitLogging",
    "Snapshot"]

_publish(__name__, __all__)
