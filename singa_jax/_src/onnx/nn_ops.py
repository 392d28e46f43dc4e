"""The import op table, neural-network family: convolution, pooling, normalisation, dropout,
resizing and the recurrent ops. Same calling convention as :mod:`.registry`.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from singa_jax._src.onnx.registry import NodeCall, register, static_floats, static_ints

__all__ = ["conv_padding", "pool_padding"]


# ------------------------------------------------------------------------------------------
# convolution
# ------------------------------------------------------------------------------------------
def _spatial(call: NodeCall, name: str, default: int, n: int) -> Tuple[int, ...]:
    v = call.attr(name)
    return (default,) * n if v is None else tuple(int(e) for e in v)


def conv_padding(call: NodeCall, in_sizes: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]) -> List[Tuple[int, int]]:
    """(begin, end) padding per spatial axis from ``auto_pad`` / ``pads``."""
    n = len(in_sizes)
    auto = call.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * n
    pads = _spatial(call, "pads", 0, 2 * n)
    return [(pads[i], pads[i + n]) for i in range(n)]


def _check_auto_pad(call: NodeCall) -> Optional[str]:
    auto = call.attr("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad '{auto}'"
    return None


_CONV_DIMS = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"),
              3: ("NCDHW", "OIDHW", "NCDHW")}


def _conv(call, x, w, b=None):
    n = x.ndim - 2
    kernel = tuple(w.shape[2:])
    strides, dil = _spatial(call, "strides", 1, n), _spatial(call, "dilations", 1, n)
    pads = conv_padding(call, x.shape[2:], kernel, strides, dil)
    y = lax.conv_general_dilated(x, w.astype(x.dtype), strides, pads, rhs_dilation=dil,
                                 dimension_numbers=_CONV_DIMS[n],
                                 feature_group_count=call.attr("group", 1))
    return y if b is None else y + b.reshape((1, -1) + (1,) * n).astype(y.dtype)


def _check_conv(call: NodeCall) -> Optional[str]:
    return _check_auto_pad(call)


def _conv_transpose(call, x, w, b=None):
    n, g = x.ndim - 2, call.attr("group", 1)
    kernel = tuple(w.shape[2:])
    strides, dil = _spatial(call, "strides", 1, n), _spatial(call, "dilations", 1, n)
    out_pad = _spatial(call, "output_padding", 0, n)
    in_sizes = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    out_shape, auto = call.attr("output_shape"), call.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-n:] if out_shape is not None else \
            [i * s for i, s in zip(in_sizes, strides)]
        pads = []
        for i, s, e, op, t in zip(in_sizes, strides, eff, out_pad, target):
            total = s * (i - 1) + op + e - t
            half = total // 2
            pads.append((half, total - half) if auto == "SAME_UPPER" else (total - half, half))
    elif auto == "VALID":
        pads = [(0, 0)] * n
    else:
        p = _spatial(call, "pads", 0, 2 * n)
        pads = [(p[i], p[i + n]) for i in range(n)]
    # the transposed conv is a conv of the stride-dilated input with the flipped kernel,
    # (in, out/g) weights regrouped to (out, in/g)
    c_in, c_out_g = w.shape[0], w.shape[1]
    wk = w.reshape((g, c_in // g, c_out_g) + kernel)
    wk = jnp.swapaxes(wk, 1, 2).reshape((g * c_out_g, c_in // g) + kernel)
    wk = jnp.flip(wk, axis=tuple(range(2, 2 + n)))
    lax_pads = [(e - 1 - lo, e - 1 - hi + op) for e, (lo, hi), op in zip(eff, pads, out_pad)]
    y = lax.conv_general_dilated(x, wk.astype(x.dtype), (1,) * n, lax_pads, lhs_dilation=strides,
                                 rhs_dilation=dil, dimension_numbers=_CONV_DIMS[n],
                                 feature_group_count=g)
    return y if b is None else y + b.reshape((1, -1) + (1,) * n).astype(y.dtype)


register("Conv", _conv, attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads",
                               "strides"), check=_check_conv,
         doc="1/2/3-d convolution: groups, dilations, pads, auto_pad")
register("ConvTranspose", _conv_transpose,
         attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                "output_shape", "pads", "strides"), check=_check_conv,
         doc="transposed convolution: groups, dilations, output_padding/output_shape")


# ------------------------------------------------------------------------------------------
# pooling
# ------------------------------------------------------------------------------------------
def pool_padding(call: NodeCall, in_sizes: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]
                 ) -> Tuple[List[Tuple[int, int]], List[int]]:
    """(explicit (begin, end) pads, extra end padding that ceil_mode adds) per spatial axis."""
    pads = conv_padding(call, in_sizes, kernel, strides, dilations)
    extra = []
    for size, k, s, d, (lo, hi) in zip(in_sizes, kernel, strides, dilations, pads):
        span = size + lo + hi - ((k - 1) * d + 1)
        if call.attr("ceil_mode", 0):
            out = -(-span // s) + 1
            if (out - 1) * s >= size + lo:  # the last window must start inside the input
                out -= 1
        else:
            out = span // s + 1
        extra.append(max((out - 1) * s + (k - 1) * d + 1 - (size + lo + hi), 0))
    return pads, extra


def _pool_setup(call, x):
    n = x.ndim - 2
    kernel = tuple(call.attr("kernel_shape"))
    strides, dil = _spatial(call, "strides", 1, n), _spatial(call, "dilations", 1, n)
    pads, extra = pool_padding(call, x.shape[2:], kernel, strides, dil)
    window, wstrides, wdil = (1, 1) + kernel, (1, 1) + strides, (1, 1) + dil
    return n, pads, extra, window, wstrides, wdil


def _maxpool(call, x):
    n, pads, extra, window, strides, dil = _pool_setup(call, x)
    full = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    init = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    # a concrete NumPy init value lets JAX see a max-reduction and differentiate it
    return lax.reduce_window(x, np.array(init, x.dtype), lax.max, window, strides, full,
                             window_dilation=dil)


def _avgpool(call, x):
    n, pads, extra, window, strides, dil = _pool_setup(call, x)
    full = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, window, strides, full,
                              window_dilation=dil)
    # the divisor counts the input elements under each window, plus the explicit pads with
    # count_include_pad (never the ceil_mode extension)
    ones = jnp.ones((1, 1) + x.shape[2:], x.dtype)
    if call.attr("count_include_pad", 0):
        ones = jnp.pad(ones, [(0, 0), (0, 0)] + list(pads), constant_values=1)
        cpads = [(0, 0), (0, 0)] + [(0, e) for e in extra]
    else:
        cpads = full
    count = lax.reduce_window(ones, np.array(0, x.dtype), lax.add, window, strides, cpads,
                              window_dilation=dil)
    return total / count


def _lppool(call, x):
    n, pads, extra, window, strides, dil = _pool_setup(call, x)
    p = call.attr("p", 2)
    full = [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    s = lax.reduce_window(jnp.abs(x) ** p, np.array(0, x.dtype), lax.add, window, strides,
                          full, window_dilation=dil)
    return s ** (1.0 / p)


def _check_pool(call: NodeCall) -> Optional[str]:
    if call.op_type == "MaxPool" and call.n_outputs > 1:
        return "the Indices output (second output) of MaxPool"
    if call.attr("kernel_shape") is None:
        return "a missing kernel_shape attribute"
    return _check_auto_pad(call)


_POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")
register("MaxPool", _maxpool, attrs=_POOL_ATTRS + ("storage_order",), check=_check_pool,
         doc="max pooling: pads, auto_pad, ceil_mode, dilations (no Indices output)")
register("AveragePool", _avgpool, attrs=_POOL_ATTRS + ("count_include_pad",), check=_check_pool,
         doc="average pooling: pads, auto_pad, ceil_mode, count_include_pad")
register("LpPool", _lppool, attrs=_POOL_ATTRS + ("p",), check=_check_pool, doc="Lp pooling")
register("GlobalAveragePool", lambda call, x: jnp.mean(x, tuple(range(2, x.ndim)), keepdims=True),
         doc="mean over the spatial axes")
register("GlobalMaxPool", lambda call, x: jnp.max(x, tuple(range(2, x.ndim)), keepdims=True),
         doc="max over the spatial axes")


# ------------------------------------------------------------------------------------------
# normalisation, dropout
# ------------------------------------------------------------------------------------------
def _bn_training(call: NodeCall) -> bool:
    """Batch statistics when the node says training_mode=1 (opset 14+) or when the imported
    model is being trained (fine-tuning, like SINGA's BatchNorm2d layer)."""
    return bool(call.attr("training_mode", 0)) or call.training


def _batchnorm(call, x, scale, bias, mean, var):
    eps, momentum = call.attr("epsilon", 1e-5), call.attr("momentum", 0.9)
    cshape = (1, -1) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    if _bn_training(call):
        bmean = jnp.mean(x, axes)
        bvar = jnp.mean(jnp.square(x - bmean.reshape(cshape)), axes)
        y = (x - bmean.reshape(cshape)) * lax.rsqrt(bvar + eps).reshape(cshape) * \
            scale.reshape(cshape) + bias.reshape(cshape)
        bmean, bvar = lax.stop_gradient(bmean), lax.stop_gradient(bvar)
        new_mean = (mean * momentum + bmean * (1 - momentum)).astype(mean.dtype)
        new_var = (var * momentum + bvar * (1 - momentum)).astype(var.dtype)
        if call.training:  # fine-tuning: the graph's running statistics follow the batches
            call.state_updates[3], call.state_updates[4] = new_mean, new_var
        return (y, new_mean, new_var)[:call.n_outputs] if call.n_outputs > 1 else y
    y = (x - mean.reshape(cshape)) * lax.rsqrt(var + eps).reshape(cshape) * \
        scale.reshape(cshape) + bias.reshape(cshape)
    return y


def _check_bn(call: NodeCall) -> Optional[str]:
    if call.opset < 9 and call.attr("spatial", 1) != 1:
        return "spatial=0"
    if call.n_outputs > 3:
        return "the saved_mean/saved_var outputs (opset < 14)"
    return None


def _instancenorm(call, x, scale, bias):
    axes = tuple(range(2, x.ndim))
    cshape = (1, -1) + (1,) * (x.ndim - 2)
    mean = jnp.mean(x, axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(var + call.attr("epsilon", 1e-5))
    return y * scale.reshape(cshape) + bias.reshape(cshape)


def _layernorm(call, x, scale, bias=None):
    axis = call.attr("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    axes = tuple(range(axis, x.ndim))
    mean = jnp.mean(x, axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axes, keepdims=True)
    inv = lax.rsqrt(var + call.attr("epsilon", 1e-5))
    y = (x - mean) * inv * scale
    y = y if bias is None else y + bias
    return (y, mean, inv)[:call.n_outputs] if call.n_outputs > 1 else y


def _lrn(call, x):
    size = call.attr("size")
    alpha, beta, bias = call.attr("alpha", 1e-4), call.attr("beta", 0.75), call.attr("bias", 1.0)
    sq = jnp.square(x)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    window = (1, size) + (1,) * (x.ndim - 2)
    pads = [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2)
    s = lax.reduce_window(sq, np.array(0, x.dtype), lax.add, window, (1,) * x.ndim, pads)
    return x / (bias + alpha / size * s) ** beta


def _dropout(call, x, ratio=None, training_mode=None):
    if call.opset < 12:
        rate = call.attr("ratio", 0.5)
    else:
        rate = 0.5 if ratio is None else float(np.asarray(ratio).reshape(()))
    train = call.training or (training_mode is not None and bool(np.asarray(training_mode)))
    if not train or rate == 0.0:
        y, mask = x, jnp.ones(x.shape, jnp.bool_)
    else:
        mask = jax.random.bernoulli(call.key, 1.0 - rate, x.shape)
        y = jnp.where(mask, x / (1.0 - rate), 0).astype(x.dtype)
    return (y, mask) if call.n_outputs > 1 else y


register("BatchNormalization", _batchnorm,
         attrs=("epsilon", "momentum", "training_mode", "spatial", "is_test", "consumed_inputs"),
         state=(3, 4), check=_check_bn,
         doc="inference mode; batch statistics + running update in training (fine-tuning)")
register("InstanceNormalization", _instancenorm, attrs=("epsilon",), doc="per-instance norm")
register("LayerNormalization", _layernorm, attrs=("axis", "epsilon", "stash_type"),
         doc="normalise over the axes from axis on")
register("LRN", _lrn, attrs=("alpha", "beta", "bias", "size"), doc="local response norm")
register("Dropout", _dropout, attrs=("ratio", "seed", "is_test"), static=(1, 2), needs_key=True,
         doc="identity in inference; inverted dropout while training")


# ------------------------------------------------------------------------------------------
# resizing
# ------------------------------------------------------------------------------------------
def _source_coords(call: NodeCall, mode: str, out_len: int, in_len: int, scale: float):
    x = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adj = out_len / (scale * in_len)
        center = in_len / 2 * (1 - adj)
        return center + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "align_corners":  # the resized length is in_len * scale, before flooring
        resized = in_len * scale
        return x * (in_len - 1) / (resized - 1) if resized > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    raise call.fail(f"coordinate_transformation_mode '{mode}' is not supported")


def _nearest_index(call: NodeCall, src: np.ndarray, in_len: int) -> np.ndarray:
    rule = call.attr("nearest_mode", "round_prefer_floor")
    if rule == "floor":
        idx = np.floor(src)
    elif rule == "ceil":
        idx = np.ceil(src)
    elif rule == "round_prefer_ceil":
        idx = np.floor(src + 0.5)
    else:
        idx = np.ceil(src - 0.5)
    return np.clip(idx, 0, in_len - 1).astype(np.int32)


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights of the 4 taps at offsets -1, 0, 1, 2 from floor(src)."""
    def k(d):
        d = np.abs(d)
        return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                        np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return np.stack([k(t + 1), k(t), k(1 - t), k(2 - t)], axis=-1)


def _resize_axis(call: NodeCall, x, axis: int, out_len: int, scale: float, mode: str,
                 coord: str):
    in_len = x.shape[axis]
    if out_len == in_len and scale == 1.0 and coord != "tf_crop_and_resize":
        return x
    src = _source_coords(call, coord, out_len, in_len, scale)
    if mode == "nearest":
        return jnp.take(x, _nearest_index(call, src, in_len), axis=axis)
    base = np.floor(src)
    t = src - base
    if mode == "linear":
        taps, weights = [base, base + 1], np.stack([1 - t, t], axis=-1)
    else:
        taps = [base - 1, base, base + 1, base + 2]
        weights = _cubic_weights(t, call.attr("cubic_coeff_a", -0.75))
        if call.attr("exclude_outside", 0):
            inside = np.stack([(p >= 0) & (p < in_len) for p in taps], axis=-1)
            weights = weights * inside
            weights = weights / weights.sum(-1, keepdims=True)
    out = 0
    shape = [1] * x.ndim
    shape[axis] = out_len
    for i, p in enumerate(taps):
        idx = np.clip(p, 0, in_len - 1).astype(np.int32)
        w = jnp.asarray(weights[:, i].reshape(shape), x.dtype)
        out = out + jnp.take(x, idx, axis=axis) * w
    return out.astype(x.dtype)


def _resize_impl(call: NodeCall, x, scales: Optional[Sequence[float]],
                 sizes: Optional[Sequence[int]], mode: str, coord: str,
                 axes: Optional[Sequence[int]] = None):
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in axes]
    if sizes:
        sizes = list(sizes)
        policy = call.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [s / x.shape[a] for s, a in zip(sizes, axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(math.floor(r * x.shape[a] + 0.5)) for a in axes]
            scales = [r] * len(axes)
        else:
            scales = [s / x.shape[a] for s, a in zip(sizes, axes)]
    else:
        sizes = [int(math.floor(x.shape[a] * s)) for a, s in zip(axes, scales)]
    y = x
    for a, n, s in zip(axes, sizes, scales):
        y = _resize_axis(call, y, a, n, float(s), mode, coord)
    return y


def _resize(call, x, roi=None, scales=None, sizes=None):
    if call.opset < 11:  # inputs (X, scales)
        scales, roi = roi, None
    scales = static_floats(call, scales, "scales")
    sizes = static_ints(call, sizes, "sizes")
    coord = "asymmetric" if call.opset < 11 else \
        call.attr("coordinate_transformation_mode", "half_pixel")
    if call.opset < 11 and call.attr("mode", "nearest") == "nearest":
        call.attrs.setdefault("nearest_mode", "floor")
    return _resize_impl(call, x, scales or None, sizes or None, call.attr("mode", "nearest"),
                        coord, call.attr("axes"))


def _check_resize(call: NodeCall) -> Optional[str]:
    mode = call.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        return f"mode '{mode}'"
    coord = call.attr("coordinate_transformation_mode", "half_pixel")
    if coord == "tf_crop_and_resize":
        return "coordinate_transformation_mode 'tf_crop_and_resize'"
    if call.attr("antialias", 0):
        return "antialias=1"
    return None


def _upsample(call, x, scales=None):
    scales = call.attr("scales") if call.opset < 9 else static_floats(call, scales, "scales")
    call.attrs.setdefault("nearest_mode", "floor")
    return _resize_impl(call, x, scales, None, call.attr("mode", "nearest"), "asymmetric")


register("Resize", _resize,
         attrs=("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
                "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
                "nearest_mode"), static=(1, 2, 3), check=_check_resize,
         doc="nearest / linear / cubic; every coordinate mode but tf_crop_and_resize")
register("Upsample", _upsample, attrs=("mode", "scales"), static=(1,), check=_check_resize,
         doc="nearest / linear (asymmetric coordinates)")


# ------------------------------------------------------------------------------------------
# recurrent ops: RNN, GRU, LSTM (layout 0 or 1, forward / reverse / bidirectional)
# ------------------------------------------------------------------------------------------
_ACTIVATIONS: Dict[str, Callable] = {
    "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh, "relu": jax.nn.relu,
    "hardsigmoid": lambda x: jnp.clip(0.2 * x + 0.5, 0, 1), "softsign": lambda x: x / (1 + jnp.abs(x)),
    "softplus": jax.nn.softplus,
}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activations(call: NodeCall, dirs: int) -> List[List[Callable]]:
    names = call.attr("activations") or _DEFAULT_ACTS[call.op_type] * dirs
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    per = len(_DEFAULT_ACTS[call.op_type])
    if len(names) == per and dirs == 2:
        names = names * 2
    return [[_ACTIVATIONS[n.lower()] for n in names[d * per:(d + 1) * per]] for d in range(dirs)]


def _cell(kind: str, acts, clip, hidden: int, linear_before_reset: int):
    """One time step ``(h, c), (x_proj, ok) -> ...`` of an ONNX RNN/GRU/LSTM."""
    def clipped(v):
        return v if clip is None else jnp.clip(v, -clip, clip)

    def step(R, Rb, carry, xp):
        h, c = carry
        if kind == "RNN":
            return acts[0](clipped(xp + h @ R.T + Rb)), c
        if kind == "LSTM":
            g = clipped(xp + h @ R.T + Rb)
            i, o, f, cc = jnp.split(g, 4, axis=-1)
            c_new = acts[0](f) * c + acts[0](i) * acts[1](cc)
            return acts[0](o) * acts[2](c_new), c_new
        xz, xr, xh = jnp.split(xp, 3, axis=-1)
        Rz, Rr, Rh = jnp.split(R, 3, axis=0)
        bz, br, bh = jnp.split(Rb, 3, axis=-1)
        z = acts[0](clipped(xz + h @ Rz.T + bz))
        r = acts[0](clipped(xr + h @ Rr.T + br))
        if linear_before_reset:
            hh = acts[1](clipped(xh + r * (h @ Rh.T + bh)))
        else:
            hh = acts[1](clipped(xh + (r * h) @ Rh.T + bh))
        return (1 - z) * hh + z * h, c
    return step


def _recurrent(call, x, W, R, B=None, seq_lens=None, h0=None, c0=None, P=None):
    kind, layout = call.op_type, call.attr("layout", 0)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
    T, batch = x.shape[0], x.shape[1]
    dirs, hidden = W.shape[0], call.attr("hidden_size", R.shape[-1])
    gh = _GATES[kind] * hidden
    B = jnp.zeros((dirs, 2 * gh), x.dtype) if B is None else B
    h0 = jnp.zeros((dirs, batch, hidden), x.dtype) if h0 is None else \
        (jnp.swapaxes(h0, 0, 1) if layout else h0)
    c0 = jnp.zeros((dirs, batch, hidden), x.dtype) if c0 is None else \
        (jnp.swapaxes(c0, 0, 1) if layout else c0)
    lengths = jnp.full((batch,), T, jnp.int32) if seq_lens is None else seq_lens.astype(jnp.int32)
    t = jnp.arange(T)[:, None]
    valid = t < lengths[None, :]
    rev_idx = jnp.where(valid, lengths[None, :] - 1 - t, t)  # reverse within each length
    acts = _activations(call, dirs)
    direction = call.attr("direction", "forward")
    ys, hs, cs = [], [], []
    for d in range(dirs):
        backward = direction == "reverse" or d == 1
        seq = jnp.take_along_axis(x, rev_idx[:, :, None], axis=0) if backward else x
        xp = jnp.einsum("tbi,gi->tbg", seq, W[d]) + B[d, :gh]
        step = _cell(kind, acts[d], call.attr("clip"), hidden, call.attr("linear_before_reset", 0))

        def body(carry, inp, d=d, step=step):
            xpt, ok = inp
            h_new, c_new = step(R[d], B[d, gh:], carry, xpt)
            ok = ok[:, None]
            h, c = carry
            return (jnp.where(ok, h_new, h), jnp.where(ok, c_new, c)), jnp.where(ok, h_new, 0)

        (h, c), y = lax.scan(body, (h0[d], c0[d]), (xp, valid))
        ys.append(jnp.take_along_axis(y, rev_idx[:, :, None], axis=0) if backward else y)
        hs.append(h)
        cs.append(c)
    Y, Yh, Yc = jnp.stack(ys, 1), jnp.stack(hs), jnp.stack(cs)  # (T, dirs, B, H)
    if layout:
        Y, Yh, Yc = jnp.transpose(Y, (2, 0, 1, 3)), jnp.swapaxes(Yh, 0, 1), jnp.swapaxes(Yc, 0, 1)
    outs = (Y, Yh, Yc) if kind == "LSTM" else (Y, Yh)
    return outs[:call.n_outputs] if call.n_outputs > 1 else outs[0]


def _check_recurrent(call: NodeCall) -> Optional[str]:
    names = call.attr("activations") or []
    for n in names:
        n = n.decode() if isinstance(n, bytes) else n
        if n.lower() not in _ACTIVATIONS:
            return f"activation '{n}'"
    if call.attr("input_forget", 0):
        return "input_forget=1"
    if call.attr("activation_alpha") or call.attr("activation_beta"):
        return "activation_alpha/activation_beta"
    return None


_RNN_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction",
              "hidden_size", "layout")
register("RNN", _recurrent, attrs=_RNN_ATTRS, check=_check_recurrent,
         doc="simple RNN, any direction, sequence_lens, layout 0/1")
register("GRU", _recurrent, attrs=_RNN_ATTRS + ("linear_before_reset",), check=_check_recurrent,
         doc="GRU, linear_before_reset 0/1")
register("LSTM", _recurrent, attrs=_RNN_ATTRS + ("input_forget",), check=_check_recurrent,
         doc="LSTM without peepholes")
