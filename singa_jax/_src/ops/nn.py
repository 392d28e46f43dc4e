"""SINGA's neural-network operators: convolution, pooling, batch normalisation, dropout,
embedding, cosine similarity and the (cuDNN-style) RNN operator. Their static configuration comes
in SINGA's handle classes (:mod:`.handles`: ``ConvHandle``, ``PoolingHandle``, ...), built once per
layer from a sample input and passed to the functional op on every call.

Every op's forward is one pure ``jax.numpy``/``jax.lax`` function run as a cached ``jax.jit``
kernel (via :class:`~singa_jax.autograd.Function`); backward is that function's ``vjp``,
so gradients are the mathematical ones (see docs/autograd_nn.md for where SINGA's differ).
"""
from __future__ import annotations

from functools import lru_cache, partial
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from singa_jax._src.autodiff.autocast import COMPUTE, FLOAT32, NORMALISE
from singa_jax._src.autodiff.autocast import declare as declare_autocast
from singa_jax._src.base.checks import check_indices
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.base.modes import is_training
from singa_jax._src.backend import conv as conv_cpu
from singa_jax._src.autodiff.kernels import handle_cache, handle_statics
from singa_jax._src.autodiff import residuals as _residuals
from singa_jax._src.autodiff.function import Function, InvalidInput
from singa_jax._src.autodiff.recipes import kind_call
from singa_jax._src.ops.handles import (NO_ODD_PADDING, BatchNormHandle, ConvHandle,
                                        CudnnBatchNormHandle, CudnnConvHandle, CudnnPoolingHandle,
                                        CudnnRNNHandle, Pair, PoolingHandle, RNNHandle,
                                        checked_odd_padding, rnn_layout, RNN_GATES)

__all__ = [
    # handles
    "ConvHandle", "CudnnConvHandle", "PoolingHandle", "CudnnPoolingHandle", "BatchNormHandle",
    "CudnnBatchNormHandle", "RNNHandle", "CudnnRNNHandle",
    # operators and their functional forms
    "_Conv2d", "conv2d", "_BatchNorm2d", "batchnorm_2d", "_Pooling2d", "pooling_2d",
    "GlobalAveragePool", "globalaveragepool", "Dropout", "dropout", "Embedding", "embedding",
    "CosSim", "cossim", "_RNN",
]

# ================================================================================================
# Pure kernels
# ================================================================================================
def _conv2d_kernel(x, W, b=None, *, stride: Pair, padding: Pair, dilation: Pair, group: int,
                   odd_padding: Tuple[int, int, int, int]):
    """y[n, o] = sum_{c in group(o), i, j} W[o, c, i, j] * xpad[n, c, s*h + d*i, s*w + d*j] + b[o].

    SINGA zero-pads the input by ``odd_padding`` (top, bottom, left, right) and then by the
    symmetric ``padding``; both fold into one asymmetric padding of the convolution.
    """
    top, bottom, left, right = odd_padding
    pads = ((padding[0] + top, padding[0] + bottom), (padding[1] + left, padding[1] + right))

    # each backend's fastest forms (autograd.conv_cpu), chosen when the program is lowered
    y = conv_cpu.convolve(x, W, stride, pads, dilation, group)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1).astype(y.dtype)
    return y


def replicate_odd_pad(x, odd_padding):
    """SINGA's pooling odd padding (``handle_odd_pad_fwd(is_pool=True)``): along H, then W,
    prepend a copy of the first ``pad`` rows (columns) and append a copy of the last ``pad``, so
    the extra border holds real values rather than zeros that would bias max/average pooling."""
    top, bottom, left, right = odd_padding
    for axis, before, after in ((2, top, bottom), (3, left, right)):
        n = x.shape[axis]
        parts = []
        if before:
            parts.append(lax.slice_in_dim(x, 0, before, axis=axis))
        parts.append(x)
        if after:
            parts.append(lax.slice_in_dim(x, n - after, n, axis=axis))
        if len(parts) > 1:
            x = jnp.concatenate(parts, axis=axis)
    return x


def _pooling2d_kernel(x, *, kernel: Pair, stride: Pair, padding: Pair, is_max: bool,
                      odd_padding: Tuple[int, int, int, int]):
    """Max pooling (padding never wins) or average pooling whose divisor counts only the input
    elements under the window (padding excluded, as SINGA's DNNL and cuDNN kernels)."""
    x = replicate_odd_pad(x, odd_padding)
    if is_max and tuple(kernel) == tuple(stride) and tuple(padding) == (0, 0):
        return _max_pool_tiles(x, tuple(kernel))
    window, strides = (1, 1) + tuple(kernel), (1, 1) + tuple(stride)
    pads = ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1]))
    if is_max:
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)
    total = lax.reduce_window(x, 0.0, lax.add, window, strides, pads)
    ones = jnp.ones((1, 1) + x.shape[2:], x.dtype)
    count = lax.reduce_window(ones, 0.0, lax.add, window, strides, pads)
    return total / count


def _tiles(x, kernel: Pair):
    """NCHW ``x`` cut into non-overlapping ``kernel`` tiles: (N, C, Ho, kh, Wo, kw); rows and
    columns past the last whole tile are dropped, as pooling without padding drops them."""
    (kh, kw), (n, c, h, w) = kernel, x.shape
    ho, wo = h // kh, w // kw
    return x[:, :, :ho * kh, :wo * kw].reshape(n, c, ho, kh, wo, kw)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool_tiles(x, kernel: Pair):
    """Max pooling with windows that tile the input (kernel == stride, no padding), as a
    reshape + max. Its gradient goes to the FIRST maximum of each window in row-major order --
    the rule of XLA's select_and_scatter that ``reduce_window``'s gradient lowers to -- but as
    elementwise ops on the tiles, where select_and_scatter expands into index arrays of the whole
    activation and a scatter (about 5 ms of LeNet's 21 ms step on XLA:CPU)."""
    return jnp.max(_tiles(x, kernel), axis=(3, 5))


def _max_pool_tiles_fwd(x, kernel: Pair):
    y = _max_pool_tiles(x, kernel)
    return y, (x, y)


def _max_pool_tiles_bwd(kernel: Pair, residuals, dy):
    x, y = residuals
    (kh, kw), (n, c, h, w) = kernel, x.shape
    tiles = _tiles(x, kernel)
    # position of each element inside its window (row-major); the first maximum has the
    # smallest position among the elements equal to the window's maximum
    position = (lax.broadcasted_iota(jnp.int32, (kh, 1, kw), 0) * kw +
                lax.broadcasted_iota(jnp.int32, (kh, 1, kw), 2)).reshape(1, 1, 1, kh, 1, kw)
    is_max = tiles == y[:, :, :, None, :, None]
    first = jnp.min(jnp.where(is_max, position, kh * kw), axis=(3, 5), keepdims=True)
    dx = jnp.where(position == first, dy[:, :, :, None, :, None], 0).astype(x.dtype)
    dx = dx.reshape(n, c, (h // kh) * kh, (w // kw) * kw)
    if dx.shape[2:] != (h, w):  # the rows/columns no window covered get no gradient
        dx = jnp.pad(dx, ((0, 0), (0, 0), (0, h - dx.shape[2]), (0, w - dx.shape[3])))
    return (dx,)


_max_pool_tiles.defvjp(_max_pool_tiles_fwd, _max_pool_tiles_bwd)


def _bn_axes(x):
    """Axes reduced by batch norm (all but the channel axis 1) and the broadcast shape of (C,)."""
    axes = (0,) + tuple(range(2, x.ndim))
    return axes, (1, -1) + (1,) * (x.ndim - 2)


def _batchnorm_kernel(x, scale, bias, running_mean, running_var, *, training: bool,
                      momentum: float, epsilon: float):
    """y = (x - mean) / sqrt(var + eps) * scale + bias, per channel.

    Training: batch mean and biased batch variance normalise, and SINGA's running update is
    returned too: running = (1 - momentum) * running + momentum * batch, with the UNBIASED batch
    variance (n / (n - 1)) going into running_var. Eval: the running statistics normalise.
    """
    if training:
        return _batchnorm_training(x, scale, bias, running_mean, running_var, momentum,
                                   epsilon)[0]
    axes, cshape = _bn_axes(x)
    inv = lax.rsqrt(running_var + epsilon)
    return (x - running_mean.reshape(cshape)) * (inv * scale).reshape(cshape) + \
        bias.reshape(cshape)


def _batchnorm_training(x, scale, bias, running_mean, running_var, momentum: float,
                        epsilon: float):
    """Training-mode batch norm: ``((y, new running mean, new running var), batch mean,
    1 / sqrt(batch var + eps))``."""
    axes, cshape = _bn_axes(x)
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean.reshape(cshape)), axis=axes)
    inv = lax.rsqrt(var + epsilon)
    y = (x - mean.reshape(cshape)) * (inv * scale).reshape(cshape) + bias.reshape(cshape)
    n = x.size // x.shape[1]
    mean, var = lax.stop_gradient(mean), lax.stop_gradient(var)
    new_mean = (1.0 - momentum) * running_mean + momentum * mean
    new_var = (1.0 - momentum) * running_var + momentum * var * (n / max(n - 1, 1))
    return (y, new_mean.astype(running_mean.dtype), new_var.astype(running_var.dtype)), mean, inv


@lru_cache(maxsize=None)
def _lean_batchnorm_training(momentum: float, epsilon: float) -> Callable:
    """Training-mode batch norm whose pullback keeps ``x`` and ``scale`` (the kernel's inputs:
    not copied) and two per-channel vectors, the batch mean and 1 / sqrt(var + eps): JAX's own
    keeps two activation-sized arrays more (``x - mean`` and its double). With ``xhat = (x -
    mean) * inv`` over the ``n`` values of a channel::

        dbias = sum(dy);  dscale = sum(dy * xhat)
        dx = scale * inv * (dy - dbias / n - xhat * dscale / n)

    The running statistics' outputs carry no gradient (their batch statistics are held fixed,
    as in the kernel). For ``bias`` of ``scale``'s dtype (see :func:`_lean_batchnorm`)."""

    @jax.custom_vjp
    def batchnorm(x, scale, bias, running_mean, running_var):
        return _batchnorm_training(x, scale, bias, running_mean, running_var, momentum,
                                   epsilon)[0]

    def forward(x, scale, bias, running_mean, running_var):
        outs, mean, inv = _batchnorm_training(x, scale, bias, running_mean, running_var,
                                              momentum, epsilon)
        return outs, (x, scale, mean, inv)

    def backward(kept, cotangents):
        x, scale, mean, inv = kept
        dy = cotangents[0]
        axes, cshape = _bn_axes(x)
        n = x.size // x.shape[1]
        xhat = (x - mean.reshape(cshape)) * inv.reshape(cshape)
        dbias = jnp.sum(dy, axis=axes)
        dscale = jnp.sum(dy * xhat, axis=axes)
        dx = (scale * inv).reshape(cshape) * (dy - (dbias / n).reshape(cshape)
                                              - xhat * (dscale / n).reshape(cshape))
        return (dx.astype(x.dtype), dscale.astype(scale.dtype), dbias.astype(scale.dtype),
                None, None)

    batchnorm.defvjp(forward, backward)
    return batchnorm


def _lean_batchnorm(static: Tuple) -> Optional[Callable]:
    config = dict(static)
    if not config["training"]:
        return None  # (evaluation's pullback keeps the running statistics only)
    lean = _lean_batchnorm_training(config["momentum"], config["epsilon"])

    def batchnorm(x, scale, bias, running_mean, running_var):
        if bias.dtype != scale.dtype:  # (the lean pullback gives dbias scale's dtype)
            return _batchnorm_kernel(x, scale, bias, running_mean, running_var, **config)
        return lean(x, scale, bias, running_mean, running_var)
    return batchnorm


_residuals.register_lean(_batchnorm_kernel, _lean_batchnorm)


def _globalaveragepool_kernel(x, *, data_format: str):
    """Mean over the spatial axes, kept as size-1 axes: (N, C, 1, 1) or (N, 1, 1, C)."""
    axes = tuple(range(2, x.ndim)) if data_format == "channels_first" else \
        tuple(range(1, x.ndim - 1))
    return jnp.mean(x, axis=axes, keepdims=True)


def _dropout_kernel(x, key, *, ratio: float):
    """y = x * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio) drawn from ``key``."""
    return _dropout_with_mask(x, key, ratio)[0]


def _dropout_with_mask(x, key, ratio: float):
    keep = jax.random.bernoulli(key, 1.0 - ratio, x.shape)
    return _where_kept(keep, x, ratio), keep


def _where_kept(keep, x, ratio: float):
    """``x / (1 - ratio)`` where ``keep``, else 0."""
    return jnp.where(keep, x / (1.0 - ratio), jnp.zeros((), x.dtype)).astype(x.dtype)


@lru_cache(maxsize=None)
def _lean_dropout(ratio: float) -> Callable:
    """Dropout whose pullback keeps its boolean mask alone (``dx = dy / (1 - ratio)`` where
    kept, else 0); JAX's own keeps a float array of the input's size too."""

    @jax.custom_vjp
    def dropout(x, key):
        return _dropout_with_mask(x, key, ratio)[0]

    def backward(keep, dy):
        return _where_kept(keep, dy, ratio), None

    dropout.defvjp(lambda x, key: _dropout_with_mask(x, key, ratio), backward)
    return dropout


_residuals.register_lean(_dropout_kernel, lambda static: _lean_dropout(dict(static)["ratio"]))


def _embedding_kernel(x, w):
    """y[..., :] = w[x[...], :] (float indices are truncated to int, as SINGA's int(idx))."""
    idx = x if jnp.issubdtype(x.dtype, jnp.integer) else x.astype(jnp.int32)
    return jnp.take(w, idx, axis=0)


def _row_dot(a, b):
    return jnp.sum(a * b, axis=1)


def _cossim_kernel(a, b):
    """cos(a_i, b_i) = <a_i, b_i> / (|a_i| |b_i|) for every row i."""
    return _row_dot(a, b) / (jnp.sqrt(_row_dot(a, a)) * jnp.sqrt(_row_dot(b, b)))


# ---- RNN -------------------------------------------------------------------------------------
def _rnn_cell(mode: int, x_proj, h, c, R, bR):
    """One step of cuDNN's cell given the input projection ``x_proj = x W^T + b_W``.

    relu/tanh: h' = act(x_proj + h R^T + b_R)
    LSTM (gates i, f, g, o): c' = f*c + i*g, h' = o*tanh(c')
    GRU (gates r, z, n):     n = tanh(x_n + r*(h R_n^T + b_Rn)), h' = (1-z)*n + z*h
    """
    h_proj = h @ R.T + bR
    if mode in (0, 1):
        act = jax.nn.relu if mode == 0 else jnp.tanh
        return act(x_proj + h_proj), c
    if mode == 2:
        i, f, g, o = jnp.split(x_proj + h_proj, 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c_new), c_new
    xr, xz, xn = jnp.split(x_proj, 3, axis=-1)
    hr, hz, hn = jnp.split(h_proj, 3, axis=-1)
    r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h, c


def _rnn_params(w, layout, pseudo: int, gates: int, hidden: int, in_size: int, bias: int):
    """(W (G*H, in), R (G*H, H), b_W (G*H,), b_R (G*H,)) of one pseudo-layer from the flat w."""
    def mat(lin, cols):
        off, size = layout[(lin, pseudo, False)]
        return lax.dynamic_slice_in_dim(w, off, size).reshape(hidden, cols)

    def vec(lin):
        if not bias:
            return jnp.zeros((hidden,), w.dtype)
        off, size = layout[(lin, pseudo, True)]
        return lax.dynamic_slice_in_dim(w, off, size)

    W = jnp.concatenate([mat(g, in_size) for g in range(gates)], axis=0)
    R = jnp.concatenate([mat(gates + g, hidden) for g in range(gates)], axis=0)
    bW = jnp.concatenate([vec(g) for g in range(gates)])
    bR = jnp.concatenate([vec(gates + g) for g in range(gates)])
    return W, R, bW, bR


def rnn_direction(mode, x, valid, h0, c0, W, R, bW, bR):
    """Scan one direction of cuDNN's cell over ``x`` (seq, batch, in) with ``W`` (G*H, in),
    ``R`` (G*H, H); returns (ys, h_T, c_T). Steps where ``valid`` (seq, batch) is False keep the
    state and emit 0; ``valid=None`` means every step is valid (no masking is computed). The
    one scan kernel of the recurrent layers: ``layer.RNN``/``layer.LSTM`` call it too."""
    x_proj = jnp.einsum("tbi,gi->tbg", x, W) + bW  # all input projections at once

    def step(carry, inputs):
        h, c = carry
        xp, ok = inputs
        h_new, c_new = _rnn_cell(mode, xp, h, c, R, bR)
        if ok is None:
            return (h_new, c_new), h_new
        ok = ok[:, None]
        return (jnp.where(ok, h_new, h), jnp.where(ok, c_new, c)), jnp.where(ok, h_new, 0.0)

    (h, c), ys = lax.scan(step, (h0, c0), (x_proj, valid))
    return ys, h, c


def _rnn_kernel(x, hx, cx, w, seq_lengths=None, key=None, *, mode: int, hidden_size: int,
                num_layers: int, bidirectional: int, bias: int, dropout: float):
    """cuDNN's RNN on (seq, batch, feature) input: returns y (seq, batch, hidden*dirs), hy, cy.

    With ``seq_lengths`` (batch,), sequence b is read at t < seq_lengths[b] only: y is 0 after
    its end, hy/cy hold its state at its last step, and the reverse direction starts at its end.
    ``key`` (given in training with dropout > 0) drops inputs of layers 1.. as cuDNN does.
    """
    T, B, F = x.shape
    dirs, gates = 2 if bidirectional else 1, RNN_GATES[mode]
    layout, _ = rnn_layout(mode, F, hidden_size, num_layers, bidirectional, bias)
    t = jnp.arange(T)[:, None]
    if seq_lengths is None:
        lengths = jnp.full((B,), T, jnp.int32)
    else:
        lengths = seq_lengths.astype(jnp.int32).reshape(B)
    valid = jnp.broadcast_to(t < lengths[None, :], (T, B))
    # time index of the reversed sequence: within its length each sequence runs backwards
    reverse_idx = jnp.where(valid, lengths[None, :] - 1 - t, t)

    def time_gather(a):
        return jnp.take_along_axis(a, reverse_idx[:, :, None], axis=0)

    layer_in, hys, cys = x, [], []
    for layer in range(num_layers):
        if layer and key is not None and dropout > 0.0:
            layer_in = _dropout_kernel(layer_in, jax.random.fold_in(key, layer), ratio=dropout)
        in_size = layer_in.shape[-1]
        outs = []
        for d in range(dirs):
            pseudo = layer * dirs + d
            params = _rnn_params(w, layout, pseudo, gates, hidden_size, in_size, bias)
            seq = time_gather(layer_in) if d else layer_in
            ys, h, c = rnn_direction(mode, seq, valid, hx[pseudo], cx[pseudo], *params)
            outs.append(time_gather(ys) if d else ys)
            hys.append(h)
            cys.append(c)
        layer_in = outs[0] if dirs == 1 else jnp.concatenate(outs, axis=-1)
    return layer_in, jnp.stack(hys), jnp.stack(cys)


def _rnn_op_kernel(x, hx, cx, w, *extras, has_lengths: bool, has_key: bool,
                   return_sequences: bool, **config):
    """_RNN's kernel: extras are (seq_lengths if has_lengths, key if has_key)."""
    extras = list(extras)
    lengths = extras.pop(0) if has_lengths else None
    key = extras.pop(0) if has_key else None
    y = _rnn_kernel(x, hx, cx, w.reshape(-1), lengths, key, **config)[0]
    return y if return_sequences else y[-1]


# ================================================================================================
# Operators
# ================================================================================================
def _check(cond: bool, op: str, msg: str) -> None:
    if not cond:
        raise InvalidInput(f"{op}: {msg}")


class _WindowOp(Function):
    """Base of the handle-configured window ops (convolution, pooling): SINGA's constructor
    ``Op(handle, odd_padding)``; ``config(handle)`` gives the kernel's static arguments."""

    handle_type: type = object

    def __init__(self, handle: Any, odd_padding: Sequence[int] = NO_ODD_PADDING):
        op = type(self).__name__
        if not isinstance(handle, self.handle_type):
            raise TypeError(f"{op}: handle must be a {self.handle_type.__name__}, got "
                            f"{type(handle).__name__}")
        if type(odd_padding) is tuple and odd_padding == NO_ODD_PADDING:  # the usual one
            odd_padding = NO_ODD_PADDING
        else:
            odd_padding = checked_odd_padding(odd_padding, op)
        static, key = handle_statics(
            handle, odd_padding, lambda: dict(odd_padding=odd_padding, **self.config(handle)))
        super().__init__(**static)
        self._static = key
        self.handle = handle
        self.odd_padding = odd_padding

    @staticmethod
    def config(handle: Any) -> Dict[str, Any]:
        raise NotImplementedError


class _Conv2d(_WindowOp):
    """2-D convolution (NCHW input, OIHW weight) configured by a ConvHandle."""

    fn = staticmethod(_conv2d_kernel)
    handle_type = ConvHandle

    @staticmethod
    def config(handle: ConvHandle) -> Dict[str, Any]:
        return dict(stride=(handle.stride_h, handle.stride_w),
                    padding=(handle.pad_h, handle.pad_w),
                    dilation=(handle.dilation_h, handle.dilation_w), group=handle.group)

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, x, W, b=None):
        h, xs, ws = self.handle, x.shape, W.shape
        # the usual case in one test; the messages are formatted only for a failing input
        if not (len(xs) == 4 and len(ws) == 4 and xs[1] == ws[1] * h.group
                and ws[0] % h.group == 0 and ws[2] == h.kernel_h and ws[3] == h.kernel_w
                and (b is None or tuple(b.shape) == (ws[0],))):
            self._check_inputs(x, W, b)
        return super().forward(x, W) if b is None else super().forward(x, W, b)

    def _check_inputs(self, x, W, b) -> None:
        """InvalidInput naming what does not fit (``forward``'s test failed)."""
        h, op = self.handle, "_Conv2d"
        _check(x.ndim == 4, op, f"input x must be 4-D NCHW, got shape {tuple(x.shape)}")
        _check(W.ndim == 4, op, f"weight W must be 4-D (out, in/group, kh, kw), got shape "
                                f"{tuple(W.shape)}")
        _check(x.shape[1] == W.shape[1] * h.group, op,
               f"input x of shape {tuple(x.shape)} has {x.shape[1]} channels but W of shape "
               f"{tuple(W.shape)} with group={h.group} expects {W.shape[1] * h.group}")
        _check(W.shape[0] % h.group == 0, op, f"W of shape {tuple(W.shape)}: {W.shape[0]} "
                                              f"filters are not divisible by group={h.group}")
        _check(tuple(W.shape[2:]) == (h.kernel_h, h.kernel_w), op,
               f"W of shape {tuple(W.shape)} does not match the handle's kernel "
               f"{(h.kernel_h, h.kernel_w)}")
        if b is not None:
            _check(tuple(b.shape) == (W.shape[0],), op,
                   f"bias b of shape {tuple(b.shape)} does not match W's {W.shape[0]} filters")


def conv2d(handle: ConvHandle, x: Tensor, W: Tensor, b: Optional[Tensor] = None,
           odd_padding: Sequence[int] = NO_ODD_PADDING) -> Tensor:
    """2-D convolution of NCHW ``x`` with OIHW ``W`` (+ ``b``) as configured by ``handle``;
    ``odd_padding`` (top, bottom, left, right) is extra zero padding for SAME_UPPER/LOWER."""
    xs = (x, W) if b is None else (x, W, b)
    if type(odd_padding) is tuple and isinstance(handle, ConvHandle):  # (a hashable kind key)
        return kind_call(handle_cache(handle, "_op_recipes"),
                         ("conv", odd_padding), lambda: _Conv2d(handle, odd_padding), xs)
    return _Conv2d(handle, odd_padding)(*xs)[0]


class _Pooling2d(_WindowOp):
    """2-D max or average pooling configured by a PoolingHandle."""

    fn = staticmethod(_pooling2d_kernel)
    handle_type = PoolingHandle

    @staticmethod
    def config(handle: PoolingHandle) -> Dict[str, Any]:
        return dict(kernel=(handle.kernel_h, handle.kernel_w),
                    stride=(handle.stride_h, handle.stride_w),
                    padding=(handle.pad_h, handle.pad_w), is_max=handle.is_max_pooling)

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, x):
        shape, (top, bottom, left, right) = x.shape, self.odd_padding
        # the usual case in one test; the messages are formatted only for a failing input
        if not (len(shape) == 4 and top <= shape[2] and bottom <= shape[2] and left <= shape[3]
                and right <= shape[3]):
            _check(x.ndim == 4, "_Pooling2d",
                   f"input x must be 4-D NCHW, got shape {tuple(x.shape)}")
            _check(False, "_Pooling2d", f"odd_padding {self.odd_padding} exceeds the input's "
                                        f"spatial size {tuple(x.shape[2:])}")
        return super().forward(x)


def pooling_2d(handle: PoolingHandle, x: Tensor,
               odd_padding: Sequence[int] = NO_ODD_PADDING) -> Tensor:
    """Max/average pooling of NCHW ``x`` as configured by ``handle`` (see :class:`_Pooling2d`)."""
    return _Pooling2d(handle, odd_padding)(x)[0]


class _BatchNorm2d(Function):
    """Batch normalisation over (N, C, H, W) or (N, C) input.

    In training mode (``autograd.training`` when the op is made) it normalises with the batch
    statistics and rewrites ``running_mean``/``running_var`` with SINGA's momentum update
    (declared ``writes``); otherwise it normalises with the running statistics (declared
    ``reads`` only) and leaves them alone.
    """

    fn = staticmethod(_batchnorm_kernel)

    def __init__(self, handle: BatchNormHandle, running_mean: Tensor, running_var: Tensor,
                 name: Optional[str] = None):
        if not isinstance(handle, BatchNormHandle):
            raise TypeError(f"_BatchNorm2d: handle must be a BatchNormHandle, got "
                            f"{type(handle).__name__}")
        for what, t in (("running_mean", running_mean), ("running_var", running_var)):
            if not isinstance(t, Tensor):
                raise TypeError(f"_BatchNorm2d: {what} must be a Tensor (it is updated in place), "
                                f"got {type(t).__name__}")
        training, factor, epsilon = is_training(), handle.factor, handle.epsilon
        # (keyed by the mode and the values a user may set on the handle)
        static, key = handle_statics(
            handle, (training, factor, epsilon),
            lambda: dict(momentum=factor, epsilon=epsilon, training=training))
        super().__init__(name, **static)
        self._static = key
        self.handle = handle
        self.running_mean = running_mean
        self.running_var = running_var

    def reads(self) -> Tuple[Tensor, ...]:
        return (self.running_mean, self.running_var)

    def writes(self) -> Tuple[Tensor, ...]:
        return (self.running_mean, self.running_var) if self.static["training"] else ()

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, x, scale, bias):
        shape = x.shape
        # the usual case in one test; the messages are formatted only for a failing input
        if not ((len(shape) == 4 or len(shape) == 2)
                and tuple(scale.shape) == tuple(bias.shape) == self.running_mean.shape
                == self.running_var.shape == (shape[1],)):
            self._check_inputs(x, scale, bias)
        return super().forward(x, scale, bias)

    def _check_inputs(self, x, scale, bias) -> None:
        """InvalidInput naming what does not fit (``forward``'s test failed)."""
        op, c = "_BatchNorm2d", x.shape[1] if x.ndim > 1 else None
        _check(x.ndim in (2, 4), op, f"input x must be (N, C, H, W) or (N, C), got shape "
                                     f"{tuple(x.shape)}")
        for what, shape in (("scale", scale.shape), ("bias", bias.shape),
                            ("running_mean", self.running_mean.shape),
                            ("running_var", self.running_var.shape)):
            _check(tuple(shape) == (c,), op, f"{what} of shape {tuple(shape)} does not match "
                                             f"the {c} channels of x of shape {tuple(x.shape)}")


def batchnorm_2d(handle: BatchNormHandle, x: Tensor, scale: Tensor, bias: Tensor,
                 running_mean: Tensor, running_var: Tensor) -> Tensor:
    """Batch normalisation (see :class:`_BatchNorm2d`); updates the running statistics in
    training mode."""
    if isinstance(handle, BatchNormHandle) and isinstance(running_mean, Tensor) and \
            isinstance(running_var, Tensor):
        # (the kind: this handle's momentum and epsilon, over these running statistics; the
        # recipe holds them, so their ids stay theirs)
        key = ("bn", handle.factor, handle.epsilon, id(running_mean), id(running_var))
        return kind_call(handle_cache(handle, "_op_recipes"), key,
                         lambda: _BatchNorm2d(handle, running_mean, running_var),
                         (x, scale, bias))
    return _BatchNorm2d(handle, running_mean, running_var)(x, scale, bias)[0]


class GlobalAveragePool(Function):
    """Mean over the spatial axes: (N, C, H, W) -> (N, C, 1, 1) for ``channels_first``,
    (N, H, W, C) -> (N, 1, 1, C) for ``channels_last``."""

    fn = staticmethod(_globalaveragepool_kernel)

    def __init__(self, data_format: str = "channels_first"):
        # SINGA reads anything but 'channels_first' as channels last; its tests spell it
        # 'channel_last', so the singular forms are accepted too
        data_format = {"channel_first": "channels_first",
                       "channel_last": "channels_last"}.get(data_format, data_format)
        if data_format not in ("channels_first", "channels_last"):
            raise ValueError(f"GlobalAveragePool: data_format must be 'channels_first' or "
                             f"'channels_last', got {data_format!r}")
        super().__init__(data_format=data_format)
        self.data_format = data_format

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, x):
        _check(x.ndim >= 3, "GlobalAveragePool", f"input must have spatial axes, got shape "
                                                 f"{tuple(x.shape)}")
        return super().forward(x)


def globalaveragepool(x: Tensor, data_format: str = "channels_first") -> Tensor:
    return GlobalAveragePool(data_format)(x)[0]


class Dropout(Function):
    """Inverted dropout: in training, y = x * mask / (1 - ratio) with mask ~ Bernoulli(1 - ratio)
    drawn from the input device's PRNG key (a declared side input, so ``device.SetRandSeed``
    makes it reproducible and graph mode threads it); identity when not training (decided when
    the op is made). Backward uses the same mask.

    ``seed`` is accepted for SINGA's signature; SINGA reseeds the whole device with it on the
    first forward, here randomness comes only from the device key.
    """

    fn = staticmethod(_dropout_kernel)

    def __init__(self, seed: int = 0, ratio: float = 0.5):
        if not 0.0 <= float(ratio) < 1.0:
            raise ValueError(f"Dropout: ratio must be in [0, 1), got {ratio}")
        super().__init__(ratio=float(ratio))
        self.seed = int(seed)
        self.ratio = float(ratio)
        self._identity = not is_training() or self.ratio == 0.0

    def needs_key(self) -> bool:
        return True

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, x):
        return x if self._identity else super().forward(x)

    backward_is_pullback = True  # when not the identity (then a walk runs it op by op)

    def backward(self, dy):
        return dy if self._identity else super().backward(dy)


def dropout(x: Tensor, seed: int = 0, ratio: float = 0.5) -> Tensor:
    return Dropout(seed, ratio)(x)[0]


class Embedding(Function):
    """Row lookup: y[..., :] = w[x[...], :] for integer (or float, truncated) indices ``x``;
    the gradient scatter-adds dy into the looked-up rows of ``w`` (indices get none)."""

    fn = staticmethod(_embedding_kernel)

    def forward(self, x, w):
        _check(w.ndim == 2, "Embedding", f"weight w must be 2-D (vocab, dim), got shape "
                                         f"{tuple(w.shape)} (indices x of shape {tuple(x.shape)})")
        _check(jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating),
               "Embedding", f"indices x must be an int or float array, got {x.dtype}")
        # an index past the table would read NaN rows (JAX fills out-of-bounds gathers), and a
        # negative one would wrap around: reject both (graph mode: at the end of the step)
        check_indices("Embedding", "indices x", x, w.shape[0],
                      f"vocabulary of w with shape {tuple(w.shape)}")
        return super().forward(x, w)


def embedding(x: Tensor, w: Tensor) -> Tensor:
    return Embedding()(x, w)[0]


class CosSim(Function):
    """Row-wise cosine similarity of two (batch, d) tensors; output (batch,)."""

    fn = staticmethod(_cossim_kernel)

    @classmethod
    def dot(cls, a, b):
        """Row-wise dot product of two (batch, d) arrays: (batch,)."""
        return _row_dot(jnp.asarray(a), jnp.asarray(b))

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, a, b):
        _check(a.shape == b.shape and a.ndim == 2, "CosSim",
               f"inputs must be 2-D of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
        return super().forward(a, b)


def cossim(a: Tensor, b: Tensor) -> Tensor:
    return CosSim()(a, b)[0]


class _RNN(Function):
    """SINGA's cuDNN RNN operator, as a portable ``lax.scan`` kernel.

    Inputs: x (seq, batch, feature), hx and cx (layers*dirs, batch, hidden; cx is ignored unless
    LSTM), w (the packed weights, ``handle.weights_size`` values). Output: y (seq, batch,
    hidden*dirs) when ``return_sequences`` else its last time step (batch, hidden*dirs). With
    ``use_mask``, ``seq_lengths`` (a Tensor of batch lengths) marks the valid steps.
    """

    fn = staticmethod(_rnn_op_kernel)

    def __init__(self, handle: RNNHandle, return_sequences: bool = False, use_mask: bool = False,
                 seq_lengths: Optional[Tensor] = None):
        if not isinstance(handle, RNNHandle):
            raise TypeError(f"_RNN: handle must be an RNNHandle, got {type(handle).__name__}")
        if use_mask and not isinstance(seq_lengths, Tensor):
            raise TypeError(f"_RNN: use_mask=True needs seq_lengths as a Tensor, got "
                            f"{type(seq_lengths).__name__}")
        super().__init__(mode=handle.mode, hidden_size=handle.hidden_size,
                         num_layers=handle.num_layers, bidirectional=handle.bidirectional,
                         bias=handle.bias, dropout=handle.dropout,
                         return_sequences=bool(return_sequences), has_lengths=bool(use_mask),
                         has_key=is_training() and handle.dropout > 0.0 and handle.num_layers > 1)
        self.handle = handle
        self.return_sequences = bool(return_sequences)
        self.use_mask = bool(use_mask)
        self.seq_lengths = seq_lengths

    def reads(self) -> Tuple[Tensor, ...]:
        return (self.seq_lengths,) if self.use_mask else ()

    def needs_key(self) -> bool:
        return self.static["has_key"]

    replayable = True  # forward checks shapes only: eager replay may record it

    def forward(self, x, hx, cx, w):
        h, op = self.handle, "_RNN"
        _check(x.ndim == 3 and x.shape[2] == h.feature_size, op,
               f"x must be (seq, batch, {h.feature_size}), got shape {tuple(x.shape)}")
        state = h.state_shape(x.shape[1])
        for what, a in (("hx", hx), ("cx", cx)):
            _check(tuple(a.shape) == state, op, f"{what} of shape {tuple(a.shape)} does not match "
                                                f"{state} for x of shape {tuple(x.shape)}")
        _check(w.size == h.weights_size, op, f"w of shape {tuple(w.shape)} must hold "
                                             f"{h.weights_size} weights")
        if self.use_mask:
            _check(tuple(self.seq_lengths.shape) in ((x.shape[1],), (x.shape[1], 1)), op,
                   f"seq_lengths of shape {tuple(self.seq_lengths.shape)} does not match batch "
                   f"{x.shape[1]}")
        h.seq_length, h.batch_size = x.shape[0], x.shape[1]
        return super().forward(x, hx, cx, w)


# what computes in half precision under autograd.autocast (see autocast.declare)
declare_autocast(COMPUTE, _Conv2d, _RNN)
declare_autocast(FLOAT32, GlobalAveragePool, CosSim)
declare_autocast(NORMALISE, _BatchNorm2d)
