"""The recording path per operator kind (autodiff/recipes.py): a call shaped like its kind's last
call builds its operator from the kind's recipe. Every check compares against the generic path
(``kinds.ENABLED = False``) on the same inputs: the operator's state, its graph edges, its
outputs, its gradients and a short training run. Float32 on the CPU: identical values."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax._src.eager import replay
from singa_jax._src.autodiff import recipes as kinds
from singa_jax._src.base.modes import training_mode
from singa_jax.tensor import Tensor

from backend_precision import two_programs_tolerance


@pytest.fixture
def recipes_used(monkeypatch) -> List[bool]:
    """Each Recipe.record call: whether it made the operator (False: the signature differed)."""
    made: List[bool] = []
    record = kinds.Recipe.record

    def counting(self, xs):
        y = record(self, xs)
        made.append(y is not None)
        return y

    monkeypatch.setattr(kinds.Recipe, "record", counting)
    monkeypatch.setattr(kinds, "ENABLED", True)
    return made


def _fields(op: Any) -> Tuple[Dict[str, Any], list, str, Any]:
    """An operator's state: the kind's fields (Tensors by identity), its edges (creator kind,
    input identity, stores_grad), its pullback's type and its SINGA-style input mask."""
    state = dict(op.__dict__)
    for k in ("name", "y_id2idx", "_flat"):
        state.pop(k, None)
    src = [(type(c).__name__, id(x) if x is not None else None, sg)
           for c, _, x, sg in state.pop("src")]
    pullback = type(state.pop("_pullback", None)).__name__
    every = state.pop("_all_inputs", None)
    kept = {k: (id(v) if isinstance(v, Tensor) else v) for k, v in state.items()}
    return kept, src, pullback, None if every is None else every[1]


def _conv_bn_relu(x: Tensor, conv: layer.Conv2d, bn: layer.BatchNorm2d) -> List[Tensor]:
    h = conv(x)
    b = bn(h)
    return [h, b, autograd.relu(b)]


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_a_recipe_makes_the_operator_the_generic_path_makes(recipes_used, monkeypatch,
                                                            training, bias, rng):
    """Conv2d (a handle's kind), BatchNorm2d (over its running statistics, written in
    training) and relu (a table's kind): the second call of each is made from its recipe, and
    its operator, edges, output and the statistics it writes equal the generic path's."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv, bn = layer.Conv2d(3, 4, 3, padding=1, bias=bias), layer.BatchNorm2d(4)
    with training_mode(training):
        _conv_bn_relu(x, conv, bn)  # initialises the layers; leaves the recipes
        stats = [tensor.to_numpy(t) for t in (bn.running_mean, bn.running_var)]
        made = _conv_bn_relu(x, conv, bn)
        assert recipes_used[-3:] == [True, True, True]
        recipe_stats = [tensor.to_numpy(t) for t in (bn.running_mean, bn.running_var)]
        for t, a in zip((bn.running_mean, bn.running_var), stats):  # the generic call: same start
            t.copy_from_numpy(a)
        monkeypatch.setattr(kinds, "ENABLED", False)
        generic = _conv_bn_relu(x, conv, bn)
        generic_stats = [tensor.to_numpy(t) for t in (bn.running_mean, bn.running_var)]
    for a, b in zip(made, generic):
        assert type(a.creator) is type(b.creator)
        fa, fb = _fields(a.creator), _fields(b.creator)
        assert fa[0] == fb[0]
        # the same inputs, but an intermediate input is this call's own
        assert [e[0] for e in fa[1]] == [e[0] for e in fb[1]]
        assert [e[2] for e in fa[1]] == [e[2] for e in fb[1]]
        assert fa[2:] == fb[2:]
        assert a.name != b.name and a.requires_grad == b.requires_grad
        np.testing.assert_array_equal(tensor.to_numpy(a), tensor.to_numpy(b))
    for a, b in zip(recipe_stats, generic_stats):
        np.testing.assert_array_equal(a, b)
    if training:
        assert not np.array_equal(generic_stats[0], stats[0])  # (the statistics were written)


def _pullback_sources(y: Tensor, inputs: List[Any]) -> List[Any]:
    """Each leaf of ``y``'s creator's pullback as a walk recorded into its segment takes it:
    ``"output"`` (y's own value), the index of the call's input it is, or a computed residual
    (its aval, and whether it is pending)."""
    leaves, _ = y.creator._pullback_leaves(pending=True)
    sources = []
    for leaf in leaves:
        i = next((i for i, a in enumerate(inputs) if leaf is a), None)
        sources.append("output" if leaf is y._data else i if i is not None else
                       (leaf.aval, type(leaf) is replay.Deferred))
    return sources


def test_a_recorded_call_holds_its_pullback_as_the_walks_leaves(recipes_used, monkeypatch, rng):
    """Recorded by eager replay, an operator made from its recipe holds its pullback as the
    leaves a fused walk takes, gathered at the call by its kind's layout positions; the generic
    path's are gathered when the walk asks. Both are the same: the call's own inputs and output
    (no copies), and pending computed residuals of the same avals."""
    monkeypatch.setattr(replay, "MIN_RECORDS", 1)
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv, bn = layer.Conv2d(3, 4, 3, padding=1), layer.BatchNorm2d(4)
    results = []
    with training_mode(True):
        _conv_bn_relu(x, conv, bn)  # the recipes; a sequence this long is recorded from now
        replay.flush()
        for enabled in (True, False):
            monkeypatch.setattr(kinds, "ENABLED", enabled)
            h, b, r = _conv_bn_relu(x, conv, bn)
            assert type(r._data) is replay.Deferred  # (recorded)
            results.append([_pullback_sources(h, [x._data, conv.W._data, conv.b._data]),
                            _pullback_sources(b, [h._data, bn.scale._data, bn.bias._data]),
                            _pullback_sources(r, [b._data])])
            if enabled:
                assert recipes_used[-3:] == [True, True, True]
        replay.flush()
    made, generic = results
    assert made == generic
    assert sorted(made[0]) == [0, 1] and made[2] == ["output"]  # conv: x and W; relu: y
    assert sorted(made[1][:2]) == [0, 1] and len(made[1]) == 4  # bn: x, scale, 2 vectors


def test_gradients_through_recipe_made_operators_equal_the_generic_path(
        recipes_used, monkeypatch, training_mode, rng):
    """The fused walk and a SINGA-style direct backward (``op.backward(dy.data)``, which asks
    for the input gradients the call skipped) through operators made from recipes."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv, bn = layer.Conv2d(3, 4, 3, padding=1), layer.BatchNorm2d(4)
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(kinds, "ENABLED", enabled)
        grads = []
        for _ in range(4):  # recipes from the second; fused walks from the second/third
            y = autograd.reduce_sum(_conv_bn_relu(x, conv, bn)[2])
            grads = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(y)}
        h = _conv_bn_relu(x, conv, bn)[0]
        direct = h.creator.backward(tensor.from_numpy(np.ones(h.shape, np.float32)).data)
        results.append((grads, [np.asarray(d) for d in direct]))
        if enabled:
            assert recipes_used and all(recipes_used[3:])
    (made, made_direct), (generic, generic_direct) = results
    assert made.keys() == generic.keys() and len(made) == 4
    for k in made:
        np.testing.assert_allclose(made[k], generic[k], **two_programs_tolerance(1e-6, 1e-6),
                                   err_msg=k)
    assert len(made_direct) == len(generic_direct) == 3  # x's gradient too (the call skipped it)
    for a, b in zip(made_direct, generic_direct):
        np.testing.assert_allclose(a, b, **two_programs_tolerance(1e-6, 1e-6))


def test_another_signature_takes_the_generic_path_and_leaves_its_recipe(recipes_used, rng):
    """A changed input shape (a table op's recipes are kept per input avals), an input that
    stops requiring its gradient, another mode, and a PyTorch-style tracked input: each is not
    a recipe's signature (the generic path runs, its result is right, and it leaves the recipe
    of its own signature; one per mode, so training after an evaluation finds its own)."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    w = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    w.requires_grad, w.stores_grad = True, True

    def relu_of_mul(a, b):
        return autograd.relu(autograd.mul(a, b))

    with training_mode(True):
        relu_of_mul(x, w)  # (the recipes may be another test's: this call leaves this one's)
        del recipes_used[:]
        relu_of_mul(x, w)
        assert recipes_used == [True, True]
        small = tensor.from_numpy(rng.standard_normal((1, 3)).astype(np.float32))
        np.testing.assert_array_equal(tensor.to_numpy(relu_of_mul(small, small)),
                                      np.maximum(tensor.to_numpy(small) ** 2, 0))
        assert recipes_used[2:] == []  # a table op keeps a recipe per input avals: none yet
        relu_of_mul(small, small)
        relu_of_mul(x, w)  # both kept
        assert recipes_used[2:] == [True, True, True, True]
        w.requires_grad = False
        y = relu_of_mul(x, w)
        assert recipes_used[6] is False
        assert y.creator.src[0][0].input_needs_grad == (False, False)
    # another mode: a signature of its own, whose recipe is kept beside the training one's
    odd = tensor.from_numpy(rng.standard_normal((3, 7, 2)).astype(np.float32))
    with training_mode(False):
        n = len(recipes_used)
        relu_of_mul(odd, odd)  # (a shape no other test uses: no recipe yet)
        assert recipes_used[n:] == []
        np.testing.assert_array_equal(tensor.to_numpy(relu_of_mul(odd, odd)),
                                      np.maximum(tensor.to_numpy(odd) ** 2, 0))
        assert recipes_used[n:] == [True, True]
    with training_mode(True):
        n = len(recipes_used)
        relu_of_mul(odd, odd)  # the training call's first: generic
        assert recipes_used[n:] == []
        relu_of_mul(odd, odd)
    with training_mode(False):
        y = relu_of_mul(odd, odd)
        assert recipes_used[n:] == [True, True, True, True]  # each mode found its own
        assert not y.creator.keeps_backward_state()
    t = tensor.tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32), requires_grad=True)
    with training_mode(False):
        relu_of_mul(x, x)  # (leaves the recipes of these avals in this mode)
        n = len(recipes_used)
        y = autograd.relu(autograd.mul(t, t))
    assert recipes_used[n:] == [False, False] and y.tracked
    autograd.reduce_sum(y).backward()
    a = tensor.to_numpy(t)
    np.testing.assert_allclose(tensor.to_numpy(t.grad), np.where(a * a > 0, 2 * a, 0),
                               rtol=1e-6)


def test_under_autocast_a_recipe_computes_in_half_precision(recipes_used, monkeypatch, rng):
    """The autocast dtype is part of the signature: a recipe learnt under bfloat16 autocast
    gives a bfloat16 convolution equal to the generic path's; outside autocast float32 again."""
    x = tensor.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    conv = layer.Conv2d(3, 4, 3, padding=1)
    conv(x)
    outs = []
    for enabled in (True, False):
        monkeypatch.setattr(kinds, "ENABLED", enabled)
        with autograd.autocast("bfloat16"):
            conv(x)
            outs.append(conv(x))
    assert outs[0].dtype == outs[1].dtype and str(outs[0].dtype) == "bfloat16"
    np.testing.assert_array_equal(tensor.to_numpy(outs[0]).astype(np.float32),
                                  tensor.to_numpy(outs[1]).astype(np.float32))
    assert str(conv(x).dtype) == "float32"


class _Blocks(model.Model):
    def __init__(self):
        super().__init__()
        self.conv0, self.bn0 = layer.Conv2d(3, 4, 3, padding=1), layer.BatchNorm2d(4)
        self.conv1, self.bn1 = layer.Conv2d(4, 4, 3, padding=1, bias=False), layer.BatchNorm2d(4)
        self.flatten, self.fc = layer.Flatten(), layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        h = autograd.relu(self.bn0(self.conv0(x)))
        return self.fc(self.flatten(autograd.relu(self.bn1(self.conv1(h)))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _train(enabled: bool, monkeypatch) -> Tuple[List[float], Dict[str, np.ndarray]]:
    monkeypatch.setattr(kinds, "ENABLED", enabled)
    rng = np.random.default_rng(1)
    x = tensor.from_numpy(rng.standard_normal((4, 3, 6, 6)).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 3, 4).astype(np.int32))
    device.get_default_device().SetRandSeed(0)
    net = _Blocks()
    net.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    net.compile([x], is_train=True, use_graph=False)
    losses = []
    for _ in range(8):
        net.train()
        _, loss = net(x, y)
        losses.append(float(tensor.to_numpy(loss).reshape(())))
    state = {k: tensor.to_numpy(t) for k, t in net.get_states().items()}
    return losses, state


def test_eager_training_with_recipes_equals_the_generic_path(recipes_used, monkeypatch):
    """Eight eager steps (recorded by eager replay -- this short sequence too -- and from the
    third one program) with recipes and without, from the same start: the same losses,
    parameters, statistics and momentum; the loss falls."""
    monkeypatch.setattr(replay, "MIN_RECORDS", 4)
    stats_before = autograd.replay_stats()
    made_losses, made_state = _train(True, monkeypatch)
    assert sum(recipes_used) >= 6 * 7  # every conv, bn and relu from the second step on
    generic_losses, generic_state = _train(False, monkeypatch)
    assert autograd.replay_stats()["replayed"] > stats_before["replayed"]
    assert made_losses[-1] < made_losses[0]
    np.testing.assert_allclose(made_losses, generic_losses, **two_programs_tolerance(1e-6, 1e-6))
    assert made_state.keys() == generic_state.keys()
    for k in made_state:
        np.testing.assert_allclose(made_state[k], generic_state[k],
                                   **two_programs_tolerance(1e-6, 1e-6), err_msg=k)


def test_a_replaced_kernel_function_is_not_taken_from_the_recipe(recipes_used, monkeypatch,
                                                                 rng):
    """An op class whose pure function is replaced (a user patching ``autograd.Tanh.fn``)
    computes with the new one at once, as the generic path reads it on every call."""
    x = tensor.from_numpy(rng.standard_normal((2, 3)).astype(np.float32))
    autograd.tanh(x)
    autograd.tanh(x)
    assert recipes_used[-1] is True
    monkeypatch.setattr(autograd.Tanh, "fn", staticmethod(lambda a: a * 2.0))
    np.testing.assert_allclose(tensor.to_numpy(autograd.tanh(x)), 2 * tensor.to_numpy(x),
                               rtol=1e-6)
    assert recipes_used[-1] is False
