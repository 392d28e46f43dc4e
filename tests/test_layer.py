"""singa_jax.layer: every layer's forward against an independent NumPy/jnp reference with the same
parameters (set through set_params), every parameter's gradient against jax.grad of that
reference, batch-norm statistics, padding modes and groups, recurrent layers against a
step-by-step recurrence, and bad inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, layer, tensor
from singa_jax.precision import float32_matmul_precision_scope
from singa_jax.tensor import Tensor


pytestmark = pytest.mark.usefixtures("training_mode")  # autograd.training = True (conftest)


def T(a, **kw) -> Tensor:
    return Tensor(data=np.asarray(a, np.float32), **kw)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def set_random_params(lay, rng, scale=0.5):
    """Give every parameter random values through set_params; return them by name."""
    values = {n: randn(rng, *p.shape) * scale for n, p in lay.get_params().items()}
    lay.set_params(values)
    return values


def check_forward_and_grads(lay, inputs, ref, rng, atol=1e-4):
    """Forward of ``lay(*inputs)`` equals ``ref(params, *inputs)`` (jnp arrays) and the gradient of
    ``sum(y * dy)`` w.r.t. every parameter equals jax.grad of the reference."""
    y = lay(*inputs)
    params = {n: jnp.asarray(p.array) for n, p in lay.get_params().items()}
    arrays = [jnp.asarray(x.array) for x in inputs]
    dy = randn(rng, *y.shape)
    with float32_matmul_precision_scope("float32"):  # exact references, on any backend
        expected = jax.jit(ref)(params, *arrays)  # jit: one compile instead of one per jnp op
        ref_grads = jax.jit(jax.grad(lambda p: jnp.sum(ref(p, *arrays) * dy)))(params)
    np.testing.assert_allclose(np.asarray(y.array), np.asarray(expected),
                               **matmul_tolerance(1e-4, atol))
    grads = {p.name: np.asarray(g.array) for p, g in autograd.backward(y, T(dy))}
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        np.testing.assert_allclose(grads[name], np.asarray(ref_grads[name]),
                                   **matmul_tolerance(1e-3, atol), err_msg=name)
    return y


# --- references ---------------------------------------------------------------------------------
def conv_ref(x, W, b, stride, pads, group, dilation=1):
    """Direct convolution: pad, then sum over kernel offsets of strided slices (per group)."""
    (top, bottom), (left, right) = pads
    x = jnp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, w = x.shape
    o, cg, kh, kw = W.shape
    d = dilation
    oh, ow = (h - d * (kh - 1) - 1) // stride[0] + 1, (w - d * (kw - 1) - 1) // stride[1] + 1
    outs = []
    for g in range(group):
        xg, Wg = x[:, g * cg:(g + 1) * cg], W[g * (o // group):(g + 1) * (o // group)]
        acc = 0.0
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, d * i:d * i + stride[0] * (oh - 1) + 1:stride[0],
                           d * j:d * j + stride[1] * (ow - 1) + 1:stride[1]]
                acc = acc + jnp.einsum("nchw,oc->nohw", patch, Wg[:, :, i, j])
        outs.append(acc)
    y = jnp.concatenate(outs, axis=1)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def pool_ref(x, k, s, pads, is_max):
    """Pooling over explicit windows; average divides by the number of real (unpadded) inputs."""
    (top, bottom), (left, right) = pads
    n, c, h, w = x.shape
    oh, ow = (h + top + bottom - k[0]) // s[0] + 1, (w + left + right - k[1]) // s[1] + 1
    y = np.zeros((n, c, oh, ow), np.float32)
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s[0] - top, j * s[1] - left
            win = x[:, :, max(r0, 0):min(r0 + k[0], h), max(c0, 0):min(c0 + k[1], w)]
            y[:, :, i, j] = win.max(axis=(2, 3)) if is_max else win.mean(axis=(2, 3))
    return y


# --- dense layers -------------------------------------------------------------------------------
@pytest.mark.parametrize("ctor", [lambda: layer.Linear(3), lambda: layer.Linear(4, 3),
                                  lambda: layer.Linear(4, 3, False)])
def test_linear(ctor, rng):
    lin = ctor()
    x = T(randn(rng, 2, 4))
    lin(x)  # lazy initialisation from the input
    assert lin.W.shape == (4, 3) and lin.W.requires_grad and lin.W.stores_grad
    set_random_params(lin, rng)

    def ref(p, x):
        y = x @ p["W"]
        return y + p["b"] if "b" in p else y

    check_forward_and_grads(lin, [x], ref, rng)


def test_linear_init_statistics():
    lin = layer.Linear(300)
    lin.initialize(T(np.zeros((1, 200))))
    w = np.asarray(lin.W.array)
    assert w.std() == pytest.approx(np.sqrt(2.0 / 500), rel=0.05)
    np.testing.assert_array_equal(np.asarray(lin.b.array), 0)


@pytest.mark.parametrize("transA,transB", [(False, True), (True, False)])
def test_gemm(transA, transB, rng):
    g = layer.Gemm(3, alpha=0.5, beta=2.0, transA=transA, transB=transB)
    x = T(randn(rng, 4, 2) if transA else randn(rng, 2, 4))
    g(x)
    assert g.W.shape == ((3, 4) if transB else (4, 3)) and g.b.shape == (1, 3)
    set_random_params(g, rng)

    def ref(p, x):
        a = x.T if transA else x
        w = p["W"].T if transB else p["W"]
        return 0.5 * a @ w + 2.0 * p["b"]

    check_forward_and_grads(g, [x], ref, rng)


def test_embedding(rng):
    emb = layer.Embedding(6, 3)
    idx = Tensor(data=np.array([[0, 2], [5, 2]], np.int32), requires_grad=False)
    emb(idx)
    assert emb.W.shape == (6, 3)
    set_random_params(emb, rng)
    check_forward_and_grads(emb, [idx], lambda p, i: p["W"][i], rng)
    table = randn(rng, 6, 3)
    frozen = layer.Embedding(6, 3, initializer="uniform")
    frozen.from_pretrained(table, freeze=True)
    np.testing.assert_array_equal(np.asarray(frozen(idx).array), table[np.array([[0, 2], [5, 2]])])
    assert not frozen.W.requires_grad and not frozen.W.stores_grad
    uni = layer.Embedding(50, 40, initializer="uniform")
    uni.initialize(idx)
    w = np.asarray(uni.W.array)
    assert w.min() >= -1 and w.max() <= 1 and w.std() == pytest.approx(1 / np.sqrt(3), rel=0.1)


# --- convolution --------------------------------------------------------------------------------
CONV_CASES = [
    # kwargs, input HxW, expected total pads ((top, bottom), (left, right))
    (dict(padding=1), (5, 5), ((1, 1), (1, 1))),
    (dict(padding=(1, 0, 2, 1), stride=2), (5, 6), ((1, 0), (2, 1))),
    (dict(pad_mode="SAME_UPPER", stride=2), (6, 5), ((0, 1), (1, 1))),
    (dict(pad_mode="SAME_LOWER", stride=2), (6, 5), ((1, 0), (1, 1))),
    (dict(padding=1, group=2, bias=False), (5, 5), ((1, 1), (1, 1))),
    (dict(padding=2, dilation=2), (5, 5), ((2, 2), (2, 2))),  # SINGA rejects dilation != 1
]


@pytest.mark.parametrize("kwargs,hw,pads", CONV_CASES)
def test_conv2d(kwargs, hw, pads, rng):
    conv = layer.Conv2d(4, 3, **kwargs)
    x = T(randn(rng, 2, 4, *hw))
    conv(x)
    group = kwargs.get("group", 1)
    assert conv.W.shape == (4, 4 // group, 3, 3)
    assert (conv.b is None) == (not kwargs.get("bias", True))
    set_random_params(conv, rng)
    stride = (kwargs.get("stride", 1),) * 2
    dilation = kwargs.get("dilation", 1)
    y = check_forward_and_grads(conv, [x], lambda p, x: conv_ref(
        x, p["W"], p.get("b"), stride, pads, group, dilation), rng)
    if "pad_mode" in kwargs:  # SAME: out = ceil(in / stride)
        assert y.shape[2:] == tuple(-(-n // 2) for n in hw)


def test_separable_conv2d(rng):
    sep = layer.SeparableConv2d(6, 3, padding=1)
    x = T(randn(rng, 2, 4, 5, 5))
    sep(x)
    assert set(sep.get_params()) == {"depthwise_conv.W", "point_conv.W"}
    assert sep.depthwise_conv.W.shape == (4, 1, 3, 3) and sep.point_conv.W.shape == (6, 4, 1, 1)
    set_random_params(sep, rng)

    def ref(p, x):
        y = conv_ref(x, p["depthwise_conv.W"], None, (1, 1), ((1, 1), (1, 1)), 4)
        return conv_ref(y, p["point_conv.W"], None, (1, 1), ((0, 0), (0, 0)), 1)

    check_forward_and_grads(sep, [x], ref, rng)


# --- batch normalisation ------------------------------------------------------------------------
def test_batchnorm_train_eval_and_running_stats(rng):
    bn = layer.BatchNorm2d(momentum=0.9)
    x = T(randn(rng, 4, 3, 2, 2) * 2 + 1)
    autograd.training = False  # initialise without touching the running statistics
    bn(x)
    autograd.training = True
    states = bn.get_states()
    assert set(states) == {"scale", "bias", "running_mean", "running_var"}
    assert not bn.running_mean.requires_grad and not bn.running_mean.stores_grad
    np.testing.assert_array_equal(np.asarray(bn.running_var.array), 1)
    set_random_params(bn, rng)
    bn.set_states({"running_mean": np.zeros(3), "running_var": np.ones(3)})
    xa = np.asarray(x.array)
    mean, var = xa.mean(axis=(0, 2, 3)), xa.var(axis=(0, 2, 3))

    def ref(p, x):
        m, v = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        xn = (x - m.reshape(1, -1, 1, 1)) / jnp.sqrt(v.reshape(1, -1, 1, 1) + 1e-5)
        return xn * p["scale"].reshape(1, -1, 1, 1) + p["bias"].reshape(1, -1, 1, 1)

    check_forward_and_grads(bn, [x], ref, rng, atol=2e-4)
    n = 4 * 2 * 2  # SINGA: running = (1 - m) * running + m * batch, unbiased variance
    np.testing.assert_allclose(np.asarray(bn.running_mean.array), 0.9 * mean, atol=1e-5)
    np.testing.assert_allclose(np.asarray(bn.running_var.array), 0.1 + 0.9 * var * n / (n - 1),
                               atol=1e-5)
    autograd.training = False
    rm, rv = np.asarray(bn.running_mean.array), np.asarray(bn.running_var.array)
    y = np.asarray(bn(x).array)
    scale, bias = np.asarray(bn.scale.array), np.asarray(bn.bias.array)
    expect = (xa - rm.reshape(1, -1, 1, 1)) / np.sqrt(rv.reshape(1, -1, 1, 1) + 1e-5)
    np.testing.assert_allclose(y, expect * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1),
                               atol=1e-5)
    np.testing.assert_array_equal(np.asarray(bn.running_mean.array), rm)  # eval: unchanged


# --- pooling ------------------------------------------------------------------------------------
POOL_CASES = [
    (lambda: layer.MaxPool2d(2), (2, 2), (2, 2), ((0, 0), (0, 0)), True),
    (lambda: layer.AvgPool2d(3, 2, 1), (3, 3), (2, 2), ((1, 1), (1, 1)), False),
    (lambda: layer.MaxPool2d(3, 2, 1), (3, 3), (2, 2), ((1, 1), (1, 1)), True),
    (lambda: layer.Pooling2d(3, 1, 1, is_max=False), (3, 3), (1, 1), ((1, 1), (1, 1)), False),
    (lambda: layer.MaxPool1d(2), (1, 2), (1, 2), ((0, 0), (0, 0)), True),
    (lambda: layer.AvgPool1d(3, 1, 1), (1, 3), (1, 1), ((0, 0), (1, 1)), False),
]


@pytest.mark.parametrize("ctor,k,s,pads,is_max", POOL_CASES)
def test_pooling(ctor, k, s, pads, is_max, rng):
    pool = ctor()
    x = randn(rng, 2, 3, 6, 6)
    y = pool(T(x))
    np.testing.assert_allclose(np.asarray(y.array), pool_ref(x, k, s, pads, is_max), atol=1e-5)


def test_valid_pad_mode(rng):
    conv = layer.Conv2d(2, 3, padding=1, pad_mode="VALID")  # VALID ignores the padding
    assert conv(T(randn(rng, 1, 2, 5, 5))).shape == (1, 2, 3, 3)


def test_pooling_same_padding(rng):
    pool = layer.MaxPool2d(2, 1, pad_mode="SAME_UPPER")
    x = randn(rng, 1, 2, 5, 5)
    y = np.asarray(pool(T(x)).array)
    assert y.shape == (1, 2, 5, 5)
    # the extra row/column goes at the end: windows at the last row/column see only real data
    np.testing.assert_allclose(y[:, :, :4, :4], pool_ref(x, (2, 2), (1, 1), ((0, 0), (0, 0)),
                                                         True), atol=1e-6)
    np.testing.assert_allclose(y[:, :, 4, 4], x[:, :, 4, 4], atol=1e-6)


# --- parameter-free layers ----------------------------------------------------------------------
def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_stateless_layers(rng):
    a, b = randn(rng, 3, 4), randn(rng, 3, 4)
    probs = _softmax(b)
    onehot = np.eye(4, dtype=np.float32)[[0, 3, 1]]
    cases = [
        (layer.ReLU(), [a], np.maximum(a, 0)),
        (layer.Sigmoid(), [a], 1 / (1 + np.exp(-a))),
        (layer.Add(), [a, b], a + b),
        (layer.SoftMax(), [a], _softmax(a)),
        (layer.Flatten(), [a.reshape(3, 2, 2)], a),
        (layer.SoftMaxCrossEntropy(), [a, onehot],
         -np.sum(onehot * np.log(_softmax(a))) / 3),
        (layer.MeanSquareError(), [a, b], np.mean((a - b) ** 2)),
        (layer.CrossEntropy(), [probs, onehot], -np.sum(onehot * np.log(probs)) / 3),
        (layer.BinaryCrossEntropy(), [1 / (1 + np.exp(-a)), (b > 0).astype(np.float32)], None),
    ]
    for lay, inputs, expected in cases:
        y = np.asarray(lay(*[T(i) for i in inputs]).array)
        if expected is None:  # BCE: -(t log p + (1 - t) log(1 - p)) summed over rows / batch
            p, t = inputs
            expected = -np.sum(t * np.log(p) + (1 - t) * np.log(1 - p)) / 3
        np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-4, err_msg=type(lay).__name__)
    cat = layer.Cat(axis=1)
    np.testing.assert_array_equal(np.asarray(cat([T(a), T(b)]).array), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(np.asarray(layer.Reshape()(T(a), (4, 3)).array), a.reshape(4, 3))
    assert layer.Flatten(axis=2)(T(np.zeros((2, 3, 4, 5)))).shape == (6, 20)
    with pytest.raises(TypeError, match="forward takes inputs"):
        layer.Add()(T(a))


def test_dropout(rng):
    drop = layer.Dropout(ratio=0.25)
    assert drop.ratio == 0.25
    x = np.ones((40, 50), np.float32)
    y = np.asarray(drop(T(x)).array)
    kept = y != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    autograd.training = False
    np.testing.assert_array_equal(np.asarray(drop(T(x)).array), x)


# --- recurrent ----------------------------------------------------------------------------------
def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_against_recurrence(nonlinearity, rng):
    rnn = layer.RNN(3, 4, nonlinearity=nonlinearity)
    xs = [T(randn(rng, 2, 3)) for _ in range(3)]
    h0 = T(randn(rng, 2, 4))
    rnn(xs, h0)
    assert set(rnn.get_params()) == {"Wx", "Wh", "b"}
    p = set_random_params(rnn, rng)
    out, h = rnn(xs, h0)
    act = np.tanh if nonlinearity == "tanh" else (lambda v: np.maximum(v, 0))
    hh = np.asarray(h0.array)
    for t, x in enumerate(xs):
        hh = act(np.asarray(x.array) @ p["Wx"] + hh @ p["Wh"] + p["b"])
        np.testing.assert_allclose(np.asarray(out[t].array), hh, **matmul_tolerance(1e-7, 1e-5))
        step = rnn.step_forward(x, h0 if t == 0 else out[t - 1], rnn.Wx, rnn.Wh, rnn.b)
        np.testing.assert_allclose(np.asarray(step.array), hh, **matmul_tolerance(1e-7, 1e-5))
    assert h is out[-1]

    def ref(params, *arrays):
        hcur, outs = arrays[-1], []
        jact = jnp.tanh if nonlinearity == "tanh" else jax.nn.relu
        for x in arrays[:-1]:
            hcur = jact(x @ params["Wx"] + hcur @ params["Wh"] + params["b"])
            outs.append(hcur)
        return jnp.stack(outs).sum(0)

    out, _ = rnn(xs, h0)
    total = autograd.add(autograd.add(out[0], out[1]), out[2])
    # the gradient through every time step reaches every weight
    dy = randn(rng, 2, 4)
    grads = {q.name: np.asarray(g.array) for q, g in autograd.backward(total, T(dy))}
    arrays = [jnp.asarray(x.array) for x in xs] + [jnp.asarray(h0.array)]
    params = {k: jnp.asarray(v) for k, v in p.items()}
    expected = jax.jit(jax.grad(lambda q: jnp.sum(ref(q, *arrays) * dy)))(params)
    for k in expected:
        np.testing.assert_allclose(grads[k], np.asarray(expected[k]), **matmul_tolerance(1e-7, 1e-4), err_msg=k)


def test_lstm_against_recurrence(rng):
    lstm = layer.LSTM(3, 4)
    xs = [T(randn(rng, 2, 3)) for _ in range(3)]
    h0, c0 = T(randn(rng, 2, 4)), T(randn(rng, 2, 4))
    lstm(xs, (h0, c0))
    assert len(lstm.get_params()) == 16
    assert np.asarray(lstm.Wx_i.array).std() < 0.05  # N(0, 0.01) initialisation
    p = set_random_params(lstm, rng)
    out, h, c = lstm(xs, (h0, c0))
    hh, cc = np.asarray(h0.array), np.asarray(c0.array)

    def gate(g, x, hh):
        return x @ p[f"Wx_{g}"] + p[f"Bx_{g}"] + hh @ p[f"Wh_{g}"] + p[f"Bh_{g}"]

    for t, x in enumerate(xs):
        xa = np.asarray(x.array)
        i, f, o = (_sigmoid(gate(g, xa, hh)) for g in "ifo")
        cc = f * cc + i * np.tanh(gate("g", xa, hh))
        hh = o * np.tanh(cc)
        np.testing.assert_allclose(np.asarray(out[t].array), hh, **matmul_tolerance(1e-7, 1e-5))
    np.testing.assert_allclose(np.asarray(c.array), cc, **matmul_tolerance(1e-7, 1e-5))
    assert h is out[-1]
    h1, c1 = lstm.step_forward(xs[0], h0, c0)
    np.testing.assert_allclose(np.asarray(h1.array), np.asarray(out[0].array), **matmul_tolerance(1e-7, 1e-5))

    def ref(params, *arrays):
        hcur, ccur = arrays[-2], arrays[-1]
        for x in arrays[:-2]:
            g = {k: x @ params[f"Wx_{k}"] + params[f"Bx_{k}"] + hcur @ params[f"Wh_{k}"]
                 + params[f"Bh_{k}"] for k in "ifog"}
            ccur = jax.nn.sigmoid(g["f"]) * ccur + jax.nn.sigmoid(g["i"]) * jnp.tanh(g["g"])
            hcur = jax.nn.sigmoid(g["o"]) * jnp.tanh(ccur)
        return hcur + 2 * ccur

    out, h, c = lstm(xs, (h0, c0))
    loss = autograd.add(h, autograd.add(c, c))
    dy = randn(rng, 2, 4)
    grads = {q.name: np.asarray(g.array) for q, g in autograd.backward(loss, T(dy))}
    arrays = [jnp.asarray(x.array) for x in xs] + [jnp.asarray(h0.array), jnp.asarray(c0.array)]
    params = {k: jnp.asarray(v) for k, v in p.items()}
    expected = jax.jit(jax.grad(lambda q: jnp.sum(ref(q, *arrays) * dy)))(params)
    for k in expected:
        np.testing.assert_allclose(grads[k], np.asarray(expected[k]), **matmul_tolerance(1e-7, 1e-4), err_msg=k)


def test_cudnn_rnn_lstm_against_recurrence(rng):
    rnn = layer.CudnnRNN(4, rnn_mode="lstm", batch_first=True)
    x = T(randn(rng, 2, 3, 5))  # (batch, seq, feature)
    y = rnn(x)
    assert y.shape == (2, 3, 4) and rnn.W.shape == (rnn.handle.weights_size,)
    assert np.abs(np.asarray(rnn.W.array)).max() <= 0.5  # U(-1/sqrt(4), 1/sqrt(4))
    w = randn(rng, rnn.handle.weights_size) * 0.5
    rnn.set_params({rnn.W.name: w})
    mapping = rnn.handle.weights_mapping

    def part(lin, bias, shape):
        off, size = mapping[(lin, 0, bias)]
        return w[off:off + size].reshape(shape)

    Wi = [part(g, False, (4, 5)) for g in range(4)]  # cuDNN gate order i, f, g, o
    Rh = [part(4 + g, False, (4, 4)) for g in range(4)]
    bW = [part(g, True, (4,)) for g in range(4)]
    bR = [part(4 + g, True, (4,)) for g in range(4)]
    xa = np.asarray(x.array)
    hh, cc, outs = np.zeros((2, 4)), np.zeros((2, 4)), []
    for t in range(3):
        z = [xa[:, t] @ Wi[g].T + bW[g] + hh @ Rh[g].T + bR[g] for g in range(4)]
        cc = _sigmoid(z[1]) * cc + _sigmoid(z[0]) * np.tanh(z[2])
        hh = _sigmoid(z[3]) * np.tanh(cc)
        outs.append(hh)
    np.testing.assert_allclose(np.asarray(rnn(x).array), np.stack(outs, 1), **matmul_tolerance(1e-7, 1e-5))
    last = layer.CudnnRNN(4, rnn_mode="lstm", bidirectional=True, return_sequences=False,
                          batch_first=False)
    assert last(T(randn(rng, 3, 2, 5))).shape == (2, 8)
    masked = layer.CudnnRNN(4, rnn_mode="tanh", use_mask=True)
    lengths = Tensor(data=np.array([3, 1], np.int32), requires_grad=False)
    ym = np.asarray(masked(x, seq_lengths=lengths).array)
    np.testing.assert_array_equal(ym[1, 1:], 0)  # sequence 1 ends after one step
    with pytest.raises(TypeError, match="seq_lengths"):
        masked(x)
    with pytest.raises(ValueError, match="rnn_mode"):
        layer.CudnnRNN(4, rnn_mode="bogus")


# --- the Layer base: lazy init, names, params/states ------------------------------------------
class Block(layer.Layer):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(3, 3, padding=1, bias=False)
        self.bn = layer.BatchNorm2d()

    def forward(self, x):
        return autograd.relu(self.bn(self.conv(x)))


class Net(layer.Layer):
    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(3, 3, padding=1)
        self.block1 = Block()
        self.flat = layer.Flatten()
        self.fc = layer.Linear(2)

    def forward(self, x):
        return self.fc(self.flat(self.block1(self.conv1(x))))


def test_structure_version_propagates_to_every_parent_and_only_to_them(rng):
    net, other = Net(), Net()
    shared = layer.Linear(2)
    net.extra = shared
    other.extra = shared  # a layer registered in two parents bumps both

    def versions():
        return {"net": net.structure_version, "block": net.block1.structure_version,
                "bn": net.block1.bn.structure_version, "other": other.structure_version,
                "other_bn": other.block1.bn.structure_version}

    before = versions()
    net.block1.bn.momentum = 0.5  # deep in net's tree: bn, block1 and net change
    after = versions()
    assert {k for k in before if after[k] != before[k]} == {"net", "block", "bn"}
    before = after
    shared.bias = False
    after = versions()
    assert {k for k in before if after[k] != before[k]} == {"net", "other"}
    # lazy initialisation (new parameters, the _initialized flag) is a change of structure too
    before = after
    net(T(randn(rng, 2, 3, 4, 4)))
    assert net.structure_version != before["net"] and other.structure_version == before["other"]
    # a replaced or deleted sublayer no longer reports to its old parent
    old_fc = net.fc
    net.fc = layer.Linear(2)
    before = net.structure_version
    old_fc.bias = False
    assert net.structure_version == before
    old_block = net.block1
    del net.block1
    before = net.structure_version
    old_block.bn.momentum = 0.1
    assert net.structure_version == before


def test_set_states_round_trip_and_validation(rng):
    net = Net()
    x = T(randn(rng, 2, 3, 4, 4))
    net(x)
    states = {k: np.asarray(v.array) for k, v in net.get_states().items()}
    new = {k: randn(rng, *v.shape) for k, v in states.items()}
    net.set_states(new)
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(np.asarray(v.array), new[k])
    other = Net()
    other(x)
    other.set_states(net.get_states())  # Tensors are accepted too
    autograd.training = False
    np.testing.assert_allclose(np.asarray(other(x).array), np.asarray(net(x).array), atol=1e-6)
    before = {k: np.asarray(v.array) for k, v in net.get_states().items()}
    bad_shape = dict(new, **{"fc.W": np.zeros((2, 48))})
    with pytest.raises(ValueError, match=r"'fc.W' expects shape \(48, 2\), got \(2, 48\)"):
        net.set_states(bad_shape)
    with pytest.raises(ValueError, match="unknown name.*'fc.V'"):
        net.set_params({"conv1.W": new["conv1.W"] * 0, "fc.V": np.zeros(2)})
    with pytest.raises(ValueError, match="unknown name"):  # states are not parameters
        net.set_params({"block1.bn.running_mean": np.zeros(3)})
    with pytest.raises(TypeError, match="dict"):
        net.set_params([1, 2])
    for k, v in net.get_states().items():  # nothing changed by the failed calls
        np.testing.assert_array_equal(np.asarray(v.array), before[k])


# --- bad inputs ---------------------------------------------------------------------------------
def test_bad_input_shapes_name_layer_and_shapes():
    class Net(layer.Layer):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(3)
            self.conv = layer.Conv2d(2, 3)
            self.bn = layer.BatchNorm2d()

    net = Net()
    net.fc(T(np.zeros((2, 4))))
    with pytest.raises(ValueError, match=r"Linear 'fc'.*4.*\(2, 5\)"):
        net.fc(T(np.zeros((2, 5))))
    net.conv(T(np.zeros((1, 3, 4, 4))))
    with pytest.raises(ValueError, match=r"Conv2d 'conv'.*channels.*3.*\(1, 2, 4, 4\)"):
        net.conv(T(np.zeros((1, 2, 4, 4))))
    net.bn(T(np.zeros((2, 3, 2, 2))))
    with pytest.raises(ValueError, match=r"BatchNorm2d 'bn'.*3.*\(2, 4, 2, 2\)"):
        net.bn(T(np.zeros((2, 4, 2, 2))))
    with pytest.raises(ValueError, match=r"Linear.*in_features.*4.*\(2, 5\)"):
        layer.Linear(4, 3)(T(np.zeros((2, 5))))
    rnn = layer.RNN(3, 4)
    with pytest.raises(ValueError, match=r"RNN.*\(2, 3\).*\(2, 5\)"):
        rnn([T(np.zeros((2, 5)))], T(np.zeros((2, 4))))
    gemm = layer.Gemm(2)
    gemm(T(np.zeros((2, 4))))
    with pytest.raises(ValueError, match=r"Gemm.*4.*\(2, 3\)"):
        gemm(T(np.zeros((2, 3))))
    cud = layer.CudnnRNN(2, rnn_mode="relu")
    cud(T(np.zeros((1, 2, 3))))
    with pytest.raises(ValueError, match=r"CudnnRNN.*3.*\(1, 2, 4\)"):
        cud(T(np.zeros((1, 2, 4))))
    with pytest.raises(ValueError, match="initial state"):
        rnn([T(np.zeros((2, 3)))], T(np.zeros((3, 4))))  # (1, 4) or (2, 1) would broadcast
    with pytest.raises(TypeError, match="list of Tensors"):
        rnn(T(np.zeros((2, 3))), T(np.zeros((2, 4))))
    with pytest.raises(TypeError, match="padding"):
        layer.Conv2d(3, 3, padding=(1, 2, 3))
    with pytest.raises(ValueError, match="group"):
        layer.Conv2d(3, 3, group=2)
    with pytest.raises(ValueError, match="in_channels"):
        layer.Conv2d(4, 3, group=2)(T(np.zeros((1, 3, 4, 4))))
    with pytest.raises(ValueError, match="pad_mode"):
        layer.MaxPool2d(2, pad_mode="SAME")
    with pytest.raises(TypeError, match="kernel_size"):
        layer.Conv2d(3, "3")
    with pytest.raises(TypeError, match="not understood"):
        layer.Conv2d(3, 3, cudnn_algo=1)
    with pytest.raises(ValueError, match="momentum"):
        layer.BatchNorm2d(momentum=2)


def test_rnn_initial_state_broadcasts_as_in_singa(rng):
    """SINGA's ops broadcast the initial state: (batch, 1) and (1, hidden) states act like their
    broadcast to (batch, hidden), in values and gradients."""
    xs = [T(rng.normal(size=(2, 3)).astype(np.float32)) for _ in range(3)]
    lstm = layer.LSTM(3, 2)
    h, c = rng.normal(size=(2, 1)).astype(np.float32), rng.normal(size=(1, 2)).astype(np.float32)
    autograd.training = True
    small = lstm(xs, (T(h), T(c)))
    full = lstm(xs, (T(np.broadcast_to(h, (2, 2)).copy()), T(np.broadcast_to(c, (2, 2)).copy())))
    for a, b in zip(small[0] + [small[2]], full[0] + [full[2]]):
        np.testing.assert_allclose(tensor.to_numpy(a), tensor.to_numpy(b), rtol=1e-6)
    grads = [dict((p.name, tensor.to_numpy(g)) for p, g in autograd.backward(
        autograd.reduce_sum(out[1]))) for out in (small, full)]
    for name in grads[1]:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)
