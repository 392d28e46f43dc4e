"""An imported ONNX model computes on its Tensor inputs' device (SINGA's SingaRep.run moves the
model there on its first run), checked on the second of two host devices: eager runs, NumPy
inputs, and SONNXModel fine-tuning eagerly and in graph mode, against device 0 and onnxruntime.

The suite runs with two host devices (XLA_FLAGS=--xla_force_host_platform_device_count=2);
with one, the in-process tests skip and the subprocess test still runs.
"""
import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from backend_precision import matmul_tolerance  # noqa: E402
from singa_jax import device, opt, tensor  # noqa: E402
from onnx_classifier import Classifier  # noqa: E402
from singa_jax import sonnx  # noqa: E402

pytestmark = pytest.mark.usefixtures("eval_mode")  # conftest: autograd.training = False
two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two JAX devices (run "
                                 "with XLA_FLAGS=--xla_force_host_platform_device_count=2)")


def mlp_bn(rng):
    """Gemm -> BatchNormalization -> Relu -> Gemm, batch symbolic."""
    w = {"w1": 0.5 * rng.standard_normal((6, 8)), "b1": 0.1 * rng.standard_normal(8),
         "scale": 1 + 0.1 * rng.standard_normal(8), "bias": 0.1 * rng.standard_normal(8),
         "mean": 0.1 * rng.standard_normal(8), "var": 1 + 0.2 * rng.random(8),
         "w2": 0.5 * rng.standard_normal((8, 3)), "b2": 0.1 * rng.standard_normal(3)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "scale", "bias", "mean", "var"], ["n"],
                              momentum=0.9),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"])]
    g = helper.make_graph(nodes, "mlp_bn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["n", 3])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    # (with opset 17's IR version: make_model alone writes onnx's newest, which an older
    # onnxruntime refuses -- 1.30 on a GPU machine could not load IR 14)
    opsets = [helper.make_opsetid("", 17)]
    return helper.make_model(g, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets))


def ort_run(m, x):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def on(t, dev):
    return t.array.devices() == {dev.jax_device}


@two_devices
def test_rep_follows_its_tensor_inputs_device(rng):
    d0, d1 = device.create_cpu_devices(2)
    m = mlp_bn(rng)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    want = ort_run(m, x)
    rep = sonnx.prepare(m, device=d0)
    # onnxruntime computes float32 products, ours are TF32 on a GPU by default
    np.testing.assert_allclose(rep.run([x])[0], want, **matmul_tolerance(1e-5, 1e-6))  # stays put
    assert all(on(p, d0) for p in rep.get_states().values())
    (y,) = rep.run([tensor.Tensor(data=x, device=d1)])  # the first run with Tensors: moves
    assert y.device is d1 and on(y, d1)
    np.testing.assert_allclose(tensor.to_numpy(y), want, **matmul_tolerance(1e-5, 1e-6))
    assert rep.dev is d1
    assert all(p.device is d1 and on(p, d1) for p in rep.get_states().values())
    # NumPy inputs now go to the model's device
    np.testing.assert_allclose(rep.run([x])[0], want, **matmul_tolerance(1e-5, 1e-6))


@two_devices
def test_rep_device_errors_name_the_devices(rng):
    d0, d1 = device.create_cpu_devices(2)
    m = mlp_bn(rng)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    two = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add",
                            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
                             for n in "ab"], [helper.make_tensor_value_info(
                                 "y", TensorProto.FLOAT, [2])])
    add = sonnx.prepare(helper.make_model(two, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(ValueError, match=r"Tensor inputs are on different devices: 'a' on "
                                         r"Device\(cpu:0\), 'b' on Device\(cpu:1\)"):
        add.run([tensor.Tensor(data=np.ones(2, np.float32), device=d0),
                 tensor.Tensor(data=np.ones(2, np.float32), device=d1)])
    rep = sonnx.prepare(m)
    rep.run([tensor.Tensor(data=x, device=d1)])
    with pytest.raises(ValueError, match=r"input 'x' is on Device\(cpu:0\), but the model's "
                                         r"weights are on Device\(cpu:1\)"):
        rep.run([tensor.Tensor(data=x, device=d0)])
    assert rep.dev is d1 and all(on(p, d1) for p in rep.get_states().values())


def _fine_tune(m, x, y, dev, use_graph):
    net = Classifier(m)
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    tx, ty = tensor.Tensor(data=x, device=dev), tensor.Tensor(data=y, device=dev)
    net.compile([tx], is_train=True, use_graph=use_graph)
    losses = [tensor.to_numpy(net(tx, ty)).item() for _ in range(5)]
    net.eval()
    out = net(tx)
    return net, losses, out


@two_devices
@pytest.mark.parametrize("use_graph", [False, True])
def test_sonnx_model_fine_tunes_on_the_inputs_device(use_graph, rng):
    d0, d1 = device.create_cpu_devices(2)
    m = mlp_bn(rng)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)]
    _, want_losses, want_out = _fine_tune(m, x, y, d0, use_graph)
    net, losses, out = _fine_tune(m, x, y, d1, use_graph)
    assert losses[-1] < losses[0] - 0.1, losses
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert out.device is d1 and on(out, d1)
    np.testing.assert_allclose(tensor.to_numpy(out), tensor.to_numpy(want_out), rtol=1e-5,
                               atol=1e-6)
    # parameters, batch-norm statistics and the optimizer's slots all live on device 1
    assert all(t.device is d1 and on(t, d1) for t in net.get_states().values())
    assert not np.allclose(tensor.to_numpy(net.get_states()["mean"]),
                           numpy_helper.to_array(m.graph.initializer[4]))


def test_rep_follows_device_1_in_a_fresh_two_device_process(run_on_two_host_devices):
    """The eager case again, whatever devices this process has."""
    run_on_two_host_devices("""
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from singa_jax import device, sonnx, tensor
d0, d1 = device.create_cpu_devices(2)
w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
                      initializer=[numpy_helper.from_array(w, "w")])
rep = sonnx.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
x = np.ones((2, 3), np.float32)
(y,) = rep.run([tensor.Tensor(data=x, device=d1)])
assert y.array.devices() == {d1.jax_device}, y.array.devices()
np.testing.assert_allclose(tensor.to_numpy(y), x @ w, rtol=1e-6)
print("OK")
""")
