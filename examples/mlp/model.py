"""MLP as a ``model.Model`` (SINGA's examples/mlp/model.py), trainable eagerly or in graph mode.

    python examples/mlp/model.py [-m EPOCHS] [-g] [--quick]

``create_model(data_size=..., num_classes=...)`` is also the ``mlp`` choice of cnn/train_cnn.py.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.classifier import Classifier  # noqa: E402
from common.training import pick_device  # noqa: E402
from singa_jax import layer, opt, tensor  # noqa: E402

np_dtype = {"float16": np.float16, "float32": np.float32}
singa_dtype = {"float16": tensor.float16, "float32": tensor.float32}


class MLP(Classifier):
    """linear -> ReLU -> linear, trained with softmax cross-entropy on flat rows."""

    def __init__(self, data_size=10, perceptron_size=100, num_classes=10):
        super().__init__(num_classes=num_classes, input_size=data_size, dimension=2)
        self.relu = layer.ReLU()
        self.linear1 = layer.Linear(perceptron_size)
        self.linear2 = layer.Linear(num_classes)

    def forward(self, inputs):
        return self.linear2(self.relu(self.linear1(inputs)))


def create_model(pretrained=False, **kwargs):
    """Build an MLP (``pretrained`` is accepted for SINGA compatibility; no weights ship)."""
    return MLP(**kwargs)


__all__ = ['MLP', 'create_model']


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train an MLP Model on 2-D toy data.')
    parser.add_argument('-p', choices=['float32', 'float16'], default='float32',
                        dest='precision')
    parser.add_argument('-g', '--disable-graph', default=True, action='store_false',
                        help='disable graph', dest='graph')
    parser.add_argument('-m', '--max-epoch', default=1001, type=int, help='maximum epochs',
                        dest='max_epoch')
    parser.add_argument('--quick', action='store_true', help='a few steps (for tests)')
    return parser.parse_args(argv)


def main(argv=None):
    """Train on the whole toy set each step; returns the list of per-step losses."""
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from data import generate, record_loss  # the sibling data.py

    max_epoch = 60 if args.quick else args.max_epoch
    points, labels = generate()
    dev = pick_device()
    dev.SetRandSeed(0)
    precision = singa_dtype[args.precision]
    sgd = opt.SGD(0.1, 0.9, 1e-5, dtype=precision)
    tx = tensor.Tensor(points.shape, dev, precision)
    ty = tensor.Tensor(labels.shape, dev, tensor.int32)
    net = MLP(data_size=2, perceptron_size=3, num_classes=2)

    net.set_optimizer(sgd)
    net.compile([tx], is_train=True, use_graph=args.graph, sequential=True)
    net.train()
    losses = []
    tx.copy_from_numpy(points.astype(np_dtype[args.precision]))
    ty.copy_from_numpy(labels)
    for epoch in range(max_epoch):
        _, loss = net(tx, ty, 'plain', None)
        record_loss(losses, loss, epoch, max_epoch)
    return losses


if __name__ == "__main__":
    main()
