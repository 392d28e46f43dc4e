"""CIFAR-10 (``cifar-10-batches-py``: data_batch_1..5, test_batch), or offline digits."""
from typing import Optional

from .cifar import load_cifar


def load(data_dir: Optional[str] = None):
    """(train_x, train_y, val_x, val_y); see ``cifar.load_cifar``."""
    return load_cifar(data_dir, 'cifar-10-batches-py',
                      [f'data_batch_{i}' for i in range(1, 6)], ['test_batch'],
                      'labels', 'CIFAR-10')
