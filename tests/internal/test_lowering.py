"""What a compiled step lowers to on each backend (custom calls, convolution forms). (This tier
imports singa_jax._src.)"""
import importlib
import importlib.util
import os
import re
import sys
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import device, layer, opt, tensor
from singa_jax._src.backend import conv as conv_cpu
from singa_jax._src.graph.layout import tensors_in
from singa_jax._src.graph.layout import StepLowering
from test_lowering import (  # noqa: F401 (shared helpers and fixtures)
    PLATFORMS, _CPU_ONLY_TARGET, cpu_only_targets, custom_call_targets)


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples")


BATCH = 2


# input side per examples/cnn model (None: the model's own, 28 for cnn); the smallest each allows
INPUT_SIZES = {"cnn": None, "resnet": 32, "xceptionnet": 35}


# ResNet-18 of the same module (the example's ResNet-50 has the same layer kinds, and its CPU
# compile before the export took minutes of CI's time)
CONSTRUCTORS = {"resnet": "resnet18"}


def convolutions(module_text: str) -> set:
    """(result shape, feature_group_count) of every ``stablehlo.convolution`` in the module."""
    found = set()
    for line in module_text.splitlines():
        if "stablehlo.convolution" not in line:
            continue
        groups = int(re.search(r"feature_group_count = (\d+)", line).group(1))
        result = re.search(r"-> tensor<([\dx]+)x\w+>", line).group(1)
        found.add((tuple(int(d) for d in result.split("x")), groups))
    return found


def _avals(arrays) -> list:
    return [(tuple(a.shape), np.dtype(a.dtype)) for a in arrays]


# --- the example models ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def examples():
    """examples/cnn/train_cnn.py and examples/rnn/char_rnn.py as modules (each puts its own
    folders on sys.path; the path and the modules imported from examples/ are restored after)."""
    saved_path = list(sys.path)
    try:
        yield {name: _load(script) for name, script in
               (("train_cnn", "cnn/train_cnn.py"), ("char_rnn", "rnn/char_rnn.py"))}
    finally:
        sys.path[:] = saved_path
        for name, module in list(sys.modules.items()):
            location = getattr(module, "__file__", None)
            if isinstance(location, str) and os.path.abspath(location).startswith(EXAMPLES):
                del sys.modules[name]


def _load(script: str):
    spec = importlib.util.spec_from_file_location(
        "lowering_" + script.replace("/", "_")[:-3], os.path.join(EXAMPLES, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cnn_step(train_cnn, name: str):
    """Build ``name`` as train_cnn.py does (its MODELS table, SGD with momentum and weight decay,
    compile in graph mode) and train one step; returns the model, its optimizer, the batch and
    the step's results."""
    module_name, constructor, _ = train_cnn.MODELS[name]
    constructor = CONSTRUCTORS.get(name, constructor)
    factory = getattr(importlib.import_module(module_name), constructor)
    channels = 1 if name == "cnn" else 3
    kwargs = dict(num_channels=channels, num_classes=10)
    if INPUT_SIZES[name] is not None:
        kwargs["input_size"] = INPUT_SIZES[name]
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    net = factory(**kwargs)
    tx = tensor.Tensor((BATCH, channels, net.input_size, net.input_size), dev)
    ty = tensor.Tensor((BATCH,), dev, tensor.int32)
    tx.gaussian(0.0, 1.0)
    ty.copy_from_numpy(np.arange(BATCH, dtype=np.int32))
    sgd = opt.SGD(lr=train_cnn.SINGA_LR, momentum=0.9, weight_decay=1e-5)
    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=True, sequential=False)
    results = net(tx, ty, "plain", None)
    return net, sgd, [tx, ty], results


def _char_rnn_steps(char_rnn):
    """char_rnn.py's model and loop (no compile(): its layers build on the first call, a one-off
    program, so a second step runs the program kept for training)."""
    vocab, hidden, seq_length = 11, 8, 4
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    net = char_rnn.CharRNN(vocab, hidden, lr=0.5)
    inputs, labels = char_rnn.placeholders(BATCH, seq_length, vocab, dev)
    rows = np.arange(BATCH * (seq_length + 1), dtype=np.int32).reshape(BATCH, -1) % vocab
    char_rnn.convert(rows, vocab, inputs, labels)
    net.graph(True, False)
    net.train()
    for _ in range(2):
        results = net(inputs, labels)
        net.reset_states(dev)
    return net, net.optimizer, [*inputs, labels], results


def _step_program(net):
    """The one training-step program the model's runner keeps."""
    programs = [p for key, p in net._graph_runner.programs.items() if key[0] == "train_one_batch"]
    assert len(programs) == 1, f"expected one compiled training step, got {len(programs)}"
    return programs[0]


def _conv_layers(net) -> list:
    found, stack = [], [net]
    while stack:
        current = stack.pop()
        if isinstance(current, layer.Conv2d):
            found.append(current)
        stack.extend(current.__dict__.get("_layers", {}).values())
    return found


def _check_exported(net, optimizer, batch, results) -> str:
    """The checks every example's exported step passes; returns the module's text."""
    exported = net.export_step(platforms=PLATFORMS)
    assert exported.platforms == PLATFORMS
    text = exported.mlir_module()

    # nothing of this machine is baked in: no CPU-only kernel, no device, no placement
    assert not cpu_only_targets(text), cpu_only_targets(text)
    assert exported.nr_devices == 1
    assert all(s is None for s in exported.in_shardings_hlo + exported.out_shardings_hlo)
    for placement in ("mhlo.sharding", "memory_kind", "annotate_device_placement"):
        assert placement not in text, placement

    # the exported function is the compiled step: its state (parameters and momentum slots
    # donated, the rest read) and batch in; the new state, then the results (out, loss and the
    # value checks the step makes, see singa_jax._src.base.checks) out
    prog = _step_program(net)
    donated = [t.array for t in prog.donated] + [d.key for d in prog.donated_devices]
    read = [t.array for t in prog.read] + [d.key for d in prog.read_devices]
    assert _avals(exported.in_avals) == _avals(donated + read + [t.array for t in batch])
    new_state = ([t.array for t in prog.written] + [d.key for d in prog.written_devices]
                 + [t.array for t in prog.extra_out])
    assert _avals(exported.out_avals[:len(new_state)]) == _avals(new_state)
    result_avals = _avals(exported.out_avals[len(new_state):])
    out, loss = results
    assert result_avals[:2] == _avals([out.array, loss.array])
    assert len(result_avals) == sum(kind[0] in ("T", "A") for kind in prog.result_kinds)
    donated_ids = {id(t) for t in prog.donated}
    params = list(net.get_params().values())
    assert params and all(id(p) in donated_ids for p in params)
    slots = [t for t in tensors_in(optimizer.get_states()) if t.shape in {p.shape for p in params}]
    assert slots and all(id(t) in donated_ids for t in slots)  # the momentum buffers

    # every convolution layer convolves with XLA's convolution (its forward at least; the CPU
    # forms would be products or shifted slices), and no CPU form's function is in the module
    convs = convolutions(text)
    for conv in _conv_layers(net):
        h = conv.handle
        shape = (h.batchsize, h.num_filters, h.conv_height, h.conv_width)
        assert (shape, h.group) in convs, f"{conv.name}: no convolution to {shape}, {h.group}"
    assert "depthwise_convolution" not in text
    return text


# Xception's step takes minutes on 2 cores (-m slow); its depthwise convolution's lowering is
# checked below on its own
@pytest.mark.parametrize("name", ["cnn", "resnet",
                                  pytest.param("xceptionnet", marks=pytest.mark.slow)])
def test_cnn_example_step_lowers_for_gpu_and_tpu(examples, name):
    net, sgd, batch, results = _cnn_step(examples["train_cnn"], name)
    assert np.isfinite(tensor.to_numpy(results[1])).all()
    text = _check_exported(net, sgd, batch, results)
    assert _conv_layers(net) and "stablehlo.convolution" in text


def test_char_rnn_example_step_lowers_for_gpu_and_tpu(examples):
    net, optimizer, batch, results = _char_rnn_steps(examples["char_rnn"])
    assert np.isfinite(tensor.to_numpy(results[1])).all()
    _check_exported(net, optimizer, batch, results)


def test_an_spmd_step_refuses_to_export_with_a_clear_error(run_on_two_host_devices):
    """A DistOpt step over two devices compiles as one SPMD program (opt/spmd.py), which is not
    exported: the error says so instead of lowering a single-device program."""
    lowering = StepLowering(None, ([], [], []), "Net.train_one_batch")
    with pytest.raises(NotImplementedError, match="Net.train_one_batch runs as one SPMD"):
        lowering.export(PLATFORMS)
    run_on_two_host_devices("""
import numpy as np
from singa_jax import layer, model, opt, tensor
sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))  # before any Tensor, as SINGA's examples

class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss

net = Net()
net.set_optimizer(sgd)
x = tensor.from_numpy(np.ones((4, 3), np.float32))
y = tensor.from_numpy(np.zeros(4, np.int32))
net.compile([x], is_train=True, use_graph=True)
net(x, y)
try:
    net.export_step()
except NotImplementedError as e:
    assert "Net.train_one_batch runs as one SPMD program" in str(e), e
    print("OK")
""")


# --- the convolution kernel: its form is chosen when lowering ---------------------------------
@pytest.mark.parametrize("x_shape, w_shape, group", [
    ((2, 1, 12, 12), (4, 1, 5, 5), 1),    # one input channel: windows x kernel on CPU
    ((2, 8, 6, 6), (16, 8, 1, 1), 1),     # 1x1: a product on CPU
    ((2, 8, 6, 6), (8, 1, 3, 3), 8),      # depthwise: shifted slices on CPU
], ids=["one-channel", "1x1", "depthwise"])
def test_conv_kernel_takes_xla_convolution_on_gpu_and_tpu(x_shape, w_shape, group):
    """The forward and both gradients of autograd's convolution, lowered for GPU/TPU, are XLA
    convolutions; lowered for the CPU, the forward and the input gradient are the CPU forms."""
    stride, pads, dilation = (1, 1), ((1, 1), (1, 1)), (1, 1)

    def forward_backward(x, W, dy):
        y, pullback = jax.vjp(lambda x, W: conv_cpu.conv(x, W, stride, pads, dilation, group),
                              x, W)
        return y, pullback(dy)

    x = jax.ShapeDtypeStruct(x_shape, jnp.float32)
    W = jax.ShapeDtypeStruct(w_shape, jnp.float32)
    y_shape = jax.eval_shape(lambda x, W: conv_cpu.xla_conv(x, W, stride, pads, dilation, group),
                             x, W).shape
    dy = jax.ShapeDtypeStruct(y_shape, jnp.float32)

    def module(platforms):
        return jax.export.export(jax.jit(forward_backward), platforms=platforms)(x, W, dy)

    elsewhere = module(PLATFORMS)
    assert elsewhere.platforms == PLATFORMS
    text = elsewhere.mlir_module()
    shapes = {shape for shape, _ in convolutions(text)}
    assert (y_shape, group) in convolutions(text) and x_shape in shapes
    assert "depthwise_convolution" not in text and not custom_call_targets(text)

    on_cpu = {shape for shape, _ in convolutions(module(("cpu",)).mlir_module())}
    assert y_shape not in on_cpu and x_shape not in on_cpu
