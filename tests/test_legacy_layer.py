"""SINGA 2.x/3.0's layer API in autograd: eager parameters, autograd.Layer subclasses overriding
__call__ (the Xception Block pattern), nested get/set_params, and training one with a hand-written
SGD step over the (param, grad) pairs of autograd.backward."""
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, layer
from singa_jax.tensor import Tensor


def T(a, **kw) -> Tensor:
    return Tensor(data=np.asarray(a, np.float32), **kw)


class Block(autograd.Layer):
    """SINGA 3.0's Xception block: a list of layers and ReLU operators plus a skip path."""

    def __init__(self, in_filters, out_filters, reps):
        super(Block, self).__init__()
        if out_filters != in_filters:
            self.skip = autograd.Conv2d(in_filters, out_filters, 1, stride=1, padding=0,
                                        bias=False)
            self.skipbn = autograd.BatchNorm2d(out_filters)
        else:
            self.skip = None
        self.layers = []
        filters = in_filters
        for _ in range(reps):
            self.layers.append(autograd.ReLU())
            self.layers.append(autograd.SeparableConv2d(filters, out_filters, 3, stride=1,
                                                        padding=1, bias=False))
            self.layers.append(autograd.BatchNorm2d(out_filters))
            filters = out_filters

    def __call__(self, x):
        y = self.layers[0](x)
        for lay in self.layers[1:]:
            if isinstance(y, tuple):
                y = y[0]
            y = lay(y)
        skip = self.skipbn(self.skip(x)) if self.skip is not None else x
        return autograd.add(y, skip)


class Net(autograd.Layer):
    def __init__(self):
        super().__init__()
        self.conv1 = autograd.Conv2d(2, 4, 3, 1, 1, bias=False)
        self.bn1 = autograd.BatchNorm2d(4)
        self.block1 = Block(4, 6, 1)
        self.pool = autograd.MaxPool2d(2, 2)
        self.fc = autograd.Linear(6 * 2 * 2, 3)

    def __call__(self, x):
        y = autograd.relu(self.bn1(self.conv1(x)))
        y = self.pool(self.block1(y))
        return self.fc(autograd.flatten(y))


def test_residual_block_network_trains(rng, training_mode):
    x = T(rng.standard_normal((8, 2, 4, 4)))
    labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)]
    net = Net()
    assert set(net.get_params()) == {"conv1", "bn1", "block1", "pool", "fc"}
    assert net.get_params()["pool"] == {}
    assert set(net.get_params()["fc"]) == {"W", "b"}
    assert net.block1.get_params() == {"skip": {"W": net.block1.skip.W},
                                       "skipbn": {"scale": net.block1.skipbn.scale,
                                                  "bias": net.block1.skipbn.bias}}
    losses = []
    for _ in range(12):
        loss = autograd.softmax_cross_entropy(net(x), T(labels))
        losses.append(np.asarray(loss.array).item())
        seen = 0
        for p, g in autograd.backward(loss):  # hand-written SGD step
            p.array = p.array - 0.1 * g.array
            seen += 1
        # every parameter was found, also those of the list-held layers: conv1 W, bn1 (2),
        # separable conv (2 W) + its BN (2), skip W + skip BN (2), fc (2)
        assert seen == 1 + 2 + 4 + 1 + 2 + 2
    assert losses[-1] < 0.5 * losses[0]


def test_eager_parameters_and_nested_set_params(rng):
    lin = autograd.Linear(200, 300)  # built in the constructor, as SINGA 3.0
    assert isinstance(lin, autograd.Layer) and isinstance(lin, layer.Linear)
    assert lin.W.shape == (200, 300) and lin.b.shape == (300,) and lin.W.stores_grad
    assert np.asarray(lin.W.array).std() == pytest.approx(np.sqrt(2 / 500), rel=0.05)
    assert lin.get_params() == {"W": lin.W, "b": lin.b}
    w = rng.standard_normal((200, 300)).astype(np.float32)
    lin.set_params(W=w)
    np.testing.assert_array_equal(np.asarray(lin.W.array), w)
    lin.set_one_param("b", T(np.ones(300)))
    np.testing.assert_array_equal(np.asarray(lin.b.array), 1)
    x = rng.standard_normal((2, 200)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(lin(T(x)).array), x @ w + 1,
                               **matmul_tolerance(1e-4, 1e-4))
    with pytest.raises(ValueError, match="in_features"):
        lin(T(np.zeros((2, 3))))

    conv = autograd.Conv2d(3, 4, 3, padding=1, group=1)
    assert conv.W.shape == (4, 3, 3, 3) and conv.get_params().keys() == {"W", "b"}
    with pytest.raises(ValueError, match="channels"):
        conv(T(np.zeros((1, 2, 5, 5))))
    bn = autograd.BatchNorm2d(4)
    assert bn.get_params().keys() == {"scale", "bias"} and bn.running_mean.shape == (4,)

    net = Net()
    before = np.asarray(net.fc.W.array)
    with pytest.raises(ValueError, match=r"'block1.skip.W' expects shape"):
        net.set_params(fc={"W": np.zeros((24, 3))}, block1={"skip": {"W": np.zeros((6, 4))}})
    np.testing.assert_array_equal(np.asarray(net.fc.W.array), before)  # checked before changing
    with pytest.raises(ValueError, match="no parameter or sublayer 'fc.V'"):
        net.set_params(fc={"V": np.zeros(3)})
    with pytest.raises(TypeError, match="is a layer"):
        net.set_params(fc=np.zeros(3))
    with pytest.raises(ValueError, match="not an allowed parameter"):
        lin.set_one_param("bias", np.zeros(3))
    net.set_params(fc={"W": np.zeros((24, 3))}, block1={"skip": {"W": np.ones((6, 4, 1, 1))}})
    np.testing.assert_array_equal(np.asarray(net.block1.skip.W.array), 1)


def test_legacy_pools_and_recurrent_layers(rng):
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    y = np.asarray(autograd.MaxPool2d(2)(T(x)).array)
    np.testing.assert_array_equal(y, x.reshape(1, 1, 2, 2, 2, 2).max(axis=(3, 5)))
    y = np.asarray(autograd.AvgPool2d(2, 1, 0, odd_padding=(0, 1, 0, 1))(T(x)).array)
    assert y.shape == (1, 1, 4, 4)  # the odd padding adds a row and a column at the end
    windows = np.lib.stride_tricks.sliding_window_view(x[0, 0], (2, 2)).mean(axis=(2, 3))
    np.testing.assert_allclose(y[0, 0, :3, :3], windows, **matmul_tolerance(1e-7, 1e-6))
    assert autograd.MaxPool1d(2)(T(x)).shape == (1, 1, 4, 2)
    assert autograd.AvgPool1d(2)(T(x)).shape == (1, 1, 4, 2)
    assert autograd.Pooling2d(2, is_max=False)(T(x)).shape == (1, 1, 2, 2)
    with pytest.raises(ValueError, match="odd_padding"):
        autograd.MaxPool1d(2, odd_padding=(1, 0, 0, 0))

    rnn = autograd.RNN(3, 4)
    assert rnn.params == (rnn.Wx, rnn.Wh, rnn.b) and rnn.Wx.shape == (3, 4)
    xs = [T(rng.standard_normal((2, 3))) for _ in range(2)]
    out, h = rnn(xs, T(np.zeros((2, 4))))
    assert len(out) == 2 and h.shape == (2, 4)
    lstm = autograd.LSTM(3, 4)
    assert len(lstm.params) == 16 and lstm.Wx[1] is lstm.Wx_f
    out, h, c = lstm(xs, (T(np.zeros((2, 4))), T(np.zeros((2, 4)))))
    h1, c1 = lstm.step_forward(xs[0], T(np.zeros((2, 4))), T(np.zeros((2, 4))), lstm.Wx,
                               lstm.Wh, lstm.Bx, lstm.Bh)
    np.testing.assert_allclose(np.asarray(h1.array), np.asarray(out[0].array),
                               **matmul_tolerance(1e-7, 1e-6))
    assert isinstance(autograd.RNN_Base(), autograd.Layer)
    with pytest.raises(NotImplementedError):
        autograd.RNN_Base().step_forward()


def test_legacy_layers_inside_a_modern_network(rng):
    class Modern(layer.Layer):
        def __init__(self):
            super().__init__()
            self.fc1 = autograd.Linear(4, 3)
            self.fc2 = autograd.Linear(3, 2)

        def forward(self, x):
            return self.fc2(self.fc1(x))

    net = Modern()
    assert set(net.get_params()) == {"fc1.W", "fc1.b", "fc2.W", "fc2.b"}
    values = {k: rng.standard_normal(v.shape).astype(np.float32)
              for k, v in net.get_params().items()}
    net.set_states(values)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    expected = (x @ values["fc1.W"] + values["fc1.b"]) @ values["fc2.W"] + values["fc2.b"]
    np.testing.assert_allclose(np.asarray(net(T(x)).array), expected, **matmul_tolerance(1e-5, 1e-5))
