"""singa_jax.initializer: distributions (moments of large samples), fans, in-place fills,
reproducibility from the device key, the host sampler of a layer's initialisation, and
errors."""
import math

import numpy as np
import pytest

from singa_jax import device, initializer
from singa_jax.tensor import Tensor


def filled(fn, shape, *args):
    t = Tensor(shape=shape)
    before = t.array
    fn(t, *args)
    assert t.array is not before and t.shape == tuple(shape) and t.dtype == np.float32
    return np.asarray(t.array)


# (initializer, weight shape, expected std for normal or limit for uniform, distribution)
FAN_CASES = [
    ("lecun_uniform", (200, 300), math.sqrt(3.0 / 200), "uniform"),
    ("lecun_normal", (200, 300), math.sqrt(1.0 / 200), "normal"),
    ("glorot_uniform", (200, 300), math.sqrt(6.0 / 500), "uniform"),
    ("glorot_normal", (200, 300), math.sqrt(2.0 / 500), "normal"),
    ("he_uniform", (200, 300), math.sqrt(6.0 / 200), "uniform"),
    ("he_normal", (200, 300), math.sqrt(2.0 / 200), "normal"),
    # conv kernel (out, in, kh, kw): fan_in = in*kh*kw = 8*9, fan_out = out*kh*kw = 64*9
    ("he_normal", (64, 8, 3, 3), math.sqrt(2.0 / 72), "normal"),
    ("glorot_uniform", (64, 8, 3, 3), math.sqrt(6.0 / (72 + 576)), "uniform"),
]


def test_eye_and_orthogonal():
    np.testing.assert_array_equal(filled(initializer.eye, (3, 5)), np.eye(3, 5))
    for shape in [(6, 4), (4, 6)]:
        q = filled(initializer.orthogonal, shape, 2.0) / 2.0
        gram = q.T @ q if shape[0] > shape[1] else q @ q.T
        np.testing.assert_allclose(gram, np.eye(min(shape)), atol=1e-5)
    with pytest.raises(ValueError, match="2-D"):
        initializer.eye(Tensor(shape=(2, 2, 2)))
    with pytest.raises(ValueError, match="2-D"):
        initializer.orthogonal(Tensor(shape=(4,)))


def test_deprecated_initializers():
    with pytest.warns(DeprecationWarning):
        a = filled(initializer.gaussian, (200, 300), 200, 300)
    assert a.std() == pytest.approx(math.sqrt(4.0 / 500), rel=0.05)
    with pytest.warns(DeprecationWarning):
        a = filled(initializer.gaussian, (200, 300), 300)  # one fan given: avg = 1
    assert a.std() == pytest.approx(math.sqrt(2.0 / 300), rel=0.05)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="fan_in"):
        initializer.gaussian(Tensor(shape=(2, 2)))
    with pytest.warns(DeprecationWarning):
        a = filled(initializer.xavier, (200, 300))
    lim = math.sqrt(6.0 / 500)
    assert a.max() <= lim and a.std() == pytest.approx(lim / math.sqrt(3), rel=0.05)
    with pytest.warns(DeprecationWarning):
        a = filled(initializer.glorot, (200, 300))
    assert a.std() == pytest.approx(math.sqrt(2.0 / 500), rel=0.05)
    with pytest.warns(DeprecationWarning):
        a = filled(initializer.msra, (200, 300))
    assert a.std() == pytest.approx(math.sqrt(2.0 / 200), rel=0.05)


def test_draws_from_device_key():
    dev = device.get_default_device()
    dev.SetRandSeed(7)
    a = filled(initializer.he_uniform, (200, 300))
    b = filled(initializer.he_uniform, (200, 300))
    dev.SetRandSeed(7)
    a2 = filled(initializer.he_uniform, (200, 300))
    np.testing.assert_array_equal(a, a2)
    assert not np.array_equal(a, b)


def test_bad_inputs():
    with pytest.raises(TypeError, match="expected a Tensor"):
        initializer.he_normal(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="dtype int32"):
        initializer.glorot_uniform(Tensor(shape=(2, 2), dtype=np.int32))


@pytest.mark.parametrize("name", sorted({case[0] for case in FAN_CASES}))
def test_fan_initializer_names_itself(name):
    fn = getattr(initializer, name)
    assert fn.__name__ == name and "Fill ``t`` in place with" in fn.__doc__
    with pytest.raises(TypeError, match=rf"initializer\.{name}: expected a Tensor"):
        fn([[0.0]])


