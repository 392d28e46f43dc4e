"""singa_jax.sonnx: export -> onnxruntime, export -> import -> run, fine-tuning, errors.

Every comparison is against an independent computation: onnxruntime for exported models, the
singa_jax forward that was exported, NumPy for hand-built graphs.
"""
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from backend_precision import matmul_tolerance, two_programs_tolerance  # noqa: E402
from singa_jax import autograd, layer, model, opt, tensor  # noqa: E402
from onnx_classifier import Classifier  # noqa: E402
from singa_jax import sonnx  # noqa: E402
from singa_jax.precision import float32_matmul_precision_scope  # noqa: E402


def ort_run(m, *xs):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


def t(a):
    return tensor.Tensor(data=np.asarray(a))


pytestmark = pytest.mark.usefixtures("eval_mode")  # conftest: autograd.training = False


def check_round_trip(inputs, y, opset=None, atol=1e-5, batch_free=True):
    """Export y's graph; onnxruntime and our importer must both reproduce y (onnxruntime
    computes float32 products, y's are TF32 on a GPU by default; the importer's program is
    another program than the one that computed y, its products rounded on their own)."""
    m = sonnx.to_onnx(inputs, [y], opset_version=opset)
    xs = [tensor.to_numpy(x) for x in inputs]
    want = tensor.to_numpy(y)
    np.testing.assert_allclose(ort_run(m, *xs)[0], want, **matmul_tolerance(1e-5, atol))
    np.testing.assert_allclose(sonnx.prepare(m).run(xs)[0], want,
                               **two_programs_tolerance(1e-5, atol))
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
    np.testing.assert_allclose(sonnx.prepare(om).run([xb])[0], ort_run(om, xb)[0],
                               **matmul_tolerance(1e-5, 1e-5))


def test_lstm_layer_round_trip(rng):
    lstm = layer.LSTM(5, 6)
    xs = [t(rng.standard_normal((2, 5)).astype(np.float32)) for _ in range(3)]
    h0 = t(np.zeros((2, 6), np.float32))
    c0 = t(np.zeros((2, 6), np.float32))
    ys, h, c = lstm(xs, (h0, c0))
    check_round_trip(xs + [h0, c0], h)


# The importer must reproduce the forward to 1e-5: two singa_jax computations, in float32 here
# (under TF32 a rounding flip in the first convolution grows through the second)
@float32_matmul_precision_scope("float32")
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
# opset and IR version of what we write
# --------------------------------------------------------------------------------------------
def _ir_for(opset):
    return helper.find_min_ir_version_for([helper.make_opsetid("", opset)])


def test_default_export_is_loadable_by_onnxruntime_1_18(rng, tmp_path):
    """onnxruntime 1.18 (the onnx extra's floor) loads IR <= 10 and opset <= 21: a default
    export stays within both whatever onnx is installed, and runs as singa_jax computed it."""
    m = CNN()
    x = t(rng.standard_normal((2, 3, 12, 12)).astype(np.float32))
    m.compile([x], is_train=False, use_graph=False)
    _randomize_bn(m, rng)
    y = m.forward(x)
    assert sonnx.DEFAULT_OPSET == min(onnx.defs.onnx_opset_version(), 21)
    for om in (sonnx.to_onnx([x], [y]), sonnx.SingaFrontend.singa_to_onnx_model([x], y)):
        assert [(o.domain, o.version) for o in om.opset_import] == [("", sonnx.DEFAULT_OPSET)]
        assert om.ir_version <= 10 and om.ir_version == _ir_for(sonnx.DEFAULT_OPSET)
        onnx.checker.check_model(om, full_check=True)
        sonnx.save(om, str(tmp_path / "m.onnx"))  # as a user ships it
        loaded = sonnx.load(str(tmp_path / "m.onnx"))
        assert loaded.ir_version == om.ir_version
        np.testing.assert_allclose(ort_run(loaded, tensor.to_numpy(x))[0], tensor.to_numpy(y),
                                   **matmul_tolerance(1e-5, 1e-5))


@pytest.mark.parametrize("opset", [18, onnx.defs.onnx_opset_version()])
def test_explicit_opset_gets_the_ir_version_it_needs(opset, rng):
    a = t(rng.standard_normal((3, 4)).astype(np.float32))
    y = autograd.reduce_mean(autograd.relu(a), [1], 1)
    om = sonnx.to_onnx([a], [y], opset_version=opset)
    assert om.opset_import[0].version == opset
    assert om.ir_version == _ir_for(opset)  # 8 for 18; 14 for onnx 1.23's 28
    onnx.checker.check_model(om, full_check=True)
    try:
        got = ort_run(om, tensor.to_numpy(a))[0]
    except Exception as e:  # onnxruntime's own error class (its pybind Fail)
        # only an opset past what the default export promises (RUNTIME_MAX_OPSET) may need an
        # IR version newer than the installed onnxruntime reads
        if opset <= sonnx.RUNTIME_MAX_OPSET or "Unsupported model IR version" not in str(e):
            raise
        pytest.skip(f"the installed onnxruntime {ort.__version__} predates IR version "
                    f"{om.ir_version} (onnx {onnx.__version__}'s opset {opset}): export checked, "
                    f"not run: {re.search(r'Unsupported model IR version.*', str(e)).group(0)}")
    np.testing.assert_allclose(got, tensor.to_numpy(y), rtol=1e-6)


@pytest.mark.parametrize("opset", [7, 13, 21])
def test_run_node_model_has_the_ir_version_of_its_opset(opset, monkeypatch):
    """run_node builds a one-node model: it carries its opset's IR version, so onnxruntime
    (and any runtime reading that opset) loads it too."""
    built = []
    prepare = sonnx.SingaBackend.prepare.__func__

    def spy(cls, model, *args, **kwargs):
        built.append(model)
        return prepare(cls, model, *args, **kwargs)

    monkeypatch.setattr(sonnx.SingaBackend, "prepare", classmethod(spy))
    a = np.array([[-1.5, 0.5, 2.0]], np.float32)
    out = sonnx.run_node(helper.make_node("Relu", ["a"], ["y"]), [a], opset_version=opset)
    np.testing.assert_array_equal(out["y"], np.maximum(a, 0))
    (m,) = built
    assert m.ir_version == _ir_for(opset)
    np.testing.assert_array_equal(ort_run(m, a)[0], np.maximum(a, 0))


# --------------------------------------------------------------------------------------------
# import: hand-built graphs against NumPy, errors raised at prepare
# --------------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=17):
    """A hand-built model at ``opset``, with that opset's IR version as exporters write it
    (``helper.make_model`` alone writes onnx's newest, which an older onnxruntime refuses)."""
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=_ir_for(opset))


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


def _declared_batch_1_cnn(rng):
    """A file that declares batch 1 (as many exporters write): Conv -> Relu -> Reshape(0, -1)
    -> Gemm -> Relu -> Flatten -> Gemm, batch-free as written."""
    w = {"cw": 0.3 * rng.standard_normal((4, 3, 3, 3)), "cb": 0.1 * rng.standard_normal(4),
         "w1": 0.1 * rng.standard_normal((16, 4 * 6 * 6)), "b1": 0.1 * rng.standard_normal(16),
         "w2": 0.3 * rng.standard_normal((16, 5)), "b2": 0.1 * rng.standard_normal(5)}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "to2d"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w1", "b1"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Flatten", ["hr"], ["hf"], axis=1),
             helper.make_node("Gemm", ["hf", "w2", "b2"], ["y"], name="fc2")]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in w.items()]
    inits.append(onnx.numpy_helper.from_array(np.array([0, -1], np.int64), "to2d"))
    m = _model(nodes, [_vi("x", [1, 3, 6, 6])], [_vi("y", [1, 5])], inits)

    def reference(x):  # NumPy
        p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))
        c = np.einsum("nchwij,kcij->nkhw", win, w["cw"]) + w["cb"][:, None, None]
        h = np.maximum(np.maximum(c, 0).reshape(len(x), -1) @ w["w1"].T + w["b1"], 0)
        return h @ w["w2"] + w["b2"]
    return m, reference


def _symbolic_batch(m):
    """A copy whose batch dimension is symbolic: onnxruntime refuses batch 8 for a declared 1."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "n"
    return m


def test_declared_batch_1_runs_at_any_batch(rng):
    m, reference = _declared_batch_1_cnn(rng)
    rep = sonnx.prepare(m)
    for n in (1, 8):
        x = rng.standard_normal((n, 3, 6, 6)).astype(np.float32)
        want = ort_run(_symbolic_batch(m), x)[0]
        np.testing.assert_allclose(want, reference(x), rtol=1e-4, atol=1e-5)
        (got,) = rep.run([x])  # NumPy in, NumPy out
        assert got.shape == (n, 5)
        np.testing.assert_allclose(got, want, **matmul_tolerance(1e-5, 1e-5))  # ours: TF32 on GPU
        (got_t,) = rep.run([t(x)])  # Tensors in, Tensors out
        np.testing.assert_allclose(tensor.to_numpy(got_t), want, **matmul_tolerance(1e-5, 1e-5))


def test_declared_batch_1_other_axes_stay_checked(rng):
    m, _ = _declared_batch_1_cnn(rng)
    rep = sonnx.prepare(m)
    for shape in ((8, 4, 6, 6), (8, 3, 6), (1, 3, 6, 7)):
        with pytest.raises(ValueError, match=re.escape(
                f"input 'x' expects shape (1, 3, 6, 6), got {shape} (the leading, batch axis "
                f"may have any size)")):
            rep.run([np.zeros(shape, np.float32)])


def test_reshape_with_a_baked_in_batch_keeps_it(rng):
    """A Reshape constant that writes the batch as 1 keeps 1 (as SINGA's would), as torch writes
    x.view(x.size(0), -1) at a fixed batch: at batch 8, [1, 12] cannot reshape and [1, -1]
    folds the batch into axis 1, which the next Gemm rejects; both errors name their node."""
    w = rng.standard_normal((12, 2)).astype(np.float32)

    def model(target):
        return _model([helper.make_node("Reshape", ["x", "s"], ["h"], name="flat"),
                       helper.make_node("Gemm", ["h", "w"], ["y"], name="fc")],
                      [_vi("x", [1, 3, 4])], [_vi("y", [1, 2])],
                      [onnx.numpy_helper.from_array(np.array(target, np.int64), "s"),
                       onnx.numpy_helper.from_array(w, "w")])

    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    x8 = np.zeros((8, 3, 4), np.float32)
    for target in ([1, 12], [1, -1]):
        rep = sonnx.prepare(model(target))
        np.testing.assert_allclose(rep.run([x])[0], x.reshape(1, 12) @ w, **matmul_tolerance(1e-5))
        if target == [1, 12]:
            with pytest.raises(ValueError, match=re.escape(
                    "node 'flat' (Reshape, opset 17): cannot reshape (8, 3, 4) to [1, 12]")):
                rep.run([x8])
        else:
            with pytest.raises(TypeError, match=re.escape(
                    "node 'fc' (Gemm, opset 17) on inputs of shapes [(1, 96), (12, 2)]: ")):
                rep.run([x8])


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


@pytest.mark.parametrize("use_graph", [False, True])
def test_declared_batch_1_fine_tunes_at_batch_8(use_graph, rng):
    m, reference = _declared_batch_1_cnn(rng)
    x = rng.standard_normal((8, 3, 6, 6)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]
    net = Classifier(m)
    net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    tx, ty = t(x), t(y)
    net.compile([tx], is_train=True, use_graph=use_graph)
    logits = reference(x)  # the loss of the first step, from NumPy
    p = np.exp(logits - logits.max(1, keepdims=True))
    first = -np.mean(np.sum(y * np.log(p / p.sum(1, keepdims=True)), 1))
    losses = [tensor.to_numpy(net(tx, ty)).item() for _ in range(8)]
    np.testing.assert_allclose(losses[0], first, rtol=1e-4)
    assert losses[-1] < 0.5 * losses[0], losses
    net.eval()
    assert tensor.to_numpy(net(tx)).shape == (8, 5)




# --------------------------------------------------------------------------------------------
# an imported graph exported again: alone, fine-tuned under a new head, between layers
# --------------------------------------------------------------------------------------------
def _exported_again(inputs, y, feeds):
    """Export ``y`` (computed through an imported graph); onnxruntime on the file, and the file
    imported again, must both give ``y``'s values."""
    m = sonnx.to_onnx(inputs, [y])
    want = tensor.to_numpy(y)
    np.testing.assert_allclose(ort_run(m, *feeds)[0], want, **matmul_tolerance(1e-5))
    again = sonnx.prepare(m).run([t(f) for f in feeds])[0]
    np.testing.assert_allclose(tensor.to_numpy(again), want, **two_programs_tolerance(1e-5))
    return m


def test_an_imported_model_exports_again(rng):
    src = MLPBN()
    xa = rng.standard_normal((4, 6)).astype(np.float32)
    x = t(xa)
    src.compile([x], is_train=False, use_graph=False)
    first = sonnx.to_onnx([x], [src.forward(x)])
    rep = sonnx.prepare(first)  # (held: the export reads its batch-norm statistics)
    y = rep.run([x])[0]
    m = _exported_again([x], y, [xa])
    # the imported graph's own nodes, written again (not one opaque operator)
    assert [n.op_type for n in m.graph.node if n.op_type != "Identity"] == \
        [n.op_type for n in first.graph.node if n.op_type != "Identity"]


class Around(model.Model):
    """singa_jax layers before and after an imported graph."""

    def __init__(self, onnx_model):
        super().__init__()
        self.pre = layer.Linear(6)
        self.imported = sonnx.SONNXModel(onnx_model)
        self.post = layer.Linear(3)

    def forward(self, x):
        return self.post(autograd.tanh(self.imported.forward(autograd.relu(self.pre(x)))[0]))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer(loss)
        return loss


@pytest.mark.parametrize("use_graph", [False, True])
def test_a_fine_tuned_import_exports_its_trained_weights(use_graph, rng):
    """Imported, fine-tuned with a new head (eager or graph mode), exported from an eager
    forward: onnxruntime and the re-imported file give the fine-tuned model's outputs, which the
    original weights do not."""
    src = MLPBN()
    xa = rng.standard_normal((4, 6)).astype(np.float32)
    x, y = t(xa), t(np.eye(2, dtype=np.float32)[[0, 1, 1, 0]])
    src.compile([x], is_train=False, use_graph=False)
    om = sonnx.to_onnx([x], [src.forward(x)])
    net = FineTune(om)
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([x], is_train=True, use_graph=use_graph)
    untrained = tensor.to_numpy(net.forward(x))
    for _ in range(5):
        net(x, y)
    net.eval()
    out = net.forward(x)
    m = _exported_again([x], out, [xa])
    assert not np.allclose(ort_run(m, xa)[0], untrained, atol=1e-3)


@pytest.mark.parametrize("use_graph", [False, True])
def test_an_import_between_layers_exports_again(use_graph, rng):
    src = MLPBN()
    x6 = t(rng.standard_normal((4, 6)).astype(np.float32))
    src.compile([x6], is_train=False, use_graph=False)
    om = sonnx.to_onnx([x6], [src.forward(x6)])
    xa = rng.standard_normal((4, 5)).astype(np.float32)
    x, y = t(xa), t(np.eye(3, dtype=np.float32)[[0, 1, 2, 0]])
    net = Around(om)
    net.set_optimizer(opt.SGD(lr=0.05))
    net.compile([x], is_train=True, use_graph=use_graph)
    for _ in range(3):
        net(x, y)
    net.eval()
    _exported_again([x], net.forward(x), [xa])


def test_an_import_at_an_older_opset_exports_at_the_default(rng):
    """A graph imported at opset 13 (ReduceMean's axes an attribute, Squeeze's an input) is
    written at the export's opset (ReduceMean's axes an input from 18)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Squeeze", ["m", "ax"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["y"])]
    w = rng.standard_normal((3, 2)).astype(np.float32)
    inits = [helper.make_tensor("ax", TensorProto.INT64, [1], [1]),
             helper.make_tensor("w", TensorProto.FLOAT, [3, 2], w.ravel())]
    m13 = _model(nodes, [_vi("x", [4, 5, 3])], [_vi("y", [4, 2])], inits, opset=13)
    xa = rng.standard_normal((4, 5, 3)).astype(np.float32)
    x = t(xa)
    y = sonnx.prepare(m13).run([x])[0]
    np.testing.assert_allclose(tensor.to_numpy(y), xa.mean(1) @ w, rtol=1e-5, atol=1e-6)
    m = _exported_again([x], y, [xa])
    assert m.opset_import[0].version == sonnx.DEFAULT_OPSET
    (reduce,) = [n for n in m.graph.node if n.op_type == "ReduceMean"]
    assert len(reduce.input) == 2  # the axes: an input at the new opset
