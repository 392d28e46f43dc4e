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
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading

import jax
import numpy as np
import pytest

from backend_precision import two_programs_tolerance
from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax._src.backend import tiers as graph_tiers
from singa_jax._src.base import host_prng
from singa_jax._src.backend import xla_options


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


def test_host_key_operations_equal_jax_random():
    keys = [jax.random.PRNGKey(s) for s in (0, 1, 11, 2 ** 31 - 1)]
    keys.append(jax.device_put(np.array([0xFFFFFFFF, 0x12345678], np.uint32)))
    for key in keys:
        assert host_prng.supported(key)
        for got, want in zip(host_prng.split(key), jax.random.split(key)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        for i in (0, 1, 7, 2 ** 32 - 1):
            np.testing.assert_array_equal(np.asarray(host_prng.fold_in(key, i)),
                                          np.asarray(jax.random.fold_in(key, i)))
    assert not host_prng.supported(jax.random.key(0))  # a typed key: jax.random's own path


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


# --- tiered compilation: the first call runs a quickly compiled program ---------------------------
def _tiers_possible():
    """The quick options of the default backend (None: it has none, nothing to test)."""
    platform = jax.default_backend()
    return xla_options.quick_options(platform, xla_options.compile_options(
        platform, for_compile_time=False))


def _program(net):
    (prog,) = net._graph_runner.programs.values()
    return prog


def test_a_tiered_step_runs_quick_then_optimised_and_equals_a_step_compiled_once(
        tier_records):
    """With tiers forced (this suite compiles every program quickly: the optimised tier then
    takes the options it has without that flag), the first call runs the quick program while
    the optimised one compiles in the background; the call after it is ready runs it. The
    state the quick program wrote (donated buffers) carries over, a bad call in between
    changes nothing, a new batch size is a new (tiered) program and the old one still serves
    its own size: every loss and final state equals the same calls compiled once."""
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")
    bad_y = tensor.from_numpy(np.full((IN[0],), 7, np.int32))  # a class out of range (3)
    runs = []
    for mode in ("always", False):
        net = build(OPTIMIZERS["sgd_momentum"], True)
        losses = []
        with model.tiered_compilation(mode):
            losses.append(float(net(*data(0))[1].array[0]))
            prog = _program(net)
            quick = prog.compiled
            if mode:
                assert counts(net, "tiered", "compiles") == (1, 2)
                assert prog.pending is not None
                assert net._graph_runner.last_compile_options == _tiers_possible()
            net.finish_compiling()
            assert prog.pending is None
            assert (prog.compiled is not quick) == bool(mode)
            before = states(net)
            with pytest.raises(ValueError):
                net(data(1)[0], bad_y)
            assert_close(before, states(net), tol=0)
            losses += [float(net(*data(s))[1].array[0]) for s in (1, 2)]
            losses += [float(net(*data(s, batch=2))[1].array[0]) for s in (3, 4)]
            losses.append(float(net(*data(5))[1].array[0]))
        assert counts(net, "traces", "tiered") == (2, (2 if mode else 0))
        runs.append((losses, states(net)))
    np.testing.assert_allclose(runs[0][0], runs[1][0], **two_programs_tolerance(1e-5))
    assert_close(runs[0][1], runs[1][1], tol=1e-5)


@pytest.fixture
def tier_records(monkeypatch, tmp_path):
    """The records of programs compiled into the persistent cache go to a folder of this test
    (never the user's cache: a record there would decide another test's tiers)."""
    monkeypatch.setattr(graph_tiers, "_records_folder", lambda: str(tmp_path))
    return tmp_path


@contextlib.contextmanager
def _optimising():
    """Programs compiled for run time (this suite compiles them for compile time, when a
    step's own options are the quick ones and there are no tiers to choose)."""
    saved = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", saved)


def test_tiers_only_where_they_pay(monkeypatch, tier_records):
    """``True``: a step is compiled in tiers unless the quick tier would save it too little
    (this small Net: under MIN_SECONDS_SAVED), its own options are quick already (this suite's compile-time-first
    flag) or it is compiled ahead (``compile_step`` promises a first call at steady speed,
    even with tiers forced). ``"auto"`` (the default) also leaves out steps whose quick
    program would compete with the optimised compilation for a CPU's few cores; with cores
    to spare the quick program serves each call until the optimised one is ready, which the
    first call after that runs."""
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")

    def tiered(ahead=False, mode=True):
        for name in os.listdir(tier_records):  # no program recorded as cached yet
            os.remove(tier_records / name)
        net = build(OPTIMIZERS["sgd_momentum"], True)
        with model.tiered_compilation(mode):
            if ahead:
                assert net.compile_step(*data(0)) is True
            net(*data(0))
        net.finish_compiling()
        return net.graph_stats()["tiered"]

    with _optimising():
        assert tiered() == 0
        assert tiered(ahead=True, mode="always") == 0
    monkeypatch.setattr(graph_tiers, "MIN_SECONDS_SAVED", -1.0)  # this Net counts as large now
    assert tiered() == 0  # compile-time-first: its options are the quick ones
    with _optimising():
        assert tiered() == 1
        assert tiered(ahead=True) == 0
        platform = jax.default_backend()
        for cores in (10 ** 6, 1):
            monkeypatch.setattr(xla_options, "QUICK_STEPS_MIN_CPU_CORES", cores)
            competing = not xla_options.quick_steps_while_compiling(platform)
            assert tiered(mode="auto") == (0 if competing else 1)
        # cores to spare: the quick program serves the calls made while the optimised one
        # compiles (held back here until the second call has run); a call after it is ready
        # runs it
        for name in os.listdir(tier_records):
            os.remove(tier_records / name)
        gate = threading.Event()
        compile_optimised = graph_tiers.Pending._compile

        def held_back(self, lowered, after):
            assert gate.wait(120), "the test never released the optimised compilation"
            return compile_optimised(self, lowered, after)

        monkeypatch.setattr(graph_tiers.Pending, "_compile", held_back)
        net = build(OPTIMIZERS["sgd_momentum"], True)
        with model.tiered_compilation("auto"):
            net(*data(0))
            prog = _program(net)
            quick, pending = prog.compiled, prog.pending
            assert pending is not None and not pending.wait and pending.started
            net(*data(1))
            assert not pending.ready() and prog.compiled is quick and prog.pending is pending
            gate.set()
            pending.future.result()
            net(*data(2))
        assert prog.compiled is not quick and prog.pending is None


def test_the_saving_of_a_quick_tier_is_estimated_from_the_program():
    """What decides whether tiers pay: the program's operations (nested ones counted) and the
    bytes they output; more operations save more compile time, more bytes cost the slower
    quick program more."""
    inner = jax.jit(lambda v: jax.numpy.tanh(v) * 2)
    jaxpr = jax.make_jaxpr(lambda v: inner(v @ v) + 1)(np.ones((8, 8), np.float32)).jaxpr
    assert graph_tiers.program_size(jaxpr) == (4, 4 * 8 * 8 * 4)  # dot, tanh, mul, add
    platform = jax.default_backend()
    saving = xla_options.quick_tier_saving
    assert saving(platform, 2000, 10 ** 6) >= saving(platform, 1000, 10 ** 6)
    assert saving(platform, 1000, 10 ** 10) <= saving(platform, 1000, 10 ** 6)


def test_the_tiers_switch(monkeypatch):
    monkeypatch.delenv(graph_tiers.ENV, raising=False)
    assert graph_tiers.tiers_mode() == "auto"
    for setting, mode in (("0", False), ("off", False), ("1", True), ("always", "always"),
                          ("auto", "auto")):
        monkeypatch.setenv(graph_tiers.ENV, setting)
        assert graph_tiers.tiers_mode() == mode
    monkeypatch.setenv(graph_tiers.ENV, "0")
    with model.tiered_compilation(True):
        assert graph_tiers.tiers_mode() is True
        with model.tiered_compilation("always"):
            assert graph_tiers.tiers_mode() == "always"
    assert graph_tiers.tiers_mode() is False
    with pytest.raises(ValueError, match="tiered_compilation"):
        model.tiered_compilation("sometimes")


def test_a_program_recorded_in_the_persistent_cache_is_not_compiled_in_tiers(
        monkeypatch, tier_records):
    """A step whose optimised program a run compiled (in the background, or in the
    foreground) is recorded next to the persistent cache: the same step in a later run loads
    it instead of compiling a quick one first. Without a persistent cache nothing is
    recorded and the step is compiled in tiers."""
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")
    monkeypatch.setattr(graph_tiers, "MIN_SECONDS_SAVED", -1.0)  # this small Net counts as large

    def tiered():
        net = build(OPTIMIZERS["sgd_momentum"], True)
        net(*data(0))
        net.finish_compiling()
        return net.graph_stats()["tiered"]

    with _optimising(), model.tiered_compilation(True):
        assert [tiered(), tiered()] == [1, 0]
        assert len(os.listdir(tier_records)) == 1
        monkeypatch.setattr(graph_tiers, "_records_folder", lambda: None)
        assert [tiered(), tiered()] == [1, 1]


def test_a_failed_optimised_compile_leaves_the_quick_program_serving(monkeypatch,
                                                                   tier_records):
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")

    def fail(self, lowered, after):
        raise RuntimeError("no memory left for the optimised program")

    monkeypatch.setattr(graph_tiers.Pending, "_compile", fail)
    runs = []
    for mode in ("always", False):
        net = build(OPTIMIZERS["sgd_momentum"], True)
        with model.tiered_compilation(mode):
            losses = [float(net(*data(0))[1].array[0])]
            quick = _program(net).compiled
            if mode:
                with pytest.warns(RuntimeWarning, match="optimised compilation .* failed"):
                    net.finish_compiling()
                assert _program(net).compiled is quick and _program(net).pending is None
            losses += [float(net(*data(s))[1].array[0]) for s in (1, 2)]
        runs.append((losses, states(net)))
    np.testing.assert_allclose(runs[0][0], runs[1][0], **two_programs_tolerance(1e-5))
    assert_close(runs[0][1], runs[1][1], tol=1e-5)
