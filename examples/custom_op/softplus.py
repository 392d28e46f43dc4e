"""A custom operator written the way SINGA's autograd guide describes: a subclass of
``autograd.Operator`` whose ``forward``/``backward`` take and return C++-level tensors and
compute with ``singa_wrap`` functions.

    y = softplus(x) = log(1 + exp(x)),   dy/dx = sigmoid(x)

Run it (eager training of one weight vector through the op, gradient checked against finite
differences first):

    python examples/custom_op/softplus.py [--steps N]

The same file runs under SINGA's names with ``python -m singa_jax.run`` after changing the
imports to ``from singa import autograd, tensor, singa_wrap as singa``.
"""
import argparse

import numpy as np

from singa_jax import autograd, opt, tensor
from singa_jax import singa_wrap as singa


class SoftPlus(autograd.Operator):
    """softplus(x) = log(1 + exp(x)), computed on CTensors with singa_wrap functions."""

    def forward(self, x):
        if autograd.training:
            self.input = x  # what backward needs, kept as SINGA's operators keep it
        return singa.Log(singa.AddFloat(singa.Exp(x), 1.0))

    def backward(self, dy):
        return singa.__mul__(dy, singa.Sigmoid(self.input))


def softplus(x):
    return SoftPlus()(x)[0]


def finite_difference_check(seed: int = 0) -> float:
    """Largest gap between the operator's gradient of sum(softplus(x) * c) and central
    differences of the same objective (float64 NumPy)."""
    rng = np.random.default_rng(seed)
    x_np = rng.normal(size=(3, 4)).astype(np.float32)
    c_np = rng.normal(size=(3, 4)).astype(np.float32)
    autograd.training = True
    x = tensor.Tensor(data=x_np, requires_grad=True, stores_grad=True)
    c = tensor.Tensor(data=c_np, requires_grad=False)
    loss = autograd.reduce_sum(autograd.mul(softplus(x), c))
    grads = {id(p): g for p, g in autograd.backward(loss)}
    analytic = tensor.to_numpy(grads[id(x)])

    def objective(v):
        return float(np.sum(np.log1p(np.exp(v)) * c_np.astype(np.float64)))
    eps, numeric = 1e-4, np.zeros_like(x_np, dtype=np.float64)
    for i in np.ndindex(x_np.shape):
        up, down = x_np.astype(np.float64), x_np.astype(np.float64)
        up[i] += eps
        down[i] -= eps
        numeric[i] = (objective(up) - objective(down)) / (2 * eps)
    return float(np.max(np.abs(analytic - numeric)))


def train(steps: int, seed: int = 0) -> list:
    """Fit w so that softplus(w) matches a target vector; returns the losses."""
    rng = np.random.default_rng(seed)
    target = tensor.Tensor(data=np.log1p(np.exp(rng.normal(size=(8,)))).astype(np.float32),
                           requires_grad=False)
    w = tensor.Tensor(data=np.zeros(8, np.float32), requires_grad=True, stores_grad=True)
    sgd = opt.SGD(lr=0.5)
    autograd.training = True
    losses = []
    for _ in range(steps):
        loss = autograd.mse_loss(softplus(w), target)
        sgd(loss)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return losses


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description="a custom singa_wrap operator, trained")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"max |analytic - finite difference| = {finite_difference_check():.2e}")
    losses = train(args.steps)
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.6f} after {args.steps} steps")
    return losses


if __name__ == "__main__":
    main()
