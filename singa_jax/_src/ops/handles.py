"""The handle classes of SINGA's neural-network operators (conv, pooling, batch-norm, RNN):
plain Python objects holding the static configuration SINGA's C++ handles hold, built once per
layer from a sample input. The ``Cudnn*`` names are subclasses that accept the extra cuDNN
arguments, so code written for either backend runs on every XLA device."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence, Tuple

__all__ = ["ConvHandle", "CudnnConvHandle", "PoolingHandle", "CudnnPoolingHandle",
           "BatchNormHandle", "CudnnBatchNormHandle", "RNNHandle", "CudnnRNNHandle"]

Pair = Tuple[int, int]
NO_ODD_PADDING = (0, 0, 0, 0)


def _pair(v: Any, what: str) -> Pair:
    """An (h, w) pair of ints from an int or a length-2 sequence."""
    if hasattr(v, "__index__"):  # int, NumPy int
        return (int(v), int(v))
    v = tuple(int(e) for e in v)
    if len(v) != 2:
        raise ValueError(f"{what}: expected an int or a pair (h, w), got {v}")
    return v


def _shape_of(input: Any, what: str) -> Tuple[int, ...]:
    """Shape of SINGA's handle sample input (a Tensor, a jax array/tracer or a NumPy array)."""
    shape = getattr(input, "shape", None)
    if shape is None:
        raise TypeError(f"{what}: input must be a Tensor or an array, got {type(input).__name__}")
    return tuple(int(s) for s in (shape() if callable(shape) else shape))


def checked_odd_padding(odd_padding: Sequence[int], op: str) -> Tuple[int, int, int, int]:
    pads = tuple(int(p) for p in odd_padding)
    if len(pads) != 4 or min(pads) < 0:
        raise ValueError(f"{op}: odd_padding must be four non-negative ints (top, bottom, left, "
                         f"right), got {tuple(odd_padding)}")
    return pads


# ================================================================================================
# Handles (static configuration)
# ================================================================================================
class ConvHandle:
    """Configuration of a 2-D convolution (SINGA's C++ ``ConvHandle``).

    Args (SINGA's order): input (sample NCHW input, only its shape is read), kernel_size,
    stride, padding (symmetric (h, w) padding), in_channels, out_channels, bias, groups;
    ``dilation`` is an extension (SINGA's layer rejects dilation != 1).
    """

    def __init__(self, input: Any, kernel_size: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], in_channels: int, out_channels: int, bias: bool,
                 groups: int = 1, dilation: Sequence[int] = (1, 1)):
        shape = _shape_of(input, type(self).__name__)
        if len(shape) != 4:
            raise ValueError(f"{type(self).__name__}: input must be NCHW (4-D), got shape {shape}")
        if shape[1] != int(in_channels):
            raise ValueError(f"{type(self).__name__}: the number of input channels mismatched: "
                             f"input shape {shape} vs in_channels={in_channels}")
        self.kernel_h, self.kernel_w = _pair(kernel_size, "ConvHandle kernel_size")
        self.stride_h, self.stride_w = _pair(stride, "ConvHandle stride")
        self.pad_h, self.pad_w = _pair(padding, "ConvHandle padding")
        self.dilation_h, self.dilation_w = _pair(dilation, "ConvHandle dilation")
        self.channels = int(in_channels)
        self.num_filters = int(out_channels)
        self.group = int(groups)
        self.bias_term = bool(bias)
        if self.group < 1 or self.channels % self.group or self.num_filters % self.group:
            raise ValueError(f"{type(self).__name__}: groups={groups} must divide in_channels="
                             f"{in_channels} and out_channels={out_channels}")
        if min(self.stride_h, self.stride_w) < 1:
            raise ValueError(f"{type(self).__name__}: stride must be >= 1, got {stride}")
        self.batchsize, _, self.height, self.width = shape
        ekh = (self.kernel_h - 1) * self.dilation_h + 1
        ekw = (self.kernel_w - 1) * self.dilation_w + 1
        self.conv_height = (self.height + 2 * self.pad_h - ekh) // self.stride_h + 1
        self.conv_width = (self.width + 2 * self.pad_w - ekw) // self.stride_w + 1

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(kernel=({self.kernel_h}, {self.kernel_w}), stride=("
                f"{self.stride_h}, {self.stride_w}), pad=({self.pad_h}, {self.pad_w}), "
                f"channels={self.channels}, num_filters={self.num_filters}, group={self.group}, "
                f"bias={self.bias_term})")


class CudnnConvHandle(ConvHandle):
    """SINGA's GPU conv handle; the cuDNN tuning arguments are accepted and recorded (XLA picks
    the convolution algorithm itself)."""

    def __init__(self, input: Any, kernel_size: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], in_channels: int, out_channels: int, bias: bool,
                 groups: int = 1, workspace_byte_limit: int = 1024 * 1024 * 1024,
                 prefer: str = "fastest", dilation: Sequence[int] = (1, 1)):
        super().__init__(input, kernel_size, stride, padding, in_channels, out_channels, bias,
                         groups, dilation)
        self.workspace_byte_limit = int(workspace_byte_limit)
        self.prefer = prefer


class PoolingHandle:
    """Configuration of 2-D max/average pooling (SINGA's C++ ``PoolingHandle``).

    Args (SINGA's order): input (sample NCHW input), kernel_size, stride, padding, is_max.
    Output size is ``floor((H + 2*pad - kernel) / stride) + 1`` as in SINGA.
    """

    def __init__(self, input: Any, kernel_size: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], is_max: bool = True):
        shape = _shape_of(input, type(self).__name__)
        if len(shape) != 4:
            raise ValueError(f"{type(self).__name__}: input must be NCHW (4-D), got shape {shape}")
        self.kernel_h, self.kernel_w = _pair(kernel_size, "PoolingHandle kernel_size")
        self.stride_h, self.stride_w = _pair(stride, "PoolingHandle stride")
        self.pad_h, self.pad_w = _pair(padding, "PoolingHandle padding")
        if min(self.stride_h, self.stride_w) < 1:
            raise ValueError(f"{type(self).__name__}: stride must be >= 1, got {stride}")
        if self.pad_h >= self.kernel_h or self.pad_w >= self.kernel_w:
            raise ValueError(f"{type(self).__name__}: padding {padding} must be smaller than the "
                             f"kernel {kernel_size}")
        self.is_max_pooling = bool(is_max)
        self.batchsize, self.channels, self.height, self.width = shape
        self.pooled_height = (self.height + 2 * self.pad_h - self.kernel_h) // self.stride_h + 1
        self.pooled_width = (self.width + 2 * self.pad_w - self.kernel_w) // self.stride_w + 1

    def __repr__(self) -> str:
        kind = "max" if self.is_max_pooling else "avg"
        return (f"{type(self).__name__}({kind}, kernel=({self.kernel_h}, {self.kernel_w}), "
                f"stride=({self.stride_h}, {self.stride_w}), pad=({self.pad_h}, {self.pad_w}))")


class CudnnPoolingHandle(PoolingHandle):
    """SINGA's GPU pooling handle (same configuration as :class:`PoolingHandle`)."""


class BatchNormHandle:
    """Configuration of batch normalisation (SINGA's C++ ``BatchNormHandle``).

    Args (SINGA's order): momentum, input (sample (N, C, H, W) or (N, C) input).
    ``factor`` is SINGA's name for the momentum: running = (1 - factor) * running + factor * batch.
    """

    epsilon = 1e-5  # SINGA's (DNNL and cuDNN) epsilon

    def __init__(self, momentum: float, input: Any):
        shape = _shape_of(input, type(self).__name__)
        if len(shape) not in (2, 4):
            raise ValueError(f"{type(self).__name__}: input must be 4-D (N, C, H, W) or 2-D "
                             f"(N, C), got shape {shape}")
        if not 0.0 <= float(momentum) <= 1.0:
            raise ValueError(f"{type(self).__name__}: momentum must be in [0, 1], got {momentum}")
        self.factor = float(momentum)
        self.batchsize, self.channels = shape[0], shape[1]
        self.is_2d = len(shape) == 2
        self.height, self.width = (1, 1) if self.is_2d else shape[2:]

    @property
    def momentum(self) -> float:
        return self.factor

    def __repr__(self) -> str:
        return f"{type(self).__name__}(momentum={self.factor}, channels={self.channels})"


class CudnnBatchNormHandle(BatchNormHandle):
    """SINGA's GPU batch-norm handle (same configuration as :class:`BatchNormHandle`)."""


# cuDNN's RNN modes and the number of gates (linear layers per input/recurrent side) of each.
RNN_MODES = {0: "relu", 1: "tanh", 2: "lstm", 3: "gru"}
RNN_GATES = {0: 1, 1: 1, 2: 4, 3: 3}


@lru_cache(maxsize=None)
def rnn_layout(mode: int, feature_size: int, hidden_size: int, num_layers: int,
                bidirectional: int, bias: int):
    """Offsets of every matrix and bias in cuDNN's packed weight vector.

    Layout (cuDNN's canonical one): pseudo-layers ``layer * directions + direction`` one after
    another; within each, the matrices of linear layers ``0 .. 2G-1`` (``0..G-1`` act on the input,
    ``G..2G-1`` on the hidden state; each (hidden, in) row-major), then their biases (hidden,).
    Returns ``({(lin_layer_id, pseudo_layer, is_bias): (offset, size)}, total_size)``.
    """
    gates, dirs, h = RNN_GATES[mode], 2 if bidirectional else 1, hidden_size
    mapping, offset = {}, 0
    for layer in range(num_layers):
        in_size = feature_size if layer == 0 else h * dirs
        for d in range(dirs):
            pseudo = layer * dirs + d
            for lin in range(2 * gates):
                size = h * (in_size if lin < gates else h)
                mapping[(lin, pseudo, False)] = (offset, size)
                offset += size
            if bias:
                for lin in range(2 * gates):
                    mapping[(lin, pseudo, True)] = (offset, h)
                    offset += h
    return mapping, offset


class RNNHandle:
    """Configuration of a (multi-layer, optionally bidirectional) RNN: SINGA's ``CudnnRNNHandle``.

    Args (SINGA's order): x (sample input (seq, batch, feature)), hidden_size, mode (0: RNN
    relu, 1: RNN tanh, 2: LSTM, 3: GRU), num_layers, bias, dropout (between layers, training
    only), bidirectional. ``weights_size`` is the length of the packed weight vector ``W`` and
    ``weights_mapping`` maps ``(lin_layer_id, pseudo_layer, is_bias)`` to ``(offset, size)``
    in it (cuDNN's layout; see :func:`rnn_layout`).
    """

    def __init__(self, x: Any, hidden_size: int, mode: int = 0, num_layers: int = 1,
                 bias: int = 1, dropout: float = 0.0, bidirectional: int = 0):
        shape = _shape_of(x, type(self).__name__)
        name = type(self).__name__
        if len(shape) != 3:
            raise ValueError(f"{name}: x must be (seq, batch, feature), got shape {shape}")
        if int(mode) not in RNN_MODES:
            raise ValueError(f"{name}: mode must be one of {RNN_MODES}, got {mode}")
        if int(num_layers) < 1 or int(hidden_size) < 1:
            raise ValueError(f"{name}: num_layers and hidden_size must be >= 1, got {num_layers}, "
                             f"{hidden_size}")
        if int(bidirectional) not in (0, 1):
            raise ValueError(f"{name}: bidirectional should be 0 or 1, got {bidirectional}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {dropout}")
        self.seq_length, self.batch_size, self.feature_size = shape
        self.hidden_size = int(hidden_size)
        self.mode = int(mode)
        self.num_layers = int(num_layers)
        self.bias = int(bool(bias))
        self.dropout = float(dropout)
        self.bidirectional = int(bidirectional)
        self.batch_first = 0
        self.weights_mapping, self.weights_size = rnn_layout(
            self.mode, self.feature_size, self.hidden_size, self.num_layers, self.bidirectional,
            self.bias)
        # cuDNN scratch sizes: XLA manages its own scratch memory.
        self.workspace_size = self.reserve_size = 0

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def state_shape(self, batch_size: int) -> Tuple[int, int, int]:
        """Shape of hx/cx/hy/cy: (num_layers * directions, batch, hidden)."""
        return (self.num_layers * self.directions, int(batch_size), self.hidden_size)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({RNN_MODES[self.mode]}, feature={self.feature_size}, "
                f"hidden={self.hidden_size}, layers={self.num_layers}, "
                f"bidirectional={self.bidirectional}, weights_size={self.weights_size})")


CudnnRNNHandle = RNNHandle
