"""Two-class toy data of SINGA's MLP example: is a noisy point below the line y = 5x + 1?"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.training import scalar  # noqa: E402


def boundary(x):
    return 5 * x + 1


def generate(num_points: int = 400, seed: int = 0):
    """(points float32 (N, 2), labels int32 (N,)): label 1 when the point lies below the line."""
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, num_points)
    y = boundary(x) + 2 * rng.randn(num_points)
    points = np.stack([x, y], axis=1).astype(np.float32)
    labels = (boundary(x) > y).astype(np.int32)
    return points, labels


def record_loss(losses, loss, step, num_steps, every=100):
    """Append the loss Tensor's value to ``losses``; print it every ``every`` steps and last."""
    losses.append(scalar(loss))
    if step % every == 0 or step == num_steps - 1:
        print(f"step {step}: training loss = {losses[-1]:.6f}")
