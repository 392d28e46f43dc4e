"""Semantics of the reverse-mode engine (engine.py + function.py), independent of particular ops:
which tensors get gradients, accumulation, skipping, the training switch, custom operators,
custom dy, multi-output ops, and that memory does not grow over many steps."""
from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd
from singa_jax.autograd import Operator
from singa_jax.tensor import Tensor


pytestmark = pytest.mark.usefixtures("training_mode")


def _t(a, **kw) -> Tensor:
    return Tensor(data=np.asarray(a, np.float32), **kw)


def _np(t: Tensor) -> np.ndarray:
    return np.asarray(t.array)


def test_only_stores_grad_tensors_are_yielded_with_their_gradients(rng):
    x = _t(rng.normal(size=(3, 4)))  # input: requires grad but does not store it
    w = _t(rng.normal(size=(4, 2)), stores_grad=True)
    b = _t(rng.normal(size=(2,)), stores_grad=True)
    y = autograd.add_bias(autograd.matmul(x, w), b)
    grads = dict((id(p), g) for p, g in autograd.backward(autograd.reduce_sum(y)))
    assert set(grads) == {id(w), id(b)}
    np.testing.assert_allclose(_np(grads[id(w)]), _np(x).sum(0)[:, None].repeat(2, 1),
                               **matmul_tolerance(1e-5))  # x^T @ ones: a product
    np.testing.assert_allclose(_np(grads[id(b)]), [3.0, 3.0])


def test_a_tensor_used_by_several_ops_accumulates_its_gradient(rng):
    x = _t(rng.normal(size=(2, 3)), stores_grad=True)
    # y = x*x + sin(x) + x  ->  dy/dx = 2x + cos(x) + 1
    y = autograd.add(autograd.add(autograd.mul(x, x), autograd.sin(x)), x)
    (p, g), = list(autograd.backward(y))
    assert p is x
    np.testing.assert_allclose(_np(g), 2 * _np(x) + np.cos(_np(x)) + 1, rtol=1e-5)


def test_ops_whose_inputs_need_no_grad_are_skipped(rng):
    calls = []

    class Spy(Operator):
        def forward(self, x):
            return x * 2

        def backward(self, dy):
            calls.append(self.name)
            return dy * 2

    frozen = _t(rng.normal(size=(3,)), requires_grad=False)
    w = _t(rng.normal(size=(3,)), stores_grad=True)
    branch = Spy(name="frozen_branch")(frozen)[0]  # needs no grad: its backward must not run
    assert not branch.requires_grad
    y = autograd.mul(Spy(name="w_branch")(w)[0], branch)
    grads = autograd.gradients(y)
    assert calls == ["w_branch"]
    np.testing.assert_allclose(_np(grads[id(w)]), 2 * _np(branch), rtol=1e-6)


def test_a_tensor_also_used_by_a_no_grad_op_still_gets_its_gradient(rng):
    x = _t(rng.normal(size=(5,)), stores_grad=True)
    y = autograd.mul(x, autograd.greater(x, _t(np.zeros(5))))  # relu through a mask
    grads = autograd.gradients(y)
    np.testing.assert_array_equal(_np(grads[id(x)]), (_np(x) > 0).astype(np.float32))


def test_training_switch_controls_backward_state(rng):
    x = _t(rng.normal(size=(3,)), stores_grad=True)
    autograd.training = False
    y = autograd.tanh(x)
    np.testing.assert_allclose(_np(y), np.tanh(_np(x)), rtol=1e-6)  # forward still works
    with pytest.raises(RuntimeError, match="training"):
        list(autograd.backward(y))
    autograd.training = True
    g = autograd.gradients(autograd.tanh(x))[id(x)]
    np.testing.assert_allclose(_np(g), 1 - np.tanh(_np(x)) ** 2, rtol=1e-5)


def test_user_defined_operator_with_jax_numpy_works_unchanged(rng):
    class Cube(Operator):
        """y = x^3, written like a SINGA user operator but with jax.numpy."""

        def forward(self, x):
            if autograd.training:
                self.x = x
            return jnp.power(x, 3)

        def backward(self, dy):
            return 3 * jnp.square(self.x) * dy

    def cube(x):
        return Cube()(x)[0]

    x = _t(rng.normal(size=(2, 3)), stores_grad=True)
    y = autograd.reduce_mean(autograd.mul(cube(x), x))  # mean(x^4)
    grads = autograd.gradients(y)
    np.testing.assert_allclose(_np(y), np.mean(_np(x) ** 4), rtol=1e-5)
    np.testing.assert_allclose(_np(grads[id(x)]), 4 * _np(x) ** 3 / 6, rtol=1e-5)


def test_backward_with_a_custom_dy(rng):
    x = _t(rng.normal(size=(2, 3)), stores_grad=True)
    dy = rng.normal(size=(2, 3)).astype(np.float32)
    g_tensor = autograd.gradients(autograd.exp(x), _t(dy))[id(x)]
    np.testing.assert_allclose(_np(g_tensor), dy * np.exp(_np(x)), rtol=1e-5)
    g_scalar = autograd.gradients(autograd.exp(x), 0.5)[id(x)]  # scales every element
    np.testing.assert_allclose(_np(g_scalar), 0.5 * np.exp(_np(x)), rtol=1e-5)
    with pytest.raises(ValueError, match="backward"):
        autograd.gradients(autograd.exp(x), _t(np.ones((3, 2))))


DEFAULT_DY_CASES = [
    # (id, y from x, d sum(y) / dx from x) -- y is never a scalar here except reduce_sum's
    ("relu", lambda x: autograd.relu(x), lambda a: (a > 0).astype(np.float32)),
    ("sum_of_several", lambda x: autograd.sum(x, x), lambda a: np.full_like(a, 2.0)),
    ("reduce_sum", lambda x: autograd.reduce_sum(x, [1]), np.ones_like),
    ("second_split_output", lambda x: autograd.split(x, 1, [1, 2])[1],
     lambda a: np.array([[0, 1, 1]] * len(a), np.float32)),
    ("cast", lambda x: autograd.cast(x, 0), np.ones_like),
]


@pytest.mark.parametrize("make_y,expected", [c[1:] for c in DEFAULT_DY_CASES],
                         ids=[c[0] for c in DEFAULT_DY_CASES])
def test_default_dy_works_whatever_op_produced_y(make_y, expected, rng):
    x_np = rng.normal(size=(2, 3)).astype(np.float32)
    x = _t(x_np, stores_grad=True)
    g = autograd.gradients(make_y(x))[id(x)]  # dy defaults to ones of y's shape
    np.testing.assert_array_equal(_np(g), expected(x_np))


def test_multi_output_op_where_only_some_outputs_are_used(rng):
    x_np = rng.normal(size=(3, 6)).astype(np.float32)
    x = _t(x_np, stores_grad=True)
    a, b, c = autograd.split(x, 1, [1, 2, 3])
    y = autograd.add(autograd.reduce_sum(autograd.mul(a, a)), autograd.reduce_sum(c))  # b unused
    g = _np(autograd.gradients(y)[id(x)])
    expected = np.zeros_like(x_np)
    expected[:, :1] = 2 * x_np[:, :1]
    expected[:, 3:] = 1.0
    np.testing.assert_allclose(g, expected, rtol=1e-6)


def test_same_tensor_twice_in_one_op(rng):
    x = _t(rng.normal(size=(4,)), stores_grad=True)
    g = autograd.gradients(autograd.mul(x, x))[id(x)]
    np.testing.assert_allclose(_np(g), 2 * _np(x), rtol=1e-6)


def test_non_leaf_tensor_with_stores_grad_is_yielded(rng):
    x = _t(rng.normal(size=(3,)), stores_grad=True)
    h = autograd.exp(x)
    h.stores_grad = True
    grads = autograd.gradients(autograd.reduce_sum(autograd.mul(h, h)))
    np.testing.assert_allclose(_np(grads[id(h)]), 2 * np.exp(_np(x)), rtol=1e-5)
    np.testing.assert_allclose(_np(grads[id(x)]), 2 * np.exp(2 * _np(x)), rtol=1e-5)


def test_memory_does_not_grow_over_many_steps(rng):
    w = _t(rng.normal(size=(4, 4)), stores_grad=True)
    x = _t(rng.normal(size=(2, 4)))

    def step():
        loss = autograd.reduce_mean(autograd.relu(autograd.matmul(x, w)))
        for p, g in autograd.backward(loss):
            p.array = p.array - 0.01 * g.array  # rebinding, as an optimizer does

    for _ in range(20):  # warm up: compile, fill caches
        step()
    gc.collect()
    before = len(jax.live_arrays())
    for _ in range(1000):
        step()
    gc.collect()
    assert len(jax.live_arrays()) <= before + 2


def test_forward_rejects_non_tensor_inputs():
    with pytest.raises(TypeError, match="Tensor"):
        autograd.relu(np.ones(3))


class _Scale(Operator):
    """y = 2 x, written as a user Operator (no jax kernel)."""

    def forward(self, x):
        return 2.0 * x

    def backward(self, dy):
        return 2.0 * dy


def test_gradient_is_yielded_when_a_freed_intermediate_shared_the_parameters_id():
    # An intermediate Tensor nobody keeps is freed during the forward pass (its consumers record
    # only its id); CPython may hand that id to a Tensor made later, such as a parameter a layer
    # builds lazily. The engine must not mistake the two (SINGA keys its counts by id alone).
    x = Tensor(data=np.ones(3, np.float32), requires_grad=True)
    h2 = _Scale()(_Scale()(x)[0])[0]  # the first output is now referenced only by id
    (src_op, freed_id, _, _), = h2.creator.src
    w = Tensor(data=np.arange(3, dtype=np.float32), stores_grad=True, name="w")
    loss = autograd.reduce_sum(autograd.mul(h2, w))
    # make w look exactly like an allocator that reused the freed id: same id in every record
    mul_op = loss.creator.src[0][0]
    entry = [i for i, s in enumerate(mul_op.src) if s[2] is w][0]
    mul_op.src[entry] = (w.creator, freed_id, w, True)
    w.creator.y_id2idx = {freed_id: 0}
    grads = dict((t.name, np.asarray(g.array)) for t, g in autograd.backward(loss))
    np.testing.assert_allclose(grads["w"], 4.0 * np.ones(3))  # d(sum(4x * w))/dw = 4x


def test_every_parameter_gets_its_gradient_when_ids_are_reused():
    # the same, with CPython actually reusing the id (skipped if the allocator does not)
    x = Tensor(data=np.ones(3, np.float32), requires_grad=True)
    h1 = _Scale()(x)[0]
    h2 = _Scale()(h1)[0]
    freed_id = id(h1)
    del h1
    kept = []
    for _ in range(2000):
        w = Tensor(data=np.arange(3, dtype=np.float32), stores_grad=True, name="w")
        if id(w) == freed_id:
            break
        kept.append(w)
    else:
        pytest.skip("CPython did not reuse the freed Tensor's id")
    loss = autograd.reduce_sum(autograd.mul(h2, w))
    grads = {t.name: np.asarray(g.array) for t, g in autograd.backward(loss)}
    np.testing.assert_allclose(grads["w"], 4.0 * np.ones(3))
