"""Everything a training run needs to continue exactly where it stopped, as named arrays.

A checkpoint of a run is SINGA's checkpoint (:mod:`singa_jax._src.model.checkpoint`): the
model's states are its *model states* (state type 0), so SINGA's ``Model.load_states`` reads the
file; the rest of the run is in *auxiliary states* (type 1), under these names:

``run/step``
    the step the run had completed (the caller's count).
``opt/<name>``
    the optimizer's states (``Optimizer.get_states``: its step counter, from which every
    scheduled hyper-parameter is computed, its slots, the loss scale).
``device/<platform>:<id>/key``
    each Device's PRNG key (dropout masks, random fills), as int64 (the SINGA format has no
    uint32).
``loader/epoch``, ``loader/batch``
    the ``DeviceLoader``'s position (:meth:`DeviceLoader.get_state`): the next batch.
``rng/numpy/keys``, ``rng/numpy/meta``, ``rng/python/keys``, ``rng/python/meta``
    NumPy's and Python's global random generators (SINGA's examples shuffle with
    ``np.random``).
``extra/<name>``
    what the caller adds (a best accuracy, a counter).

Values are taken at a step boundary, as the arrays the Tensors hold at that moment (Tensors are
handles over immutable arrays, so holding them costs no copy); the host copy is made later, off
the training thread. A value split over several processes' devices (a ZeRO slot, an FSDP
parameter) is gathered whole when it is taken, a collective every rank runs at the same step.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from singa_jax._src.data.loader import DeviceLoader
from singa_jax._src.model import checkpoint
from singa_jax._src.runtime import device as device_mod
from singa_jax._src.runtime.mesh import gathered
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["Snapshot", "Restored", "take", "restore"]

STEP = "run/step"
OPT, DEVICE, LOADER, EXTRA = "opt/", "device/", "loader/", "extra/"
NUMPY_KEYS, NUMPY_META = "rng/numpy/keys", "rng/numpy/meta"
PYTHON_KEYS, PYTHON_META = "rng/python/keys", "rng/python/meta"


@dataclass
class Snapshot:
    """A run's values at one step boundary: ``{name: array}`` (device arrays or NumPy) and each
    name's SINGA state type; :meth:`to_host` makes them NumPy arrays (off the training
    thread)."""

    arrays: Dict[str, Any]
    state_types: Dict[str, int]

    def to_host(self) -> Dict[str, np.ndarray]:
        host = {name: checkpoint.host_array("state", name, _local(a))
                for name, a in self.arrays.items()}
        host.update({name: a.astype(np.int64) for name, a in host.items()
                     if a.dtype == np.uint32})  # keys: the SINGA format has no uint32
        self.arrays = {}  # drop the device arrays: graph mode may donate their buffers again
        return host


@dataclass
class Restored:
    """What :meth:`CheckpointManager.restore` put back and what the loop needs to go on.

    Attributes:
        step: the step the checkpoint was taken after (continue with ``step``, counting from 0).
        epoch, batch: the loader's position (the next batch), None without a loader.
        extra: the caller's extra values, as NumPy arrays by name.
        path: the checkpoint file read.
    """

    step: int
    path: str
    epoch: Optional[int] = None
    batch: Optional[int] = None
    extra: Dict[str, np.ndarray] = field(default_factory=dict)


def device_name(d: device_mod.Device) -> str:
    return f"{DEVICE}{d.jax_device.platform}:{d.jax_device.id}/key"


def _taken(a: Any) -> Any:
    """``a`` as it can be copied to the host later: a value split over processes is gathered
    now (a collective), a replicated one is this process's copy; the device-to-host copy
    starts at once where the backend can copy asynchronously."""
    if isinstance(a, jax.Array):
        if not a.is_fully_addressable and not a.is_fully_replicated:
            a = gathered([a], f"checkpointing a value {tuple(a.shape)} {a.dtype} split over "
                              f"the processes' devices: every rank must save at the same "
                              f"step")[0]
        # the array itself is kept (not its local piece): the reference tells graph mode not to
        # donate its buffer to the next step (graph.layout.copy_shared) while it is written
        try:
            a.copy_to_host_async()
        except Exception:  # noqa: BLE001 -- an optimisation only (some arrays cannot)
            pass
    return a


def _local(a: Any) -> Any:
    """A replicated value of several processes as this process's copy."""
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        return a.addressable_data(0)
    return a


def _array(value: Any) -> Any:
    return value.array if isinstance(value, Tensor) else value


def take(step: int, model: Any, optimizer: Any = None, loader: Optional[DeviceLoader] = None,
         extra: Optional[Mapping[str, Any]] = None, rng: bool = True) -> Snapshot:
    """The run's values now (the caller is at a step boundary)."""
    arrays: Dict[str, Any] = {}
    types: Dict[str, int] = {}
    for name, t in model.get_states().items():
        arrays[name] = _taken(_array(t))
        types[name] = checkpoint.MODEL_STATE_TYPE
    aux: Dict[str, Any] = {STEP: np.asarray(step, np.int64)}
    if optimizer is not None:
        for name, t in optimizer.get_states().items():
            aux[OPT + name] = _taken(_array(t))
    for d in device_mod.all_devices():
        aux[device_name(d)] = _taken(d.key)  # (uint32: written as int64, see to_host)
    if loader is not None:
        position = loader.get_state()
        aux[LOADER + "epoch"] = np.asarray(position["epoch"], np.int64)
        aux[LOADER + "batch"] = np.asarray(position["batch"], np.int64)
    if rng:
        aux.update(_generator_states())
    for name, value in (extra or {}).items():
        if not checkpoint.is_state_value(value):
            raise TypeError(f"CheckpointManager.save: extra '{name}' must be a Tensor, an array "
                            f"or a number, got {type(value).__name__}")
        aux[EXTRA + str(name)] = _taken(_array(value))
    clash = sorted(set(arrays) & set(aux))
    if clash:
        raise ValueError(f"CheckpointManager.save: model state name(s) {clash} clash with the "
                         f"run's own names")
    arrays.update(aux)
    types.update({name: checkpoint.AUX_STATE_TYPE for name in aux})
    return Snapshot(arrays, types)


def _generator_states() -> Dict[str, np.ndarray]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {NUMPY_KEYS: np.asarray(keys, np.int64),
            NUMPY_META: np.asarray([pos, has_gauss, gauss], np.float64),
            PYTHON_KEYS: np.asarray(internal, np.int64),
            PYTHON_META: np.asarray([version, gauss_next is not None,
                                     0.0 if gauss_next is None else gauss_next], np.float64)}


def _set_generator_states(aux: Mapping[str, np.ndarray]) -> None:
    if NUMPY_KEYS in aux:
        pos, has_gauss, gauss = aux[NUMPY_META].tolist()
        np.random.set_state(("MT19937", aux[NUMPY_KEYS].astype(np.uint32), int(pos),
                             int(has_gauss), float(gauss)))
    if PYTHON_KEYS in aux:
        version, has_gauss, gauss = aux[PYTHON_META].tolist()
        random.setstate((int(version), tuple(int(v) for v in aux[PYTHON_KEYS]),
                         float(gauss) if has_gauss else None))


def restore(path: str, model: Any, optimizer: Any = None,
            loader: Optional[DeviceLoader] = None) -> Restored:
    """Read the checkpoint ``path`` and put the run's values back. Everything is checked first
    (the model's names and shapes, the optimizer's states, the devices' keys, the loader's
    position); on an error nothing has changed."""
    model_states, aux = checkpoint.read_states(path)
    owner = type(model).__name__
    checkpoint.check_against(owner, model.get_states(), model_states, path)
    if STEP not in aux:
        raise ValueError(f"CheckpointManager.restore: {path!r} is a checkpoint of a model, not of "
                         f"a run (it has no '{STEP}'); load it with {owner}.load_states")
    opt_states = {k[len(OPT):]: v for k, v in aux.items() if k.startswith(OPT)}
    if opt_states and optimizer is None:
        raise ValueError(f"CheckpointManager.restore: {path!r} holds optimizer states but no "
                         f"optimizer was given and {owner} has none (set_optimizer first)")
    keys: List[Tuple[device_mod.Device, jax.Array]] = []
    for d in device_mod.all_devices():
        saved = aux.get(device_name(d))
        if saved is not None:
            if saved.shape != np.shape(d.key):
                raise ValueError(f"CheckpointManager.restore: {path!r} holds a key of shape "
                                 f"{saved.shape} for {device_name(d)}, the device's key has "
                                 f"shape {np.shape(d.key)}")
            keys.append((d, saved.astype(np.uint32)))
    position = None
    if loader is not None and LOADER + "epoch" in aux:
        position = {"epoch": int(aux[LOADER + "epoch"]), "batch": int(aux[LOADER + "batch"])}
        try:
            loader.checked_state(position)
        except ValueError as e:
            raise ValueError(f"CheckpointManager.restore: {path!r}: {e}") from e
    # all checked: only now does anything change (the optimizer checks its own dict whole first)
    if opt_states:
        optimizer.set_states(opt_states)
    model.set_states(model_states)
    for d, key in keys:
        d.key = jax.device_put(key, d.jax_device)
    if position is not None:
        loader.set_state(position)
    _set_generator_states(aux)
    extra = {k[len(EXTRA):]: v for k, v in aux.items() if k.startswith(EXTRA)}
    restored = Restored(step=int(aux[STEP]), path=str(path), extra=extra)
    if position is not None:
        restored.epoch, restored.batch = position["epoch"], position["batch"]
    return restored
