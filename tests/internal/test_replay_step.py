"""A training step recorded into one replay segment, white-box: pieces, speculation, the launching
thread. (This tier imports singa_jax._src.)"""
import os
import subprocess
import sys
import jax
import numpy as np
import pytest
from singa_jax import autograd, device, tensor
from singa_jax._src.eager import replay
from singa_jax._src.backend import xla_options
from singa_jax._src.autodiff import fused
from singa_jax._src.optim import update
from test_replay_step import (  # noqa: F401 (shared helpers and fixtures)
    Net, WARMUP, _build, _close, _data, _sgd, _states, _warm)

pytestmark = pytest.mark.usefixtures("record_every_sequence")


def test_a_recurring_training_step_is_one_program_without_residuals_or_gradients(monkeypatch):
    compiled = []
    real = replay._compile

    def spy(segment, live):
        compiled.append(([call for call, _, _ in segment.calls], live, len(segment.leaves)))
        return real(segment, live)

    monkeypatch.setattr(replay, "_compile", spy)
    net = _build(_sgd())
    x, y = _data()
    _warm(net, x, y)
    before = autograd.replay_stats()
    net.train()
    out, loss = net(x, y)
    after = autograd.replay_stats()
    # the step ran as one replayed program, nothing op by op
    assert after["replayed"] - before["replayed"] == 1
    assert after["op_by_op"] == before["op_by_op"]
    calls, live, outputs = compiled[-1]
    assert fused.fused_backward_walk in calls and update.recorded_update_kernel in calls
    assert calls[-1] is update.advance_unless_skipped  # the optimizer's step() too
    # what it returns: the parameters, slots and buffers it rebinds (the step counter
    # included), the guard's state and the call's two results -- no residual, no gradient
    rebound = len(net.get_states()) + len(net.optimizer.get_states())
    assert len(live) == rebound + 1 + 2
    assert outputs >= len(live) + 10  # (the 10 gradients among the outputs not returned)
    assert all(isinstance(t._data, jax.Array) for t in net.get_states().values())


def _evaluation_in_pieces(monkeypatch, calls):
    """Replay dispatches a segment that keeps no backward state every ``calls`` calls on the
    default device (None: one program), SINGA_JAX_REPLAY_PIECE ignored."""
    monkeypatch.setattr(xla_options, "_PIECE_ENV", None)
    monkeypatch.setitem(xla_options.REPLAY_PIECE_CALLS, device.get_default_device().platform,
                        calls)


def test_an_evaluation_forward_is_dispatched_in_pieces_and_a_training_step_is_not(monkeypatch):
    """On an accelerator a recorded segment that keeps no backward state is dispatched every
    REPLAY_PIECE_CALLS calls (the device runs it while the host records the rest); a training
    step stays one program. Forced here on the default device, pieces of 3 calls: each
    recurring piece is its own compiled program and the forward still equals op by op."""
    monkeypatch.setattr(xla_options, "_PIECE_ENV", None)  # (SINGA_JAX_REPLAY_PIECE ignored)
    assert xla_options.replay_piece_calls("cpu") is None  # the CPU's own rule: one program
    assert xla_options.replay_piece_calls("gpu") == xla_options.REPLAY_PIECE_CALLS_ELSEWHERE
    _evaluation_in_pieces(monkeypatch, 3)
    net = _build(_sgd())
    x, y = _data()
    with autograd.eager_replay(True):
        _warm(net, x, y)
        before = autograd.replay_stats()
        net.train()
        net(x, y)
        after = autograd.replay_stats()
        assert after["replayed"] - before["replayed"] == 1  # the training step: one program
        net.eval()
        for _ in range(3):
            before = autograd.replay_stats()
            pieces = tensor.to_numpy(net(x))
            after = autograd.replay_stats()
    # 9 forward calls in pieces of 3: three programs, each replayed, none op by op
    assert after["replayed"] - before["replayed"] == 3
    assert after["op_by_op"] == before["op_by_op"]
    with autograd.eager_replay(False):
        plain = tensor.to_numpy(net(x))
    np.testing.assert_allclose(pieces, plain, **_close())
    for value, calls in (("16", 16), ("0", None)):  # the environment's setting, every platform
        monkeypatch.setattr(xla_options, "_PIECE_ENV", xla_options._piece_setting(value))
        assert xla_options.replay_piece_calls("gpu") == xla_options.replay_piece_calls("cpu") \
            == calls
    for bad in ("many", "-1"):
        with pytest.raises(ValueError, match="SINGA_JAX_REPLAY_PIECE must be a whole number"):
            xla_options._piece_setting(bad)


def test_pieces_do_not_run_ahead(monkeypatch):
    """An evaluation in pieces (an accelerator's rule, forced here) is never speculated: each
    piece already runs on the device while the next is recorded (measured: speculating them
    too was slower). Its recurring pieces still replay, and equal op by op."""
    _evaluation_in_pieces(monkeypatch, 3)
    net = _build(_sgd())
    x, _ = _data()
    net.eval()
    with autograd.eager_replay(True), autograd.replay_speculation(True):
        before = autograd.replay_stats()
        for _ in range(8):
            pieces = tensor.to_numpy(net(x))
        after = autograd.replay_stats()
    assert after["replayed"] - before["replayed"] >= 3 * 6  # (compiled at their second run)
    assert after["speculated"] == before["speculated"]
    assert after["mispredicted"] == before["mispredicted"]
    with autograd.eager_replay(False):
        plain = tensor.to_numpy(net(x))
    np.testing.assert_allclose(pieces, plain, **_close())


_GC_SCRIPT = """
import gc, sys
import jax, numpy as np
# objects frozen before singa_jax ran (gc.freeze() by the interpreter's startup -- a
# sitecustomize, say -- or by a dependency): not singa_jax's doing
frozen_before = gc.get_freeze_count()
from singa_jax import autograd, tensor
from singa_jax._src.backend import gc_tuning
if sys.argv[1] == "own":
    gc.set_threshold(900, 10, 10)  # the program's own thresholds stand
before = gc.get_threshold()
x = tensor.from_numpy(np.ones((3,), np.float32)); x.requires_grad_()
autograd.training = True
y = autograd.reduce_sum(autograd.mul(x, x), None, 0)
grads = [tensor.to_numpy(g) for _, g in autograd.backward(y)]  # singa_jax tunes the GC here
print(before[0], gc.get_threshold()[0], gc_tuning.tuned(), grads[0].tolist())
class Cycle:
    pass
c = Cycle(); c.me = c; del c  # cyclic garbage: an explicit collection still frees it
print(gc.collect() >= 1, gc.get_freeze_count() - frozen_before)
gc_tuning.untune()
print(gc.get_threshold()[0], gc_tuning.tuned())
"""


@pytest.mark.parametrize("case", ["default", "off", "own"])
def test_gc_tuning_and_its_switch(case):
    env = {k: v for k, v in os.environ.items() if k != "SINGA_JAX_GC_TUNING"}
    if case == "off":
        env["SINGA_JAX_GC_TUNING"] = "0"
    out = subprocess.run([sys.executable, "-c", _GC_SCRIPT, case], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second, third = out.stdout.split("\n")[-4:-1]
    assert first.endswith("[2.0, 2.0, 2.0]")  # d(sum x*x)/dx at x = 1
    assert second == "True 0"  # singa_jax froze nothing (gc.freeze)
    if case == "default":
        assert first.startswith("700 10000 True")
        assert third == "700 False"  # untune restores Python's threshold
    elif case == "off":
        assert first.startswith("700 700 False")
        assert third == "700 False"
    else:
        assert first.startswith("900 900 False")
        assert third == "900 False"


# --- speculation: a recurring step's program starts before its recording ends ---------------
def _counted(fn):
    """``fn()``'s result and how many programs it speculated and mispredicted."""
    before = autograd.replay_stats()
    result = fn()
    after = autograd.replay_stats()
    return result, (after["speculated"] - before["speculated"],
                    after["mispredicted"] - before["mispredicted"])


def _speculation_run(speculate, monkeypatch, steps=12, tweak_at=None, small_last=False):
    """Train with a new batch every step (as a data loader gives them), then evaluate, with or
    without speculation; returns losses, states, the evaluation's outputs and per call
    ``(speculated, mispredicted)``."""
    # an evaluation as one program on every backend, as on a CPU (an accelerator's pieces
    # do not speculate: test_pieces_do_not_run_ahead)
    _evaluation_in_pieces(monkeypatch, None)
    with autograd.eager_replay(True), autograd.replay_speculation(speculate):
        net = _build(_sgd())

        def tweak():
            # a parameter rebound inside the call, before its forward, without a kernel: the
            # arrays the call started with no longer predict it
            net.fc.W.array = jax.numpy.asarray(tensor.to_numpy(net.fc.W) * 0.5)

        losses, counts = [], []
        for step in range(steps):
            if step == tweak_at:
                net.before_forward.append(tweak)
            batch = 1 if small_last and step == steps - 1 else 2
            net.train()
            (_, loss), count = _counted(lambda: net(*_data(seed=step, batch=batch)))
            losses.append(tensor.to_numpy(loss))
            counts.append(count)
        net.eval()
        evals = []
        for i in range(6):
            out, count = _counted(lambda: net(_data(seed=100 + i)[0]))
            evals.append(tensor.to_numpy(out))
            counts.append(count)
    return losses, _states(net), evals, counts


def _assert_identical(a, b):
    """Speculated vs not: the same compiled programs on the same arrays -- bit for bit on the
    CPU. (On a GPU a run's first steps, op by op or by a program the run before compiled for
    the same sequence, may differ from the other run's by TF32's rounding: two programs.)"""
    def same(x, y, err_msg=""):
        if jax.default_backend() == "cpu":
            np.testing.assert_array_equal(x, y, err_msg=err_msg)
        else:
            np.testing.assert_allclose(x, y, **_close(), err_msg=err_msg)

    for la, lb in zip(a[0], b[0]):
        same(la, lb)
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        same(a[1][k], b[1][k], err_msg=k)
    for ea, eb in zip(a[2], b[2]):
        same(ea, eb)


# A recurring sequence is compiled at its second run and has a plan after its third (learnt
# from the second and third runs of its program); a training step's whole sequence (its walk
# recorded too) first occurs at its second call, once its walk is fused (every test starts
# from a cold engine). So a step runs ahead from its fifth call on: four calls first.
LEARNT = 4


def _ahead_from(counts):
    """The first call from which every one ran ahead, none mispredicted (len: none did)."""
    first = len(counts)
    while first > 0 and counts[first - 1] == (1, 0):
        first -= 1
    return first


@pytest.mark.parametrize("in_thread", [False, True], ids=["here", "launching-thread"])
def test_a_recurring_step_starts_on_predicted_inputs_and_equals_the_unspeculated(monkeypatch,
                                                                                in_thread):
    """Also with the program launched from replay's thread (a GPU's rule, forced here)."""
    monkeypatch.setitem(xla_options.LAUNCHES_IN_THREAD, device.get_default_device().platform,
                        in_thread)
    calls_at_start = []
    real = replay._speculate

    def spy(segment, plan):
        calls_at_start.append(len(segment.calls))
        real(segment, plan)

    monkeypatch.setattr(replay, "_speculate", spy)
    interval = sys.getswitchinterval()
    speculated = _speculation_run(True, monkeypatch)
    plain = _speculation_run(False, monkeypatch)
    # (the launching thread shortens the switch interval only while a launch is pending)
    assert sys.getswitchinterval() == interval
    _assert_identical(speculated, plain)
    counts = speculated[3]
    # every training step and evaluation after the first few ran ahead; none mispredicted
    assert _ahead_from(counts[:12]) == LEARNT, counts
    assert _ahead_from(counts[12:]) == 3, counts  # (no walk to fuse first)
    assert all(c == (0, 0) for c in plain[3])
    # each started after the segment's first recorded call: the batch and the state are the
    # arrays the call started with
    assert calls_at_start and set(calls_at_start) == {1}
    losses = [float(np.ravel(v)[0]) for v in speculated[0]]
    assert losses[-1] < losses[0]


def test_a_mispredicted_input_discards_the_speculated_program(monkeypatch):
    speculated = _speculation_run(True, monkeypatch, tweak_at=8)
    plain = _speculation_run(False, monkeypatch, tweak_at=8)
    _assert_identical(speculated, plain)
    counts = speculated[3]
    assert counts[8] == (0, 1)  # run ahead on the old parameter, discarded
    assert counts[9:12] == [(1, 0)] * 3  # one miss keeps the plan


def test_a_smaller_last_batch_is_not_speculated(monkeypatch):
    speculated = _speculation_run(True, monkeypatch, small_last=True)
    plain = _speculation_run(False, monkeypatch, small_last=True)
    _assert_identical(speculated, plain)
    assert _ahead_from(speculated[3][:11]) == LEARNT, speculated[3]
    assert speculated[3][11] == (0, 0)  # another batch shape: nothing run ahead


def test_a_training_loop_without_a_model_call_is_speculated_from_the_last_step(monkeypatch):
    """A user's own loop (forward, loss, optimizer): no call arguments, so the parameters are
    predicted as the last step's program outputs; the batch, new each step, is read by the
    first operator (x) and the loss (y), so the program starts at the loss."""
    results, starts = [], []
    real = replay._speculate

    def spy(segment, plan):
        end, depth = plan.end, 0
        while end is not None:
            end, depth = end.parent, depth + 1
        starts.append((len(segment.calls), depth - 1))  # (calls so far, calls of the step)
        real(segment, plan)

    monkeypatch.setattr(replay, "_speculate", spy)
    for speculate in (True, False):
        with autograd.eager_replay(True), autograd.replay_speculation(speculate):
            net = _build(_sgd())
            net.train()
            losses, counts = [], []

            def step(x, y):
                loss = net.loss(net.forward(x), y)
                net.optimizer(loss)
                return loss

            for i in range(12):
                loss, count = _counted(lambda: step(*_data(seed=i)))
                losses.append(tensor.to_numpy(loss))
                counts.append(count)
            results.append((losses, _states(net), [], counts))
    _assert_identical(results[0], results[1])
    assert results[0][3][-4:] == [(1, 0)] * 4
    # started once the loss was recorded: the walk, the update and the step still to come
    so_far, of_step = starts[-1]
    assert so_far == of_step - 3


def test_a_launching_thread_in_another_jax_context_leaves_the_program_to_the_flush(monkeypatch):
    """A step run in a thread-local JAX scope that keys jit's executables (here a matmul
    precision): the launching thread, outside it, would run another executable -- so it runs
    nothing, and the flush calls the program as without speculation."""
    monkeypatch.setitem(xla_options.LAUNCHES_IN_THREAD, device.get_default_device().platform,
                        True)
    with jax.default_matmul_precision("highest"):
        speculated = _speculation_run(True, monkeypatch)
        plain = _speculation_run(False, monkeypatch)
    _assert_identical(speculated, plain)
    assert all(ran_ahead == 0 for ran_ahead, _ in speculated[3]), speculated[3]


def test_a_forked_child_launches_from_a_thread_of_its_own(tmp_path):
    """After os.fork the parent's launching thread does not exist in the child: the child
    makes its own (else its first speculated launch would wait forever)."""
    script = tmp_path / "fork_launch.py"
    script.write_text(
        "import os, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import jax.numpy as jnp\n"
        "from singa_jax._src.backend import xla_options\n"
        "from singa_jax._src.eager import launcher\n"
        "program = xla_options.kernel(lambda a: a + 1)\n"
        "x = jnp.arange(3.0)\n"
        "assert float(launcher.launch_in_thread(program, [x]).result(timeout=60)[0]) == 1.0\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    out = launcher.launch_in_thread(program, [x]).result(timeout=60)\n"
        "    os._exit(0 if float(out[2]) == 3.0 else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "child 0", done.stdout + done.stderr[-2000:]


def test_an_evaluation_after_training_steps_predicts_parameters_from_their_tensors(monkeypatch):
    """Evaluation forwards called directly (no Model call, so no call arrays) between training
    phases: the parameters are new arrays after each phase, held by the same Tensors -- the
    plan predicts them as what those Tensors hold, so every evaluation of a later phase runs
    ahead (predicting "the same array as last time" would miss after each phase)."""
    results = []
    # an evaluation as one program on every backend, as on a CPU (an accelerator's pieces
    # do not speculate: test_pieces_do_not_run_ahead)
    _evaluation_in_pieces(monkeypatch, None)
    for speculate in (True, False):
        # each run a tree of sequences of its own (the first run's plans would serve the
        # second)
        monkeypatch.setattr(replay, "_ROOT", replay._Step(None, None))
        with autograd.eager_replay(True), autograd.replay_speculation(speculate):
            net = _build(_sgd())
            counts, outs = [], []
            for phase in range(6):
                for i in range(3):
                    net.train()
                    net(*_data(seed=phase * 3 + i))
                for i in range(3):
                    net.eval()
                    # (the read runs the forward's segment: counted with it)
                    out, count = _counted(
                        lambda: tensor.to_numpy(net.forward(_data(seed=100 + i)[0])))
                    outs.append(out)
                    counts.append(count)
            results.append((outs, _states(net), [], counts))
    _assert_identical(results[0], results[1])
    # phases 0-2 learn; from phase 3 every evaluation runs ahead, none mispredicted
    assert results[0][3][9:] == [(1, 0)] * 9, results[0][3]
