"""Tests of autograd's neural-network operators: conv, pooling, batch norm, dropout, embedding, cossim,
global average pooling and the RNN operator, against NumPy references written independently
(naive loops, step-by-step recurrences) and gradients against finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, device
from singa_jax.precision import float32_matmul_precision_scope
from singa_jax.tensor import Tensor


pytestmark = pytest.mark.usefixtures("training_mode")


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def leaf(a, grad=True):
    return Tensor(data=np.asarray(a), stores_grad=grad, requires_grad=grad)


def run_with_grads(op_fn, arrays, dy):
    """y and the gradient of <y, dy> w.r.t. every float input of op_fn(*tensors)."""
    ts = [leaf(a, np.issubdtype(np.asarray(a).dtype, np.floating)) for a in arrays]
    y = op_fn(*ts)
    grads = autograd.gradients(y, dy)
    return np.asarray(y.array), [None if id(t) not in grads else np.asarray(grads[id(t)].array)
                                for t in ts]


# The gradient's formula is checked in float32 (finite differences of TF32 results are noise);
# forward results are compared with their references at the precision in force.
@float32_matmul_precision_scope("float32")
def check_fd(op_fn, arrays, seed=0, eps=1e-2, rtol=2e-2, atol=1e-3):
    """Directional finite differences: for every float input i and a random direction v,
    <dL/dx_i, v> must match (L(x_i + eps v) - L(x_i - eps v)) / (2 eps), L = <y, dy>."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a) for a in arrays]
    y, grads = run_with_grads(op_fn, arrays, None)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    y, grads = run_with_grads(op_fn, arrays, dy)

    def loss(args):
        out = op_fn(*[Tensor(data=a, requires_grad=False) for a in args])
        return float(np.sum(np.asarray(out.array, np.float64) * dy))

    for i, a in enumerate(arrays):
        if not np.issubdtype(a.dtype, np.floating):
            continue
        v = rng.standard_normal(a.shape).astype(np.float32)
        plus = [b if j != i else (a + eps * v).astype(np.float32) for j, b in enumerate(arrays)]
        minus = [b if j != i else (a - eps * v).astype(np.float32) for j, b in enumerate(arrays)]
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        analytic = float(np.sum(grads[i].astype(np.float64) * v))
        assert analytic == pytest.approx(fd, rel=rtol, abs=atol), f"input {i}"
    return y, grads


# ---------------------------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------------------------
def conv_reference(x, W, b, stride, pad, dilation, group, odd=(0, 0, 0, 0)):
    """Naive NCHW grouped convolution on an explicitly zero-padded input."""
    x = np.pad(x, ((0, 0), (0, 0), (pad[0] + odd[0], pad[0] + odd[1]),
                   (pad[1] + odd[2], pad[1] + odd[3])))
    n, c, hh, ww = x.shape
    o, cg, kh, kw = W.shape
    eh, ew = (kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1
    oh, ow = (hh - eh) // stride[0] + 1, (ww - ew) // stride[1] + 1
    y = np.zeros((n, o, oh, ow), np.float64)
    per_group = o // group
    for f in range(o):
        g = f // per_group
        for i in range(oh):
            for j in range(ow):
                patch = x[:, g * cg:(g + 1) * cg,
                          i * stride[0]:i * stride[0] + eh:dilation[0],
                          j * stride[1]:j * stride[1] + ew:dilation[1]]
                y[:, f, i, j] = np.sum(patch * W[f], axis=(1, 2, 3))
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


CONV_CASES = [  # (in_ch, out_ch, kernel, stride, padding, dilation, group, bias, odd_padding)
    (3, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, True, (0, 0, 0, 0)),
    (4, 6, (3, 2), (2, 1), (0, 1), (1, 1), 2, False, (0, 0, 0, 0)),
    (4, 4, (3, 3), (1, 2), (1, 0), (2, 1), 4, True, (0, 0, 0, 0)),  # depthwise + dilation
    (2, 3, (3, 3), (2, 2), (0, 0), (1, 1), 1, True, (0, 1, 0, 1)),  # SAME_UPPER-style
    (2, 3, (2, 2), (1, 1), (0, 0), (1, 1), 1, True, (1, 0, 1, 0)),  # SAME_LOWER-style
    (3, 6, (3, 3), (2, 1), (1, 1), (1, 1), 3, True, (0, 1, 1, 0)),  # depthwise, multiplier 2
    (5, 5, (1, 3), (1, 1), (0, 1), (1, 1), 5, False, (0, 0, 0, 0)),  # depthwise, 1x3
]


@pytest.mark.parametrize("cin,cout,kernel,stride,pad,dil,group,bias,odd", CONV_CASES)
def test_conv2d_forward_and_grad(cin, cout, kernel, stride, pad, dil, group, bias, odd):
    rng = np.random.default_rng(1)
    x = rand(rng, 2, cin, 6, 5)
    W = rand(rng, cout, cin // group, *kernel)
    b = rand(rng, cout) if bias else None
    handle_input = np.zeros((2, cin, 6 + odd[0] + odd[1], 5 + odd[2] + odd[3]), np.float32)
    handle = autograd.ConvHandle(handle_input, kernel, stride, pad, cin, cout, bias, group,
                           dilation=dil)
    arrays = [x, W] + ([b] if bias else [])

    def op(*ts):
        return autograd.conv2d(handle, *ts, odd_padding=odd) if bias else \
            autograd.conv2d(handle, ts[0], ts[1], None, odd)

    y, grads = check_fd(op, arrays)
    expected = conv_reference(x, W, b, stride, pad, dil, group, odd)
    np.testing.assert_allclose(y, expected, **matmul_tolerance(1e-4, 1e-4))
    assert (handle.conv_height, handle.conv_width) == expected.shape[2:]
    assert all(g.shape == a.shape for g, a in zip(grads, arrays))


def test_conv2d_bias_gradient_is_sum_of_dy():
    rng = np.random.default_rng(2)
    x, W, b = rand(rng, 2, 2, 4, 4), rand(rng, 3, 2, 3, 3), rand(rng, 3)
    handle = autograd.CudnnConvHandle(x, (3, 3), (1, 1), (1, 1), 2, 3, True)
    dy = rand(rng, 2, 3, 4, 4)
    _, (_, _, db) = run_with_grads(lambda *t: autograd.conv2d(handle, *t), [x, W, b], dy)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-5)


def test_conv2d_channel_mismatch_raises():
    rng = np.random.default_rng(3)
    x, W = leaf(rand(rng, 1, 3, 4, 4)), leaf(rand(rng, 2, 2, 3, 3))
    handle = autograd.ConvHandle(np.zeros((1, 3, 4, 4)), (3, 3), (1, 1), (0, 0), 3, 2, False)
    with pytest.raises(ValueError, match=r"_Conv2d.*\(1, 3, 4, 4\).*\(2, 2, 3, 3\)"):
        autograd.conv2d(handle, x, W)
    with pytest.raises(ValueError, match="in_channels"):
        autograd.ConvHandle(np.zeros((1, 3, 4, 4)), (3, 3), (1, 1), (0, 0), 4, 2, False)


# ---------------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------------
def pool_reference(x, kernel, stride, pad, is_max, odd=(0, 0, 0, 0)):
    """Naive pooling; SINGA's odd padding copies edge rows/columns of the input; the symmetric
    padding never wins a max and is not counted by the average."""
    top, bottom, left, right = odd
    x = np.concatenate([x[:, :, :top], x, x[:, :, x.shape[2] - bottom:]], axis=2)
    x = np.concatenate([x[:, :, :, :left], x, x[:, :, :, x.shape[3] - right:]], axis=3)
    n, c, hh, ww = x.shape
    oh = (hh + 2 * pad[0] - kernel[0]) // stride[0] + 1
    ow = (ww + 2 * pad[1] - kernel[1]) // stride[1] + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * stride[0] - pad[0], j * stride[1] - pad[1]
            win = x[:, :, max(r0, 0):min(r0 + kernel[0], hh), max(c0, 0):min(c0 + kernel[1], ww)]
            y[:, :, i, j] = win.max(axis=(2, 3)) if is_max else win.mean(axis=(2, 3))
    return y


POOL_CASES = [  # (kernel, stride, padding, is_max, odd_padding)
    ((2, 2), (2, 2), (0, 0), True, (0, 0, 0, 0)),
    ((3, 3), (2, 2), (1, 1), True, (0, 0, 0, 0)),
    ((3, 3), (2, 2), (1, 1), False, (0, 0, 0, 0)),
    ((3, 2), (1, 2), (1, 0), False, (0, 0, 0, 0)),
    ((3, 3), (2, 2), (0, 0), False, (0, 1, 1, 0)),
    ((2, 2), (2, 2), (0, 0), True, (1, 0, 0, 1)),
]


@pytest.mark.parametrize("kernel,stride,pad,is_max,odd", POOL_CASES)
def test_pooling_forward_and_grad(kernel, stride, pad, is_max, odd):
    rng = np.random.default_rng(4)
    # distinct, well separated values so a max never ties or switches under the FD step
    x = (rng.permutation(2 * 3 * 5 * 6).reshape(2, 3, 5, 6) * 0.1).astype(np.float32)
    handle = autograd.PoolingHandle(np.zeros((2, 3, 5 + odd[0] + odd[1], 6 + odd[2] + odd[3])),
                              kernel, stride, pad, is_max)
    y, _ = check_fd(lambda t: autograd.pooling_2d(handle, t, odd), [x], eps=1e-3)
    np.testing.assert_allclose(y, pool_reference(x, kernel, stride, pad, is_max, odd),
                               rtol=1e-5, atol=1e-5)
    assert y.shape[2:] == (handle.pooled_height, handle.pooled_width)


def test_average_pooling_excludes_padding_from_count():
    x = np.ones((1, 1, 2, 2), np.float32)
    handle = autograd.CudnnPoolingHandle(x, (3, 3), (1, 1), (1, 1), False)
    y = autograd.pooling_2d(handle, leaf(x))
    np.testing.assert_allclose(np.asarray(y.array), np.ones((1, 1, 2, 2)))


def test_max_pooling_gradient_routes_to_argmax():
    x = np.array([[[[1, 5], [3, 2]]]], np.float32)
    handle = autograd.PoolingHandle(x, (2, 2), (2, 2), (0, 0), True)
    _, (dx,) = run_with_grads(lambda t: autograd.pooling_2d(handle, t), [x],
                              np.full((1, 1, 1, 1), 3.0, np.float32))
    np.testing.assert_array_equal(dx, [[[[0, 3], [0, 0]]]])


# ---------------------------------------------------------------------------------------------
# batch normalisation
# ---------------------------------------------------------------------------------------------
def bn_tensors(rng, c):
    scale, bias = rand(rng, c), rand(rng, c)
    rm, rv = rand(rng, c), (np.abs(rand(rng, c)) + 0.5).astype(np.float32)
    return scale, bias, rm, rv


@pytest.mark.parametrize("shape", [(4, 3, 2, 2), (5, 3)])
def test_batchnorm_training_statistics_and_running_update(shape):
    rng = np.random.default_rng(5)
    x = rand(rng, *shape, scale=2.0) + 1.0
    scale, bias, rm0, rv0 = bn_tensors(rng, shape[1])
    momentum = 0.8
    handle = autograd.CudnnBatchNormHandle(momentum, x)
    rm, rv = Tensor(data=rm0, requires_grad=False), Tensor(data=rv0, requires_grad=False)
    y = autograd.batchnorm_2d(handle, leaf(x), leaf(scale), leaf(bias), rm, rv)

    axes = (0,) + tuple(range(2, x.ndim))
    cshape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    n = x.size // shape[1]
    expected = (x - mean.reshape(cshape)) / np.sqrt(var.reshape(cshape) + 1e-5) \
        * scale.reshape(cshape) + bias.reshape(cshape)
    np.testing.assert_allclose(np.asarray(y.array), expected, rtol=1e-4, atol=1e-4)
    # SINGA: running = (1 - momentum) * running + momentum * batch, unbiased batch variance
    np.testing.assert_allclose(np.asarray(rm.array), (1 - momentum) * rm0 + momentum * mean,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rv.array),
                               (1 - momentum) * rv0 + momentum * var * n / (n - 1), rtol=1e-5)


def test_batchnorm_eval_uses_running_statistics_and_keeps_them():
    rng = np.random.default_rng(6)
    x = rand(rng, 3, 2, 3, 3)
    scale, bias, rm0, rv0 = bn_tensors(rng, 2)
    handle = autograd.BatchNormHandle(0.9, x)
    rm, rv = Tensor(data=rm0, requires_grad=False), Tensor(data=rv0, requires_grad=False)
    autograd.training = False
    y = autograd.batchnorm_2d(handle, leaf(x), leaf(scale), leaf(bias), rm, rv)
    c = (1, -1, 1, 1)
    expected = (x - rm0.reshape(c)) / np.sqrt(rv0.reshape(c) + 1e-5) * scale.reshape(c) \
        + bias.reshape(c)
    np.testing.assert_allclose(np.asarray(y.array), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(rm.array), rm0)
    np.testing.assert_array_equal(np.asarray(rv.array), rv0)


@pytest.mark.parametrize("shape", [(4, 2, 2, 3)])
def test_batchnorm_training_gradients(shape):
    rng = np.random.default_rng(7)
    x = rand(rng, *shape)
    scale, bias, rm0, rv0 = bn_tensors(rng, shape[1])
    handle = autograd.BatchNormHandle(0.9, x)

    def op(xt, st, bt):
        rm, rv = Tensor(data=rm0, requires_grad=False), Tensor(data=rv0, requires_grad=False)
        return autograd.batchnorm_2d(handle, xt, st, bt, rm, rv)

    check_fd(op, [x, scale, bias], eps=1e-2)


def test_batchnorm_channel_mismatch_raises_before_update():
    x = np.zeros((2, 3, 2, 2), np.float32)
    handle = autograd.BatchNormHandle(0.9, x)
    rm = Tensor(data=np.zeros(4, np.float32), requires_grad=False)
    rv = Tensor(data=np.ones(4, np.float32), requires_grad=False)
    with pytest.raises(ValueError, match=r"_BatchNorm2d.*\(4,\).*\(2, 3, 2, 2\)"):
        autograd.batchnorm_2d(handle, leaf(x), leaf(np.ones(4, np.float32)),
                              leaf(np.zeros(4, np.float32)), rm, rv)
    np.testing.assert_array_equal(np.asarray(rm.array), np.zeros(4))


def test_batchnorm_and_dropout_trace_under_jit():
    """Graph mode runs the eager code on tracers: running stats and the device key are rebound
    to traced values and come out of the compiled function as outputs."""
    dev = device.get_default_device()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
    handle = autograd.BatchNormHandle(0.5, x)

    def step(x_arr, rm_arr, rv_arr, key):
        saved_key, dev.key = dev.key, key
        try:
            rm, rv = Tensor(data=rm_arr, requires_grad=False), Tensor(data=rv_arr,
                                                                      requires_grad=False)
            xt = Tensor(data=x_arr)
            y = autograd.batchnorm_2d(handle, xt, Tensor(data=jnp.ones(3)),
                                      Tensor(data=jnp.zeros(3)), rm, rv)
            z = autograd.dropout(y, ratio=0.5)
            return z.array, rm.array, rv.array, dev.key
        finally:
            dev.key = saved_key

    key = jax.random.PRNGKey(3)
    z, rm, rv, new_key = jax.jit(step)(x, jnp.zeros(3), jnp.ones(3), key)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    n = x.size // 3
    np.testing.assert_allclose(np.asarray(rm), 0.5 * mean, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(rv), 0.5 + 0.5 * var * n / (n - 1), rtol=1e-6)
    normalised = (x - mean.reshape(1, 3, 1, 1)) / np.sqrt(var.reshape(1, 3, 1, 1) + 1e-5)
    z = np.asarray(z)
    kept = z != 0
    assert 0 < kept.sum() < z.size
    np.testing.assert_allclose(z[kept], 2 * normalised[kept], rtol=1e-4)
    assert not np.array_equal(np.asarray(new_key), np.asarray(key))  # the key was advanced


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------
def test_dropout_scales_kept_values_and_backward_reuses_mask():
    rng = np.random.default_rng(8)
    x = rand(rng, 20, 50) + 3.0  # no zeros in x, so y == 0 marks a dropped element
    ratio = 0.3
    y, (dx,) = run_with_grads(lambda t: autograd.dropout(t, ratio=ratio), [x],
                              np.full((20, 50), 2.0, np.float32))
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - ratio), rtol=1e-6)
    np.testing.assert_allclose(dx, np.where(kept, 2.0 / (1 - ratio), 0.0), rtol=1e-6)
    assert abs(1 - kept.mean() - ratio) < 0.05


def test_dropout_reproducible_with_device_seed():
    dev = device.get_default_device()
    x = leaf(np.ones((8, 16), np.float32) + 1.0)
    dev.SetRandSeed(11)
    first = np.asarray(autograd.dropout(x, ratio=0.5).array)
    second = np.asarray(autograd.dropout(x, ratio=0.5).array)
    dev.SetRandSeed(11)
    again = np.asarray(autograd.dropout(x, ratio=0.5).array)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)


def test_dropout_is_identity_in_eval():
    autograd.training = False
    dev = device.get_default_device()
    key_before = np.asarray(dev.key)
    x = np.arange(6, dtype=np.float32)
    y = autograd.dropout(leaf(x), ratio=0.9)
    np.testing.assert_array_equal(np.asarray(y.array), x)
    np.testing.assert_array_equal(np.asarray(dev.key), key_before)
    with pytest.raises(ValueError, match="Dropout"):
        autograd.Dropout(ratio=1.0)


# ---------------------------------------------------------------------------------------------
# embedding, cossim, global average pool
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [np.int32, np.float32])
def test_embedding_gather_and_scatter_add(index_dtype):
    rng = np.random.default_rng(9)
    idx = np.array([[0, 2, 2], [4, 0, 1]], index_dtype)
    w = rand(rng, 5, 3)
    dy = rand(rng, 2, 3, 3)
    y, (dx, dw) = run_with_grads(autograd.embedding, [idx, w], dy)
    np.testing.assert_array_equal(y, w[idx.astype(int)])
    expected = np.zeros_like(w)
    np.add.at(expected, idx.astype(int).reshape(-1), dy.reshape(-1, 3))
    np.testing.assert_allclose(dw, expected, rtol=1e-6)
    if dx is not None:  # float indices: the true gradient is zero
        np.testing.assert_array_equal(dx, 0)


def test_embedding_bad_weight_raises():
    with pytest.raises(ValueError, match=r"Embedding.*\(5,\).*\(2, 2\)"):
        autograd.embedding(leaf(np.zeros((2, 2), np.int32), False), leaf(np.ones(5, np.float32)))


def test_cossim_forward_and_grad():
    rng = np.random.default_rng(10)
    a, b = rand(rng, 4, 5), rand(rng, 4, 5)
    y, _ = check_fd(autograd.cossim, [a, b], eps=1e-3)
    expected = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    np.testing.assert_allclose(y, expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(autograd.CosSim.dot(a, b)), np.sum(a * b, 1), rtol=1e-5)
    with pytest.raises(ValueError, match=r"CosSim.*\(4, 5\).*\(3, 5\)"):
        autograd.cossim(leaf(a), leaf(b[:3]))


@pytest.mark.parametrize("fmt", ["channels_first", "channels_last"])
def test_globalaveragepool(fmt):
    rng = np.random.default_rng(11)
    x = rand(rng, 2, 3, 4, 5)
    dy_shape = (2, 3, 1, 1) if fmt == "channels_first" else (2, 1, 1, 5)
    dy = rand(rng, *dy_shape)
    y, (dx,) = run_with_grads(lambda t: autograd.globalaveragepool(t, fmt), [x], dy)
    axes = (2, 3) if fmt == "channels_first" else (1, 2)
    np.testing.assert_allclose(y, x.mean(axis=axes, keepdims=True), rtol=1e-5)
    count = np.prod([x.shape[a] for a in axes])
    np.testing.assert_allclose(dx, np.broadcast_to(dy / count, x.shape), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# RNN
# ---------------------------------------------------------------------------------------------
def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def np_cell(mode, W, R, bW, bR, x, h, c):
    """cuDNN's cells, gate by gate; W/R/bW/bR are lists of per-gate matrices/vectors."""
    def pre(g):
        return W[g] @ x + bW[g] + R[g] @ h + bR[g]
    if mode == 0:
        return np.maximum(pre(0), 0), c
    if mode == 1:
        return np.tanh(pre(0)), c
    if mode == 2:
        i, f, g, o = sigmoid(pre(0)), sigmoid(pre(1)), np.tanh(pre(2)), sigmoid(pre(3))
        c = f * c + i * g
        return o * np.tanh(c), c
    r, z = sigmoid(pre(0)), sigmoid(pre(1))
    n = np.tanh(W[2] @ x + bW[2] + r * (R[2] @ h + bR[2]))
    return (1 - z) * n + z * h, c


def np_rnn(mode, x, hx, cx, params, lengths, num_layers, dirs):
    """Sequence by sequence, step by step; y is zero past each sequence's length."""
    T, B, _ = x.shape
    H = hx.shape[2]
    layer_in = x.astype(np.float64)
    hy, cy = np.zeros_like(hx, np.float64), np.zeros_like(cx, np.float64)
    for layer in range(num_layers):
        out = np.zeros((T, B, H * dirs))
        for d in range(dirs):
            p = layer * dirs + d
            for b in range(B):
                h, c = hx[p, b].astype(np.float64), cx[p, b].astype(np.float64)
                steps = range(lengths[b]) if d == 0 else reversed(range(lengths[b]))
                for t in steps:
                    h, c = np_cell(mode, *params[p], layer_in[t, b], h, c)
                    out[t, b, d * H:(d + 1) * H] = h
                hy[p, b], cy[p, b] = h, c
        layer_in = out
    return layer_in, hy, cy


def make_rnn_weights(rng, handle):
    """Random per-gate parameters, and the same values packed through handle.weights_mapping."""
    gates = {0: 1, 1: 1, 2: 4, 3: 3}[handle.mode]
    flat = np.zeros(handle.weights_size, np.float32)
    params = {}
    for p in range(handle.num_layers * handle.directions):
        parts = {}
        for lin in range(2 * gates):
            for is_bias in (False, True):
                off, size = handle.weights_mapping[(lin, p, is_bias)]
                vals = rand(rng, size, scale=0.5)
                flat[off:off + size] = vals
                parts[(lin, is_bias)] = vals
        H = handle.hidden_size
        W = [parts[(g, False)].reshape(H, -1) for g in range(gates)]
        R = [parts[(gates + g, False)].reshape(H, H) for g in range(gates)]
        params[p] = (W, R, [parts[(g, True)] for g in range(gates)],
                     [parts[(gates + g, True)] for g in range(gates)])
    return flat, params


def rnn_case(rng, mode, num_layers, bidirectional, T=4, B=3, F=2, H=3):
    x = rand(rng, T, B, F)
    handle = autograd.CudnnRNNHandle(x, H, mode=mode, num_layers=num_layers,
                               bidirectional=bidirectional)
    flat, params = make_rnn_weights(rng, handle)
    hx, cx = rand(rng, *handle.state_shape(B)), rand(rng, *handle.state_shape(B))
    return handle, x, hx, cx, flat, params


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_rnn_bidirectional_masked_matches_stepwise_numpy(mode):
    autograd.training = False  # forward only: one kernel to compile
    rng = np.random.default_rng(12 + mode)
    handle, x, hx, cx, flat, params = rnn_case(rng, mode, 1, 1)
    lengths = np.array([4, 2, 3], np.int32)
    seq = Tensor(data=lengths, requires_grad=False)
    op = autograd._RNN(handle, return_sequences=True, use_mask=True, seq_lengths=seq)
    y = op(leaf(x), leaf(hx), leaf(cx), leaf(flat))[0]
    expected, _, _ = np_rnn(mode, x, hx, cx, params, lengths, 1, 2)
    np.testing.assert_allclose(np.asarray(y.array), expected, **matmul_tolerance(1e-4, 1e-5))


def test_rnn_two_layers_last_step_matches_numpy():
    autograd.training = False
    rng = np.random.default_rng(16)
    handle, x, hx, cx, flat, params = rnn_case(rng, 2, 2, 0)
    last = autograd._RNN(handle)(leaf(x), leaf(hx), leaf(cx), leaf(flat))[0]
    expected, _, _ = np_rnn(2, x, hx, cx, params, [x.shape[0]] * x.shape[1], 2, 1)
    assert last.shape == expected.shape[1:]
    np.testing.assert_allclose(np.asarray(last.array), expected[-1], **matmul_tolerance(1e-4, 1e-5))


@pytest.mark.parametrize("mode", [2, 3])
def test_rnn_gradients(mode):
    rng = np.random.default_rng(30 + mode)
    handle, x, hx, cx, flat, _ = rnn_case(rng, mode, 1, 1, T=3, B=2, F=2, H=2)
    seq = Tensor(data=np.array([3, 2], np.int32), requires_grad=False)

    def op(*ts):
        return autograd._RNN(handle, return_sequences=True, use_mask=True, seq_lengths=seq)(*ts)[0]

    check_fd(op, [x, hx, cx, flat], eps=1e-2, rtol=3e-2)


def test_rnn_handle_weight_size_and_bad_input():
    x = np.zeros((4, 2, 3), np.float32)
    lstm = autograd.CudnnRNNHandle(x, 5, mode=2)
    assert lstm.weights_size == 4 * (5 * 3 + 5 * 5 + 2 * 5)
    gru2 = autograd.CudnnRNNHandle(x, 5, mode=3, num_layers=2, bidirectional=1)
    layer0, layer1 = 3 * (5 * 3 + 5 * 5 + 10), 3 * (5 * 10 + 5 * 5 + 10)
    assert gru2.weights_size == 2 * (layer0 + layer1)
    w = leaf(np.zeros(lstm.weights_size, np.float32))
    h = leaf(np.zeros((1, 2, 5), np.float32))
    with pytest.raises(ValueError, match=r"_RNN.*\(4, 2, 4\)"):
        autograd._RNN(lstm)(leaf(np.zeros((4, 2, 4), np.float32)), h, h, w)
    with pytest.raises(ValueError, match=r"_RNN.*hx.*\(1, 3, 5\)"):
        autograd._RNN(lstm)(leaf(x), leaf(np.zeros((1, 3, 5), np.float32)), h, w)
