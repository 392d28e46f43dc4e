"""Training-loop helpers shared by the examples: device choice, progress bar, checkpoints."""
import os
import time
from typing import Dict, Iterator, Optional

import numpy as np
from tqdm import tqdm

from singa_jax import device, tensor

EPOCH_KEY = 'epoch'
OPT_PREFIX = 'optimizer/'


def pick_device(device_id: int = 0) -> 'device.Device':
    """Device ``device_id`` of the default XLA backend (GPU/TPU when present, else the host).

    SINGA's examples call ``device.create_cuda_gpu_on(id)``; that still works on a GPU machine,
    but the examples should also run on a laptop, so they ask for the default backend instead.
    """
    return device.create_device(None, device_id)


def accuracy(pred: np.ndarray, target: np.ndarray) -> int:
    """Number of rows whose arg-max equals the integer target."""
    return int((np.argmax(pred, axis=1) == target.reshape(-1)).sum())


class Progress:
    """A tqdm bar over the batches of one epoch showing running loss, accuracy and throughput."""

    def __init__(self, num_batches: int, batch_size: int, desc: str, quiet: bool = False):
        self.bar = tqdm(range(num_batches), desc=desc, unit='batch', leave=False,
                        disable=quiet, dynamic_ncols=True)
        self.batch_size = batch_size
        self.loss_sum = 0.0
        self.correct = 0
        self.seen = 0
        self.start = time.time()

    def __iter__(self) -> Iterator[int]:
        return iter(self.bar)

    def update(self, loss: float, correct: Optional[int] = None) -> None:
        self.seen += self.batch_size
        self.loss_sum += loss
        postfix = {'loss': f'{loss:.4f}'}
        if correct is not None:
            self.correct += correct
            postfix['acc'] = f'{self.correct / self.seen:.4f}'
        postfix['img/s'] = f'{self.throughput:.0f}'
        self.bar.set_postfix(postfix, refresh=False)

    @property
    def throughput(self) -> float:
        return self.seen / max(time.time() - self.start, 1e-9)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.seen // self.batch_size, 1)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.seen, 1)

    def close(self) -> None:
        self.bar.close()


def _flatten(states: Dict, prefix: str) -> Dict[str, 'tensor.Tensor']:
    """Optimizer states (nested dicts of Tensors and numbers) as a flat {key: Tensor} dict."""
    flat = {}
    for key, value in states.items():
        name = f'{prefix}{key}'
        if isinstance(value, dict):
            flat.update(_flatten(value, name + '/'))
        elif isinstance(value, tensor.Tensor):
            flat[name] = value
        else:  # a Python or NumPy number, e.g. SINGA's step counter
            flat[name] = tensor.from_numpy(np.asarray(value, dtype=np.float32))
    return flat


def _unflatten(flat: Dict[str, 'tensor.Tensor'], prefix: str) -> Dict:
    nested: Dict = {}
    for name, value in flat.items():
        if not name.startswith(prefix):
            continue
        *parents, leaf = name[len(prefix):].split('/')
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        # zero-dimensional entries were numbers when saved
        node[leaf] = float(tensor.to_numpy(value)) if len(value.shape) == 0 else value
    return nested


def save_checkpoint(model, path: str, epoch: int, optimizer=None) -> None:
    """Write the model's states, the finished epoch and the optimizer's states to ``path``.

    The file is SINGA's zip format (``Model.save_states``). It is written next to ``path`` first
    and then renamed, so an interrupted run never leaves a truncated checkpoint behind.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    aux = {EPOCH_KEY: tensor.from_numpy(np.asarray([epoch], dtype=np.int32))}
    if optimizer is not None and hasattr(optimizer, 'get_states'):
        aux.update(_flatten(optimizer.get_states(), OPT_PREFIX))
    partial = path + '.partial'
    if os.path.exists(partial):
        os.remove(partial)
    model.save_states(partial, aux_states=aux)
    os.replace(partial, path)


def load_checkpoint(model, path: str, optimizer=None) -> int:
    """Restore what ``save_checkpoint`` wrote; returns the epoch to continue from."""
    aux = model.load_states(path)
    if optimizer is not None and hasattr(optimizer, 'set_states'):
        opt_states = _unflatten(aux, OPT_PREFIX)
        if opt_states:
            optimizer.set_states(opt_states)
    return int(tensor.to_numpy(aux[EPOCH_KEY]).reshape(-1)[0]) + 1


# SINGA's train_one_batch picks the optimizer method from ``dist_option``; the names below are
# SINGA's DistOpt methods, and 'plain' is an ordinary ``optimizer(loss)`` step.
_DIST_UPDATES = {
    'plain': (None, {}),
    'half': ('backward_and_update_half', {}),
    'partialUpdate': ('backward_and_partial_update', {}),
    'sparseTopK': ('backward_and_sparse_update', {'topK': True}),
    'sparseThreshold': ('backward_and_sparse_update', {'topK': False}),
}


def update(optimizer, loss, dist_option: str = 'plain', spars=None) -> None:
    """Back-propagate ``loss`` and update the parameters the way ``dist_option`` asks."""
    if dist_option not in _DIST_UPDATES:
        raise ValueError(f"train_one_batch: dist_option must be one of {sorted(_DIST_UPDATES)}, "
                         f"got {dist_option!r}")
    method, kwargs = _DIST_UPDATES[dist_option]
    if method is None:
        optimizer(loss)
        return
    if not hasattr(optimizer, method):
        raise ValueError(f"train_one_batch: dist_option {dist_option!r} needs a distributed "
                         f"optimizer (opt.DistOpt) with {method}(); got {type(optimizer).__name__}")
    if 'topK' in kwargs:
        kwargs = dict(kwargs, spars=spars)
    getattr(optimizer, method)(loss, **kwargs)


def scalar(t: 'tensor.Tensor') -> float:
    """The value of a one-element Tensor (a loss) as a Python float."""
    return float(tensor.to_numpy(t).reshape(-1)[0])
