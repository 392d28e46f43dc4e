"""A device-side input pipeline: :class:`DeviceLoader` makes the batches of an epoch on a
background thread -- slices them on the host, puts them on the device (or splits them over a
mesh of devices) and runs the device-side transform (augmentation, resizing, casting: ONE
jitted function, :mod:`.transforms`) -- up to ``prefetch`` batches ahead of the training loop.

Why a thread and not a process: the work left on the host is a NumPy gather and a
``jax.device_put`` (both release the GIL) and the dispatch of one jitted call; forking a
process that has started JAX's runtime is unsafe. The thread never blocks the training loop:
the loop takes ready batches from a bounded queue, and ``next()`` records how long it waited
(:attr:`EpochBatches.wait_seconds`), so a loop can tell when it is input-bound.

Reproducible: the order of an epoch is a permutation drawn from ``(seed, epoch)`` on the host
and each batch's transform key is ``transforms.batch_key(seed, epoch, step)``, so the batches
are the same whatever the prefetch depth, the placement or the thread's timing.
"""
from __future__ import annotations

import atexit
import math
import queue
import threading
import time
import weakref
from typing import (Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple,
                    Union)

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from singa_jax._src.data.transforms import batch_key
from singa_jax._src.runtime.device import get_default_device

__all__ = ["DeviceLoader", "EpochBatches"]

_POLL_SECONDS = 0.1  # how often a blocked worker re-checks whether it was stopped
_JOIN_SECONDS = 5.0  # how long close()/exit waits for a worker in a long host call

Placement = Union[None, jax.Device, Sharding, Mesh, Sequence[jax.Device]]
HostBatch = Tuple[int, np.ndarray, Optional[np.ndarray], int]  # step, x, y, real rows


def _sharding_of(device: Any, sharding: Placement, where: str) -> Sharding:
    """Where batches go: one device (a singa_jax Device, a jax.Device, default: singa_jax's
    default device) or, with ``sharding``, split along the batch over several devices (a
    ``jax.sharding.Sharding``; a ``Mesh``: over all its axes; a list of devices)."""
    if sharding is not None:
        if device is not None:
            raise ValueError(f"{where}: pass device or sharding, not both")
        if isinstance(sharding, Sharding):
            return sharding
        if isinstance(sharding, Mesh):
            return NamedSharding(sharding, PartitionSpec(tuple(sharding.axis_names)))
        devices = list(sharding)
        if not devices or not all(isinstance(d, jax.Device) for d in devices):
            raise TypeError(f"{where}: sharding must be a jax Sharding, a Mesh or a list of jax "
                            f"devices, got {sharding!r}")
        mesh = Mesh(np.array(devices, dtype=object), ("batch",))
        return NamedSharding(mesh, PartitionSpec("batch"))
    if device is None:
        device = get_default_device()
    jax_device = getattr(device, "jax_device", device)  # a singa_jax Device wraps one
    if not isinstance(jax_device, jax.Device):
        raise TypeError(f"{where}: device must be a singa_jax Device or a jax.Device, got "
                        f"{type(device).__name__}")
    return SingleDeviceSharding(jax_device)


def _batch_ways(sharding: Sharding) -> int:
    """Into how many pieces ``sharding`` splits the first axis of a batch."""
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec)
        axes = spec[0] if spec else None
        if axes is None:
            return 1
        axes = axes if isinstance(axes, tuple) else (axes,)
        return int(np.prod([sharding.mesh.shape[a] for a in axes]))
    return len(sharding.device_set)  # a general sharding: assume the batch axis is split


class _ArraySource:
    """The host batches of an epoch from whole-dataset arrays."""

    def __init__(self, x: np.ndarray, y: Optional[np.ndarray], batch_size: int, shuffle: bool,
                 seed: int, drop_last: bool, pad_last: bool):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.shuffle, self.seed, self.drop_last, self.pad_last = shuffle, seed, drop_last, pad_last
        n = len(x)
        self.num_batches = n // batch_size if drop_last else math.ceil(n / batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch``: the same permutation for the same (seed, epoch)."""
        n = len(self.x)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng((int(self.seed), int(epoch))).permutation(n)

    def batches(self, epoch: int, limit: Optional[int], start: int = 0) -> Iterator[HostBatch]:
        order = self.order(epoch)
        count = self.num_batches if limit is None else min(limit, self.num_batches)
        bs = self.batch_size
        for step in range(start, count):
            start = step * bs
            # in order: a slice (a view, no gather); shuffled: the rows of the permutation
            idx = order[start:start + bs] if self.shuffle else slice(start, start + bs)
            x = self.x[idx]
            y = None if self.y is None else self.y[idx]
            rows = len(x)
            if rows < bs and self.pad_last:  # zeros keep the shape (and a compiled step)
                x = _zero_pad(x, bs)
                y = None if y is None else _zero_pad(y, bs)
            yield step, x, y, rows


def _zero_pad(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` with zero rows appended up to ``rows``."""
    return np.concatenate([a, np.zeros((rows - len(a),) + a.shape[1:], a.dtype)])


class _IterableSource:
    """The host batches of an epoch from an iterable of ``x`` or ``(x, y)`` batches (``iter()``
    is called once per epoch: a list is re-read, an iterator continues)."""

    def __init__(self, batches: Iterable[Any]):
        self.source = batches
        self.num_batches: Optional[int] = len(batches) if hasattr(batches, "__len__") else None

    def batches(self, epoch: int, limit: Optional[int], start: int = 0) -> Iterator[HostBatch]:
        it = iter(self.source)
        step = 0
        while limit is None or step < limit:
            try:
                item = next(it)
            except StopIteration:
                return
            if step < start:  # an iterable cannot seek: the batches before ``start`` are read
                step += 1
                continue
            x, y = item if isinstance(item, tuple) else (item, None)
            # copies: the device transfer reads them after it returns, and an iterable may
            # refill one buffer for every batch (see Device.put)
            x = np.array(x)
            y = None if y is None else np.array(y)
            if y is not None and len(y) != len(x):
                raise ValueError(f"DeviceLoader: batch {step} of epoch {epoch} has {len(x)} "
                                 f"inputs but {len(y)} labels")
            yield step, x, y, len(x)
            step += 1


class _Failure(Exception):
    """An exception raised in the worker, with where it happened, handed to the reader."""

    def __init__(self, error: BaseException, epoch: int, step: Optional[int]):
        super().__init__(error)
        self.error, self.epoch, self.step = error, epoch, step


_END = object()  # the worker made every batch of the epoch

# every worker still running, stopped at interpreter exit (a daemon thread inside a JAX call
# while the interpreter tears JAX down can crash the exit; see singa_jax._src.backend.shutdown)
_LIVE: "weakref.WeakSet[_Worker]" = weakref.WeakSet()


class _Worker:
    """One epoch's background thread and its bounded queue. It holds no reference to the
    :class:`EpochBatches` reading it, so an abandoned reader is collected and stops it."""

    def __init__(self, produce: Callable[[Callable[[], bool]], Iterator[Any]], capacity: int,
                 epoch: int):
        self.epoch = epoch  # (named in a failure the producer did not place itself)
        self.queue: "queue.Queue[Any]" = queue.Queue(capacity)
        self.stopped = threading.Event()
        self._produce = produce
        self.thread = threading.Thread(target=self._run, name=f"DeviceLoader epoch {epoch}",
                                       daemon=True)
        _LIVE.add(self)
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._produce(self.stopped.is_set):
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 -- handed to the reader, which re-raises it
            self._put(e if isinstance(e, _Failure) else _Failure(e, self.epoch, None))

    def stop(self, wait: bool = True) -> None:
        self.stopped.set()
        if wait and self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(_JOIN_SECONDS)


@atexit.register
def _stop_all_workers() -> None:
    """At exit, before singa_jax's and JAX's own hooks (registered earlier, so run later):
    stop every loader thread so that none is inside JAX while it shuts down."""
    for worker in list(_LIVE):
        worker.stop()


class EpochBatches:
    """The batches of one epoch of a :class:`DeviceLoader`, in order: an iterator of
    ``(x, y)`` device arrays (``x`` alone for a loader without labels). Its thread starts
    when it is made and stops at the epoch's end, at :meth:`close` (or ``with``), or when the
    iterator is dropped.

    Attributes:
        epoch: the epoch.
        num_batches: how many batches it yields (None: as many as its iterable gives).
        wait_seconds: how long ``next()`` has waited for batches in total (the training loop
            was input-bound for that long); ``last_wait``: the last ``next()``'s wait.
        count: the real rows of the batch last returned (fewer than the batch size for a
            zero-padded last batch, ``pad_last``).
        step: how many batches of the epoch were returned (counting those before the batch
            the epoch started at, when it resumed mid-epoch).
    """

    def __init__(self, loader: "DeviceLoader", epoch: int, start: int = 0):
        self.epoch = int(epoch)
        self.num_batches = loader.batches_per_epoch
        self.wait_seconds = 0.0
        self.last_wait = 0.0
        self.count = 0
        self.step = start
        self._has_y = loader.has_labels
        self._closed = False
        self._worker = _Worker(loader._producer(self.epoch, start), loader.prefetch, self.epoch)

    def __iter__(self) -> "EpochBatches":
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        start = time.perf_counter()
        worker = self._worker
        while True:
            try:
                item = worker.queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if worker.stopped.is_set():  # stopped from elsewhere (exit): nothing will come
                    self._closed = True
                    raise StopIteration from None
        self.last_wait = time.perf_counter() - start
        self.wait_seconds += self.last_wait
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            where = f"epoch {item.epoch}" + ("" if item.step is None else f", batch {item.step}")
            raise RuntimeError(f"DeviceLoader: making the batches failed at {where}: "
                               f"{type(item.error).__name__}: {item.error}") from item.error
        x, y, count = item
        self.count = count
        self.step += 1
        return (x, y) if self._has_y else x

    def close(self) -> None:
        """Stop the thread (it finishes the batch in hand) and drop the batches made ahead."""
        self._closed = True
        self._worker.stop()

    def __enter__(self) -> "EpochBatches":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        worker = self.__dict__.get("_worker")
        if worker is not None:
            worker.stop(wait=False)


class DeviceLoader:
    """Batches of a dataset made on a background thread and put on the device ahead of use.

    Args:
        x: the inputs, a NumPy array with the examples along its first axis (the whole
            dataset; see :meth:`from_batches` for an iterable of batches).
        y: the labels (or any per-example targets), same length as ``x``; None: no labels.
        batch_size: examples per batch.
        shuffle: a new order every epoch, drawn from ``(seed, epoch)``.
        seed: the seed of the order and of the transform's keys
            (``transforms.batch_key(seed, epoch, step)``).
        drop_last: leave out the last batch when it is short (the default: every batch has
            one shape, so a compiled step is not compiled again). Otherwise it is yielded short,
            or, with ``pad_last``, zero-padded to ``batch_size`` (``EpochBatches.count`` gives
            its real rows).
        transform: a device-side ``(key, x) -> x`` (:mod:`.transforms`, e.g.
            ``compose(random_shift(4), random_flip(), resize(224))``), compiled into one jitted
            function with the key's derivation -- when the loader is made, for the batch shape
            (``compile_seconds``; ``output`` is the transformed batch's shape and dtype); None:
            the batches as they are.
        prefetch: batches made ahead of the loop (the queue's capacity; the thread works on
            one more). 2 keeps a device busy when making a batch is faster than a step.
        device: where the batches go: a singa_jax ``Device`` or a ``jax.Device``; default
            singa_jax's default device.
        sharding: instead of ``device``, split every batch along its first axis over several
            devices: a ``jax.sharding.Sharding``, a ``Mesh`` (split over all its axes) or a
            list of devices. Labels are split the same way.
        batches_per_epoch: at most this many batches per epoch (None: the whole dataset).

    Iterating a loader runs its next epoch (0, 1, ...); :meth:`epoch` runs a given one. Either
    gives an :class:`EpochBatches` of device arrays ``(x, y)``::

        loader = DeviceLoader(train_x, train_y, 64, shuffle=True, seed=0,
                              transform=compose(random_shift(4), random_flip()))
        for epoch in range(10):
            for x, y in loader.epoch(epoch):
                tx.array, ty.array = x, y           # no host copy: rebind the Tensors
                out, loss = model(tx, ty)
    """

    def __init__(self, x: Any, y: Any = None, batch_size: int = 32, *, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = True, pad_last: bool = False,
                 transform: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
                 prefetch: int = 2, device: Any = None, sharding: Placement = None,
                 batches_per_epoch: Optional[int] = None):
        where = "DeviceLoader"
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"{where}: batch_size must be an int >= 1, got {batch_size!r}")
        x = np.asarray(x)
        if x.ndim < 1 or len(x) == 0:
            raise ValueError(f"{where}: x must hold at least one example along its first "
                             f"axis, got shape {x.shape}")
        if y is not None:
            y = np.asarray(y)
            if y.ndim < 1 or len(y) != len(x):
                raise ValueError(f"{where}: y must have one entry per example of x: x has shape "
                                 f"{x.shape}, y {y.shape}")
            if y.dtype == np.int64 and not jax.config.jax_enable_x64:
                y = y.astype(np.int32)  # once here, not per batch (JAX would make it int32)
        if drop_last and len(x) < batch_size:
            raise ValueError(f"{where}: {len(x)} examples make no full batch of {batch_size} "
                             f"(drop_last=True)")
        self._init_common(where, transform, prefetch, device, sharding, batches_per_epoch, seed)
        self.batch_size = int(batch_size)
        self.source: Any = _ArraySource(x, y, self.batch_size, bool(shuffle), int(seed),
                                        bool(drop_last), bool(pad_last))
        self.has_labels = y is not None
        self._check(x.shape[1:], x.dtype, None if y is None else (y.shape[1:], y.dtype))

    @classmethod
    def from_batches(cls, batches: Iterable[Any], *, seed: int = 0,
                     transform: Optional[Callable[[jax.Array, jax.Array], jax.Array]] = None,
                     prefetch: int = 2, device: Any = None, sharding: Placement = None,
                     batches_per_epoch: Optional[int] = None, labels: bool = True
                     ) -> "DeviceLoader":
        """A loader over an iterable of host batches (``x`` or ``(x, y)`` NumPy arrays; e.g.
        SINGA's :class:`~singa_jax.data.ImageBatchIter`, which never ends: give
        ``batches_per_epoch``). ``iter(batches)`` is called at each epoch's start. ``labels``:
        whether the batches are ``(x, y)`` pairs."""
        if isinstance(batches, np.ndarray) or not hasattr(batches, "__iter__"):
            raise TypeError(f"DeviceLoader.from_batches: batches must be an iterable of host "
                            f"batches, got {type(batches).__name__}")
        self = cls.__new__(cls)
        self._init_common("DeviceLoader.from_batches", transform, prefetch, device, sharding,
                          batches_per_epoch, seed)
        self.batch_size = None
        self.output = None  # unknown until a batch is made
        self.source = _IterableSource(batches)
        self.has_labels = bool(labels)
        if self.batches_per_epoch is None:
            self.batches_per_epoch = self.source.num_batches
        return self

    def _init_common(self, where: str, transform: Any, prefetch: int, device: Any,
                     sharding: Placement, batches_per_epoch: Optional[int], seed: int) -> None:
        if isinstance(prefetch, bool) or int(prefetch) != prefetch or prefetch < 1:
            raise ValueError(f"{where}: prefetch must be an int >= 1, got {prefetch!r}")
        if batches_per_epoch is not None and (int(batches_per_epoch) != batches_per_epoch
                                              or batches_per_epoch < 1):
            raise ValueError(f"{where}: batches_per_epoch must be an int >= 1 or None, got "
                             f"{batches_per_epoch!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"{where}: transform must be callable (key, x) -> x, got "
                            f"{type(transform).__name__}")
        if not 0 <= int(seed) < 2 ** 32:
            raise ValueError(f"{where}: seed must be in [0, 2**32), got {seed!r}")
        self.seed = int(seed)
        self.prefetch = int(prefetch)
        self.transform = transform
        self.sharding = _sharding_of(device, sharding, where)
        self._limit = None if batches_per_epoch is None else int(batches_per_epoch)
        self.batches_per_epoch: Optional[int] = self._limit
        self._next_epoch = 0
        self._resume: Optional[Tuple[int, int]] = None  # (epoch, batch) set_state continues at
        self._current: Optional["weakref.ref[EpochBatches]"] = None  # the epoch last made
        self.compile_seconds = 0.0  # compiling the transform when the loader was made
        self._program = None if transform is None else jax.jit(
            self._apply, out_shardings=self.sharding)

    def _apply(self, seed_epoch_step: jax.Array, x: jax.Array) -> jax.Array:
        key = batch_key(seed_epoch_step[0], seed_epoch_step[1], seed_epoch_step[2])
        return self.transform(key, x)

    def _check(self, example_shape: Tuple[int, ...], dtype: Any,
               labels: Optional[Tuple[Tuple[int, ...], Any]]) -> None:
        """Before the first epoch: the placement splits the batch evenly, and the transform
        accepts a batch (it is traced, compiled and run on a batch of zeros)."""
        source = self.source
        limit = source.num_batches if self._limit is None else min(self._limit,
                                                                   source.num_batches)
        self.batches_per_epoch = limit
        shape = (self.batch_size,) + tuple(example_shape)
        ways = _batch_ways(self.sharding)
        if self.batch_size % ways or (not source.drop_last and not source.pad_last
                                      and (len(source.x) % self.batch_size) % ways):
            raise ValueError(f"DeviceLoader: the placement splits every batch over {ways} "
                             f"devices, so batches of shape {shape} (and a short last batch "
                             f"of {len(source.x) % self.batch_size}) must divide by {ways}; "
                             f"change batch_size or use drop_last/pad_last")
        dtype = jax.dtypes.canonicalize_dtype(dtype)  # what device_put makes of it
        if self.transform is None:
            self.output = jax.ShapeDtypeStruct(shape, dtype)
            return
        # Compile it now, on a batch of zeros (the program the batches will call): the first
        # epoch's first batch would otherwise wait for the compilation, and the loop would
        # count compiling as waiting for input. Tracing it checks the pieces' shapes: a bad
        # piece raises here, before anything is compiled.
        started = time.perf_counter()
        zeros = jax.device_put(np.zeros(shape, dtype), self.sharding)
        out = jax.block_until_ready(self._program(np.zeros(3, np.uint32), zeros))
        self.compile_seconds = time.perf_counter() - started
        self.output = jax.ShapeDtypeStruct(out.shape, out.dtype)

    def _producer(self, epoch: int, start: int = 0
                  ) -> Callable[[Callable[[], bool]], Iterator[Any]]:
        """What an epoch's worker runs: the placed and transformed batches from ``start`` on."""
        def produce(stopped: Callable[[], bool]) -> Iterator[Any]:
            making = start  # the batch being made (read from the source, placed, transformed)
            try:
                for step, x, y, count in self.source.batches(epoch, self._limit, start):
                    if stopped():
                        return
                    making = step
                    placed = self._place(epoch, step, x, y)
                    yield placed + (count,)
                    making = step + 1
            except Exception as e:
                raise _Failure(e, epoch, making) from e
        return produce

    def _place(self, epoch: int, step: int, x: np.ndarray, y: Optional[np.ndarray]
               ) -> Tuple[jax.Array, Optional[jax.Array]]:
        """One host batch on the device(s), transformed (dispatched: not waited for)."""
        x_dev = jax.device_put(x, self.sharding)
        y_dev = None if y is None else jax.device_put(y, self.sharding)
        if self._program is not None:
            x_dev = self._program(np.array([self.seed, epoch, step], np.uint32), x_dev)
        return x_dev, y_dev

    def epoch(self, epoch: int, start: Optional[int] = None) -> EpochBatches:
        """The batches of ``epoch`` from batch ``start`` on (its thread starts now); the next
        ``iter(loader)`` runs ``epoch + 1``. ``start`` None: batch 0, or, for the epoch a
        :meth:`set_state` resumes, the batch it resumes at (once)."""
        if isinstance(epoch, bool) or int(epoch) != epoch or not 0 <= epoch < 2 ** 32:
            raise ValueError(f"DeviceLoader.epoch: epoch must be an int in [0, 2**32), got "
                             f"{epoch!r}")
        epoch = int(epoch)
        if start is None:
            resume, self._resume = self._resume, None
            start = resume[1] if resume is not None and resume[0] == epoch else 0
        total = self.batches_per_epoch
        if isinstance(start, bool) or int(start) != start or start < 0 or (
                total is not None and start > total):
            raise ValueError(f"DeviceLoader.epoch: start must be an int in [0, "
                             f"{'batches per epoch' if total is None else total}], got "
                             f"{start!r}")
        self._next_epoch = epoch + 1
        batches = EpochBatches(self, epoch, int(start))
        self._current = weakref.ref(batches)
        return batches

    def __iter__(self) -> EpochBatches:
        if self._resume is not None:
            return self.epoch(self._resume[0])
        return self.epoch(self._next_epoch)

    def get_state(self) -> Dict[str, int]:
        """Where the loader is: ``{"epoch": e, "batch": b}``, the next batch the training loop
        will take (the epoch in progress and how many of its batches were returned; after an
        epoch's last batch, the next epoch's batch 0). A checkpoint saves it; :meth:`set_state`
        continues from there with the same remaining batches, since an epoch's order and
        transform keys are drawn from ``(seed, epoch, batch)``."""
        current = self._current() if self._current is not None else None
        if self._resume is not None:
            epoch, batch = self._resume
        elif current is None:
            epoch, batch = self._next_epoch, 0
        else:
            epoch, batch = current.epoch, current.step
            if current.num_batches is not None and batch >= current.num_batches:
                epoch, batch = epoch + 1, 0
        return {"epoch": int(epoch), "batch": int(batch)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`get_state`'s ``state``: the next ``iter(loader)`` or
        ``loader.epoch(state["epoch"])`` yields that epoch's batches from ``state["batch"]``
        on, the batches an uninterrupted loop would have taken next."""
        self._resume = self.checked_state(state)
        self._next_epoch = self._resume[0]

    def checked_state(self, state: Mapping[str, Any]) -> Tuple[int, int]:
        """``(epoch, batch)`` that :meth:`set_state` would continue at (the end of an epoch is the
        start of the next), or a ValueError naming what is wrong; changes nothing."""
        try:
            epoch, batch = int(state["epoch"]), int(state["batch"])
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"DeviceLoader.set_state: expected {{'epoch': int, 'batch': int}}, "
                             f"got {state!r}") from e
        total = self.batches_per_epoch
        if epoch < 0 or batch < 0 or (total is not None and batch > total):
            raise ValueError(f"DeviceLoader.set_state: epoch {epoch}, batch {batch} is not a "
                             f"position of this loader ({total} batches per epoch)")
        if total is not None and batch == total:
            epoch, batch = epoch + 1, 0
        return epoch, batch

    def __len__(self) -> int:
        if self.batches_per_epoch is None:
            raise TypeError("DeviceLoader.from_batches over an iterable of unknown length has "
                            "no len(); give batches_per_epoch")
        return self.batches_per_epoch

    def __repr__(self) -> str:
        return (f"DeviceLoader(batch_size={self.batch_size}, batches_per_epoch="
                f"{self.batches_per_epoch}, transform={self.transform!r}, prefetch="
                f"{self.prefetch}, sharding={self.sharding})")
