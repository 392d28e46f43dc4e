"""SINGA 5.1 conformance: what SINGA's own test files (test_onnx.py,
test_onnx_backend.py, test_operation.py) do, each checked against an
independent computation: NumPy, jax.grad, onnxruntime on the exported model.
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from singa_jax import autograd, layer, singa_wrap, tensor  # noqa: E402
from singa_jax import sonnx  # noqa: E402


def t(a):
    return tensor.Tensor(data=np.asarray(a))


def ort_run(m, *xs):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


def round_trip(inputs, y, feeds, want, atol=1e-6):
    """Export with SINGA's ``inputs`` list; onnxruntime and our importer, fed ``feeds``, must
    both give ``want``; returns the model."""
    m = sonnx.to_onnx(inputs, [y])
    np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(ort_run(m, *feeds)[0], want, rtol=1e-5, atol=atol)
    rep = sonnx.prepare(m)
    np.testing.assert_allclose(rep.run(list(feeds))[0], want, rtol=1e-5, atol=atol)
    return m


pytestmark = pytest.mark.usefixtures("eval_mode")


# --------------------------------------------------------------------------------------------
# to_onnx's inputs as SINGA's tests give them
# --------------------------------------------------------------------------------------------
def test_export_skips_the_constants_an_operator_took():
    """SINGA's test_clip / test_reshape list the Python scalars / tuple the op took."""
    x = np.array([-0.9, -0.3, -0.1, 0.1, 0.5, 0.9], np.float32).reshape(3, 2)
    tx = t(x)
    m = round_trip([tx, -0.5, 0.5], autograd.clip(tx, -0.5, 0.5), [x], np.clip(x, -0.5, 0.5))
    assert [i.name for i in m.graph.input] == [m.graph.input[0].name]
    y = autograd.Reshape((2, 3))(tx)[0]
    round_trip([tx, (2, 3)], y, [x], x.reshape(2, 3))


def test_export_rejects_other_input_types():
    x = t(np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="input 1 must be a Tensor.*str"):
        sonnx.to_onnx([x, "min"], [autograd.relu(x)])


def test_batchnorm_statistics_given_as_inputs_stay_initializers():
    """SINGA's test_batch_norm exports with [x, s, bias, mean, var] and runs with [x, s, bias]."""
    x = np.array([[[[-1, 0, 1]], [[2, 3, 4]]]], np.float32)
    s, b = np.array([1.0, 1.5], np.float32), np.array([0, 1], np.float32)
    mean, var = np.array([0, 3], np.float32), np.array([1, 1.5], np.float32)
    tx, ts, tb, tm, tv = (t(a) for a in (x, s, b, mean, var))
    handle = singa_wrap.BatchNormHandle(0.9, tx.data)
    y = autograd.batchnorm_2d(handle, tx, ts, tb, tm, tv)
    c = (slice(None), None, None)
    want = s[c] * (x - mean[c]) / np.sqrt(var[c] + 1e-5) + b[c]
    m = round_trip([tx, ts, tb, tm, tv], y, [x, s, b], want, atol=1e-5)
    assert len(m.graph.input) == 3
    assert {i.name for i in m.graph.initializer} >= {tm.name, tv.name}


def test_tile_with_more_repeats_than_axes_exports():
    """As np.tile (and SINGA's test_tile): new leading axes."""
    x = np.array([0, 1, 2], np.float32)
    tx = t(x)
    round_trip([tx], autograd.tile(tx, [2, 2]), [x], np.tile(x, [2, 2]))
    x3 = np.arange(6, dtype=np.float32).reshape(3, 2)
    tx3 = t(x3)
    round_trip([tx3], autograd.tile(tx3, [2, 1, 3]), [x3], np.tile(x3, [2, 1, 3]))


# --------------------------------------------------------------------------------------------
# Unsqueeze: SINGA inserts the axes one by one
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("axes, shape", [
    ([2, 4, 5], (3, 2, 1, 1, 1)),  # SINGA's test_unsqueeze: past the end appends
    ([1, 0], (1, 3, 1, 2)),        # order matters: the second insert shifts the first
    ([0, 3], (1, 3, 2, 1)),        # sorted and in range: as np.expand_dims
    ([-1], (3, 2, 1)),             # negative: from the end of the output, as ONNX
])
def test_unsqueeze_forward_gradient_and_export(axes, shape):
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    want = x.reshape(shape)
    tx = tensor.Tensor(data=x, requires_grad=True, stores_grad=True)
    with autograd_training():
        y = autograd.unsqueeze(tx, axes)
        assert y.shape == shape
        dy = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        grads = autograd.gradients(y, tensor.Tensor(data=dy))
        np.testing.assert_array_equal(np.asarray(grads[id(tx)].array), dy.reshape(3, 2))
    m = round_trip([tx], autograd.unsqueeze(tx, axes), [x], want)
    assert ort_run(m, x)[0].shape == shape


class autograd_training:
    def __enter__(self):
        self.saved, autograd.training = autograd.training, True

    def __exit__(self, *exc):
        autograd.training = self.saved


# --------------------------------------------------------------------------------------------
# OneHot: depth as a one-element array (SINGA's test_onehot)
# --------------------------------------------------------------------------------------------
def test_onehot_with_a_depth_array():
    indices = np.array([[1, 9], [2, 4]], np.float32)
    values = np.array([1, 3], np.float32)
    want = np.where(np.arange(10)[None, :, None] == indices[:, None, :], 3.0, 1.0)
    tx = t(indices)
    y = autograd.onehot(1, tx, np.array([10], np.float32), values)
    assert y.shape == (2, 10, 2)
    round_trip([tx], y, [indices], want)
    for bad in (np.array([10, 2]), 2.5, 0):
        with pytest.raises(ValueError, match="OneHot: depth"):
            autograd.onehot(1, tx, bad, values)


# --------------------------------------------------------------------------------------------
# SingaRep.run(last_layers=k): SINGA's rule for negative k
# --------------------------------------------------------------------------------------------
def test_last_layers_follows_singa():
    """SINGA's test_inference: two convs, last_layers=-1 gives the first conv's output."""
    rng = np.random.default_rng(1)
    x = t(rng.standard_normal((2, 3, 3, 3)).astype(np.float32))
    conv1, conv2 = layer.Conv2d(1, 2), layer.Conv2d(1, 2)
    h = conv1(x)
    y = conv2(h)
    rep = sonnx.prepare(sonnx.to_onnx([x], [y]))
    xs = [tensor.to_numpy(x)]
    np.testing.assert_allclose(rep.run(xs, last_layers=-1)[0], tensor.to_numpy(h), atol=1e-5)
    np.testing.assert_allclose(rep.run(xs, last_layers=0)[0], tensor.to_numpy(h), atol=1e-5)
    for k in (-2, 1, None):
        kw = {} if k is None else {"last_layers": k}
        np.testing.assert_allclose(rep.run(xs, **kw)[0], tensor.to_numpy(y), atol=1e-5)
    with pytest.raises(ValueError, match="last_layers=2 is out of range"):
        rep.run(xs, last_layers=2)


# --------------------------------------------------------------------------------------------
# SingaBackend._rename_operators: SINGA's table, which test_onnx_backend.py selects tests by
# --------------------------------------------------------------------------------------------
def test_rename_operators_is_singas_table():
    table = sonnx.SingaBackend._rename_operators
    assert len(table) == 81
    assert set(table) <= set(sonnx.OPS)  # every op SINGA imports runs here
    for onnx_op, singa_op in table.items():
        module, name = (layer, singa_op[6:]) if singa_op.startswith("layer.") else \
            (autograd, singa_op)
        assert hasattr(module, name), (onnx_op, singa_op)
    assert table["Relu"] == "ReLU" and table["MaxPool"] == "layer.Pooling2d"
    assert table["Neg"] == "Negative" and table["MatMul"] == "Matmul"
