"""Eager replay : a recurring eager sequence runs as one compiled program with
eager semantics intact. Every check compares against op-by-op execution
(``autograd.eager_replay(False)``) of the same program from the same seed: float32 on the CPU,
where the fused program and the single kernels give the same results up to XLA's fusion
rounding (1e-6 relative)."""
import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor

from backend_precision import matmul_tolerance

# small programs, shorter than the sequences eager replay records by default: record them
# anyway (an internal test checks the default)
pytestmark = pytest.mark.usefixtures("record_every_sequence")

# float32 on XLA:CPU: fused program vs one kernel per operator, 1e-6; where float32 products
# are computed in reduced precision (TF32 on an NVIDIA GPU) the two round differently: widened
_TOLERANCE = matmul_tolerance(1e-6, 1e-6)
RTOL, ATOL = _TOLERANCE["rtol"], _TOLERANCE["atol"]




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
    before = autograd.replay_stats()
    replayed = _train(Net, True, [2], steps=6)
    after = autograd.replay_stats()
    # the forward recurred: it was recorded, compiled once and run as one program
    assert after["recorded"] > before["recorded"]
    assert after["compiled"] > before["compiled"]
    assert after["replayed"] > before["replayed"]
    mid = autograd.replay_stats()
    plain = _train(Net, False, [2], steps=6)
    assert autograd.replay_stats()["recorded"] == mid["recorded"]  # the switch runs op by op
    _assert_same(replayed, plain)
    losses = [float(np.ravel(v)[0]) for v in replayed[0]]
    assert losses[-1] < losses[0]  # and it trains


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
            before = autograd.replay_stats()
            outs.append(tensor.to_numpy(net(x)))
            after = autograd.replay_stats()
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


