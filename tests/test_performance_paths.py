"""singa_jax's fast paths give the numbers of the paths they replace.

* max pooling over tiling windows (reshape + max, first-argmax custom_vjp) equals XLA's
  reduce_window lowering, values and gradients, ties included;
* graph mode's CPU compile options, and the fallback when a jaxlib rejects one; a step's own
  options unless its program holds a depthwise convolution; eager kernels take their own
  options (YNNPACK for single dots) when called outside any trace, and work inside one;
* compile()'s abstract initialisation gives the parameters an eager forward gives, and lowers
  no program for a new parameter shape (fills and random draws assembled on the host on CPU);
* a training step compiles once per signature (its optimizer slots learnt by a first trace);
* eager mode computes no gradient for a plain input batch;
* fills (``Tensor(shape)``, ``set_value``) are made by NumPy on CPU, by the device in traces;
* the persistent compilation cache setting and its opt-out;
* glibc's malloc thresholds pinned for XLA:CPU's buffers (no page faults per fresh buffer),
  and left alone when opted out or set by the user.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from singa_jax import autograd, device, layer, model, opt, tensor


def reduce_window_max(x, kernel):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1) + kernel, (1, 1) + kernel,
                             ((0, 0),) * 4)


def test_max_pool_layer_uses_tiles_and_matches_jax_grad():
    rng = np.random.default_rng(1)
    x_np = rng.integers(0, 4, (2, 3, 6, 6)).astype(np.float32)
    dy = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    x = tensor.Tensor(data=x_np, stores_grad=True)
    prev = autograd.training
    autograd.training = True
    try:
        y = layer.MaxPool2d(2, 2)(x)
        loss = autograd.reduce_sum(autograd.mul(y, tensor.Tensor(data=dy, requires_grad=False)))
        grads = {id(p): g for p, g in autograd.backward(loss)}
    finally:
        autograd.training = prev
    ref = jax.grad(lambda a: jnp.sum(reduce_window_max(a, (2, 2)) * dy))(jnp.asarray(x_np))
    np.testing.assert_array_equal(np.asarray(y.array), reduce_window_max(x_np, (2, 2)))
    np.testing.assert_array_equal(np.asarray(grads[id(x)].array), ref)


# --- models ----------------------------------------------------------------------------------
class _Classifier(model.Model):
    """A model trained on softmax cross-entropy by its optimizer (subclasses give forward)."""

    def __init__(self):
        super().__init__()
        self.loss = layer.SoftMaxCrossEntropy()

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class Net(_Classifier):
    def __init__(self, channels: int = 4, classes: int = 5):
        super().__init__()
        self.conv = layer.Conv2d(channels, 3, padding=1)
        self.bn = layer.BatchNorm2d(channels)
        self.pool = layer.MaxPool2d(2, 2)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(classes)

    def forward(self, x):
        return self.fc(self.flat(self.pool(autograd.relu(self.bn(self.conv(x))))))


SHAPE = (4, 2, 6, 6)


def data(step):
    rng = np.random.default_rng(10 + step)
    x = tensor.from_numpy(rng.standard_normal(SHAPE).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 5, SHAPE[0]).astype(np.int32))
    return x, y


def build(use_graph):
    device.get_default_device().SetRandSeed(5)
    net = Net()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([tensor.Tensor(SHAPE)], is_train=True, use_graph=use_graph)
    return net


def test_abstract_initialisation_gives_the_eager_parameters():
    compiled = build(False)
    key_after = np.asarray(device.get_default_device().key)
    device.get_default_device().SetRandSeed(5)
    eager = Net()
    with _training(False):
        eager.forward(tensor.Tensor(SHAPE))  # today's way: an eager placeholder forward
    np.testing.assert_array_equal(np.asarray(device.get_default_device().key), key_after)
    a, b = compiled.get_states(), eager.get_states()
    assert a.keys() == b.keys() and len(a) == 8  # conv 2, bn 4, fc 2
    for k in a:
        assert not isinstance(a[k].array, jax.core.Tracer)
        np.testing.assert_array_equal(np.asarray(a[k].array), np.asarray(b[k].array), err_msg=k)


class _training:
    def __init__(self, mode):
        self.mode = mode

    def __enter__(self):
        self.prev = autograd.training
        autograd.training = self.mode

    def __exit__(self, *exc):
        autograd.training = self.prev


def test_a_training_step_compiles_once_and_equals_eager():
    eager, compiled = build(False), build(True)
    for s in range(3):
        x, y = data(s)
        _, le = eager(x, y)
        _, lg = compiled(x, y)
        np.testing.assert_allclose(np.asarray(lg.array), np.asarray(le.array), rtol=1e-5,
                                   atol=1e-6)
    # the momentum slots are made before the first trace, which takes them: one trace, one
    # compilation (tests/test_first_step.py)
    stats = compiled.graph_stats()
    assert stats["compiles"] == 1 and stats["traces"] == 1 and stats["programs"] == 1
    for k, t in eager.get_states().items():
        np.testing.assert_allclose(np.asarray(compiled.get_states()[k].array),
                                   np.asarray(t.array), rtol=1e-5, atol=1e-6, err_msg=k)
    slots = compiled.optimizer.get_states()
    for k, t in eager.optimizer.get_states().items():
        np.testing.assert_allclose(np.asarray(slots[k].array), np.asarray(t.array),
                                   rtol=1e-5, atol=1e-6, err_msg=k)


