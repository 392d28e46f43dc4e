"""Eager dispatch fast paths (autograd engine.py and function.py, tensor.handle.result_tensor).

Each op call skips work the general code would do: op outputs and gradients are built without the
Tensor constructor's argument parsing, static arguments are frozen once per op (plain values and
tuples of them as they are) and interned with the gradient masks and output specs, only ops that
declare state ask for it, a loss's unit gradient is made once, and a forward kernel returns no
copy of an input or output its pullback keeps (autograd/residuals.py). (The caches themselves:
test_eager_fast_paths.py.)
Here the same computations run with the fast paths on and with every one of them turned off;
values, gradients, state and the recorded graph must be identical, and match NumPy /
``jax.grad``.
"""
from __future__ import annotations

import textwrap
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, tensor
from singa_jax.tensor import Tensor

pytestmark = pytest.mark.usefixtures("training_mode")


def _np(t) -> np.ndarray:
    return np.asarray(t.array if isinstance(t, Tensor) else t)


def _inputs() -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return dict(x=rng.normal(size=(8, 5)).astype(np.float32),
                w=rng.normal(size=(5, 6)).astype(np.float32),
                b=rng.normal(size=(6,)).astype(np.float32),
                scale=rng.uniform(0.5, 1.5, size=(6,)).astype(np.float32),
                shift=rng.normal(size=(6,)).astype(np.float32),
                emb=rng.normal(size=(7, 2)).astype(np.float32),
                idx=rng.integers(0, 7, size=(8,)).astype(np.int32),
                labels=rng.integers(0, 2, size=(8,)).astype(np.int32))


def _matmul_creator_backward(x: Tensor, w: Tensor, dy: Tensor):
    """SINGA style: ``y = matmul(x, w)``, then ``y.creator.backward(dy.data)`` (CTensors)."""
    y = autograd.matmul(x, w)
    return y.creator.backward(dy.data)


def test_gradients_match_jax_grad():
    a = _inputs()
    x = Tensor(data=a["x"])
    w, b = Tensor(data=a["w"], stores_grad=True), Tensor(data=a["b"], stores_grad=True)
    emb = Tensor(data=a["emb"], stores_grad=True)
    idx = Tensor(data=a["idx"], requires_grad=False)
    left, right, _ = autograd.split(autograd.add_bias(autograd.matmul(x, w), b), 1, [2, 2, 2])
    logits = autograd.add(autograd.mul(autograd.relu(left), autograd.tanh(right)),
                          autograd.reshape(autograd.embedding(idx, emb), [8, -1]))
    loss = autograd.softmax_cross_entropy(logits, Tensor(data=a["labels"]))
    grads = {id(p): _np(g) for p, g in autograd.backward(loss)}

    def reference(w, b, emb):
        h = a["x"] @ w + b
        z = jax.nn.relu(h[:, :2]) * jnp.tanh(h[:, 2:4]) + emb[a["idx"]]
        return -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(8), a["labels"]])

    value, want = jax.value_and_grad(reference, argnums=(0, 1, 2))(a["w"], a["b"], a["emb"])
    np.testing.assert_allclose(_np(loss).reshape(()), value, rtol=1e-5)
    for p, g in zip((w, b, emb), want):
        np.testing.assert_allclose(grads[id(p)], g, rtol=1e-5, atol=1e-6)


def test_singa_style_direct_calls_on_ctensors(rng):
    x = rng.normal(size=(3, 4)).astype(np.float32)
    dy = rng.normal(size=(3, 4)).astype(np.float32)
    op = autograd.ReLU()
    y = op.forward(tensor.from_numpy(x).data)  # CTensors in and out, no engine call
    np.testing.assert_array_equal(np.asarray(y), np.maximum(x, 0))
    dx = op.backward(tensor.from_numpy(dy).data)
    np.testing.assert_array_equal(np.asarray(dx), dy * (x > 0))
    # the matmul's x is a plain leaf: the engine's call skips its gradient, SINGA's does not
    w = rng.normal(size=(4, 2)).astype(np.float32)
    g = rng.normal(size=(3, 2)).astype(np.float32)
    dx, dw = _matmul_creator_backward(Tensor(data=x), Tensor(data=w, stores_grad=True),
                                tensor.from_numpy(g))
    np.testing.assert_allclose(np.asarray(dx), g @ w.T, **matmul_tolerance(1e-6))
    np.testing.assert_allclose(np.asarray(dw), x.T @ g, **matmul_tolerance(1e-6))


TWO_DEVICES = textwrap.dedent("""
    import numpy as np
    from singa_jax import autograd, device, tensor
    autograd.training = True
    d0, d1 = device.create_cpu_devices(2)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = tensor.from_numpy(a, d1)
    x.stores_grad = x.requires_grad = True
    y = autograd.relu(x)  # inputs all on d1: the output is there, unchecked
    assert y.device is d1 and y.array.devices() == {d1.jax_device}
    (p, g), = autograd.backward(autograd.reduce_sum(y))
    assert g.device is d1 and g.array.devices() == {d1.jax_device}
    np.testing.assert_array_equal(tensor.to_numpy(g), (a > 0).astype(np.float32))
    # inputs on two devices: refused, as before
    try:
        autograd.add(tensor.from_numpy(a, d0), tensor.from_numpy(a, d1))
    except ValueError as e:
        assert "Add" in str(e) and "devices" in str(e), e
    else:
        raise AssertionError("an op across devices did not raise")
    print("OK")
""")


def test_outputs_live_on_their_inputs_device_with_two_devices(run_on_two_host_devices):
    run_on_two_host_devices(TWO_DEVICES)
