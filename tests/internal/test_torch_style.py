"""PyTorch-style autograd internals: the pullback an operator keeps. (This tier imports
singa_jax._src.)"""
import numpy as np
from backend_precision import matmul_tolerance
from singa_jax import autograd, layer, tensor
from singa_jax.tensor import Tensor
from test_torch_style import (  # noqa: F401 (shared helpers and fixtures)
    arr, evaluation_mode)


# --- the recording rule: torch-style works in evaluation mode, SINGA's eval pays nothing ------
def test_evaluation_mode_keeps_no_backward_state_for_singa_layers(rng):
    fc = layer.Linear(3)
    x = Tensor(data=rng.normal(size=(2, 4)).astype(np.float32), requires_grad=False)
    y = fc(x)
    assert not y.tracked and y.creator._vjp is None  # SINGA in eval: no residuals kept
    xt = tensor.tensor(np.asarray(x.array), requires_grad=True)
    yt = fc(xt)  # a tracked input: the layer's ops keep what backward needs
    assert yt.tracked and yt.creator._vjp is not None
    autograd.reduce_sum(yt * yt).backward()
    w, b = np.asarray(fc.W.array), np.asarray(fc.b.array)
    out = np.asarray(x.array) @ w + b
    # products (TF32 on a GPU by default) against NumPy's float32 ones
    np.testing.assert_allclose(arr(xt.grad), 2 * out @ w.T, **matmul_tolerance(1e-5, 1e-6))
    np.testing.assert_allclose(arr(fc.W.grad), np.asarray(x.array).T @ (2 * out),
                               **matmul_tolerance(1e-5))
