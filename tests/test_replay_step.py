"""Eager replay of a whole training step: the forward, the fused backward walk and the optimizer's
update recorded into one segment, run as ONE program once the step recurs (eager replay,
the fused walk, the replayed update). Every check compares against op-by-op
execution (``autograd.eager_replay(False)``) from the same seed: float32 on the CPU, equal up
to XLA's fusion rounding (1e-6; on a GPU's TF32 up to two programs' own roundings:
backend_precision.two_programs_tolerance)."""
import warnings
import weakref

import numpy as np
import pytest

from backend_precision import two_programs_tolerance
from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax.opt import NonFiniteStepWarning

# small programs, shorter than the sequences eager replay records by default: record them
# anyway (an internal test checks the default)
pytestmark = pytest.mark.usefixtures("record_every_sequence")

WARMUP = 7  # calls after which a recurring step is one compiled program (see bench_eager.py)


def _close():
    """Replayed vs op by op: two programs computing the same steps, 1e-6 apart where float32
    products are float32 (fusion rounding), their own TF32 roundings apart on a GPU."""
    return two_programs_tolerance(1e-6, 1e-6)




class Net(model.Model):
    """Two [Conv2d, BatchNorm2d, ReLU] blocks, Flatten, Linear, softmax cross-entropy."""

    def __init__(self, per_param=False, read_grads=False):
        super().__init__()
        self.per_param, self.read_grads = per_param, read_grads
        self.conv0, self.bn0, self.relu0 = layer.Conv2d(4, 4, 3, padding=1), \
            layer.BatchNorm2d(4), layer.ReLU()
        self.conv1, self.bn1, self.relu1 = layer.Conv2d(4, 4, 3, padding=1), \
            layer.BatchNorm2d(4), layer.ReLU()
        self.flatten, self.fc = layer.Flatten(), layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()
        self.grads_seen = []
        self.before_forward = []  # (callables a test queues for the next training call)

    def forward(self, x):
        x = self.relu0(self.bn0(self.conv0(x)))
        return self.fc(self.flatten(self.relu1(self.bn1(self.conv1(x)))))

    def train_one_batch(self, x, y):
        while self.before_forward:
            self.before_forward.pop()()
        out = self.forward(x)
        loss = self.loss(out, y)
        if self.per_param:  # SINGA's older style: the walk's pairs updated one by one
            for p, g in autograd.backward(loss):
                if self.read_grads:  # a gradient read while the walk's segment is pending
                    self.grads_seen.append(tensor.to_numpy(g).copy())
                self.optimizer.update(p, g)
            self.optimizer.step()
        else:
            self.optimizer(loss)
        return out, loss


def _data(seed=0, batch=2, nan=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 4, 5, 5)).astype(np.float32)
    if nan:
        x[0, 0, 0, 0] = np.nan
    return (tensor.from_numpy(x),
            tensor.from_numpy(rng.integers(0, 3, batch).astype(np.int32)))


def _build(optimizer, **kwargs):
    device.get_default_device().SetRandSeed(0)
    net = Net(**kwargs)
    net.set_optimizer(optimizer)
    net.compile([_data()[0]], is_train=True, use_graph=False)
    return net


def _warm(net, x, y):
    """Train ``net`` on ``(x, y)`` until its step is one replayed program (WARMUP calls);
    returns the last call's ``(out, loss)``."""
    for _ in range(WARMUP):
        net.train()
        result = net(x, y)
    return result


def _states(net):
    state = {k: tensor.to_numpy(v) for k, v in net.get_states().items()}
    state.update({f"opt/{k}": tensor.to_numpy(v)
                  for k, v in net.optimizer.get_states().items()})
    return state


def _train(replayed, make_optimizer, steps=WARMUP + 3, **kwargs):
    with autograd.eager_replay(replayed):
        net = _build(make_optimizer(), **kwargs)
        losses = []
        for step in range(steps):
            net.train()
            _, loss = net(*_data(seed=step % 2))
            losses.append(tensor.to_numpy(loss))
        return losses, _states(net), net


def _assert_same(a, b):
    for la, lb in zip(a[0], b[0]):
        np.testing.assert_allclose(la, lb, **_close())
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        np.testing.assert_allclose(a[1][k], b[1][k], **_close(), err_msg=k)


def _sgd():
    return opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3)


def _adam():
    # epsilon well above the rounding noise (~1e-7) that is all the conv biases' gradient
    # (exactly zero: batch norm follows): with SINGA's 1e-8, Adam's normalised step moved them
    # by up to lr per step in the direction of that noise, which two programs round apart on
    # a GPU (conv0.b 0.015 vs -0.004 on an H200); the other parameters' steps barely change
    return opt.Adam(lr=0.01, epsilon=1e-4)


@pytest.mark.parametrize("make_optimizer", [_sgd, _adam], ids=["sgd", "adam"])
def test_replayed_steps_equal_op_by_op(make_optimizer):
    replayed = _train(True, make_optimizer)
    plain = _train(False, make_optimizer)
    _assert_same(replayed[:2], plain[:2])
    losses = [float(np.ravel(v)[0]) for v in replayed[0]]
    assert losses[-1] < losses[0]


def test_a_second_backward_through_a_replayed_step_recomputes_its_residuals():
    results = []
    for replayed in (True, False):
        with autograd.eager_replay(replayed):
            net = _build(_sgd())
            x, y = _data()
            _, loss = _warm(net, x, y)
            before = autograd.replay_stats()["recomputed"]
            # SINGA keeps the graph: walk it again (its pullbacks saw the old parameters)
            grads = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss)}
            results.append(grads)
            if replayed:
                assert autograd.replay_stats()["recomputed"] == before + 1
    assert results[0].keys() == results[1].keys() and len(results[0]) == 10
    for k in results[0]:
        np.testing.assert_allclose(results[0][k], results[1][k], **_close(),
                                   err_msg=k)


def test_a_replayed_step_keeps_of_the_last_state_only_what_its_graph_may_need():
    """A replayed step's program does not return its forward's residuals; a second backward
    recomputes them from the forward's inputs, so while the step's graph (its loss) is held,
    the parameters it read stay alive -- but not the optimizer slots it updated, and once the
    graph is dropped, nothing of the state it read (the guard watching for skipped updates
    included)."""
    net = _build(_sgd())
    x, y = _data()
    _warm(net, x, y)
    slots = [t for k, t in net.optimizer.get_states().items() if k.startswith("moments/")]
    params = list(net.get_params().values())
    assert len(slots) == len(params) == 10
    old_slots = [weakref.ref(t.array) for t in slots]
    old_params = [weakref.ref(t.array) for t in params]
    replayed = autograd.replay_stats()["replayed"]
    net.train()
    out, loss = net(x, y)
    tensor.to_numpy(loss)
    assert autograd.replay_stats()["replayed"] > replayed  # (the step ran as its program)
    assert all(r() is None for r in old_slots)
    assert all(r() is not None for r in old_params)
    del out, loss
    assert all(r() is None for r in old_params)


@pytest.mark.parametrize("read_grads", [False, True], ids=["unread", "read"])
def test_per_parameter_updates_from_the_walk_equal_op_by_op(read_grads):
    replayed = _train(True, _sgd, per_param=True, read_grads=read_grads)
    plain = _train(False, _sgd, per_param=True, read_grads=read_grads)
    _assert_same(replayed[:2], plain[:2])
    if read_grads:
        for ga, gb in zip(replayed[2].grads_seen, plain[2].grads_seen):
            np.testing.assert_allclose(ga, gb, **_close())


def test_an_apply_override_falls_back_and_equals_op_by_op():
    class HalfStepSGD(opt.SGD):  # SINGA's way: a subclass with its own apply
        def apply(self, param_name, param_value, param_grad):
            param_value.data -= 0.5 * self.lr.init_value * param_grad.data

    replayed = _train(True, lambda: HalfStepSGD(lr=0.05))
    plain = _train(False, lambda: HalfStepSGD(lr=0.05))
    _assert_same(replayed[:2], plain[:2])


def test_a_non_finite_step_is_skipped_and_reported_inside_the_program():
    net = _build(_sgd())
    x, y = _data()
    _warm(net, x, y)
    before = _states(net)
    bad_x, _ = _data(nan=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        net.train()
        net(bad_x, y)  # the same sequence: recorded, run by the step's program
    after = _states(net)
    for k in before:
        if not k.startswith("bn"):  # (the batch norm's running statistics saw the batch)
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert int(tensor.to_numpy(net.optimizer.skipped_steps)[0]) == 1
    with pytest.warns(NonFiniteStepWarning, match="skipped the update"):
        net.train()
        net(x, y)


def test_float16_loss_scaling_in_the_replayed_step_equals_op_by_op():
    def run(replayed):
        with autograd.eager_replay(replayed):
            device.get_default_device().SetRandSeed(0)
            net = Net()
            net.set_optimizer(_sgd())
            net.compile([_data()[0]], is_train=True, use_graph=False, autocast="float16")
            for step in range(WARMUP + 2):
                net.train()
                net(*_data(seed=step % 2))
            return _states(net)

    replayed, plain = run(True), run(False)
    assert "opt/loss_scale" in replayed
    for k in replayed:  # float16 products: equal up to float16 rounding of fused programs
        np.testing.assert_allclose(replayed[k], plain[k], rtol=2e-3, atol=2e-4, err_msg=k)


def test_pytorch_style_backward_and_update_still_work():
    def run(replayed):
        with autograd.eager_replay(replayed):
            device.get_default_device().SetRandSeed(0)
            net = Net()
            net.compile([_data()[0]], is_train=True, use_graph=False)
            params = [p for p in net.get_params().values()]
            for p in params:
                p.requires_grad_()
            autograd.training = True
            try:
                for step in range(WARMUP):
                    out = net.forward(_data(seed=step % 2)[0])
                    loss = autograd.reduce_mean(autograd.mul(out, out), None, 0)
                    loss.backward()
                    for p in params:
                        p.data -= 0.01 * p.grad.data
                        p.grad = None
            finally:
                autograd.training = False
            return {p.name: tensor.to_numpy(p) for p in params}

    replayed, plain = run(True), run(False)
    for k in replayed:
        np.testing.assert_allclose(replayed[k], plain[k], **_close(), err_msg=k)


def test_a_plain_loop_that_reads_nothing_replays_each_step_as_one_program():
    """No Model call (whose end runs what is pending) and no guard (whose step() reads its
    state): the optimizer's call ends the recorded step itself."""
    def run(replayed):
        with autograd.eager_replay(replayed):
            net = _build(opt.SGD(lr=0.05, momentum=0.9))
            net.optimizer.skip_nonfinite = False
            autograd.training = True
            counts = []
            try:
                for step in range(WARMUP + 3):
                    before = autograd.replay_stats()["replayed"]
                    x, y = _data(seed=step % 2)
                    net.optimizer(net.loss(net.forward(x), y))
                    counts.append(autograd.replay_stats()["replayed"] - before)
            finally:
                autograd.training = False
            return counts, _states(net)

    counts, replayed = run(True)
    assert counts[-3:] == [1, 1, 1]  # one program per step, from the step's recurrence on
    _, plain = run(False)
    for k in replayed:
        np.testing.assert_allclose(replayed[k], plain[k], **_close(), err_msg=k)


def test_a_replayed_step_that_raises_after_its_update_leaves_the_state_as_it_was():
    class Failing(Net):
        fail = False

        def train_one_batch(self, x, y):
            out, loss = super().train_one_batch(x, y)
            if self.fail:
                raise RuntimeError("after the update")
            return out, loss

    device.get_default_device().SetRandSeed(0)
    net = Failing()
    net.set_optimizer(_sgd())
    net.compile([_data()[0]], is_train=True, use_graph=False)
    x, y = _data()
    _warm(net, x, y)
    before = _states(net)
    net.fail = True
    with pytest.raises(RuntimeError, match="after the update"):
        net(x, y)
    after = _states(net)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


