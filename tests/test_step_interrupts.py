"""A training step interrupted by Ctrl-C, or failing out of device memory, leaves every state as
it was before the step or as the whole step leaves it -- never a mix, never a deleted array.

Ctrl-C is a real SIGINT, timed by the kernel (``signal.setitimer``) at delays spread over a
measured step, in graph mode and eagerly (op by op, and replayed as compiled programs). Each
interrupted model runs in lockstep with an uninterrupted one built from the same seed: the
interrupted step's state must equal, exactly, the state before the step or the reference's
state after it. Out of device memory is XLA's RESOURCE_EXHAUSTED: a real one (a step output
larger than any address space) and one injected into the compiled call, which, as XLA:CPU does,
consumes the buffers donated to it.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time

import jax
import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax.model import DeviceMemoryError

BATCH = (8, 1, 12, 12)
POINTS = 40  # interrupt delays per mode, spread from 0 to 1.2 step times
OOM_MESSAGE = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes."

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread(),
    reason="needs SIGALRM timers and the main thread (the one Ctrl-C interrupts)")


class CNN(model.Model):
    def __init__(self, huge_output: bool = False):
        super().__init__()
        self.conv = layer.Conv2d(8, 3, padding=1)
        self.relu = layer.ReLU()
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(4)
        self.loss = layer.SoftMaxCrossEntropy()
        self.huge_output = huge_output

    def forward(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        if self.huge_output and x.shape[0] == 8:
            # an output no address space holds (2**46 float32: 256 TiB): allocating it fails
            return out, loss, autograd.expand(loss, (2 ** 46,))
        return out, loss


class FailAfterUpdate(layer.Layer):
    """Raises XLA's out-of-memory error when armed: the eager step has updated every
    parameter and slot by then, so only its transaction can put them back."""

    def __init__(self):
        super().__init__()
        self.armed = False

    def forward(self, x):
        if self.armed:
            raise jax.errors.JaxRuntimeError(OOM_MESSAGE)
        return x


class FailingCNN(CNN):
    def __init__(self):
        super().__init__()
        self.fail = FailAfterUpdate()

    def train_one_batch(self, x, y):
        out, loss = super().train_one_batch(x, y)
        return self.fail(out), loss


def build(graph: bool, cls=CNN, **kwargs):
    device.get_default_device().SetRandSeed(0)
    m = cls(**kwargs)
    sgd = opt.SGD(lr=0.05, momentum=0.9)
    m.set_optimizer(sgd)
    m.compile([tensor.Tensor(BATCH)], is_train=True, use_graph=graph)
    return m, sgd


def batch(n: int = BATCH[0]):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, *BATCH[1:])).astype(np.float32)
    y = rng.integers(0, 4, n).astype(np.int32)
    return tensor.from_numpy(x), tensor.from_numpy(y)


def snapshot(m, sgd) -> dict:
    """Every parameter and optimizer state as host copies (reading a deleted array raises)."""
    states = {f"model/{k}": v for k, v in m.get_states().items()}
    states.update({f"opt/{k}": v for k, v in sgd.get_states().items()})
    return {k: np.array(tensor.to_numpy(v) if isinstance(v, tensor.Tensor) else v)
            for k, v in states.items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def differing(a: dict, b: dict) -> list:
    return sorted(k for k in a if not np.array_equal(a[k], b.get(k)))


def loss_of(result) -> float:
    return float(tensor.to_numpy(result[1]).reshape(-1)[0])


@contextlib.contextmanager
def default_sigint():
    """Python's own SIGINT handler for the test (a test runner's worker may install another)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def interrupted_call(m, args, delay: float) -> bool:
    """Call ``m(*args)`` with a SIGINT raised ``delay`` seconds after the call starts (the
    kernel's timer sends SIGALRM, whose handler raises SIGINT). Returns whether the call
    returned before the KeyboardInterrupt (which is then caught here, after it)."""
    fired = []

    def on_alarm(signum, frame):
        fired.append(True)
        signal.raise_signal(signal.SIGINT)

    old = signal.signal(signal.SIGALRM, on_alarm)
    returned = False
    try:
        signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-6))
        m(*args)
        returned = True
        end = time.perf_counter() + 5
        while not fired and time.perf_counter() < end:  # the interrupt, after the call
            pass
        for _ in range(1000):  # (a few bytecodes for the raised signal's handler to run)
            pass
        raise AssertionError(f"no SIGINT arrived {delay * 1e3:.3f} ms after the call")
    except KeyboardInterrupt:
        return returned
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def call_time(m, args, sgd) -> float:
    """The median duration of the model's call (each after the state is computed, as in the
    trials below)."""
    times = []
    for _ in range(15):
        snapshot(m, sgd)
        start = time.perf_counter()
        m(*args)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def interrupt_steps(m, sgd, ref, ref_sgd, args, delays, outcomes: dict) -> None:
    """One interrupted step of ``m`` per delay, each checked against the lockstep ``ref``."""
    for delay in delays:
        before = snapshot(m, sgd)
        assert same(before, snapshot(ref, ref_sgd)), "the lockstep models diverged"
        ref(*args)
        after = snapshot(ref, ref_sgd)
        assert not same(before, after)
        returned = interrupted_call(m, args, delay)
        now = snapshot(m, sgd)  # raises for a deleted array
        if returned:  # the interrupt came after the call: the step is whole
            assert same(now, after), differing(now, after)
            outcomes["returned"] += 1
        elif same(now, before):
            outcomes["before"] += 1
            m(*args)  # the step again, uninterrupted
            assert same(snapshot(m, sgd), after), differing(snapshot(m, sgd), after)
        else:
            assert same(now, after), (f"interrupted {delay * 1e3:.3f} ms into the call, these "
                                      f"states are neither before nor after the step: "
                                      f"{differing(now, before)} / {differing(now, after)}")
            outcomes["after"] += 1


@pytest.mark.parametrize("mode", ["graph", "eager", "eager-replayed"])
def test_ctrl_c_anywhere_in_a_step_leaves_the_state_before_or_after_it(mode, tmp_path, request):
    if mode == "eager-replayed":  # eager steps replayed as one compiled program each
        request.getfixturevalue("record_every_sequence")
    graph = mode == "graph"
    x, y = batch()
    m, sgd = build(graph)
    ref, ref_sgd = build(graph)
    first_loss = loss_of(m(x, y))
    assert loss_of(ref(x, y)) == first_loss
    outcomes = {"before": 0, "after": 0, "returned": 0}
    steps = []
    # Rounds of POINTS delays over a step timed anew each round: on a loaded machine a round
    # timed during a slow spell may see most calls return before their interrupt; then
    # another round follows (each interrupt is checked all the same)
    for _ in range(4):
        steps.append(call_time(m, (x, y), sgd))
        for _ in range(15):
            ref(x, y)  # (lockstep with the steps just timed)
        delays = [1.2 * steps[-1] * i / (POINTS - 1) for i in range(POINTS)]
        with default_sigint():
            interrupt_steps(m, sgd, ref, ref_sgd, (x, y), delays, outcomes)
        inside = outcomes["before"] + outcomes["after"]
        if inside >= POINTS // 4 and (outcomes["after"] >= 1 or not graph):
            break
    print(f"{mode}: steps {[round(t * 1e3, 3) for t in steps]} ms, "
          f"{POINTS * len(steps)} interrupts: {outcomes}")
    assert inside >= POINTS // 4, outcomes  # the interrupts fall inside the calls
    if graph:  # some after the compiled call was made (held back until the step was whole)
        assert outcomes["after"] >= 1, outcomes
    m.save_states(str(tmp_path / "after_interrupts.zip"))
    losses = [loss_of(m(x, y)) for _ in range(5)]
    assert losses[-1] < 0.5 * first_loss and losses[-1] <= losses[0], (first_loss, losses)


@pytest.mark.parametrize("call", ["first", "later"])
def test_ctrl_c_as_the_compiled_step_runs_is_raised_once_the_step_is_whole(call, monkeypatch):
    """A SIGINT raised inside the compiled call (its state donated): the call completes -- the
    first call's transaction too, which must not roll back the optimizer's new slots -- and
    then raises KeyboardInterrupt, the state exactly the uninterrupted step's."""
    x, y = batch()
    m, sgd = build(True)
    ref, ref_sgd = build(True)
    if call == "later":
        m(x, y)
        ref(x, y)
    ref(x, y)
    after = snapshot(ref, ref_sgd)
    real_call = jax.stages.Compiled.__call__
    raised = []

    def ctrl_c_then_run(self, *args):
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # (bytecodes: the handler runs here, and holds it back)
            pass
        raised.append(True)
        return real_call(self, *args)

    with default_sigint():
        monkeypatch.setattr(jax.stages.Compiled, "__call__", ctrl_c_then_run)
        try:
            with pytest.raises(KeyboardInterrupt):
                m(x, y)
        finally:
            monkeypatch.setattr(jax.stages.Compiled, "__call__", real_call)
    assert raised == [True]
    assert same(snapshot(m, sgd), after), differing(snapshot(m, sgd), after)
    traces = m.graph_stats()["traces"]
    m(x, y)
    ref(x, y)
    assert same(snapshot(m, sgd), snapshot(ref, ref_sgd))
    assert m.graph_stats()["traces"] == traces  # the compiled step serves the next call


def test_a_sigint_handler_of_ones_own_is_left_alone(monkeypatch):
    """With a SIGINT handler the program installed, a SIGINT during the compiled run reaches
    that handler there and then (nothing is held back, the handler is not replaced)."""
    x, y = batch()
    m, sgd = build(True)
    m(x, y)
    events = []

    def own_handler(signum, frame):
        events.append("handler")

    real_call = jax.stages.Compiled.__call__

    def ctrl_c_then_run(self, *args):
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # (bytecodes: the handler runs here)
            pass
        events.append("compiled call")
        assert signal.getsignal(signal.SIGINT) is own_handler
        return real_call(self, *args)

    old = signal.signal(signal.SIGINT, own_handler)
    try:
        monkeypatch.setattr(jax.stages.Compiled, "__call__", ctrl_c_then_run)
        m(x, y)
        events.append("returned")
    finally:
        monkeypatch.setattr(jax.stages.Compiled, "__call__", real_call)
        signal.signal(signal.SIGINT, old)
    assert events == ["handler", "compiled call", "returned"]


def test_ctrl_c_while_a_step_compiles_interrupts_at_once():
    """Before a compiled step runs (tracing, compiling) Ctrl-C is not held back: it interrupts
    the first call with every state as before, and the next call compiles and trains."""
    x, y = batch()
    m, sgd = build(True)
    before = snapshot(m, sgd)
    with default_sigint():
        with pytest.raises(KeyboardInterrupt):
            with contextlib.ExitStack() as stack:
                original = layer.ReLU.forward

                def relu_then_ctrl_c(self, *args):  # Ctrl-C during the trace
                    signal.raise_signal(signal.SIGINT)
                    for _ in range(1000):  # (bytecodes: the handler runs here)
                        pass
                    return original(self, *args)

                stack.callback(setattr, layer.ReLU, "forward", original)
                layer.ReLU.forward = relu_then_ctrl_c
                m(x, y)
    assert same(snapshot(m, sgd), before)
    assert m.graph_stats()["programs"] == 0  # nothing was compiled
    losses = [loss_of(m(x, y)) for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_out_of_memory_injected_into_the_compiled_step(monkeypatch):
    """Graph mode: the compiled run fails with RESOURCE_EXHAUSTED. A failure that leaves its
    inputs changes nothing; one that consumes its donated buffers (as XLA:CPU does) changes
    nothing on a program's first run (whose inputs are kept) and says which state is lost on a
    later one."""
    x, y = batch()
    m, sgd = build(True)
    first = loss_of(m(x, y))
    real_call = jax.stages.Compiled.__call__
    calls = []

    def failing(consume):
        def call(self, donated, read, batch):
            calls.append(len(donated))
            if consume:
                for a in donated:
                    a.delete()  # what a failed XLA:CPU run does to its donated inputs
            raise jax.errors.JaxRuntimeError(OOM_MESSAGE)
        return call

    def step_failing(consume, args):
        before = snapshot(m, sgd)
        monkeypatch.setattr(jax.stages.Compiled, "__call__", failing(consume))
        try:
            with pytest.raises(DeviceMemoryError) as err:
                m(*args)
        finally:
            monkeypatch.setattr(jax.stages.Compiled, "__call__", real_call)
        assert calls and calls[-1] > 0  # the compiled step was called, with donated state
        assert isinstance(err.value, MemoryError)
        assert isinstance(err.value.__cause__, jax.errors.JaxRuntimeError)
        n = args[0].shape[0]
        text = str(err.value)
        assert "CNN.train_one_batch (graph mode)" in text, text
        assert f"float32[{n},1,12,12], int32[{n}]" in text, text
        assert "1073741824 bytes (1.00 GiB)" in text and "smaller batch" in text, text
        return before, text

    # a later run (the program has run before) whose failure leaves its inputs
    before, text = step_failing(False, (x, y))
    assert "No state changed" in text, text
    assert same(snapshot(m, sgd), before), differing(snapshot(m, sgd), before)

    # the first run of a new program (a new batch size), consuming its inputs: restored
    small = batch(4)
    before, text = step_failing(True, small)
    assert "No state changed" in text, text
    assert same(snapshot(m, sgd), before), differing(snapshot(m, sgd), before)
    losses = [loss_of(m(*small)) for _ in range(6)]
    assert losses[-1] < losses[0] and losses[-1] < first, (first, losses)

    # a later run consuming its inputs: nothing kept them, and the error says so
    _, text = step_failing(True, small)
    assert "No state changed" not in text and "could not be restored" in text, text
    assert "load_states" in text, text
    with pytest.raises(RuntimeError, match="deleted"):
        snapshot(m, sgd)


def test_out_of_memory_compiling_the_step(monkeypatch):
    """Graph mode: XLA runs out of memory compiling the step; its first call changes nothing
    and says so, and once memory suffices the same call compiles and trains."""
    x, y = batch()
    m, sgd = build(True)
    before = snapshot(m, sgd)

    def compile_out_of_memory(self, *args, **kwargs):
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Failed to allocate request for 1.50GiB on device ordinal 0")

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_out_of_memory)
    with pytest.raises(DeviceMemoryError) as err:
        m(x, y)
    monkeypatch.undo()
    text = str(err.value)
    assert "CNN.train_one_batch (graph mode): out of device memory compiling" in text, text
    assert "float32[8,1,12,12], int32[8]" in text, text
    assert f"{3 * 2 ** 29} bytes (1.50 GiB)" in text and "No state changed" in text, text
    assert same(snapshot(m, sgd), before), differing(snapshot(m, sgd), before)
    losses = [loss_of(m(x, y)) for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
def test_a_real_out_of_memory_step_changes_nothing(graph):
    """A step whose output no device can hold: XLA fails allocating it (running the compiled
    step, or the eager kernel); nothing changed, and a smaller batch trains."""
    m, sgd = build(graph, huge_output=True)
    x, y = batch()
    before = snapshot(m, sgd)
    with pytest.raises(DeviceMemoryError) as err:
        m(x, y)
    text = str(err.value)
    mode = "graph mode" if graph else "eager mode"
    assert f"CNN.train_one_batch ({mode})" in text, text
    assert "float32[8,1,12,12], int32[8]" in text, text
    assert f"{2 ** 48} bytes (262144.00 GiB)" in text, text
    assert "No state changed" in text, text
    assert same(snapshot(m, sgd), before), differing(snapshot(m, sgd), before)
    small_x, small_y = batch(4)
    losses = [loss_of(m(small_x, small_y)) for _ in range(6)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_out_of_memory_in_an_eager_step_after_its_update():
    """Eagerly, an out-of-memory error after the optimizer has updated every state goes
    through the step's transaction: every state as before, and the error names the batch."""
    m, sgd = build(False, cls=FailingCNN)
    x, y = batch()
    first = loss_of(m(x, y))
    before = snapshot(m, sgd)
    m.fail.armed = True
    with pytest.raises(DeviceMemoryError) as err:
        m(x, y)
    text = str(err.value)
    assert "FailingCNN.train_one_batch (eager mode)" in text, text
    assert "float32[8,1,12,12], int32[8]" in text and "1073741824 bytes (1.00 GiB)" in text
    assert "No state changed" in text and "smaller batch" in text, text
    assert same(snapshot(m, sgd), before), differing(snapshot(m, sgd), before)
    m.fail.armed = False
    losses = [loss_of(m(x, y)) for _ in range(5)]
    assert losses[-1] < first, (first, losses)
