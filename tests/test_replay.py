"""Eager replay : a recurring eager sequence runs as one compiled program with
eager semantics intact. Every check compares against op-by-op execution
(``autograd.eager_replay(False)``) of the same program from the same seed: float32 on the CPU,
where the fused program and the single kernels give the same results up to XLA's fusion
rounding (1e-6 relative)."""
import jax
import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax._src.eager import replay

from backend_precision import matmul_tolerance

# float32 on XLA:CPU: fused program vs one kernel per operator, 1e-6; where float32 products
# are computed in reduced precision (TF32 on an NVIDIA GPU) the two round differently: widened
_TOLERANCE = matmul_tolerance(1e-6, 1e-6)
RTOL, ATOL = _TOLERANCE["rtol"], _TOLERANCE["atol"]


@pytest.fixture(autouse=True)
def record_every_sequence(monkeypatch):
    """These small programs' sequences are shorter than replay.MIN_RECORDS: record them anyway
    (test_only_long_sequences_are_recorded checks the default)."""
    monkeypatch.setattr(replay, "MIN_RECORDS", 1)


class Net(model.Model):
    """Three [Conv2d, BatchNorm2d, ReLU] blocks, Flatten, Linear: BatchNorm writes its running
    statistics (a declared write) on every training step."""

    def __init__(self, depth=3):
        super().__init__()
        self.depth = depth
        for i in range(depth):
            setattr(self, f"conv{i}", layer.Conv2d(4, 4, 3, padding=1))
            setattr(self, f"bn{i}", layer.BatchNorm2d(4))
            setattr(self, f"relu{i}", layer.ReLU())
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()
        self.seen = []  # values read inside forward (see Branchy)

    def forward(self, x):
        for i in range(self.depth):
            x = getattr(self, f"relu{i}")(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
        return self.fc(self.flatten(x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class Branchy(Net):
    """Python control flow on a value in the middle of the forward: reading it ends the
    recorded segment; the branch taken changes the operator sequence."""

    def forward(self, x):
        # a recorded (pending) value read on the host: its segment ends here
        s = float(tensor.to_numpy(autograd.reduce_sum(autograd.relu(x), None, 0)))
        self.seen.append(s)
        h = self.relu0(self.bn0(self.conv0(x)))
        h = autograd.mul(h, h) if s > self.threshold else autograd.add(h, h)
        h = self.relu1(self.bn1(self.conv1(h)))
        return self.fc(self.flatten(h))


def _data(batch, seed=0):
    rng = np.random.default_rng(seed)
    x = tensor.from_numpy(rng.standard_normal((batch, 4, 5, 5)).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 3, batch).astype(np.int32))
    return x, y


def _train(net_cls, replayed, batches, steps=5, **attrs):
    """Losses, eval outputs and final state of a model trained eagerly."""
    with autograd.eager_replay(replayed):
        device.get_default_device().SetRandSeed(0)
        net = net_cls()
        for k, v in attrs.items():
            setattr(net, k, v)
        net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
        x0, _ = _data(batches[0])
        net.compile([x0], is_train=True, use_graph=False)
        losses, evals = [], []
        for step in range(steps):
            x, y = _data(batches[step % len(batches)], seed=step % 2)
            net.train()
            _, loss = net(x, y)
            losses.append(tensor.to_numpy(loss))
        net.eval()
        for _ in range(3):
            evals.append(tensor.to_numpy(net(_data(batches[0])[0])))
        state = {k: tensor.to_numpy(v) for k, v in net.get_states().items()}
        state.update({k: tensor.to_numpy(v) for k, v in net.optimizer.get_states().items()})
        return losses, evals, state, net


def _assert_same(a, b):
    for la, lb in zip(a[0], b[0]):
        np.testing.assert_allclose(la, lb, rtol=RTOL, atol=ATOL)
    for ea, eb in zip(a[1], b[1]):
        np.testing.assert_allclose(ea, eb, rtol=RTOL, atol=ATOL)
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        np.testing.assert_allclose(a[2][k], b[2][k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_replayed_training_and_evaluation_equal_op_by_op():
    before = replay.stats()
    replayed = _train(Net, True, [2], steps=6)
    after = replay.stats()
    # the forward recurred: it was recorded, compiled once and run as one program
    assert after["recorded"] > before["recorded"]
    assert after["compiled"] > before["compiled"]
    assert after["replayed"] > before["replayed"]
    mid = replay.stats()
    plain = _train(Net, False, [2], steps=6)
    assert replay.stats()["recorded"] == mid["recorded"]  # the switch runs op by op
    _assert_same(replayed, plain)
    losses = [float(np.ravel(v)[0]) for v in replayed[0]]
    assert losses[-1] < losses[0]  # and it trains


def test_no_tensor_holds_a_pending_value_after_a_model_call():
    *_, net = _train(Net, True, [2], steps=4)
    tensors = list(net.get_states().values()) + list(net.optimizer.get_states().values())
    assert all(isinstance(t._data, jax.Array) for t in tensors)


def test_a_changed_shape_runs_correctly_and_gets_its_own_program():
    a = _train(Net, True, [2, 3], steps=8)
    b = _train(Net, False, [2, 3], steps=8)
    _assert_same(a, b)


def test_python_control_flow_on_values_ends_the_segment_and_changes_the_sequence():
    # a threshold between the two batches' sums: the branch alternates with the batch
    sums = [float(np.maximum(tensor.to_numpy(_data(2, seed)[0]), 0).sum()) for seed in (0, 1)]
    a = _train(Branchy, True, [2], steps=6, threshold=sum(sums) / 2)
    b = _train(Branchy, False, [2], steps=6, threshold=sum(sums) / 2)
    _assert_same(a, b)
    seen = np.array(a[3].seen)
    np.testing.assert_allclose(seen, b[3].seen, rtol=RTOL)
    assert (seen > sum(sums) / 2).any() and (seen < sum(sums) / 2).any()  # both branches ran


def test_intermediates_are_readable_and_the_creator_graph_is_there():
    x = tensor.from_numpy(np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 12))
    w = tensor.from_numpy(np.linspace(0.5, -0.5, 36, dtype=np.float32).reshape(12, 3))
    w.requires_grad = w.stores_grad = True

    def chain():
        h = autograd.matmul(x, w)
        r = autograd.relu(h)
        return h, r, autograd.reduce_sum(autograd.mul(r, r), None, 0)

    autograd.training = True
    try:
        for _ in range(4):  # recorded from the second call, one program from the third
            h, r, s = chain()
            # metadata without running anything; values on demand
            assert r.shape == (2, 3) and r.dtype == np.float32
            assert isinstance(s.creator, autograd.ReduceSum)
            assert isinstance(s.creator.src[0][0], autograd.Mul)
            assert s.creator.src[0][0].src[0][0] is r.creator
            xh = x.array @ w.array
            np.testing.assert_allclose(tensor.to_numpy(h), xh, rtol=RTOL)
            np.testing.assert_allclose(tensor.to_numpy(r), np.maximum(xh, 0), rtol=RTOL)
            grads = dict((id(p), g) for p, g in autograd.backward(s))
            expect = np.asarray(x.array).T @ (2 * np.maximum(xh, 0))
            np.testing.assert_allclose(tensor.to_numpy(grads[id(w)]), expect, rtol=1e-5)
    finally:
        autograd.training = False


def test_recorded_output_is_read_before_its_segment_ends():
    """Reading a value of a pending segment runs the segment (and only what is recorded)."""
    x = tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    for _ in range(3):
        a = autograd.relu(x)
        b = autograd.mul(a, a)
        assert np.allclose(tensor.to_numpy(a), np.arange(6).reshape(2, 3))
        c = autograd.add(b, a)
        np.testing.assert_allclose(tensor.to_numpy(c), (np.arange(6) ** 2 + np.arange(6)).reshape(2, 3))


def test_switch_is_scoped_and_a_decorator():
    assert autograd.eager_replay(False)(lambda: replay.active())() is False
    with autograd.eager_replay(False):
        assert not replay.active()
        with autograd.eager_replay(True):
            assert replay.active()
    assert replay.active()


def test_failed_step_leaves_every_tensor_as_it_was():
    """A transaction rolls back tensors whose values were pending when the step failed."""
    _, _, _, net = _train(Net, True, [2], steps=3)
    states = {k: tensor.to_numpy(v) for k, v in net.get_states().items()}
    net.train()
    x, _ = _data(2)
    bad_y = tensor.from_numpy(np.array([0, 7], np.int32))  # label 7 of 3 classes
    with pytest.raises(ValueError):
        net(x, bad_y)
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), states[k], err_msg=k)


def test_only_long_sequences_are_recorded(monkeypatch):
    """With the default threshold a short sequence runs op by op from then on (on a CPU its
    kernels overlap with the Python of the next ops) and a long one is recorded again."""
    monkeypatch.setattr(replay, "MIN_RECORDS", 8)
    x = tensor.from_numpy(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))

    def chain(n):
        y = x
        for _ in range(n):
            y = autograd.tanh(y)
        replay.flush()  # a sequence boundary, as a Model call's end or a backward is
        return y

    chain(12)  # a long sequence: the kernel is known and the next sequence is recorded
    for n, recorded in ((12, True), (3, True), (3, False), (12, False), (12, True)):
        # a short sequence turns recording off for the next; a long one, run at once, turns it
        # back on
        before = replay.stats()["recorded"]
        y = chain(n)
        assert (replay.stats()["recorded"] > before) is recorded, (n, recorded)
        want = np.asarray(x.array)
        for _ in range(n):
            want = np.tanh(want)
        # (XLA's float32 tanh against NumPy's, twelve times over: 1e-5)
        np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-5)


class Widening(model.Model):
    """Linear layers of distinct widths, each followed by tanh: every forward kernel has a
    signature of its own, as SINGA's ResNet-50 has about 50."""

    def __init__(self, n=10):
        super().__init__()
        self.n = n
        for i in range(n):
            setattr(self, f"fc{i}", layer.Linear(5 + i))

    def forward(self, x):
        for i in range(self.n):
            x = autograd.tanh(getattr(self, f"fc{i}")(x))
        return x


def test_kernels_met_for_the_first_time_are_recorded_without_ending_the_segment():
    """A kernel signature not seen before is recorded at once (its outputs from a trace): the
    first forward is ONE segment, not one per new kernel, and the second runs compiled."""
    x = tensor.from_numpy(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    device.get_default_device().SetRandSeed(0)
    net = Widening()
    net.compile([x], is_train=False, use_graph=False)
    net.eval()
    with autograd.eager_replay(True):
        outs, deltas = [], []
        for _ in range(3):
            before = replay.stats()
            outs.append(tensor.to_numpy(net(x)))
            after = replay.stats()
            deltas.append({k: after[k] - before[k] for k in after})
    with autograd.eager_replay(False):
        plain = tensor.to_numpy(net(x))
    first, second, third = deltas
    assert first["recorded"] >= 2 * net.n  # every kernel of the forward recorded ...
    assert first["op_by_op"] == 1 and first["replayed"] == 0  # ... in one segment, run op by op
    assert second["recorded"] == first["recorded"]
    assert second["compiled"] == 1 and second["replayed"] == 1
    assert third["compiled"] == 0 and third["replayed"] == 1
    for out in outs:
        np.testing.assert_allclose(out, plain, rtol=RTOL, atol=ATOL)


def test_a_kernel_whose_trace_fails_raises_at_the_operator_and_nothing_is_recorded():
    a = tensor.from_numpy(np.ones((2, 3), np.float32))
    b = tensor.from_numpy(np.ones((4, 5), np.float32))
    with autograd.eager_replay(True):
        h = autograd.tanh(a)  # a pending value, then a matmul of mismatched shapes
        with pytest.raises(Exception, match="3|4"):
            autograd.matmul(h, b)
        np.testing.assert_allclose(tensor.to_numpy(h), np.tanh(np.ones((2, 3))), rtol=1e-6)


@pytest.mark.parametrize("heavy", [False, True])
def test_walks_of_heavy_operators_fuse_where_the_backend_says(monkeypatch, heavy):
    """xla_options.fuses_heavy_walks: on a CPU a long walk of heavy operators goes op by op; on
    an accelerator it is fused (and recorded into the step's program) like a small one. Here
    every operator counts as heavy and walks past 4 operators as long; the switch of the
    platform the test runs on is flipped: the gradients equal op by op's either way."""
    from singa_jax._src.backend import xla_options
    from singa_jax._src.autodiff import fused
    from singa_jax._src.autodiff import backward as backward_mod
    monkeypatch.setattr(fused, "FUSED_WALK_MAX_OPS", 4)
    monkeypatch.setattr(fused, "FUSED_WALK_SMALL_OP", 0)
    platform = device.get_default_device().platform
    monkeypatch.setitem(xla_options.HEAVY_WALKS_FUSED, platform, heavy)
    walks = []
    walk = backward_mod.fused_walk

    def counting(*args, **kwargs):
        result = walk(*args, **kwargs)
        walks.append(result is not None)
        return result

    monkeypatch.setattr(backward_mod, "fused_walk", counting)  # the name backward() calls
    replayed = _train(Net, True, [2], steps=5)
    assert any(walks) is heavy  # (a plan fuses from its second walk on)
    plain = _train(Net, False, [2], steps=5)
    _assert_same(replayed, plain)
