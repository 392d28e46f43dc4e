"""Mixed precision: ``autograd.autocast`` and ``Model.compile(..., autocast=...)``.

Forward values are checked against the same computation written in jax.numpy with the policy's
casts, and against float32 NumPy within bfloat16's precision (8 bits of mantissa: relative
error ~4e-3 per rounding); gradients against ``jax.grad`` of the cast function; training against
float32 training's accuracy on scikit-learn's digits (CPU, float32 matmul precision).
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_digits

from singa_jax import autograd, device, layer, model, opt, tensor

from backend_precision import matmul_tolerance

BF16 = jnp.dtype(jnp.bfloat16)
F16 = jnp.dtype(jnp.float16)


def _param(a):
    t = tensor.from_numpy(np.asarray(a, np.float32))
    t.requires_grad = t.stores_grad = True
    return t


@pytest.fixture(autouse=True)
def training_mode():
    prev = autograd.training
    autograd.training = True
    yield
    autograd.training = prev


# --- the operator policy ----------------------------------------------------------------------
def test_products_compute_in_bfloat16_and_gradients_reach_float32_params():
    rng = np.random.RandomState(0)
    x, w, b = rng.randn(6, 5), rng.randn(5, 4), rng.randn(4)
    tx, tw, tb = _param(x), _param(w), _param(b)
    labels = np.array([0, 1, 2, 3, 0, 1], np.int32)
    with autograd.autocast("bfloat16"):
        y = autograd.add_bias(autograd.matmul(tx, tw), tb, axis=0)
        loss = autograd.softmax_cross_entropy(y, tensor.from_numpy(labels))
    assert y.dtype == BF16 and loss.dtype == jnp.float32

    def reference(x, w, b):  # the policy written out: products in bfloat16, the loss in float32
        y = (x.astype(BF16) @ w.astype(BF16)) + b.astype(BF16)
        logp = jax.nn.log_softmax(y.astype(jnp.float32))
        return -jnp.mean(logp[jnp.arange(6), labels]), y

    (ref_loss, ref_y), ref_grads = jax.value_and_grad(reference, argnums=(0, 1, 2), has_aux=True)(
        jnp.float32(x), jnp.float32(w), jnp.float32(b))
    np.testing.assert_array_equal(np.float32(tensor.to_numpy(y)), np.float32(ref_y))
    # bfloat16 compute is within its precision of float32 NumPy
    np.testing.assert_allclose(np.float32(tensor.to_numpy(y)), x @ w + b, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(tensor.to_numpy(loss)[0], ref_loss, rtol=1e-6)
    grads = {id(p): g for p, g in autograd.backward(loss)}
    for t, ref in zip((tx, tw, tb), ref_grads):
        g = grads[id(t)]
        assert g.dtype == jnp.float32  # the cast's pullback: a float32 input's own dtype
        # bfloat16 products (8-bit mantissa: 2**-8 relative per rounding); XLA may keep a
        # product's float32 result where a bfloat16 round trip follows (excess precision),
        # so not bit for bit
        np.testing.assert_allclose(tensor.to_numpy(g), ref, rtol=8e-3, atol=2e-3)


def test_sensitive_ops_run_in_float32_and_batchnorm_returns_the_input_dtype():
    rng = np.random.RandomState(1)
    x = rng.randn(4, 3, 5, 5).astype(np.float32)
    th = tensor.from_numpy(x).as_type(tensor.float16)
    with autograd.autocast("float16"):
        s = autograd.softmax(autograd.reshape(th, (4, 75)))
        m = autograd.reduce_mean(th, axes=[1, 2, 3], keepdims=0)
        bn = layer.BatchNorm2d()
        y = bn(th)
    assert s.dtype == jnp.float32 and m.dtype == jnp.float32
    h = x.astype(np.float16).astype(np.float32).reshape(4, 75)
    e = np.exp(h - h.max(1, keepdims=True))
    np.testing.assert_allclose(tensor.to_numpy(s), e / e.sum(1, keepdims=True), rtol=1e-5)
    assert y.dtype == F16
    assert bn.scale.dtype == bn.running_mean.dtype == bn.running_var.dtype == jnp.float32
    h4 = x.astype(np.float16).astype(np.float32)
    mu, var = h4.mean((0, 2, 3), keepdims=True), h4.var((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(np.float32(tensor.to_numpy(y)), (h4 - mu) / np.sqrt(var + 1e-5),
                               rtol=2e-3, atol=2e-3)  # float16 output: 11-bit mantissa


def test_layers_made_under_autocast_have_float32_parameters():
    with autograd.autocast("bfloat16"):
        fc1, fc2, conv = layer.Linear(8), layer.Linear(3), layer.Conv2d(4, 3, padding=1)
        h = fc1(tensor.from_numpy(np.ones((2, 5), np.float32)))
        assert h.dtype == BF16
        out = fc2(h)  # a bfloat16 activation into a new layer: float32 parameters, no cast
        c = conv(tensor.from_numpy(np.ones((1, 2, 4, 4), np.float32)).as_type(tensor.float16))
    assert out.dtype == BF16 and c.dtype == BF16
    for t in (fc1.W, fc1.b, fc2.W, fc2.b, conv.W, conv.b):
        assert t.dtype == jnp.float32


# --- models -----------------------------------------------------------------------------------
class _MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1, self.relu, self.fc2 = layer.Linear(64), layer.ReLU(), layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class _CNN(_MLP):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = layer.Conv2d(8, 3, padding=1), layer.BatchNorm2d()
        self.pool, self.flat = layer.MaxPool2d(2, 2), layer.Flatten()

    def forward(self, x):
        h = self.flat(self.pool(self.relu(self.bn(self.conv(x)))))
        return self.fc2(self.relu(self.fc1(h)))


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(y))
    return x[order], y[order]


def _train(cls, data, autocast, graph, epochs=6, batch=64, steps=None):
    x, y = data
    if cls is _MLP:
        x = x.reshape(len(x), -1)
    device.get_default_device().SetRandSeed(0)
    m = cls()
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    m.compile([tensor.from_numpy(x[:batch])], is_train=True, use_graph=graph, autocast=autocast)
    n_train = 1408 if steps is None else steps * batch
    for _ in range(epochs):
        for i in range(0, n_train, batch):
            m(tensor.from_numpy(x[i:i + batch]), tensor.from_numpy(y[i:i + batch]))
    m.eval()
    out = m(tensor.from_numpy(x[n_train:]))
    return m, out, float(np.mean(tensor.to_numpy(out).argmax(1) == y[n_train:]))


@pytest.mark.parametrize("cls", [_MLP, _CNN], ids=["mlp", "cnn"])
def test_bfloat16_training_matches_float32_accuracy_eager_and_graph(cls, digits):
    _, _, acc32 = _train(cls, digits, None, graph=True)
    m_graph, out_graph, acc_graph = _train(cls, digits, "bfloat16", graph=True)
    m_eager, out_eager, acc_eager = _train(cls, digits, "bfloat16", graph=False)
    assert acc32 > 0.93
    # 389 test digits: an accuracy near 0.98 has a standard error of ~0.7%, so two trainings
    # in different arithmetic differ by a few digits (an H200 run: 0.990 float32/TF32, 0.979
    # bfloat16 graph mode); within 2% (8 digits), while a broken bfloat16 training falls far
    assert acc_graph >= acc32 - 0.02 and acc_eager >= acc32 - 0.02, (acc32, acc_graph, acc_eager)
    assert out_graph.dtype == out_eager.dtype == BF16  # the logits: the compute dtype
    for m in (m_graph, m_eager):
        assert all(t.dtype == jnp.float32 for t in m.get_states().values())
        assert all(t.dtype == jnp.float32 for t in m.optimizer.get_states().values())
        assert "loss_scale" not in m.optimizer.get_states()  # bfloat16 needs no loss scaling


@pytest.mark.parametrize("cls", [_MLP, _CNN], ids=["mlp", "cnn"])
def test_bfloat16_graph_step_equals_the_eager_step(cls, digits):
    """Two training steps from the same parameters, eagerly and as one compiled program: the
    same parameters and logits to bfloat16's precision (different fusions round differently;
    over epochs the two trajectories drift apart as float32 ones do, only faster)."""
    results = []
    for graph in (False, True):
        m, out, _ = _train(cls, digits, "bfloat16", graph, epochs=1, batch=64, steps=2)
        results.append(({k: tensor.to_numpy(t) for k, t in m.get_states().items()},
                        np.float32(tensor.to_numpy(out))))
    (eager_params, eager_out), (graph_params, graph_out) = results
    for k, v in eager_params.items():
        np.testing.assert_allclose(graph_params[k], v, rtol=2e-2, atol=2e-3, err_msg=k)
    np.testing.assert_allclose(graph_out, eager_out, rtol=3e-2, atol=3e-2)


def test_checkpoint_and_onnx_export_hold_float32_weights(tmp_path, digits):
    onnx = pytest.importorskip("onnx")
    from singa_jax import sonnx
    x, y = digits
    m = _CNN()
    m.set_optimizer(opt.SGD(lr=0.05))
    tx = tensor.from_numpy(x[:16])
    m.compile([tx], is_train=True, use_graph=True, autocast="bfloat16")
    m(tx, tensor.from_numpy(y[:16]))
    path = str(tmp_path / "m.zip")
    m.save_states(path)
    fresh = _CNN()
    fresh.compile([tx], is_train=False)
    fresh.load_states(path)
    assert all(t.dtype == jnp.float32 for t in fresh.get_states().values())
    m.eval()
    with autograd.autocast("bfloat16"):
        proto = sonnx.to_onnx([tx], [m.forward(tx)])
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    types = {init.data_type for init in proto.graph.initializer} & floats
    assert types == {onnx.TensorProto.FLOAT}, types
    # the file is the float32 model (mixed precision is how it ran, not what it is): no
    # half-precision value anywhere; it computes singa_jax's float32 forward
    assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    rep = sonnx.prepare(proto)
    got = tensor.to_numpy(rep.run([tx])[0])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, tensor.to_numpy(m.forward(tx)), rtol=1e-5, atol=1e-5)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (ort_out,) = sess.run(None, {proto.graph.input[0].name: tensor.to_numpy(tx)})
    np.testing.assert_allclose(ort_out, got, **matmul_tolerance(1e-4, 1e-4))


def test_the_bfloat16_step_lowers_for_gpu_and_tpu(digits):
    x, y = digits
    m = _CNN()
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    tx, ty = tensor.from_numpy(x[:8]), tensor.from_numpy(y[:8])
    m.compile([tx], is_train=True, use_graph=True, autocast="bfloat16")
    m(tx, ty)
    exported = m.export_step(("cuda", "tpu"))
    text = exported.mlir_module()
    assert "bf16" in text and "convolution" in text


# --- float16 loss scaling ---------------------------------------------------------------------
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_float16_loss_scaling_grows_and_an_overflow_skips_and_halves(graph, digits):
    x, y = digits
    x = x.reshape(len(x), -1)[:16]
    m = _MLP()
    sgd = opt.SGD(lr=0.05, momentum=0.9)
    sgd.loss_scale_growth_interval = 3
    m.set_optimizer(sgd)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y[:16])
    m.compile([tx], is_train=True, use_graph=graph, autocast="float16")
    scales = []
    for _ in range(4):
        out, loss = m(tx, ty)
        scales.append(float(tensor.to_numpy(sgd.loss_scale)[0]))
    assert out.dtype == F16 and loss.dtype == jnp.float32
    assert scales == [2.0 ** 16, 2.0 ** 16, 2.0 ** 17, 2.0 ** 17]  # doubled after 3 clean
    before = {k: tensor.to_numpy(t).copy() for k, t in m.get_states().items()}
    slots = {k: tensor.to_numpy(t).copy() for k, t in sgd.get_states().items()
             if k.startswith("moments")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a loss-scaled skip is the mechanism, not a warning
        m(tensor.from_numpy(x * 3e4), ty)  # float16 activations overflow
    assert float(tensor.to_numpy(sgd.loss_scale)[0]) == 2.0 ** 16
    assert int(tensor.to_numpy(sgd.skipped_steps)[0]) == 1
    for k, t in m.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(t), before[k])
    for k, v in slots.items():
        np.testing.assert_array_equal(tensor.to_numpy(sgd.get_states()[k]), v)
    # the scale is saved with the optimizer's states and restored from them
    saved = {k: tensor.to_numpy(t).copy() for k, t in sgd.get_states().items()}
    np.testing.assert_array_equal(saved["loss_scale"], [2.0 ** 16, 0.0])
    other = opt.SGD(lr=0.05, momentum=0.9)
    other.set_states({"loss_scale": saved["loss_scale"]})
    np.testing.assert_array_equal(tensor.to_numpy(other.loss_scale), [2.0 ** 16])
    with pytest.raises(ValueError, match="loss_scale must be a finite number > 0"):
        other.set_states({"step_counter": 5.0, "loss_scale": 0.0})
    assert float(tensor.to_numpy(other.step_counter)[0]) == 0.0  # nothing changed


def test_float16_loss_scaled_update_equals_the_unscaled_float32_update():
    rng = np.random.RandomState(2)
    x, w = rng.randn(8, 5).astype(np.float32), rng.randn(5, 3).astype(np.float32)
    labels = tensor.from_numpy(np.arange(8, dtype=np.int32) % 3)
    results = []
    for dtype in ("float16", None):
        tw = _param(w)
        sgd = opt.SGD(lr=0.1)
        with autograd.autocast(dtype):
            loss = autograd.softmax_cross_entropy(autograd.matmul(tensor.from_numpy(x), tw),
                                                  labels)
            sgd(loss)
        results.append(tensor.to_numpy(tw))
        assert (sgd.loss_scale is None) == (dtype is None)
    # float16 products (11-bit mantissa) against float32: the same update to that precision
    np.testing.assert_allclose(results[0], results[1], rtol=2e-3, atol=2e-4)
    assert not np.array_equal(results[1], w)
