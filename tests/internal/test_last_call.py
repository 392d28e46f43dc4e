"""A one-operator layer's call recorded from its last call's recipe (layers/last_call.py).
Every check compares against the same calls with no layer learning its call (``learn`` replaced
by a plain ``forward``): outputs, gradients, running statistics and a training run. Float32 on
the CPU, the same kernels either way: identical values."""
from __future__ import annotations

import copy
import pickle
from typing import Any, List

import numpy as np
import pytest

from singa_jax import autograd, layer, opt, tensor
from singa_jax._src.autodiff import recipes
from singa_jax._src.base import observe
from singa_jax._src.layers import last_call
from singa_jax._src.base.modes import training_mode
from test_replay import Net
from test_transactions import in_threads


@pytest.fixture
def again_used(monkeypatch) -> List[Any]:
    """Each LastCall.again call: the layer's output it recorded, or None (the whole path)."""
    made: List[Any] = []
    again = last_call.LastCall.again

    def counting(self, layer_, inputs):
        y = again(self, layer_, inputs)
        made.append(y)
        return y

    monkeypatch.setattr(last_call.LastCall, "again", counting)
    return made


def _no_learning(monkeypatch) -> None:
    monkeypatch.setattr(last_call, "learn", lambda layer_, inputs: layer_.forward(*inputs))


class _Blocks(Net):
    """test_replay's Net (its Flatten, Linear, loss and training step) with one ReLU layer
    shared by its three blocks: a learnt call used at three places."""

    def __init__(self) -> None:
        super().__init__(depth=0)
        self.convs = [layer.Conv2d(4, 3, padding=1) for _ in range(3)]
        self.bns = [layer.BatchNorm2d(4) for _ in range(3)]
        self.relu = layer.ReLU()
        for i, (c, b) in enumerate(zip(self.convs, self.bns)):
            setattr(self, f"conv{i}", c)
            setattr(self, f"bn{i}", b)

    def forward(self, x):
        for c, b in zip(self.convs, self.bns):
            x = self.relu(b(c(x)))
        return self.fc(self.flatten(x))


def _train(seed_data, steps: int) -> List[np.ndarray]:
    x, y = seed_data
    net = _Blocks()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([x], is_train=True, use_graph=False)
    for t in net.get_states().values():  # the same start for both runs
        t.copy_from_numpy(np.linspace(-0.5, 0.5, t.size(), dtype=np.float32).reshape(t.shape))
    losses = []
    net.train()
    for _ in range(steps):
        _, loss = net(x, y)
        losses.append(tensor.to_numpy(loss).item())
    net.eval()
    out = tensor.to_numpy(net(x))
    states = [tensor.to_numpy(t) for _, t in sorted(net.get_states().items())]
    return [np.array(losses), out, *states]


@pytest.fixture
def data(rng):
    x = tensor.from_numpy(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    y = tensor.from_numpy(np.array([0, 2], dtype=np.int32))
    return x, y


def test_training_with_learnt_calls_equals_training_without(data, again_used, monkeypatch):
    """A model's training steps and evaluation with its Conv2d, BatchNorm2d and ReLU calls
    recorded from their last calls: the losses, output and every parameter, statistic and
    optimizer state equal those of the whole path, bit for bit; and the loss falls."""
    learnt = _train(data, 8)
    hits = sum(y is not None for y in again_used)
    assert hits >= 6 * 7  # 3 convs, 3 batch norms, 3 relus per step, after the first steps
    _no_learning(monkeypatch)
    del again_used[:]
    whole = _train(data, 8)
    assert not again_used
    for a, b in zip(learnt, whole):
        np.testing.assert_array_equal(a, b)
    assert learnt[0][-1] < learnt[0][0]


def test_a_learnt_call_follows_what_the_layer_became(rng, again_used):
    """Recorded from the last call only while nothing it depends on changed: a parameter
    replaced, another input shape, another mode (BatchNorm2d's running statistics in evaluation)
    each take the whole path, and the output is the layer's as it is now."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv, bn = layer.Conv2d(3, 4, 3, padding=1), layer.BatchNorm2d(4)
    with training_mode(True):
        for _ in range(3):
            conv(x)
        assert again_used[-1] is not None
        new_W = tensor.from_numpy(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
        conv.W = new_W
        y = conv(x)
        assert again_used[-1] is None  # (another structure: the whole path, learning again)
        np.testing.assert_allclose(tensor.to_numpy(y), tensor.to_numpy(
            autograd.conv2d(conv.handle, x, new_W, conv.b)), rtol=1e-6, atol=1e-6)
        assert y.creator.src[1][1] == id(new_W)
        conv(x)
        assert again_used[-1] is not None
        wide = tensor.from_numpy(rng.standard_normal((2, 3, 7, 7)).astype(np.float32))
        assert conv(wide).shape == (2, 4, 7, 7) and again_used[-1] is None
        h = conv(x)
        bn(h)
        bn(h)
        assert again_used[-1] is not None
        trained_mean = tensor.to_numpy(bn.running_mean)
    with training_mode(False):
        out = bn(h)
        assert again_used[-1] is None  # (the evaluation mode: another recipe)
        mean, var = trained_mean, tensor.to_numpy(bn.running_var)
        expected = (tensor.to_numpy(h) - mean[None, :, None, None]) / np.sqrt(
            var[None, :, None, None] + 1e-5)
        np.testing.assert_allclose(tensor.to_numpy(out), expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(tensor.to_numpy(bn.running_mean), trained_mean)


def test_only_the_declared_classes_learn(rng, again_used):
    """A subclass overriding forward, an instance given its own forward, a convolution with
    its ReLU (two operators) and a layer of options (Flatten) never skip their forward."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))

    class Counted(layer.Conv2d):
        calls = 0

        def forward(self, x):  # (still one operator: only the class tells it apart)
            type(self).calls += 1
            return super().forward(x)

    counted = Counted(4, 3, padding=1)
    fused = layer.Conv2d(4, 3, padding=1, activation="RELU")
    flatten = layer.Flatten()
    own = layer.Conv2d(4, 3, padding=1)
    own(x)
    calls = []
    own.forward = lambda x: calls.append(x) or layer.Conv2d.forward(own, x)
    with training_mode(False):
        for _ in range(3):
            d = counted(x)
            f = fused(x)
            flatten(x)
            own(x)
    assert not any(y is not None for y in again_used)
    assert len(calls) == 3 and Counted.calls == 3
    plain = autograd.conv2d(counted.handle, x, counted.W, counted.b)
    np.testing.assert_array_equal(tensor.to_numpy(d), tensor.to_numpy(plain))
    assert (tensor.to_numpy(f) >= 0).all()
    for lay in (counted, fused, flatten):
        assert last_call.ATTRIBUTE not in lay.__dict__


def test_observed_and_copied_layers_take_the_whole_path(rng, again_used, monkeypatch):
    """With an observer on (a profiler naming layers) a learnt call goes the whole way; a
    layer's copied or pickled state leaves its learnt call out (its recipe holder is the
    original's)."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv = layer.Conv2d(4, 3, padding=1)
    with training_mode(False):
        conv(x)
        conv(x)
        assert last_call.ATTRIBUTE in conv.__dict__
        monkeypatch.setattr(observe, "on", True)
        conv(x)
        assert again_used[-1] is None
        monkeypatch.setattr(observe, "on", False)
        assert last_call.ATTRIBUTE not in conv.__getstate__()
        relu = layer.ReLU()
        relu(x)
        relu(x)
        assert last_call.ATTRIBUTE in relu.__dict__
        for other in (copy.deepcopy(relu), pickle.loads(pickle.dumps(relu))):
            assert last_call.ATTRIBUTE not in other.__dict__
            np.testing.assert_array_equal(tensor.to_numpy(other(x)), tensor.to_numpy(relu(x)))


def test_recipes_off_or_replay_off_take_the_whole_path(rng, again_used, monkeypatch):
    """With the per-kind recipes off or eager replay off, a layer's call is the generic
    path's, and its gradients are those of the learnt call."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv = layer.Conv2d(4, 3, padding=1)
    grads = []
    with training_mode(True):
        for variant in ("learnt", "recipes off", "replay off"):
            if variant == "recipes off":
                monkeypatch.setattr(recipes, "ENABLED", False)
            if variant == "replay off":
                monkeypatch.setattr(recipes, "ENABLED", True)
            with autograd.eager_replay(variant != "replay off"):
                conv(x)
                y = conv(x)
                assert (again_used[-1] is not None) == (variant == "learnt")
                loss = autograd.sum(autograd.mul(y, y))
                grads.append({id(p): tensor.to_numpy(g) for p, g in autograd.backward(loss)})
    for g in grads[1:]:
        assert g.keys() == grads[0].keys()
        for k in g:
            np.testing.assert_allclose(g[k], grads[0][k], rtol=1e-5, atol=1e-6)


def test_a_call_of_more_than_one_operator_is_not_learnt(rng, again_used):
    """A declared class whose call also makes an operator of the generic path (its output kept
    aside, not returned) never skips its forward: that operator is made at every call."""

    @last_call.one_operator
    class WithSideOperator(layer.Layer):
        def forward(self, x):
            self.__dict__["side"] = autograd.Abs()(x)[0]  # (no structure change)
            return autograd.relu(x)

    x = tensor.from_numpy(rng.standard_normal((2, 3)).astype(np.float32))
    lay = WithSideOperator()
    sides = []
    for _ in range(3):
        np.testing.assert_array_equal(tensor.to_numpy(lay(x)), np.maximum(tensor.to_numpy(x), 0))
        sides.append(lay.side.creator)
    assert len(set(map(id, sides))) == 3 and not any(y is not None for y in again_used)
    assert last_call.ATTRIBUTE not in lay.__dict__


def test_a_forward_patched_on_the_class_is_called(rng, again_used, monkeypatch):
    """A learnt call stands for the class's forward as it was learnt: patched since (say, to
    instrument every ReLU), the patch runs."""
    x = tensor.from_numpy(rng.standard_normal((2, 3)).astype(np.float32))
    relu = layer.ReLU()
    relu(x)
    relu(x)
    assert again_used[-1] is not None
    seen = []
    forward = layer.ReLU.forward
    monkeypatch.setattr(layer.ReLU, "forward", lambda self, x: seen.append(x) or forward(self, x))
    for _ in range(2):
        np.testing.assert_array_equal(tensor.to_numpy(relu(x)), np.maximum(tensor.to_numpy(x), 0))
    assert len(seen) == 2 and again_used[-1] is None


def test_threads_sharing_a_layer_get_their_own_results(rng):
    """Two threads calling one learnt Conv2d (each recording into its own segment) on their
    own inputs, in turns as the scheduler pleases: each call's output is the convolution of its
    own input."""
    conv = layer.Conv2d(4, 3, padding=1)
    inputs = [rng.standard_normal((2, 3, 5, 5)).astype(np.float32) for _ in range(2)]
    conv(tensor.from_numpy(inputs[0]))
    conv(tensor.from_numpy(inputs[0]))
    assert last_call.ATTRIBUTE in conv.__dict__
    expected = [tensor.to_numpy(autograd.conv2d(conv.handle, tensor.from_numpy(a), conv.W,
                                                conv.b)) for a in inputs]
    def calls(i: int) -> None:
        x = tensor.from_numpy(inputs[i])
        for _ in range(40):
            np.testing.assert_allclose(tensor.to_numpy(conv(x)), expected[i], rtol=1e-5,
                                       atol=1e-5)

    in_threads(lambda: calls(0), lambda: calls(1))
