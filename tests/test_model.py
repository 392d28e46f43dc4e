"""Model API: compile / train / eval / graph mode with real layers and optimizers.

Graph mode (one compiled XLA program per step) must give eager mode's numbers to 1e-5 relative
over many steps from the same seeds (float32 products; on a GPU, TF32's rounding in each
program: backend_precision.two_programs_tolerance): losses, parameters, batch-norm statistics,
optimizer state, and exactly the step counter and the device's PRNG key.
"""
import jax
import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax.model import GraphModeError

from backend_precision import two_programs_tolerance


def counts(net, *keys):
    """Graph mode's counts of ``net`` (``Model.graph_stats``) for ``keys``."""
    stats = net.graph_stats()
    return tuple(stats[k] for k in keys)


class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1 = layer.Linear(12)
        self.relu = layer.ReLU()
        self.drop = layer.Dropout(0.3)
        self.fc2 = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(self.drop(self.relu(self.fc1(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class SmallCNN(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(4, 3, padding=1, bias=False)  # BN cancels a bias
        self.bn = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.pool = layer.MaxPool2d(2, 2)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pool(self.relu(self.bn(self.conv(x))))
        return self.fc(self.flatten(y))

    def train_one_batch(self, x, y, dist_option="plain"):
        out = self.forward(x)
        loss = self.loss(out, y)
        if dist_option == "plain":  # a static (non-tensor) argument, as in SINGA's examples
            self.optimizer(loss)
        return out, loss


MLP_IN, CNN_IN = (6, 5), (4, 2, 6, 6)


def data(shape, step):
    rng = np.random.default_rng(1000 + step)
    x = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 3, shape[0]).astype(np.int32))
    return x, y


def build(cls, make_opt, use_graph, in_shape, seed=3):
    device.get_default_device().SetRandSeed(seed)
    m = cls()
    m.set_optimizer(make_opt())
    m.compile([tensor.Tensor(in_shape)], is_train=True, use_graph=use_graph)
    return m


def train(cls, make_opt, use_graph, in_shape, steps=8, sizes=None):
    m = build(cls, make_opt, use_graph, in_shape)
    losses = []
    for s in range(steps):
        shape = (sizes[s],) + in_shape[1:] if sizes else in_shape
        out, loss = m(*data(shape, s))
        assert isinstance(loss, tensor.Tensor)
        losses.append(tensor.to_numpy(loss).item())
    return m, np.array(losses)


def snapshot(m):
    states = {k: tensor.to_numpy(v) for k, v in m.get_states().items()}
    states.update({f"opt/{k}": tensor.to_numpy(v) for k, v in m.optimizer.get_states().items()})
    states["key"] = np.asarray(device.get_default_device().key)
    return states


def assert_same_states(a, b):
    """Eager vs graph mode: two programs, 1e-5 apart in float32 (their own TF32 roundings
    apart on a GPU); integer state (counters, the RNG key) exactly equal."""
    assert a.keys() == b.keys()
    for k in a:
        if np.issubdtype(np.asarray(a[k]).dtype, np.floating):
            np.testing.assert_allclose(a[k], b[k], **two_programs_tolerance(1e-5, 1e-6),
                                       err_msg=k)
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(autouse=True)
def restore_training_flag():
    prev = autograd.training
    yield
    autograd.training = prev


OPTIMIZERS = {
    "sgd_momentum": lambda: opt.SGD(lr=0.1, momentum=0.9),
    "sgd_decay_schedule": lambda: opt.SGD(lr=opt.ExponentialDecay(0.2, 2, 0.5), momentum=0.5,
                                          weight_decay=1e-3),
    "adam": lambda: opt.Adam(lr=0.01),
    "rmsprop": lambda: opt.RMSProp(lr=0.01),
    "adagrad": lambda: opt.AdaGrad(lr=0.05),
}


@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
def test_mlp_with_dropout_graph_equals_eager(name):
    eager, le = train(MLP, OPTIMIZERS[name], False, MLP_IN)
    graph, lg = train(MLP, OPTIMIZERS[name], True, MLP_IN)
    np.testing.assert_allclose(lg, le, **two_programs_tolerance(1e-5))
    assert_same_states(snapshot(eager), snapshot(graph))
    # the optimizer's slots are made before the first trace, which takes them as inputs: one
    # trace and one XLA compilation, the program reused from then on
    assert counts(graph, "traces", "compiles") == (1, 1)
    assert graph.graph_stats()["programs"] == 1
    assert eager.graph_stats()["traces"] == 0


@pytest.mark.parametrize("name", ["sgd_decay_schedule", "adam", "rmsprop", "adagrad"])
def test_cnn_with_batchnorm_graph_equals_eager(name):
    steps = 5
    eager, le = train(SmallCNN, OPTIMIZERS[name], False, CNN_IN, steps=steps)
    graph, lg = train(SmallCNN, OPTIMIZERS[name], True, CNN_IN, steps=steps)
    np.testing.assert_allclose(lg, le, **two_programs_tolerance(1e-5))
    a, b = snapshot(eager), snapshot(graph)
    assert_same_states(a, b)
    assert np.abs(b["bn.running_mean"]).sum() > 0  # statistics were really updated
    assert b["opt/step_counter"].item() == steps
    if name == "sgd_decay_schedule":  # the schedule advanced inside the compiled step
        lr = tensor.to_numpy(graph.optimizer.lr_value).item()
        np.testing.assert_allclose(lr, 0.2 * 0.5 ** (steps / 2), rtol=1e-6)


def test_training_reduces_the_loss_in_graph_mode():
    m = build(SmallCNN, OPTIMIZERS["adam"], True, CNN_IN)
    x, y = data(CNN_IN, 0)
    losses = [tensor.to_numpy(m(x, y)[1]).item() for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]


def test_new_batch_size_retraces_and_old_programs_are_reused():
    sizes = [4, 4, 6, 4, 6]
    graph, losses = train(SmallCNN, OPTIMIZERS["adam"], True, CNN_IN, steps=5, sizes=sizes)
    assert np.isfinite(losses).all()
    assert graph.graph_stats()["traces"] == 2  # batch 4, batch 6
    assert graph.graph_stats()["programs"] == 2


def test_static_argument_is_part_of_the_program_key():
    m = build(SmallCNN, OPTIMIZERS["adam"], True, CNN_IN)
    x, y = data(CNN_IN, 0)
    m(x, y, "plain")
    m(x, y, "plain")
    before = {k: tensor.to_numpy(v) for k, v in m.get_params().items()}
    count = m.graph_stats()["traces"]
    m(x, y, "no_update")
    assert m.graph_stats()["traces"] == count + 1
    for k, v in m.get_params().items():  # the other branch: parameters untouched
        np.testing.assert_array_equal(before[k], tensor.to_numpy(v))


def test_eval_after_train_is_compiled_and_uses_running_statistics():
    eager, _ = train(SmallCNN, OPTIMIZERS["adam"], False, CNN_IN, steps=3)
    graph, _ = train(SmallCNN, OPTIMIZERS["adam"], True, CNN_IN, steps=3)
    eager.eval()
    graph.eval()
    assert autograd.training is False
    x, _ = data(CNN_IN, 99)
    before = snapshot(graph)
    count = graph.graph_stats()["traces"]
    outs = [tensor.to_numpy(graph(x)) for _ in range(3)]  # eager first call, then compiled
    out_eager = tensor.to_numpy(eager(x))
    assert graph.graph_stats()["traces"] == count + 1
    for out in outs:
        np.testing.assert_allclose(out, out_eager, rtol=1e-5, atol=1e-6)
    after = snapshot(graph)
    for k in before:  # evaluation changes no state, BN statistics included
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    # back to training: the cached training program is reused
    graph.train()
    graph(*data(CNN_IN, 5))
    assert graph.graph_stats()["traces"] == count + 1


def test_compile_initialises_without_touching_statistics():
    m = build(SmallCNN, OPTIMIZERS["adam"], True, CNN_IN)
    names = set(m.get_states())
    assert {"conv.W", "fc.W", "fc.b", "bn.running_mean", "bn.running_var"} <= names
    np.testing.assert_array_equal(tensor.to_numpy(m.get_states()["bn.running_mean"]), 0)
    assert m.training and m.graph_mode and autograd.training
    m2 = SmallCNN()
    m2.compile([tensor.Tensor(CNN_IN)], is_train=False, use_graph=False, sequential=True)
    assert not m2.training and not m2.graph_mode and m2.sequential and not autograd.training
    with pytest.raises(TypeError, match="compile"):
        m2.compile([np.zeros(CNN_IN)])


class Branchy(MLP):
    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        if tensor.to_numpy(loss).item() > 0:  # Python control flow on a tensor value
            self.optimizer(loss)
        return out, loss


def test_value_dependent_control_flow_raises_clear_error():
    m = build(Branchy, OPTIMIZERS["sgd_momentum"], True, MLP_IN)
    before = {k: tensor.to_numpy(v) for k, v in m.get_states().items()}
    with pytest.raises(GraphModeError, match=r"Branchy\.train_one_batch.*use_graph=False"):
        m(*data(MLP_IN, 0))  # the first call traces
    for k, v in m.get_states().items():
        assert not isinstance(v.array, jax.core.Tracer)
        np.testing.assert_array_equal(before[k], tensor.to_numpy(v))
    for k, v in m.optimizer.get_states().items():  # slots the failed trace created: no tracers
        assert not isinstance(v.array, jax.core.Tracer), k
    m.graph(False)  # the suggested fix works
    _, loss = m(*data(MLP_IN, 0))
    assert np.isfinite(tensor.to_numpy(loss)).all()


def test_graph_mode_needs_a_tensor_argument():
    m = build(MLP, OPTIMIZERS["sgd_momentum"], True, MLP_IN)
    with pytest.raises(ValueError, match="expects a Tensor"):
        m.train_one_batch()


def test_default_model_methods():
    m = model.Model()
    with pytest.raises(NotImplementedError):
        m.forward(tensor.Tensor((2,)))
    m.graph(False)
    with pytest.raises(NotImplementedError):
        m.train_one_batch(tensor.Tensor((2,)))
    m.set_optimizer("anything")
    assert m.optimizer == "anything"


def test_replaced_parameter_tensor_is_used_by_the_compiled_step():
    """Graph mode caches the model's state list; assigning a new parameter Tensor to a layer must
    invalidate it, so the next step reads and updates the new Tensor, not a stale one."""
    m = build(MLP, OPTIMIZERS["sgd_momentum"], True, MLP_IN)
    for s in range(3):
        m(*data(MLP_IN, s))
    old = m.fc2.W
    new_value = np.full(old.shape, 0.05, np.float32)
    m.fc2.W = tensor.Tensor(data=new_value, requires_grad=True, stores_grad=True)
    old_value = tensor.to_numpy(old)
    x, y = data(MLP_IN, 3)
    m(x, y)
    # the replacement made a new program: its new momentum slot (its key still owned by the
    # old tensor, so not made ahead) is learnt by a first trace, then the step is traced with
    # it as input and compiled once
    assert counts(m, "traces", "compiles") == (3, 2)
    np.testing.assert_array_equal(tensor.to_numpy(old), old_value)  # the old tensor is left alone
    moved = tensor.to_numpy(m.fc2.W)
    assert not np.allclose(moved, new_value)  # the new one was read and updated
    # and the update started from the new value: one SGD step moves it by at most lr * |grad|
    assert np.abs(moved - new_value).max() < 1.0


@pytest.mark.parametrize("use_graph", [False, True], ids=["eager", "graph"])
def test_assigning_a_hyper_parameter_takes_effect(use_graph):
    m = build(MLP, lambda: opt.SGD(lr=0.1, momentum=0.9), use_graph, MLP_IN)
    for s in range(3):
        m(*data(MLP_IN, s))
    with pytest.raises(ValueError, match="SGD: invalid lr"):
        m.optimizer.lr = -1.0  # validated like the constructor's, nothing changes
    assert m.optimizer.lr == opt.Constant(0.1)
    m.optimizer.lr = 0.0  # a number becomes a Constant; lr_value follows at once
    assert float(m.optimizer.lr_value.array[0]) == 0.0
    frozen = {k: tensor.to_numpy(v) for k, v in m.get_params().items()}
    for s in range(3, 5):
        m(*data(MLP_IN, s))  # graph mode compiles a new program: lr is baked in
    for k, v in m.get_params().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), frozen[k], err_msg=k)
    m.optimizer.lr = opt.ExponentialDecay(0.1, 1, 0.5)
    m(*data(MLP_IN, 5))
    assert any(not np.array_equal(tensor.to_numpy(v), frozen[k])
               for k, v in m.get_params().items())
    np.testing.assert_allclose(tensor.to_numpy(m.optimizer.lr_value), [0.1 * 0.5 ** 6],
                               rtol=1e-6)


def test_graph_mode_without_compile_builds_parameters_inside_the_first_step():
    """No compile(): the layers build their parameters inside the first (traced) step; they
    leave that program as outputs and are state from the second call on. Same numbers as eager
    (this once exposed an engine bug: a freed intermediate's id reused by a new parameter)."""
    runs = []
    for use_graph in (False, True):
        device.get_default_device().SetRandSeed(3)
        m = MLP()
        m.set_optimizer(OPTIMIZERS["adam"]())
        m.train(True)
        m.graph(use_graph)
        losses = [tensor.to_numpy(m(*data(MLP_IN, s))[1]).item() for s in range(4)]
        runs.append((np.array(losses), snapshot(m)))
    np.testing.assert_allclose(runs[1][0], runs[0][0], **two_programs_tolerance(1e-5))
    assert_same_states(runs[0][1], runs[1][1])
    assert len(runs[1][1]) == 4 + 1 + 8 + 1  # params, step counter, m and v slots, key
