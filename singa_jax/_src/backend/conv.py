"""How 2-D convolutions run on XLA:CPU: per shape and per direction, XLA's convolution or the
same sum written as slices and a matrix product.

XLA:CPU runs a convolution as an Eigen kernel that is good at wide 3x3 layers and poor at some
shapes every CNN has (docs/performance.md has the measurements, batch 64/8):

* a 1x1 kernel, above all a strided one: it is a matrix product over channels, and as a
  product it runs in half the time, in each direction (ResNet's projections: 30 -> 15 ms forward,
  35 -> 13 ms weight gradient);
  over many pixels that product is taken per sample, ``y[n] = W @ x[n]``, in NCHW's own order:
  the im2col product transposes the activations, and XLA:CPU's transposing copies cost more than
  the product (ResNet's 56x56 layer 256 -> 64: 32 -> 15 ms forward and backward);
* one input channel (LeNet's first layer): the contraction is the 25 taps of the window, and
  patches times the kernel take 0.9 ms where the convolution takes 2.8-5 ms;
* the input gradient of a layer whose output is much smaller than its input (LeNet's second
  layer, 12x12 -> 8x8) or whose input has few channels: XLA computes it as a convolution over the
  zero-padded gradient (2.25x the useful work for LeNet's conv2), 7.1 ms where scattering the
  patches' gradients back takes 3.9 ms.

Every form computes y[n, o, h, w] = sum_{c, i, j} W[o, c, i, j] * xpad[n, c, s*h + d*i, s*w + d*j];
they differ only in summation order. The forward, the input gradient and the weight gradient
each pick their form from the shapes (``forward_as_matmul``, ``input_grad_as_matmul``,
``weight_grad_as_matmul``): LeNet's conv2, say, runs forward and weight gradient as XLA
convolutions and its input gradient as a product.

Depthwise convolutions (one input channel per group) are a sum of shifted slices scaled per
channel: XLA:CPU's ``feature_group_count == channels`` path, and above all its weight gradient,
is 5-10x slower (a 3x3 depthwise forward+backward on 8x128x147x147: 3.4 s grouped, 0.64 s as
slices).

:func:`conv` is the convolution of every backend: the forms are chosen by
``lax.platform_dependent`` when a program is lowered for its device, so GPU and TPU keep their own
kernels whatever the default backend.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Tuple

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["conv", "convolve", "xla_conv"]

Pair = Tuple[int, int]
Pads = Tuple[Tuple[int, int], Tuple[int, int]]
Shape = Tuple[int, ...]
_DIMENSIONS = ("NCHW", "OIHW", "NCHW")


def convolve(x, W, stride: Pair, pads: Pads, dilation: Pair, group: int):
    """:func:`conv` with its static arguments made hashable tuples."""
    return conv(x, W, tuple(stride), (tuple(pads[0]), tuple(pads[1])), tuple(dilation), group)


def xla_conv(x, W, stride: Pair, pads: Pads, dilation: Pair, group: int = 1):
    """XLA's own convolution."""
    return lax.conv_general_dilated(x, W, window_strides=stride, padding=pads,
                                    rhs_dilation=dilation, dimension_numbers=_DIMENSIONS,
                                    feature_group_count=group)


# --- the matrix-product forms ----------------------------------------------------------------
def _out_hw(x_shape: Shape, kernel: Pair, stride: Pair, pads: Pads, dilation: Pair) -> Pair:
    """The output's (height, width)."""
    return tuple((x_shape[2 + i] + sum(pads[i]) - dilation[i] * (kernel[i] - 1) - 1)
                 // stride[i] + 1 for i in range(2))


def _windows(x, kernel: Pair, stride: Pair, pads: Pads, dilation: Pair) -> list:
    """The kh*kw strided slices of the padded ``x`` that window tap (i, j) reads:
    ``[xpad[:, :, d*i::s, d*j::s] cut to the output's size, ...]`` in row-major tap order."""
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho, wo = _out_hw(x.shape, kernel, stride, pads, dilation)
    if any(p for pair in pads for p in pair):
        x = jnp.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    return [lax.slice(x, (0, 0, i * dh, j * dw),
                      (n, c, i * dh + sh * (ho - 1) + 1, j * dw + sw * (wo - 1) + 1),
                      (1, 1, sh, sw))
            for i in range(kh) for j in range(kw)]


def _patches(x, kernel: Pair, stride: Pair, pads: Pads, dilation: Pair):
    """The input's windows stacked by tap: (N, C, kh*kw, Ho, Wo) (for a 1x1 kernel a unit axis,
    which XLA drops: the product is then one over channels)."""
    return jnp.stack(_windows(x, kernel, stride, pads, dilation), axis=2)


def matmul_conv(x, W, stride: Pair, pads: Pads, dilation: Pair):
    """The convolution as one matrix product of the input's windows (N, C, kh*kw, Ho, Wo) with
    the kernel (O, C, kh*kw): im2col, without materialising more than the windows."""
    o, c, kh, kw = W.shape
    return jnp.einsum("nckhw,ock->nohw", _patches(x, (kh, kw), stride, pads, dilation),
                      W.reshape(o, c, kh * kw))


def per_sample_product(x, W, stride: Pair, pads: Pads):
    """A 1x1 convolution as one matrix product per sample, ``y[n] = W @ x[n]`` over
    (C, H*W): NCHW's own order, so neither the activations nor their gradients are transposed
    (the im2col product above transposes them: XLA:CPU's transposing copies were 0.9 s of
    ResNet-50's 2.3 s step at batch 8); the kernel is broadcast over the batch instead."""
    (x,) = _windows(x, (1, 1), stride, pads, (1, 1))  # the one tap: padded, strided
    n, c, h, w = x.shape
    o = W.shape[0]
    kernels = jnp.broadcast_to(W.reshape(o, c), (n, o, c))
    y = lax.dot_general(kernels, x.reshape(n, c, h * w), (((2,), (1,)), ((0,), (0,))))
    return y.reshape(n, o, h, w)


# --- which form, per direction ---------------------------------------------------------------
def as_per_sample_product(W_shape: Shape, out_hw: Pair) -> bool:
    """A 1x1 kernel over many output pixels, ``3*o*c <= pixels*(o + c)``: broadcasting the
    kernel over the batch then costs less than transposing the activations (ResNet's 56x56 and
    28x28 layers, Xception's 1x1 layers down to 38x38; not ResNet's 14x14 and 7x7 ones, where
    one product per sample is too small and the broadcast kernel too big)."""
    o, c = W_shape[:2]
    return _is_1x1(W_shape) and 3 * o * c <= out_hw[0] * out_hw[1] * (o + c)


def _is_1x1(W_shape: Shape) -> bool:
    return tuple(W_shape[2:]) == (1, 1)


def forward_as_matmul(x_shape: Shape, W_shape: Shape) -> bool:
    """A 1x1 kernel, or a single input channel (the window's taps are the only contraction)."""
    return _is_1x1(W_shape) or x_shape[1] == 1


def input_grad_as_matmul(x_shape: Shape, W_shape: Shape, out_hw: Pair, stride: Pair) -> bool:
    """A 1x1 kernel; an input of at most 4 channels (XLA's transposed convolution then has a
    tiny output depth); or a stride-1 layer whose input has at least twice the output's pixels
    (XLA convolves the zero-padded gradient: the padding is over half its work). Strided 3x3
    layers keep XLA's transposed convolution (2.5x faster than scattering windows there)."""
    if _is_1x1(W_shape) or x_shape[1] <= 4:
        return True
    return tuple(stride) == (1, 1) and x_shape[2] * x_shape[3] >= 2 * out_hw[0] * out_hw[1]


def weight_grad_as_matmul(W_shape: Shape) -> bool:
    """A 1x1 kernel (wider kernels would stack kh*kw copies of the input: XLA is faster)."""
    return _is_1x1(W_shape)


def input_grad_matmul(dy, W, x_shape: Shape, stride: Pair, pads: Pads, dilation: Pair):
    """The input gradient as one matrix product of ``dy`` with the kernel, giving every window
    tap's contribution (N, kh*kw, C, Ho, Wo), added back where the tap read (col2im)."""
    o, c, kh, kw = W.shape
    n, _, ho, wo = dy.shape
    (sh, sw), (dh, dw) = stride, dilation
    (top, bottom), (left, right) = pads
    if kh * kw == 1:  # one tap: its contribution, spread by the stride and cut or padded to x
        taps = jnp.einsum("nohw,oc->nchw", dy, W.reshape(o, c))
        zero = jnp.zeros((), dy.dtype)
        return lax.pad(taps, zero, ((0, 0, 0), (0, 0, 0),
                                    (-top, x_shape[2] - (sh * (ho - 1) + 1) + top, sh - 1),
                                    (-left, x_shape[3] - (sw * (wo - 1) + 1) + left, sw - 1)))
    taps = jnp.einsum("nohw,ock->nkchw", dy, W.reshape(o, c, kh * kw))
    dx = jnp.zeros((n, c, x_shape[2] + top + bottom, x_shape[3] + left + right), dy.dtype)
    for tap in range(kh * kw):  # in-place adds: faster than one fusion of kh*kw pads here
        i, j = divmod(tap, kw)
        dx = dx.at[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                   j * dw:j * dw + sw * (wo - 1) + 1:sw].add(taps[:, tap])
    return dx[:, :, top:top + x_shape[2], left:left + x_shape[3]]


def weight_grad_matmul(x, dy, W_shape: Shape, stride: Pair, pads: Pads, dilation: Pair):
    """The weight gradient as one matrix product of ``dy`` with the input's windows."""
    o, c, kh, kw = W_shape
    patches = _patches(x, (kh, kw), stride, pads, dilation)
    return jnp.einsum("nohw,nckhw->ock", dy, patches).reshape(W_shape)


def _cpu_forward(x, W, stride: Pair, pads: Pads, dilation: Pair, group: int):
    if group == 1:
        if as_per_sample_product(W.shape, _out_hw(x.shape, W.shape[2:], stride, pads, dilation)):
            return per_sample_product(x, W, stride, pads)
        if forward_as_matmul(x.shape, W.shape):
            return matmul_conv(x, W, stride, pads, dilation)
        return xla_conv(x, W, stride, pads, dilation)
    if group == x.shape[1]:
        return _depthwise_shifts(x, W, stride, pads, dilation)
    return xla_conv(x, W, stride, pads, dilation, group)


def _cpu_backward(x, W, dy, stride: Pair, pads: Pads, dilation: Pair, group: int):
    if group == 1:
        if as_per_sample_product(W.shape, dy.shape[2:]):
            return _both_gradients(lambda x, W: per_sample_product(x, W, stride, pads), x, W, dy)
        if input_grad_as_matmul(x.shape, W.shape, dy.shape[2:], stride):
            dx = input_grad_matmul(dy, W, x.shape, stride, pads, dilation)
        else:
            dx = jax.vjp(lambda x: xla_conv(x, W, stride, pads, dilation), x)[1](dy)[0]
        if weight_grad_as_matmul(W.shape):
            dW = weight_grad_matmul(x, dy, W.shape, stride, pads, dilation)
        else:
            dW = jax.vjp(lambda W: xla_conv(x, W, stride, pads, dilation), W)[1](dy)[0]
        return dx, dW
    if group == x.shape[1]:
        return _both_gradients(lambda x, W: _depthwise_shifts(x, W, stride, pads, dilation),
                               x, W, dy)
    return _xla_backward(x, W, dy, stride, pads, dilation, group)


def _both_gradients(f: Callable, x, W, dy):
    """``(dx, dW)`` of ``f(x, W)`` for the output gradient ``dy``, as JAX differentiates ``f``."""
    return jax.vjp(f, x, W)[1](dy)


def _xla_backward(x, W, dy, stride: Pair, pads: Pads, dilation: Pair, group: int):
    """Both gradients of XLA's convolution, as JAX differentiates it."""
    return _both_gradients(lambda x, W: xla_conv(x, W, stride, pads, dilation, group), x, W, dy)


# --- the convolution: each platform's forms, chosen at lowering ------------------------------
@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def conv(x, W, stride: Pair, pads: Pads, dilation: Pair, group: int):
    """The convolution on any backend: the CPU forms above on CPU, XLA's convolution elsewhere.

    Forward and backward each choose with their own ``lax.platform_dependent``: differentiating
    through one choice would pass the branch index from forward to backward, and XLA:CPU then
    leaves the gradient's convolutions on its slow generic path (64 ms instead of 2 ms for
    LeNet's conv2). The price of the ``custom_vjp`` is forward-mode differentiation
    (``jax.jvp``/``jacfwd``), which it does not support."""
    return lax.platform_dependent(
        x, W, cpu=partial(_cpu_forward, stride=stride, pads=pads, dilation=dilation, group=group),
        default=partial(xla_conv, stride=stride, pads=pads, dilation=dilation, group=group))


def _conv_fwd(x, W, stride: Pair, pads: Pads, dilation: Pair, group: int):
    return conv(x, W, stride, pads, dilation, group), (x, W)


def _conv_bwd(stride: Pair, pads: Pads, dilation: Pair, group: int, residuals, dy):
    x, W = residuals
    kwargs = dict(stride=stride, pads=pads, dilation=dilation, group=group)
    return lax.platform_dependent(x, W, dy, cpu=partial(_cpu_backward, **kwargs),
                                  default=partial(_xla_backward, **kwargs))


conv.defvjp(_conv_fwd, _conv_bwd)


# --- depthwise -----------------------------------------------------------------------------------
def depthwise_convolution(x, W, stride: Pair, pads: Pads, dilation: Pair):
    """y[n, o, h, w] = sum_{i, j} W[o, 0, i, j] * xpad[n, o // m, s*h + d*i, s*w + d*j], output
    channel o reading input channel o // m (m = the channel multiplier)."""
    multiplier = W.shape[0] // x.shape[1]
    if multiplier > 1:
        x = jnp.repeat(x, multiplier, axis=1)
    kh, kw = W.shape[2:]
    windows = _windows(x, (kh, kw), stride, pads, dilation)
    y = None
    for tap, window in enumerate(windows):
        term = window * W[:, 0, tap // kw, tap % kw].reshape(1, -1, 1, 1)
        y = term if y is None else y + term
    return y


# A jitted function of its own: a compiled step's lowered module then holds a function named
# after it (xla_options.DEPTHWISE_CONVOLUTION; its gradient's too), and such a step keeps
# YNNPACK off (xla_options.CPU_STEP_OPTIONS).
_depthwise_shifts = jax.jit(depthwise_convolution, static_argnums=(2, 3, 4))
