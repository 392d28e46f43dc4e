"""Out of device memory: :class:`DeviceMemoryError`, what a Model's step raises when XLA cannot
allocate what compiling or running it needs, and how a failed graph-mode run gives back the
state it was donated.

A compiled step is given the old buffers of the state it rewrites (donation). XLA may consume
them even when the run fails: XLA:CPU does when it cannot allocate an output (measured with
JAX 0.10.2: the donated input ``is_deleted()`` after the RESOURCE_EXHAUSTED error). A program's
first run is when its memory need meets the device for the first time, so before it the runner
keeps a host copy of the arrays it donates (:func:`host_copies`; one device-to-host copy of
the state per compiled program, none on later runs), and a failed run puts every consumed
array back from it (:func:`run_failed`); the first run is also waited for, since XLA:CPU
reports a failed allocation asynchronously, in the run's outputs. A later run that fails and
consumed its inputs (the memory other arrays hold grew since) has no copy to restore from: the
error says which state is lost (one reported asynchronously surfaces where a value is read).
"""
from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence, Tuple

import jax
import numpy as np

from singa_jax._src.tensor.tensor import Tensor

__all__ = ["DeviceMemoryError", "is_out_of_memory", "requested_bytes", "out_of_memory",
           "host_copies", "run_failed"]


class DeviceMemoryError(MemoryError):
    """A Model's step (``train_one_batch`` or an evaluation ``forward``) did not fit in device
    memory, in graph or eager mode: compiling or running it failed with XLA's
    RESOURCE_EXHAUSTED. The message names the model, the mode, the batch's shapes and dtypes
    and the bytes XLA asked for; unless it says otherwise no state changed, and a smaller batch
    can be tried. The XLA error is chained (``__cause__``)."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is XLA's out-of-memory error (RESOURCE_EXHAUSTED)."""
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return False
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
_BYTES = re.compile(r"(\d+)\s*bytes\b")  # "... while trying to allocate 1073741824 bytes."
_B = re.compile(r"\((\d+)\s*B\)")  # "... request for 12.00GiB (12884901888B) ..."
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])i?B\b")  # "... allocate 1.50GiB ..."


def requested_bytes(message: str) -> Optional[int]:
    """The bytes an XLA out-of-memory message says were asked for, or None when it names no
    size."""
    for pattern in (_BYTES, _B):
        found = pattern.search(message)
        if found:
            return int(found.group(1))
    found = _SIZE.search(message)
    if found:
        return int(float(found.group(1)) * _UNITS[found.group(2)])
    return None


def _shapes(batch: Sequence[Any]) -> str:
    return ", ".join(f"{np.dtype(a.dtype).name}[{','.join(map(str, a.shape))}]"
                     for a in batch) or "no tensor inputs"


def out_of_memory(where: str, mode: str, doing: str, batch: Sequence[Any],
                  error: BaseException, state_note: Optional[str] = None) -> DeviceMemoryError:
    """The DeviceMemoryError of ``where`` ("Model.train_one_batch") failing with ``error`` in
    ``mode`` ("graph mode"/"eager mode") while ``doing`` ("compiling"/"running") on the arrays
    ``batch``; ``state_note`` replaces the default "no state changed"."""
    message = str(error)
    asked = requested_bytes(message)
    size = (f"XLA asked for {asked} bytes ({asked / 2 ** 30:.2f} GiB) it could not allocate"
            if asked is not None else "XLA did not say how many bytes it asked for")
    note = state_note or ("No state changed: the parameters, buffers, optimizer state and "
                          "random keys are what they were before the call.")
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return DeviceMemoryError(
        f"{where} ({mode}): out of device memory {doing} the step on a batch of "
        f"{_shapes(batch)}; {size}. {note} Try a smaller batch (or a smaller model). "
        f"XLA said: {first}")


# --- a graph-mode run that fails ----------------------------------------------------------------
def _array(holder: Any) -> Any:
    return holder._data if isinstance(holder, Tensor) else holder.key


def _set(holder: Any, array: Any) -> None:
    if isinstance(holder, Tensor):
        holder._data = array
    else:
        holder.key = array


def _copyable(a: Any) -> bool:
    return isinstance(a, jax.Array) and not a.is_deleted() and a.is_fully_addressable and \
        not jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)


def host_copies(holders: Sequence[Any]) -> List[Optional[Tuple[np.ndarray, Any]]]:
    """Before a program's first run: each donated holder's (a Tensor's or a Device's key)
    value as a host array and its sharding, or None where it cannot be copied. Only host
    arrays are kept: a reference to a device array would make the runner copy it on the device
    rather than donate it (``layout.copy_shared``)."""
    return [(np.array(a), a.sharding) if _copyable(a) else None
            for a in map(_array, holders)]


def run_failed(where: str, holders: Sequence[Any], kept: Optional[list], batch: Sequence[Any],
               error: BaseException) -> DeviceMemoryError:
    """After a compiled run of ``where`` failed out of memory: every donated holder whose array
    the run consumed gets its value back from ``kept`` (:func:`host_copies`, or None); returns
    the error to raise, saying which state could not be given back."""
    lost = []
    for i, holder in enumerate(holders):
        a = _array(holder)
        if not (isinstance(a, jax.Array) and a.is_deleted()):
            continue
        copy = kept[i] if kept is not None else None
        if copy is None:
            lost.append(getattr(holder, "name", None) or repr(holder))
        else:
            _set(holder, jax.device_put(copy[0], copy[1]))
    note = None
    if lost:
        names = ", ".join(map(str, lost[:5])) + (", ..." if len(lost) > 5 else "")
        note = (f"The failed run consumed {len(lost)} of the {len(holders)} state arrays it "
                f"updates in place ({names}): XLA deleted them, and they could not be restored "
                f"(only a program's first run keeps a copy). Build the model and its optimizer "
                f"again and load their states from a checkpoint (Model.load_states, "
                f"Optimizer.set_states) before training on.")
    return out_of_memory(where, "graph mode", "running", batch, error, note)
