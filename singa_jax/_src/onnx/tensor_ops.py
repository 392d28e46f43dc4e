"""The import op table, tensor family: elementwise, reductions, shapes, indexing, constants
(the calling convention: :mod:`.registry`)."""
from __future__ import annotations

import builtins
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

from singa_jax._src.onnx.registry import (NodeCall, checked_axis, jax_dtype, register,
                                         static_floats, static_ints)

__all__: list = []  # the ops are registered in OPS


def _axes(call: NodeCall, axes: Optional[Sequence[int]], ndim: int) -> Optional[Tuple[int, ...]]:
    return None if axes is None else tuple(checked_axis(call, a, ndim) for a in axes)


def _attr_or_input(call: NodeCall, attr: str, value: Any, since: int) -> Optional[Tuple[int, ...]]:
    """Ints given by attribute ``attr`` before opset ``since`` and by an input from it on."""
    if call.opset < since:
        v = call.attr(attr)
        return None if v is None else tuple(int(e) for e in v)
    return static_ints(call, value, attr)


# ------------------------------------------------------------------------------------------
# elementwise: unary
# ------------------------------------------------------------------------------------------
def _unary(fn: Callable) -> Callable:
    def run(call, x):
        return fn(x)
    run.__doc__ = fn.__doc__
    return run


def _hardswish(x):
    return x * jnp.clip(x / 6.0 + 0.5, 0.0, 1.0)


def _mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


UNARY: Dict[str, Callable] = {
    "Abs": jnp.abs, "Acos": jnp.arccos, "Acosh": jnp.arccosh, "Asin": jnp.arcsin,
    "Asinh": jnp.arcsinh, "Atan": jnp.arctan, "Atanh": jnp.arctanh, "Ceil": jnp.ceil,
    "Cos": jnp.cos, "Cosh": jnp.cosh, "Erf": jsp.erf, "Exp": jnp.exp, "Floor": jnp.floor,
    "Log": jnp.log, "Neg": jnp.negative, "Not": jnp.logical_not,
    "Reciprocal": lambda x: 1 / x, "Relu": jax.nn.relu, "Round": jnp.round,
    "Sigmoid": jax.nn.sigmoid, "Sign": jnp.sign, "Sin": jnp.sin, "Sinh": jnp.sinh,
    "Softplus": jax.nn.softplus, "Softsign": lambda x: x / (1 + jnp.abs(x)), "Sqrt": jnp.sqrt,
    "Tan": jnp.tan, "Tanh": jnp.tanh, "IsNaN": jnp.isnan, "HardSwish": _hardswish, "Mish": _mish,
}
for _name, _fn in UNARY.items():
    register(_name, _unary(_fn), doc=f"elementwise {_name}")


def _isinf(call, x):
    neg, pos = call.attr("detect_negative", 1), call.attr("detect_positive", 1)
    return (jnp.isneginf(x) & bool(neg)) | (jnp.isposinf(x) & bool(pos))


register("IsInf", _isinf, attrs=("detect_negative", "detect_positive"), doc="elementwise IsInf")


def _elu(call, x):
    a = call.attr("alpha", 1.0)
    return jnp.where(x >= 0, x, a * jnp.expm1(jnp.minimum(x, 0))).astype(x.dtype)


def _selu(call, x):
    a, g = call.attr("alpha", 1.67326319217681884765625), call.attr("gamma", 1.05070102214813232421875)
    return (g * jnp.where(x > 0, x, a * jnp.expm1(jnp.minimum(x, 0)))).astype(x.dtype)


def _celu(call, x):
    a = call.attr("alpha", 1.0)
    return (jnp.maximum(x, 0) + jnp.minimum(0, a * jnp.expm1(jnp.minimum(x, 0) / a))).astype(x.dtype)


def _leakyrelu(call, x):
    return jnp.where(x >= 0, x, call.attr("alpha", 0.01) * x).astype(x.dtype)


def _thresholdedrelu(call, x):
    return jnp.where(x > call.attr("alpha", 1.0), x, 0).astype(x.dtype)


def _hardsigmoid(call, x):
    return jnp.clip(call.attr("alpha", 0.2) * x + call.attr("beta", 0.5), 0, 1).astype(x.dtype)


def _gelu(call, x):
    return jax.nn.gelu(x, approximate=call.attr("approximate", "none") == "tanh")


def _shrink(call, x):
    bias, lambd = call.attr("bias", 0.0), call.attr("lambd", 0.5)
    return jnp.where(x < -lambd, x + bias, jnp.where(x > lambd, x - bias, 0)).astype(x.dtype)


def _clip(call, x, lo=None, hi=None):
    if call.opset < 11:
        lo, hi = call.attr("min", -np.inf), call.attr("max", np.inf)
    lo = jnp.asarray(-jnp.inf if lo is None else lo).astype(x.dtype) \
        if jnp.issubdtype(x.dtype, jnp.floating) else (jnp.iinfo(x.dtype).min if lo is None else lo)
    hi = jnp.asarray(jnp.inf if hi is None else hi).astype(x.dtype) \
        if jnp.issubdtype(x.dtype, jnp.floating) else (jnp.iinfo(x.dtype).max if hi is None else hi)
    return jnp.minimum(jnp.maximum(x, lo), hi).astype(x.dtype)


register("Elu", _elu, attrs=("alpha",), doc="alpha * (exp(x) - 1) for x < 0")
register("Selu", _selu, attrs=("alpha", "gamma"), doc="scaled ELU")
register("Celu", _celu, attrs=("alpha",), doc="continuously differentiable ELU")
register("LeakyRelu", _leakyrelu, attrs=("alpha",), doc="alpha * x for x < 0")
register("ThresholdedRelu", _thresholdedrelu, attrs=("alpha",), doc="x where x > alpha")
register("HardSigmoid", _hardsigmoid, attrs=("alpha", "beta"), doc="clip(alpha x + beta, 0, 1)")
register("Gelu", _gelu, attrs=("approximate",), doc="exact or tanh-approximated GELU")
register("Shrink", _shrink, attrs=("bias", "lambd"), doc="soft/hard shrinkage")
register("Clip", _clip, attrs=("min", "max"), const=(1, 2),
         doc="clip to [min, max] (attributes before opset 11, inputs since)")


# ------------------------------------------------------------------------------------------
# elementwise: binary and variadic (NumPy broadcasting)
# ------------------------------------------------------------------------------------------
def _div(a, b):
    if jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        return lax.div(*jnp.broadcast_arrays(a, b))  # C truncation, as ONNX
    return a / b


def _pow(a, b):
    return jnp.power(a, b.astype(a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else b) \
        .astype(a.dtype)


def _mod(call, a, b):
    if call.attr("fmod", 0):
        return jnp.fmod(a, b)
    return jnp.mod(a, b)


def _prelu(call, x, slope):
    return jnp.where(x >= 0, x, slope * x).astype(x.dtype)


def _binary(fn: Callable) -> Callable:
    def run(call, a, b):
        return fn(a, b)
    return run


BINARY: Dict[str, Callable] = {
    "Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": _div, "Pow": _pow,
    "And": jnp.logical_and, "Or": jnp.logical_or, "Xor": jnp.logical_xor, "Equal": jnp.equal,
    "Greater": jnp.greater, "Less": jnp.less, "GreaterOrEqual": jnp.greater_equal,
    "LessOrEqual": jnp.less_equal, "BitwiseAnd": jnp.bitwise_and, "BitwiseOr": jnp.bitwise_or,
    "BitwiseXor": jnp.bitwise_xor,
}
for _name, _fn in BINARY.items():
    register(_name, _binary(_fn), doc=f"elementwise {_name} (broadcasting)")
register("Mod", _mod, attrs=("fmod",), doc="remainder (sign of divisor, or of dividend with fmod)")
register("PRelu", _prelu, doc="slope * x for x < 0 (slope broadcasts)")


def _variadic(fn: Callable) -> Callable:
    def run(call, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return run


register("Sum", _variadic(jnp.add), doc="elementwise sum of the inputs")
register("Max", _variadic(jnp.maximum), doc="elementwise max of the inputs")
register("Min", _variadic(jnp.minimum), doc="elementwise min of the inputs")
register("Mean", lambda call, *xs: _variadic(jnp.add)(call, *xs) / len(xs),
         doc="elementwise mean of the inputs")


def _where(call, cond, a, b):
    return jnp.where(cond, a, b)


register("Where", _where, doc="a where cond else b")


# ------------------------------------------------------------------------------------------
# softmax family, matrix products
# ------------------------------------------------------------------------------------------
def _softmax_axes(call: NodeCall, x) -> Tuple[int, ...]:
    """Opset < 13: the input is viewed as 2-d at ``axis`` (default 1), so the op normalises over
    every axis from ``axis`` on; opset 13+: over ``axis`` (default -1) alone."""
    if call.opset < 13:
        a = checked_axis(call, call.attr("axis", 1), max(x.ndim, 1))
        return tuple(range(a, x.ndim))
    return (checked_axis(call, call.attr("axis", -1), max(x.ndim, 1)),)


def _softmax(call, x):
    return jax.nn.softmax(x, axis=_softmax_axes(call, x))


def _logsoftmax(call, x):
    return jax.nn.log_softmax(x, axis=_softmax_axes(call, x))


def _hardmax(call, x):
    axes = _softmax_axes(call, x)
    lead = x.shape[:axes[0]]
    flat = x.reshape(lead + (-1,)) if len(axes) > 1 else jnp.moveaxis(x, axes[0], -1)
    hot = jax.nn.one_hot(jnp.argmax(flat, axis=-1), flat.shape[-1], dtype=x.dtype)
    return hot.reshape(x.shape) if len(axes) > 1 else jnp.moveaxis(hot, -1, axes[0])


register("Softmax", _softmax, attrs=("axis",), doc="softmax (2-d view before opset 13)")
register("LogSoftmax", _logsoftmax, attrs=("axis",), doc="log of softmax")
register("Hardmax", _hardmax, attrs=("axis",), doc="one-hot of the argmax")


def _gemm(call, a, b, c=None):
    a = a.T if call.attr("transA", 0) else a
    b = b.T if call.attr("transB", 0) else b
    y = call.attr("alpha", 1.0) * jnp.matmul(a, b)
    return y if c is None else y + call.attr("beta", 1.0) * c


register("MatMul", lambda call, a, b: jnp.matmul(a, b), doc="NumPy matmul")
register("Gemm", _gemm, attrs=("alpha", "beta", "transA", "transB"),
         doc="alpha * A' B' + beta * C")


def _einsum(call, *xs):
    return jnp.einsum(call.attr("equation"), *xs)


register("Einsum", _einsum, attrs=("equation",), doc="Einstein summation")


# ------------------------------------------------------------------------------------------
# reductions
# ------------------------------------------------------------------------------------------
def _reduction(reduce: Callable, axes_input_since: int) -> Callable:
    """A Reduce* op: axes by attribute before opset ``axes_input_since``, by input from it on;
    no axes means all of them unless ``noop_with_empty_axes``."""

    def run(call, x, axes=None):
        axes = _attr_or_input(call, "axes", axes, axes_input_since)
        if not axes:
            if call.attr("noop_with_empty_axes", 0):
                return x
            axes = tuple(range(x.ndim))
        axes = _axes(call, axes, x.ndim)
        return reduce(x, axes, bool(call.attr("keepdims", 1)))
    return run


def _logsumexp(x, axes, keep):
    return jsp.logsumexp(x, axis=axes, keepdims=keep)


REDUCTIONS: Dict[str, Tuple[Callable, int]] = {
    "ReduceSum": (lambda x, a, k: jnp.sum(x, a, keepdims=k), 13),
    "ReduceMean": (lambda x, a, k: jnp.mean(x, a, keepdims=k), 18),
    "ReduceMax": (lambda x, a, k: jnp.max(x, a, keepdims=k), 18),
    "ReduceMin": (lambda x, a, k: jnp.min(x, a, keepdims=k), 18),
    "ReduceProd": (lambda x, a, k: jnp.prod(x, a, keepdims=k), 18),
    "ReduceL1": (lambda x, a, k: jnp.sum(jnp.abs(x), a, keepdims=k), 18),
    "ReduceL2": (lambda x, a, k: jnp.sqrt(jnp.sum(x * x, a, keepdims=k)).astype(x.dtype), 18),
    "ReduceLogSum": (lambda x, a, k: jnp.log(jnp.sum(x, a, keepdims=k)), 18),
    "ReduceLogSumExp": (_logsumexp, 18),
    "ReduceSumSquare": (lambda x, a, k: jnp.sum(x * x, a, keepdims=k), 18),
}
for _name, (_fn, _since) in REDUCTIONS.items():
    register(_name, _reduction(_fn, _since), attrs=("axes", "keepdims", "noop_with_empty_axes"),
             static=(1,), doc=f"{_name[6:]} over axes (axes input from opset {_since})")


def _arg(which: Callable) -> Callable:
    def run(call, x):
        axis = checked_axis(call, call.attr("axis", 0), x.ndim)
        if call.attr("select_last_index", 0):
            flipped = jnp.flip(x, axis)
            idx = x.shape[axis] - 1 - which(flipped, axis=axis)
        else:
            idx = which(x, axis=axis)
        idx = idx.astype(jnp.int32)
        return jnp.expand_dims(idx, axis) if call.attr("keepdims", 1) else idx
    return run


register("ArgMax", _arg(jnp.argmax), attrs=("axis", "keepdims", "select_last_index"),
         doc="index of the max along axis")
register("ArgMin", _arg(jnp.argmin), attrs=("axis", "keepdims", "select_last_index"),
         doc="index of the min along axis")


def _cumsum(call, x, axis):
    ax = checked_axis(call, static_ints(call, axis, "axis")[0], x.ndim)
    y = jnp.flip(x, ax) if call.attr("reverse", 0) else x
    out = jnp.cumsum(y, axis=ax)
    if call.attr("exclusive", 0):
        out = out - y
    return jnp.flip(out, ax) if call.attr("reverse", 0) else out


register("CumSum", _cumsum, attrs=("exclusive", "reverse"), static=(1,), doc="cumulative sum")


# ------------------------------------------------------------------------------------------
# shape manipulation
# ------------------------------------------------------------------------------------------
def _reshape(call, x, shape=None):
    target = list(call.attr("shape")) if call.opset < 5 else list(static_ints(call, shape, "shape"))
    if not call.attr("allowzero", 0):
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    known = math.prod(s for s in target if s != -1)
    if target.count(-1) > 1 or (-1 in target and (known == 0 or x.size % known)) or \
            (-1 not in target and known != x.size):
        raise ValueError(f"{call.describe()}: cannot reshape {x.shape} to {target}")
    return jnp.reshape(x, [x.size // known if s == -1 else s for s in target])


def _flatten(call, x):
    a = call.attr("axis", 1)
    a = a + x.ndim if a < 0 else a
    return jnp.reshape(x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))


def _transpose(call, x):
    perm = call.attr("perm")
    return jnp.transpose(x, None if perm is None else tuple(perm))


def _squeeze(call, x, axes=None):
    axes = _attr_or_input(call, "axes", axes, 13)
    if not axes:
        return jnp.squeeze(x)
    return jnp.squeeze(x, _axes(call, axes, x.ndim))


def _unsqueeze(call, x, axes=None):
    axes = _attr_or_input(call, "axes", axes, 13)
    ndim = x.ndim + len(axes)
    return jnp.reshape(x, _unsqueezed_shape(x.shape, _axes(call, axes, ndim)))


def _unsqueezed_shape(shape, axes):
    it = iter(shape)
    return tuple(1 if i in axes else next(it) for i in range(len(shape) + len(axes)))


def _concat(call, *xs):
    xs = [x for x in xs if x is not None]
    return jnp.concatenate(xs, axis=checked_axis(call, call.attr("axis"), xs[0].ndim))


def _split(call, x, split=None):
    ax = checked_axis(call, call.attr("axis", 0), x.ndim)
    parts = _attr_or_input(call, "split", split, 13)
    n = x.shape[ax]
    if not parts:
        count = call.attr("num_outputs", call.n_outputs)
        size = -(-n // count)  # opset 18: the last piece may be smaller
        parts = [size] * (count - 1) + [n - size * (count - 1)]
    starts = np.cumsum([0] + list(parts[:-1]))
    return tuple(lax.slice_in_dim(x, int(s), int(s) + int(p), axis=ax)
                 for s, p in zip(starts, parts))


def _clamp_index(v: int, n: int, lo: int, hi: int) -> int:
    v = v + n if v < 0 else v
    return min(max(v, lo), hi)


def _slice(call, x, starts=None, ends=None, axes=None, steps=None):
    if call.opset < 10:
        starts, ends, axes = call.attr("starts"), call.attr("ends"), call.attr("axes")
        steps = None
    else:
        starts, ends = static_ints(call, starts, "starts"), static_ints(call, ends, "ends")
        axes, steps = static_ints(call, axes, "axes"), static_ints(call, steps, "steps")
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [builtins.slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = checked_axis(call, a, x.ndim)
        n = x.shape[a]
        if st > 0:
            s, e = _clamp_index(s, n, 0, n), _clamp_index(e, n, 0, n)
        else:  # a negative step may end before index 0: None, not -1, says so
            s, e = _clamp_index(s, n, -1, n - 1), _clamp_index(e, n, -1, n - 1)
            e = None if e < 0 else e
        index[a] = builtins.slice(s, e, st)
    return x[tuple(index)]


def _gather(call, x, idx):
    ax = checked_axis(call, call.attr("axis", 0), x.ndim)
    idx = jnp.asarray(idx)
    return jnp.take(x, jnp.where(idx < 0, idx + x.shape[ax], idx), axis=ax)


def _gather_elements(call, x, idx):
    ax = checked_axis(call, call.attr("axis", 0), x.ndim)
    idx = jnp.where(idx < 0, idx + x.shape[ax], idx)
    return jnp.take_along_axis(x, idx, axis=ax)


def _scatter_elements(call, x, idx, updates):
    ax = checked_axis(call, call.attr("axis", 0), x.ndim)
    grid = list(jnp.indices(idx.shape, sparse=True))
    grid[ax] = jnp.where(idx < 0, idx + x.shape[ax], idx)
    at = x.at[tuple(grid)]
    mode = call.attr("reduction", "none")
    return {"none": at.set, "add": at.add, "mul": at.multiply, "max": at.max,
            "min": at.min}[mode](updates.astype(x.dtype))


def _check_scatter(call):
    mode = call.attr("reduction", "none")
    return None if mode in ("none", "add", "mul", "max", "min") else f"reduction '{mode}'"


def _tile(call, x, repeats):
    return jnp.tile(x, static_ints(call, repeats, "repeats"))


def _expand(call, x, shape):
    shape = static_ints(call, shape, "shape")
    return jnp.broadcast_to(x, jnp.broadcast_shapes(x.shape, shape))


def _pad(call, x, pads=None, value=None, axes=None):
    if call.opset < 11:
        pads, cval = call.attr("pads"), call.attr("value", 0.0)
    else:
        pads = static_ints(call, pads, "pads")
        cval = 0 if value is None else value
    axes = tuple(range(x.ndim)) if axes is None else _axes(call, static_ints(call, axes, "axes"),
                                                             x.ndim)
    half = len(pads) // 2
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[i + half])
    # negative pads crop
    crop = tuple(builtins.slice(-lo if lo < 0 else None, hi if hi < 0 else None)
                 for lo, hi in width)
    width = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    mode = call.attr("mode", "constant")
    if mode == "constant":
        y = jnp.pad(x, width, constant_values=jnp.asarray(cval, x.dtype).reshape(()))
    else:
        y = jnp.pad(x, width, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])
    return y[crop]


def _check_pad(call):
    mode = call.attr("mode", "constant")
    return None if mode in ("constant", "reflect", "edge", "wrap") else f"mode '{mode}'"


register("Reshape", _reshape, attrs=("allowzero", "shape"), static=(1,),
         doc="reshape (0 copies a dim, one -1 is inferred)")
register("Flatten", _flatten, attrs=("axis",), doc="to 2-d at axis")
register("Transpose", _transpose, attrs=("perm",), doc="permute axes")
register("Squeeze", _squeeze, attrs=("axes",), static=(1,), doc="drop size-1 axes")
register("Unsqueeze", _unsqueeze, attrs=("axes",), static=(1,), doc="insert size-1 axes")
register("Concat", _concat, attrs=("axis",), doc="join along axis")
register("Split", _split, attrs=("axis", "split", "num_outputs"), static=(1,),
         doc="cut along axis")
register("Slice", _slice, attrs=("starts", "ends", "axes"), static=(1, 2, 3, 4),
         doc="strided slices along axes")
register("Gather", _gather, attrs=("axis",), doc="take along axis (negative indices wrap)")
register("GatherElements", _gather_elements, attrs=("axis",), doc="take_along_axis")
register("ScatterElements", _scatter_elements, attrs=("axis", "reduction"), check=_check_scatter,
         doc="write updates at indices along axis")
register("Tile", _tile, static=(1,), doc="repeat the whole tensor along each axis")
register("Expand", _expand, static=(1,), doc="broadcast to shape")
register("Pad", _pad, attrs=("mode", "pads", "value"), static=(1, 3), const=(2,), check=_check_pad,
         doc="constant / reflect / edge / wrap padding (negative pads crop)")


def _depth_to_space(call, x):
    b, c, h, w = x.shape
    k = call.attr("blocksize")
    if call.attr("mode", "DCR") == "DCR":
        y = jnp.transpose(x.reshape(b, k, k, c // k ** 2, h, w), (0, 3, 4, 1, 5, 2))
    else:
        y = jnp.transpose(x.reshape(b, c // k ** 2, k, k, h, w), (0, 1, 4, 2, 5, 3))
    return y.reshape(b, c // k ** 2, h * k, w * k)


def _space_to_depth(call, x):
    b, c, h, w = x.shape
    k = call.attr("blocksize")
    perm = (0, 3, 5, 1, 2, 4) if call.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    y = jnp.transpose(x.reshape(b, c, h // k, k, w // k, k), perm)
    return y.reshape(b, c * k * k, h // k, w // k)


register("DepthToSpace", _depth_to_space, attrs=("blocksize", "mode"), doc="DCR or CRD")
register("SpaceToDepth", _space_to_depth, attrs=("blocksize", "mode"),
         doc="inverse of DepthToSpace (DCR or CRD)")


# ------------------------------------------------------------------------------------------
# shapes, constants, types, value-dependent ops
# ------------------------------------------------------------------------------------------
def _shape(call, x):
    dims = np.asarray(x.shape, np.int64)
    start, end = call.attr("start", 0), call.attr("end", None)
    return dims[start:end]


def _constant_value(call):
    for key in ("value_float", "value_int"):
        if key in call.attrs:
            return np.asarray(call.attrs[key], np.float32 if key == "value_float" else np.int64)
    for key in ("value_floats", "value_ints"):
        if key in call.attrs:
            return np.asarray(call.attrs[key], np.float32 if key == "value_floats" else np.int64)
    if "value" in call.attrs:
        from onnx import numpy_helper
        return numpy_helper.to_array(call.attrs["value"])
    raise call.fail("has none of the attributes value, value_float(s), value_int(s)")


def _constant(call):
    return _constant_value(call)


def _check_constant(call):
    for key in ("sparse_value", "value_string", "value_strings"):
        if key in call.attrs:
            return f"attribute '{key}' (only dense numeric constants)"
    return None


def _constant_of_shape(call, shape):
    from onnx import numpy_helper
    dims = static_ints(call, shape, "input")
    value = call.attr("value")
    arr = np.zeros(1, np.float32) if value is None else numpy_helper.to_array(value)
    return np.full(dims, arr.reshape(-1)[0], arr.dtype)


def _range(call, start, limit, delta):
    s, l_, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    return np.arange(s, l_, d).astype(np.result_type(s, l_, d))


def _onehot(call, indices, depth, values):
    depth = int(static_floats(call, depth, "depth")[0])
    idx = jnp.asarray(indices)
    idx = jnp.where(idx < 0, idx + depth, idx).astype(jnp.int32)
    ax = call.attr("axis", -1)
    hot = jax.nn.one_hot(idx, depth, axis=ax, dtype=jnp.bool_)
    values = jnp.asarray(values)
    return jnp.where(hot, values[1], values[0])


def _nonzero(call, x):
    if isinstance(x, jax.core.Tracer):
        raise call.fail("the output shape depends on the input's values: it needs a constant "
                        "input or an un-jitted run (SingaRep.run outside graph mode)")
    return np.stack(np.nonzero(np.asarray(x))).astype(np.int64)


def _size(call, x):
    return np.asarray(x.size, np.int64)


def _eyelike(call, x):
    dt = x.dtype if call.attr("dtype") is None else jax_dtype(call.attr("dtype"))
    return jnp.eye(x.shape[0], x.shape[1], k=call.attr("k", 0), dtype=dt)


def _trilu(call, x, k=None):
    k = 0 if k is None else static_ints(call, k, "k")[0]
    return jnp.triu(x, k) if call.attr("upper", 1) else jnp.tril(x, k)


def _topk(call, x, k):
    k = static_ints(call, k, "K")[0]
    ax = checked_axis(call, call.attr("axis", -1), x.ndim)
    moved = jnp.moveaxis(x, ax, -1)
    vals, idx = lax.top_k(moved if call.attr("largest", 1) else -moved, k)
    vals = vals if call.attr("largest", 1) else -vals
    return jnp.moveaxis(vals, -1, ax), jnp.moveaxis(idx, -1, ax).astype(jnp.int32)


register("Shape", _shape, attrs=("start", "end"), doc="the input's shape (a constant)")
register("Size", _size, doc="the input's element count (a constant)")
register("Constant", _constant, attrs=("value", "value_float", "value_floats", "value_int",
                                       "value_ints", "sparse_value", "value_string",
                                       "value_strings"),
         check=_check_constant, doc="a constant tensor")
register("ConstantOfShape", _constant_of_shape, attrs=("value",), static=(0,),
         doc="a tensor of a given shape filled with value")
register("Range", _range, static=(0, 1, 2), doc="arithmetic sequence (constant inputs)")
register("OneHot", _onehot, attrs=("axis",), static=(1,), const=(2,),
         doc="one-hot along axis with (off, on) values")
register("NonZero", _nonzero, value_dependent=True, doc="indices of nonzero entries")
register("EyeLike", _eyelike, attrs=("dtype", "k"), doc="identity-like matrix")
register("Trilu", _trilu, attrs=("upper",), static=(1,), doc="upper/lower triangle")
register("TopK", _topk, attrs=("axis", "largest", "sorted"), static=(1,),
         doc="k largest (or smallest) along axis, sorted")


