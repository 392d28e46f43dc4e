"""The first step: ``Model.compile()`` compiles no program per layer, graph mode's first training
call traces and compiles once, and ``Model.compile_step`` compiles a step ahead.

* compile() lowers no XLA program: a fresh process initialising a model compiles nothing (key
  splits on the host, bit for bit as ``jax.random``; parameters drawn by NumPy on the host);
  its parameters and the device key it leaves are those of an eager first call;
* graph mode's first training call traces once and compiles once: the optimizer's slots, guard
  state, scheduled values and float16 loss scale are state before the trace; a slot the step
  does not use is dropped again; the first steps equal eager ones (1e-6 where float32 products
  are float32; two programs' TF32 roundings apart on a GPU: backend_precision);
* ``compile_step`` compiles ``train_one_batch`` for given arguments without changing any state,
  after which the first call runs the compiled program; a step that builds a layer inside it
  cannot be compiled ahead and is left to its first call; compile() in evaluation mode compiles
  ``forward`` for its placeholders.
"""
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from backend_precision import two_programs_tolerance
from singa_jax import autograd, device, layer, model, opt, tensor


def counts(net, *keys):
    """Graph mode's counts of ``net`` (``Model.graph_stats``) for ``keys``."""
    stats = net.graph_stats()
    return tuple(stats[k] for k in keys)


class Net(model.Model):
    """conv (a 4x2x3x3 weight) -> batch norm -> relu -> linear (a 144x70000-element weight:
    two random chunks) -> an unused linear layer (its parameters get no gradient)."""

    def __init__(self, classes: int = 3, wide: int = 70000 // 144 + 1):
        super().__init__()
        self.conv = layer.Conv2d(4, 3, padding=1, bias=False)
        self.bn = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(wide)
        self.out = layer.Linear(classes)
        self.spare = layer.Linear(2)  # never in the loss: no gradient, no slot
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.out(self.fc(self.flatten(self.relu(self.bn(self.conv(x))))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


IN = (4, 2, 6, 6)


def data(step, batch=IN[0]):
    rng = np.random.default_rng(70 + step)
    x = tensor.from_numpy(rng.standard_normal((batch,) + IN[1:]).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 3, batch).astype(np.int32))
    return x, y


def build(make_opt, use_graph, compile_=True, autocast=None):
    device.get_default_device().SetRandSeed(11)
    net = Net()
    net.spare.initialize(tensor.Tensor((2, 5)))
    net.set_optimizer(make_opt())
    if compile_:
        net.compile([tensor.Tensor(IN)], is_train=True, use_graph=use_graph, autocast=autocast)
    return net


def states(net):
    out = {k: np.asarray(t.array) for k, t in net.get_states().items()}
    out.update({f"opt/{k}": np.asarray(t.array) for k, t in net.optimizer.get_states().items()})
    out["key"] = np.asarray(device.get_default_device().key)
    return out


def assert_close(a, b, tol=1e-6):
    """States ``a`` and ``b`` equal to ``tol`` (relative and absolute): the float32 tolerance of
    two programs computing the same steps, widened where float32 products are reduced-precision
    (TF32 on a GPU: backend_precision.two_programs_tolerance); ``tol=0``: identical."""
    assert a.keys() == b.keys()
    close = two_programs_tolerance(tol, tol) if tol else {"rtol": 0, "atol": 0}
    for k in a:
        np.testing.assert_allclose(np.asarray(a[k], np.float64), np.asarray(b[k], np.float64),
                                   **close, err_msg=k)


@pytest.fixture(autouse=True)
def restore_training_flag():
    prev = autograd.training
    yield
    autograd.training = prev


# --- compile(): no program per layer, the eager parameters ---------------------------------------
_FRESH_PROCESS = textwrap.dedent("""
    import json, logging, sys
    import jax
    from singa_jax import device, layer, model, tensor
    d = device.get_default_device()
    d.SetRandSeed(11)
    names = []
    class Grab(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if msg.startswith("Compiling "):
                names.append(msg.split()[1])
    logging.getLogger("jax").addHandler(Grab())
    jax.config.update("jax_log_compiles", True)
    sys.path.insert(0, sys.argv[1])
    from test_first_step import Net
    Net().compile([tensor.Tensor((4, 2, 6, 6))], is_train=True, use_graph=True)
    first = list(names)
    del names[:]
    Net(classes=5, wide=300).compile([tensor.Tensor((3, 2, 5, 5))], is_train=True,
                                     use_graph=True)
    second = list(names)
    del names[:]
    jax.jit(lambda v: v * 3.0 + 1.0)(jax.numpy.ones(3))  # the listener sees a compile
    print(json.dumps([first, second, names]))
""")


def test_compile_in_a_fresh_process_compiles_nothing():
    """Not even a process's first compile() compiles a program: keys are split and parameters
    drawn on the host. Before, the first compiled the shared random draw (and its scalar
    conversions), earlier still key splits (iota, split, unstack) and chunk folds -- and on
    GPU/TPU every compile() a fill and a cut per parameter shape."""
    env = dict(os.environ, SINGA_JAX_COMPILATION_CACHE="0", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, os.path.dirname(__file__)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second, control = json.loads(proc.stdout.strip().splitlines()[-1])
    assert control, "the log listener saw no compile: it cannot tell that none happened"
    assert first == [] and second == [], (first, second)


def test_compile_gives_the_parameters_and_key_of_an_eager_first_call():
    """compile() initialises abstractly, an eager first call (no compile) concretely: both
    split keys and draw on the host, bit for bit the same."""
    compiled = build(lambda: opt.SGD(lr=0.1), use_graph=True)
    key_after_compile = np.asarray(device.get_default_device().key)
    eager = build(lambda: opt.SGD(lr=0.1), use_graph=False, compile_=False)
    autograd.training = False
    eager.forward(tensor.Tensor(IN))  # the layers initialise on their first (eager) call
    assert eager.fc.W.size() > 65536  # large (the device sampler would draw it in chunks)
    a, b = compiled.get_params(), eager.get_params()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k].array), np.asarray(b[k].array), err_msg=k)
    np.testing.assert_array_equal(key_after_compile, np.asarray(device.get_default_device().key))


# --- graph mode: one trace, one compilation ------------------------------------------------------
OPTIMIZERS = {
    "sgd_momentum": lambda: opt.SGD(lr=0.1, momentum=0.9),
    "adam_decay": lambda: opt.Adam(lr=opt.ExponentialDecay(0.01, 2, 0.5)),
    "rmsprop": lambda: opt.RMSProp(lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_first_training_call_traces_once_and_equals_eager(name):
    eager, graph = build(OPTIMIZERS[name], False), build(OPTIMIZERS[name], True)
    runs = []
    for net in (eager, graph):
        device.get_default_device().SetRandSeed(5)
        losses = [float(net(*data(s))[1].array[0]) for s in range(3)]
        runs.append((losses, states(net)))
    np.testing.assert_allclose(runs[1][0], runs[0][0], **two_programs_tolerance(1e-6))
    assert_close(runs[0][1], runs[1][1])
    assert counts(graph, "traces", "compiles", "programs") == (1, 1, 1)
    # the unused layer's parameters have no slot, as after eager steps
    assert not any("spare" in k for k in graph.optimizer.get_states())


def test_float16_loss_scale_is_state_of_the_first_trace():
    eager = build(OPTIMIZERS["sgd_momentum"], False, autocast="float16")
    graph = build(OPTIMIZERS["sgd_momentum"], True, autocast="float16")
    runs = []
    for net in (eager, graph):
        device.get_default_device().SetRandSeed(5)
        losses = [float(net(*data(s))[1].array[0]) for s in range(2)]
        runs.append((losses, states(net)))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-3)
    assert "opt/loss_scale" in runs[1][1]
    np.testing.assert_array_equal(runs[1][1]["opt/loss_scale"], runs[0][1]["opt/loss_scale"])
    assert counts(graph, "traces", "compiles") == (1, 1)


def test_a_failed_first_trace_keeps_no_state_made_ahead():
    class Branching(Net):
        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = self.loss(out, y)
            if float(loss.array[0]) > 0:  # a Python branch on a value: not compilable
                self.optimizer(loss)
            return out, loss

    device.get_default_device().SetRandSeed(11)
    net = Branching()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([tensor.Tensor(IN)], is_train=True, use_graph=True)
    before = states(net)
    with pytest.raises(model.GraphModeError):
        net(*data(0))
    after = states(net)
    assert before.keys() == after.keys() and not any(k.startswith("opt/moments") for k in after)


# --- compile_step: a step compiled ahead ---------------------------------------------------------
def test_compile_step_compiles_without_changing_state_and_the_first_call_runs_it():
    eager = build(OPTIMIZERS["sgd_momentum"], False)
    graph = build(OPTIMIZERS["sgd_momentum"], True)
    x, y = data(0)
    before = states(graph)
    assert graph.compile_step(x, y) is True
    assert counts(graph, "traces", "compiles") == (1, 1)
    after = states(graph)
    for k in before:  # nothing changed; the slots made ahead are zeros until the first step
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    assert all(not v.any() for k, v in after.items() if k.startswith("opt/moments"))
    results = []
    for net in (eager, graph):
        device.get_default_device().SetRandSeed(5)
        results.append([float(net(*data(s))[1].array[0]) for s in range(2)])
    assert counts(graph, "traces", "compiles") == (1, 1)  # the call ran the program
    np.testing.assert_allclose(results[1], results[0], **two_programs_tolerance(1e-6))
    assert_close(states(eager), states(graph))


def test_compile_step_of_a_step_that_builds_a_layer_is_left_to_the_first_call():
    class LateLayer(Net):
        def train_one_batch(self, x, y):
            if not hasattr(self, "head"):
                self.head = layer.Linear(3)  # built (and initialised) inside the step
            out = self.head(self.forward(x))
            loss = self.loss(out, y)
            self.optimizer(loss)
            return out, loss

    nets = []
    for use_graph in (False, True):
        device.get_default_device().SetRandSeed(11)
        net = LateLayer()
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        net.compile([tensor.Tensor(IN)], is_train=True, use_graph=use_graph)
        nets.append(net)
    eager, graph = nets
    assert graph.compile_step(*data(0)) is False
    for t in graph.get_states().values():  # no tracer left in the model
        assert not isinstance(t.array, jax.core.Tracer)
    results = []
    for net in (eager, graph):
        device.get_default_device().SetRandSeed(5)
        results.append([float(net(*data(s))[1].array[0]) for s in range(2)])
    np.testing.assert_allclose(results[1], results[0], **two_programs_tolerance(1e-6))
    assert_close(states(eager), states(graph))


def test_compile_step_needs_graph_mode():
    net = build(OPTIMIZERS["sgd_momentum"], False)
    with pytest.raises(RuntimeError, match="graph mode"):
        net.compile_step(*data(0))


def test_evaluation_compile_compiles_forward_for_the_placeholders():
    device.get_default_device().SetRandSeed(11)
    net = Net()
    net.compile([tensor.Tensor(IN)], is_train=False, use_graph=True)
    assert counts(net, "traces", "compiles") == (1, 1)
    x, _ = data(3)
    out = np.asarray(net(x).array)
    assert counts(net, "traces", "compiles") == (1, 1)  # ran the program
    net.graph(False)
    np.testing.assert_allclose(out, np.asarray(net(x).array),
                               **two_programs_tolerance(1e-6, 1e-6))


