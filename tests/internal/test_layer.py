"""Layer internals: lazy initialisation, the layer registry and parents. (This tier imports
singa_jax._src.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import autograd, layer
from singa_jax.tensor import Tensor
pytestmark = pytest.mark.usefixtures("training_mode")  # autograd.training = True (conftest)
from test_layer import (  # noqa: F401 (shared helpers and fixtures)
    Block, Net, T, check_forward_and_grads, conv_ref, randn, set_random_params)


def test_conv2d_relu_old_signature_and_init(rng):
    conv = layer.Conv2d(4, 4, 3, 1, 1, activation="RELU")  # Conv2d(in, out, k, stride, pad)
    x = T(randn(rng, 2, 4, 5, 5))
    conv(x)
    set_random_params(conv, rng)
    check_forward_and_grads(conv, [x], lambda p, x: jax.nn.relu(
        conv_ref(x, p["W"], p["b"], (1, 1), ((1, 1), (1, 1)), 1)), rng)
    big = layer.Conv2d(64, 3)
    big.initialize(T(np.zeros((1, 32, 3, 3))))  # parameters only, no forward
    assert big._initialized
    assert np.asarray(big.W.array).std() == pytest.approx(np.sqrt(2 / (32 * 9 + 64)), rel=0.05)


def test_lazy_init_and_hierarchical_names(rng):
    net = Net()
    assert net.get_params() == {} and not net.fc._initialized
    assert net.block1.bn.name == "block1.bn" and net.fc.name == "fc"
    net(T(randn(rng, 2, 3, 4, 4)))
    assert set(net.get_params()) == {"conv1.W", "conv1.b", "block1.conv.W", "block1.bn.scale",
                                     "block1.bn.bias", "fc.W", "fc.b"}
    assert set(net.get_states()) - set(net.get_params()) == {"block1.bn.running_mean",
                                                             "block1.bn.running_var"}
    for name, t in net.get_params().items():
        assert t.name == name and t.requires_grad and t.stores_grad
    assert net.fc.W.shape == (48, 2)
    # the optimizer sees every parameter through autograd.backward
    loss = autograd.mse_loss(net(T(randn(rng, 2, 3, 4, 4))), T(np.zeros((2, 2))))
    assert {p.name for p, _ in autograd.backward(loss)} == set(net.get_params())
    del net.flat
    assert "flat" not in net._layers
    with pytest.raises(AttributeError, match="flat"):
        net.flat


def test_register_layers_and_renaming():
    seq = layer.Layer()
    seq.register_layers(layer.Linear(3), layer.ReLU())
    assert set(seq._layers) == {"Linear_0", "ReLU_1"}
    outer = layer.Layer()
    outer.body = seq  # renaming a layer renames its subtree
    assert seq.Linear_0.name == "body.Linear_0"
    named = layer.Layer()
    named.register_layers({"first": layer.Linear(2), "second": layer.Linear(2)})
    assert [n for n in named._layers] == ["first", "second"]
    seq.Linear_0(T(np.zeros((1, 4))))
    assert seq.Linear_0.W.name == "body.Linear_0.W"


def test_sublayer_attribute_follows_registration_through_replace_shadow_and_delete():
    net = layer.Layer()
    first, second = layer.Linear(2), layer.Linear(3)
    net.body = first
    # an instance attribute (Python's own lookup finds it) and the registered sublayer
    assert vars(net)["body"] is first and net._layers["body"] is first and net.body is first
    net.body = second  # replaced: both places, and the old one leaves the tree
    assert net.body is second and net._layers["body"] is second and id(net) not in first._parents
    net.register_layers({"head": first})
    assert net.head is first and vars(net)["head"] is first
    net.body = 3  # a plain value shadows the sublayer, which stays registered (as in SINGA)
    assert net.body == 3 and net._layers["body"] is second
    del net.body  # the sublayer is deleted; the plain value that shadowed it stays
    assert "body" not in net._layers and net.body == 3
    del net.head
    assert "head" not in net._layers and "head" not in vars(net)
    with pytest.raises(AttributeError, match="head"):
        net.head
    # a registered name that already means something keeps its meaning (SINGA's lookup order)
    net.plain = 5
    net.register_layers({"forward": first, "plain": second})
    assert net.forward.__func__ is layer.Layer.forward and net.plain == 5
    assert net._layers["forward"] is first and net._layers["plain"] is second


def test_structure_version_links_survive_deepcopy():
    import copy
    net = Net()
    dup = copy.deepcopy(net)
    assert dup.block1.bn._parents and dup.block1._parents
    before, dup_before = net.structure_version, dup.structure_version
    dup.block1.bn.momentum = 0.5  # the copy's tree reports to the copy, not to the original
    assert dup.structure_version != dup_before and net.structure_version == before


def test_initialize_turns_graph_off_and_device_dtype_checks(rng):
    seen = []

    class Probe(layer.Layer):
        def initialize(self, x):
            seen.append(x.device.graph_enabled())
            self.w = Tensor(shape=(2,), requires_grad=True, stores_grad=True)

        def forward(self, x):
            return x

    x = T(randn(rng, 2, 2))
    x.device.EnableGraph(True)
    try:
        p = Probe()
        p(x)
        assert seen == [False] and x.device.graph_enabled()
    finally:
        x.device.EnableGraph(False)
    assert p._initialized and p.w.name == "w"
    p(x)
    assert seen == [False]  # initialize runs once
    w64 = Tensor(data=np.zeros(2, np.float32))
    w64.array = w64.array.astype(jnp.bfloat16)
    p.dtype_check(x, w64)
    assert w64.dtype == np.float32
    p.device_check(x, w64)
    assert w64.device is x.device
    assert layer.LayerMeta.init_wrapper(lambda self: 1)(p) is None  # no input: nothing to do
