"""A failed model call changes nothing; graph-mode value checks fail the step at its end with
nothing applied; models train without compile(); two threads train their own models exactly as
one thread would (issue: reliability)."""
import threading

import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor


class Net(model.Model):
    """Linear -> BatchNorm -> ReLU -> Dropout -> Linear, softmax cross-entropy, SGD momentum:
    every kind of state (params, BN statistics, optimizer slots, step counter, device key)."""

    def __init__(self, dropout: float = 0.2):
        super().__init__()
        self.l1, self.bn, self.relu = layer.Linear(8), layer.BatchNorm2d(), layer.ReLU()
        self.drop, self.l2 = layer.Dropout(dropout), layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()
        self.fail_after_update = False

    def forward(self, x):
        h = self.l1(x)
        h = autograd.reshape(self.bn(autograd.reshape(h, (h.shape[0], 8, 1, 1))), (h.shape[0], 8))
        return self.l2(self.drop(self.relu(h)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        if self.fail_after_update:
            raise RuntimeError("failing after the update")
        return out, loss


def batch(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return (tensor.from_numpy(rng.normal(size=(n, 5)).astype(np.float32)),
            tensor.from_numpy(rng.integers(0, 3, size=n).astype(np.int32)))


def snapshot(m):
    """Every value a step may change: the model's states, the optimizer's, all device keys."""
    values = {f"m/{k}": np.asarray(v.array) for k, v in m.get_states().items()}
    values.update({f"o/{k}": np.asarray(v.array) for k, v in m.optimizer.get_states().items()})
    values.update({f"key/{i}": np.asarray(d.key) for i, d in enumerate(device.all_devices())})
    return values


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def make(graph, dropout=0.2, seed=None):
    if seed is not None:
        device.get_default_device().SetRandSeed(seed)
    m = Net(dropout)
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    x, _ = batch()
    m.compile([x], is_train=True, use_graph=graph)
    return m


@pytest.mark.parametrize("graph", [False, True])
def test_a_failed_step_changes_nothing(graph):
    m = make(graph, seed=3)
    x, y = batch()
    m(x, y)  # slots and counters exist now
    before = snapshot(m)
    m.fail_after_update = True
    x3, y3 = batch(3, seed=1)  # a new batch size: graph mode traces this call
    with pytest.raises(RuntimeError, match="after the update"):
        m(x3, y3)
    assert_same(before, snapshot(m))
    m.fail_after_update = False
    m(x, y)  # and the model trains on as if nothing happened
    fresh = make(graph, seed=3)
    fresh(x, y)
    fresh(x, y)
    for k, v in snapshot(fresh).items():
        np.testing.assert_allclose(snapshot(m)[k], v, rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("graph", [False, True])
def test_a_failed_first_call_leaves_no_half_built_model(graph):
    device.get_default_device().SetRandSeed(7)
    m = Net()
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    m.graph(graph)
    m.fail_after_update = True
    x, y = batch()
    with pytest.raises(RuntimeError):
        m(x, y)  # no compile(): the first call builds the layers, then fails
    assert m.optimizer.get_states() == {} or all(
        np.all(np.isfinite(np.asarray(v.array))) for v in m.optimizer.get_states().values())
    m.fail_after_update = False
    m(x, y)
    device.get_default_device().SetRandSeed(7)
    ref = Net()
    ref.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    ref.graph(graph)
    ref(x, y)
    np.testing.assert_allclose(tensor.to_numpy(m.l1.W), tensor.to_numpy(ref.l1.W), rtol=1e-6)
    assert np.abs(tensor.to_numpy(m.l1.W)).sum() > 0  # not the zeros a failed trace left


@pytest.mark.parametrize("graph", [False, True])
def test_training_without_compile_works_whatever_the_flag(graph):
    autograd.training = False  # a SINGA program may leave it so; the model's own mode rules
    m = Net(dropout=0.0)
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    m.graph(graph)
    x, y = batch(16)
    losses = [float(tensor.to_numpy(m(x, y)[1]).reshape(-1)[0]) for _ in range(15)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("graph", [False, True])
def test_bad_labels_fail_the_step_with_nothing_applied(graph):
    m = make(graph)
    x, y = batch()
    m(x, y)
    before = snapshot(m)
    bad = tensor.from_numpy(np.array([0, 1, 3, 1], np.int32))
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        m(x, bad)
    assert_same(before, snapshot(m))
    negative = tensor.from_numpy(np.array([0, -1, 2, 1], np.int32))
    with pytest.raises(ValueError, match="-1"):
        m(x, negative)
    assert_same(before, snapshot(m))
    m(x, y)  # the good batch still trains
    assert not np.array_equal(before["m/l2.W"], tensor.to_numpy(m.l2.W))


def in_threads(*jobs):
    """Run each job in its own thread at once; their results, or the first error raised."""
    results, errors = [None] * len(jobs), []

    def run(i):
        try:
            results[i] = jobs[i]()
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def train(m, steps, seed):
    data = [batch(8, seed=seed * 10 + i) for i in range(4)]
    losses = []
    for s in range(steps):
        x, y = data[s % 4]
        losses.append(np.asarray(m(x, y)[1].array))
    return losses, snapshot_params(m)


def snapshot_params(m):
    return {k: np.asarray(v.array) for k, v in m.get_states().items()}


@pytest.mark.parametrize("modes", [(False, True), (True, True)])
def test_two_threads_train_their_own_models_as_one_thread_would(modes):
    steps = 60
    # alone, one after the other (dropout off: the device key is shared by every model)
    alone = []
    for graph, seed in zip(modes, (1, 2)):
        alone.append(train(make(graph, dropout=0.0, seed=seed), steps, seed))
    models = [make(graph, dropout=0.0, seed=seed) for graph, seed in zip(modes, (1, 2))]
    results = in_threads(lambda: train(models[0], steps, 1), lambda: train(models[1], steps, 2))
    for (losses_a, params_a), (losses_t, params_t) in zip(alone, results):
        for a, b in zip(losses_a, losses_t):
            np.testing.assert_array_equal(a, b)
        for k in params_a:
            np.testing.assert_array_equal(params_a[k], params_t[k], err_msg=k)


def test_one_thread_trains_while_another_evaluates():
    trainer, evaluator = make(True, dropout=0.0), make(True, dropout=0.0)
    evaluator.eval()
    x, _ = batch(8)
    expected = tensor.to_numpy(evaluator(x))
    outputs, (losses, _) = in_threads(
        lambda: [tensor.to_numpy(evaluator(x)) for _ in range(40)],
        lambda: train(trainer, 60, 3))
    assert losses[-1].reshape(-1)[0] < losses[0].reshape(-1)[0]
    for out in outputs:  # eval mode all along: BN uses running stats, nothing drifts
        np.testing.assert_array_equal(out, expected)


def test_two_threads_drawing_from_the_shared_device_key_do_not_crash():
    """With dropout both compiled steps read and donate the device's key: the runs take turns
    on it (graph._key_locks), so neither passes a donated key, and no key is used twice."""
    models = [make(True, dropout=0.3, seed=s) for s in (1, 2)]

    def losses(m):
        return [float(np.asarray(m(*batch(8, seed=s))[1].array).reshape(-1)[0])
                for s in range(40)]

    runs = in_threads(lambda: losses(models[0]), lambda: losses(models[1]))
    assert all(len(ls) == 40 and np.all(np.isfinite(ls)) for ls in runs)
