"""Seeing what a run does: SINGA's time profiling, traces with the model's names, compile
explanations, the run summary and anomaly detection (singa_jax.debug, Device.SetVerbosity).

Times are read on XLA:CPU (the tests' backend); their bounds are wide because the suite runs
two workers on two cores."""
import glob
import logging
import os
import re
import statistics
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from singa_jax import autograd, debug, device, layer, model, opt, tensor
from test_long_runs import _Deep as Deep12

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


class MLP(model.Model):
    def __init__(self, hidden=16, classes=3, read=False):
        super().__init__()
        self.fc1 = layer.Linear(hidden)
        self.relu = layer.ReLU()
        self.fc2 = layer.Linear(classes)
        self.loss = layer.SoftMaxCrossEntropy()
        self.read = read

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        if self.read:
            tensor.to_numpy(out)  # a host read inside the step
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _batch(dev, n, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = tensor.from_numpy(rng.standard_normal((n, features)).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, classes, n).astype(np.int32))
    x.to_device(dev)
    y.to_device(dev)
    return x, y


def _model(dev, graph, x, **kwargs):
    m = MLP(**kwargs)
    m.set_optimizer(opt.SGD(0.01))
    m.compile([x], is_train=True, use_graph=graph)
    return m


def _params(m):
    return {k: tensor.to_numpy(v).copy() for k, v in m.get_params().items()}


# --- SINGA's time profiling ---------------------------------------------------------------------
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_verbosity_2_times_each_operation_and_adds_up_to_the_step(graph, capsys):
    """A compute-bound MLP: the operations' device times per step add up to roughly the
    measured step (a profiler that lost or double counted operations would not)."""
    dev = device.get_default_device()
    x, y = _batch(dev, 512, 784, 10)
    m = _model(dev, graph, x, hidden=1024, classes=10)
    for _ in range(3):  # compiled, warm
        tensor.to_numpy(m(x, y)[1])
    times = []
    for _ in range(5):
        start = time.perf_counter()
        tensor.to_numpy(m(x, y)[1])
        times.append(time.perf_counter() - start)
    step = statistics.median(times)
    dev.SetVerbosity(2)
    dev.SetSkipIteration(1)
    for _ in range(4):
        m(x, y)
    dev.PrintTimeProfiling()
    printed = capsys.readouterr().out
    profile = dev.time_profile()
    assert profile["iterations"] == 3 and profile["source"].startswith("device")
    lines = printed.strip().splitlines()
    assert lines[0] == "Time Profiling:"
    ops = [re.fullmatch(r"OP_ID(\d+)\. (.+) : (\S+) sec", line) for line in lines[1:]]
    assert all(ops), lines
    assert [int(o.group(1)) for o in ops] == list(range(len(ops)))
    labels = " ".join(o.group(2) for o in ops)
    for name in ("fc1/Matmul", "fc2/Matmul", "(backward)", "update"):
        assert name in labels
    total = sum(float(o.group(3)) for o in ops)
    assert 0.25 * step < total < 2.5 * step, (total, step, times)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_verbosity_1_prints_forward_backward_and_update(graph, capsys):
    dev = device.get_default_device()
    x, y = _batch(dev, 256, 512, 10)
    m = _model(dev, graph, x, hidden=512, classes=10)
    dev.SetVerbosity(1)
    dev.SetSkipIteration(2)
    for _ in range(8):  # 6 profiled: a step's times are averaged, so one preempted op is diluted
        m(x, y)
    dev.PrintTimeProfiling()
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "Time Profiling:"
    found = {}
    for line in out[1:]:
        what, seconds = re.fullmatch(r"(.+) : (\S+) sec", line).groups()
        found[what] = float(seconds)
    assert {"Forward Propagation Time", "Backward Propagation Time",
            "Parameter Update Time"} <= set(found)
    # each category holds what ran in it: two 256x512x512-sized products forward, four
    # backward, and an update touching each weight once (the margins are several-fold; loose
    # here because the suite's two workers share two cores)
    assert min(found.values()) > 0
    assert found["Forward Propagation Time"] + found["Backward Propagation Time"] > \
        found["Parameter Update Time"]
    assert dev.time_profile()["iterations"] == 6


def test_verbosity_0_profiles_nothing_and_skipped_steps_are_not_profiled(capsys):
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = _model(dev, False, x)
    for _ in range(3):
        m(x, y)
    assert dev.time_profile()["iterations"] == 0
    dev.SetVerbosity(2)
    dev.SetSkipIteration(5)
    for _ in range(3):
        m(x, y)
    assert dev.time_profile()["iterations"] == 0
    dev.PrintTimeProfiling()
    assert "no training step profiled yet (3 skipped" in capsys.readouterr().out


def test_time_profiling_settings_are_checked():
    dev = device.get_default_device()
    with pytest.raises(ValueError, match=r"Device.SetVerbosity: verbosity must be 0 to 3, got 7"):
        dev.SetVerbosity(7)
    with pytest.raises(TypeError, match="SetSkipIteration: skip must be an int, got str"):
        dev.SetSkipIteration("5")
    assert dev.verbosity() == 0 and dev.skip_iteration() == 5


# --- traces ---------------------------------------------------------------------------------------
def _trace_events(folder):
    files = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    assert len(files) == 1, files
    data = jax.profiler.ProfileData.from_file(files[0])
    return [e.name for p in data.planes for line in p.lines for e in line.events]


def test_a_captured_trace_names_layers_operators_and_steps(tmp_path):
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = _model(dev, False, x)
    with debug.trace(str(tmp_path), skip=2, steps=3) as capture:
        for _ in range(8):
            m(x, y)
    assert (capture.calls, capture.recorded) == (8, 3)
    names = _trace_events(tmp_path)
    for name in ("fc1", "fc1/Matmul", "fc1/AddBias", "relu/ReLU", "fc2/Matmul",
                 "loss/SoftMaxCrossEntropy", "update (SGD)"):
        assert name in names, name
    assert names.count("MLP.train_one_batch") == 3  # one step annotation per recorded call


def test_graph_mode_programs_carry_the_layer_and_operator_names():
    """The compiled step's metadata names its operations; the time profile reads them."""
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = _model(dev, True, x)
    dev.SetVerbosity(2)
    dev.SetSkipIteration(1)
    for _ in range(2):
        m(x, y)
    labels = " ".join(label for label, _ in dev.time_profile()["ops"])
    for name in ("fc1/Matmul", "relu/ReLU", "(backward)", "update"):
        assert name in labels


def test_trace_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="debug.trace: steps must be an int >= 0"):
        debug.trace(str(tmp_path), steps=-1)
    with pytest.raises(TypeError, match="log_dir must be a folder path"):
        debug.trace(3)


# --- why it compiled --------------------------------------------------------------------------
def _growing_batches(m, dev, steps, start=8):
    for i in range(steps):
        m(*_batch(dev, start + i, 5, 3, seed=i))


def test_an_eager_loop_whose_shapes_change_every_step_is_reported(caplog):
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = _model(dev, False, x)
    with pytest.warns(debug.RecompilationWarning, match="compiled on each of the last 10") as w:
        _growing_batches(m, dev, 12)
    assert os.path.basename(__file__) in w[0].filename  # pointed at the user's line
    with caplog.at_level(logging.WARNING, logger="singa_jax.compiles"), \
            debug.explain_compiles():
        m(*_batch(dev, 30, 5, 3))
    log = debug.compile_log()
    fc1 = [r for r in log if r["layer"] == "fc1" and "Matmul" in r["what"]]
    assert fc1 and "float32[30,5]" in fc1[0]["cause"]
    assert fc1[0]["kind"] == "eager kernel"
    assert os.path.basename(__file__) in fc1[0]["frame"]
    assert any("in layer fc1" in r.message and "float32[30,5]" in r.message
               for r in caplog.records)


def test_a_graph_mode_loop_whose_shapes_change_every_step_is_reported_with_the_cause():
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = _model(dev, True, x)
    with pytest.warns(RuntimeWarning, match=r"argument 0 \(input\): f32\[11,5\] -> f32\[12,5\]"):
        _growing_batches(m, dev, 5)
    with debug.explain_compiles():
        m(*_batch(dev, 40, 5, 3))
    steps = [r for r in debug.compile_log() if r["kind"] == "graph step"]
    assert steps[-1]["what"] == "MLP.train_one_batch"
    assert "f32[12,5] -> f32[40,5]" in steps[-1]["cause"]


def test_a_host_read_inside_a_step_is_reported_as_the_replay_breaker(caplog):
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = _model(dev, False, x, read=True)
    with caplog.at_level(logging.WARNING, logger="singa_jax.compiles"), \
            debug.explain_compiles():
        for _ in range(3):
            m(x, y)
    read_line = next(i for i, line in enumerate(open(__file__), 1)
                     if "a host read inside the step" in line)
    where = f"{os.path.basename(__file__)}:{read_line}"
    assert any("ended early" in r.message and where in r.message for r in caplog.records)
    assert debug.stats()["replay"]["reads"] >= 1


def test_the_switch_in_the_environment_explains_compiles(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        "import numpy as np\n"
        "from singa_jax import tensor, autograd\n"
        "x = tensor.from_numpy(np.ones((3, 4), np.float32))\n"
        "print(tensor.to_numpy(autograd.relu(x)).sum())\n")
    env = dict(os.environ, SINGA_JAX_EXPLAIN_COMPILES="1", SINGA_JAX_COMPILATION_CACHE="0")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert re.search(r"singa_jax compiled \(eager kernel\) kernel '\w+' of ReLU", done.stderr)
    assert f"{script}:4" in done.stderr


# --- the run's summary ------------------------------------------------------------------------
def test_stats_count_compilations_replay_and_graph_memory(capsys):
    dev = device.get_default_device()
    x, y = _batch(dev, 13, 7, 3)  # (shapes no other test compiles for)
    debug.reset_stats()
    eager = _model(dev, False, x)
    graph = _model(dev, True, x)
    for _ in range(4):
        eager(x, y)
        graph(x, y)
    s = debug.stats()
    assert s["steps"] >= 8
    assert s["compilations"]["eager kernel"]["count"] > 0
    assert s["compilations"]["graph step"]["count"] >= 1
    assert s["compilations"]["graph step"]["seconds"] > 0
    assert s["graph_steps"]["MLP.train_one_batch"]["argument_bytes"] > 0
    assert s["replay"]["recorded"] > 0
    debug.print_stats()
    out = capsys.readouterr().out
    assert "graph step MLP.train_one_batch" in out and "eager replay:" in out


def test_stats_give_the_memory_of_eager_replay_programs(capsys):
    dev = device.get_default_device()
    x, y = _batch(dev, 11, 5, 3)  # (shapes no other test compiles for)
    m = Deep12()  # (enough operators that eager replay records the step)
    m.set_optimizer(opt.SGD(0.01, momentum=0.9))
    m.compile([x], is_train=True, use_graph=False)
    debug.reset_stats()
    for _ in range(4):  # recorded, then compiled when the sequence recurs, then replayed
        m(x, y)
    programs = debug.stats()["replay_programs"]
    assert programs, debug.stats()["replay"]
    step = max(programs, key=lambda p: p["kernels"])
    assert step["kernels"] > 3 * len(m.blocks) and step["device"] == str(dev)
    params = sum(v.size() * 4 for v in m.get_params().values())
    # the training step's program reads every parameter and the batch and returns every new
    # parameter (and momentum slot): XLA's own sizes of its inputs and outputs say so
    assert step["argument_bytes"] >= params + x.size() * 4 + y.size() * 4
    assert step["output_bytes"] >= params
    assert step["temp_bytes"] >= 0 and step["alias_bytes"] == 0  # (replay donates nothing)
    debug.print_stats()
    assert f"eager replay program of {step['kernels']} kernels" in capsys.readouterr().out
    debug.reset_stats()
    assert debug.stats()["replay_programs"] == []


# --- anomaly detection ------------------------------------------------------------------------
class NaNGradient(autograd.Operator):
    """Identity forward; a NaN gradient backward."""
    takes_arrays = True

    def forward(self, x):
        return x

    def backward(self, dy):
        return dy * float("nan")


class Broken(layer.Layer):
    def forward(self, x):
        return NaNGradient()(x)[0]


class WithBrokenLayer(MLP):
    def __init__(self):
        super().__init__()
        self.bad = Broken()

    def forward(self, x):
        return self.fc2(self.relu(self.bad(self.fc1(x))))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_detect_anomaly_names_the_layer_whose_backward_made_a_nan(graph):
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    m = WithBrokenLayer()
    sgd = opt.SGD(0.1, momentum=0.9)
    m.set_optimizer(sgd)
    m.compile([x], is_train=True, use_graph=graph)
    m(x, y)  # (NaN gradients: the optimizer's guard skips the update)
    before = _params(m)
    states = {k: tensor.to_numpy(v).copy() for k, v in sgd.get_states().items()}
    with autograd.detect_anomaly(), pytest.raises(autograd.AnomalyError) as e:
        m(x, y)
    assert e.value.phase == "backward" and e.value.layer == "bad"
    message = str(e.value)
    assert "backward of NaNGradient" in message and "in layer 'bad'" in message
    assert "shape (8, 16) float32: 128 NaN, 0 inf of 128 values" in message
    assert "fc1/Matmul" in message and "bad/NaNGradient" in message  # the chain
    after = _params(m)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert all(np.array_equal(v, tensor.to_numpy(sgd.get_states()[k]))
               for k, v in states.items())


def test_detect_anomaly_names_the_forward_operator_and_its_layer():
    dev = device.get_default_device()

    class LogOfInput(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(4)

        def forward(self, x):
            return autograd.log(self.fc(x))

    x, _ = _batch(dev, 8, 5, 3)
    m = LogOfInput()
    m.compile([x], is_train=False, use_graph=False)
    m.eval()
    with autograd.detect_anomaly():
        with pytest.raises(autograd.AnomalyError, match=r"forward of Log .* outside any named Layer"
                                                       r".* NaN") as e:
            m(x)
    assert e.value.phase == "forward"
    assert "every input was finite" in str(e.value)
    assert "fc/AddBias" in str(e.value)


def test_detect_anomaly_in_a_plain_loop_stops_before_any_update():
    dev = device.get_default_device()
    x, y = _batch(dev, 8, 5, 3)
    fc = layer.Linear(3)
    bad = Broken()
    sgd = opt.SGD(0.1)
    autograd.training = True
    try:
        loss = autograd.softmax_cross_entropy(bad(fc(x)), y)
        before = {k: tensor.to_numpy(v).copy() for k, v in fc.get_params().items()}
        with autograd.detect_anomaly():
            assert autograd.is_anomaly_enabled()
            loss = autograd.softmax_cross_entropy(bad(fc(x)), y)
            with pytest.raises(autograd.AnomalyError, match="backward of NaNGradient"):
                sgd(loss)
        assert not autograd.is_anomaly_enabled()
    finally:
        autograd.training = False
    after = {k: tensor.to_numpy(v) for k, v in fc.get_params().items()}
    assert all(np.array_equal(before[k], after[k]) for k in before)
