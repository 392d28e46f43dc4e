"""SINGA's C++ operation API (``model_operation.i``): convolution, pooling, batch normalisation and
cuDNN-style RNN functions configured by handles, on JAX.

The handle classes are singa_jax.autograd's (``ConvHandle``, ``PoolingHandle``, ...); the
forward functions run those ops' pure kernels and every backward function is the ``jax.vjp`` of
the same kernel, so the math lives in :mod:`singa_jax._src.ops.nn` only. The ``Cpu*``, ``Gpu*``
and ``Cudnn*`` names are the same JAX code and run on any device. Every function is one cached
``jax.jit`` kernel per (handle configuration, shapes).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.ops import nn
from singa_jax._src.autodiff import residuals
from singa_jax._src.ops.handles import (BatchNormHandle, ConvHandle, CudnnBatchNormHandle,
                                        CudnnConvHandle, CudnnPoolingHandle, CudnnRNNHandle,
                                        PoolingHandle)
from singa_jax._src.runtime.ctensor import CTensor, describe, as_array, out_tensor, store
from singa_jax._src.backend.xla_options import kernel

__all__ = [
    "ConvHandle", "CudnnConvHandle", "PoolingHandle", "CudnnPoolingHandle", "BatchNormHandle",
    "CudnnBatchNormHandle", "CudnnRNNHandle",
    "CpuConvForward", "CpuConvBackwardx", "CpuConvBackwardW", "CpuConvBackwardb",
    "GpuConvForward", "GpuConvBackwardx", "GpuConvBackwardW", "GpuConvBackwardb",
    "CpuPoolingForward", "CpuPoolingBackward", "GpuPoolingForward", "GpuPoolingBackward",
    "CpuBatchNormForwardTraining", "CpuBatchNormForwardInference", "CpuBatchNormBackwardx",
    "GpuBatchNormForwardTraining", "GpuBatchNormForwardInference", "GpuBatchNormBackward",
    "GpuRNNForwardTraining", "GpuRNNForwardInference", "GpuRNNBackwardx", "GpuRNNBackwardW",
    "GpuRNNForwardTrainingEx", "GpuRNNForwardInferenceEx", "GpuRNNBackwardxEx",
    "GpuRNNBackwardWEx",
]

NO_ODD_PADDING = (0, 0, 0, 0)


def _check_handle(op: str, handle: Any, kind: type) -> None:
    if not isinstance(handle, kind):
        raise TypeError(f"{op}: expected a {kind.__name__}, got {type(handle).__name__}")


def _static(config: dict) -> Tuple:
    return tuple(sorted(config.items()))


# ================================================================================================
# Convolution
# ================================================================================================
def _conv(x, W, b, config):
    return nn._conv2d_kernel(x, W, b, odd_padding=NO_ODD_PADDING, **dict(config))


@kernel(static_argnums=0)
def _conv_forward(config, x, W, b):
    return _conv(x, W, b, config)


@kernel(static_argnums=0)
def _conv_backward_x(config, dy, W, x):
    return jax.vjp(lambda x_: _conv(x_, W, None, config), x)[1](dy)[0]


@kernel(static_argnums=0)
def _conv_backward_w(config, dy, x, W):
    return jax.vjp(lambda w_: _conv(x, w_, None, config), W)[1](dy)[0]


@jax.jit
def _conv_backward_b(dy, b):
    return jnp.sum(dy, axis=(0, 2, 3)).reshape(b.shape).astype(b.dtype)


def _conv_config(op: str, ch: Any, x: jax.Array, W: jax.Array) -> Tuple:
    _check_handle(op, ch, ConvHandle)
    if x.ndim != 4 or W.ndim != 4:
        raise ValueError(f"{op}: x and W must be 4-D (NCHW, OIHW), got shapes {tuple(x.shape)} "
                         f"and {tuple(W.shape)}")
    if x.shape[1] != W.shape[1] * ch.group or tuple(W.shape[2:]) != (ch.kernel_h, ch.kernel_w):
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} and W of shape {tuple(W.shape)} do "
                         f"not match the handle {ch!r}")
    return _static(nn._Conv2d.config(ch))


def CpuConvForward(x: Any, W: Any, b: Any, ch: ConvHandle) -> CTensor:
    """y = conv(x, W) + b as configured by ``ch`` (b is added when ``ch.bias_term``)."""
    xa, wa = as_array(x, "CpuConvForward"), as_array(W, "CpuConvForward")
    config = _conv_config("CpuConvForward", ch, xa, wa)
    ba = as_array(b, "CpuConvForward") if ch.bias_term and b is not None else None
    return CTensor.from_array(_conv_forward(config, xa, wa, ba))


def CpuConvBackwardx(dy: Any, W: Any, x: Any, ch: ConvHandle) -> CTensor:
    """dL/dx of the convolution given dL/dy."""
    xa, wa = as_array(x, "CpuConvBackwardx"), as_array(W, "CpuConvBackwardx")
    config = _conv_config("CpuConvBackwardx", ch, xa, wa)
    return CTensor.from_array(_conv_backward_x(config, as_array(dy, "CpuConvBackwardx"), wa, xa))


def CpuConvBackwardW(dy: Any, x: Any, W: Any, ch: ConvHandle) -> CTensor:
    """dL/dW of the convolution given dL/dy."""
    xa, wa = as_array(x, "CpuConvBackwardW"), as_array(W, "CpuConvBackwardW")
    config = _conv_config("CpuConvBackwardW", ch, xa, wa)
    return CTensor.from_array(_conv_backward_w(config, as_array(dy, "CpuConvBackwardW"), xa, wa))


def CpuConvBackwardb(dy: Any, b: Any, ch: ConvHandle) -> CTensor:
    """dL/db: dy summed over batch and space, in b's shape."""
    _check_handle("CpuConvBackwardb", ch, ConvHandle)
    dya, ba = as_array(dy, "CpuConvBackwardb"), as_array(b, "CpuConvBackwardb")
    if dya.ndim != 4 or dya.shape[1] != ba.size:
        raise ValueError(f"CpuConvBackwardb: dy {describe(dy)} does not match b {describe(b)}")
    return CTensor.from_array(_conv_backward_b(dya, ba))


GpuConvForward = CpuConvForward
GpuConvBackwardx = CpuConvBackwardx
GpuConvBackwardW = CpuConvBackwardW
GpuConvBackwardb = CpuConvBackwardb


# ================================================================================================
# Pooling
# ================================================================================================
def _pool(x, config):
    return nn._pooling2d_kernel(x, odd_padding=NO_ODD_PADDING, **dict(config))


@partial(jax.jit, static_argnums=0)
def _pool_forward(config, x):
    return _pool(x, config)


@partial(jax.jit, static_argnums=0)
def _pool_backward(config, dy, x):
    return jax.vjp(lambda x_: _pool(x_, config), x)[1](dy)[0]


def _pool_config(op: str, ph: Any, x: jax.Array) -> Tuple:
    _check_handle(op, ph, PoolingHandle)
    if x.ndim != 4:
        raise ValueError(f"{op}: x must be 4-D NCHW, got shape {tuple(x.shape)}")
    return _static(nn._Pooling2d.config(ph))


def CpuPoolingForward(ph: PoolingHandle, x: Any) -> CTensor:
    """Max or average pooling of ``x`` as configured by ``ph``."""
    xa = as_array(x, "CpuPoolingForward")
    return CTensor.from_array(_pool_forward(_pool_config("CpuPoolingForward", ph, xa), xa))


def CpuPoolingBackward(ph: PoolingHandle, dy: Any, x: Any, y: Any) -> CTensor:
    """dL/dx of pooling given dL/dy (``y``, the forward output, is accepted as in SINGA; the
    gradient is recomputed from ``x``)."""
    xa = as_array(x, "CpuPoolingBackward")
    config = _pool_config("CpuPoolingBackward", ph, xa)
    return CTensor.from_array(_pool_backward(config, as_array(dy, "CpuPoolingBackward"), xa))


GpuPoolingForward = CpuPoolingForward
GpuPoolingBackward = CpuPoolingBackward


# ================================================================================================
# Batch normalisation
# ================================================================================================
def _per_channel(x: jax.Array, *params: jax.Array):
    """SINGA passes scale/bias/statistics as (C,) or (1, C, 1, 1): the kernel takes (C,)."""
    return tuple(p.reshape(x.shape[1]) for p in params)


@partial(jax.jit, static_argnums=(0, 1))
def _bn_training(momentum: float, epsilon: float, x, scale, bias, rm, rv):
    s, b, m, v = _per_channel(x, scale, bias, rm, rv)
    y, new_mean, new_var = nn._batchnorm_kernel(x, s, b, m, v, training=True, momentum=momentum,
                                                epsilon=epsilon)
    axes, _ = nn._bn_axes(x)
    batch_mean, batch_var = jnp.mean(x, axis=axes), jnp.var(x, axis=axes)
    return y, new_mean, new_var, batch_mean, batch_var


@partial(jax.jit, static_argnums=(0,))
def _bn_inference(epsilon: float, x, scale, bias, rm, rv):
    s, b, m, v = _per_channel(x, scale, bias, rm, rv)
    return nn._batchnorm_kernel(x, s, b, m, v, training=False, momentum=0.0, epsilon=epsilon)


@partial(jax.jit, static_argnums=(0,))
def _bn_backward(epsilon: float, dy, x, scale, bias):
    s, b = _per_channel(x, scale, bias)
    zeros = jnp.zeros_like(s)

    def y_of(x_, s_, b_):
        return nn._batchnorm_kernel(x_, s_, b_, zeros, zeros, training=True, momentum=0.0,
                                    epsilon=epsilon)[0]

    dx, ds, db = jax.vjp(y_of, x, s, b)[1](dy)
    return dx, ds.reshape(scale.shape), db.reshape(scale.shape)


def _bn_arrays(op: str, bnh: Any, x: Any, *params: Any):
    _check_handle(op, bnh, BatchNormHandle)
    xa = as_array(x, op)
    arrays = [as_array(p, op) for p in params]
    if xa.ndim not in (2, 4):
        raise ValueError(f"{op}: x must be (N, C, H, W) or (N, C), got {describe(x)}")
    for p, a in zip(params, arrays):
        if a.size != xa.shape[1]:
            raise ValueError(f"{op}: {describe(p)} does not hold one value per channel of x "
                             f"{describe(x)}")
    return xa, arrays


def _bn_forward_training(op: str, bnh: BatchNormHandle, x: Any, bnScale: Any, bnBias: Any,
                         running_mean: Any, running_var: Any):
    rm, rv = out_tensor(running_mean, op), out_tensor(running_var, op)
    xa, (s, b, m, v) = _bn_arrays(op, bnh, x, bnScale, bnBias, rm, rv)
    y, new_mean, new_var, batch_mean, batch_var = _bn_training(bnh.factor, bnh.epsilon, xa, s,
                                                               b, m, v)
    store(op, rm, new_mean)
    store(op, rv, new_var)
    return y, batch_mean.reshape(m.shape), batch_var.reshape(m.shape)


def CpuBatchNormForwardTraining(bnh: BatchNormHandle, x: Any, bnScale: Any, bnBias: Any,
                                running_mean: CTensor, running_var: CTensor
                                ) -> Tuple[CTensor, CTensor, CTensor]:
    """Normalise with the batch statistics; update ``running_mean``/``running_var`` in place
    (SINGA's momentum rule, unbiased variance); return (y, batch mean, batch variance)."""
    y, mean, var = _bn_forward_training("CpuBatchNormForwardTraining", bnh, x, bnScale, bnBias,
                                        running_mean, running_var)
    return CTensor.from_array(y), CTensor.from_array(mean), CTensor.from_array(var)


def GpuBatchNormForwardTraining(cbnh: BatchNormHandle, x: Any, bnScale: Any, bnBias: Any,
                                running_mean: CTensor, running_var: CTensor
                                ) -> Tuple[CTensor, CTensor, CTensor]:
    """As the CPU form, but the third result is cuDNN's saved 1 / sqrt(var + eps)."""
    y, mean, var = _bn_forward_training("GpuBatchNormForwardTraining", cbnh, x, bnScale, bnBias,
                                        running_mean, running_var)
    return (CTensor.from_array(y), CTensor.from_array(mean),
            CTensor.from_array(jax.lax.rsqrt(var + cbnh.epsilon)))


def CpuBatchNormForwardInference(bnh: BatchNormHandle, x: Any, bnScale: Any, bnBias: Any,
                                 running_mean: Any, running_var: Any) -> CTensor:
    """Normalise with the running statistics."""
    xa, (s, b, m, v) = _bn_arrays("CpuBatchNormForwardInference", bnh, x, bnScale, bnBias,
                                  running_mean, running_var)
    return CTensor.from_array(_bn_inference(bnh.epsilon, xa, s, b, m, v))


GpuBatchNormForwardInference = CpuBatchNormForwardInference


def CpuBatchNormBackwardx(bnh: BatchNormHandle, y: Any, dy: Any, x: Any, bnScale: Any,
                          bnBias: Any, mean: Any, var: Any) -> Tuple[CTensor, CTensor, CTensor]:
    """(dx, dscale, dbias) of training-mode batch norm. ``y``, ``mean`` and ``var`` are accepted
    as in SINGA; the batch statistics are recomputed from ``x`` (they must be x's anyway)."""
    xa, (s, b) = _bn_arrays("CpuBatchNormBackwardx", bnh, x, bnScale, bnBias)
    dx, ds, db = _bn_backward(bnh.epsilon, as_array(dy, "CpuBatchNormBackwardx"), xa, s, b)
    return CTensor.from_array(dx), CTensor.from_array(ds), CTensor.from_array(db)


def GpuBatchNormBackward(cbnh: BatchNormHandle, dy: Any, x: Any, bnScale: Any, mean: Any,
                         var: Any) -> Tuple[CTensor, CTensor, CTensor]:
    """(dx, dscale, dbias); cuDNN's saved mean and inverse deviation are accepted, the
    statistics recomputed from ``x``."""
    xa, (s,) = _bn_arrays("GpuBatchNormBackward", cbnh, x, bnScale)
    dx, ds, db = _bn_backward(cbnh.epsilon, as_array(dy, "GpuBatchNormBackward"), xa, s,
                              jnp.zeros_like(s))
    return CTensor.from_array(dx), CTensor.from_array(ds), CTensor.from_array(db)


# ================================================================================================
# cuDNN-style RNN. As cuDNN keeps a reserve space from the training forward pass for backward,
# the handle keeps the pullback of the forward kernel: Backwardx runs it and keeps dW for
# BackwardW.
# ================================================================================================
def _rnn_config(h: Any) -> Tuple:
    return _static(dict(mode=h.mode, hidden_size=h.hidden_size, num_layers=h.num_layers,
                        bidirectional=h.bidirectional, bias=h.bias, dropout=h.dropout))


def _rnn(config, x, hx, cx, w, lengths, key):
    return nn._rnn_kernel(x, hx, cx, w.reshape(-1), lengths, key, **dict(config))


@partial(jax.jit, static_argnums=0)
def _rnn_forward(config, x, hx, cx, w, lengths):
    return _rnn(config, x, hx, cx, w, lengths, None)


@partial(jax.jit, static_argnums=0)
def _rnn_forward_vjp(config, x, hx, cx, w, lengths, key):
    outs, pullback = jax.vjp(lambda *a: _rnn(config, *a, lengths, key), x, hx, cx, w)
    return outs, residuals.split(pullback, (x, hx, cx, w), outs)  # no copies of them


@jax.jit
def _rnn_pullback(pullback, cotangents):
    return pullback(cotangents)


def _rnn_inputs(op: str, h: Any, x: Any, hx: Any, cx: Any, W: Any):
    _check_handle(op, h, CudnnRNNHandle)
    xa, hxa, cxa, wa = (as_array(a, op) for a in (x, hx, cx, W))
    state = h.state_shape(xa.shape[1]) if xa.ndim == 3 else None
    if xa.ndim != 3 or xa.shape[2] != h.feature_size or tuple(hxa.shape) != state or \
            tuple(cxa.shape) != state or wa.size != h.weights_size:
        raise ValueError(f"{op}: x {describe(x)}, hx {describe(hx)}, cx {describe(cx)}, "
                         f"W {describe(W)} do not match the handle {h!r}")
    h.seq_length, h.batch_size = xa.shape[0], xa.shape[1]
    return xa, hxa, cxa, wa


def _rnn_training(op: str, x, hx, cx, W, lengths, h) -> Tuple[CTensor, CTensor, CTensor]:
    xa, hxa, cxa, wa = _rnn_inputs(op, h, x, hx, cx, W)
    key = CTensor.from_array(xa).device().next_key() if h.dropout > 0 else None
    la = None if lengths is None else as_array(lengths, op)
    (y, hy, cy), pullback = _rnn_forward_vjp(_rnn_config(h), xa, hxa, cxa, wa, la, key)
    h._pullback = residuals.join(pullback, (xa, hxa, cxa, wa), (y, hy, cy))
    h._dW = None
    return CTensor.from_array(y), CTensor.from_array(hy), CTensor.from_array(cy)


def _rnn_inference(op: str, x, hx, cx, W, lengths, h) -> Tuple[CTensor, CTensor, CTensor]:
    xa, hxa, cxa, wa = _rnn_inputs(op, h, x, hx, cx, W)
    la = None if lengths is None else as_array(lengths, op)
    y, hy, cy = _rnn_forward(_rnn_config(h), xa, hxa, cxa, wa, la)
    return CTensor.from_array(y), CTensor.from_array(hy), CTensor.from_array(cy)


def _rnn_backward_x(op: str, dy, dhy, dcy, h) -> Tuple[CTensor, CTensor, CTensor]:
    pullback = getattr(h, "_pullback", None)
    if pullback is None:
        raise RuntimeError(f"{op}: no forward state in the handle; call GpuRNNForwardTraining"
                           f"{'Ex' if op.endswith('Ex') else ''} with this handle first")
    dx, dhx, dcx, dW = _rnn_pullback(pullback, tuple(as_array(d, op) for d in (dy, dhy, dcy)))
    h._pullback, h._dW = None, dW
    return CTensor.from_array(dx), CTensor.from_array(dhx), CTensor.from_array(dcx)


def _rnn_backward_w(op: str, h) -> CTensor:
    dW = getattr(h, "_dW", None)
    if dW is None:
        raise RuntimeError(f"{op}: call the matching GpuRNNBackwardx first (it computes dW)")
    h._dW = None
    return CTensor.from_array(dW)


def GpuRNNForwardTraining(x: Any, hx: Any, cx: Any, W: Any, h: CudnnRNNHandle
                          ) -> Tuple[CTensor, CTensor, CTensor]:
    """(y, hy, cy) of the RNN; keeps what backward needs in ``h``."""
    return _rnn_training("GpuRNNForwardTraining", x, hx, cx, W, None, h)


def GpuRNNForwardInference(x: Any, hx: Any, cx: Any, W: Any, h: CudnnRNNHandle
                           ) -> Tuple[CTensor, CTensor, CTensor]:
    return _rnn_inference("GpuRNNForwardInference", x, hx, cx, W, None, h)


def GpuRNNBackwardx(y: Any, dy: Any, dhy: Any, dcy: Any, W: Any, hx: Any, cx: Any,
                    h: CudnnRNNHandle) -> Tuple[CTensor, CTensor, CTensor]:
    """(dx, dhx, dcx) for the last training forward pass through ``h``."""
    return _rnn_backward_x("GpuRNNBackwardx", dy, dhy, dcy, h)


def GpuRNNBackwardW(x: Any, hx: Any, y: Any, h: CudnnRNNHandle) -> CTensor:
    """dW (flat, cuDNN's layout) for the last training forward pass through ``h``."""
    return _rnn_backward_w("GpuRNNBackwardW", h)


def GpuRNNForwardTrainingEx(x: Any, hx: Any, cx: Any, W: Any, seq_lengths: Any,
                            h: CudnnRNNHandle) -> Tuple[CTensor, CTensor, CTensor]:
    """As GpuRNNForwardTraining, sequence b read only at t < seq_lengths[b]."""
    return _rnn_training("GpuRNNForwardTrainingEx", x, hx, cx, W, seq_lengths, h)


def GpuRNNForwardInferenceEx(x: Any, hx: Any, cx: Any, W: Any, seq_lengths: Any,
                             h: CudnnRNNHandle) -> Tuple[CTensor, CTensor, CTensor]:
    return _rnn_inference("GpuRNNForwardInferenceEx", x, hx, cx, W, seq_lengths, h)


def GpuRNNBackwardxEx(y: Any, dy: Any, dhy: Any, dcy: Any, W: Any, hx: Any, cx: Any,
                      seq_lengths: Any, h: CudnnRNNHandle) -> Tuple[CTensor, CTensor, CTensor]:
    return _rnn_backward_x("GpuRNNBackwardxEx", dy, dhy, dcy, h)


def GpuRNNBackwardWEx(x: Any, hx: Any, y: Any, seq_lengths: Any, h: CudnnRNNHandle) -> CTensor:
    return _rnn_backward_w("GpuRNNBackwardWEx", h)
