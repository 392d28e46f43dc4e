"""SINGA's ``layer`` module on JAX: ``from singa_jax import layer; layer.Linear(10)``.

:class:`Layer` initialises its parameters on its first call, from the input's shape, and
names them and its sublayers after its attributes; the layers are SINGA's dense and
parameter-free layers, convolution, batch normalisation, pooling and the recurrent layers.
"""
from singa_jax._src.layers.base import Layer as Layer, LayerMeta as LayerMeta
from singa_jax._src.layers.core import (
    Linear as Linear, Gemm as Gemm, Embedding as Embedding, ReLU as ReLU, Sigmoid as Sigmoid,
    Add as Add, Flatten as Flatten, SoftMaxCrossEntropy as SoftMaxCrossEntropy, SoftMax as SoftMax,
    MeanSquareError as MeanSquareError, CrossEntropy as CrossEntropy,
    BinaryCrossEntropy as BinaryCrossEntropy, Dropout as Dropout, Cat as Cat, Reshape as Reshape)
from singa_jax._src.layers.conv import (
    Conv2d as Conv2d, SeparableConv2d as SeparableConv2d, BatchNorm2d as BatchNorm2d,
    Pooling2d as Pooling2d, MaxPool2d as MaxPool2d, AvgPool2d as AvgPool2d, MaxPool1d as MaxPool1d,
    AvgPool1d as AvgPool1d)
from singa_jax._src.layers.rnn import (
    RNN_Base as RNN_Base, RNN as RNN, LSTM as LSTM, CudnnRNN as CudnnRNN)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Layer", "LayerMeta", "Linear", "Gemm", "Embedding", "ReLU", "Sigmoid", "Add", "Flatten",
    "SoftMaxCrossEntropy", "SoftMax", "MeanSquareError", "CrossEntropy", "BinaryCrossEntropy",
    "Dropout", "Cat", "Reshape", "Conv2d", "SeparableConv2d", "BatchNorm2d", "Pooling2d",
    "MaxPool2d", "AvgPool2d", "MaxPool1d", "AvgPool1d", "RNN_Base", "RNN", "LSTM", "CudnnRNN"]

_publish(__name__, __all__)
