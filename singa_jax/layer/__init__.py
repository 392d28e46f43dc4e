"""SINGA's ``layer`` module on JAX: ``from singa_jax import layer; layer.Linear(10)``.

:mod:`.base` holds the Layer machinery (lazy initialisation, names, params/states); the layers
are grouped by family in :mod:`.core` (dense and parameter-free), :mod:`.conv` (convolution,
batch-norm, pooling) and :mod:`.rnn` (recurrent).
"""
from .base import Layer, LayerMeta
from .core import (Linear, Gemm, Embedding, ReLU, Sigmoid, Add, Flatten, SoftMaxCrossEntropy,
                   SoftMax, MeanSquareError, CrossEntropy, BinaryCrossEntropy, Dropout, Cat,
                   Reshape)
from .conv import (Conv2d, SeparableConv2d, BatchNorm2d, Pooling2d, MaxPool2d, AvgPool2d,
                   MaxPool1d, AvgPool1d)
from .rnn import RNN_Base, RNN, LSTM, CudnnRNN

__all__ = ["Layer", "LayerMeta",
           # core
           "Linear", "Gemm", "Embedding", "ReLU", "Sigmoid", "Add", "Flatten",
           "SoftMaxCrossEntropy", "SoftMax", "MeanSquareError", "CrossEntropy",
           "BinaryCrossEntropy", "Dropout", "Cat", "Reshape",
           # conv
           "Conv2d", "SeparableConv2d", "BatchNorm2d", "Pooling2d", "MaxPool2d", "AvgPool2d",
           "MaxPool1d", "AvgPool1d",
           # rnn
           "RNN_Base", "RNN", "LSTM", "CudnnRNN"]
