"""Tensor internals: its module layout and the samplers. (This tier imports
singa_jax._src.)"""
import jax
import numpy as np
import pytest
from singa_jax import tensor



def test_sampling_draw_shapes_dtypes_and_chunks():
    from singa_jax._src.runtime import sampling
    key = jax.random.PRNGKey(0)
    size = sampling._DRAW_CHUNK + 10  # two chunks: the second from fold_in(key, 1)
    values = np.asarray(sampling.draw("uniform", key, (2.0, 3.0), (size,), np.float16))
    assert values.shape == (size,) and values.dtype == np.float16
    assert 2.0 <= values.min() and values.max() <= 3.0
    assert abs(float(values.mean()) - 2.5) < 0.01
    # within one chunk, a smaller draw is a prefix of a larger one (one compiled program)
    head = np.asarray(sampling.draw("uniform", key, (2.0, 3.0), (5,), np.float16))
    more = np.asarray(sampling.draw("uniform", key, (2.0, 3.0), (4, 25), np.float16))
    np.testing.assert_array_equal(head, more.reshape(-1)[:5])
    with pytest.raises(ValueError, match="unknown sample kind 'poisson'"):
        sampling.draw("poisson", key, (1.0,), (3,), np.float32)


# --- module layout: dtypes, sampling and creator live apart, tensor re-exports ----------------
def test_tensor_reexports_the_dtype_module():
    from singa_jax._src.base import dtypes
    for name in dtypes.__all__:
        assert getattr(tensor, name) is getattr(dtypes, name), name
    assert tensor.singa_dtype_code(tensor.int64) == 5 and tensor.singa_dtype_code("float") == 0


def test_leaf_creator_is_the_creator_modules_dummy():
    from singa_jax import autograd
    from singa_jax._src.base import node as creator
    assert autograd.Dummy is creator.Dummy and autograd.Dummy is creator.Dummy
    t = tensor.Tensor((2, 3), name="w")
    leaf = t.creator
    assert type(leaf) is creator.Dummy and isinstance(leaf, creator.Node)
    assert (leaf.name, leaf.src, leaf.y_id2idx, leaf.requires_grad) == ("w", [], {id(t): 0}, False)
    assert (leaf.output_name(0), leaf.grad_name(0), leaf.get_params()) == ("w", "w_g", [])
    assert leaf.tensor is t and leaf.shape == (2, 3)  # attributes forwarded to the tensor
