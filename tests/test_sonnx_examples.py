"""The example models (examples/cnn/model: SINGA's cnn, resnet, xceptionnet; examples/mlp)
exported to ONNX: onnxruntime and our importer both reproduce singa_jax's forward."""
import importlib
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from backend_precision import matmul_tolerance  # noqa: E402
from singa_jax import autograd, sonnx, tensor  # noqa: E402
from singa_jax.precision import float32_matmul_precision_scope  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _randomize_bn(m, rng):
    for name, v in m.get_states().items():
        if name.endswith("running_var"):
            v.data = np.abs(rng.standard_normal(v.shape)).astype(np.float32) + 0.5
        elif name.endswith("running_mean"):
            v.data = 0.1 * rng.standard_normal(v.shape).astype(np.float32)


def cnn_model(name: str):
    """examples/cnn/model/<name>.py, imported as the package module ``model.<name>`` the way
    train_cnn.py does (the modules use relative imports); sys.path and sys.modules restored."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    sys.path[:0] = [str(EXAMPLES / "cnn"), str(EXAMPLES)]
    try:
        return importlib.import_module(f"model.{name}")
    finally:
        sys.path[:] = saved_path
        for key in set(sys.modules) - saved_modules:
            if key == "model" or key.startswith("model.") or key.startswith("common"):
                del sys.modules[key]


def _build(which: str):
    if which == "cnn":
        return cnn_model("cnn").create_model(num_channels=1), (2, 1, 28, 28)
    if which == "mlp":
        return load("mlp/model.py", "ex_mlp").create_model(data_size=20, num_classes=4), (3, 20)
    if which == "resnet":
        return cnn_model("resnet").resnet18(num_channels=3, input_size=32), (2, 3, 32, 32)
    return cnn_model("xceptionnet").create_model(num_channels=3, input_size=99), (1, 3, 99, 99)


# Xception's eager forward and import compile ~150 kernels each: minutes on 2 cores (-m slow)
@pytest.mark.parametrize("which", ["cnn", "mlp", "resnet",
                                   pytest.param("xceptionnet", marks=pytest.mark.slow)])
def test_example_model_round_trip(which, rng):
    saved = autograd.training
    autograd.training = False
    try:
        m, shape = _build(which)
        x = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
        m.compile([x], is_train=False, use_graph=False)
        _randomize_bn(m, rng)
        y = m.forward(x)
        om = sonnx.to_onnx([x], [y])
        want = tensor.to_numpy(y)
        sess = ort.InferenceSession(om.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, {sess.get_inputs()[0].name: tensor.to_numpy(x)})[0]
        # onnxruntime computes float32 products, y's are TF32 on a GPU by default
        np.testing.assert_allclose(got, want, **matmul_tolerance(1e-5, 1e-5))
        # the importer against the forward: two singa_jax computations, equal in float32 (under
        # TF32 rounding flips grow through these deep networks' layers)
        with float32_matmul_precision_scope("float32"):
            want = tensor.to_numpy(m.forward(x))
            back = sonnx.prepare(om).run([tensor.to_numpy(x)])[0]
        np.testing.assert_allclose(back, want, rtol=1e-5, atol=1e-5)
    finally:
        autograd.training = saved
