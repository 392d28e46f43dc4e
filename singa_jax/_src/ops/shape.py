"""Shape and indexing operators: reshape, flatten, transpose, (un)squeeze, concat, split, slice,
gather, tile, expand, pad, upsample, depth/space rearrangements, scatter, one-hot, plus the few
ops whose result is a shape or depends on values (Shape, NonZero, ConstantOfShape).

All are Functions (one jitted kernel forward, the vjp backward) except ``NonZero`` and
``ConstantOfShape``: their output SHAPE depends on the input's values, so they read those values
on the host and cannot run inside a compiled (graph-mode) step. ``Shape`` returns the static shape
as a constant, which is fine under jit.
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.autodiff.operator import Operator
from singa_jax._src.runtime.ctensor import CTensor
from singa_jax._src.autodiff.function import Function, NonDifferentiable, TensorArgsOp
from singa_jax._src.ops.declare import functional
from singa_jax._src.ops.helpers import host_values, normalize_axis

__all__ = [
    "Reshape", "reshape", "Flatten", "flatten", "Transpose", "transpose", "Unsqueeze",
    "unsqueeze", "Squeeze", "squeeze", "Concat", "cat", "Split", "split", "Slice", "slice",
    "Gather", "gather", "Tile", "tile", "Expand", "expand", "Pad", "pad", "UpSample", "upsample",
    "DepthToSpace", "depth_to_space", "SpaceToDepth", "space_to_depth", "ScatterElements",
    "scatter_elements", "OneHot", "onehot", "Shape", "shape", "NonZero", "nonzero",
    "ConstantOfShape", "constant_of_shape",
]

Ints = Union[int, Sequence[int]]


def _ints(v: Any) -> Tuple[int, ...]:
    """An int or a sequence/array of ints as a tuple of Python ints (hashable static args)."""
    if isinstance(v, int) or getattr(v, "ndim", None) == 0:
        return (int(v),)
    return tuple(int(e) for e in v)


# --------------------------------------------------------------------------------------------
# reshaping
# --------------------------------------------------------------------------------------------
def _reshape(x, *, shape):
    # SINGA/ONNX: 0 copies the input's dimension, one -1 is inferred
    target = [x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(shape)]
    known = math.prod(s for s in target if s != -1)
    if target.count(-1) > 1 or (-1 in target and (known == 0 or x.size % known)) or \
            (-1 not in target and known != x.size):
        raise ValueError(f"cannot reshape {x.shape} ({x.size} elements) to {list(shape)}")
    return jnp.reshape(x, [x.size // known if s == -1 else s for s in target])


class Reshape(Function):
    """y = x reshaped to ``shape``; a 0 keeps that input dimension, one -1 is inferred."""

    fn = staticmethod(_reshape)

    def __init__(self, shape: Sequence[int]):
        super().__init__(shape=_ints(shape))


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Reshape ``x`` (see :class:`Reshape`)."""
    return Reshape(shape)(x)[0]


def _flatten(x, *, axis):
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"axis {axis} is out of range [-{x.ndim}, {x.ndim}]")
    return jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


class Flatten(Function):
    """y = x as the matrix (d_0 * ... * d_(axis-1), d_axis * ... * d_n); axis=0 gives (1, N)."""

    fn = staticmethod(_flatten)

    def __init__(self, axis: int = 1):
        super().__init__(axis=int(axis))


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    """Flatten ``x`` to a matrix (see :class:`Flatten`)."""
    return Flatten(axis)(x)[0]


def _transpose(x, *, perm):
    if perm is not None and sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"perm {list(perm)} is not a permutation of the {x.ndim} axes")
    return jnp.transpose(x, perm)


class Transpose(Function):
    """y = x with its axes permuted by ``perm`` (None reverses them), as ``np.transpose``."""

    fn = staticmethod(_transpose)

    def __init__(self, perm: Optional[Sequence[int]]):
        super().__init__(perm=None if perm is None else _ints(perm))


def transpose(x: Tensor, shape: Optional[Sequence[int]]) -> Tensor:
    """Permute the axes of ``x`` by ``shape`` (SINGA's name for the permutation)."""
    return Transpose(shape)(x)[0]


def unsqueeze_positions(ndim: int, axis: Sequence[int]) -> Tuple[int, ...]:
    """Where the size-1 dimensions that ``Unsqueeze(axis)`` inserts into a rank-``ndim`` input
    end up in the output (sorted): the axes as ONNX's / ``np.expand_dims`` take them.

    SINGA inserts the axes one after another, in the given order, with ``list.insert``: an axis
    past the current end appends (SINGA's test unsqueezes a (3, 2) input at [2, 4, 5] to
    (3, 2, 1, 1, 1)), and a later insert shifts the earlier ones. A negative axis counts from
    the end of the output, as in ONNX (SINGA's ``list.insert(-1, 1)`` would put it before the
    last dimension, which its ONNX import, passing ONNX's axes through, does not mean).
    """
    out_rank = ndim + len(axis)
    cur = [False] * ndim  # True marks an inserted dimension
    for a in axis:
        a = int(a)
        if a < 0:
            a += out_rank
            if a < 0:
                raise ValueError(f"axis {a - out_rank} is out of range for an output of rank "
                                 f"{out_rank}")
        cur.insert(a, True)
    return tuple(i for i, inserted in enumerate(cur) if inserted)


def _unsqueeze(x, *, axis):
    return jnp.expand_dims(x, unsqueeze_positions(x.ndim, axis))


class Unsqueeze(Function):
    """y = x with size-1 dimensions inserted at ``axis`` (an int or a list), one after another
    in the given order as SINGA does (an axis past the end appends); negative axes count from
    the end of the OUTPUT, as ``np.expand_dims``. See :func:`unsqueeze_positions`."""

    fn = staticmethod(_unsqueeze)

    def __init__(self, axis: Ints):
        super().__init__(axis=_ints(axis))


def unsqueeze(x: Tensor, axis: Ints = -1) -> Tensor:
    """Insert size-1 dimensions (see :class:`Unsqueeze`)."""
    return Unsqueeze(axis)(x)[0]


def _squeeze(x, *, axis):
    for a in axis:
        if x.shape[normalize_axis(a, x.ndim)] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {x.shape}: its length is not 1")
    return jnp.squeeze(x, axis or None)


class Squeeze(Function):
    """y = x without the size-1 dimensions listed in ``axis`` (all of them when empty)."""

    fn = staticmethod(_squeeze)

    def __init__(self, axis: Ints = ()):
        super().__init__(axis=_ints(axis))


def squeeze(x: Tensor, axis: Ints = ()) -> Tensor:
    """Remove size-1 dimensions (see :class:`Squeeze`)."""
    return Squeeze(axis)(x)[0]


# --------------------------------------------------------------------------------------------
# joining and splitting
# --------------------------------------------------------------------------------------------
def _concat(*xs, axis):
    if not xs:
        raise ValueError("needs at least one input")
    ref = xs[0].shape
    ax = normalize_axis(axis, len(ref))
    for x in xs[1:]:
        if len(x.shape) != len(ref) or any(a != b for i, (a, b) in enumerate(zip(x.shape, ref))
                                           if i != ax):
            raise ValueError(f"all inputs must have the same shape except along axis {axis}, "
                             f"got {[tuple(x.shape) for x in xs]}")
    return jnp.concatenate(xs, axis=ax)


class Concat(Function):
    """y = the inputs joined along ``axis`` (all other dimensions must agree)."""

    fn = staticmethod(_concat)

    def __init__(self, axis: int = 0):
        super().__init__(axis=int(axis))


def cat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Concatenate the list ``xs`` along ``axis`` (see :class:`Concat`)."""
    return Concat(axis)(*xs)[0]


def _split(x, *, axis, parts, num_output):
    ax = normalize_axis(axis, x.ndim)
    if parts is None:  # SINGA: equal parts of floor(d / num_output); a remainder is dropped
        parts = (x.shape[ax] // num_output,) * num_output
    if sum(parts) > x.shape[ax] or min(parts) < 0:
        raise ValueError(f"parts {list(parts)} do not fit in axis {axis} of length {x.shape[ax]}")
    starts = [sum(parts[:i]) for i in range(len(parts))]
    return tuple(jax.lax.slice_in_dim(x, s, s + n, axis=ax) for s, n in zip(starts, parts))


class Split(Function):
    """ys = x cut along ``axis`` into pieces of the lengths ``parts`` (or into ``num_output``
    equal pieces when ``parts`` is None). Has one output per piece."""

    fn = staticmethod(_split)

    def __init__(self, axis: int, parts: Optional[Sequence[int]], num_output: Optional[int] = None):
        if parts is None and not num_output:
            raise ValueError("Split: give the piece lengths `parts` or the count `num_output`")
        super().__init__(axis=int(axis), parts=None if parts is None else _ints(parts),
                         num_output=None if num_output is None else int(num_output))


def split(x: Tensor, axis: int, parts: Optional[Sequence[int]],
          num_output: Optional[int] = None) -> Tuple[Tensor, ...]:
    """Split ``x`` into a tuple of Tensors (see :class:`Split`)."""
    return Split(axis, parts, num_output)(x)


# --------------------------------------------------------------------------------------------
# indexing
# --------------------------------------------------------------------------------------------
def _slice(x, *, starts, ends, axes, steps):
    axes = range(len(starts)) if axes is None else axes
    steps = (1,) * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have "
                         f"the same length")
    index = [builtins.slice(None)] * x.ndim  # the builtin: ``slice`` below is SINGA's op
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[normalize_axis(axis, x.ndim)] = builtins.slice(start, end, step)
    return x[tuple(index)]


class Slice(Function):
    """y = x[start:end:step] along each of ``axes`` (all axes in order when None)."""

    fn = staticmethod(_slice)

    def __init__(self, starts: Sequence[int], ends: Sequence[int],
                 axes: Optional[Sequence[int]] = None, steps: Optional[Sequence[int]] = None):
        super().__init__(starts=_ints(starts), ends=_ints(ends),
                         axes=None if axes is None else _ints(axes),
                         steps=None if steps is None else _ints(steps))


def slice(x: Tensor, starts: Sequence[int], ends: Sequence[int],  # noqa: A001 (SINGA's name)
          axes: Optional[Sequence[int]] = None, steps: Optional[Sequence[int]] = None) -> Tensor:
    """Slice ``x`` along several axes (see :class:`Slice`)."""
    return Slice(starts, ends, axes, steps)(x)[0]


def _gather(x, indices, *, axis):
    ax = normalize_axis(axis, x.ndim)
    return jnp.take(x, jnp.mod(indices.astype(jnp.int32), x.shape[ax]), axis=ax)


class Gather(TensorArgsOp):
    """y = the entries of x at ``indices`` (a list, possibly nested, or an int Tensor; negative
    indices count from the end) along ``axis``: shape x.shape[:axis] + indices.shape +
    x.shape[axis+1:]. Repeated indices accumulate their gradients."""

    fn = staticmethod(_gather)
    tensor_arg_names = ("indices",)

    def __init__(self, axis: int, indices: Any):
        super().__init__({"indices": indices}, axis=int(axis))


def gather(x: Tensor, axis: int, indices: Any) -> Tensor:
    """Take entries of ``x`` along ``axis`` (see :class:`Gather`)."""
    return Gather(axis, indices)(x)[0]


def _scatter_elements(x, indices, updates, *, axis):
    ax = normalize_axis(axis, x.ndim)
    if indices.shape != updates.shape or indices.ndim != x.ndim:
        raise ValueError(f"indices {indices.shape} and updates {updates.shape} must have the same "
                         f"shape and x's rank ({x.ndim})")
    grid = list(jnp.indices(indices.shape, sparse=True))
    grid[ax] = jnp.mod(indices.astype(jnp.int32), x.shape[ax])
    return x.at[tuple(grid)].set(updates.astype(x.dtype))


class ScatterElements(TensorArgsOp):
    """y = x with ``y[..., indices[i, j], ...] = updates[i, j]`` along ``axis`` (ONNX
    ScatterElements). x's gradient is zero where it was overwritten; a float ``updates`` Tensor
    gets the gradient of the positions it wrote."""

    fn = staticmethod(_scatter_elements)
    tensor_arg_names = ("indices", "updates")

    def __init__(self, indices: Any, updates: Any, axis: int = 0):
        super().__init__({"indices": indices, "updates": updates}, axis=int(axis))


def scatter_elements(x: Tensor, indices: Any, updates: Any, axis: int = 0) -> Tensor:
    """Write ``updates`` into ``x`` at ``indices`` along ``axis`` (see :class:`ScatterElements`)."""
    return ScatterElements(indices, updates, axis)(x)[0]


def _onehot(indices, *, axis, depth, values):
    off, on = values
    hot = jax.nn.one_hot(jnp.mod(indices.astype(jnp.int32), depth), depth, axis=axis,
                         dtype=jnp.float32)
    return hot * (on - off) + off


class OneHot(NonDifferentiable, Function):
    """y = ``values[1]`` at each index (taken modulo ``depth``) and ``values[0]`` elsewhere, along
    a new axis of length ``depth`` inserted at ``axis``; float32, no gradient."""

    fn = staticmethod(_onehot)

    def __init__(self, axis: int, depth: Any, values: Sequence[float]):
        # SINGA's tests pass depth as a one-element array (np.array([10])), as ONNX's OneHot
        # input is; NumPy 2 no longer converts such an array with int()
        d = np.asarray(depth)
        if d.size != 1 or d.dtype.kind not in "iuf" or not float(d.reshape(-1)[0]).is_integer():
            raise ValueError(f"OneHot: depth must be one integer (or a one-element array of "
                             f"one), got {depth!r}")
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if v.size != 2:
            raise ValueError(f"OneHot: values must be [off_value, on_value], got {values!r}")
        depth = int(d.reshape(-1)[0])
        if depth < 1:
            raise ValueError(f"OneHot: depth must be positive, got {depth}")
        super().__init__(axis=int(axis), depth=depth, values=(float(v[0]), float(v[1])))


def onehot(axis: int, indices: Tensor, depth: int, values: Sequence[float]) -> Tensor:
    """One-hot encode ``indices`` (see :class:`OneHot`)."""
    return OneHot(axis, depth, values)(indices)[0]


# --------------------------------------------------------------------------------------------
# repetition and padding
# --------------------------------------------------------------------------------------------
def _tile(x, *, repeats):
    # SINGA applies a short ``repeats`` to the LEADING axes (NumPy would use the trailing ones)
    repeats = tuple(repeats) + (1,) * (x.ndim - len(repeats))
    return jnp.tile(x, repeats)


class Tile(Function):
    """y = x repeated ``repeats[i]`` times along axis i (as ``np.tile``; a ``repeats`` shorter
    than x's rank applies to the leading axes, a longer one adds leading axes)."""

    fn = staticmethod(_tile)

    def __init__(self, repeats: Ints):
        super().__init__(repeats=_ints(repeats))


def tile(x: Tensor, repeats: Ints) -> Tensor:
    """Tile ``x`` (see :class:`Tile`)."""
    return Tile(repeats)(x)[0]


def _expand(x, *, shape):
    return jnp.broadcast_to(x, jnp.broadcast_shapes(x.shape, shape))


class Expand(Function):
    """y = x broadcast with ``shape`` (ONNX Expand: bidirectional NumPy broadcasting)."""

    fn = staticmethod(_expand)

    def __init__(self, shape: Sequence[int]):
        super().__init__(shape=_ints(shape))


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast ``x`` to ``shape`` (see :class:`Expand`)."""
    return Expand(shape)(x)[0]


_PAD_MODES = ("constant", "reflect", "edge")


def _pad(x, *, mode, pads, constant):
    half = len(pads) // 2
    if len(pads) % 2 or half > x.ndim:
        raise ValueError(f"pads {list(pads)} must hold a begin and an end count for at most "
                         f"{x.ndim} axes")
    width = [(pads[i], pads[i + half]) for i in range(half)] + [(0, 0)] * (x.ndim - half)
    if mode == "constant":
        return jnp.pad(x, width, mode="constant", constant_values=constant)
    return jnp.pad(x, width, mode=mode)


class Pad(Function):
    """y = x padded by ``pads`` = [begin_0, begin_1, ..., end_0, end_1, ...] (ONNX order) with
    ``mode`` "constant" (value ``constant``), "reflect" (mirror, edge excluded) or "edge"."""

    fn = staticmethod(_pad)

    def __init__(self, mode: str, pads: Sequence[int], constant: float = 0.):
        if mode not in _PAD_MODES:
            raise ValueError(f"Pad: mode must be one of {sorted(_PAD_MODES)}, got {mode!r}")
        super().__init__(mode=mode, pads=_ints(pads), constant=float(constant))


def pad(x: Tensor, mode: str, pads: Sequence[int], constant: float = 0.) -> Tensor:
    """Pad ``x`` (see :class:`Pad`)."""
    return Pad(mode, pads, constant)(x)[0]


def _upsample(x, *, scales):
    if len(scales) > x.ndim:
        raise ValueError(f"{len(scales)} scales for a {x.ndim}-d input")
    for axis, s in enumerate(scales):
        if s != 1:
            x = jnp.repeat(x, s, axis=axis)
    return x


class UpSample(Function):
    """y = x with every element repeated ``int(scales[i])`` times along axis i (nearest)."""

    fn = staticmethod(_upsample)

    def __init__(self, mode: str, scales: Sequence[float]):
        if mode.lower() != "nearest":
            raise ValueError(f"UpSample: only mode 'nearest' is supported, got {mode!r}")
        super().__init__(scales=_ints(scales))
        self.mode = mode.lower()


def upsample(x: Tensor, mode: str, scales: Sequence[float]) -> Tensor:
    """Nearest-neighbour upsampling (see :class:`UpSample`)."""
    return UpSample(mode, scales)(x)[0]


# (reshape to 6-d, permutation) of each rearrangement: depth->space and its inverse
_D2S_PERM = {"DCR": (0, 3, 4, 1, 5, 2), "CRD": (0, 1, 4, 2, 5, 3)}
_S2D_PERM = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}


def _depth_to_space(x, *, blocksize, mode):
    if x.ndim != 4 or x.shape[1] % (blocksize * blocksize):
        raise ValueError(f"needs a 4-d (N, C, H, W) input with C divisible by blocksize^2 = "
                         f"{blocksize * blocksize}, got {x.shape}")
    b, c, h, w = x.shape
    c_out = c // blocksize ** 2
    six = ((b, blocksize, blocksize, c_out, h, w) if mode == "DCR"
           else (b, c_out, blocksize, blocksize, h, w))
    y = jnp.transpose(x.reshape(six), _D2S_PERM[mode])
    return y.reshape(b, c_out, h * blocksize, w * blocksize)


def _space_to_depth(x, *, blocksize, mode):
    if x.ndim != 4 or x.shape[2] % blocksize or x.shape[3] % blocksize:
        raise ValueError(f"needs a 4-d (N, C, H, W) input with H and W divisible by blocksize "
                         f"{blocksize}, got {x.shape}")
    b, c, h, w = x.shape
    hb, wb = h // blocksize, w // blocksize
    y = jnp.transpose(x.reshape(b, c, hb, blocksize, wb, blocksize), _S2D_PERM[mode])
    return y.reshape(b, c * blocksize ** 2, hb, wb)


class _BlockRearrange(Function):
    def __init__(self, blocksize: int, mode: str = "DCR"):
        if mode.upper() not in _D2S_PERM:
            raise ValueError(f"{type(self).__name__}: mode must be 'DCR' or 'CRD', got {mode!r}")
        super().__init__(blocksize=int(blocksize), mode=mode.upper())


class DepthToSpace(_BlockRearrange):
    """(N, C, H, W) -> (N, C / b^2, H * b, W * b): moves blocks of depth into space; mode DCR
    (depth-column-row) or CRD (column-row-depth) orders the channels."""

    fn = staticmethod(_depth_to_space)


class SpaceToDepth(_BlockRearrange):
    """(N, C, H, W) -> (N, C * b^2, H / b, W / b): the inverse of :class:`DepthToSpace`."""

    fn = staticmethod(_space_to_depth)


def depth_to_space(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    """See :class:`DepthToSpace`."""
    return DepthToSpace(blocksize, mode)(x)[0]


def space_to_depth(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    """See :class:`SpaceToDepth`."""
    return SpaceToDepth(blocksize, mode)(x)[0]


# --------------------------------------------------------------------------------------------
# shapes and value-dependent shapes (no gradient)
# --------------------------------------------------------------------------------------------
class Shape(NonDifferentiable, Function):
    """y = x's shape as a 1-d int32 tensor (a constant: it is known before the data is)."""

    fn = staticmethod(lambda x: jnp.asarray(x.shape, jnp.int32))

    def backward(self, *dys):
        # the engine never calls it (no gradient); called directly it answers as SINGA's does,
        # with dy's shape as a list
        if dys and isinstance(dys[0], CTensor):
            return list(dys[0].shape())
        return super().backward(*dys)


shape = functional(Shape, "shape", ("x",), Shape.__doc__)


class NonZero(NonDifferentiable, Operator):
    """y = the indices of x's nonzero entries, shape (x.ndim, count), int32 (``np.nonzero``
    stacked). Its size depends on x's values: it syncs with the device and cannot run inside a
    compiled (graph-mode / jit) step."""

    takes_arrays = True

    def forward(self, x):
        if isinstance(x, jax.core.Tracer):
            host_values("NonZero", x)  # raises the explanatory error
        return jnp.stack(jnp.nonzero(x)).astype(jnp.int32)


nonzero = functional(NonZero, "nonzero", ("x",), NonZero.__doc__)


class ConstantOfShape(NonDifferentiable, Operator):
    """y = a float32 tensor filled with ``value``, whose shape is given by the VALUES of the 1-d
    input x (read on the host: it cannot run inside a compiled step)."""

    takes_arrays = True

    def __init__(self, value: float = 0.):
        super().__init__()
        self.value = float(value)

    def forward(self, x):
        dims = host_values("ConstantOfShape", x).astype(int).reshape(-1).tolist()
        if any(d < 0 for d in dims):
            raise ValueError(f"ConstantOfShape: shape {dims} has a negative dimension")
        return jnp.full(dims, self.value, jnp.float32)


def constant_of_shape(x: Tensor, value: float = 0) -> Tensor:
    """A tensor of shape ``x`` (a 1-d tensor of sizes) filled with ``value``."""
    return ConstantOfShape(value)(x)[0]
