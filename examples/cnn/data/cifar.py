"""CIFAR-10/100 in the python pickle batches, or offline digits shaped like CIFAR."""
import os
import pickle
from typing import Optional, Sequence

import numpy as np

from ._fallback import load_digits_images, require

MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.2023, 0.1994, 0.2010], dtype=np.float32).reshape(1, 3, 1, 1)


def read_batches(folder: str, names: Sequence[str], label_key: str, dataset: str):
    images, labels = [], []
    for name in names:
        with open(require(os.path.join(folder, name), dataset), 'rb') as f:
            batch = pickle.load(f, encoding='latin1')
        images.append(np.asarray(batch['data'], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[label_key], dtype=np.int32))
    return np.concatenate(images).astype(np.float32), np.concatenate(labels)


def normalize(train_x, val_x):
    """Scale to [0, 1], then standardise each channel with CIFAR-10's statistics."""
    return (train_x / 255 - MEAN) / STD, (val_x / 255 - MEAN) / STD


def load_cifar(data_dir: Optional[str], subfolder: str, train_names, test_names, label_key,
               dataset: str):
    """(train_x, train_y, val_x, val_y): float32 (N, 3, 32, 32), int32 labels.

    ``data_dir`` is the extracted folder (or its parent). Without it: scikit-learn's digits
    upsampled to 32x32 and repeated over 3 channels (10 classes, no download).
    """
    if data_dir is None:
        return load_digits_images(size=32, channels=3)
    if os.path.isdir(os.path.join(data_dir, subfolder)):
        data_dir = os.path.join(data_dir, subfolder)
    train_x, train_y = read_batches(data_dir, train_names, label_key, dataset)
    val_x, val_y = read_batches(data_dir, test_names, label_key, dataset)
    train_x, val_x = normalize(train_x, val_x)
    return train_x, train_y, val_x, val_y
