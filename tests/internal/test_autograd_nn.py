"""The nn family's kernels white-box: the RNN scan kernel and every backend's convolution forms.
(This tier imports singa_jax._src.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from backend_precision import matmul_tolerance
from singa_jax._src.backend import conv as conv_cpu
from singa_jax._src.ops import nn
pytestmark = pytest.mark.usefixtures("training_mode")
from test_autograd_nn import (  # noqa: F401 (shared helpers and fixtures)
    make_rnn_weights, np_cell, np_rnn, rand, rnn_case, sigmoid)


def test_depthwise_convolution_on_cpu_equals_the_grouped_convolution():
    """The CPU backend computes depthwise convolutions as shifted slices (conv_cpu.conv,
    5-10x faster there than XLA's grouped convolution): same values and gradients."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rand(rng, 2, 4, 9, 8))
    W = jnp.asarray(rand(rng, 8, 1, 3, 3))
    pads, stride, dilation = ((1, 2), (0, 1)), (2, 1), (1, 2)

    def grouped(x, W):
        return jax.lax.conv_general_dilated(x, W, stride, pads, rhs_dilation=dilation,
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                            feature_group_count=4)

    def shifted(x, W):
        return conv_cpu.conv(x, W, stride, pads, dilation, 4)

    np.testing.assert_allclose(shifted(x, W), grouped(x, W), **matmul_tolerance(1e-5, 1e-5))
    for a, b in zip(jax.grad(lambda *a: jnp.sum(jnp.sin(shifted(*a))), (0, 1))(x, W),
                    jax.grad(lambda *a: jnp.sum(jnp.sin(grouped(*a))), (0, 1))(x, W)):
        np.testing.assert_allclose(a, b, **matmul_tolerance(1e-5, 1e-5))


DENSE_CPU_CASES = [  # (x shape, W shape, stride, pads, dilation): each CPU form is taken
    ((3, 5, 7, 6), (4, 5, 1, 1), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # 1x1 strided: per sample
    ((2, 5, 6, 7), (3, 5, 1, 1), (2, 3), ((1, 0), (2, 1)), (1, 1)),  # ... and padded
    ((2, 12, 5, 5), (10, 12, 1, 1), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # 1x1, few pixels: im2col
    ((2, 12, 2, 3), (10, 12, 1, 1), (1, 1), ((1, 0), (0, 1)), (1, 1)),  # ... and padded
    ((2, 1, 9, 8), (3, 1, 3, 2), (1, 2), ((1, 0), (2, 1)), (2, 1)),  # one input channel
    ((2, 6, 8, 8), (5, 6, 5, 5), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # output << input
    ((2, 6, 7, 7), (5, 6, 3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # XLA's in every direction
]


@pytest.mark.parametrize("x_shape,W_shape,stride,pads,dilation", DENSE_CPU_CASES)
def test_dense_convolution_on_cpu_equals_xla_convolution(x_shape, W_shape, stride, pads,
                                                         dilation):
    """The CPU backend computes some convolutions and some of their gradients as matrix products
    of the input's windows (conv_cpu.dense_conv): same values, gradients and forward-mode
    derivatives as XLA's convolution."""
    rng = np.random.default_rng(5)
    x, W = jnp.asarray(rand(rng, *x_shape)), jnp.asarray(rand(rng, *W_shape))

    def dense(x, W):
        return conv_cpu.conv(x, W, stride, pads, dilation, 1)

    def xla(x, W):
        return conv_cpu.xla_conv(x, W, stride, pads, dilation)

    np.testing.assert_allclose(dense(x, W), xla(x, W), **matmul_tolerance(1e-5, 1e-5))
    for a, b in zip(jax.grad(lambda *a: jnp.sum(jnp.sin(dense(*a))), (0, 1))(x, W),
                    jax.grad(lambda *a: jnp.sum(jnp.sin(xla(*a))), (0, 1))(x, W)):
        np.testing.assert_allclose(a, b, **matmul_tolerance(1e-5, 1e-5))
    # only the input's gradient, only the weight's
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(dense(x, W) ** 2))(x),
                               jax.grad(lambda x: jnp.sum(xla(x, W) ** 2))(x), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(jax.grad(lambda W: jnp.sum(dense(x, W) ** 2))(W),
                               jax.grad(lambda W: jnp.sum(xla(x, W) ** 2))(W), rtol=1e-4,
                               atol=1e-4)


def test_dense_convolution_forms_follow_the_shape_rules():
    """Which direction takes the matrix-product form (docs/performance.md has the timings)."""
    assert conv_cpu.forward_as_matmul((64, 1, 28, 28), (20, 1, 5, 5))      # LeNet conv1
    assert conv_cpu.forward_as_matmul((8, 256, 56, 56), (512, 256, 1, 1))  # projection
    assert not conv_cpu.forward_as_matmul((64, 20, 12, 12), (50, 20, 5, 5))
    # LeNet conv2: the input (12x12) has 2.25x the output's (8x8) pixels
    assert conv_cpu.input_grad_as_matmul((64, 20, 12, 12), (50, 20, 5, 5), (8, 8), (1, 1))
    assert conv_cpu.input_grad_as_matmul((64, 3, 32, 32), (64, 3, 3, 3), (32, 32), (1, 1))
    assert not conv_cpu.input_grad_as_matmul((8, 64, 56, 56), (64, 64, 3, 3), (56, 56), (1, 1))
    assert not conv_cpu.input_grad_as_matmul((8, 128, 56, 56), (128, 128, 3, 3), (28, 28),
                                             (2, 2))
    assert conv_cpu.weight_grad_as_matmul((512, 256, 1, 1))
    assert not conv_cpu.weight_grad_as_matmul((50, 20, 5, 5))
    # a 1x1 layer over many pixels: one product per sample (ResNet-50's 56x56 and 28x28 layers)
    assert conv_cpu.as_per_sample_product((64, 256, 1, 1), (56, 56))
    assert conv_cpu.as_per_sample_product((512, 128, 1, 1), (28, 28))
    assert not conv_cpu.as_per_sample_product((256, 1024, 1, 1), (14, 14))
    assert not conv_cpu.as_per_sample_product((2048, 512, 1, 1), (7, 7))
    assert not conv_cpu.as_per_sample_product((64, 64, 3, 3), (56, 56))
    for x_shape, W_shape, stride, pads, dilation in DENSE_CPU_CASES[:4]:  # both 1x1 forms tested
        out_hw = conv_cpu._out_hw(x_shape, W_shape[2:], stride, pads, dilation)
        assert conv_cpu.as_per_sample_product(W_shape, out_hw) == (x_shape[1] == 5)


def test_rnn_final_states_match_numpy():
    rng = np.random.default_rng(20)
    handle, x, hx, cx, flat, params = rnn_case(rng, 3, 1, 1, T=5, B=2)
    lengths = np.array([5, 3], np.int32)
    kernel = jax.jit(lambda *a: nn._rnn_kernel(*a, None, mode=3, hidden_size=3, num_layers=1,
                                               bidirectional=1, bias=1, dropout=0.0))
    got = kernel(x, hx, cx, flat, lengths)
    for g, want in zip(got, np_rnn(3, x, hx, cx, params, lengths, 1, 2)):
        np.testing.assert_allclose(np.asarray(g), want, **matmul_tolerance(1e-4, 1e-5))
