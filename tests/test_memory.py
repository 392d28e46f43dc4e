"""Rematerialisation (``Layer.rematerialize``, ``Model.compile(remat=...)``): a training step
whose blocks are rematerialised keeps less for its backward -- the compiled graph-mode step's
own memory analysis says how much -- and computes the plain step's values and gradients.

Tolerances: float32 on the CPU; the rematerialised step computes the same operations in
another program, so losses agree to 1e-5 relative and, after three SGD steps through six
batch-norm blocks, which amplify rounding, states to 1e-4 relative (5e-5 absolute)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from singa_jax import debug, device, layer, model, opt, tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
from transformer import GPT  # noqa: E402  (the memory benchmark's model)


class Block(layer.Layer):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = layer.Conv2d(c, 3, padding=1), layer.BatchNorm2d(c)
        self.conv2, self.bn2 = layer.Conv2d(c, 3, padding=1), layer.BatchNorm2d(c)
        self.relu, self.add = layer.ReLU(), layer.Add()

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.add(x, self.bn2(self.conv2(y))))


class ResNetLike(model.Model):
    def __init__(self, blocks=6, c=16, dropout=0.0):
        super().__init__()
        self.stem = layer.Conv2d(c, 3, padding=1)
        self.blocks = [Block(c) for _ in range(blocks)]
        self.register_layers(*self.blocks)
        self.drop = layer.Dropout(dropout) if dropout else None
        self.flat, self.fc = layer.Flatten(), layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        x = self.flat(x)
        return self.fc(self.drop(x) if self.drop is not None else x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _cnn(graph, remat=None, per_block=False):
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    r = np.random.default_rng(0)
    x = tensor.from_numpy(r.normal(size=(8, 3, 16, 16)).astype(np.float32))
    y = tensor.from_numpy(r.integers(0, 10, 8).astype(np.int32))
    x.to_device(dev)
    y.to_device(dev)
    net = ResNetLike()
    net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    if per_block:
        net.compile([x], is_train=True, use_graph=graph)
        for b in net.blocks:
            b.rematerialize(remat)
    else:
        net.compile([x], is_train=True, use_graph=graph, remat=remat)
    return net, x, y


def _gpt(remat=None):
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    r = np.random.default_rng(0)
    ids = tensor.from_numpy(r.integers(0, 64, (4, 32)).astype(np.int32))
    targets = tensor.from_numpy(r.integers(0, 64, (4, 32)).astype(np.int32))
    ids.to_device(dev)
    targets.to_device(dev)
    net = GPT(vocab=64, seq=32, d_model=32, heads=2, layers=8)
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([ids], is_train=True, use_graph=True, remat=remat)
    return net, ids, targets


def _steps(net, *batch, n=3):
    debug.reset_stats()
    losses = [tensor.to_numpy(net(*batch)[1]).item() for _ in range(n)]
    states = {k: tensor.to_numpy(v) for k, v in net.get_states().items()}
    states.update({"opt/" + k: tensor.to_numpy(v)
                   for k, v in net.optimizer.get_states().items()})
    memory = debug.stats()["graph_steps"]
    return losses, states, memory


def _assert_same(got, want):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)  # the losses
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-4, atol=5e-5, err_msg=k)


@pytest.mark.parametrize("build", ["cnn", "gpt"])
def test_a_rematerialised_graph_step_holds_half_and_computes_the_plain_step(build):
    """The compiled step's temporaries at most half of the plain step's (XLA's memory
    analysis), with the plain step's losses, parameters, buffers and slots after 3 steps."""
    make = (lambda remat: _gpt(remat)) if build == "gpt" else (lambda remat: _cnn(True, remat))
    plain = _steps(*make(None))
    remat = _steps(*make("nothing"))
    _assert_same(remat, plain)
    (name, before), = plain[2].items()
    after = remat[2][name]
    assert after["temp_bytes"] <= 0.6 * before["temp_bytes"], (before, after)


@pytest.mark.parametrize("policy", ["nothing", "dots"])
def test_rematerialised_blocks_compute_the_plain_step_in_eager_mode(policy):
    plain = _steps(*_cnn(False))
    remat = _steps(*_cnn(False, policy, per_block=True))
    _assert_same(remat, plain)


def test_a_rematerialised_layer_with_dropout_recomputes_the_same_mask():
    """Dropout inside a rematerialised block: the backward's recomputation draws the mask the
    forward drew, so the gradients are those of the loss computed: with z = x W + b and
    y = dropout(z) = z * m, loss = sum(y^2) has dW = x^T (2 y m) and db = sum(2 y m), where
    m = y / z is read from the forward's own output."""
    from singa_jax import autograd
    dev = device.get_default_device()

    class Inner(layer.Layer):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = layer.Linear(4), layer.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.fc(x))

    inner = Inner()
    xs = np.random.default_rng(1).normal(size=(6, 5)).astype(np.float32)
    x = tensor.from_numpy(xs)
    x.to_device(dev)
    autograd.training = True
    try:
        inner(x)  # initialises
        inner.rematerialize("nothing")
        y = inner(x)
        loss = autograd.reduce_sum(autograd.mul(y, y), axes=None, keepdims=0)
        grads = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss)}
    finally:
        autograd.training = False
    w, b = tensor.to_numpy(inner.fc.W), tensor.to_numpy(inner.fc.b)
    ys = tensor.to_numpy(y)
    z = xs @ w + b
    m = np.where(z != 0, ys / np.where(z != 0, z, 1), 0)
    assert 0 < (ys == 0).mean() < 1  # some of the outputs were dropped, some kept
    dy = 2 * ys * m
    np.testing.assert_allclose(grads[inner.fc.W.name], xs.T @ dy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[inner.fc.b.name], dy.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_remat_policies_are_checked():
    with pytest.raises(ValueError, match="remat policy must be one of"):
        layer.Linear(3).rematerialize("everything")
    net, x, y = _cnn(True)
    with pytest.raises(ValueError, match="remat policy must be one of"):
        net.compile([x], is_train=True, use_graph=True, remat="some")
    if __import__("jax").default_backend() == "cpu":
        with pytest.raises(ValueError, match="'offload' keeps saved values in host memory"):
            layer.Linear(3).rematerialize("offload")
