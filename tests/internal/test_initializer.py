"""Initializer internals: host-side key splits and draws equal to jax.random's. (This tier imports
singa_jax._src.)"""
import contextlib
import math
import jax
import ml_dtypes
import numpy as np
import pytest
from singa_jax import device, initializer, layer
from singa_jax._src.base import host_prng, modes
from singa_jax._src.runtime import sampling
from singa_jax.tensor import Tensor
from test_initializer import (  # noqa: F401 (shared helpers and fixtures)
    FAN_CASES, filled)


SAMPLERS = {"device": contextlib.nullcontext, "host": modes.parameter_initialization}


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("name,shape,scale,dist", FAN_CASES)
def test_fan_initializers(name, shape, scale, dist, sampler):
    with SAMPLERS[sampler]():
        a = filled(getattr(initializer, name), shape)
    assert abs(a.mean()) < 0.05 * scale
    if dist == "normal":
        assert a.std() == pytest.approx(scale, rel=0.05)
    else:
        assert a.min() >= -scale and a.max() <= scale
        assert a.std() == pytest.approx(scale / math.sqrt(3.0), rel=0.05)  # std of U(-l, l)


# --- a layer's initialisation: the host sampler ----------------------------------------------
@pytest.fixture
def no_device_draws(monkeypatch):
    """Fail any draw by the device sampler (jax.random's compiled program)."""
    def refuse(*args, **kwargs):
        raise AssertionError("drawn by the device sampler")
    monkeypatch.setattr(sampling, "_draw_flat", refuse)


def test_parameter_initialization_draws_on_the_host(no_device_draws):
    with modes.parameter_initialization():
        g = np.asarray(Tensor((400, 500)).gaussian(1.0, 2.0).array)
        u = np.asarray(Tensor((400, 500)).uniform(-1.0, 3.0).array)
        b = np.asarray(Tensor((400, 500)).bernoulli(0.3).array)
        h = Tensor((300, 300), dtype=ml_dtypes.bfloat16).uniform(0.0, 1.0)
    assert g.dtype == np.float32 and g.mean() == pytest.approx(1.0, abs=0.02)
    assert g.std() == pytest.approx(2.0, rel=0.01)
    assert u.min() >= -1.0 and u.max() < 3.0 and u.mean() == pytest.approx(1.0, abs=0.02)
    assert u.std() == pytest.approx(4.0 / math.sqrt(12.0), rel=0.01)
    assert set(np.unique(b)) == {0.0, 1.0} and b.mean() == pytest.approx(0.3, abs=0.01)
    hv = np.asarray(h.array).astype(np.float32)
    assert h.dtype == ml_dtypes.bfloat16 and hv.min() >= 0.0 and hv.max() <= 1.0
    with pytest.raises(AssertionError, match="device sampler"):  # outside: the device's
        Tensor((4,)).gaussian(0.0, 1.0)


def test_host_draws_are_pcg64_of_the_fill_key_and_reproducible(no_device_draws):
    """The samples are NumPy's PCG64 seeded with the fill's key (the device key's split, made
    on the host too): a function of the seed alone, whatever the backend."""
    dev = device.get_default_device()
    dev.SetRandSeed(5)
    _, fill_key = host_prng.split(dev.key)
    with modes.parameter_initialization():
        a = np.asarray(Tensor((3, 1000)).gaussian(0.5, 3.0).array)
        assert host_prng.supported(dev.key)
        dev.SetRandSeed(5)
        a2 = np.asarray(Tensor((3, 1000)).gaussian(0.5, 3.0).array)
    rng = np.random.Generator(np.random.PCG64(np.asarray(fill_key, np.uint32)))
    want = np.float32(0.5) + np.float32(3.0) * rng.standard_normal(3000, dtype=np.float32)
    np.testing.assert_array_equal(a, want.reshape(3, 1000))
    np.testing.assert_array_equal(a, a2)


def test_a_layer_initialises_without_the_device_sampler(no_device_draws):
    """A layer's parameters come from the host sampler, eagerly too, at the std its
    initializer asks for (Linear: SINGA's glorot-style std sqrt(2 / (in + out)))."""
    dev = device.get_default_device()
    dev.SetRandSeed(3)
    fc = layer.Linear(400)
    x = Tensor((8, 600))
    x.set_value(0.0)
    fc(x)
    w = np.asarray(fc.W.array)
    assert w.shape == (600, 400)
    assert w.std() == pytest.approx(math.sqrt(2.0 / 1000), rel=0.02)
    assert isinstance(fc.W.array, jax.Array)
    dev.SetRandSeed(3)
    again = layer.Linear(400)
    again(x)
    np.testing.assert_array_equal(np.asarray(again.W.array), w)
