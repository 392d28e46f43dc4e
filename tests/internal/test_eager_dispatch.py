"""The eager call path white-box: fast paths against the generic path, lean pullbacks, kept
residuals. (This tier imports singa_jax._src.)"""
from __future__ import annotations
import re
from typing import Dict
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax._src.eager import replay
from singa_jax._src.autodiff import residuals
from singa_jax._src.autodiff import backward as backward_mod
from singa_jax._src.autodiff import function, kernels
from singa_jax._src.autodiff import operator as operator_mod
from singa_jax._src.autodiff import recipes as kinds
from singa_jax._src.tensor import tensor as tensor_mod
from singa_jax._src.ops import nn
from singa_jax._src.autodiff.function import Function
from singa_jax._src.backend.xla_options import kernel
from singa_jax._src.base.node import Dummy
from singa_jax._src.base.modes import TraceHook, trace_hook
from singa_jax.tensor import Tensor
pytestmark = pytest.mark.usefixtures("training_mode")
from test_eager_dispatch import (  # noqa: F401 (shared helpers and fixtures)
    _inputs, _matmul_creator_backward, _np)


def _subclasses(cls: type):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _general_result(array, device, requires_grad=True, creator=None, name=None,
                    placed=False) -> Tensor:
    return Tensor(data=array, device=device, requires_grad=requires_grad, creator=creator,
                  name=name)


def _use_general_paths(monkeypatch) -> None:
    """Turn every fast path off: no per-kind recipes (every call builds its operator the
    generic way), outputs and gradients through ``Tensor(...)``, static arguments frozen by the
    general ``_freeze`` (sorted), declared state asked of every op, the root gradient made by a
    kernel on each backward. (The checked monkeypatch makes each patch reach every module that
    reads the name.)"""
    monkeypatch.setattr(kinds, "ENABLED", False)
    for module in (operator_mod, backward_mod, tensor_mod):
        monkeypatch.setattr(module, "result_tensor", _general_result)
    for module in (kernels, function):
        monkeypatch.setattr(module, "static_key", kernels._freeze)
    for cls in _subclasses(Function):
        monkeypatch.setattr(cls, "_declares_state", True)
    monkeypatch.setattr(backward_mod, "_unit_gradient",
                        lambda shape, dtype: kernels.fill_like(1.0, shape, dtype))
    # the forward kernels return their whole pullback (fresh kernels: the cached ones were
    # traced with the forwarding)
    monkeypatch.setattr(residuals, "split", lambda pullback, inputs, outputs: pullback)
    fresh = kernel(static_argnums=(0, 1, 2, 3))(kernels.forward_vjp_kernel.__wrapped__)
    for module in (kernels, kinds):
        monkeypatch.setattr(module, "forward_vjp_kernel", fresh)
    # no interned keys, masks or output specs (each op derives its own), every replayed output
    # returned, pullbacks walked as the pytrees they are
    for module in (kernels, function, kinds):
        monkeypatch.setattr(module, "interned", lambda t: t)
    for module in (kernels, function):
        monkeypatch.setattr(module, "INTERNED_MAX", 0)
    monkeypatch.setattr(function, "_DIFFERENTIATED", {})
    monkeypatch.setattr(function, "_OUTPUT_SPECS", {})
    monkeypatch.setattr(operator_mod, "_NEEDS", {})
    monkeypatch.setattr(replay, "_referenced", lambda leaves: None)


def _recorded_graph(y: Tensor) -> np.ndarray:
    """The creator graph behind ``y`` as text (op types, inputs' names and flags, outputs'
    names), with the naming counters left out: they differ between two runs."""
    lines, seen, stack = [], set(), [y.creator]
    while stack:
        op = stack.pop()
        if op in seen or isinstance(op, Dummy):
            continue
        seen.add(op)
        outs = sorted(op.output_name(i) for i in op.y_id2idx.values())
        srcs = [(type(c).__name__, c.output_name(c.y_id2idx[xid]), stores, x is not None)
                for c, xid, x, stores in op.src]
        lines.append(re.sub(r"#\d+", "#", f"{type(op).__name__} {outs} <- {srcs} "
                                          f"requires_grad={op.requires_grad}"))
        stack.extend(c for c, _, _, _ in op.src)
    return np.array(lines)


def _scenario(a: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Every kind of op the fast paths meet: a plain input batch (no gradient), declared reads and
    writes (BatchNorm's running statistics, the loss's target), a keyed op (Dropout), an op with
    several outputs one of which is unused, integer inputs (Embedding's indices), list-valued
    static arguments (Reshape), a SINGA-style backward and a PyTorch-style one."""
    device.get_default_device().SetRandSeed(7)  # Dropout's mask: same key in every run
    x = Tensor(data=a["x"])
    w, b = Tensor(data=a["w"], stores_grad=True), Tensor(data=a["b"], stores_grad=True)
    scale, shift = Tensor(data=a["scale"], stores_grad=True), Tensor(data=a["shift"],
                                                                     stores_grad=True)
    emb = Tensor(data=a["emb"], stores_grad=True)
    idx, labels = Tensor(data=a["idx"], requires_grad=False), Tensor(data=a["labels"])
    running_mean, running_var = tensor.zeros((6,)), tensor.ones((6,))
    handle = autograd.BatchNormHandle(0.1, Tensor((8, 6)))

    h = autograd.add_bias(autograd.matmul(x, w), b)
    h = autograd.batchnorm_2d(handle, h, scale, shift, running_mean, running_var)
    h = autograd.dropout(h, ratio=0.3)
    left, right, unused = autograd.split(h, 1, [2, 2, 2])
    e = autograd.reshape(autograd.embedding(idx, emb), [8, -1])
    logits = autograd.add(autograd.mul(autograd.relu(left), autograd.tanh(right)), e)
    loss = autograd.softmax_cross_entropy(logits, labels)
    out = {"loss": _np(loss), "graph": _recorded_graph(loss), "running_mean": _np(running_mean),
           "running_var": _np(running_var), "unused": _np(unused)}
    named = {id(w): "w", id(b): "b", id(scale): "scale", id(shift): "shift", id(emb): "emb"}
    for p, g in autograd.backward(loss):
        out[f"grad {named[id(p)]}"] = _np(g)
        out[f"grad name {named[id(p)]}"] = np.array(re.sub(r"#\d+", "#", g.name))
    # SINGA style: a matmul's creator backward gives x's gradient too, though the engine's
    # call skipped it (x is a plain leaf)
    dy = tensor.from_numpy(np.ones((8, 6), np.float32))
    out["singa dx"], out["singa dw"] = map(np.asarray, _matmul_creator_backward(x, w, dy))
    # PyTorch style: gradient with respect to an intermediate result and a parameter
    t = tensor.tensor(a["x"], requires_grad=True)
    mid = autograd.tanh(autograd.matmul(t, w))
    gmid, gt = autograd.grad(autograd.reduce_sum(autograd.mul(mid, mid)), [mid, t])
    out["torch dmid"], out["torch dt"] = _np(gmid), _np(gt)
    return out


def test_fast_and_general_paths_give_identical_values_gradients_and_state(monkeypatch):
    a = _inputs()
    with autograd.fused_backward(False):  # the second walk would recur: one fused kernel
        _scenario(a)  # the first call of each kind leaves its recipe ...
        fast = _scenario(a)  # ... which the second takes
        _use_general_paths(monkeypatch)
        general = _scenario(a)
    assert fast.keys() == general.keys()
    assert {"grad w", "grad b", "grad scale", "grad shift", "grad emb"} <= fast.keys()
    for k in fast:
        np.testing.assert_array_equal(fast[k], general[k], err_msg=k)


def test_op_outputs_and_gradients_are_the_tensors_the_constructor_makes(rng):
    x = Tensor(data=rng.normal(size=(2, 3)).astype(np.float32), stores_grad=True)
    y = autograd.relu(x)
    like = Tensor(data=y.array, device=y.device, requires_grad=y.requires_grad,
                  creator=y.creator, name=y.name)
    assert vars(y).keys() == vars(like).keys()
    assert all(getattr(y, k) is getattr(like, k) for k in vars(y) if k != "name")
    assert y.name == like.name == f"{y.creator.name}:0" and y.creator.y_id2idx == {id(y): 0}
    (p, g), = autograd.backward(autograd.reduce_sum(y))
    assert p is x and g.name == f"{x.name}_g" and g.requires_grad and not g.stores_grad
    assert isinstance(g.creator, Dummy) and g.creator.name == g.name and g.device is x.device
    np.testing.assert_array_equal(_np(g), (_np(x) > 0).astype(np.float32))


def test_graph_mode_hook_sees_every_op_output_created(rng):
    class Recorder(TraceHook):
        def __init__(self):
            self.made = []

        def created(self, t):
            self.made.append(t)

    hook = Recorder()
    x = Tensor(data=rng.normal(size=(2, 3)).astype(np.float32), stores_grad=True)
    with trace_hook(hook):
        parts = autograd.split(x, 1, [1, 2])
        s = autograd.reduce_sum(autograd.relu(parts[1]))
        grads = [g for _, g in autograd.backward(s)]
    # in order: split's two outputs, relu's, sum's, then x's gradient
    relu_out = s.creator.src[0][0].y_id2idx
    assert [id(t) for t in hook.made] == [id(parts[0]), id(parts[1]), *relu_out, id(s),
                                          id(grads[0])]


def test_a_loss_unit_gradient_is_one_and_never_a_kept_tracer(monkeypatch, rng):
    monkeypatch.setattr(backward_mod, "_UNIT_GRADIENTS", {})
    x = Tensor(data=rng.normal(size=(3, 4)).astype(np.float32), stores_grad=True)
    loss = autograd.reduce_mean(autograd.mul(x, x))  # one element, shape (1, 1)
    explicit = [_np(g) for _, g in autograd.backward(loss, tensor.ones((1, 1)))]
    # inside a trace the unit gradient is a tracer: used there, not kept for later calls
    traced = jax.jit(lambda: [g.array for _, g in autograd.backward(loss)])()
    assert not any(isinstance(g, jax.core.Tracer) for g in backward_mod._UNIT_GRADIENTS.values())
    default = [_np(g) for _, g in autograd.backward(loss)]
    assert len(backward_mod._UNIT_GRADIENTS) == 1  # made by the eager backward, kept
    again = [_np(g) for _, g in autograd.backward(loss)]
    for got in (traced, default, again):
        np.testing.assert_allclose(np.asarray(got[0]), explicit[0], rtol=1e-6)
    np.testing.assert_allclose(explicit[0], 2 * _np(x) / x.size(), rtol=1e-6)


def test_static_arguments_plain_or_not_select_the_same_kernel_results(rng):
    x = Tensor(data=rng.normal(size=(4, 6)).astype(np.float32), stores_grad=True)
    # plain statics (kept as they are) and list / NumPy ones (frozen) alike
    y1 = autograd.reshape(x, [3, -1])
    y2 = autograd.reshape(x, np.array([3, 8]))
    y3 = autograd.reduce_sum(x, axes=[1], keepdims=0)
    y4 = autograd.reduce_sum(x, axes=None, keepdims=1)
    np.testing.assert_array_equal(_np(y1), _np(x).reshape(3, 8))
    np.testing.assert_array_equal(_np(y2), _np(x).reshape(3, 8))
    np.testing.assert_allclose(_np(y3), _np(x).sum(1), rtol=1e-6)
    np.testing.assert_allclose(_np(y4), _np(x).sum(keepdims=True), rtol=1e-6)
    assert dict(y2.creator._static) == {"shape": (3, 8)}  # NumPy values frozen to tuples
    assert y4.creator._static == (("axes", None), ("keepdims", 1))  # plain: items as they are


def _pullback_leaves(y: Tensor) -> list:
    return jax.tree_util.tree_leaves(y.creator._vjp)


def _pullback_of(y: Tensor, op_type: str) -> list:
    """The pullback leaves of the nearest op of type ``op_type`` behind ``y``."""
    stack = [y.creator]
    while stack:
        op = stack.pop()
        if type(op).__name__ == op_type:
            return jax.tree_util.tree_leaves(op._vjp)
        stack.extend(c for c, _, _, _ in op.src)
    raise AssertionError(f"no {op_type} behind {y.name}")


def test_forward_kernels_return_no_copies_of_inputs_or_outputs(rng):
    x = Tensor(data=rng.normal(size=(8, 5)).astype(np.float32))  # a plain input: no gradient
    w = Tensor(data=rng.normal(size=(5, 3)).astype(np.float32), stores_grad=True)
    h = autograd.matmul(x, w)  # dW = x^T dy: the pullback keeps x, the input itself
    kept, = _pullback_leaves(h)
    assert kept is x.array
    e = autograd.exp(h)  # d exp = exp: the pullback keeps the output itself
    assert any(leaf is e.array for leaf in _pullback_leaves(e))
    m = autograd.mul(e, e)  # x * x keeps x (as each factor)
    assert all(leaf is e.array for leaf in _pullback_leaves(m))
    loss = autograd.reduce_sum(m)
    (p, g), = autograd.backward(loss)
    want = jax.grad(lambda w: jnp.sum(jnp.exp(_np(x) @ w) ** 2))(_np(w))
    assert p is w
    np.testing.assert_allclose(_np(g), want, rtol=1e-5)
    # the same arrays back-propagated again, by the fused walk (the graph is kept)
    with autograd.fused_backward(True):
        for _ in range(2):
            (_, g2), = autograd.backward(loss)
    np.testing.assert_allclose(_np(g2), want, rtol=1e-5)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 3)])
def test_relu_and_batchnorm_pullbacks_keep_no_activation_sized_copies(rng, shape):
    """relu's and training batch norm's eager pullbacks are hand-written (residuals.register_lean):
    relu keeps its output alone, batch norm its input and scale plus two per-channel vectors
    (JAX's own keep a mask and a zeros array, and ``x - mean`` twice). Values and gradients of
    x, scale and bias equal JAX's differentiation of the plain functions (float32, CPU; the
    hand-written batch-norm gradient sums in another order: 1e-5), and so do the running
    statistics."""
    c = shape[1]
    x = rng.normal(size=shape).astype(np.float32) * 2 + 1
    scale, bias = (rng.normal(size=c).astype(np.float32) for _ in range(2))
    rm0, rv0 = rng.normal(size=c).astype(np.float32), np.abs(rng.normal(size=c)).astype(
        np.float32) + 0.5
    xt, st, bt = (Tensor(data=v, stores_grad=True) for v in (x, scale, bias))
    rm, rv = Tensor(data=rm0, requires_grad=False), Tensor(data=rv0, requires_grad=False)
    handle = autograd.BatchNormHandle(0.9, xt)
    h = autograd.batchnorm_2d(handle, xt, st, bt, rm, rv)
    kept = _pullback_leaves(h)
    assert kept[0] is xt.array and kept[1] is st.array
    assert [k.shape for k in kept[2:]] == [(c,), (c,)]  # the batch mean, 1 / sqrt(var + eps)
    y = autograd.relu(h)
    dy = rng.normal(size=shape).astype(np.float32)
    loss = autograd.reduce_sum(autograd.mul(y, Tensor(data=dy, requires_grad=False)))
    grads = {id(p): _np(g) for p, g in autograd.backward(loss)}

    def reference(x, scale, bias):  # the plain kernel, differentiated by JAX
        y, new_mean, new_var = nn._batchnorm_kernel(x, scale, bias, rm0, rv0, training=True,
                                                    momentum=0.9, epsilon=1e-5)
        return jnp.sum(jax.nn.relu(y) * dy), (y, new_mean, new_var)

    (_, (want_h, want_rm, want_rv)), want = jax.value_and_grad(
        reference, argnums=(0, 1, 2), has_aux=True)(x, scale, bias)
    np.testing.assert_allclose(_np(h), want_h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_np(rm), want_rm, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_np(rv), want_rv, rtol=1e-6, atol=1e-7)
    for p, g in zip((xt, st, bt), want):
        np.testing.assert_allclose(grads[id(p)], g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op, fn", [(autograd.relu, jax.nn.relu), (autograd.tanh, jnp.tanh),
                                    (autograd.sigmoid, jax.nn.sigmoid)])
def test_activation_pullbacks_keep_the_output_alone(rng, op, fn):
    """relu, tanh and sigmoid keep their output as the pullback's one residual (the kernel's
    own output, no copy); gradients equal jax.grad's (float32, CPU: 1e-6), relu's 0 at
    ``x <= 0`` even for an infinite incoming gradient (SINGA's rule)."""
    x = rng.normal(size=(4, 7)).astype(np.float32)
    x[0, :3] = 0.0
    xt = Tensor(data=x, stores_grad=True)
    y = op(xt)
    assert [leaf is y.array for leaf in _pullback_leaves(y)] == [True]
    dy = rng.normal(size=x.shape).astype(np.float32)
    (_, g), = autograd.backward(autograd.reduce_sum(autograd.mul(
        y, Tensor(data=dy, requires_grad=False))))
    want = jax.grad(lambda v: jnp.sum(fn(v) * dy))(x)
    np.testing.assert_allclose(_np(g), want, rtol=1e-6, atol=1e-7)
    if op is autograd.relu:
        inf = np.where(x > 0, 1.0, np.inf).astype(np.float32)
        (_, g), = autograd.backward(autograd.reduce_sum(autograd.mul(
            op(Tensor(data=x, stores_grad=True)), Tensor(data=inf, requires_grad=False))))
        np.testing.assert_array_equal(_np(g), (x > 0).astype(np.float32))


def test_dropout_pullback_keeps_its_mask_alone(rng):
    """Dropout's eager pullback keeps its boolean mask only (JAX's own keeps a float array of
    x's size too); the gradient is dy / (1 - ratio) where kept, else 0 (float32, CPU: 1e-6)."""
    x = Tensor(data=rng.normal(size=(6, 9)).astype(np.float32), stores_grad=True)
    y = autograd.dropout(x, 0, 0.3)
    assert [(k.shape, k.dtype) for k in _pullback_leaves(y)] == [((6, 9), np.dtype(bool))]
    dy = rng.normal(size=(6, 9)).astype(np.float32)
    (_, g), = autograd.backward(autograd.reduce_sum(autograd.mul(
        y, Tensor(data=dy, requires_grad=False))))
    keep = _np(y) != 0
    assert 0 < keep.sum() < keep.size
    np.testing.assert_allclose(_np(y)[keep], _np(x)[keep] / 0.7, rtol=1e-6)
    np.testing.assert_allclose(_np(g), np.where(keep, dy / 0.7, 0), rtol=1e-6, atol=1e-7)


def test_a_kept_input_survives_a_graph_step_that_rewrites_its_tensor(rng):
    """An eager forward's pullback holds a parameter's array itself (no copy). A compiled step
    run before that backward donates the parameter's buffer to XLA, unless something else holds
    it (graph._copy_shared): the eager backward must still read the forward's values."""

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(3)

        def forward(self, x):
            return self.fc(x)

        def train_one_batch(self, x, y):
            loss = autograd.mse_loss(self.forward(x), y)
            self.optimizer(loss)
            return loss

    xa = rng.normal(size=(4, 5)).astype(np.float32)
    ya = rng.normal(size=(4, 3)).astype(np.float32)
    net = Net()
    net.set_optimizer(opt.SGD(lr=0.1))
    x, y = tensor.from_numpy(xa), tensor.from_numpy(ya)
    net.compile([x], is_train=True, use_graph=True)
    net(x, y)
    # eager, with an input that gets a gradient: dx = dy W^T, so the pullback keeps W's array
    xg = Tensor(data=xa, stores_grad=True)
    hidden = autograd.tanh(net.forward(xg))
    assert any(leaf is net.fc.W.array for leaf in _pullback_of(hidden, "Matmul"))
    w_then, b_then = _np(net.fc.W).copy(), _np(net.fc.b).copy()
    for _ in range(2):
        net(x, y)  # compiled steps rewrite W
    assert not np.allclose(_np(net.fc.W), w_then)
    grads = {id(p): _np(g) for p, g in autograd.backward(autograd.reduce_sum(hidden))}
    want = jax.grad(lambda x: jnp.sum(jnp.tanh(x @ w_then + b_then)))(xa)
    np.testing.assert_allclose(grads[id(xg)], want, rtol=1e-5, atol=1e-6)


def test_only_ops_that_declare_state_fetch_it():
    assert not autograd.ReLU._declares_state and not autograd.ReduceSum._declares_state
    assert autograd.Dropout._declares_state  # needs_key
    assert autograd.SoftMaxCrossEntropy._declares_state  # reads its target
    from singa_jax._src.ops.nn import _BatchNorm2d
    assert _BatchNorm2d._declares_state  # reads and writes the running statistics
