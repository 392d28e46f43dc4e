"""Two-class toy data of SINGA's MLP example: is a noisy point below the line y = 5x + 1?"""
import numpy as np


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
