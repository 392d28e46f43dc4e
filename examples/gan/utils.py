"""Data loading and image output for the GAN examples."""
import gzip
import os
import pickle
import sys
import time
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.digits import load_digits_flat  # noqa: E402


def print_log(s):
    print('[{}]{}'.format(time.ctime(), s), flush=True)


def load_data(filepath: Optional[str] = None) -> np.ndarray:
    """Training images as (N, 784) float32 rows in [0, 1].

    ``filepath``: the classic ``mnist.pkl.gz`` (pickled (train, valid, test) pairs, as SINGA's
    example reads). None: scikit-learn's bundled digits upsampled to 28x28 (no download).
    """
    if filepath is None:
        return load_digits_flat(size=28)
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"gan: {filepath} does not exist; pass mnist.pkl.gz or nothing "
                                f"to train on scikit-learn's bundled digits")
    with gzip.open(filepath, 'rb') as f:
        train_set, _, _ = pickle.load(f, encoding='bytes')
    return np.asarray(train_set[0], dtype=np.float32)


def save_grid(images: np.ndarray, rows: int, cols: int, path: str) -> None:
    """Write (rows*cols, H*W) images in [0, 1] as one binary PGM picture (no plotting library)."""
    side = int(round(np.sqrt(images.shape[1])))
    tiles = images[:rows * cols].reshape(rows, cols, side, side)
    grid = tiles.transpose(0, 2, 1, 3).reshape(rows * side, cols * side)
    pixels = (np.clip(grid, 0, 1) * 255).astype(np.uint8)
    with open(path, 'wb') as f:
        f.write(b'P5\n%d %d\n255\n' % (pixels.shape[1], pixels.shape[0]))
        f.write(pixels.tobytes())
