"""JAX interop: zero-copy exchange (__jax_array__, from_jax/to_jax, DLPack, NumPy),
Model.functional()/load_functional under jax.grad, jax.vmap, jax.jit, jax.checkpoint and
sharding, and opt.from_optax."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from backend_precision import two_programs_tolerance
from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax.tensor import Tensor


@pytest.fixture(autouse=True)
def restore_training_flag():
    saved = autograd.training
    yield
    autograd.training = saved


# --- zero-copy exchange -------------------------------------------------------------------------
def test_jax_array_exchange_is_zero_copy():
    a = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    t = tensor.from_jax(a)
    assert t.array is a and t.to_jax() is a and jnp.asarray(t) is a
    assert t.shape == (2, 3) and t.dtype == jnp.float32
    with pytest.raises(TypeError, match="jax.Array"):
        tensor.from_jax(np.ones(3))


def test_numpy_and_dlpack_both_ways():
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    t = Tensor(data=values)  # on the default device: any backend
    copied = np.asarray(t)
    copied[0, 0] = 100.0  # a writable copy, as before: the tensor is unchanged
    assert float(t.array[0, 0]) == 0.0
    view = np.asarray(t, copy=False)
    np.testing.assert_array_equal(view, values)
    assert not view.flags.writeable
    # DLPack between frameworks on the tensor's own device (NumPy reads host memory only)
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(t)), values)
    again = tensor.from_dlpack(t)
    np.testing.assert_array_equal(np.asarray(again), values)
    assert again.device.jax_device == t.device.jax_device
    host = Tensor(data=values, device=device.create_cpu_device())
    np.testing.assert_array_equal(np.from_dlpack(host), values)  # Tensor -> NumPy via DLPack
    back = tensor.from_dlpack(values)                          # NumPy -> Tensor via DLPack
    np.testing.assert_array_equal(np.asarray(back), values)
    with pytest.raises(TypeError, match="__dlpack__"):
        tensor.from_dlpack([1.0, 2.0])


def test_dlpack_with_pytorch():
    torch = pytest.importorskip("torch")
    t = Tensor(data=np.arange(6, dtype=np.float32).reshape(2, 3))
    # torch reads the tensor where it lives (a CUDA tensor on a GPU): .cpu() before .numpy()
    np.testing.assert_array_equal(torch.from_dlpack(t).cpu().numpy(), np.asarray(t))
    back = tensor.from_dlpack(torch.arange(4.0))
    np.testing.assert_array_equal(np.asarray(back), [0.0, 1.0, 2.0, 3.0])
    if torch.cuda.is_available() and any(d.platform == "gpu" for d in jax.devices()):
        on_gpu = tensor.from_dlpack(torch.arange(4.0, device="cuda"))
        assert on_gpu.device.platform == "gpu"
        np.testing.assert_array_equal(np.asarray(on_gpu), [0.0, 1.0, 2.0, 3.0])


# --- models as pure functions -------------------------------------------------------------------
class Block(layer.Layer):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(6)
        self.bn = layer.BatchNorm2d()

    def forward(self, x):
        h = self.fc(x)
        return self.bn(autograd.reshape(h, (h.shape[0], 6, 1, 1)))


class Net(model.Model):
    def __init__(self, dropout=False):
        super().__init__()
        self.block = Block()
        self.relu = layer.ReLU()
        self.drop = layer.Dropout(0.5) if dropout else None
        self.out = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        h = self.relu(autograd.reshape(self.block(x), (x.shape[0], 6)))
        if self.drop is not None:
            h = self.drop(h)
        return self.out(h)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def make_net(rng, dropout=False):
    net = Net(dropout)
    x = Tensor(data=rng.normal(size=(4, 5)).astype(np.float32), requires_grad=False)
    x.device.SetRandSeed(0)  # the same initial parameters for every net
    net.compile([x], is_train=False, use_graph=False)
    return net, x


def test_functional_names_values_and_apply_equal_the_model(rng):
    net, x = make_net(rng)
    apply, params, state = net.functional()
    assert list(params) == list(net.get_params())
    assert sorted(state) == ["block.bn.running_mean", "block.bn.running_var"]
    out, new_state = apply(params, state, x.array)
    np.testing.assert_allclose(np.asarray(out), np.asarray(net(x).array), rtol=1e-6)
    for k in state:
        np.testing.assert_array_equal(np.asarray(new_state[k]), np.asarray(state[k]))


def test_apply_in_training_returns_new_state_and_leaves_the_model_alone(rng):
    net, x = make_net(rng)
    apply, params, state = net.functional()
    before = {k: np.asarray(v.array) for k, v in net.get_states().items()}
    out, new_state = jax.jit(apply, static_argnames="training")(params, state, x.array,
                                                                training=True)
    after = {k: v.array for k, v in net.get_states().items()}
    for k, v in after.items():  # no tracer left behind; same values
        assert not isinstance(v, jax.core.Tracer)
        np.testing.assert_array_equal(np.asarray(v), before[k])
    autograd.training = True  # the same forward, eagerly, in training mode
    expected = net.forward(x)
    for k in new_state:
        np.testing.assert_allclose(np.asarray(new_state[k]), np.asarray(net.get_states()[k].array),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected.array), rtol=1e-5, atol=1e-6)


def test_jax_grad_of_apply_equals_singa_backward(rng):
    net, x = make_net(rng)
    y = Tensor(data=np.eye(3, dtype=np.float32)[rng.integers(0, 3, 4)], requires_grad=False)
    apply, params, state = net.functional()

    def loss_fn(p):
        out, _ = apply(p, state, x.array, training=True)
        logp = jax.nn.log_softmax(out)
        return -jnp.mean(jnp.sum(y.array * logp, axis=1))

    grads = jax.grad(loss_fn)(params)
    autograd.training = True
    loss = net.loss(net.forward(x), y)
    singa = {p.name: g for p, g in autograd.backward(loss)}
    assert sorted(singa) == sorted(grads)
    for k, g in grads.items():
        np.testing.assert_allclose(np.asarray(g), np.asarray(singa[k].array), rtol=1e-4,
                                   atol=1e-6, err_msg=k)


def test_forward_mode_through_apply_equals_reverse_mode(rng):
    """``jax.jvp`` through ``apply`` in training mode (batch norm, ReLU: ops whose eager
    pullbacks are hand-written ``custom_vjp`` forms, which have no forward mode -- apply runs
    their plain functions) gives the directional derivative ``jax.grad`` gives (float32, CPU:
    1e-5)."""
    net, x = make_net(rng)
    apply, params, state = net.functional()

    def f(p):
        return jnp.sum(jnp.tanh(apply(p, state, x.array, training=True)[0]))

    direction = {k: jnp.asarray(rng.normal(size=v.shape).astype(np.float32))
                 for k, v in params.items()}
    _, forward = jax.jvp(f, (params,), (direction,))
    grads = jax.grad(f)(params)
    reverse = sum(jnp.vdot(grads[k], direction[k]) for k in params)
    np.testing.assert_allclose(float(forward), float(reverse), rtol=1e-5, atol=1e-6)


def test_vmap_jit_and_checkpoint_over_apply(rng):
    net, _ = make_net(rng)
    apply, params, state = net.functional()
    batches = jnp.asarray(rng.normal(size=(3, 4, 5)).astype(np.float32))
    one = [np.asarray(apply(params, state, b)[0]) for b in batches]
    vmapped = jax.vmap(lambda b: apply(params, state, b)[0])(batches)
    np.testing.assert_allclose(np.asarray(vmapped), np.stack(one), rtol=1e-5, atol=1e-6)

    def loss(p, b):
        return jnp.sum(apply(p, state, b)[0] ** 2)

    g_plain = jax.grad(loss)(params, batches[0])
    g_remat = jax.jit(jax.grad(jax.checkpoint(loss)))(params, batches[0])
    for k in params:
        np.testing.assert_allclose(np.asarray(g_remat[k]), np.asarray(g_plain[k]), rtol=1e-5,
                                   atol=1e-6)
    assert all(not isinstance(t.array, jax.core.Tracer) for t in net.get_states().values())


def test_apply_under_a_sharded_jit(rng):
    net, x = make_net(rng)
    apply, params, state = net.functional()
    mesh = jax.make_mesh((len(jax.devices()),), ("batch",))
    batch = jnp.asarray(rng.normal(size=(4 * len(jax.devices()), 5)).astype(np.float32))
    sharded = jax.device_put(batch, NamedSharding(mesh, PartitionSpec("batch")))
    # data parallel, as a JAX user writes it: the batch split over the mesh, the model's
    # params and state replicated on it
    replicated = NamedSharding(mesh, PartitionSpec())
    on_mesh = jax.device_put((params, state), replicated)
    out = jax.jit(lambda p, s, b: apply(p, s, b)[0])(*on_mesh, sharded)
    assert out.sharding.is_equivalent_to(sharded.sharding, out.ndim)
    np.testing.assert_allclose(np.asarray(out), np.asarray(apply(params, state, batch)[0]),
                               rtol=1e-5, atol=1e-6)


def test_random_ops_need_a_key_and_use_it(rng):
    net, x = make_net(rng, dropout=True)
    apply, params, state = net.functional()
    device_key = np.asarray(x.device.key)
    with pytest.raises(ValueError, match="key="):
        apply(params, state, x.array, training=True)
    k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    a = apply(params, state, x.array, training=True, key=k1)[0]
    b = jax.jit(apply, static_argnames="training")(params, state, x.array, training=True,
                                                  key=k1)[0]
    c = apply(params, state, x.array, training=True, key=k2)[0]
    # (eager vs jitted: two programs, TF32's roundings apart on a GPU)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **two_programs_tolerance(1e-6, 1e-6))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    np.testing.assert_array_equal(np.asarray(x.device.key), device_key)  # not advanced
    apply(params, state, x.array)  # evaluation draws nothing: no key needed


def test_load_functional_writes_trained_values_back(rng):
    net, x = make_net(rng)
    apply, params, state = net.functional()
    target = jnp.asarray(rng.normal(size=(4, 3)).astype(np.float32))

    def loss(p, s):
        out, new_s = apply(p, s, x.array, training=True)
        return jnp.mean((out - target) ** 2), new_s

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    losses = []
    for _ in range(10):
        (value, state), g = step(params, state)
        params = jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)
        losses.append(float(value))
    assert losses[-1] < losses[0]
    net.load_functional(params, state)
    np.testing.assert_allclose(np.asarray(net(x).array),
                               np.asarray(apply(params, state, x.array)[0]), rtol=1e-5)


def test_functional_errors_name_the_problem(rng):
    with pytest.raises(RuntimeError, match="not initialised"):
        Net().functional()
    net, x = make_net(rng)
    apply, params, state = net.functional()
    with pytest.raises(ValueError, match=r"missing \['out.b'\]"):
        apply({k: v for k, v in params.items() if k != "out.b"}, state, x.array)
    with pytest.raises(ValueError, match=r"out.W.*\(2, 2\).*\(6, 3\)"):
        apply({**params, "out.W": jnp.zeros((2, 2))}, state, x.array)
    with pytest.raises(ValueError, match="out.W"):
        net.load_functional({"out.W": np.zeros((2, 2), np.float32)})


# --- optax --------------------------------------------------------------------------------------
class MLP(Net):
    """Linear-ReLU-Linear (no batch-norm, whose input bias has a vanishing gradient that Adam
    would amplify into rounding noise)."""

    def __init__(self):
        super().__init__()
        del self.block
        self.fc = layer.Linear(6)

    def forward(self, x):
        return self.out(self.relu(self.fc(x)))


def fit(optimizer, rng_seed=0, steps=5, use_graph=False):
    """Train an MLP with ``optimizer`` (SINGA's ``optimizer(loss)`` step); returns the net."""
    rng = np.random.default_rng(rng_seed)
    net = MLP()
    x = Tensor(data=rng.normal(size=(4, 5)).astype(np.float32), requires_grad=False)
    x.device.SetRandSeed(0)
    y = Tensor(data=np.eye(3, dtype=np.float32)[rng.integers(0, 3, 4)], requires_grad=False)
    net.set_optimizer(optimizer)
    net.compile([x], is_train=True, use_graph=use_graph)
    for _ in range(steps):
        net(x, y)
    return net, x, y


def test_optax_adam_equals_singa_adam():
    optax = pytest.importorskip("optax")
    singa, _, _ = fit(opt.Adam(lr=0.05, beta_1=0.9, beta_2=0.99, epsilon=1e-7))
    wrapped, _, _ = fit(opt.from_optax(optax.adam(0.05, b1=0.9, b2=0.99, eps=1e-7)))
    for k, p in singa.get_params().items():
        np.testing.assert_allclose(np.asarray(wrapped.get_params()[k].array),
                                   np.asarray(p.array), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(np.asarray(wrapped.optimizer.step_counter.array)[0]) == 5.0


def test_optax_in_graph_mode_and_its_state_in_checkpoints(tmp_path):
    optax = pytest.importorskip("optax")
    tx = optax.chain(optax.clip(1.0), optax.adam(0.05))
    eager, _, _ = fit(opt.from_optax(tx), steps=4)
    graph, x, y = fit(opt.from_optax(tx), steps=4, use_graph=True)
    for k, p in eager.get_params().items():
        np.testing.assert_allclose(np.asarray(graph.get_params()[k].array), np.asarray(p.array),
                                   rtol=1e-5, atol=1e-6, err_msg=k)
    states = graph.optimizer.get_states()
    assert sorted(states) == ["1.0.count/fc.W", "1.0.count/fc.b", "1.0.count/out.W",
                              "1.0.count/out.b", "1.0.mu/fc.W", "1.0.mu/fc.b", "1.0.mu/out.W",
                              "1.0.mu/out.b", "1.0.nu/fc.W", "1.0.nu/fc.b", "1.0.nu/out.W",
                              "1.0.nu/out.b", "step_counter"]
    path = str(tmp_path / "ckpt.zip")
    graph.save_states(path, aux_states=states)
    resumed = opt.from_optax(tx)
    net, _, _ = fit(opt.SGD(lr=0.0), steps=0)
    aux = net.load_states(path)
    resumed.set_states(aux)
    net.set_optimizer(resumed)
    net.compile([x], is_train=True, use_graph=False)
    for _ in range(2):  # the resumed run continues exactly like the original
        net(x, y)
        graph(x, y)
    for k, p in graph.get_params().items():
        np.testing.assert_allclose(np.asarray(net.get_params()[k].array), np.asarray(p.array),
                                   rtol=1e-5, atol=1e-6, err_msg=k)
    with pytest.raises(ValueError, match="shape"):
        resumed.set_states({"1.0.mu/out.W": np.zeros((2, 2), np.float32)})


def test_from_optax_rejects_other_objects():
    with pytest.raises(TypeError, match="GradientTransformation"):
        opt.from_optax(lambda g: g)
