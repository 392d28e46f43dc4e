"""MNIST in the standard IDX files (``train-images-idx3-ubyte[.gz]`` etc.), or offline digits."""
import gzip
import os
from typing import Optional

import numpy as np

from ._fallback import load_digits_images, require

FILES = {
    'train_x': 'train-images-idx3-ubyte',
    'train_y': 'train-labels-idx1-ubyte',
    'val_x': 't10k-images-idx3-ubyte',
    'val_y': 't10k-labels-idx1-ubyte',
}
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049


def _read_idx(path: str, magic: int) -> np.ndarray:
    """An IDX file (big-endian header of int32: magic, then one size per dimension)."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], 'big')
    if found != magic:
        raise ValueError(f"mnist: {path} has magic number {found}, expected {magic}")
    ndim = 3 if magic == IMAGE_MAGIC else 1
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find(data_dir: str, stem: str) -> str:
    for name in (stem + '.gz', stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    return require(os.path.join(data_dir, stem + '.gz'), 'MNIST')


def load_dataset(data_dir: str):
    paths = {key: _find(data_dir, stem) for key, stem in FILES.items()}
    train_x = _read_idx(paths['train_x'], IMAGE_MAGIC)[:, None].astype(np.float32)
    val_x = _read_idx(paths['val_x'], IMAGE_MAGIC)[:, None].astype(np.float32)
    train_y = _read_idx(paths['train_y'], LABEL_MAGIC).astype(np.int32)
    val_y = _read_idx(paths['val_y'], LABEL_MAGIC).astype(np.int32)
    return train_x, train_y, val_x, val_y


def load(data_dir: Optional[str] = None):
    """(train_x, train_y, val_x, val_y): float32 (N, 1, 28, 28) in [0, 1], int32 labels.

    Without ``data_dir``: scikit-learn's 8x8 digits upsampled to 28x28 (no download).
    """
    if data_dir is None:
        return load_digits_images(size=28, channels=1)
    train_x, train_y, val_x, val_y = load_dataset(data_dir)
    return train_x / 255, train_y, val_x / 255, val_y
