"""``CheckpointManager``: checkpoints of a training run, saved in the background, N kept.

One file per checkpoint, ``<prefix>-<step>.zip`` in the manager's folder (a run of several
processes: ``<prefix>-<step>.rank<r>.zip``, one per rank), in SINGA's format
(:mod:`.run_state` lists what it holds). A save takes the run's values at the step boundary
where it is called (references to immutable arrays, no copy) and hands them to a writer thread,
which copies them to the host and writes the file; the training thread goes on at once. A
save waits for the previous one to be written first, so at most one is in flight and the files
appear in step order. Each file is written to a temporary file and moved into place, so a
process killed mid-write leaves every earlier checkpoint intact; once a file is in place the
oldest beyond ``max_to_keep`` are deleted. At interpreter exit a save in flight is finished.
"""
from __future__ import annotations

import atexit
import os
import re
import threading
import weakref
from typing import Any, List, Mapping, Optional

import jax

from singa_jax._src.base import last_checkpoint
from singa_jax._src.data.loader import DeviceLoader
from singa_jax._src.model import checkpoint
from singa_jax._src.persist import run_state
from singa_jax._src.persist.run_state import Restored

__all__ = ["CheckpointManager"]

_LIVE: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()
# The writer thread's niceness: a tenth of a training thread's CPU share when the cores are
# all busy (Linux's weights: 110 against 1024), so a save slows the step by a few percent and
# is still written within seconds (at 19 a save waits tens of seconds behind busy steps).
_WRITER_NICENESS = 10


class CheckpointManager:
    """Checkpoints of a training run in the folder ``directory``: save and restore everything
    the run needs to continue bit for bit (see ``docs/long_runs.md``).

    Args:
        directory: the folder (made if missing). Every rank of a multi-process run must see it.
        max_to_keep: how many checkpoints to keep (the newest); None keeps all.
        background: write files on a writer thread (the default); False: :meth:`save`
            returns once the file is written.
        compress: deflate the arrays (smaller files, seconds per 100 MB of state more).
        prefix: the files' name before ``-<step>``.

    ::

        ckpt = CheckpointManager("runs/cnn", max_to_keep=3)
        run = ckpt.restore(model, loader=loader)       # None: no checkpoint yet
        step = run.step if run else 0
        for epoch in range(run.epoch if run else 0, epochs):
            for x, y in loader.epoch(epoch):            # resumes mid-epoch after a restore
                tx.array, ty.array = x, y
                model(tx, ty)
                step += 1
                if step % 100 == 0:
                    ckpt.save(step, model, loader=loader)
        ckpt.close()
    """

    def __init__(self, directory: str, max_to_keep: Optional[int] = 3, background: bool = True,
                 compress: bool = False, prefix: str = "ckpt"):
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or int(max_to_keep) !=
                                        max_to_keep or max_to_keep < 1):
            raise ValueError(f"CheckpointManager: max_to_keep must be an int >= 1 or None, got "
                             f"{max_to_keep!r}")
        if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError(f"CheckpointManager: prefix must be letters, digits, '_' or '.', "
                             f"got {prefix!r}")
        self.directory = os.fspath(directory)
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise NotADirectoryError(f"CheckpointManager: {self.directory!r} is a file, not a "
                                     f"folder")
        os.makedirs(self.directory, exist_ok=True)
        self.max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self.background = bool(background)
        self.compress = bool(compress)
        self.prefix = prefix
        self._rank, self._ranks = jax.process_index(), jax.process_count()
        self._writer: Optional[threading.Thread] = None
        self._failure: Optional[BaseException] = None
        self._pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)"
                                   + (rf"\.rank{self._rank}" if self._ranks > 1 else "")
                                   + r"\.zip$")
        _LIVE.add(self)

    # --- where the files are ---------------------------------------------------------------------
    def path(self, step: int, rank: Optional[int] = None) -> str:
        """The file of the checkpoint after ``step`` (of ``rank``, default this process's)."""
        rank = self._rank if rank is None else rank
        suffix = f".rank{rank}" if self._ranks > 1 else ""
        return os.path.join(self.directory, f"{self.prefix}-{int(step)}{suffix}.zip")

    def steps(self) -> List[int]:
        """The steps of the complete checkpoints in the folder, oldest first (with several
        processes: those whose every rank's file is there)."""
        found = []
        for name in os.listdir(self.directory):
            match = self._pattern.match(name)
            if match:
                step = int(match[1])
                if all(os.path.exists(self.path(step, r)) for r in range(self._ranks)):
                    found.append(step)
        return sorted(found)

    def latest_step(self) -> Optional[int]:
        """The newest complete checkpoint's step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    # --- saving ----------------------------------------------------------------------------------
    def save(self, step: int, model: Any, optimizer: Any = None,
             loader: Optional[DeviceLoader] = None, extra: Optional[Mapping[str, Any]] = None,
             rng: bool = True, wait: bool = False) -> str:
        """Checkpoint the run after ``step``: ``model``'s states, ``optimizer``'s (default: the
        model's optimizer), every Device's key, ``loader``'s position, NumPy's and Python's
        global random states (``rng``) and ``extra`` (Tensors, arrays or numbers). Call it
        between steps. Returns the file's path; the file is complete once :meth:`wait` returns
        (at once with ``wait=True`` or ``background=False``). Waits for the previous save first,
        and raises the error it failed with, if any."""
        if isinstance(step, bool) or int(step) != step or step < 0:
            raise ValueError(f"CheckpointManager.save: step must be an int >= 0, got {step!r}")
        self.wait()
        optimizer = _optimizer_of(model, optimizer)
        snapshot = run_state.take(int(step), model, optimizer, loader, extra, rng)
        path = self.path(step)
        if self.background and not wait:
            self._writer = threading.Thread(target=self._write_caught, args=(snapshot, path),
                                            name=f"CheckpointManager {path}")
            self._writer.start()
        else:
            self._write(snapshot, path)
        return path

    def _write_caught(self, snapshot: run_state.Snapshot, path: str) -> None:
        _lower_priority()
        try:
            self._write(snapshot, path)
        except BaseException as e:  # noqa: BLE001 -- raised on the training thread by wait()
            self._failure = e

    def _write(self, snapshot: run_state.Snapshot, path: str) -> None:
        types = snapshot.state_types
        checkpoint.write_archive(path, snapshot.to_host(), types, compress=self.compress)
        last_checkpoint.record(path)
        self._remove_old()

    def _remove_old(self) -> None:
        if self.max_to_keep is None:
            return
        for step in self.steps()[:-self.max_to_keep]:
            try:
                os.remove(self.path(step))
            except FileNotFoundError:
                pass

    def wait(self) -> None:
        """Wait until the save in flight is written; raise its error if it failed."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise RuntimeError(f"CheckpointManager: writing a checkpoint into "
                               f"{self.directory!r} failed: {type(failure).__name__}: "
                               f"{failure}") from failure

    def close(self) -> None:
        """Finish the save in flight (see :meth:`wait`)."""
        self.wait()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- restoring -------------------------------------------------------------------------------
    def restore(self, model: Any, optimizer: Any = None, loader: Optional[DeviceLoader] = None,
                step: Optional[int] = None) -> Optional[Restored]:
        """Put the run of checkpoint ``step`` (default: the newest complete one) back into
        ``model``, ``optimizer`` (default: the model's), every Device's key, ``loader`` and the
        global random generators, and return where it stood (:class:`Restored`); None when the
        folder holds no checkpoint. The model must be built as when it was saved (compiled,
        so that its states exist); everything is checked before anything changes."""
        self.wait()
        if step is None:
            step = self.latest_step()
            if step is None:
                return None
        path = self.path(step)
        if not os.path.exists(path):
            raise FileNotFoundError(f"CheckpointManager.restore: no checkpoint of step {step} "
                                    f"in {self.directory!r} (it has steps {self.steps()})")
        return run_state.restore(path, model, _optimizer_of(model, optimizer), loader)

    def __repr__(self) -> str:
        return (f"CheckpointManager({self.directory!r}, max_to_keep={self.max_to_keep}, "
                f"background={self.background}, steps={self.steps()})")


def _lower_priority() -> None:
    """Run this (writer) thread at a lower CPU priority, where the OS allows it per thread
    (Linux): copying and writing the arrays then takes mostly the time the training step
    leaves idle instead of slowing the step down."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not permitted: the default priority
        pass


def _optimizer_of(model: Any, optimizer: Any) -> Any:
    return optimizer if optimizer is not None else getattr(model, "optimizer", None)


@atexit.register
def _finish_saves() -> None:
    """A save in flight at exit is written (registered after JAX's hooks: runs before them)."""
    for manager in list(_LIVE):
        writer = manager._writer
        if writer is not None:
            writer.join()
