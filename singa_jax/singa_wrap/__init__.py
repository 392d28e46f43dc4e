"""``singa_wrap``: SINGA's SWIG module (its C++ layer as Python sees it) on JAX.

SINGA's Python code, its tests and its users' custom operators call this layer directly:
``Tensor.data`` is a C++ tensor (here :class:`CTensor`, one mutable handle over a ``jax.Array``),
and ``singa_wrap`` functions (``Add``, ``ReLU``, ``SoftMax``, ``CpuConvForward``, ...) take and
return such tensors. Every function here also accepts plain ``jax.Array``s; ``as_array(x)`` gives
the array behind either. Module layout: ``ctensor`` (the tensor class, dtypes, ``VecTensor``),
``functions`` (``core_tensor.i``'s free functions), ``operations`` (conv/pooling/batch-norm/RNN
handles), ``platform`` (build flags, ``Platform``, ``NcclIdHolder``) and ``io`` (``Snapshot``).
"""
from ..ctensor import (CTensor, Tensor, VecTensor, as_array, kFloat32, kFloat16, kInt, kChar,  # noqa: F401
                      kDouble, kUChar, kLong, SizeOf, Product)
from .functions import (  # noqa: F401
    Abs, Ceil, Floor, Round, RoundE, Exp, Erf, Log, ReLU, Sigmoid, Sign, Sqrt, Square, Cos, Cosh,
    Acos, Acosh, Sin, Sinh, Asin, Asinh, Tan, Tanh, Atan, Atanh, ReLUBackward,
    __add__, __sub__, __mul__, __div__, __lt__, __le__, __gt__, __ge__, __eq__,
    Add, Sub, EltwiseMult, Div, AddFloat, SubFloat, MultFloat, DivFloat, AddFloatWithRet,
    SubFloatWithRet, EltwiseMultFloatWithRet, DivFloatWithRet, LTFloat, LEFloat, GTFloat, GEFloat,
    EQFloat, Pow, PowWithRet, PowFloat, PowFloatWithRet,
    Sum, SumAsFloat, SumAll, Average, SoftMax, SoftMaxBackward, CrossEntropyFwd,
    SoftmaxCrossEntropyBwd,
    Reshape, Contiguous, Transpose, DefaultTranspose, ConcatOn, SliceOn, CopyDataToFrom,
    Bernoulli, Gaussian, Uniform,
    Axpy, Mult, MultWithRet, MultWithScale, AddColumn, AddColumnWithScale, AddRow,
    AddRowWithScale, SubColumn, SubRow, MultColumn, MultRow, DivColumn, DivRow, SumColumns,
    SumRows)
from .operations import (  # noqa: F401
    ConvHandle, CudnnConvHandle, PoolingHandle, CudnnPoolingHandle, BatchNormHandle,
    CudnnBatchNormHandle, CudnnRNNHandle,
    CpuConvForward, CpuConvBackwardx, CpuConvBackwardW, CpuConvBackwardb,
    GpuConvForward, GpuConvBackwardx, GpuConvBackwardW, GpuConvBackwardb,
    CpuPoolingForward, CpuPoolingBackward, GpuPoolingForward, GpuPoolingBackward,
    CpuBatchNormForwardTraining, CpuBatchNormForwardInference, CpuBatchNormBackwardx,
    GpuBatchNormForwardTraining, GpuBatchNormForwardInference, GpuBatchNormBackward,
    GpuRNNForwardTraining, GpuRNNForwardInference, GpuRNNBackwardx, GpuRNNBackwardW,
    GpuRNNForwardTrainingEx, GpuRNNForwardInferenceEx, GpuRNNBackwardxEx, GpuRNNBackwardWEx)
from .platform import (USE_CUDA, USE_CUDNN, USE_OPENCL, USE_PYTHON, USE_PYTHON3,  # noqa: F401
                       USE_DNNL, USE_JAVA, USE_DIST, Device, Platform, NcclIdHolder, Communicator,
                       InitLogging)
from .io import Snapshot  # noqa: F401
