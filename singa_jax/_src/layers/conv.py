"""Convolution, batch normalisation and pooling layers.

Padding follows SINGA: ``padding`` is an int, ``(pad_h, pad_w)`` (both sides), or
``(top, bottom, left, right)``; the asymmetric part of the latter is kept in ``odd_padding``
``(top, bottom, left, right)`` and applied before the symmetric ``padding``. With
``pad_mode='SAME_UPPER'`` / ``'SAME_LOWER'`` the padding is computed from the input so that
``out = ceil(in / stride)``; an odd total puts the extra row/column at the end (UPPER) or the
beginning (LOWER).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

from singa_jax._src.layers import initializer as init
from singa_jax._src.layers import utils
from singa_jax._src.layers.last_call import one_operator
from singa_jax._src.runtime.device import Device
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.layers.base import Layer, positive_int
from singa_jax._src.ops.handles import (BatchNormHandle, ConvHandle, CudnnBatchNormHandle,
                                        CudnnConvHandle, CudnnPoolingHandle, PoolingHandle)
from singa_jax._src.ops.nn import batchnorm_2d, conv2d, pooling_2d
from singa_jax._src.ops.elementwise import relu

__all__ = ["Conv2d", "SeparableConv2d", "BatchNorm2d", "Pooling2d", "MaxPool2d", "AvgPool2d",
           "MaxPool1d", "AvgPool1d"]

_PAD_MODES = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _pair(layer: str, what: str, value: Any, minimum: Optional[int] = None) -> Tuple[int, int]:
    """``value`` (an int or a pair) as a pair of ints, each at least ``minimum`` when given."""
    if isinstance(value, int):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{layer}: {what} must be an int or a pair of ints, got {value!r}")
    if minimum is not None and min(pair) < minimum:
        raise ValueError(f"{layer}: {what} must be >= {minimum}, got {value!r}")
    return pair


def split_padding(layer: str, padding: Any) -> Tuple[Tuple[int, int], Tuple[int, int, int, int]]:
    """SINGA's ``(padding, odd_padding)`` from an int, a pair or ``(top, bottom, left, right)``."""
    if padding is None:
        return (0, 0), (0, 0, 0, 0)
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        top, bottom, left, right = (int(p) for p in padding)
        odd = (max(top - bottom, 0), max(bottom - top, 0), max(left - right, 0),
               max(right - left, 0))
        return (top - odd[0], left - odd[2]), odd
    if isinstance(padding, (int, tuple, list)):
        return _pair(layer, "padding", padding), (0, 0, 0, 0)
    raise TypeError(f"{layer}: padding must be an int, a pair or 4 ints, got {padding!r}")


def same_padding(pad_mode: str, spatial: Sequence[int], kernel: Sequence[int],
                 stride: Sequence[int]) -> Tuple[Tuple[int, int], Tuple[int, int, int, int]]:
    """``(padding, odd_padding)`` for SAME_UPPER / SAME_LOWER (see utils.get_padding_shape)."""
    pads, odd = utils.get_padding_shape(pad_mode, spatial, kernel, stride)
    return (pads[0], pads[2]), tuple(odd)


def _older_form(layer: str, nb_kernels: Any, kernel_size: Any, args: Tuple, stride: Any,
                padding: Any) -> Tuple[Optional[int], Any, Any, Any, Any]:
    """SINGA's backward-compatible positional form ``(in_channels, nb_kernels, kernel_size,
    stride, padding)``: returns ``(in_channels or None, nb_kernels, kernel_size, stride,
    padding)``."""
    if not args:
        return None, nb_kernels, kernel_size, stride, padding
    if len(args) > 3:
        raise TypeError(f"{layer}: too many positional arguments {args}")
    rest = list(args[1:]) + [stride, padding][len(args) - 1:]
    return (nb_kernels, kernel_size, args[0], rest[0], rest[1])


def _backend(x: Tensor, host_cls: type, accelerator_cls: type) -> type:
    """SINGA's choice of handle class by device (both run the same portable XLA kernel)."""
    return host_cls if x.device.platform == "cpu" else accelerator_cls


class _Windowed(Layer):
    """Shared by Conv2d and Pooling2d: kernel/stride/padding/pad_mode and the op's handle,
    rebuilt whenever the input shape changes."""

    def _set_window(self, kernel_size: Any, stride: Any, padding: Any, pad_mode: str) -> None:
        layer = type(self).__name__
        if pad_mode not in _PAD_MODES:
            raise ValueError(f"{layer}: pad_mode must be one of {_PAD_MODES}, got {pad_mode!r}")
        self.kernel_size = _pair(layer, "kernel_size", kernel_size, minimum=1)
        self.stride = (self.kernel_size if stride is None
                       else _pair(layer, "stride", stride, minimum=1))
        self.padding, self.odd_padding = split_padding(layer, padding)
        if min(self.padding + self.odd_padding) < 0:
            raise ValueError(f"{layer}: padding must be >= 0, got {padding!r}")
        self.pad_mode = pad_mode

    def _check_4d(self, x: Tensor, channels: Optional[int]) -> None:
        if x.ndim() != 4:
            raise self._input_error("4 dimensions (N, C, H, W)", "", x)
        if channels is not None and x.shape[1] != channels:
            raise self._input_error("channels (shape[1])", channels, x)

    def _prepare(self, x: Tensor) -> None:
        """(Re)compute SAME padding and the handle when the input shape changes."""
        if getattr(self, "_handle_shape", None) == x.shape:
            return
        if self.pad_mode in ("SAME_UPPER", "SAME_LOWER"):
            self.padding, self.odd_padding = same_padding(self.pad_mode, x.shape[2:],
                                                          self.kernel_size, self.stride)
        elif self.pad_mode == "VALID":
            self.padding, self.odd_padding = (0, 0), (0, 0, 0, 0)
        self._check_window_fits(x)
        self.handle = self._make_handle(x)
        self._handle_shape = x.shape

    def _check_window_fits(self, x: Tensor) -> None:
        """The (dilated) kernel must fit in the padded input, or the output would be empty."""
        dilation = getattr(self, "dilation", (1, 1))
        top, bottom, left, right = self.odd_padding
        for axis, size, k, d, pad, odd in ((2, x.shape[2], self.kernel_size[0], dilation[0],
                                             self.padding[0], top + bottom),
                                            (3, x.shape[3], self.kernel_size[1], dilation[1],
                                             self.padding[1], left + right)):
            window, padded = d * (k - 1) + 1, size + 2 * pad + odd
            if window > padded:
                dilated = f" (dilation {dilation})" if hasattr(self, "dilation") else ""
                raise ValueError(f"{self._describe()}: kernel_size {self.kernel_size}{dilated} "
                                 f"spans {window} along axis {axis}, more "
                                 f"than the padded input's {padded} (input shape {x.shape}, "
                                 f"padding {self.padding}, odd_padding {self.odd_padding})")

    def _make_handle(self, x: Tensor):
        raise NotImplementedError


@one_operator  # (with activation='RELU' two: such a layer never learns its call)
class Conv2d(_Windowed):
    """2-D convolution (cross-correlation) over NCHW input.

    ``W: (nb_kernels, in_channels / group, kh, kw) ~ N(0, sqrt(2 / (in/group*kh*kw + nb_kernels)))``,
    ``b: (nb_kernels,) = 0``. ``activation='RELU'`` applies a ReLU after the convolution.
    ``Conv2d(in_channels, nb_kernels, kernel_size[, stride[, padding]])`` (the older form) is also
    accepted; ``in_channels`` is then checked against the input.
    """

    _param_attrs = ("W", "b")

    def __init__(self, nb_kernels: int, kernel_size: Any, *args, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, group: int = 1, bias: bool = True,
                 pad_mode: str = "NOTSET", activation: str = "NOTSET", **kwargs):
        super().__init__()
        self.in_channels, nb_kernels, kernel_size, stride, padding = _older_form(
            "Conv2d", nb_kernels, kernel_size, args, stride, padding)
        self.nb_kernels = positive_int("Conv2d", "nb_kernels", nb_kernels)
        self._set_window(kernel_size, stride, padding, pad_mode)
        self.dilation = _pair("Conv2d", "dilation", dilation, minimum=1)
        if group < 1 or nb_kernels % group:
            raise ValueError(f"Conv2d: nb_kernels ({nb_kernels}) must be a multiple of group "
                             f"({group}) and group >= 1")
        self.group = group
        self.bias = bias
        if activation not in ("NOTSET", "RELU"):
            raise ValueError(f"Conv2d: activation must be 'NOTSET' or 'RELU', got {activation!r}")
        self.activation = activation
        self.inner_params = {"cudnn_prefer": "fastest", "workspace_MB_limit": 1024}
        for key, value in kwargs.items():
            if key not in self.inner_params:
                raise TypeError(f"Conv2d: keyword argument not understood: {key!r} (accepted: "
                                f"{sorted(self.inner_params)})")
            self.inner_params[key] = value

    def initialize(self, x: Tensor) -> None:
        self._check_4d(x, self.in_channels)
        self._build(x.shape[1], x.device, x.dtype)

    def _build(self, in_channels: int, device: Device, dtype: Any) -> None:
        if in_channels % self.group:
            raise ValueError(f"{self._describe()}: in_channels ({in_channels}) must be a multiple "
                             f"of group ({self.group})")
        self.in_channels = in_channels
        kh, kw = self.kernel_size
        w_shape = (self.nb_kernels, in_channels // self.group, kh, kw)
        self.W = self._new_param(w_shape, device, dtype)
        init.gaussian_fill(self.W, 0.0, math.sqrt(2.0 / (w_shape[1] * kh * kw + self.nb_kernels)))
        self.b = self._new_param((self.nb_kernels,), device, dtype) if self.bias else None

    def _make_handle(self, x: Tensor):
        handle_cls = _backend(x, ConvHandle, CudnnConvHandle)
        return handle_cls(x.array, self.kernel_size, self.stride, self.padding, self.in_channels,
                          self.nb_kernels, self.bias, self.group, dilation=self.dilation)

    def forward(self, x: Tensor) -> Tensor:
        W, b, shape = self.W, self.b, x.shape
        # the usual call (the input's shape, device and dtype as the last time) in one test
        if not (shape == self.__dict__.get("_handle_shape") and shape[1] == self.in_channels
                and self._on_device_and_dtype_of(x, W, b)):
            self._check_4d(x, self.in_channels)
            self.device_check(x, W, b)  # both skip b = None (bias=False)
            self.dtype_check(x, W, b)
            self._prepare(x)
        y = conv2d(self.handle, x, W, b, self.odd_padding)
        if self.activation == "RELU":
            y = relu(y)
        return y


class SeparableConv2d(Layer):
    """A depthwise convolution (``group = in_channels``) followed by a 1x1 pointwise one;
    sublayers ``depthwise_conv`` and ``point_conv``."""

    def __init__(self, nb_kernels: int, kernel_size: Any, *args, stride: Any = 1,
                 padding: Any = 0, bias: bool = False):
        super().__init__()
        self.in_channels, nb_kernels, kernel_size, stride, padding = _older_form(
            "SeparableConv2d", nb_kernels, kernel_size, args, stride, padding)
        self.nb_kernels = nb_kernels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.bias = bias

    def initialize(self, x: Tensor) -> None:
        if self.in_channels is not None and x.shape[1] != self.in_channels:
            raise self._input_error("channels (shape[1])", self.in_channels, x)
        self._make_convs(x.shape[1])

    def _make_convs(self, in_channels: int) -> None:
        self.in_channels = in_channels
        self.depthwise_conv = Conv2d(in_channels, self.kernel_size, stride=self.stride,
                                     padding=self.padding, group=in_channels, bias=self.bias)
        self.point_conv = Conv2d(self.nb_kernels, 1, bias=self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.point_conv(self.depthwise_conv(x))


@one_operator
class BatchNorm2d(Layer):
    """Batch normalisation over axis 1: ``y = scale * (x - mean) / sqrt(var + eps) + bias``.

    While ``autograd.training`` it normalises with the batch statistics and updates
    ``running = (1 - momentum) * running + momentum * batch`` (SINGA/cuDNN's convention, unbiased
    batch variance); otherwise it uses ``running_mean`` / ``running_var``. Parameters ``scale``
    (ones) and ``bias`` (zeros); states ``running_mean`` (zeros) and ``running_var`` (ones).
    """

    _param_attrs = ("scale", "bias")
    _state_attrs = ("running_mean", "running_var")

    def __init__(self, *args, momentum: float = 0.9):
        super().__init__()
        self.channels = positive_int("BatchNorm2d", "channels", args[0]) if args else None
        if len(args) > 1:
            momentum = args[1]
        if not 0 <= momentum <= 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be in [0, 1], got {momentum}")
        self.momentum = momentum

    def initialize(self, x: Tensor) -> None:
        self._check_input(x)
        self._build(x.shape[1], x.device, x.dtype)

    def _build(self, channels: int, device: Device, dtype: Any) -> None:
        self.channels = channels
        shape = (channels,)
        self.scale = init.constant_fill(self._new_param(shape, device, dtype), 1.0)
        self.bias = self._new_param(shape, device, dtype)
        self.running_mean = self._new_param(shape, device, dtype, trainable=False)
        self.running_var = init.constant_fill(
            self._new_param(shape, device, dtype, trainable=False), 1.0)

    def _check_input(self, x: Tensor) -> None:
        if x.ndim() not in (2, 4):
            raise self._input_error("2 or 4 dimensions (N, C[, H, W])", "", x)
        if self.channels is not None and x.shape[1] != self.channels:
            raise self._input_error("channels (shape[1])", self.channels, x)

    def forward(self, x: Tensor) -> Tensor:
        tensors = (self.scale, self.bias, self.running_mean, self.running_var)
        shape = x.shape
        # the usual call (the input's shape, device and dtype as the last time) in one test
        if not (shape == self.__dict__.get("_handle_shape") and shape[1] == self.channels
                and self._on_device_and_dtype_of(x, *tensors)):
            self._check_input(x)
            self.device_check(x, *tensors)  # both change the tensors in place
            self.dtype_check(x, *tensors)
            if getattr(self, "_handle_shape", None) != shape:
                handle_cls = _backend(x, BatchNormHandle, CudnnBatchNormHandle)
                self.handle = handle_cls(self.momentum, x.array)
                self._handle_shape = shape
        return batchnorm_2d(self.handle, x, *tensors)


class Pooling2d(_Windowed):
    """Max (``is_max``) or average pooling over NCHW input; ``stride`` defaults to the kernel
    size. Average pooling divides by the number of non-padding elements in each window."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, is_max: bool = True,
                 pad_mode: str = "NOTSET"):
        super().__init__()
        self._set_window(kernel_size, stride, padding, pad_mode)
        self.is_max = is_max

    def initialize(self, x: Tensor) -> None:
        self._check_4d(x, None)

    def _make_handle(self, x: Tensor):
        handle_cls = _backend(x, PoolingHandle, CudnnPoolingHandle)
        return handle_cls(x.array, self.kernel_size, self.stride, self.padding, self.is_max)

    def forward(self, x: Tensor) -> Tensor:
        self._check_4d(x, None)
        self._prepare(x)
        return pooling_2d(self.handle, x, self.odd_padding)


def _make_pool(name: str, is_max: bool, one_d: bool) -> type:
    """MaxPool2d / AvgPool2d / MaxPool1d / AvgPool1d: Pooling2d with ``is_max`` fixed; the 1-D
    ones pool along the last axis of ``(N, C, 1, W)`` input."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 pad_mode: str = "NOTSET"):
        if one_d:
            stride = kernel_size if stride is None else stride
            kernel_size, stride, padding = (1, kernel_size), (1, stride), (0, padding)
        Pooling2d.__init__(self, kernel_size, stride, padding, is_max, pad_mode)

    kind = "Max" if is_max else "Average"
    dims = "1-D (along W of (N, C, 1, W) input)" if one_d else "2-D"
    return type(name, (Pooling2d,), {"__init__": __init__, "__module__": __name__,
                                     "__doc__": f"{kind} pooling, {dims}."})


MaxPool2d = _make_pool("MaxPool2d", True, False)
AvgPool2d = _make_pool("AvgPool2d", False, False)
MaxPool1d = _make_pool("MaxPool1d", True, True)
AvgPool1d = _make_pool("AvgPool1d", False, True)
