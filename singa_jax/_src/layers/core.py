"""Dense layers (Linear, Gemm, Embedding) and the parameter-free layers, made one per line by
``_make_stateless``: each wraps one function of :mod:`singa_jax.autograd`."""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from singa_jax._src.layers import initializer as init
from singa_jax._src.runtime.device import Device, get_default_device
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.layers.base import Layer, positive_int
from singa_jax._src.layers.last_call import one_operator
from singa_jax._src.ops.elementwise import add, add_bias, gemm, matmul, relu, sigmoid, softmax
from singa_jax._src.ops.loss import (binary_cross_entropy, cross_entropy, mse_loss,
                                     softmax_cross_entropy)
from singa_jax._src.ops.nn import dropout, embedding
from singa_jax._src.ops.shape import cat, flatten, reshape

__all__ = ["Linear", "Gemm", "Embedding", "ReLU", "Sigmoid", "Add", "Flatten",
           "SoftMaxCrossEntropy", "SoftMax", "MeanSquareError", "CrossEntropy",
           "BinaryCrossEntropy", "Dropout", "Cat", "Reshape"]


class Linear(Layer):
    """``y = x W + b`` with ``W: (in_features, out_features)``, ``b: (out_features,)``.

    ``Linear(out_features)`` infers ``in_features`` from the first input; the older
    ``Linear(in_features, out_features[, bias])`` form is also accepted (and then checked).
    ``W ~ N(0, sqrt(2 / (in + out)))``, ``b = 0``.
    """

    _param_attrs = ("W", "b")

    def __init__(self, out_features: int, *args, bias: bool = True, **kwargs):
        super().__init__()
        self.out_features = positive_int("Linear", "out_features", out_features)
        self.in_features = None
        if len(args) > 0:  # Linear(in_features, out_features[, bias])
            self.in_features = self.out_features
            self.out_features = positive_int("Linear", "out_features", args[0])
        self.bias = args[1] if len(args) > 1 else bias

    def initialize(self, x: Tensor) -> None:
        if self.in_features is not None and x.shape[-1] != self.in_features:
            raise self._input_error("in_features (last axis)", self.in_features, x)
        self._build(x.shape[-1], x.device, x.dtype)

    def _build(self, in_features: int, device: Device, dtype: Any) -> None:
        self.in_features = in_features
        self.W = self._new_param((in_features, self.out_features), device, dtype)
        init.gaussian_fill(self.W, 0.0, math.sqrt(2.0 / (in_features + self.out_features)))
        self.b = self._new_param((self.out_features,), device, dtype) if self.bias else None

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x, self.W, self.b)  # both skip b = None (bias=False)
        self.dtype_check(x, self.W, self.b)
        if x.ndim() < 2 or x.shape[-1] != self.W.shape[0]:
            raise self._input_error("in_features (last axis)", self.W.shape[0], x)
        y = matmul(x, self.W)
        if self.bias:
            y = add_bias(y, self.b, axis=0)
        return y


class Gemm(Layer):
    """``Y = alpha * A' B' + beta * C`` (ONNX Gemm) with the input as ``A``, the weight ``W`` as
    ``B`` (``(nb_kernels, in)`` when ``transB``, else ``(in, nb_kernels)``) and the bias as ``C``
    (``bias_shape`` or ``(1, nb_kernels)``). ``W ~ N(0, sqrt(2 / (in + nb_kernels)))``."""

    _param_attrs = ("W", "b")

    def __init__(self, nb_kernels: int, alpha: float = 1.0, beta: float = 1.0,
                 transA: bool = False, transB: bool = True, bias: bool = True,
                 bias_shape: Optional[Sequence[int]] = None):
        super().__init__()
        self.nb_kernels = positive_int("Gemm", "nb_kernels", nb_kernels)
        self.alpha = alpha
        self.beta = beta
        self.transA = 1 if transA else 0
        self.transB = 1 if transB else 0
        self.bias = bias
        self.bias_shape = bias_shape

    def _in_features(self, x: Tensor) -> int:
        return x.shape[0] if self.transA else x.shape[-1]

    def initialize(self, x: Tensor) -> None:
        self.in_features = self._in_features(x)
        w_shape = ((self.nb_kernels, self.in_features) if self.transB
                   else (self.in_features, self.nb_kernels))
        self.W = self._new_param(w_shape, x.device, x.dtype)
        init.gaussian_fill(self.W, 0.0, math.sqrt(2.0 / (self.in_features + self.nb_kernels)))
        b_shape = tuple(self.bias_shape) if self.bias_shape else (1, self.nb_kernels)
        self.b = self._new_param(b_shape, x.device, x.dtype) if self.bias else None

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x, self.W, self.b)
        w_in = self.W.shape[-1] if self.transB else self.W.shape[0]
        if x.ndim() != 2 or self._in_features(x) != w_in:
            axis = "shape[0] (transA)" if self.transA else "shape[1]"
            raise self._input_error(f"in_features {axis}", w_in, x)
        return gemm(x, self.W, self.b, self.alpha, self.beta, self.transA, self.transB)


class Embedding(Layer):
    """Look-up table ``W: (input_dim, output_dim)``; ``y[..., :] = W[x[...]]``.
    ``W ~ U(-1, 1)`` for ``initializer='uniform'``, else ``N(0, 1)``."""

    _param_attrs = ("W",)

    def __init__(self, input_dim: int, output_dim: int, initializer: str = "gaussian"):
        super().__init__()
        self.input_dim = positive_int("Embedding", "input_dim", input_dim)
        self.output_dim = positive_int("Embedding", "output_dim", output_dim)
        self.initializer = initializer

    def initialize(self, x: Tensor) -> None:
        self._build(x.device)

    def _build(self, device: Device) -> None:
        self.W = self._new_param((self.input_dim, self.output_dim), device)
        if self.initializer == "uniform":
            init.uniform_fill(self.W, -1.0, 1.0)
        else:
            init.gaussian_fill(self.W, 0.0, 1.0)

    def from_pretrained(self, W: Any, freeze: bool = True) -> None:
        """Use the table ``W`` (a Tensor or array of shape ``(input_dim, output_dim)``); with
        ``freeze`` it is no longer trained."""
        if not self._initialized:
            device = W.device if isinstance(W, Tensor) else None
            self._build(device if device is not None else get_default_device())
            self._initialized = True
        self.set_params({self.W.name: W})
        self.W.requires_grad = not freeze
        self.W.stores_grad = not freeze

    def forward(self, x: Tensor) -> Tensor:
        self.device_check(x, self.W)
        return embedding(x, self.W)


def _make_stateless(name: str, fn: Callable, inputs: Tuple[str, ...], options: Dict[str, Any],
                    doc: str) -> type:
    """A Layer class whose forward is the autograd function ``fn(*inputs, *options)``."""
    P = inspect.Parameter

    def __init__(self, *args, **kwargs):
        Layer.__init__(self)
        bound = init_sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for opt in options:
            setattr(self, opt, bound.arguments[opt])

    def forward(self, *args):
        if len(args) != len(inputs):
            raise TypeError(f"{self._describe()}.forward takes inputs {list(inputs)}, got "
                            f"{len(args)} argument(s)")
        if not options:
            return fn(*args)
        # options go by keyword: autograd.dropout(x, seed, ratio) takes ratio second
        return fn(*args, **{opt: getattr(self, opt) for opt in options})

    self_param = P("self", P.POSITIONAL_OR_KEYWORD)
    init_sig = inspect.Signature([self_param] + [P(o, P.POSITIONAL_OR_KEYWORD, default=d)
                                                 for o, d in options.items()])
    __init__.__signature__ = init_sig
    forward.__signature__ = inspect.Signature(
        [self_param] + [P(i, P.POSITIONAL_OR_KEYWORD) for i in inputs])
    forward.__name__ = "forward"
    opts = ", ".join(f"{o}={d!r}" for o, d in options.items())
    cls = type(name, (Layer,), {
        "__init__": __init__, "forward": forward, "__module__": __name__,
        "__doc__": f"{name}({opts}): {doc} (``autograd.{fn.__name__}``).",
    })
    return cls


# --- parameter-free layers, one autograd function each --------------------------------------
ReLU = _make_stateless("ReLU", relu, ("x",), {}, "``max(x, 0)``")
Sigmoid = _make_stateless("Sigmoid", sigmoid, ("x",), {}, "``1 / (1 + exp(-x))``")
Add = _make_stateless("Add", add, ("a", "b"), {}, "``a + b``")
for _one in (ReLU, Sigmoid, Add):  # (one operator of a table's kind per call: see last_call)
    one_operator(_one)
del _one
Flatten = _make_stateless("Flatten", flatten, ("x",), {"axis": 1},
                          "reshape to 2-D: axes before ``axis`` form the rows")
SoftMaxCrossEntropy = _make_stateless(
    "SoftMaxCrossEntropy", softmax_cross_entropy, ("x", "t"), {},
    "mean cross-entropy of ``softmax(x)`` against labels or one-hot ``t``")
SoftMax = _make_stateless("SoftMax", softmax, ("x",), {}, "softmax along axis 1")
MeanSquareError = _make_stateless("MeanSquareError", mse_loss, ("x", "t"), {},
                                  "mean squared error (SINGA's ``mse_loss``)")
CrossEntropy = _make_stateless("CrossEntropy", cross_entropy, ("x", "t"), {},
                               "cross-entropy of probabilities ``x``")
BinaryCrossEntropy = _make_stateless("BinaryCrossEntropy", binary_cross_entropy, ("x", "t"), {},
                                     "binary cross-entropy of probabilities ``x``")
Dropout = _make_stateless(
    "Dropout", dropout, ("x",), {"ratio": 0.5},
    "zero each element with probability ``ratio`` and scale the rest by ``1 / (1 - ratio)`` "
    "while ``autograd.training``; identity otherwise")
Cat = _make_stateless("Cat", cat, ("xs",), {"axis": 0},
                      "concatenate the list ``xs`` along ``axis``")
Reshape = _make_stateless("Reshape", reshape, ("x", "shape"), {}, "reshape ``x`` to ``shape``")
