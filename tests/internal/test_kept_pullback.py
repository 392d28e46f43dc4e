"""A pullback kept until a backward holds only the kernel inputs and outputs it forwards
(:func:`residuals.forwarded`): an input only the forward read, or an output only its Tensor
holds, is freed with its last other holder -- and an eager replay segment's program need not
return it. The pullback joined from what is kept gives the gradients ``jax.vjp`` gives."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax._src.autodiff import residuals
from singa_jax._src.autodiff.kernels import Unjoined

X = jnp.asarray(np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3))
Y = jnp.asarray(np.linspace(0.5, 2.0, 6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("name, f, keeps_inputs, keeps_output", [
    ("add", lambda x, y: x + y, (False, False), False),    # a pullback of no residual
    ("mul", lambda x, y: x * y, (True, True), False),      # both factors
    ("exp", lambda x, y: jnp.exp(x), (False, False), True),  # its own output
])
def test_a_kept_pullback_holds_only_what_it_forwards(name, f, keeps_inputs, keeps_output):
    xs = (X, Y)

    @jax.jit
    def kernel(x, y):  # as an eager forward kernel returns its pullback
        ys, pullback, _ = residuals.vjp(lambda *a: (f(*a), ()), (True, True), (x, y))
        return ys, pullback

    ys, pullback = kernel(*xs)
    inputs, output = residuals.forwarded(pullback, xs, ys)
    assert tuple(x is not None for x in inputs) == keeps_inputs, name
    assert (output is not None) == keeps_output, name
    for kept, x in zip(inputs, xs):
        assert kept is None or kept is x  # the caller's own arrays, not copies
    # the pullback joined from what is kept: the gradients of jax.vjp on the plain function
    dy = jnp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    got = Unjoined(pullback, inputs, output).joined()(dy)
    want = jax.vjp(f, *xs)[1](dy)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
    # the same from the leaves a fused walk takes (Unjoined.flat)
    leaves, treedef = Unjoined(pullback, inputs, output).flat()
    for g, w in zip(treedef.unflatten(leaves)(dy), want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


def test_a_pullback_not_split_keeps_no_input_or_output():
    pullback = {"r": X}  # (a pytree of its own residuals: nothing forwarded)
    assert residuals.forwarded(pullback, (X, Y), (X,)) == ((), None)
