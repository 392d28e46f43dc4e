"""singa_wrap's RNN operations against the nn family's kernel. (This tier imports
singa_jax._src.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import singa_wrap as sw
from singa_jax._src.ops import nn
from test_singa_wrap import (  # noqa: F401 (shared helpers and fixtures)
    RNG, ct, npa)


def test_rnn_functions_match_jax_grad():
    T, B, F, H = 3, 2, 4, 5
    x = RNG.normal(size=(T, B, F)).astype(np.float32)
    h = sw.CudnnRNNHandle(ct(x), H, 1)  # tanh RNN (cheapest to compile)
    W = RNG.normal(size=(h.weights_size,)).astype(np.float32) * 0.3
    hx, cx = np.zeros((1, B, H), np.float32), np.zeros((1, B, H), np.float32)
    xc = ct(x)
    y, hy, cy = sw.GpuRNNForwardTraining(xc, ct(hx), ct(cx), ct(W), h)
    assert y.shape() == (T, B, H) and hy.shape() == (1, B, H) and cy.shape() == (1, B, H)
    # the weights' gradient needs x: the handle's pullback keeps x's array itself, not a copy
    assert any(leaf is xc._array for leaf in jax.tree_util.tree_leaves(h._pullback))
    dy = RNG.normal(size=(T, B, H)).astype(np.float32)

    def loss(x_, w_):
        out = nn._rnn_kernel(x_, hx, cx, w_, None, None, mode=1, hidden_size=H, num_layers=1,
                             bidirectional=0, bias=1, dropout=0.0)[0]
        return jnp.sum(out * dy), out
    (_, y_ref), (gx, gw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, W)
    np.testing.assert_allclose(npa(y), y_ref, rtol=1e-5, atol=1e-6)
    zeros = ct(np.zeros((1, B, H)))
    dx, dhx, dcx = sw.GpuRNNBackwardx(y, ct(dy), zeros, zeros, ct(W), ct(hx), ct(cx), h)
    np.testing.assert_allclose(npa(dx), gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(npa(sw.GpuRNNBackwardW(ct(x), ct(hx), y, h)), gw, rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(RuntimeError, match="GpuRNNBackwardx first"):
        sw.GpuRNNBackwardW(ct(x), ct(hx), y, h)
    with pytest.raises(RuntimeError, match="GpuRNNForwardTrainingEx with this handle first"):
        sw.GpuRNNBackwardxEx(y, ct(dy), zeros, zeros, ct(W), ct(hx), ct(cx), None, h)
    # with sequence lengths: sequence 1 ends after 2 steps, sequence 0 is unchanged
    y_ex, _, _ = sw.GpuRNNForwardInferenceEx(ct(x), ct(hx), ct(cx), ct(W), ct(np.array([3, 2])), h)
    assert np.all(npa(y_ex)[2, 1] == 0)
    np.testing.assert_allclose(npa(y_ex)[:, 0], y_ref[:, 0], rtol=1e-5, atol=1e-6)
