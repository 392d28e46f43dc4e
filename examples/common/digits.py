"""Offline default data: scikit-learn's bundled 8x8 handwritten digits, reshaped for the examples.

``sklearn.datasets.load_digits`` ships inside the scikit-learn wheel (1797 images of the digits
0-9, 8x8 pixels, values 0..16), so the examples train on real data without any download.
Images are upsampled with bilinear interpolation to the size a model expects (28x28 like MNIST,
32x32x3 like CIFAR-10).  This is host-side input preparation, hence NumPy.
"""
from typing import Tuple

import numpy as np

Split = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def bilinear_matrix(in_size: int, out_size: int) -> np.ndarray:
    """(out_size, in_size) matrix R with ``R @ v`` = bilinear resampling of v (pixel centres)."""
    # the centre of output pixel i sits at input coordinate (i + 0.5) * in/out - 0.5
    coords = (np.arange(out_size) + 0.5) * in_size / out_size - 0.5
    coords = np.clip(coords, 0, in_size - 1)
    lower = np.floor(coords).astype(int)
    upper = np.minimum(lower + 1, in_size - 1)
    frac = coords - lower
    matrix = np.zeros((out_size, in_size), dtype=np.float32)
    matrix[np.arange(out_size), lower] += 1 - frac
    matrix[np.arange(out_size), upper] += frac
    return matrix


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of a batch of NCHW images to (N, C, size, size)."""
    height, width = x.shape[-2:]
    if (height, width) == (size, size):
        return x.astype(np.float32, copy=False)
    rows, cols = bilinear_matrix(height, size), bilinear_matrix(width, size)
    # separable: resample the rows, then the columns
    return np.einsum('ph,nchw,qw->ncpq', rows, x.astype(np.float32), cols, optimize=True)


def load_digits_images(size: int = 28, channels: int = 1, test_ratio: float = 0.2,
                       seed: int = 0) -> Split:
    """Digits as (train_x, train_y, val_x, val_y): float32 NCHW in [0, 1] and int32 labels.

    The split is a fixed shuffle (``seed``) so every run and every model sees the same test set.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8)
    images = resize_images(images, size)
    if channels > 1:
        images = np.repeat(images, channels, axis=1)
    labels = digits.target.astype(np.int32)
    order = np.random.RandomState(seed).permutation(len(labels))
    num_test = int(round(len(labels) * test_ratio))
    test_idx, train_idx = order[:num_test], order[num_test:]
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def load_digits_flat(size: int = 28, seed: int = 0) -> np.ndarray:
    """All digit images as (N, size*size) float32 rows in [0, 1] (the GAN examples' real data)."""
    train_x, _, val_x, _ = load_digits_images(size=size, test_ratio=0.0, seed=seed)
    del val_x
    return train_x.reshape(train_x.shape[0], -1)
