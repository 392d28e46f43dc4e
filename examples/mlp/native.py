"""MLP written with autograd operations only (SINGA's examples/mlp/native.py).

No layers, no Model: the parameters are Tensors with ``stores_grad=True``, the forward pass is a
chain of ``autograd`` functions and ``opt.SGD`` back-propagates the loss and updates them.

    python examples/mlp/native.py [-m EPOCHS] [--quick]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.training import pick_device  # noqa: E402
from singa_jax import autograd, opt, tensor  # noqa: E402
from singa_jax.tensor import Tensor  # noqa: E402

singa_dtype = {"float16": tensor.float16, "float32": tensor.float32}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train an MLP built from autograd operations.')
    parser.add_argument('-p', choices=['float32', 'float16'], default='float32',
                        dest='precision')
    parser.add_argument('-m', '--max-epoch', default=1001, type=int, help='maximum epochs',
                        dest='max_epoch')
    parser.add_argument('--quick', action='store_true', help='a few steps (for tests)')
    return parser.parse_args(argv)


def parameter(value: np.ndarray, dev, dtype) -> Tensor:
    """A trainable Tensor: autograd tracks it (requires_grad) and yields its gradient
    (stores_grad)."""
    return Tensor(data=value.astype(np.dtype(dtype)), device=dev, dtype=dtype,
                  requires_grad=True, stores_grad=True)


def main(argv=None):
    """Returns the list of per-step losses."""
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from data import generate, record_loss  # the sibling data.py

    max_epoch = 60 if args.quick else args.max_epoch
    autograd.training = True
    points, labels = generate()
    one_hot = np.eye(2, dtype=np.float32)[labels]  # softmax_cross_entropy takes either form
    print("train_data_shape:", points.shape)
    print("train_label_shape:", one_hot.shape)

    precision = singa_dtype[args.precision]
    dev = pick_device()
    inputs = Tensor(data=points, device=dev).as_type(precision)
    target = Tensor(data=one_hot, device=dev)

    rng = np.random.RandomState(0)
    w0 = parameter(rng.normal(0, 0.1, (2, 3)), dev, precision)
    b0 = parameter(np.zeros(3), dev, precision)
    w1 = parameter(rng.normal(0, 0.1, (3, 2)), dev, precision)
    b1 = parameter(np.zeros(2), dev, precision)

    sgd = opt.SGD(0.05, 0.8)
    losses = []
    for i in range(max_epoch):
        x = autograd.matmul(inputs, w0)
        x = autograd.add_bias(x, b0)
        x = autograd.relu(x)
        x = autograd.matmul(x, w1)
        x = autograd.add_bias(x, b1)
        loss = autograd.softmax_cross_entropy(x, target)
        sgd(loss)
        record_loss(losses, loss, i, max_epoch)
    return losses


if __name__ == "__main__":
    main()
