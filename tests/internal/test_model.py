"""Model internals: declared state and the programs graph mode keeps. (This tier imports
singa_jax._src.)"""
import numpy as np
import pytest
from singa_jax import autograd, device, layer, model, opt, tensor
from test_model import (  # noqa: F401 (shared helpers and fixtures)
    CNN_IN, MLP, MLP_IN, OPTIMIZERS, SmallCNN, build, data, restore_training_flag)


class CustomStates(layer.Layer):
    """A user layer that keeps its tensor in its own way and overrides get_params/get_states."""

    def initialize(self, x):
        self.scale_tensor = tensor.Tensor(data=np.ones(x.shape[1:], np.float32), stores_grad=True)

    def forward(self, x):
        return autograd.mul(x, self.scale_tensor)

    def get_params(self):
        return {"custom.scale": self.scale_tensor}

    def get_states(self):
        return self.get_params()


class WithCustom(MLP):
    def __init__(self):
        super().__init__()
        self.custom = CustomStates()

    def forward(self, x):
        return super().forward(self.custom(x))


def test_graph_state_collection_matches_get_states():
    for m in (build(SmallCNN, OPTIMIZERS["adam"], False, CNN_IN),
              build(WithCustom, OPTIMIZERS["adam"], False, MLP_IN)):
        fast = m._state_tensors()
        assert len(fast) == len({id(t) for t in fast})
        assert {id(t) for t in fast} == {id(t) for t in m.get_states().values()}
    assert any(t is m.custom.scale_tensor for t in m._state_tensors())


class Head(layer.Layer):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)

    def forward(self, x):
        return self.fc(autograd.relu(x))


class Deep(model.Model):
    """An MLP whose second layer sits two levels down (model -> head -> fc)."""

    def __init__(self):
        super().__init__()
        self.fc1 = layer.Linear(12)
        self.head = Head()
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.head(self.fc1(x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_declared_state_cache_is_per_model():
    """A model's cached state list holds until something in ITS tree is assigned: a new
    parameter deep in the tree is picked up at once, assignments in another model are not
    even looked at (the cached tuple stays the same object)."""
    m = build(Deep, OPTIMIZERS["sgd_momentum"], True, MLP_IN)
    other = build(Deep, OPTIMIZERS["sgd_momentum"], True, MLP_IN)
    m(*data(MLP_IN, 0))
    declared = m._declared_state()[0]
    assert m._declared_state()[0] is declared  # cached
    other.head.fc.W = tensor.Tensor(data=np.zeros((12, 3), np.float32), requires_grad=True,
                                    stores_grad=True)
    other.head.extra = layer.Linear(2)
    assert m._declared_state()[0] is declared  # unrelated model: cache kept
    old_w = m.head.fc.W
    new_w = tensor.Tensor(data=np.full((12, 3), 0.05, np.float32), requires_grad=True,
                          stores_grad=True)
    m.head.fc.W = new_w  # two levels down
    redeclared = m._declared_state()[0]
    assert redeclared is not declared
    assert any(t is new_w for t in redeclared) and not any(t is old_w for t in redeclared)
    assert {id(t) for t in redeclared} >= {id(t) for t in m.get_states().values()}
    # and the compiled step trains the new tensor
    m(*data(MLP_IN, 1))
    assert not np.allclose(tensor.to_numpy(new_w), 0.05)
    # a new sublayer deep in the tree invalidates the cache as well
    m.head.fc.extra = layer.Linear(2)
    assert m._declared_state()[0] is not redeclared


def test_compiled_step_carries_only_the_state_it_changes():
    m = build(MLP, lambda: opt.SGD(lr=0.1, momentum=0.9), True, MLP_IN)
    for s in range(3):
        m(*data(MLP_IN, s))
    (prog,) = m._graph_runner.programs.values()
    ids = lambda ts: {id(t) for t in ts}  # noqa: E731
    sgd = m.optimizer
    carried = ids(prog.donated + prog.read + prog.written)
    # constant hyper-parameters fold into the program: their value tensors are not carried
    assert not ids([sgd.lr_value, sgd.mom_value, sgd.dam_value, sgd.decay_value]) & carried
    rewritten = list(m.get_params().values()) + list(sgd.get_states().values())
    assert ids(rewritten) <= ids(prog.donated) and ids(prog.written) == ids(prog.donated)
    assert prog.donated_devices == [device.get_default_device()]  # dropout advances the key


def test_evaluation_does_not_walk_the_layers_again_while_the_loss_layer_waits(monkeypatch):
    """An evaluation never calls the loss layer, so it stays uninitialised: the layers a call
    may initialise (and a failing call un-initialises) are found once per structure, not
    on every call -- and found again when a layer joins the model."""
    from singa_jax._src.model import model as model_mod
    walks = []
    real = model_mod.layer_tree
    # (the model's own binding: its calls' walks are counted, not initialization's)
    monkeypatch.setattr_one(model_mod, "layer_tree",
                            lambda root: walks.append(root) or real(root))
    m = MLP()
    m.compile([tensor.Tensor(MLP_IN)], is_train=False, use_graph=False)
    m.eval()
    x, _ = data(MLP_IN, 0)
    m(x)
    assert m._uninitialised_layers() == [m.loss]
    walks.clear()
    for _ in range(3):
        m(x)
    assert walks == []
    m.extra = layer.Linear(2)  # a new layer, not yet initialised: the model's structure changed
    assert {id(lay) for lay in m._uninitialised_layers()} == {id(m.loss), id(m.extra)}
    assert len(walks) == 1


def test_a_failed_first_call_leaves_its_new_layers_waiting_for_the_next_call():
    """A call that initialises a layer and then raises leaves the layer uninitialised (the
    transaction undoes it) -- and the model's record of its uninitialised layers says so, even
    when it was read again after the layer was initialised."""

    class Failing(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(3)
            self.fail = True

        def forward(self, x):
            y = self.fc(x)
            self._uninitialised_layers()  # (read once the layer is initialised)
            if self.fail:
                raise RuntimeError("the step fails after initialising fc")
            return y

    m = Failing()
    m.eval()
    x, _ = data(MLP_IN, 0)
    with pytest.raises(RuntimeError, match="fails after initialising"):
        m(x)
    assert not m.fc._initialized
    assert any(lay is m.fc for lay in m._uninitialised_layers())
    m.fail = False
    np.testing.assert_allclose(tensor.to_numpy(m(x)),
                               tensor.to_numpy(x) @ tensor.to_numpy(m.fc.W) +
                               tensor.to_numpy(m.fc.b), rtol=1e-5, atol=1e-6)
