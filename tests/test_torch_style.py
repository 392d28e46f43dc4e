"""PyTorch-style autograd on SINGA tensors: tensor.tensor, requires_grad_, backward,
.grad, grad_fn, detach, recorded operators, autograd.grad, grad mode, retain_graph, Layer's
named_parameters/parameters/zero_grad, the manual optimizer loop, and graph mode."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, layer, model, opt, tensor
from singa_jax.tensor import Tensor


@pytest.fixture(autouse=True)
def evaluation_mode():
    """PyTorch users never set autograd.training: run every test in evaluation mode (SINGA's
    default) unless it sets the mode itself, and restore the flag afterwards."""
    saved = autograd.training
    autograd.training = False
    yield
    autograd.training = saved


def leaf(values, requires_grad=True):
    return tensor.tensor(np.asarray(values, np.float32), requires_grad=requires_grad)


def arr(t):
    return np.asarray(t.array)


# --- leaves and tensor.tensor ----------------------------------------------------------------
def test_tensor_factory_makes_leaves_with_numpy_dtypes():
    t = tensor.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert t.dtype == np.float32 and t.shape == (2, 2)
    assert not t.requires_grad and not t.stores_grad and not t.tracked and t.grad_fn is None
    assert tensor.tensor(3).dtype == np.int32
    assert tensor.tensor(np.arange(3.0)).dtype == np.float32  # float64 -> float32, as SINGA
    assert tensor.tensor([1, 2], dtype=tensor.float32).dtype == np.float32
    x = tensor.tensor(2.5, requires_grad=True)
    assert x.requires_grad and x.stores_grad and x.tracked and x.grad is None
    with pytest.raises(RuntimeError, match="floating-point"):
        tensor.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match="numbers"):
        tensor.tensor(["a"])


def test_requires_grad_underscore_returns_self_and_can_be_undone():
    t = Tensor(data=np.ones(3, np.float32))
    assert t.requires_grad_() is t and t.stores_grad and t.tracked
    t.requires_grad_(False)
    assert not (t.requires_grad or t.stores_grad or t.tracked)
    y = leaf([1.0]) * 2
    assert y.requires_grad_() is y  # a tracked result: a no-op, as in PyTorch
    with pytest.raises(RuntimeError, match="only leaves.*detach"):
        y.requires_grad_(False)


# --- recorded operators and backward ----------------------------------------------------------
def test_pow_plus_leaf_backward():
    x, b = leaf(2.0), leaf(0.5)
    y = x ** 3 + b
    assert y.grad_fn is not None and "Add" in repr(y.grad_fn)
    assert y.backward() is None
    np.testing.assert_allclose(arr(x.grad), 12.0)  # 3 x^2
    np.testing.assert_allclose(arr(b.grad), 1.0)


def test_every_operator_matches_jax_grad(rng):
    xv = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    wv = rng.normal(size=(4, 2)).astype(np.float32)
    bv = rng.normal(size=(2,)).astype(np.float32)

    def f(x, w, b):  # every recorded operator, reflected forms included
        h = (x * 2.0 - 1.0) / (x + 3.0) + x ** 2 - 0.5 / x + 2.0 ** x * 0.1
        z = -(h @ w) + b
        return 1.0 - z * z

    x, w, b = leaf(xv), leaf(wv), leaf(bv)
    y = autograd.reduce_sum(f(x, w, b))
    y.backward()
    expected = jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2))(xv, wv, bv)
    for t, e in zip((x, w, b), expected):
        np.testing.assert_allclose(arr(t.grad), np.asarray(e), rtol=1e-4, atol=1e-5)


def test_operators_stay_plain_without_a_tracked_operand():
    p = Tensor(data=np.ones(3, np.float32), stores_grad=True)  # a SINGA parameter
    for y in (p * 2, p + p, -p, 2 - p, p ** 2):
        assert isinstance(y.creator, autograd.Dummy) and not y.tracked
    x = leaf([1.0, 2.0])
    with autograd.no_grad():
        y = x * 3
    assert y.grad_fn is None and not y.tracked and not y.requires_grad
    np.testing.assert_allclose(arr(y), [3.0, 6.0])


def test_backward_of_a_non_scalar_needs_grad_and_weights_by_it(rng):
    xv = rng.normal(size=(2, 3)).astype(np.float32)
    gv = rng.normal(size=(2, 3)).astype(np.float32)
    x = leaf(xv)
    y = x * x
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"):
        y.backward()
    y.backward(Tensor(data=gv))
    np.testing.assert_allclose(arr(x.grad), 2 * xv * gv, rtol=1e-6)


def test_backward_without_a_gradient_path_is_an_error():
    t = tensor.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="does not require grad"):
        (t * 2).backward(Tensor(data=np.ones(2, np.float32)))
    with pytest.raises(RuntimeError, match="kept no backward state.*requires_grad_"):
        autograd.reduce_sum(t * 2).backward()  # a SINGA op in evaluation mode


def test_grad_accumulates_and_is_assignable():
    x = leaf([1.0, -2.0])
    for _ in range(2):
        autograd.reduce_sum(x * x).backward()
    np.testing.assert_allclose(arr(x.grad), [4.0, -8.0])  # 2 * 2x
    x.grad = None
    autograd.reduce_sum(x * 3.0).backward()
    np.testing.assert_allclose(arr(x.grad), [3.0, 3.0])
    g = x.grad
    x.zero_grad()
    assert x.grad is g  # rebound, not replaced (graph mode keeps it as state)
    np.testing.assert_allclose(arr(x.grad), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        x.grad = Tensor(data=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="Tensor or None"):
        x.grad = np.zeros(2)


def test_retain_graph_and_the_freed_graph_error():
    x = leaf([1.0, 2.0])
    y = autograd.reduce_sum(x * x * x)
    y.backward(retain_graph=True)
    y.backward()  # a second pass over the retained graph accumulates
    np.testing.assert_allclose(arr(x.grad), 2 * 3 * np.array([1.0, 4.0]))
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()
    # a graph sharing freed operators is refused too, before any .grad changes
    h = x * 2.0
    a, b = autograd.reduce_sum(h), autograd.reduce_sum(h * h)
    a.backward()
    before = arr(x.grad)
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        b.backward()
    np.testing.assert_array_equal(arr(x.grad), before)


def test_singa_backward_keeps_the_graph(training_mode):
    """SINGA's entry points retain: examples/gan iterates autograd.backward(loss), then calls
    optimizer(loss) on the same graph."""
    w = Tensor(data=np.array([[1.0], [2.0]], np.float32), stores_grad=True, name="w")
    x = Tensor(data=np.array([[1.0, 1.0]], np.float32), requires_grad=False)
    loss = autograd.reduce_sum(autograd.matmul(x, w))
    first = {id(p): arr(g) for p, g in autograd.backward(loss)}
    second = {id(p): arr(g) for p, g in autograd.backward(loss)}
    np.testing.assert_array_equal(first[id(w)], second[id(w)])
    opt.SGD(lr=0.5)(loss)
    np.testing.assert_allclose(arr(w), [[0.5], [1.5]])
    # a graph freed by Tensor.backward cannot be handed to the optimizer
    loss2 = autograd.reduce_sum(autograd.matmul(x, w))
    loss2.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        opt.SGD(lr=0.5)(loss2)


def test_grad_fn_and_detach():
    x = leaf([1.0, 2.0])
    y = x * 2.0
    assert x.grad_fn is None
    assert isinstance(y.grad_fn, autograd.Mul) and "Mul" in repr(y.grad_fn)
    d = y.detach()
    assert d.grad_fn is None and not d.requires_grad and not d.tracked
    assert d.array is y.array  # same values, no copy
    z = autograd.reduce_sum(d * x)  # the detached factor is a constant
    z.backward()
    np.testing.assert_allclose(arr(x.grad), [2.0, 4.0])


def test_inplace_arithmetic_on_tracked_tensors():
    w = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match="no_grad"):
        w += 1.0
    autograd.reduce_sum(w * w).backward()
    with autograd.no_grad():  # the classic manual update
        w -= 0.25 * w.grad
    np.testing.assert_allclose(arr(w), [0.5, 1.0])
    assert w.grad_fn is None and w.tracked


# --- autograd.grad ----------------------------------------------------------------------------
def test_autograd_grad_returns_a_tuple_and_leaves_grad_alone(rng):
    xv, wv = rng.normal(size=(3,)).astype(np.float32), rng.normal(size=(3,)).astype(np.float32)
    x, w = leaf(xv), leaf(wv)
    h = x * w
    y = autograd.reduce_sum(h * h)
    gx, gh = autograd.grad(y, [x, h], retain_graph=True)
    np.testing.assert_allclose(arr(gx), 2 * xv * wv * wv, rtol=1e-5)
    np.testing.assert_allclose(arr(gh), 2 * xv * wv, rtol=1e-5)  # an intermediate input
    assert x.grad is None and w.grad is None
    (gw,) = autograd.grad(y, w)
    np.testing.assert_allclose(arr(gw), 2 * wv * xv * xv, rtol=1e-5)
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        autograd.grad(y, w)


def test_autograd_grad_outputs_and_several_outputs(rng):
    xv = rng.normal(size=(2, 2)).astype(np.float32)
    gv = rng.normal(size=(2, 2)).astype(np.float32)
    x = leaf(xv)
    a, b = x * x, x * 3.0
    (g,) = autograd.grad([a, b], [x], grad_outputs=[Tensor(data=gv), Tensor(data=gv)])
    np.testing.assert_allclose(arr(g), 2 * xv * gv + 3 * gv, rtol=1e-5)
    z, unused = leaf([1.0]), leaf([1.0])
    assert autograd.grad(autograd.reduce_sum(z * 2.0), [z, unused], allow_unused=True)[1] is None
    with pytest.raises(RuntimeError, match="not used"):
        autograd.grad(autograd.reduce_sum(z * 2.0), [unused])
    plain = Tensor(data=np.ones(2, np.float32))  # SINGA's default flags: a plain leaf
    with pytest.raises(RuntimeError, match="requires_grad_"):
        autograd.grad(autograd.reduce_sum(x * 1.0), [plain])
    with pytest.raises(ValueError, match="2 grad_outputs for 1 outputs"):
        autograd.grad([x * 1.0], [x], grad_outputs=[None, None])


# --- grad mode --------------------------------------------------------------------------------
def test_no_grad_enable_grad_and_set_grad_enabled():
    x = leaf([1.0])

    @autograd.no_grad()
    def plain(t):
        return t * 2.0

    assert plain(x).grad_fn is None and autograd.is_grad_enabled()
    with autograd.no_grad():
        assert not autograd.is_grad_enabled()
        with autograd.enable_grad():
            assert (x * 2.0).grad_fn is not None
        assert (x * 2.0).grad_fn is None
    with autograd.set_grad_enabled(False):
        assert (x * 2.0).grad_fn is None
    assert autograd.is_grad_enabled()
    autograd.set_grad_enabled(False)
    try:
        assert not autograd.is_grad_enabled()
    finally:
        autograd.set_grad_enabled(True)


def test_grad_mode_is_per_thread():
    x = leaf([1.0, 2.0])
    inside, go = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with autograd.no_grad():
            inside.set()
            go.wait(10)
            seen["worker"] = (x * 2.0).grad_fn

    thread = threading.Thread(target=worker)
    thread.start()
    inside.wait(10)
    y = x * 2.0  # this thread records while the worker is in no_grad
    go.set()
    thread.join(10)
    assert seen["worker"] is None and y.grad_fn is not None
    y_sum = autograd.reduce_sum(y)
    y_sum.backward()
    np.testing.assert_allclose(arr(x.grad), [2.0, 2.0])


# --- layers and the manual optimizer loop -----------------------------------------------------
class Block(layer.Layer):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(4)
        self.act = layer.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.hidden = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.hidden(self.block(x))

    def train_one_batch(self, x, y):
        return pytorch_style_step(self, x, y)


def pytorch_style_step(net, x, y):
    """``net``'s training step written PyTorch's way: forward and loss, ``zero_grad``,
    ``loss.backward()``, an update per parameter, ``step()``."""
    out = net.forward(x)
    loss = net.loss(out, y)
    net.zero_grad()
    loss.backward()
    for p in net.parameters():
        net.optimizer.update(p, p.grad)
    net.optimizer.step()
    return out, loss


def batches(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(Tensor(data=rng.normal(size=(6, 5)).astype(np.float32), requires_grad=False),
             Tensor(data=np.eye(3, dtype=np.float32)[rng.integers(0, 3, 6)],
                    requires_grad=False)) for _ in range(n)]


def test_named_parameters_of_nested_layers():
    net = Net()
    assert list(net.named_parameters()) == []  # parameters are created by the first call
    net.compile([batches(1)[0][0]], is_train=False)
    names = [n for n, _ in net.named_parameters()]
    assert names == ["block.fc.W", "block.fc.b", "hidden.W", "hidden.b"]
    assert [id(p) for p in net.parameters()] == [id(p) for p in net.get_params().values()]
    assert [n for n, _ in net.block.named_parameters()] == ["block.fc.W", "block.fc.b"]


def test_manual_loop_equals_the_optimizer_call_and_zero_grad(training_mode):
    data = batches(3)
    nets = [Net(), Net()]
    for net in nets:
        net.compile([data[0][0]], is_train=True, use_graph=False)
    nets[1].set_states({k: v.array for k, v in nets[0].get_states().items()})
    for net in nets:
        net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    losses = []
    for x, y in data:
        _, loss = nets[0](x, y)  # zero_grad, loss.backward, update(p, p.grad), step
        losses.append(float(arr(loss).reshape(())))
        nets[1].optimizer(nets[1].loss(nets[1].forward(x), y))  # SINGA's call
    for (name, a), b in zip(nets[0].named_parameters(), nets[1].parameters()):
        np.testing.assert_allclose(arr(a), arr(b), rtol=1e-5, atol=1e-6, err_msg=name)
    assert losses[-1] != losses[0]
    nets[0].zero_grad()
    assert all(np.all(arr(p.grad) == 0) for p in nets[0].parameters())
    nets[0].zero_grad(set_to_none=True)
    assert all(p.grad is None for p in nets[0].parameters())


def train_net(data, use_graph, start=None):
    """A Net trained on ``data`` by its torch-style train_one_batch; returns (net, the states it
    started from, the losses)."""
    net = Net()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([data[0][0]], is_train=True, use_graph=use_graph)
    if start is None:
        start = {k: v.array for k, v in net.get_states().items()}
    net.set_states(start)
    losses = [float(arr(net(x, y)[1]).reshape(())) for x, y in data]
    return net, start, losses


def test_graph_mode_compiles_backward_and_grad_updates_like_eager():
    data = batches(1, seed=1) * 4  # one batch, so the loss must fall
    eager, start, eager_losses = train_net(data, use_graph=False)
    graph, _, graph_losses = train_net(data, use_graph=True, start=start)
    np.testing.assert_allclose(graph_losses, eager_losses, rtol=1e-5)
    assert graph_losses[-1] < graph_losses[0]
    for (name, a), b in zip(eager.named_parameters(), graph.parameters()):
        np.testing.assert_allclose(arr(b), arr(a), rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(arr(b.grad), arr(a.grad), rtol=1e-5, atol=1e-6, err_msg=name)
    # one trace meets the new .grad tensors and momentum slots, the next is reused from then on
    assert graph.graph_stats()["traces"] == 2


class PenaltyNet(Net):
    """A step that computes a penalty under no_grad: it must not reach the gradients."""

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        with autograd.no_grad():
            penalty = autograd.reduce_sum(autograd.mul(self.hidden.W, self.hidden.W))
        assert not penalty.requires_grad
        total = autograd.add(loss, penalty)
        self.optimizer(total)
        return out, total


def test_no_grad_inside_and_outside_graph_mode():
    data = batches(2, seed=2)
    finals = {}
    for name, cls, use_graph in (("plain", Net, False), ("eager", PenaltyNet, False),
                                 ("graph", PenaltyNet, True)):
        net = cls()
        net.compile([data[0][0]], is_train=True, use_graph=use_graph)
        if name == "plain":
            start = {k: v.array for k, v in net.get_states().items()}
        net.set_states(start)
        net.set_optimizer(opt.SGD(lr=0.2))
        for x, y in data:
            if name == "plain":
                net.optimizer(net.loss(net.forward(x), y))
            else:
                net(x, y)
        finals[name] = {k: arr(v) for k, v in net.get_params().items()}
    for k in finals["plain"]:  # the penalty changed nothing, compiled or not
        np.testing.assert_allclose(finals["eager"][k], finals["plain"][k], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(finals["graph"][k], finals["plain"][k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
def test_backward_does_not_enter_operators_no_tracked_tensor_depends_on(fused):
    """SINGA's seed tutorial (cells 5-7): x untracked and reshaped outside training mode, w and
    b tracked; the walk from the tracked loss must not enter the reshape (which kept no
    backward state), as PyTorch never enters an operator no tracked tensor depends on. The
    gradients equal jax.grad's, eagerly and on a repeated (fused) walk."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    b0 = rng.standard_normal(3).astype(np.float32)
    x = tensor.ones((5,))
    assert x.requires_grad and not x.tracked  # SINGA's default flags
    w = tensor.Tensor(data=w0.copy()).requires_grad_()
    b = tensor.Tensor(data=b0.copy()).requires_grad_()

    def loss_of(w_, b_):
        z = jnp.ones((1, 5)) @ w_ + b_
        return jnp.mean(z * z)

    want_w, want_b = jax.grad(loss_of, argnums=(0, 1))(w0, b0)
    with autograd.fused_backward(fused):
        for _ in range(3):  # the second and third walks recur (fused when it is on)
            w.grad = b.grad = None
            z = autograd.matmul(autograd.reshape(x, (1, 5)), w) + b
            loss = autograd.reduce_mean(z * z)
            loss.backward(retain_graph=True)
            np.testing.assert_allclose(tensor.to_numpy(w.grad), want_w,
                                       **matmul_tolerance(1e-6))
            np.testing.assert_allclose(tensor.to_numpy(b.grad), want_b,
                                       **matmul_tolerance(1e-6))
