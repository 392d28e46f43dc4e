"""SINGA's utils: SAME padding arithmetic, odd padding, handle renewal, graph order."""
import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax import autograd, tensor, utils
from singa_jax.autograd import ConvHandle, PoolingHandle


@pytest.mark.parametrize("mode,n,k,s", [("SAME_UPPER", 7, 3, 2), ("SAME_LOWER", 7, 4, 1),
                                         ("SAME_UPPER", 8, 4, 3), ("SAME_LOWER", 5, 2, 2)])
def test_same_padding_gives_ceil_output(mode, n, k, s):
    out = utils.get_output_shape(mode, [n], [k], [s])
    assert out == [-(-n // s)]
    pads, odd = utils.get_padding_shape(mode, [n], [k], [s])
    before, after = pads[0] + odd[0], pads[1] + odd[1]
    assert (n + before + after - k) // s + 1 == out[0]  # the padding yields that output size
    assert pads[0] == pads[1] and sum(odd) in (0, 1)
    if sum(odd):
        assert odd[1 if mode == "SAME_UPPER" else 0] == 1


def test_valid_output_shape():
    assert utils.get_output_shape("VALID", [10, 9], [3, 4], [2, 1]) == [4, 6]


def test_odd_pad_forward_and_backward(rng):
    x = jnp.asarray(rng.standard_normal((1, 2, 3, 4)), jnp.float32)
    y = utils.handle_odd_pad_fwd(x, (1, 0, 0, 2))
    np.testing.assert_array_equal(np.asarray(y), np.pad(np.asarray(x), ((0, 0), (0, 0), (1, 0),
                                                                          (0, 2))))
    p = utils.handle_odd_pad_fwd(x, (0, 1, 1, 0), is_pool=True)  # border copies, not zeros
    xn = np.asarray(x)
    ref = np.concatenate([xn, xn[:, :, -1:]], axis=2)
    ref = np.concatenate([ref[:, :, :, :1], ref], axis=3)
    np.testing.assert_array_equal(np.asarray(p), ref)
    np.testing.assert_array_equal(np.asarray(utils.handle_odd_pad_bwd(y, (1, 0, 0, 2))), xn)


def test_same_pad_shape_check_and_re_new_handle():
    x = tensor.Tensor((2, 3, 7, 7))
    h = ConvHandle(x.array, (3, 3), (2, 2), (1, 1), 3, 4, True, 1)
    assert utils.same_pad_shape_check(h, "SAME_UPPER", x.array) == [1, 1, 1, 1]
    bad = ConvHandle(x.array, (3, 3), (2, 2), (0, 0), 3, 4, True, 1)
    with pytest.raises(ValueError, match="should be"):
        utils.same_pad_shape_check(bad, "SAME_UPPER", x.array)
    h2 = utils.re_new_handle(h, tensor.Tensor((5, 3, 9, 9)).array)
    assert type(h2) is ConvHandle and (h2.batchsize, h2.height, h2.conv_height) == (5, 9, 5)
    ph = PoolingHandle(x.array, (2, 2), (2, 2), (0, 0), False)
    ph2 = utils.re_new_handle(ph, tensor.Tensor((1, 3, 8, 8)).array, is_pool=True)
    assert ph2.pooled_height == 4 and not ph2.is_max_pooling


def test_post_order_lists_ops_before_their_users(training_mode):
    x = tensor.Tensor(data=np.ones((2, 3), np.float32), requires_grad=False, name="x")
    w = tensor.Tensor(data=np.ones((3, 2), np.float32), stores_grad=True, name="w")
    y = autograd.relu(autograd.matmul(x, w))
    nodes, weights, inputs = utils.post_order_recursive(y.creator, None)
    kinds = [type(op).__name__ for op in nodes.values()]
    assert kinds.index("Matmul") < kinds.index("ReLU")
    assert list(weights) == ["w"] and weights["w"] is w
    assert list(inputs) == ["x"]


def test_update_progress_and_force_unicode(capsys):
    utils.update_progress(0.5, "half")
    assert "50.0% half" in capsys.readouterr().out
    assert utils.force_unicode(b"abc") == "abc" and utils.force_unicode("x") == "x"
