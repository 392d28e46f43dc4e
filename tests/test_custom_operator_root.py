"""A user's Operator at the root of a backward walk gets what SINGA's ``autograd.backward(y, dy)``
hands it: the Python float 1.0 when ``dy`` is None, ``float(dy)`` for a number, a CTensor for a
Tensor. SINGA's examples write loss operators against that (msmlp's ``SumError``:
``def backward(self, dy=1.0): ... dx *= dy`` on a Python Tensor)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax import singa_wrap as singa
from singa_jax.singa_wrap import CTensor


class SumError(autograd.Operator):
    """SINGA's msmlp loss, as its example writes it: the gradient is a Python Tensor of ones
    scaled in place by ``dy``."""

    def __init__(self):
        super().__init__()
        self.received = []

    def forward(self, x):
        self.data_x = x
        return singa.SumAll(x)

    def backward(self, dy=1.0):
        self.received.append(dy)
        dev = device.get_default_device()
        dx = tensor.Tensor(self.data_x.shape(), dev, tensor.float32)
        dx.copy_from_numpy(np.ones(self.data_x.shape(), np.float32))
        dx *= dy
        return dx


class ScaledSum(autograd.Operator):
    """The same loss on CTensors only, so that ``dx *= dy`` also takes the CTensor SINGA hands
    over for a Tensor ``dy``."""

    def __init__(self):
        super().__init__()
        self.received = []

    def forward(self, x):
        self.data_x = x
        return singa.SumAll(x)

    def backward(self, dy=1.0):
        self.received.append(dy)
        dx = singa.AddFloat(singa.MultFloat(self.data_x, 0.0), 1.0)
        dx *= dy
        return dx


def _data():
    rng = np.random.default_rng(4)
    return (rng.normal(size=(6, 5)).astype(np.float32),
            rng.normal(size=(5, 3)).astype(np.float32))


def _reference(x_np, w_np, scale=1.0):
    """d(scale * sum(relu(x @ w)))/dx, dw by jax.grad."""
    return jax.grad(lambda x, w: scale * jnp.sum(jax.nn.relu(x @ w)), argnums=(0, 1))(
        jnp.asarray(x_np), jnp.asarray(w_np))


def _graph(x_np, w_np, op):
    x = tensor.Tensor(data=x_np, requires_grad=True, stores_grad=True)
    w = tensor.Tensor(data=w_np, requires_grad=True, stores_grad=True)
    return x, w, op(autograd.relu(autograd.matmul(x, w)))[0]


def test_singas_sum_error_as_the_loss_gets_one_and_gives_jax_grads(training_mode):
    """Walked three times (a recurring walk is fused for built-in operators; this one, rooted
    at a user's operator, goes op by op), each time from the float 1.0."""
    x_np, w_np = _data()
    want = _reference(x_np, w_np)
    for _ in range(3):
        op = SumError()
        x, w, loss = _graph(x_np, w_np, op)
        grads = {id(p): g for p, g in autograd.backward(loss)}
        assert len(op.received) == 1 and type(op.received[0]) is float \
            and op.received[0] == 1.0
        np.testing.assert_allclose(tensor.to_numpy(grads[id(x)]), want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tensor.to_numpy(grads[id(w)]), want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dy", ["none", "number", "numpy number", "tensor"])
def test_a_ctensor_loss_operator_gets_what_singa_passes_for_each_dy(training_mode, dy):
    x_np, w_np = _data()
    given = {"none": None, "number": 2, "numpy number": np.float32(0.5),
             "tensor": tensor.Tensor(data=np.array([-1.5], np.float32))}[dy]
    scale = {"none": 1.0, "number": 2.0, "numpy number": 0.5, "tensor": -1.5}[dy]
    op = ScaledSum()
    x, w, loss = _graph(x_np, w_np, op)
    grads = {id(p): g for p, g in autograd.backward(loss, given)}
    [received] = op.received
    if dy == "tensor":
        assert isinstance(received, CTensor)
        np.testing.assert_array_equal(np.asarray(received), [-1.5])
    else:
        assert type(received) is float and received == scale
    want = _reference(x_np, w_np, scale)
    np.testing.assert_allclose(tensor.to_numpy(grads[id(x)]), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tensor.to_numpy(grads[id(w)]), want[1], rtol=1e-5, atol=1e-6)


def test_a_user_operator_below_the_root_still_gets_ctensors(training_mode):
    """Only the root's creator gets SINGA's float: an operator the walk reaches later gets its
    output's gradient as a CTensor, as in SINGA."""
    received = []

    class Double(autograd.Operator):
        def forward(self, x):
            return singa.MultFloat(x, 2.0)

        def backward(self, dy):
            received.append(dy)
            return singa.MultFloat(dy, 2.0)

    x_np, _ = _data()
    x = tensor.Tensor(data=x_np, requires_grad=True, stores_grad=True)
    loss = ScaledSum()(Double()(x)[0])[0]
    [(_, g)] = list(autograd.backward(loss))
    assert isinstance(received[0], CTensor) and received[0].shape() == (6, 5)
    np.testing.assert_allclose(tensor.to_numpy(g), np.full((6, 5), 2.0, np.float32))


class MSMLP(model.Model):
    """msmlp's synflow step: a Linear layer under SumError, updated by the optimizer."""

    def __init__(self):
        super().__init__()
        self.linear = layer.Linear(3)

    def forward(self, x):
        return self.linear(x)

    def train_one_batch(self, x):
        loss = SumError()(self.forward(x))[0]
        self.optimizer(loss)
        return loss


@pytest.mark.parametrize("use_graph", [False, True])
def test_sum_error_trains_a_model_eagerly_and_in_graph_mode(use_graph):
    x_np, _ = _data()
    dev = device.get_default_device()
    tx = tensor.Tensor(data=x_np, device=dev)
    net = MSMLP()
    net.set_optimizer(opt.SGD(lr=0.1))
    net.compile([tx], is_train=True, use_graph=use_graph, sequential=False)
    w0 = tensor.to_numpy(net.linear.W).copy()
    b0 = tensor.to_numpy(net.linear.b).copy()
    net.train_one_batch(tx)
    # d sum(x @ W + b) / dW = x^T 1, / db = the batch size
    np.testing.assert_allclose(tensor.to_numpy(net.linear.W),
                               w0 - 0.1 * x_np.T @ np.ones((6, 3), np.float32), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(tensor.to_numpy(net.linear.b), b0 - 0.1 * 6, rtol=1e-5)
