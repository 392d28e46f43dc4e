"""singa_wrap: CTensor methods and free functions against NumPy, the conv/pool/batch-norm/RNN
handle functions against jax.grad, and a custom Operator built from singa_wrap functions."""
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, tensor
from singa_jax import singa_wrap as sw

RNG = np.random.default_rng(0)


def ct(a):
    return sw.CTensor.from_array(jnp.asarray(np.asarray(a, np.float32)))


def npa(x):
    return np.asarray(sw.as_array(x))


# ---------------------------------------------------------------------------------------------
# CTensor
# ---------------------------------------------------------------------------------------------
def test_ctensor_constructors_and_accessors():
    t = sw.CTensor((2, 3))
    assert t.shape() == (2, 3) and t.shape(1) == 3 and t.nDim() == 2 and t.Size() == 6
    assert t.data_type() == sw.kFloat32 == tensor.float32 and t.MemSize() == 24
    assert not t.transpose() and t.initialized() and t.device() is tensor.get_default_device()
    i = sw.CTensor([4], sw.kInt)
    assert i.data_type() == sw.kInt and i.shape() == (4,)
    d = sw.CTensor((3,), t.device(), sw.kInt)
    assert d.data_type() == np.int32 and npa(d).tolist() == [0, 0, 0]
    copy = sw.CTensor(t)
    copy += 1.0
    assert npa(t).sum() == 0 and npa(copy).sum() == 6  # the copy constructor copies


def test_ctensor_host_values_roundtrip():
    t = sw.CTensor((2, 3))
    t.CopyFloatDataFromHostPtr(np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(t.GetFloatValue(6), np.arange(6, dtype=np.float32))
    assert t.GetFloatValue(4).dtype == np.float32 and t.GetFloatValue(4).shape == (4,)
    t.CopyFloatDataFromHostPtr(np.array([9, 9], np.float32), 2)  # partial copy at an offset
    np.testing.assert_array_equal(npa(t).ravel(), [0, 1, 9, 9, 4, 5])
    i = sw.CTensor((3,), sw.kInt)
    i.CopyIntDataFromHostPtr(np.array([1, -2, 3], np.int32))
    assert i.GetIntValue(3).tolist() == [1, -2, 3]
    t.SetFloatValue(2.5)
    assert npa(t).tolist() == [[2.5] * 3] * 2
    with pytest.raises(ValueError, match="GetFloatValue"):
        t.GetFloatValue(7)
    with pytest.raises(ValueError, match="do not fit"):
        t.CopyFloatDataFromHostPtr(np.zeros(5, np.float32), 2)


def test_ctensor_inplace_and_arithmetic():
    a, b = RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))
    x = ct(a)
    same = x
    x += ct(b)
    x *= 2.0
    x -= 1.0
    x /= ct(np.full((2, 3), 4.0))
    assert same is x  # in place: the object stays, its array is rebound
    np.testing.assert_allclose(npa(x), ((a + b) * 2 - 1) / 4, rtol=1e-6)
    np.testing.assert_allclose(npa(ct(a) + 1.0), a + 1, rtol=1e-6)
    np.testing.assert_allclose(npa(2.0 - ct(a)), 2 - a, rtol=1e-6)
    np.testing.assert_allclose(npa(ct(a) * ct(b)), a * b, rtol=1e-6)
    np.testing.assert_allclose(npa(ct(a) / 2.0), a / 2, rtol=1e-6)
    np.testing.assert_array_equal(npa(ct(a) > 0.0), (a > 0).astype(np.float32))
    i = sw.CTensor((2,), sw.kInt)
    i += 2.7
    assert i.data_type() == sw.kInt and npa(i).tolist() == [2, 2]  # keeps its dtype, as C++
    with pytest.raises(ValueError, match="__iadd__"):
        x += ct(np.ones((3, 3)))
    assert x.shape() == (2, 3)


def test_ctensor_shape_type_device_methods():
    a = RNG.normal(size=(2, 3)).astype(np.float32)
    x = ct(a)
    assert x.Reshape([3, 2]) is x and x.shape() == (3, 2)
    np.testing.assert_array_equal(npa(x.T()), a.reshape(3, 2).T)
    assert x.AsType(sw.kInt).data_type() == sw.kInt and x.data_type() == sw.kFloat32
    x.ToType(sw.kInt)
    assert x.data_type() == sw.kInt
    y = ct(a)
    y.ToHost()
    y.ToDevice(tensor.get_default_device())
    assert y.device() is tensor.get_default_device()
    z = sw.CTensor((5,))
    z.ResetLike(y)
    assert z.shape() == (2, 3) and npa(z).sum() == 0
    z.CopyData(ct(a))
    np.testing.assert_array_equal(npa(z), a)
    np.testing.assert_array_equal(npa(y.Clone()), a)
    np.testing.assert_array_equal(npa(ct([1, 2]).Repeat([2], 0)), [1, 1, 2, 2])
    assert x.L1() == pytest.approx(np.abs(npa(x)).mean())
    assert ct(a).L2() == pytest.approx(np.linalg.norm(a) / a.size, rel=1e-6)
    with pytest.raises(ValueError, match="Reshape"):
        x.Reshape([4, 2])
    with pytest.raises(ValueError, match="CopyData"):
        z.CopyData(ct(np.ones(4)))


def test_ctensor_is_accepted_by_jax_and_numpy():
    a = RNG.normal(size=(3,)).astype(np.float32)
    x = ct(a)
    np.testing.assert_array_equal(np.asarray(x), a)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x)), a)
    out = jax.jit(lambda t: sw.MultFloat(t, 2.0))(x)  # a pytree: jit carries CTensors through
    assert isinstance(out, sw.CTensor)
    np.testing.assert_allclose(npa(out), 2 * a)
    assert isinstance(jnp.ones(3) + x, jax.Array)
    back = pickle.loads(pickle.dumps(x))
    np.testing.assert_array_equal(npa(back), a)


def test_as_array_and_bad_arguments():
    arr = jnp.ones(2)
    assert sw.as_array(arr) is arr and sw.as_array(sw.CTensor.from_array(arr)) is arr
    with pytest.raises(TypeError, match="pass t.data"):
        sw.ReLU(tensor.Tensor((2,)))
    with pytest.raises(TypeError, match="expected a CTensor or a jax.Array"):
        sw.Abs("x")
    with pytest.raises(TypeError, match="output argument must be a CTensor"):
        sw.Gaussian(0.0, 1.0, jnp.zeros(3))


# ---------------------------------------------------------------------------------------------
# free functions
# ---------------------------------------------------------------------------------------------
def test_unary_functions_match_numpy():
    a = RNG.uniform(0.1, 0.9, size=(2, 3)).astype(np.float32)
    b = RNG.normal(size=(2, 3)).astype(np.float32) * 3
    from scipy.special import erf
    cases = [(sw.Abs, np.abs, b), (sw.Ceil, np.ceil, b), (sw.Floor, np.floor, b),
             (sw.Exp, np.exp, b), (sw.Erf, erf, b), (sw.Log, np.log, a),
             (sw.ReLU, lambda v: np.maximum(v, 0), b), (sw.Sigmoid, lambda v: 1 / (1 + np.exp(-v)), b),
             (sw.Sign, np.sign, b), (sw.Sqrt, np.sqrt, a), (sw.Square, np.square, b),
             (sw.Cos, np.cos, b), (sw.Cosh, np.cosh, b), (sw.Acos, np.arccos, a),
             (sw.Acosh, np.arccosh, a + 1), (sw.Sin, np.sin, b), (sw.Sinh, np.sinh, b),
             (sw.Asin, np.arcsin, a), (sw.Asinh, np.arcsinh, b), (sw.Tan, np.tan, a),
             (sw.Tanh, np.tanh, b), (sw.Atan, np.arctan, b), (sw.Atanh, np.arctanh, a)]
    for fn, ref, x in cases:
        np.testing.assert_allclose(npa(fn(ct(x))), ref(x), rtol=2e-5, atol=1e-6,
                                   err_msg=fn.__name__)
    halves = np.array([-2.5, -0.5, 0.5, 1.5, 2.5, 1.2], np.float32)
    np.testing.assert_array_equal(npa(sw.Round(ct(halves))), [-3, -1, 1, 2, 3, 1])
    np.testing.assert_array_equal(npa(sw.RoundE(ct(halves))), [-2, -0, 0, 2, 2, 1])
    np.testing.assert_array_equal(npa(sw.ReLUBackward(ct([1, 2, 3]), ct([-1, 0, 5]))), [0, 0, 3])


def test_arithmetic_and_comparison_functions():
    a, b = RNG.normal(size=(2, 3)).astype(np.float32), RNG.uniform(1, 2, (2, 3)).astype(np.float32)
    np.testing.assert_allclose(npa(sw.__add__(ct(a), ct(b))), a + b, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.__sub__(ct(a), ct(b))), a - b, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.__mul__(ct(a), jnp.asarray(b))), a * b, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.__div__(jnp.asarray(a), ct(b))), a / b, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.AddFloat(ct(a), 2)), a + 2, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.SubFloat(ct(a), 2)), a - 2, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.MultFloat(ct(a), 3)), a * 3, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.DivFloat(ct(a), 4)), a / 4, rtol=1e-6)
    np.testing.assert_allclose(npa(sw.Pow(ct(b), ct(a))), b ** a, rtol=1e-5)
    np.testing.assert_allclose(npa(sw.PowFloat(ct(b), 2.5)), b ** 2.5, rtol=1e-5)
    for fn, ref in ((sw.LTFloat, np.less), (sw.LEFloat, np.less_equal), (sw.GTFloat, np.greater),
                    (sw.GEFloat, np.greater_equal), (sw.EQFloat, np.equal)):
        out = fn(ct(np.array([0., 1., 2.])), 1.0)
        assert out.data_type() == sw.kFloat32
        np.testing.assert_array_equal(npa(out), ref([0, 1, 2], 1).astype(np.float32))
    for fn, ref in ((sw.__lt__, np.less), (sw.__le__, np.less_equal), (sw.__gt__, np.greater),
                    (sw.__ge__, np.greater_equal), (sw.__eq__, np.equal)):
        np.testing.assert_array_equal(npa(fn(ct(a), ct(b * 0))), ref(a, 0).astype(np.float32))
    with pytest.raises(ValueError, match=r"__add__: cannot combine CTensor\(2, 3\)"):
        sw.__add__(ct(a), ct(np.ones((4,))))


def test_functions_with_output_arguments():
    a, b = RNG.normal(size=(2, 3)).astype(np.float32), RNG.uniform(1, 2, (2, 3)).astype(np.float32)
    for fn, ref in ((sw.Add, a + b), (sw.Sub, a - b), (sw.EltwiseMult, a * b), (sw.Div, a / b)):
        out = sw.CTensor((2, 3))
        assert fn(ct(a), ct(b), out) is out
        np.testing.assert_allclose(npa(out), ref, rtol=1e-6)
        np.testing.assert_allclose(npa(fn(ct(a), ct(b))), ref, rtol=1e-6)
    for fn, ref in ((sw.AddFloatWithRet, a + 2), (sw.SubFloatWithRet, a - 2),
                    (sw.EltwiseMultFloatWithRet, a * 2), (sw.DivFloatWithRet, a / 2)):
        out = sw.CTensor((6,))  # C++ writes into the output's memory: its shape is kept
        fn(ct(a), 2.0, out)
        assert out.shape() == (6,)
        np.testing.assert_allclose(npa(out), ref.ravel(), rtol=1e-6)
    out = sw.CTensor((2, 3))
    sw.PowWithRet(ct(b), ct(a), out)
    np.testing.assert_allclose(npa(out), b ** a, rtol=1e-5)
    sw.PowFloatWithRet(ct(b), 2.0, out)
    np.testing.assert_allclose(npa(out), b ** 2, rtol=1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        sw.Add(ct(a), ct(b), sw.CTensor((4,)))


def test_reductions_softmax_and_losses():
    a = RNG.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(npa(sw.Sum(ct(a), 0)), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(npa(sw.Sum(ct(a), 1)), a.sum(1), rtol=1e-5)
    assert sw.SumAll(ct(a)).shape() == (1,)
    np.testing.assert_allclose(npa(sw.SumAll(ct(a))), [a.sum()], rtol=1e-5)
    assert sw.SumAsFloat(ct(a)) == pytest.approx(a.sum(), rel=1e-5)
    np.testing.assert_allclose(npa(sw.Average(ct(a), 1)), a.mean(1), rtol=1e-5)

    def softmax_rows(m):
        e = np.exp(m - m.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    x = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(npa(sw.SoftMax(ct(x))), softmax_rows(x.reshape(2, 12)).reshape(x.shape),
                               rtol=1e-5)
    np.testing.assert_allclose(npa(sw.SoftMax(ct(x), -1)),
                               softmax_rows(x.reshape(6, 4)).reshape(x.shape), rtol=1e-5)
    out = sw.CTensor((2, 3, 4))
    sw.SoftMax(ct(x), out, 0)
    np.testing.assert_allclose(npa(out), softmax_rows(x.reshape(1, 24)).reshape(x.shape), rtol=1e-5)
    # SoftMaxBackward(dy, axis, y) is the vjp of softmax
    y = sw.SoftMax(ct(a), 1)
    dy = RNG.normal(size=a.shape).astype(np.float32)
    _, pull = jax.vjp(lambda v: jax.nn.softmax(v, axis=1), jnp.asarray(a))
    np.testing.assert_allclose(npa(sw.SoftMaxBackward(ct(dy), 1, y)), pull(jnp.asarray(dy))[0],
                               rtol=1e-5, atol=1e-6)
    # cross entropy with int labels and with soft targets (normalised per row)
    p = softmax_rows(a)
    labels = np.array([1, 0, 3], np.int32)
    lab = sw.CTensor.from_array(jnp.asarray(labels))
    np.testing.assert_allclose(npa(sw.CrossEntropyFwd(ct(p), lab)),
                               -np.log(p[np.arange(3), labels]), rtol=1e-5)
    soft = RNG.uniform(size=a.shape).astype(np.float32)
    np.testing.assert_allclose(npa(sw.CrossEntropyFwd(ct(p), ct(soft))),
                               -(soft / soft.sum(1, keepdims=True) * np.log(p)).sum(1), rtol=1e-5)
    onehot = np.eye(4, dtype=np.float32)[labels]
    np.testing.assert_allclose(npa(sw.SoftmaxCrossEntropyBwd(ct(p), lab)), p - onehot, atol=1e-6)
    np.testing.assert_allclose(npa(sw.SoftmaxCrossEntropyBwd(ct(p), ct(onehot))), p - onehot,
                               atol=1e-6)
    with pytest.raises(ValueError, match="CrossEntropyFwd"):
        sw.CrossEntropyFwd(ct(p), ct(np.ones(5)))


def test_shape_functions():
    a = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(npa(sw.Reshape(ct(a), [6, 4])), a.reshape(6, 4))
    np.testing.assert_array_equal(npa(sw.Transpose(ct(a), [2, 0, 1])), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(npa(sw.DefaultTranspose(ct(a))), a.T)
    np.testing.assert_array_equal(npa(sw.Contiguous(ct(a))), a)
    vec = sw.VecTensor()
    vec.append(ct(a))
    vec.append(jnp.asarray(a[:, :1]))
    assert all(isinstance(v, sw.CTensor) for v in vec)
    np.testing.assert_array_equal(npa(sw.ConcatOn(vec, 1)), np.concatenate([a, a[:, :1]], 1))
    np.testing.assert_array_equal(npa(sw.ConcatOn(sw.VecTensor([ct(a), ct(a)]), 0)),
                                  np.concatenate([a, a], 0))
    np.testing.assert_array_equal(npa(sw.SliceOn(ct(a), 1, 3, 2)), a[:, :, 1:3])
    dst = sw.CTensor((2, 3))
    sw.CopyDataToFrom(dst, ct(np.arange(10)), 3, 2, 5)  # 3 values from offset 5 to offset 2
    np.testing.assert_array_equal(npa(dst).ravel(), [0, 0, 5, 6, 7, 0])
    with pytest.raises(ValueError, match="Transpose"):
        sw.Transpose(ct(a), [0, 0, 1])
    with pytest.raises(ValueError, match="SliceOn"):
        sw.SliceOn(ct(a), 2, 5, 1)
    with pytest.raises(ValueError, match="CopyDataToFrom"):
        sw.CopyDataToFrom(dst, ct(np.arange(10)), 5, 2, 0)


def test_random_fills_use_the_device_key():
    dev = tensor.get_default_device()
    out = sw.CTensor((20000,))
    dev.SetRandSeed(3)
    sw.Gaussian(1.0, 2.0, out)
    g = npa(out)
    assert abs(g.mean() - 1.0) < 0.05 and abs(g.std() - 2.0) < 0.05
    dev.SetRandSeed(3)
    again = sw.CTensor((20000,))
    sw.Gaussian(1.0, 2.0, again)
    np.testing.assert_array_equal(npa(again), g)  # reproducible after SetRandSeed
    sw.Uniform(-1.0, 3.0, out)
    u = npa(out)
    assert u.min() >= -1 and u.max() <= 3 and abs(u.mean() - 1.0) < 0.05
    sw.Bernoulli(0.3, out)
    b = npa(out)
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.02
    with pytest.raises(ValueError, match="Bernoulli"):
        sw.Bernoulli(1.5, out)


def test_blas_and_matrix_functions():
    A, B = RNG.normal(size=(2, 3)).astype(np.float32), RNG.normal(size=(3, 4)).astype(np.float32)
    C0 = RNG.normal(size=(2, 4)).astype(np.float32)
    # Mult is a matmul: TF32 on a GPU by default, against NumPy's float32 products
    np.testing.assert_allclose(npa(sw.Mult(ct(A), ct(B))), A @ B, **matmul_tolerance(1e-5))
    np.testing.assert_allclose(npa(sw.Mult(ct(A), ct(B[:, 0]))), A @ B[:, 0],
                               **matmul_tolerance(1e-5))
    C = ct(C0)
    sw.Mult(2.0, ct(A), ct(B), 0.5, C)  # the GEMM form
    np.testing.assert_allclose(npa(C), 2 * A @ B + 0.5 * C0, **matmul_tolerance(1e-5))
    sw.MultWithScale(1.0, ct(A), ct(B), 0.0, C)
    np.testing.assert_allclose(npa(C), A @ B, **matmul_tolerance(1e-5))
    sw.Mult(ct(A), ct(B), C)
    np.testing.assert_allclose(npa(C), A @ B, **matmul_tolerance(1e-5))
    batched = RNG.normal(size=(5, 2, 3)).astype(np.float32), RNG.normal(size=(5, 3, 2)).astype(np.float32)
    np.testing.assert_allclose(npa(sw.Mult(ct(batched[0]), ct(batched[1]))),
                               batched[0] @ batched[1], **matmul_tolerance(1e-5))
    y = ct(C0)
    sw.Axpy(3.0, ct(A @ B), y)
    np.testing.assert_allclose(npa(y), C0 + 3 * (A @ B), rtol=1e-5)
    sw.Axpy(ct([-1.0]), ct(A @ B), y)  # alpha as a one-element CTensor (SINGA's opt does this)
    np.testing.assert_allclose(npa(y), C0 + 2 * (A @ B), rtol=1e-5)
    row, col = np.arange(4, dtype=np.float32) + 1, np.arange(2, dtype=np.float32) + 1
    for fn, ref in ((sw.AddRow, C0 + row), (sw.MultRow, C0 * row), (sw.DivRow, C0 / row),
                    (sw.SubRow, C0 - row), (sw.AddColumn, C0 + col[:, None]),
                    (sw.MultColumn, C0 * col[:, None]), (sw.DivColumn, C0 / col[:, None]),
                    (sw.SubColumn, C0 - col[:, None])):
        M = ct(C0)
        fn(ct(row if "Row" in fn.__name__ else col), M)
        np.testing.assert_allclose(npa(M), ref, rtol=1e-5, err_msg=fn.__name__)
    M = ct(C0)
    sw.AddRow(2.0, 0.5, ct(row), M)
    np.testing.assert_allclose(npa(M), 2 * row + 0.5 * C0, rtol=1e-5)
    M = ct(C0)
    sw.AddColumnWithScale(-1.0, 3.0, ct(col), M)
    np.testing.assert_allclose(npa(M), -col[:, None] + 3 * C0, rtol=1e-5)
    v = sw.CTensor((1, 4))
    sw.SumRows(ct(C0), v)
    np.testing.assert_allclose(npa(v), C0.sum(0, keepdims=True), rtol=1e-5)
    v = sw.CTensor((2,))
    sw.SumColumns(ct(C0), v)
    np.testing.assert_allclose(npa(v), C0.sum(1), rtol=1e-5)
    with pytest.raises(ValueError, match="AddRow: v"):
        sw.AddRow(ct(col), ct(C0))
    with pytest.raises(TypeError, match="Mult: expected"):
        sw.Mult(ct(A))


# ---------------------------------------------------------------------------------------------
# handle functions against jax.grad
# ---------------------------------------------------------------------------------------------
def test_conv_functions_match_jax_grad():
    x = RNG.normal(size=(2, 4, 6, 6)).astype(np.float32)
    W = RNG.normal(size=(6, 2, 3, 3)).astype(np.float32)
    b = RNG.normal(size=(6,)).astype(np.float32)
    h = sw.ConvHandle(ct(x), [3, 3], [2, 1], [1, 0], 4, 6, True, 2)

    def conv(x_, W_, b_):
        y = jax.lax.conv_general_dilated(x_, W_, (2, 1), ((1, 1), (0, 0)),
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                         feature_group_count=2)
        return y + b_.reshape(1, -1, 1, 1)
    y_ref = conv(x, W, b)
    y = sw.CpuConvForward(ct(x), ct(W), ct(b), h)
    np.testing.assert_allclose(npa(y), y_ref, rtol=1e-4, atol=1e-4)
    dy = RNG.normal(size=y_ref.shape).astype(np.float32)
    gx, gW, gb = jax.grad(lambda *a: jnp.sum(conv(*a) * dy), argnums=(0, 1, 2))(x, W, b)
    np.testing.assert_allclose(npa(sw.CpuConvBackwardx(ct(dy), ct(W), ct(x), h)), gx, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(npa(sw.GpuConvBackwardW(ct(dy), ct(x), ct(W), h)), gW, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(npa(sw.CpuConvBackwardb(ct(dy), ct(b), h)), gb, rtol=1e-4)
    no_bias = sw.ConvHandle(ct(x), [3, 3], [2, 1], [1, 0], 4, 6, False, 2)
    np.testing.assert_allclose(npa(sw.CpuConvForward(ct(x), ct(W), ct(b), no_bias)),
                               y_ref - b.reshape(1, -1, 1, 1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="CpuConvForward"):
        sw.CpuConvForward(ct(x), ct(W[:, :, :2]), ct(b), h)
    with pytest.raises(TypeError, match="ConvHandle"):
        sw.CpuConvForward(ct(x), ct(W), ct(b), object())


def test_pooling_functions_match_jax_grad_and_singa_values():
    x = np.arange(1, 13, dtype=np.float32).reshape(1, 3, 2, 2)
    dy = np.array([1, 2, 3], np.float32).reshape(1, 3, 1, 1)
    hmax = sw.PoolingHandle(ct(x), [2, 2], [1, 1], [0, 0], True)
    y = sw.CpuPoolingForward(hmax, ct(x))
    np.testing.assert_array_equal(npa(y).ravel(), [4, 8, 12])  # SINGA's test_api values
    dx = sw.CpuPoolingBackward(hmax, ct(dy), ct(x), y)
    np.testing.assert_array_equal(npa(dx).ravel(), [0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3])
    havg = sw.PoolingHandle(ct(x), [2, 2], [1, 1], [0, 0], False)
    np.testing.assert_allclose(npa(sw.GpuPoolingForward(havg, ct(x))).ravel(), [2.5, 6.5, 10.5])
    np.testing.assert_allclose(npa(sw.CpuPoolingBackward(havg, ct(dy), ct(x), y)).ravel(),
                               np.repeat([0.25, 0.5, 0.75], 4))
    # strided, padded max pooling against jax.grad of reduce_window
    x = RNG.normal(size=(2, 2, 5, 5)).astype(np.float32)
    h = sw.PoolingHandle(ct(x), [3, 3], [2, 2], [1, 1], True)

    def pool(v):
        return jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                                     ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = sw.CpuPoolingForward(h, ct(x))
    np.testing.assert_allclose(npa(y), pool(x))
    g = RNG.normal(size=npa(y).shape).astype(np.float32)
    np.testing.assert_allclose(npa(sw.CpuPoolingBackward(h, ct(g), ct(x), y)),
                               jax.grad(lambda v: jnp.sum(pool(v) * g))(x), rtol=1e-6)


def _np_bn(x, scale, bias, eps=1e-5):
    m, v = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
    return (x - m) / np.sqrt(v + eps) * scale + bias, m, v


def test_batchnorm_functions():
    x = RNG.normal(size=(4, 3, 2, 2)).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, (1, 3, 1, 1)).astype(np.float32)
    bias = RNG.normal(size=(1, 3, 1, 1)).astype(np.float32)
    rm0, rv0 = np.zeros((1, 3, 1, 1), np.float32), np.ones((1, 3, 1, 1), np.float32)
    h = sw.BatchNormHandle(0.2, ct(x))
    rm, rv = ct(rm0), ct(rv0)
    y, mean, var = sw.CpuBatchNormForwardTraining(h, ct(x), ct(scale), ct(bias), rm, rv)
    y_ref, m_ref, v_ref = _np_bn(x, scale, bias)
    np.testing.assert_allclose(npa(y), y_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(npa(mean), m_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(npa(var), v_ref, rtol=1e-5)
    n = x.size / 3
    np.testing.assert_allclose(npa(rm), 0.2 * m_ref, rtol=1e-5, atol=1e-6)  # updated in place
    np.testing.assert_allclose(npa(rv), 0.8 + 0.2 * v_ref * n / (n - 1), rtol=1e-5)
    assert rm.shape() == (1, 3, 1, 1)
    _, _, inv_std = sw.GpuBatchNormForwardTraining(h, ct(x), ct(scale), ct(bias), ct(rm0),
                                                   ct(rv0))
    np.testing.assert_allclose(npa(inv_std), 1 / np.sqrt(v_ref + 1e-5), rtol=1e-5)
    y_inf = sw.CpuBatchNormForwardInference(h, ct(x), ct(scale), ct(bias), rm, rv)
    np.testing.assert_allclose(npa(y_inf), (x - npa(rm)) / np.sqrt(npa(rv) + 1e-5) * scale + bias,
                               rtol=1e-4, atol=1e-5)
    dy = RNG.normal(size=x.shape).astype(np.float32)

    def bn(x_, s_, b_):
        m, v = jnp.mean(x_, (0, 2, 3), keepdims=True), jnp.var(x_, (0, 2, 3), keepdims=True)
        return jnp.sum(((x_ - m) / jnp.sqrt(v + 1e-5) * s_ + b_) * dy)
    gx, gs, gb = jax.grad(bn, argnums=(0, 1, 2))(x, scale, bias)
    dx, ds, db = sw.CpuBatchNormBackwardx(h, y, ct(dy), ct(x), ct(scale), ct(bias), mean, var)
    np.testing.assert_allclose(npa(dx), gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(npa(ds), gs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(npa(db), gb, rtol=1e-4, atol=1e-5)
    dx2, _, _ = sw.GpuBatchNormBackward(h, ct(dy), ct(x), ct(scale), mean, inv_std)
    np.testing.assert_allclose(npa(dx2), gx, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="output argument must be a CTensor"):
        sw.CpuBatchNormForwardTraining(h, ct(x), ct(scale), ct(bias), jnp.zeros(3), rv)
    with pytest.raises(ValueError, match="one value per channel"):
        sw.CpuBatchNormForwardInference(h, ct(x), ct(np.ones(4)), ct(bias), rm, rv)


# ---------------------------------------------------------------------------------------------
# platform, flags, NcclIdHolder
# ---------------------------------------------------------------------------------------------
def test_flags_platform_and_nccl_id():
    assert sw.USE_CUDA == any(d.platform == "gpu" for d in jax.devices())
    assert sw.USE_PYTHON3 and sw.USE_DNNL and not sw.USE_OPENCL and not sw.USE_DIST
    assert sw.Platform.GetDefaultDevice() is tensor.get_default_device()
    assert sw.SizeOf(sw.kFloat16) == 2 and sw.Product([2, 3, 4], 1) == 12
    holder = sw.NcclIdHolder()
    host, port = holder.address.split(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536 and holder.id == holder.address
    assert pickle.loads(pickle.dumps(holder)).address == holder.address
    with pytest.raises(NotImplementedError, match="DistOpt"):
        sw.Communicator(1)


# ---------------------------------------------------------------------------------------------
# a custom Operator written with singa_wrap functions
# ---------------------------------------------------------------------------------------------
class ScaledTanh(autograd.Operator):
    """y = a * tanh(x) with a CTensor-level forward/backward, as SINGA's guide writes them."""

    def __init__(self, a):
        super().__init__()
        self.a = a

    def forward(self, x):
        self.y = singa_y = sw.MultFloat(sw.Tanh(x), self.a)
        return singa_y

    def backward(self, dy):
        # d/dx a tanh(x) = a (1 - tanh^2) = a - y^2 / a
        local = sw.AddFloat(sw.MultFloat(sw.Square(self.y), -1.0 / self.a), self.a)
        return sw.__mul__(dy, local)


def test_custom_operator_gradient_by_finite_differences():
    x_np = RNG.normal(size=(2, 3)).astype(np.float32)
    c_np = RNG.normal(size=(2, 3)).astype(np.float32)
    autograd.training = True
    try:
        x = tensor.Tensor(data=x_np, requires_grad=True, stores_grad=True)
        c = tensor.Tensor(data=c_np, requires_grad=False)
        y = ScaledTanh(1.7)(x)[0]
        np.testing.assert_allclose(tensor.to_numpy(y), 1.7 * np.tanh(x_np), rtol=1e-6)
        loss = autograd.reduce_sum(autograd.mul(y, c))
        grad = {id(p): g for p, g in autograd.backward(loss)}[id(x)]
    finally:
        autograd.training = False

    def f(v):
        return np.sum(1.7 * np.tanh(v) * c_np.astype(np.float64))
    eps, numeric = 1e-5, np.zeros(x_np.shape)
    for i in np.ndindex(x_np.shape):
        up, down = x_np.astype(np.float64), x_np.astype(np.float64)
        up[i] += eps
        down[i] -= eps
        numeric[i] = (f(up) - f(down)) / (2 * eps)
    np.testing.assert_allclose(tensor.to_numpy(grad), numeric, rtol=1e-4, atol=1e-5)
    # called directly, forward/backward return what SINGA's do: one CTensor each
    op = ScaledTanh(2.0)
    out = op.forward(sw.CTensor.from_array(jnp.asarray(x_np)))
    assert isinstance(out, sw.CTensor)
    assert isinstance(op.backward(jnp.ones((2, 3))), sw.CTensor)


def test_custom_operator_example_runs():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "custom_op", "softplus.py")
    spec = importlib.util.spec_from_file_location("example_custom_op_softplus", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    try:
        assert example.finite_difference_check() < 1e-5
        losses = example.main(["--steps", "30"])
    finally:
        autograd.training = False
    assert losses[-1] < 0.2 * losses[0]


def test_custom_operator_trains_in_graph_mode_as_in_eager():
    """The same CTensor-level operator inside a Model's train_one_batch: compiled into one
    program (it traces like any op) with the same numbers as eager mode."""
    from singa_jax import layer, model, opt

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = layer.Linear(6), layer.Linear(2)
            self.loss = layer.MeanSquareError()

        def forward(self, x):
            return self.fc2(ScaledTanh(1.5)(self.fc1(x))[0])

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = self.loss(out, y)
            self.optimizer(loss)
            return out, loss

    x_np = RNG.normal(size=(8, 4)).astype(np.float32)
    y_np = RNG.normal(size=(8, 2)).astype(np.float32)
    runs = {}
    for graph in (False, True):
        tensor.get_default_device().SetRandSeed(5)
        net = Net()
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        x, y = tensor.from_numpy(x_np), tensor.from_numpy(y_np)
        net.compile([x], is_train=True, use_graph=graph)
        losses = [float(tensor.to_numpy(net(x, y)[1]).reshape(-1)[0]) for _ in range(8)]
        runs[graph] = (losses, tensor.to_numpy(net.fc1.W))
        if graph:
            assert net.graph_stats()["traces"] <= 2  # compiled, not run op by op
    assert runs[True][0][-1] < runs[True][0][0]
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-5, atol=1e-6)
