"""Models exported by another framework (torch.onnx.export, built here: no downloads) run in
singa_jax.sonnx as in onnxruntime, and one of them fine-tunes."""
import io
import warnings

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from backend_precision import matmul_tolerance  # noqa: E402
from singa_jax import device, opt, tensor  # noqa: E402
from onnx_classifier import Classifier  # noqa: E402
from singa_jax import sonnx  # noqa: E402

nn = torch.nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 3))

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


class CNNBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
                                      nn.Conv2d(8, 8, 3, stride=2, padding=1, dilation=1),
                                      nn.BatchNorm2d(8), nn.LeakyReLU(0.1),
                                      nn.AvgPool2d(2, count_include_pad=False))
        self.fc = nn.Linear(8 * 2 * 2, 4)

    def forward(self, x):
        y = self.features(x)
        return self.fc(y.view(y.shape[0], -1))  # Shape/Gather/Unsqueeze/Concat/Reshape chain


class ResBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.down = nn.Sequential(nn.Conv2d(4, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        y = torch.relu(y + self.down(x))
        return nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)


class DepthwiseSeparable(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.bn = nn.BatchNorm2d(6)
        self.pw = nn.Conv2d(6, 12, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.t = nn.ConvTranspose2d(12, 4, 2, stride=2)

    def forward(self, x):
        y = nn.functional.relu6(self.bn(self.dw(x)))
        y = nn.functional.hardswish(self.pw(y))
        y = nn.functional.pad(self.up(y), (1, 1, 1, 1), mode="reflect")
        return torch.cat([self.t(y), self.t(y) * 0.5], dim=1)


def export(net, shape, opset=17):
    torch.manual_seed(0)
    for mod in net.modules():  # non-trivial batch-norm statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    net.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # do_constant_folding=False keeps BatchNormalization nodes (not folded into Conv)
        torch.onnx.export(net, (torch.randn(*shape),), buf, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
                          opset_version=opset, do_constant_folding=False, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


def ort_run(m, x):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


pytestmark = pytest.mark.usefixtures("eval_mode")  # conftest: autograd.training = False


@pytest.mark.parametrize("net, shape, opset", [
    (MLP, (2, 10), 17), (CNNBN, (2, 3, 16, 16), 11), (ResBlock, (2, 4, 8, 8), 17),
    (DepthwiseSeparable, (2, 6, 5, 5), 13)])
def test_torch_model_matches_onnxruntime(net, shape, opset, rng):
    m = export(net(), shape, opset)
    rep = sonnx.prepare(m)
    for batch in (shape[0], 3):  # the batch dimension is dynamic in the exported graph
        x = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], ort_run(m, x),  # ours: TF32 on a GPU
                                   **matmul_tolerance(1e-4, 1e-5))
    ops = {n.op_type for n in m.graph.node}
    if net is not MLP:
        assert "BatchNormalization" in ops


@pytest.mark.parametrize("where", [
    "default", pytest.param("cpu:1", marks=pytest.mark.skipif(
        len(jax.devices()) < 2, reason="needs two JAX devices (run with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=2)"))])
def test_torch_cnn_fine_tunes(where, rng):
    """On the default device (a GPU where there is one) and on host device 1 of two: prepare's
    weights start on the host device 0 and must follow the inputs (on a GPU host, inputs on
    the GPU met weights on the CPU: 'incompatible devices')."""
    dev = device.get_default_device() if where == "default" else device.create_cpu_devices(2)[1]
    m = export(CNNBN(), (2, 3, 16, 16))
    x = rng.standard_normal((6, 3, 16, 16)).astype(np.float32)
    labels = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1]]

    net = Classifier(m)
    net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    tx, ty = tensor.Tensor(data=x, device=dev), tensor.Tensor(data=labels, device=dev)
    net.compile([tx], is_train=True, use_graph=True)
    losses = [tensor.to_numpy(net(tx, ty)).item() for _ in range(6)]
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(t.array.devices() == {dev.jax_device} for t in net.get_states().values())
    assert set(net.get_params()) == {i.name for i in m.graph.initializer
                                     if not i.name.endswith(("running_mean", "running_var"))
                                     and i.data_type == onnx.TensorProto.FLOAT}
