"""CIFAR-100 (``cifar-100-python``: train, test; fine labels), or offline digits."""
from typing import Optional

from .cifar import load_cifar


def load(data_dir: Optional[str] = None):
    """(train_x, train_y, val_x, val_y); see ``cifar.load_cifar``."""
    return load_cifar(data_dir, 'cifar-100-python', ['train'], ['test'], 'fine_labels',
                      'CIFAR-100')
