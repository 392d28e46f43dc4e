"""The eager call path's caches and one-time checks: each is keyed by what it derives
from, so a changed signature derives again, and results equal the general path's (NumPy /
jax.lax references; float32 tolerances, widened where float32 products are reduced-precision --
TF32 on a GPU -- by backend_precision.matmul_tolerance).

* a window op's static arguments and kernel key, made once per handle (and odd padding);
* interned static keys, kernel statics, gradient masks and output specs;
* a layer's usual call tested in one pass (shape, device and dtype as the last call);
* eager replay: sequences keyed by a tree walked while recording, and only the outputs
  something still references returned by a segment's program;
* fused backward walks: long walks of small operators fused too, and pullbacks kept as leaves;
* ``Layer.__setattr__`` restating a plain attribute leaves the structure version alone.
"""
from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, layer, model
from singa_jax.tensor import Tensor


def _conv_reference(x, w, b, stride, pad):
    y = jax.lax.conv_general_dilated(x, w, stride, [(pad, pad), (pad, pad)],
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                     precision=jax.lax.Precision.HIGHEST)
    return np.asarray(y + b[None, :, None, None])


def test_a_layer_checks_a_call_unlike_its_last(rng):
    """Conv2d and BatchNorm2d test their usual call in one pass; any change of shape, channels
    or dtype goes through the full checks (and rebuilds the handle) as before."""
    conv, bn = layer.Conv2d(4, 3, padding=1), layer.BatchNorm2d(4)
    xa = rng.normal(size=(2, 3, 5, 5)).astype(np.float32)
    for _ in range(2):
        y = bn(conv(Tensor(data=xa)))
    assert y.shape == (2, 4, 5, 5)
    with pytest.raises(ValueError, match="Conv2d.*channels"):
        conv(Tensor(data=rng.normal(size=(2, 5, 5, 5)).astype(np.float32)))
    with pytest.raises(ValueError, match="BatchNorm2d.*channels"):
        bn(Tensor(data=rng.normal(size=(2, 3, 5, 5)).astype(np.float32)))
    with pytest.raises(ValueError, match="Conv2d.*empty input"):
        conv(Tensor(data=np.zeros((0, 3, 5, 5), np.float32)))
    x3 = rng.normal(size=(3, 3, 7, 7)).astype(np.float32)  # another shape: a new handle
    got = np.asarray(conv(Tensor(data=x3)).array)
    want = _conv_reference(x3, np.asarray(conv.W.array), np.asarray(conv.b.array), (1, 1), 1)
    np.testing.assert_allclose(got, want, **matmul_tolerance(1e-4, 1e-4))
    with pytest.raises(TypeError, match="Conv2d.*int32"):  # a dtype unlike the parameters'
        conv(Tensor(data=x3.astype(np.int32), requires_grad=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the in-place downcast warns once per process)
        y16 = conv(Tensor(data=x3.astype(np.float16)))
    assert y16.dtype == np.float16 and conv.W.dtype == np.float16  # SINGA's dtype_check


def test_restating_a_plain_attribute_leaves_the_structure_version():
    net = model.Model()
    net.fc = layer.Linear(2)
    net.eval()
    version = net.structure_version
    net.eval()  # the flag restated: nothing changed
    assert net.structure_version == version
    net.train()
    assert net.structure_version > version
    version = net.structure_version
    t = Tensor((2,))
    net.extra = t
    assert net.structure_version > version
    version = net.structure_version
    net.extra = t  # a Tensor assignment counts, as before
    assert net.structure_version > version


def test_operators_and_tensors_are_still_counted_and_named():
    ops_before, tensors_before = autograd.Operator.op_count, Tensor.tensor_count
    a, b = autograd.ReLU(), autograd.ReLU()
    t = Tensor((1,))
    assert autograd.Operator.op_count == ops_before + 2
    assert (a.name, b.name) == (f"ReLU#{ops_before}", f"ReLU#{ops_before + 1}")
    assert Tensor.tensor_count == tensors_before + 1 and t.name == f"Dummy#{tensors_before}"


