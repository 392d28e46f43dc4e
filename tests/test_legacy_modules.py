"""SINGA 3.0's ``singa.module`` and SINGA 2.x's ``singa.optimizer`` adapters: update rules
against NumPy transcriptions of SINGA 2.x's C++ code, Module's training loop, and the clear
errors for what does not map."""
import numpy as np
import pytest

from singa_jax import autograd, device, module, opt, optimizer, tensor

RNG = np.random.default_rng(0)


def _pair():
    value = RNG.normal(size=(3, 2)).astype(np.float32)
    grads = [RNG.normal(size=(3, 2)).astype(np.float32) for _ in range(3)]
    return value, grads


def _run(opt_, value, grads, lrs, name="w"):
    v = tensor.Tensor(data=value.copy())
    for i, (g, lr) in enumerate(zip(grads, lrs)):
        out = opt_.apply_with_lr(0, lr, tensor.Tensor(data=g.copy()), v, name, i)
        assert out is v
    return tensor.to_numpy(v)


def test_sgd_and_nesterov_follow_singa2_rules():
    value, grads = _pair()
    lrs = [0.1, 0.05, 0.2]  # changing rates: SINGA 2.x keeps lr inside the history
    ref, hist = value.astype(np.float64), np.zeros_like(value, np.float64)
    for g, lr in zip(grads, lrs):
        hist = 0.9 * hist + lr * g
        ref = ref - hist
    np.testing.assert_allclose(_run(optimizer.SGD(momentum=0.9), value, grads, lrs), ref,
                               rtol=1e-5, atol=1e-5)
    plain = value - sum(lr * g for g, lr in zip(grads, lrs))
    np.testing.assert_allclose(_run(optimizer.SGD(), value, grads, lrs), plain, rtol=1e-5, atol=1e-5)
    ref, hist = value.astype(np.float64), np.zeros_like(value, np.float64)
    for g, lr in zip(grads, lrs):
        new = 0.8 * hist + lr * g
        ref = ref - ((1 + 0.8) * new - 0.8 * hist)
        hist = new
    np.testing.assert_allclose(_run(optimizer.Nesterov(momentum=0.8), value, grads, lrs), ref,
                               rtol=1e-5, atol=1e-5)


def test_rmsprop_adagrad_adam_follow_singa2_rules():
    value, grads = _pair()
    lrs = [0.1] * 3
    ref, hist = value.astype(np.float64), np.zeros_like(value, np.float64)
    for g in grads:
        hist = 0.9 * hist + 0.1 * g * g
        ref = ref - 0.1 * g / np.sqrt(hist + 1e-8)
    np.testing.assert_allclose(_run(optimizer.RMSProp(rho=0.9), value, grads, lrs), ref,
                               rtol=1e-5, atol=1e-5)
    ref, hist = value.astype(np.float64), np.zeros_like(value, np.float64)
    for g in grads:
        hist = hist + g * g
        ref = ref - 0.1 * g / np.sqrt(hist + 1e-8)
    np.testing.assert_allclose(_run(optimizer.AdaGrad(), value, grads, lrs), ref, rtol=1e-5, atol=1e-5)
    ref, m, v = value.astype(np.float64), np.zeros_like(value, np.float64), \
        np.zeros_like(value, np.float64)
    for t, g in enumerate(grads, 1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        ref = ref - 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-8)
    adam = optimizer.Adam(lr=0.1)
    np.testing.assert_allclose(_run(adam, value, grads, lrs), ref, rtol=1e-5, atol=1e-5)
    assert adam.t == 3
    with pytest.raises(ValueError, match="step must be given"):
        adam.apply_with_lr(0, 0.1, tensor.Tensor(data=grads[0]), tensor.Tensor(data=value), "w")


def test_regularizer_constraint_multipliers_and_apply():
    value, grads = _pair()
    g = grads[0]
    sgd = optimizer.SGD(lr=0.5, weight_decay=0.1, constraint=optimizer.L2Constraint(0.01))

    class Spec:  # a ParamSpec-like object
        lr_mult, decay_mult = 2.0, 3.0

        def HasField(self, field):
            return False
    sgd.register("w", Spec())
    v = tensor.Tensor(data=value.copy())
    sgd.apply(0, tensor.Tensor(data=g.copy()), v, "w")
    scaled = g * (0.01 / (np.linalg.norm(g) / g.size))  # SINGA's l2 is norm / size
    expected = value - 0.5 * 2.0 * (scaled + 0.3 * value)
    np.testing.assert_allclose(tensor.to_numpy(v), expected, rtol=1e-5, atol=1e-5)
    empty = tensor.Tensor()  # SINGA 2.x skips grads whose is_empty() (ndim 0) holds
    assert sgd.apply(0, empty, empty, "w") is empty


def test_optimizer_errors_name_the_replacement():
    with pytest.raises(NotImplementedError, match="L2Regularizer"):
        optimizer.CppRegularizer(object())
    with pytest.raises(NotImplementedError, match="L2Constraint"):
        optimizer.CppConstraint(object())
    with pytest.raises(TypeError, match="L2Regularizer"):
        optimizer.SGD(regularizer=object())
    with pytest.raises(ValueError, match="at the same time"):
        optimizer.SGD(weight_decay=0.1, regularizer=optimizer.L2Regularizer(0.1))
    with pytest.raises(ValueError, match="'lr' was not set"):
        optimizer.SGD().apply(0, tensor.Tensor((2,)), tensor.Tensor((2,)), "w")
    with pytest.raises(NotImplementedError, match="use a subclass"):
        optimizer.Optimizer(lr=0.1).apply(0, tensor.Tensor((2,)), tensor.Tensor((2,)), "w")
    with pytest.raises(ValueError, match="does not match"):
        optimizer.SGD(lr=0.1).apply(0, tensor.Tensor((2,)), tensor.Tensor((3,)), "w")

    class ProtoSpec:
        def HasField(self, field):
            return field == "regularizer"
    with pytest.raises(NotImplementedError, match="protobuf"):
        optimizer.SGD(lr=0.1).register("w", ProtoSpec())


class MLP(module.Module):
    """The shape of SINGA 3.0's examples/mlp/module.py (written anew)."""

    def __init__(self):
        super().__init__()
        self.w = tensor.Tensor((2, 2), requires_grad=True, stores_grad=True)
        self.w.gaussian(0.0, 0.1)
        self.b = tensor.Tensor((2,), requires_grad=True, stores_grad=True)
        self.b.set_value(0.0)

    def forward(self, x):
        return autograd.add_bias(autograd.matmul(x, self.w), self.b)

    def loss(self, out, ty):
        return autograd.softmax_cross_entropy(out, ty)

    def optim(self, loss):
        self.optimizer.backward_and_update(loss)


def test_module_training_loop_as_in_singa3():
    dev = device.get_default_device()
    x = RNG.normal(size=(64, 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    model = MLP()
    model.optimizer = opt.SGD(0.5)
    model.on_device(dev)
    model.graph(True, False)
    model.train()
    assert autograd.training and model.graph_mode and not model.sequential
    tx, ty = tensor.Tensor((64, 2), dev), tensor.Tensor((64,), dev, tensor.int32)
    losses = []
    try:
        for _ in range(30):
            tx.copy_from_numpy(x)
            ty.copy_from_numpy(y)
            out = model(tx)
            loss = model.loss(out, ty)
            model.optim(loss)
            losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    finally:
        model.eval()
    assert not autograd.training and model.training is False
    assert losses[-1] < 0.5 * losses[0]
    assert model.__get_name__() == "MLP" and model.initialized
    with pytest.raises(NotImplementedError, match="forward"):
        module.Module()(tx)
    with pytest.raises(TypeError, match="Device"):
        model.on_device("gpu")
    assert isinstance(MLP, module.Graph)
