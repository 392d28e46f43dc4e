"""singa_jax.sonnx: export -> onnxruntime, export -> import -> run, fine-tuning, errors.

Every comparison is against an independent computation: onnxruntime for exported models, the
singa_jax forward that was exported, NumPy for hand-built graphs.
"""
import pathlib
import re

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from singa_jax import autograd, layer, model, opt, tensor  # noqa: E402
from singa_jax import sonnx  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def ort_run(m, *xs):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


def t(a):
    return tensor.Tensor(data=np.asarray(a))


pytestmark = pytest.mark.usefixtures("eval_mode")  # conftest: autograd.training = False


def check_round_trip(inputs, y, opset=None, atol=1e-5, batch_free=True):
    """Export y's graph; onnxruntime and our importer must both reproduce y."""
    m = sonnx.to_onnx(inputs, [y], opset_version=opset)
    xs = [tensor.to_numpy(x) for x in inputs]
    want = tensor.to_numpy(y)
    np.testing.assert_allclose(ort_run(m, *xs)[0], want, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(sonnx.prepare(m).run(xs)[0], want, rtol=1e-5, atol=atol)
    dims = [d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim[:1]]
    assert (dims == ["batch"]) == batch_free
    return m


# --------------------------------------------------------------------------------------------
# export round trips, by model family
# --------------------------------------------------------------------------------------------
class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.l1, self.relu, self.l2 = layer.Linear(16), layer.ReLU(), layer.Linear(3)

    def forward(self, x):
        return autograd.softmax(self.l2(self.relu(self.l1(x))))


class CNN(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(6, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.pool = layer.MaxPool2d(2, 2)
        self.conv2 = layer.Conv2d(4, 3, stride=2, pad_mode="SAME_UPPER")
        self.avg = layer.AvgPool2d(2, 1)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(5)

    def forward(self, x):
        y = self.pool(autograd.relu(self.bn(self.conv(x))))
        return self.fc(self.flat(self.avg(self.conv2(y))))


class ResBlock(model.Model):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = layer.Conv2d(4, 3, padding=1, bias=False), layer.BatchNorm2d()
        self.c2, self.b2 = layer.Conv2d(4, 3, padding=1, bias=False), layer.BatchNorm2d()
        self.short = layer.Conv2d(4, 1, bias=False)

    def forward(self, x):
        y = autograd.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return autograd.relu(autograd.add(y, self.short(x)))


def _randomize_bn(m, rng):
    for name, v in m.get_states().items():
        if name.endswith("running_var"):
            v.data = np.abs(rng.standard_normal(v.shape)).astype(np.float32) + 0.5
        elif name.endswith("running_mean"):
            v.data = rng.standard_normal(v.shape).astype(np.float32)


@pytest.mark.parametrize("net, shape", [(MLP, (4, 10)), (CNN, (2, 3, 12, 12)),
                                        (ResBlock, (2, 3, 8, 8))])
@pytest.mark.parametrize("opset", [None, 11])
def test_model_round_trip(net, shape, opset, rng):
    m = net()
    x = t(rng.standard_normal(shape).astype(np.float32))
    m.compile([x], is_train=False, use_graph=False)
    _randomize_bn(m, rng)
    y = m.forward(x)
    om = check_round_trip([x], y, opset)
    assert om.opset_import[0].version == (opset or sonnx.DEFAULT_OPSET)
    # parameters are initializers under their singa_jax names
    inits = {i.name for i in om.graph.initializer}
    assert set(m.get_states()) <= inits
    # another batch size runs too (dynamic batch) and matches the importer
    xb = rng.standard_normal((3,) + shape[1:]).astype(np.float32)
    np.testing.assert_allclose(sonnx.prepare(om).run([xb])[0], ort_run(om, xb)[0], rtol=1e-5,
                               atol=1e-5)


def test_lstm_layer_round_trip(rng):
    lstm = layer.LSTM(5, 6)
    xs = [t(rng.standard_normal((2, 5)).astype(np.float32)) for _ in range(3)]
    h0 = t(np.zeros((2, 6), np.float32))
    c0 = t(np.zeros((2, 6), np.float32))
    ys, h, c = lstm(xs, (h0, c0))
    check_round_trip(xs + [h0, c0], h)


def test_separable_and_dilated_conv_round_trip(rng):
    x = t(rng.standard_normal((2, 4, 9, 9)).astype(np.float32))
    sep = layer.SeparableConv2d(6, 3, padding=1)
    dil = layer.Conv2d(3, 3, dilation=2, padding=2)
    check_round_trip([x], dil(sep(x)))


HALF, ONE = t(np.float32(2.5)), t(np.float32(1.0))  # constants stay alive for the export
OPERATOR_CASES = {
    "unary": lambda a, b: autograd.add(autograd.add(autograd.tanh(a), autograd.sigmoid(a)),
                                       autograd.add(autograd.exp(a), autograd.abs(a))),
    "unary2": lambda a, b: autograd.add(autograd.softsign(a), autograd.softplus(a)),
    "trig": lambda a, b: autograd.add(autograd.atan(a), autograd.cos(a)),
    "rounding": lambda a, b: autograd.add(autograd.round(autograd.mul(a, HALF)),
                                          autograd.rounde(autograd.mul(a, HALF))),
    "binary": lambda a, b: autograd.div(autograd.sub(autograd.mul(a, b), a),
                                        autograd.add(autograd.abs(b), ONE)),
    "compare": lambda a, b: autograd.add(autograd.less(a, b), autograd._and(
        autograd.greater(a, b), autograd.equal(a, a))),
    "activations": lambda a, b: autograd.add(autograd.add(autograd.elu(a, 0.7),
                                                          autograd.selu(a)),
                                             autograd.add(autograd.leakyrelu(a, 0.2),
                                                          autograd.hardsigmoid(a))),
    "clip": lambda a, b: autograd.clip(a, -0.5, 0.3),
    "softmax_axis": lambda a, b: autograd.softmax(autograd.reshape(a, (2, 3, 4)), 1),
    "shape": lambda a, b: autograd.transpose(autograd.reshape(
        autograd.cat([a, b], 1), (4, 3, 4)), (2, 0, 1)),
    "slice_split": lambda a, b: autograd.add(
        autograd.slice(a, [0, 1], [4, 5], [0, 1], [2, 1]),
        autograd.slice(autograd.split(b, 0, [2, 2])[1], [1], [5], [1])),
    "gather_tile_pad": lambda a, b: autograd.pad(autograd.tile(autograd.gather(a, 1, [0, 2]),
                                                               [1, 2]), "constant",
                                                 [0, 1, 0, 1], 0.5),
    "reduce": lambda a, b: autograd.add(autograd.reduce_sum(a, [1], 1),
                                        autograd.reduce_mean(b, [1], 1)),
    "squeeze": lambda a, b: autograd.squeeze(autograd.unsqueeze(autograd.flatten(a, 1), [0]),
                                             [0]),
    "matmul_gemm": lambda a, b: autograd.gemm(a, autograd.transpose(b, (1, 0)),
                                              autograd.matmul(a, autograd.transpose(b, (1, 0))),
                                              0.5, 2.0, 0, 0),
    "variadic": lambda a, b: autograd.add(autograd.max(a, b), autograd.mean(a, b)),
    "where": lambda a, b: autograd.where(a, b, np.array([[1, 0, 1, 0, 1, 0]] * 4,
                                                        np.float32)),
}


@pytest.mark.parametrize("case", sorted(OPERATOR_CASES))
def test_operator_round_trip(case, rng):
    a = t(rng.standard_normal((4, 6)).astype(np.float32))
    b = t(rng.standard_normal((4, 6)).astype(np.float32))
    y = OPERATOR_CASES[case](a, b)
    check_round_trip([a, b], y, batch_free=_batch_free(case))


def _batch_free(case):
    # reshape/gather/where/slice graphs bake the batch into their constants
    return case not in ("softmax_axis", "shape", "where", "slice_split")


def test_export_of_a_dead_constant_says_so(rng):
    a = t(rng.standard_normal((2, 3)).astype(np.float32))
    y = autograd.mul(a, t(np.float32(3.0)))  # the constant is freed once the op has run
    with pytest.raises(ValueError, match="no longer alive"):
        sonnx.to_onnx([a], [y])


def test_export_errors(rng):
    x = t(rng.standard_normal((3, 4)).astype(np.float32))
    lbl = t(np.eye(4, dtype=np.float32)[:3])
    loss = autograd.softmax_cross_entropy(x, lbl)
    with pytest.raises(ValueError, match="no ONNX translation"):
        sonnx.to_onnx([x, lbl], [loss])
    with pytest.raises(ValueError, match="opset_version"):
        sonnx.to_onnx([x], [autograd.relu(x)], opset_version=7)


# --------------------------------------------------------------------------------------------
# import: hand-built graphs against NumPy, errors raised at prepare
# --------------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_shape_chain_folds_and_batch_varies(rng):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (as torch exports x.view(b, -1))."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("ax", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])]
    m = _model(nodes, [_vi("x", ["n", 2, 3])], [_vi("y", ["n", 6])], inits)
    rep = sonnx.prepare(m)
    for n in (2, 5):
        x = rng.standard_normal((n, 2, 3)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], x.reshape(n, 6))


def test_unsupported_op_named_at_prepare():
    m = _model([helper.make_node("Relu", ["x"], ["h"], name="r"),
                helper.make_node("Det", ["h"], ["y"], name="det_node")],
               [_vi("x", [2, 2])], [_vi("y", [])])
    with pytest.raises(sonnx.UnsupportedOnnx, match=r"node 'det_node' \(Det, opset 17\).*'Det'"):
        sonnx.prepare(m)


def test_unsupported_attribute_value_named_at_prepare():
    m = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs",
                                 mode="linear", antialias=1)],
               [_vi("x", [1, 1, 2, 2]), _vi("scales", [4])], [_vi("y", [1, 1, 4, 4])], opset=18)
    with pytest.raises(sonnx.UnsupportedOnnx, match=r"node 'rs' \(Resize, opset 18\): "
                                                    r"antialias=1"):
        sonnx.prepare(m)
    m = _model([helper.make_node("LSTM", ["x", "w", "r"], ["y"], name="l", hidden_size=2,
                                 input_forget=1)],
               [_vi("x", [1, 1, 2]), _vi("w", [1, 8, 2]), _vi("r", [1, 8, 2])],
               [_vi("y", [1, 1, 1, 2])])
    with pytest.raises(sonnx.UnsupportedOnnx, match=r"node 'l' \(LSTM, opset 17\): "
                                                    r"input_forget=1 is not supported"):
        sonnx.prepare(m)


def test_malformed_model_gives_checker_message():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    m.graph.node[0].input[0] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        sonnx.prepare(m)


def test_bad_input_shape_and_dtype():
    rep = sonnx.prepare(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])],
                               [_vi("y", [2, 3])]))
    with pytest.raises(ValueError, match=r"input 'x' expects shape \(2, 3\), got \(3, 2\)"):
        rep.run([np.zeros((3, 2), np.float32)])
    with pytest.raises(TypeError, match="input 'x' expects dtype float32, got bool"):
        rep.run([np.zeros((2, 3), bool)])
    with pytest.raises(ValueError, match="expects 1 input"):
        rep.run([])


def test_run_node_and_get_op():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=2.0)
    a, b = np.ones((2, 3), np.float32), np.arange(12, dtype=np.float32).reshape(4, 3)
    c = np.ones(4, np.float32)
    out = sonnx.run_node(node, [a, b, c], opset_version=13)
    np.testing.assert_allclose(out["y"], 2 * a @ b.T + c)
    assert sonnx.get_op(node, 13).op_type == "Gemm"


def test_aux_output_and_last_layers(rng):
    m = MLP()
    x = t(rng.standard_normal((2, 10)).astype(np.float32))
    m.compile([x], is_train=False, use_graph=False)
    om = sonnx.to_onnx([x], [m.forward(x)])
    rep = sonnx.prepare(om)
    k = [n.op_type for n in om.graph.node].index("Relu")
    hidden = om.graph.node[k].output[0]
    relu_out = rep.run([tensor.to_numpy(x)], last_layers=k)
    _, aux = rep.run([tensor.to_numpy(x)], aux_output=(hidden,))
    np.testing.assert_allclose(relu_out[0], aux, rtol=1e-6)
    assert (aux >= 0).all() and aux.shape == (2, 16)


# --------------------------------------------------------------------------------------------
# SONNXModel: fine-tuning, eager and graph mode agree; checkpoints
# --------------------------------------------------------------------------------------------
class FineTune(sonnx.SONNXModel):
    def __init__(self, onnx_model):
        super().__init__(onnx_model)
        self.head = layer.Linear(2)

    def forward(self, x):
        return self.head(super().forward(x)[0])

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer(loss)
        return loss


class MLPBN(model.Model):
    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out = layer.Linear(8), layer.BatchNorm2d(), layer.Linear(5)

    def forward(self, x):
        return self.out(autograd.relu(self.bn(self.fc(x))))


def test_sonnx_model_fine_tunes_in_eager_and_graph_mode(rng, tmp_path):
    src = MLPBN()
    x = t(rng.standard_normal((4, 6)).astype(np.float32))
    src.compile([x], is_train=False, use_graph=False)
    om = sonnx.to_onnx([x], [src.forward(x)])
    y = t(np.eye(2, dtype=np.float32)[[0, 1, 1, 0]])
    head_w = rng.standard_normal((5, 2)).astype(np.float32)
    runs = []
    for use_graph in (False, True):
        net = FineTune(om)
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        net.compile([x], is_train=True, use_graph=use_graph)
        net.head.W.data = head_w  # the same start in both runs
        before = tensor.to_numpy(net.weights.params["fc.W"]).copy()
        losses = [tensor.to_numpy(net(x, y)).item() for _ in range(5)]
        assert losses[-1] < losses[0] - 0.1, losses
        assert not np.allclose(tensor.to_numpy(net.weights.params["fc.W"]), before)
        # batch-norm running statistics followed the batches
        assert not np.allclose(tensor.to_numpy(net.get_states()["bn.running_mean"]), 0)
        runs.append(losses)
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-4)
    net.save_states(str(tmp_path / "ft.zip"))
    other = FineTune(om)
    other.compile([x], is_train=False, use_graph=False)
    other.load_states(str(tmp_path / "ft.zip"))
    net.eval()
    other.eval()
    np.testing.assert_allclose(tensor.to_numpy(other(x)), tensor.to_numpy(net(x)), rtol=1e-5)


def test_gradients_match_finite_differences(rng):
    """The vjp of the imported graph is the true gradient (checked against central differences
    of the onnxruntime output)."""
    w = rng.standard_normal((3, 4)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Tanh", ["h"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", [2, 4])],
               [onnx.numpy_helper.from_array(w, "w")])
    rep = sonnx.prepare(m)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    autograd.training = True
    xt = t(x)
    out = rep.run([xt])[0]
    # dw = x^T dh: the graph's pullback keeps the input array itself, not a copy of it
    assert any(leaf is xt.array for leaf in jax.tree_util.tree_leaves(out.creator._vjp))
    loss = autograd.reduce_sum(autograd.reduce_sum(out, None, 0), None, 0)
    grads = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss)}
    autograd.training = False
    want = (1 - np.tanh(x @ w) ** 2)
    np.testing.assert_allclose(grads["w"], x.T @ want, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# docs
# --------------------------------------------------------------------------------------------
def test_docs_op_table_is_generated_from_the_code():
    text = (ROOT / "docs" / "onnx.md").read_text()
    found = re.search(r"<!-- op-table:start -->\n(.*?)<!-- op-table:end -->", text, re.S)
    assert found, "docs/onnx.md lost its op-table markers"
    assert found.group(1) == sonnx.op_table_markdown(), \
        "docs/onnx.md's op table is stale: run python -m singa_jax.sonnx.doc_table"
