"""Training-loop helpers shared by the examples: device choice, progress bars, checkpoints."""
import os
import time
from typing import Dict, Iterator, List, Optional

import jax
import jax.numpy as jnp
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


@jax.jit
def step_metrics(loss: jax.Array, out: jax.Array, y: jax.Array) -> jax.Array:
    """[loss, correct predictions] of one training step, computed on the device (float32)."""
    correct = jnp.sum(jnp.argmax(out, axis=1) == y.reshape(-1))
    return jnp.stack([loss.reshape(-1)[0].astype(jnp.float32), correct.astype(jnp.float32)])


@jax.jit
def correct_in(out: jax.Array, y: jax.Array, count: jax.Array) -> jax.Array:
    """Correct predictions among the first ``count`` rows (a zero-padded last batch)."""
    hits = (jnp.argmax(out, axis=1) == y.reshape(-1)) & (jnp.arange(out.shape[0]) < count)
    return jnp.sum(hits, dtype=jnp.int32)


def beside(y: jax.Array, out: jax.Array) -> jax.Array:
    """``y`` where ``out`` is: labels split over several devices (a data-parallel batch) next to
    the rank's gathered outputs (a small device-to-device copy, not a host round trip)."""
    return y if y.sharding == out.sharding else jax.device_put(y, out.sharding)


# signatures step_metrics was compiled for in this process: a step whose metrics compile is
# compiling, not training (its time is left out of the epoch's throughput)
_METRIC_SIGNATURES: set = set()

# the share of the epoch's time spent waiting for input above which the bar says input-bound
INPUT_BOUND_SHARE = 0.2


class DeviceProgress:
    """The progress bar of a training epoch whose metrics stay on the device.

    Each :meth:`record` keeps the step's [loss, correct] as a device array; the host reads
    them only when the bar refreshes (every ``refresh_seconds``, and then only the steps
    already computed: nothing waits) and at :meth:`finish`. So the loop never waits for a
    step without need: it waits only to keep at most ``in_flight`` steps queued ahead of the
    device (enough to keep it busy while the host dispatches the next one; without a bound
    the host would dispatch a whole epoch ahead and the bar would count dispatches). The bar
    shows loss, accuracy, images/s and the share of time the loop waited for input
    (``batches.wait_seconds``), with an "input-bound" hint when that share exceeds
    ``INPUT_BOUND_SHARE``.

    The epoch's time is split into the time the loop waited for the device (the step's
    share: at least that much of the epoch was the device computing steps), waited for input,
    and everything else on the host (dispatch, bookkeeping; it overlaps with the device's
    work when steps are queued, so it is an upper bound of the host's cost). Calls that
    compiled (:meth:`exclude`) are left out.
    """

    def __init__(self, num_batches: int, batch_size: int, desc: str, batches=None,
                 quiet: bool = False, refresh_seconds: float = 0.5, in_flight: int = 2):
        self.bar = tqdm(total=num_batches, desc=desc, unit='batch', leave=False,
                        disable=quiet, dynamic_ncols=True, mininterval=refresh_seconds)
        self.quiet = quiet
        self.batch_size = batch_size
        self.batches = batches  # the epoch's EpochBatches (its wait_seconds), or None
        self.refresh_seconds = refresh_seconds
        self.in_flight = in_flight
        self._values: List[jax.Array] = []  # one [loss, correct] per step, on the device
        self._host: List[np.ndarray] = []   # those read so far
        self.device_wait = 0.0
        self.compile_seconds = 0.0
        self.start = time.perf_counter()
        self._next_refresh = self.start + refresh_seconds
        self.seconds = None  # the epoch's time without compiling, set by finish()

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` (a call that compiled) out of the epoch's time."""
        self.compile_seconds += seconds

    def record(self, loss: jax.Array, out: jax.Array, y: jax.Array) -> None:
        """One step's results (device arrays; dispatched, maybe not computed yet)."""
        signature = (loss.shape, loss.dtype, out.shape, out.dtype, y.shape, y.dtype)
        started = time.perf_counter()
        self._values.append(step_metrics(loss, out, beside(y, out)))
        if signature not in _METRIC_SIGNATURES:  # that call compiled step_metrics
            _METRIC_SIGNATURES.add(signature)
            self.exclude(time.perf_counter() - started)
        if len(self._values) > self.in_flight:
            behind = self._values[-1 - self.in_flight]
            if not behind.is_ready():
                started = time.perf_counter()
                behind.block_until_ready()
                self.device_wait += time.perf_counter() - started
        self.bar.update(1)
        if not self.quiet and time.perf_counter() >= self._next_refresh:
            self._refresh()

    def _read_ready(self) -> None:
        """Read the values of the steps already computed (in order; waits for none)."""
        first = end = len(self._host)
        while end < len(self._values) and self._values[end].is_ready():
            end += 1
        if end > first:
            self._host.extend(jax.device_get(self._values[first:end]))

    def _elapsed(self) -> float:
        return max(time.perf_counter() - self.start - self.compile_seconds, 1e-9)

    def _refresh(self) -> None:
        self._read_ready()
        self._next_refresh = time.perf_counter() + self.refresh_seconds
        if not self._host:
            return
        elapsed = self._elapsed()
        postfix = {'loss': f'{self._host[-1][0]:.4f}', 'acc': f'{self.accuracy:.4f}',
                   'img/s': f'{len(self._host) * self.batch_size / elapsed:.0f}'}
        if self.batches is not None:
            waited = self.batches.wait_seconds
            share = waited / elapsed
            postfix['input wait'] = f'{waited:.2f}s ({share:.0%})' + (
                ' input-bound' if share > INPUT_BOUND_SHARE else '')
        self.bar.set_postfix(postfix, refresh=False)

    def finish(self) -> None:
        """Wait for the epoch's last step, read every value and close the bar."""
        if self._values:
            started = time.perf_counter()
            self._values[-1].block_until_ready()
            self.device_wait += time.perf_counter() - started
        self.seconds = self._elapsed()
        self._read_ready()
        self._values = []
        self.bar.close()

    @property
    def losses(self) -> List[float]:
        """Every step's loss read so far, in order."""
        return [float(v[0]) for v in self._host]

    @property
    def seen(self) -> int:
        return len(self._host) * self.batch_size

    @property
    def mean_loss(self) -> float:
        return float(np.mean([v[0] for v in self._host])) if self._host else float('nan')

    @property
    def accuracy(self) -> float:
        return float(sum(v[1] for v in self._host)) / max(self.seen, 1)

    @property
    def throughput(self) -> float:
        """Images per second of the epoch (after finish: without the calls that compiled)."""
        return self.seen / (self.seconds if self.seconds is not None else self._elapsed())

    def time_split(self) -> Dict[str, float]:
        """After :meth:`finish`: the epoch's seconds (compiling left out) and their shares:
        ``step`` (the loop waited for the device), ``input`` (waited for batches), ``host``
        (the rest), plus ``compile`` seconds."""
        total = self.seconds if self.seconds is not None else self._elapsed()
        waited = self.batches.wait_seconds if self.batches is not None else 0.0
        host = max(total - waited - self.device_wait, 0.0)
        return {'seconds': total, 'step': self.device_wait / total, 'input': waited / total,
                'host': host / total, 'compile': self.compile_seconds}


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
