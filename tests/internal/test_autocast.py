"""Autocast internals: the policy table the op families declare, and the downcast warning's
bookkeeping. (This tier imports singa_jax._src.)"""
import warnings
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import autograd, layer, opt, tensor
from singa_jax._src.layers import base as layer_base
from singa_jax._src.autodiff import autocast as mixed_precision
from test_autocast import (  # noqa: F401 (shared helpers and fixtures)
    BF16, F16, _MLP, digits, training_mode)


def test_autocast_names_and_errors():
    assert mixed_precision.compute_dtype("bf16") == BF16
    assert mixed_precision.compute_dtype(tensor.float16) == F16
    assert mixed_precision.compute_dtype(None) is None
    with pytest.raises(ValueError, match="autograd.autocast: autocast='int8'.*'bfloat16'"):
        autograd.autocast("int8")
    m = _MLP()
    x = tensor.from_numpy(np.ones((2, 64), np.float32))
    with pytest.raises(ValueError, match="_MLP.compile: autocast='float64'"):
        m.compile([x], autocast="float64")
    assert "Matmul" in mixed_precision.POLICY[mixed_precision.COMPUTE]
    assert "SoftMaxCrossEntropy" in mixed_precision.POLICY[mixed_precision.FLOAT32]


def test_half_batch_into_a_float32_model_keeps_singas_cast_and_warns_once():
    fc = layer.Linear(3)
    fc(tensor.from_numpy(np.ones((2, 4), np.float32)))
    half = tensor.from_numpy(np.ones((2, 4), np.float32)).as_type(tensor.float16)
    layer_base._WARNED_DOWNCASTS.clear()
    with pytest.warns(UserWarning, match=r"float16 input casts its float32 parameters.*"
                                         r"autocast='float16'"):
        fc(half)
    assert fc.W.dtype == F16  # SINGA's rule holds
    fc2 = layer.Linear(3)
    fc2(tensor.from_numpy(np.ones((2, 4), np.float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fc2(half)  # once per pair of dtypes
        fresh = layer.Linear(3)
        fresh(half)  # a fresh model fed float16 is a float16 model: nothing to warn about
    assert fresh.W.dtype == F16


def test_graph_mode_compiles_a_program_per_autocast_dtype(digits):
    x, y = digits
    m = _MLP()
    m.set_optimizer(opt.SGD(lr=0.05))
    tx, ty = tensor.from_numpy(x[:16].reshape(16, -1)), tensor.from_numpy(y[:16])
    m.compile([tx], is_train=True, use_graph=True)
    out, _ = m(tx, ty)
    assert out.dtype == jnp.float32
    m._autocast = BF16  # as compile(autocast='bfloat16') sets it: the cached program is stale
    out, _ = m(tx, ty)
    assert out.dtype == BF16
    m._autocast = None
    out, _ = m(tx, ty)
    assert out.dtype == jnp.float32
