"""Every operator of elementwise.py, shape.py and reduce.py: forward against a NumPy reference
(float64) and gradient against central finite differences of that reference, on random inputs
of a couple of shapes. One table row per op (or per op variant).

The gradient check runs ``autograd.backward`` with a random ``dy`` (so it checks the full
vector-Jacobian product, not just the gradient of a sum).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence, Tuple

import numpy as np
import pytest
from scipy import special

from backend_precision import matmul_tolerance
from singa_jax import autograd, tensor
from singa_jax.tensor import Tensor


pytestmark = pytest.mark.usefixtures("training_mode")


# --- input domains: keep away from kinks and outside the op's domain -----------------------
def _away_from(values, points, margin):
    """Push values closer than ``margin`` to any of ``points`` out by ``2 * margin``."""
    for p in points:
        near = np.abs(values - p) < margin
        values = np.where(near, p + np.where(values >= p, 2, -2) * margin, values)
    return values


DOMAINS = {
    "any": lambda r, s: r.normal(size=s),
    "nz": lambda r, s: _away_from(r.normal(size=s), [0.0], 0.1),  # kink at 0
    "pos": lambda r, s: r.uniform(0.5, 2.0, size=s),
    "unit": lambda r, s: r.uniform(-0.8, 0.8, size=s),
    "gt1": lambda r, s: r.uniform(1.5, 3.0, size=s),
    "offint": lambda r, s: np.floor(r.uniform(-3, 3, size=s)) + r.choice([0.2, 0.3, 0.7, 0.8], s),
    "clip": lambda r, s: _away_from(r.normal(size=s), [-0.5, 0.5], 0.05),
    "hsig": lambda r, s: _away_from(3 * r.normal(size=s), [-2.5, 2.5], 0.05),
    "small_ints": lambda r, s: r.integers(-1, 2, size=s).astype(float),  # ties and zeros
}


@dataclass
class Case:
    """One op: ``op`` maps input Tensors to an output Tensor, ``ref`` float64 arrays to an array."""
    name: str
    op: Callable
    ref: Callable
    shapes: Sequence[Tuple[Tuple[int, ...], ...]]
    domain: object = "any"  # one domain name, or one per input
    grad: bool = True  # False: the output must carry no gradient
    dtype: object = np.float32  # expected output dtype
    fixed: Sequence[np.ndarray] = field(default_factory=tuple)  # explicit inputs (no shapes)


def softmax_ref(x, axis):
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
    e = np.exp(flat - flat.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).reshape(x.shape)


def d2s_ref(x, b, mode):
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // b ** 2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // b ** 2, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // b ** 2, h * b, w * b)


def scatter_ref(x, idx, upd, axis):
    y = x.copy()
    for i in np.ndindex(idx.shape):
        j = list(i)
        j[axis] = idx[i]
        y[tuple(j)] = upd[i]
    return y


def onehot_ref(ind, depth, values, axis):
    hot = np.eye(depth)[np.mod(ind, depth).astype(int)]
    return np.moveaxis(hot, -1, axis) * (values[1] - values[0]) + values[0]


def pad_ref(x, mode, pads):
    half = len(pads) // 2
    width = [(pads[i], pads[i + half]) for i in range(half)] + [(0, 0)] * (x.ndim - half)
    return np.pad(x, width, mode=mode)


A1, A2 = ((3, 4),), ((2, 3, 2),)  # unary shapes
BIN = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4))]  # binary, incl. broadcasting
ag = autograd
SCATTER_IDX = np.array([[1, 0, 2], [0, 2, 1]])
GEMM_SHAPES = [((3, 4), (4, 2), (3, 2)), ((3, 4), (4, 2), (2,))]


def _gemm_ref(A, B, C, alpha=0.5, beta=2.0, ta=0, tb=0):
    return alpha * (A.T if ta else A) @ (B.T if tb else B) + beta * C


UNARY_REFS = [
    ("relu", lambda x: np.maximum(x, 0), "nz"), ("identity", lambda x: x, "any"),
    ("tanh", np.tanh, "any"), ("cos", np.cos, "any"), ("cosh", np.cosh, "any"),
    ("acos", np.arccos, "unit"), ("acosh", np.arccosh, "gt1"), ("sin", np.sin, "any"),
    ("sinh", np.sinh, "any"), ("asin", np.arcsin, "unit"), ("asinh", np.arcsinh, "any"),
    ("tan", np.tan, "unit"), ("atan", np.arctan, "any"), ("atanh", np.arctanh, "unit"),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), "any"), ("abs", np.abs, "nz"),
    ("exp", np.exp, "any"), ("log", np.log, "pos"), ("sqrt", np.sqrt, "pos"),
    ("sign", np.sign, "nz"), ("softsign", lambda x: x / (1 + np.abs(x)), "any"),
    ("softplus", lambda x: np.log1p(np.exp(x)), "any"), ("negative", np.negative, "any"),
    ("reciprocal", lambda x: 1 / x, "pos"), ("ceil", np.ceil, "offint"),
    ("floor", np.floor, "offint"), ("round", lambda x: np.sign(x) * np.floor(np.abs(x) + .5),
                                    "offint"),
    ("rounde", np.round, "offint"), ("erf", special.erf, "any"),
]

CASES = [Case(n, getattr(ag, n), ref, [A1, A2], dom) for n, ref, dom in UNARY_REFS] + [
    Case("_not", ag._not, lambda x: (x == 0).astype(float), [A1, A2], "small_ints", grad=False),
    # binary, broadcasting
    Case("add", ag.add, np.add, BIN),
    Case("sub", ag.sub, np.subtract, BIN),
    Case("mul", ag.mul, np.multiply, BIN),
    Case("div", ag.div, np.divide, BIN, ("any", "pos")),
    Case("pow", ag.pow, np.power, BIN, ("pos", "any")),
    Case("prelu", ag.prelu, lambda x, s: np.where(x >= 0, x, s * x), BIN[:2], ("nz", "any")),
    Case("less", ag.less, lambda x, y: (x < y).astype(float), BIN[:2], "small_ints", grad=False),
    Case("greater", ag.greater, lambda x, y: (x > y).astype(float), BIN[:2], "small_ints",
         grad=False),
    Case("equal", ag.equal, lambda x, y: (x == y).astype(float), BIN[:2], "small_ints", grad=False),
    Case("_and", ag._and, lambda a, b: np.logical_and(a, b).astype(float), BIN[:2], "small_ints",
         grad=False),
    Case("_or", ag._or, lambda a, b: np.logical_or(a, b).astype(float), BIN[:2], "small_ints",
         grad=False),
    Case("_xor", ag._xor, lambda a, b: np.logical_xor(a, b).astype(float), BIN[:2], "small_ints",
         grad=False),
    Case("matmul", ag.matmul, np.matmul, [((3, 4), (4, 2)), ((2, 3, 4), (2, 4, 5)),
                                         ((3, 4), (4,))]),
    # parametrised elementwise
    Case("clip", lambda x: ag.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), [A1, A2],
         "clip"),
    Case("clip_max_only", lambda x: ag.clip(x, max=0.5), lambda x: np.minimum(x, 0.5), [A1],
         "clip"),
    Case("elu", lambda x: ag.elu(x, 0.7), lambda x: np.where(x >= 0, x, 0.7 * np.expm1(x)),
         [A1, A2], "nz"),
    Case("selu", ag.selu, lambda x: 1.0507 * np.where(x > 0, x, 1.67326 * np.expm1(x)),
         [A1, A2], "nz"),
    Case("leakyrelu", lambda x: ag.leakyrelu(x, 0.1), lambda x: np.where(x >= 0, x, 0.1 * x),
         [A1, A2], "nz"),
    Case("hardsigmoid", ag.hardsigmoid, lambda x: np.clip(0.2 * x + 0.5, 0, 1), [A1, A2],
         "hsig"),
    Case("softmax", ag.softmax, lambda x: softmax_ref(x, 1), [A1, A2]),
    Case("softmax_axis0", lambda x: ag.softmax(x, 0), lambda x: softmax_ref(x, 0), [A1]),
    Case("softmax_axis-1", lambda x: ag.softmax(x, -1), lambda x: softmax_ref(x, x.ndim - 1),
         [A2]),
    Case("cast_float", lambda x: ag.cast(x, 0), lambda x: x, [A1]),
    Case("cast_int", lambda x: ag.cast(x, tensor.int32), lambda x: np.trunc(x), [A1], "offint",
         grad=False, dtype=np.int32),
    Case("where", lambda a, b: ag.where(a, b, [[1, 0, 0, 1]] * 3),
         lambda a, b: np.where(np.array([[1, 0, 0, 1]] * 3) != 0, a, b), [((3, 4), (3, 4))]),
    Case("where_tensor_cond", lambda a, b: ag.where(a, b, ag.greater(a, b)),
         lambda a, b: np.where(a > b, a, b), [((3, 4), (3, 4)), ((3, 4), (4,))]),
    Case("add_bias_row", ag.add_bias, lambda x, b: x + b.reshape(1, -1),
         [((3, 4), (4,)), ((3, 4), (1, 4)), ((3, 4), (4, 1))]),
    Case("add_bias_col", lambda x, b: ag.add_bias(x, b, axis=1), lambda x, b: x + b.reshape(-1, 1),
         [((3, 4), (3,)), ((3, 4), (3, 1))]),
    Case("gemm", lambda A, B, C: ag.gemm(A, B, C, 0.5, 2.0), _gemm_ref, GEMM_SHAPES),
    Case("gemm_trans", lambda A, B, C: ag.gemm(A, B, C, 0.5, 2.0, 1, 1),
         lambda A, B, C: _gemm_ref(A, B, C, ta=1, tb=1), [((4, 3), (2, 4), (3, 2))]),
    Case("gemm_no_c", lambda A, B: ag.gemm(A, B), np.matmul, [((3, 4), (4, 2))]),
    # shapes
    Case("reshape", lambda x: ag.reshape(x, [0, -1]), lambda x: x.reshape(x.shape[0], -1),
         [A1, A2]),
    Case("flatten", ag.flatten, lambda x: x.reshape(x.shape[0], -1), [A1, A2]),
    Case("flatten_axis0", lambda x: ag.flatten(x, 0), lambda x: x.reshape(1, -1), [A2]),
    Case("flatten_axis-1", lambda x: ag.flatten(x, -1), lambda x: x.reshape(-1, x.shape[-1]),
         [A2]),
    Case("transpose", lambda x: ag.transpose(x, [2, 0, 1]), lambda x: x.transpose(2, 0, 1),
         [A2, ((2, 3, 4),)]),
    Case("unsqueeze", lambda x: ag.unsqueeze(x, [0, 2]), lambda x: np.expand_dims(x, (0, 2)),
         [A1, A2]),
    Case("unsqueeze_default", ag.unsqueeze, lambda x: x[..., None], [A1]),
    Case("squeeze", ag.squeeze, np.squeeze, [((3, 1, 4),), ((1, 2, 1),)]),
    Case("squeeze_axis", lambda x: ag.squeeze(x, [-1]), lambda x: np.squeeze(x, -1),
         [((1, 3, 1),)]),
    Case("cat", lambda *xs: ag.cat(xs, 1), lambda *xs: np.concatenate(xs, 1),
         [((2, 1), (2, 3), (2, 2)), ((2, 2, 2), (2, 1, 2), (2, 3, 2))]),
    Case("cat_axis-1", lambda *xs: ag.cat(xs, -1), lambda *xs: np.concatenate(xs, -1),
         [((2, 1), (2, 3))]),
    Case("split_middle", lambda x: ag.split(x, 1, [1, 2, 1])[1], lambda x: x[:, 1:3], [A1]),
    Case("split_equal", lambda x: ag.split(x, -1, None, 2)[0], lambda x: x[..., :1], [A2]),
    Case("slice", lambda x: ag.slice(x, [1, 0], [3, 10], [0, 1]), lambda x: x[1:3, 0:10],
         [A1, A2]),
    Case("slice_steps", lambda x: ag.slice(x, [-1, 0], [-4, 4], [1, -1], [-1, 2]),
         lambda x: x[..., -1:-4:-1, 0:4:2], [((2, 4, 5),)]),
    Case("gather", lambda x: ag.gather(x, 1, [2, 0, 2, -1]), lambda x: x[:, [2, 0, 2, 3]],
         [A1]),
    Case("gather_nested", lambda x: ag.gather(x, 0, [[0, 1], [1, 1]]),
         lambda x: x[np.array([[0, 1], [1, 1]])], [A1, A2]),
    Case("tile", lambda x: ag.tile(x, [2, 1]), lambda x: np.tile(x, [2, 1]), [A1]),
    Case("tile_short", lambda x: ag.tile(x, 2), lambda x: np.tile(x, [2, 1]), [A1]),
    Case("tile_long", lambda x: ag.tile(x, [2, 1, 2]), lambda x: np.tile(x, [2, 1, 2]), [A1]),
    Case("expand", lambda x: ag.expand(x, [2, 3, 4]), lambda x: np.broadcast_to(x, (2, 3, 4)),
         [((3, 1),), ((4,),)]),
    Case("pad_constant", lambda x: ag.pad(x, "constant", [0, 2, 1, 1], 0.5),
         lambda x: np.pad(x, [(0, 1), (2, 1)], constant_values=0.5), [A1]),
    Case("pad_reflect", lambda x: ag.pad(x, "reflect", [1, 2, 2, 1]),
         lambda x: pad_ref(x, "reflect", [1, 2, 2, 1]), [A1]),
    Case("pad_edge", lambda x: ag.pad(x, "edge", [1, 2, 2, 1]),
         lambda x: pad_ref(x, "edge", [1, 2, 2, 1]), [A1, A2]),
    Case("upsample", lambda x: ag.upsample(x, "nearest", [1, 1, 2, 3]),
         lambda x: x.repeat(2, 2).repeat(3, 3), [((1, 2, 2, 2),)]),
    Case("depth_to_space_dcr", lambda x: ag.depth_to_space(x, 2),
         lambda x: d2s_ref(x, 2, "DCR"), [((1, 8, 2, 3),), ((2, 4, 1, 2),)]),
    Case("depth_to_space_crd", lambda x: ag.depth_to_space(x, 2, "CRD"),
         lambda x: d2s_ref(x, 2, "CRD"), [((1, 8, 2, 3),)]),
    Case("space_to_depth_roundtrip", lambda x: ag.space_to_depth(ag.depth_to_space(x, 2), 2),
         lambda x: x, [((1, 8, 2, 3),)]),
    Case("space_to_depth_roundtrip_crd",
         lambda x: ag.space_to_depth(ag.depth_to_space(x, 2, "CRD"), 2, "CRD"), lambda x: x,
         [((1, 8, 2, 3),)]),
    Case("scatter_elements", lambda x: ag.scatter_elements(x, SCATTER_IDX, [[1., 1.1, 1.2],
                                                                            [2., 2.1, 2.2]]),
         lambda x: scatter_ref(x, SCATTER_IDX, np.array([[1, 1.1, 1.2], [2, 2.1, 2.2]]), 0),
         [((3, 3),)]),
    Case("scatter_elements_updates", lambda x, u: ag.scatter_elements(x, SCATTER_IDX.T, u, 1),
         lambda x, u: scatter_ref(x, SCATTER_IDX.T, u, 1), [((3, 3), (3, 2))]),
    Case("onehot", lambda i: ag.onehot(-1, i, 4, [0.5, 2.0]),
         lambda i: onehot_ref(i, 4, [0.5, 2.0], -1), [A1], "small_ints", grad=False),
    Case("onehot_axis1", lambda i: ag.onehot(1, i, 3, [0, 1]),
         lambda i: onehot_ref(i, 3, [0, 1], 1), [A1], "small_ints", grad=False),
    Case("shape", ag.shape, lambda x: np.array(x.shape), [A1, A2], grad=False, dtype=np.int32),
    Case("nonzero", ag.nonzero, lambda x: np.stack(np.nonzero(x)), [A1, A2], "small_ints",
         grad=False, dtype=np.int32),
    Case("constant_of_shape", lambda s: ag.constant_of_shape(s, 1.5),
         lambda s: np.full(s.astype(int), 1.5), [], grad=False,
         fixed=[np.array([2., 3.], np.float32)]),
    # reductions
    Case("sum", ag.sum, lambda *xs: np.sum(np.broadcast_arrays(*xs), 0),
         [((3, 4), (3, 4), (3, 4)), ((2, 3), (3,), (2, 1))]),
    Case("mean", ag.mean, lambda *xs: np.mean(np.broadcast_arrays(*xs), 0),
         [((3, 4), (3, 4)), ((2, 3), (3,), (2, 1))]),
    Case("max", ag.max, lambda *xs: np.max(np.broadcast_arrays(*xs), 0),
         [((3, 4), (3, 4), (3, 4)), ((2, 3), (3,))]),
    Case("min", ag.min, lambda *xs: np.min(np.broadcast_arrays(*xs), 0),
         [((3, 4), (3, 4), (3, 4)), ((2, 3), (3,))]),
    Case("add_all", ag.add_all, lambda *xs: np.sum(np.broadcast_arrays(*xs), 0),
         [((3, 4), (4,), (3, 4))]),
    Case("reduce_sum", ag.reduce_sum, lambda x: x.sum(keepdims=True), [A1, A2]),
    Case("reduce_sum_axes", lambda x: ag.reduce_sum(x, [1, -1], 0), lambda x: x.sum((1, -1)),
         [A2]),
    Case("reduce_mean", lambda x: ag.reduce_mean(x, [0]), lambda x: x.mean(0, keepdims=True),
         [A1, A2]),
    Case("reduce_mean_all", ag.reduce_mean, lambda x: x.mean(keepdims=True), [A2]),
]


def _params():
    for case in CASES:
        variants = case.shapes or [None]
        for k, shapes in enumerate(variants):
            yield pytest.param(case, shapes, id=f"{case.name}-{k}")


def _inputs(case: Case, shapes, rng) -> list:
    if shapes is None:
        return [np.asarray(a) for a in case.fixed]
    domains = case.domain if isinstance(case.domain, tuple) else (case.domain,) * len(shapes)
    return [DOMAINS[d](rng, s).astype(np.float32) for d, s in zip(domains, shapes)]


def _finite_difference(f, arrays, i, eps=1e-4):
    """d f(arrays) / d arrays[i] by central differences, in float64."""
    base = [a.astype(np.float64) for a in arrays]
    g = np.zeros_like(base[i])
    for j in np.ndindex(base[i].shape):
        hi = [a.copy() for a in base]
        lo = [a.copy() for a in base]
        hi[i][j] += eps
        lo[i][j] -= eps
        g[j] = (f(*hi) - f(*lo)) / (2 * eps)
    return g


# ops computed with matrix products: TF32 on NVIDIA GPUs, bfloat16 on TPU by default
_PRODUCTS = {"matmul", "gemm", "gemm_trans", "gemm_no_c"}


@pytest.mark.parametrize("case,shapes", list(_params()))
def test_forward_and_gradient(case: Case, shapes, rng):
    arrays = _inputs(case, shapes, rng)
    xs = [Tensor(data=a, stores_grad=case.grad) for a in arrays]
    y = case.op(*xs)
    expected = case.ref(*[a.astype(np.float64) for a in arrays])
    assert y.dtype == case.dtype
    assert y.shape == expected.shape
    exact = case.name not in _PRODUCTS  # elementwise: float32 on every backend
    tol = dict(rtol=2e-5, atol=2e-5) if exact else matmul_tolerance(2e-5, 2e-5)
    np.testing.assert_allclose(np.asarray(y.array), expected, **tol)

    if not case.grad:
        assert not y.requires_grad
        assert list(autograd.backward(y)) == []
        return
    dy = rng.normal(size=y.shape).astype(np.float32)
    grads = autograd.gradients(y, Tensor(data=dy))
    for i, x in enumerate(xs):
        want = _finite_difference(lambda *a: float(np.sum(case.ref(*a) * dy)), arrays, i)
        got = np.asarray(grads[id(x)].array)
        assert got.shape == x.shape
        tol = dict(rtol=2e-3, atol=2e-3) if exact else matmul_tolerance(2e-3, 2e-3)
        np.testing.assert_allclose(got, want, **tol,
                                   err_msg=f"gradient of {case.name} w.r.t. input {i}")


# --- forward conventions not covered by random inputs ---------------------------------------
def test_rounding_of_halves():
    x = Tensor(data=np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.0], np.float32))
    np.testing.assert_array_equal(np.asarray(autograd.round(x).array), [-3, -2, -1, 1, 2, 3, 3])
    np.testing.assert_array_equal(np.asarray(autograd.rounde(x).array), [-2, -2, 0, 0, 2, 2, 3])


def test_max_min_ties_give_the_gradient_to_the_first_input():
    a = Tensor(data=np.array([1., 2., 3.], np.float32), stores_grad=True)
    b = Tensor(data=np.array([1., 5., 0.], np.float32), stores_grad=True)
    for op, want_a in ((autograd.max, [1, 0, 1]), (autograd.min, [1, 1, 0])):
        g = autograd.gradients(op(a, b))
        np.testing.assert_array_equal(np.asarray(g[id(a)].array), want_a)
        np.testing.assert_array_equal(np.asarray(g[id(b)].array), 1 - np.array(want_a))


def test_comparisons_of_integers_give_float32():
    a = Tensor(data=np.array([1, 2, 3], np.int32), dtype=np.int32)
    b = Tensor(data=np.array([2, 2, 2], np.int32), dtype=np.int32)
    for op, want in ((autograd.less, [1, 0, 0]), (autograd.equal, [0, 1, 0]),
                     (autograd._or, [1, 1, 1])):
        y = op(a, b)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(y.array), want)


def test_integer_division_truncates_like_singa():
    a = Tensor(data=np.array([7, -7], np.int32), dtype=np.int32)
    b = Tensor(data=np.array([2, 2], np.int32), dtype=np.int32)
    y = autograd.div(a, b)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(y.array), [3, -3])


def test_split_returns_every_piece():
    x = Tensor(data=np.arange(12, dtype=np.float32).reshape(3, 4))
    pieces = autograd.split(x, 1, [1, 3])
    assert [p.shape for p in pieces] == [(3, 1), (3, 3)]
    assert [p.shape for p in autograd.split(x, 0, None, 3)] == [(1, 4)] * 3


def test_gather_with_an_index_tensor():
    x = Tensor(data=np.arange(12, dtype=np.float32).reshape(3, 4), stores_grad=True)
    idx = Tensor(data=np.array([3, 3, 0], np.int32), dtype=np.int32)
    y = autograd.gather(x, 1, idx)
    np.testing.assert_array_equal(np.asarray(y.array), np.arange(12).reshape(3, 4)[:, [3, 3, 0]])
    g = autograd.gradients(y)[id(x)]
    np.testing.assert_array_equal(np.asarray(g.array), [[1, 0, 0, 2]] * 3)


def test_value_dependent_shapes_refuse_to_compile():
    import jax
    for op in (autograd.nonzero, autograd.constant_of_shape):
        with pytest.raises(ValueError, match="graph-mode"):
            jax.jit(lambda a: op(Tensor(data=a)).array)(np.ones(2, np.float32))
    shape = jax.jit(lambda a: autograd.shape(Tensor(data=a)).array)(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(shape), [2, 3])


def test_ops_expose_singa_attributes():
    assert autograd.SoftMax(2).axis == 2
    op = autograd.Gemm(0.5, 2.0, 1, 0)
    assert (op.alpha, op.beta, op.transA, op.transB) == (0.5, 2.0, 1, 0)
    assert autograd.Concat(-1).axis == -1
    assert autograd.Where([1, 0]).condition == [1, 0]
    assert callable(autograd.shape)  # the function, not the shape.py module


BAD_INPUTS = [
    ("matmul", lambda a, b: autograd.matmul(a, b), ((2, 3), (4, 5)), "Matmul"),
    ("add", lambda a, b: autograd.add(a, b), ((2, 3), (4,)), "Add"),
    ("cat", lambda a, b: autograd.cat([a, b], 1), ((2, 3), (3, 3)), "Concat"),
    ("add_bias", lambda a, b: autograd.add_bias(a, b), ((2, 3), (2,)), "AddBias"),
    ("gemm", lambda a, b: autograd.gemm(a, b), ((2, 3), (2, 3)), "Gemm"),
    ("reshape", lambda a, b: autograd.reshape(a, [4, -1]), ((2, 3), (1,)), "Reshape"),
    ("squeeze", lambda a, b: autograd.squeeze(a, [0]), ((2, 3), (1,)), "Squeeze"),
    ("split", lambda a, b: autograd.split(a, 1, [2, 2]), ((2, 3), (1,)), "Split"),
]


@pytest.mark.parametrize("name,call,shapes,op_name", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_shape_mismatch_names_the_op_and_the_shapes(name, call, shapes, op_name):
    a, b = (Tensor(data=np.ones(s, np.float32)) for s in shapes)
    with pytest.raises(ValueError) as err:
        call(a, b)
    msg = str(err.value)
    assert op_name in msg and str(shapes[0]) in msg


def test_bad_constructor_arguments_raise():
    with pytest.raises(ValueError, match="Pad"):
        autograd.Pad("wrap", [1, 1])
    with pytest.raises(ValueError, match="UpSample"):
        autograd.UpSample("linear", [1, 2])
    with pytest.raises(ValueError, match="AddBias"):
        autograd.AddBias(2)
    with pytest.raises(ValueError, match="Split"):
        autograd.Split(0, None)
    with pytest.raises(TypeError, match="relu"):
        autograd.relu()


def test_broadcast_helpers(rng):
    assert autograd.axis_helper((2, 3, 4), (3, 1)) == (0, 2)
    assert autograd.axis_helper((2, 3), (2, 3)) == ()
    g = rng.normal(size=(2, 3, 4)).astype(np.float32)
    out = autograd.back_broadcast((2, 3, 4), (3, 1), Tensor(data=g).data)  # SINGA passes CTensors
    assert isinstance(out, autograd.CTensor) and out.shape() == (3, 1)
    np.testing.assert_allclose(np.asarray(out), g.sum((0, 2)).reshape(3, 1), rtol=1e-5)
    array_out = autograd.back_broadcast((2, 3, 4), (3, 1), Tensor(data=g).array)
    np.testing.assert_allclose(np.asarray(array_out), g.sum((0, 2)).reshape(3, 1), rtol=1e-5)
    np.testing.assert_array_equal(autograd.ctensor2numpy(Tensor(data=g).data), g)
    np.testing.assert_array_equal(autograd.ctensor2numpy(Tensor(data=g).array), g)
