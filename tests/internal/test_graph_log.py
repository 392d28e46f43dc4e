"""A training step's backward walk recorded again from its segment's graph log
(autodiff/graph_log.py, fused._WalkAgain), and only over the graph it was recorded over: a step
whose kernels are the same but whose graph is not (a detached input, other parameters, a weight
used twice) walks its own graph. (This tier imports singa_jax._src.)"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import pytest

from singa_jax import autograd, layer, model, opt, tensor
from singa_jax._src.autodiff import fused, graph_log
from singa_jax._src.base import process_state
from test_replay_step import _close
from test_torch_style import pytorch_style_step
from test_transactions import in_threads

pytestmark = pytest.mark.usefixtures("record_every_sequence")

STEPS = 8  # the walk is recorded again from the third step on (first, planned; second, learnt)


class _NoWalksAgain(dict):
    """fused._walks_again that keeps nothing: every walk reads its graph."""

    def __setitem__(self, key, value) -> None:
        pass


class Mlp(model.Model):
    """Four Linear layers; at the steps of ``detach_at`` the first layer's output is detached
    (the same kernels, the graph cut after the first layer); with ``tied``, odd steps call the
    second layer again in place of the third (the same kernels, one weight at two places)."""

    def __init__(self, detach_at=(), tied=False):
        super().__init__()
        self.fc0, self.fc1, self.fc1b = layer.Linear(6), layer.Linear(6), layer.Linear(6)
        self.fc2, self.relu = layer.Linear(3), layer.ReLU()
        self.loss = layer.SoftMaxCrossEntropy()
        self.detach_at, self.tied, self.calls = set(detach_at), tied, 0

    def forward(self, x):
        h = self.relu(self.fc0(x))
        if self.calls in self.detach_at:
            h = h.detach()
        h = self.relu(self.fc1(h))
        third = self.fc1 if self.tied and self.calls % 2 == 1 else self.fc1b
        return self.fc2(self.relu(third(h)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        self.calls += 1
        return out, loss


def _data(step: int):
    rng = np.random.default_rng(step)
    return (tensor.from_numpy(rng.standard_normal((4, 5)).astype(np.float32)),
            tensor.from_numpy(rng.integers(0, 3, 4).astype(np.int32)))


def _train(make: Callable[[], model.Model], again: bool, monkeypatch, steps: int = STEPS,
           models: int = 1) -> Dict[str, np.ndarray]:
    """Train ``models`` models made by ``make`` (in turns, one step each) from a cold start,
    walks recorded again (``again``) or not; every state by ``model/name``."""
    process_state.reset()
    monkeypatch.setattr(fused, "_walks_again", {} if again else _NoWalksAgain())
    nets = []
    for _ in range(models):
        net = make()
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        net.compile([_data(0)[0]], is_train=True, use_graph=False)
        nets.append(net)
    for step in range(steps):
        for net in nets:
            net.train()
            net(*_data(step))
    return {f"{k}/{name}": tensor.to_numpy(t) for k, net in enumerate(nets)
            for name, t in net.get_states().items()}


def _same(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> None:
    """Bit for bit: the walk recorded again is the call the graph's walk records (the same
    program runs on the same inputs)."""
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_recurring_steps_walk_is_recorded_again_with_the_walks_own_results(monkeypatch):
    before = autograd.replay_stats()["recorded_again"]
    again = _train(Mlp, True, monkeypatch)
    assert autograd.replay_stats()["recorded_again"] - before == STEPS - 2
    _same(again, _train(Mlp, False, monkeypatch))
    with autograd.eager_replay(False):
        by_op = _train(Mlp, False, monkeypatch)
    for name in by_op:
        np.testing.assert_allclose(again[name], by_op[name], err_msg=name, **_close())


@pytest.mark.parametrize("detach_at", [(3,), (3, 4, 6)], ids=["once", "some steps"])
def test_a_step_whose_graph_is_cut_walks_its_own_graph(monkeypatch, detach_at):
    # the same kernels each step; where the first layer's output is detached, fc0 gets no
    # gradient: a walk recorded again over the uncut graph would update it
    make = lambda: Mlp(detach_at=detach_at)  # noqa: E731
    again = _train(make, True, monkeypatch)
    _same(again, _train(make, False, monkeypatch))
    uncut = _train(Mlp, True, monkeypatch)
    assert not np.array_equal(again["0/fc0.W"], uncut["0/fc0.W"])


def test_a_model_of_the_same_kernels_gets_its_own_gradients(monkeypatch):
    # two models of one architecture trained in turns: each step is the same sequence of
    # kernels, over another model's parameters
    again = _train(Mlp, True, monkeypatch, models=2)
    _same(again, _train(Mlp, False, monkeypatch, models=2))
    assert not np.array_equal(again["0/fc0.W"], again["1/fc0.W"])


def test_a_weight_used_at_two_places_gets_both_gradients(monkeypatch):
    make = lambda: Mlp(tied=True)  # noqa: E731
    tied = _train(make, True, monkeypatch)
    _same(tied, _train(make, False, monkeypatch))
    assert not np.array_equal(tied["0/fc1.W"], _train(Mlp, True, monkeypatch)["0/fc1.W"])


def test_a_second_backward_through_the_step_graph_is_walked_again(monkeypatch):
    # SINGA's GAN loop: autograd.backward over the graph, then the optimizer over the same one
    class TwoWalks(Mlp):
        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = self.loss(out, y)
            grads = {id(p): g for p, g in autograd.backward(loss)}
            self.optimizer(loss)
            self.calls += 1
            self.grads = grads
            return out, loss

    _same(_train(TwoWalks, True, monkeypatch), _train(TwoWalks, False, monkeypatch))


class TorchStyle(Mlp):
    """The same model trained PyTorch-style: ``loss.backward()``, then an update per parameter
    (a walk that is never recorded into the step's segment)."""

    def train_one_batch(self, x, y):
        result = pytorch_style_step(self, x, y)
        self.calls += 1
        return result


def test_a_thread_that_walks_pytorch_style_keeps_no_graph_log(monkeypatch):
    # (in a thread of its own: whether a thread keeps logs is the thread's)
    added = []  # (one per graph log made)
    real = graph_log.GraphLog.__init__
    monkeypatch.setattr(graph_log.GraphLog, "__init__",
                        lambda self: added.append(1) or real(self))
    noted = {}

    def steps() -> None:
        _train(TorchStyle, True, monkeypatch)
        noted["pytorch-style"] = len(added)
        before = autograd.replay_stats()["recorded_again"]
        _train(Mlp, True, monkeypatch)
        noted["singa-style"] = len(added) - noted["pytorch-style"]
        noted["recorded again"] = autograd.replay_stats()["recorded_again"] - before

    in_threads(steps)
    assert noted["pytorch-style"] == 0
    assert noted["singa-style"] > 0 and noted["recorded again"] == STEPS - 2
