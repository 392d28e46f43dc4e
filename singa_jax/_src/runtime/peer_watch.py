"""Noticing a lost peer of a multi-process run, and stopping this rank with one clear line.

JAX's own detection ends a rank with SIGABRT and a C++ stack trace: its coordination service
declares a process dead after ``heartbeat_timeout_seconds`` without a heartbeat and every other
process then aborts (measured with jaxlib 0.10.2: 4.9 s after a SIGKILL with a 5 s time-out,
118 s with 120 s). The ``missed_heartbeat_callback`` its client accepts cannot call Python
(jaxlib 0.10.2 aborts with ``std::bad_cast`` converting the status), and a process that exits
with a dead peer still waits in the client's shutdown barrier (run by the client's destructor
too) until that abort. The service therefore runs in a process of its own
(:mod:`.coordination_service`): rank 0's death stops its heartbeat like any other rank's. When
the service's process itself dies (rank 0's host lost whole), the other clients abort at once
(0.1 s): nothing in Python can run then.

So each rank runs a watch here, two daemon threads waking every ``interval`` (at most 2 s):

* the *beat* thread writes this rank's heartbeat counter to the coordination service's
  key-value store and reads every rank's counter and published state in one call (0.25 ms);
* the *watch* thread declares lost a rank whose counter has not changed for ``timeout``
  seconds of successful reads, a rank that published that it failed or left, or rank 0 (whose
  child process the service is) when this rank's own reads have failed for ``timeout`` seconds.

On a loss it writes one line to stderr (lost ranks, this rank, why, the last checkpoint),
raises :class:`PeerLostError` in the main thread (``PyThreadState_SetAsyncExc``, taken at its
next Python instruction) and, when the main thread has not taken it within ``grace`` seconds
(blocked in a collective or another C++ call), ends the process with
:data:`PEER_LOST_EXIT_STATUS`. JAX's heartbeat time-out is set longer than all of this
(:func:`jax_heartbeat_timeout`), so its SIGABRT remains the last resort only.

At exit (:func:`leave`) a rank publishes its state: *done* (it waits for every other rank to
be done too -- ranks finish at different times -- and only then runs JAX's shutdown barrier
with them), *failed* (an uncaught exception: the others stop at once instead of blocking in
their next collective) or *gone* (ending without the barrier after a loss). Without a barrier
the process ends by ``os._exit``: the barrier, also run by the client's destructor at
interpreter exit, would wait for the missing rank until JAX's abort.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from singa_jax._src.base import last_checkpoint

__all__ = ["PeerLostError", "PEER_TIMEOUT_ENV", "PEER_LOST_EXIT_STATUS", "peer_timeout",
           "jax_heartbeat_timeout", "start", "leave", "raise_if_lost", "running_timeout"]

PEER_TIMEOUT_ENV = "SINGA_JAX_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT = 20.0  # with the grace and a heartbeat interval: stopped within 30 s
PEER_LOST_EXIT_STATUS = 75  # EX_TEMPFAIL of sysexits.h: resume from the last checkpoint
_PREFIX = "singa_jax/peers/"
DONE, FAILED, GONE = "done", "failed", "gone"  # what a rank publishes as it ends
FINISH_WAIT = 300           # s a finished rank waits for the others (JAX's shutdown barrier's)
_CLEANUP_FLOOR = 30         # s between this rank's stop and JAX's abort, for except blocks


class PeerLostError(RuntimeError):
    """Another rank of this multi-process run was lost (killed, crashed, its host unreachable,
    or its program ended with an error): raised in the main thread of every other rank, so
    that it can save what it needs and clean up. The run cannot continue: a collective with
    the lost rank never completes.

    Attributes: ``lost_ranks`` (tuple of ints), ``rank`` (this process), ``checkpoint`` (the
    last checkpoint this process wrote, or None). The process exits with status 75 at the end
    (``PEER_LOST_EXIT_STATUS``), whether or not the error is caught."""

    lost_ranks: Tuple[int, ...] = ()
    rank: Optional[int] = None
    checkpoint: Optional[str] = None

    def __init__(self, *args: Any) -> None:
        watch = _WATCH[0]
        report = watch.report if watch is not None else None
        if not args:  # the watch raises the class itself: Python instantiates it, no arguments
            args = (report["message"] if report else "a peer of this multi-process run was lost",)
        super().__init__(*args)
        if report is not None:
            self.lost_ranks, self.rank = report["lost"], report["rank"]
            self.checkpoint = report["checkpoint"]
            if threading.current_thread() is threading.main_thread():
                watch.delivered.set()


def peer_timeout(value: Any = None) -> float:
    """The peer time-out in seconds: ``value`` (DistOpt's ``peer_timeout``), else
    ``$SINGA_JAX_PEER_TIMEOUT``, else 20; a clear ValueError when it is not a number >= 1."""
    where = "peer_timeout" if value is not None else PEER_TIMEOUT_ENV
    raw = value if value is not None else os.environ.get(PEER_TIMEOUT_ENV)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return DEFAULT_PEER_TIMEOUT
    try:
        seconds = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 1:  # (heartbeats are 0.25 s apart at least)
        raise ValueError(f"DistOpt: {where} must be a number of seconds >= 1 (how long another "
                         f"rank may stay silent before it counts as lost; default "
                         f"{DEFAULT_PEER_TIMEOUT:g}), got {raw!r}")
    return seconds


def _interval(timeout: float) -> float:
    return min(2.0, max(0.25, timeout / 10))


def _grace(timeout: float) -> float:
    return min(5.0, max(1.0, timeout / 6))


def jax_heartbeat_timeout(timeout: float, at_least: int) -> int:
    """JAX's heartbeat time-out for a peer time-out ``timeout``: long enough for the watch to
    notice, for a blocked rank's grace and for ``except PeerLostError`` blocks to run first."""
    return max(at_least, math.ceil(timeout + _interval(timeout) + _grace(timeout)
                                   + _CLEANUP_FLOOR + 3))


class _Watch:
    def __init__(self, client: Any, rank: int, world_size: int, timeout: float,
                 heartbeat: int) -> None:
        self.client, self.rank, self.world_size = client, rank, world_size
        self.timeout, self.interval, self.grace = timeout, _interval(timeout), _grace(timeout)
        # JAX aborts about ``heartbeat`` s after the lost rank's last beat: end before that
        self.cleanup = max(self.grace + 1, heartbeat - timeout - self.interval - 3)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.delivered = threading.Event()
        now = time.monotonic()
        self.others = [r for r in range(world_size) if r != rank]
        self.seen: Dict[int, Tuple[Optional[str], float]] = {r: (None, now) for r in self.others}
        self.state: Dict[int, str] = {}  # rank -> DONE, FAILED or GONE, as each one published
        self.last_ok = now
        self.report: Optional[Dict[str, Any]] = None
        self.leaving = self.failing = self.injected = self.exiting = False
        self.threads = [threading.Thread(target=self._beat, name="singa_jax-peer-beat",
                                         daemon=True),
                        threading.Thread(target=self._watch, name="singa_jax-peer-watch",
                                         daemon=True)]

    # --- the beat thread: the only one doing I/O (a call may block when the coordinator is
    # unreachable; the watch thread then still decides on time) -------------------------------
    def _beat(self) -> None:
        count = 0
        while not self.stopped.is_set():
            if _jax_client() is not self.client:  # the run was shut down (JAX's own call)
                self.stopped.set()
                return
            count += 1
            try:
                self.client.key_value_set(f"{_PREFIX}beat/{self.rank}", str(count),
                                          allow_overwrite=True)
                entries = self.client.key_value_dir_get(_PREFIX)
            except Exception:  # noqa: BLE001 -- the coordinator did not answer: judged on time
                entries = None
            if entries is not None:
                now = time.monotonic()
                for key, value in entries:
                    kind, _, r = key[len(_PREFIX):].partition("/")
                    r = int(r) if r.isdigit() else -1
                    if kind == "beat" and r in self.seen and self.seen[r][0] != value:
                        self.seen[r] = (value, now)
                    elif kind == "state" and r in self.seen:
                        self.state[r] = value
                self.last_ok = now
            self.stopped.wait(self.interval)

    # --- the watch thread ---------------------------------------------------------------------
    def _watch(self) -> None:
        while not self.stopped.wait(min(1.0, self.interval)):
            try:
                lost, how, silent = self._lost()
            except Exception:  # noqa: BLE001 -- never let the watch die of a surprise
                continue
            if lost:
                self._on_loss(lost, how, silent)
                return

    def _lost(self) -> Tuple[List[int], str, bool]:
        """The ranks lost now, how, and whether by silence (not by what they published)."""
        now, last_ok = time.monotonic(), self.last_ok
        limit = f"({PEER_TIMEOUT_ENV}={self.timeout:g})"
        if self.rank != 0 and now - last_ok > self.timeout:  # the coordinator's store is gone
            return [0], f"the coordination service it started unreachable for " \
                        f"{now - last_ok:.1f}s {limit}", True
        if not self.failing:  # (a failing rank waits for the others to end: not a loss)
            for kind, how in ((FAILED, "its program ended with an error"),
                              (GONE, "it left the run")):
                ended = sorted(r for r, k in dict(self.state).items() if k == kind)
                if ended:
                    return ended, how, False
        # silence over successful reads only (a slow read is not a silent peer); a rank that
        # failed or left stops beating: it is not silent, it ended
        silent = {r: last_ok - changed for r, (_, changed) in self.seen.items()
                  if self.state.get(r) not in (FAILED, GONE) and last_ok - changed > self.timeout}
        how = f"no heartbeat for {max(silent.values(), default=0):.1f}s {limit}"
        return sorted(silent), how, True

    def _on_loss(self, lost: List[int], how: str, silent: bool) -> None:
        checkpoint = last_checkpoint.latest()
        who = f"rank {lost[0]}" if len(lost) == 1 else f"ranks {lost}"
        what = f"DistOpt: rank {self.rank} of {self.world_size} lost {who}: {how}"
        resume = "Resume from the last checkpoint: " + (
            checkpoint or "none (no checkpoint written by this process)")
        stop = "" if self.leaving else "PeerLostError in the main thread, then "
        deadline = time.monotonic() + self.cleanup
        self.report = {"lost": tuple(lost), "rank": self.rank, "checkpoint": checkpoint,
                       "message": f"{what}. {resume}", "deadline": deadline,
                       "store_gone": silent and 0 in lost}
        _write(f"{what}; this rank stops ({stop}exit status {PEER_LOST_EXIT_STATUS}). {resume}")
        with self.lock:
            if not self.leaving and not self.injected:  # the program runs: raise it there
                self.injected = True
                _set_async_exc(threading.main_thread().ident, PeerLostError)
        if not self.delivered.wait(self.grace) and not self.leaving:
            # blocked in a collective (or any C++ call): it cannot take the error
            self.exit_now(PEER_LOST_EXIT_STATUS)
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        if self.exiting:  # leave() is ending the process
            return
        _write(f"DistOpt: rank {self.rank} did not end within {self.cleanup:.0f}s of losing "
               f"{who}; exiting with status {PEER_LOST_EXIT_STATUS} before JAX aborts it")
        self.exit_now(PEER_LOST_EXIT_STATUS)

    # --- leaving ------------------------------------------------------------------------------
    def begin_leaving(self, failing: bool) -> None:
        with self.lock:
            self.leaving, self.failing = True, failing
            if self.injected and not self.delivered.is_set():  # not raised inside the exit
                _set_async_exc(threading.main_thread().ident, None)

    def publish(self, state: str) -> None:
        if self.report is not None and self.report["store_gone"]:
            return  # the coordinator's store is gone, and a call could block
        try:
            self.client.key_value_set(f"{_PREFIX}state/{self.rank}", state,
                                      allow_overwrite=True)
        except Exception:  # noqa: BLE001 -- the others then see this rank go silent instead
            pass

    def wait_for_others(self, states: Tuple[str, ...], until: float) -> str:
        """Until every other rank has published one of ``states`` or is reported lost
        ("ended"), or a loss is reported while not exiting ("lost"), or ``until`` passes
        ("waited")."""
        while time.monotonic() < until:
            report = self.report
            if report is not None and not self.exiting:
                return "lost"
            lost = report["lost"] if report is not None else ()
            # (a rank that failed is alive until it publishes that it is gone)
            if all(self.state.get(r) in states or (r in lost and self.state.get(r) != FAILED)
                   for r in self.others):
                return "ended"
            try:
                time.sleep(0.05)
            except PeerLostError:  # injected just before leaving began: the report is set
                pass
        return "waited"

    def exit_now(self, status: int) -> None:
        """End the process without JAX's shutdown barrier (a rank is missing), with
        ``status``. (The service the others talk to outlives this process.)"""
        with self.lock:
            if self.exiting:
                return
            self.exiting = True
        self.publish(GONE)
        self.stopped.set()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 -- a closed stream: nothing left to save
                pass
        os._exit(status)

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(2.0)  # the beat thread finishes its key-value call (sub-millisecond)


_WATCH: List[Optional[_Watch]] = [None]


def _jax_client() -> Any:
    from jax._src.distributed import global_state
    return global_state.client


def _set_async_exc(thread_id: Optional[int], exc: Any) -> None:
    """Raise ``exc`` (a class) in thread ``thread_id`` at its next Python instruction; None
    withdraws one not yet raised."""
    if thread_id is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None)


def _write(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 -- no stderr: the exit status still says it
        pass


def _forget_in_child() -> None:
    _WATCH[0] = None  # a forked child (a data-loader worker) has no watch threads


os.register_at_fork(after_in_child=_forget_in_child)


def start(client: Any, rank: int, world_size: int, timeout: float, heartbeat: int) -> None:
    """Start watching the other ranks of the run this process just joined."""
    if world_size < 2 or _WATCH[0] is not None:
        return
    watch = _Watch(client, rank, world_size, timeout, heartbeat)
    _WATCH[0] = watch
    for t in watch.threads:
        t.start()


def running_timeout() -> Optional[float]:
    """The peer time-out of this process's watch (None: no watch runs)."""
    watch = _WATCH[0]
    return watch.timeout if watch is not None else None


def raise_if_lost() -> None:
    """In the main thread: raise PeerLostError if a peer was lost (withdrawing the one the
    watch sent, so it is raised once)."""
    watch = _WATCH[0]
    if watch is None or watch.report is None:
        return
    with watch.lock:
        if watch.injected and not watch.delivered.is_set():
            _set_async_exc(threading.main_thread().ident, None)
        watch.injected = True
    raise PeerLostError()


def _ending_with_error() -> bool:
    """Whether the program is ending by an uncaught exception: printed by Python before the
    exit hooks (a script), or propagating through them (a multiprocessing child)."""
    error = sys.exc_info()[1]
    if isinstance(error, SystemExit):
        return error.code not in (None, 0)
    return error is not None or getattr(sys, "last_value", None) is not None


def leave() -> None:
    """The exit hook. A rank that finished publishes it and waits for every other rank to
    finish (they end at different times; at most FINISH_WAIT s), then runs JAX's shutdown
    barrier with them. A rank ending with an error publishes that (the others stop at once)
    and ends with status 1 once they have. After a lost peer: exit status 75, no barrier."""
    import jax
    watch = _WATCH[0]
    if watch is None or watch.pid != os.getpid() or watch.stopped.is_set():
        jax.distributed.shutdown()
        return
    failing = False
    for _ in range(2):  # (the watch may raise PeerLostError here until leaving has begun)
        try:
            failing = _ending_with_error()
            watch.begin_leaving(failing)
            break
        except PeerLostError:
            continue
    try:
        if not failing and watch.report is None:
            watch.publish(DONE)
            if watch.wait_for_others((DONE,), time.monotonic() + FINISH_WAIT) == "waited":
                _write(f"DistOpt: rank {watch.rank} of {watch.world_size} finished, but not "
                       f"every other rank finished within {FINISH_WAIT}s; this rank stops "
                       f"(exit status 1) and the others with it")
                failing = watch.failing = True
        if failing and watch.report is None:
            watch.publish(FAILED)
            # the others stop on seeing it. A rank that failed because a peer died reports
            # that peer once it is silent
            watch.wait_for_others((FAILED, GONE), time.monotonic() + watch.timeout +
                                  watch.interval + watch.grace + 2)
    except PeerLostError:  # raised just before leaving began: the report is set
        pass
    finally:
        if watch.report is not None:
            watch.exit_now(PEER_LOST_EXIT_STATUS)
        elif failing:
            watch.exit_now(1)
    watch.stop()
    _WATCH[0] = None
    jax.distributed.shutdown()
