"""JAX's coordination service in a process of its own, so that rank 0's death is a lost peer.

``jax.distributed.initialize`` starts the coordination service (the rendezvous, the
key-value store, the barriers) inside process 0. When that process dies, every other
process's client loses the service and JAX ends it at once by SIGABRT, in C++: no Python
runs, so the peer watch (:mod:`.peer_watch`) cannot say which rank was lost. Run in a child
process of rank 0 instead, the service outlives rank 0; the other ranks see rank 0's heartbeat
stop like any other rank's and stop with the watch's line.

:func:`start` stands in for ``_jax.get_distributed_runtime_service`` while JAX initializes
(same arguments: the address JAX computed, the number of processes, the time-outs), so
JAX's own address detection and client set-up stay as they are. The child ends

* after rank 0 shut the run down (JAX's shutdown barrier passed, :meth:`Service.shutdown`):
  once no client is connected any more, at most :data:`DONE_LINGER` s later;
* after rank 0 vanished without that (killed, or ended without the barrier after a loss: its
  pipe closes, or this process is no longer its child): once no client is connected any more
  -- every other rank has stopped -- at most the heartbeat time-out later (JAX's own limit,
  past which it would end the clients anyway).

Connected clients are counted from ``/proc/net/tcp`` (the service's accepted connections);
where that file does not exist the child waits for the limits above.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, List, Optional

__all__ = ["Service", "start", "DONE_LINGER"]

DONE_LINGER = 10.0     # s the service waits for the clients to disconnect after the barrier
_READY = "ready"
_START_TIMEOUT = 120   # s for the child to import jaxlib and listen
_POLL = 0.5            # s between two counts of the connected clients
_ERROR = "error: "
_LOG_ERROR = re.compile(r"^[EF]\d{4} [\d:.]+\s+\d+ \S+\] ")  # absl's prefix of an error line


class Service:
    """Rank 0's handle on the coordination service's process (what JAX keeps as
    ``global_state.service``: it calls :meth:`shutdown` after its shutdown barrier)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def shutdown(self) -> None:
        """The run ended normally: the child stops once the clients have disconnected."""
        stdin = self.process.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write("done\n")
            stdin.close()
        except (BrokenPipeError, OSError, ValueError):  # the child is gone already
            pass


def start(address: str, num_nodes: int, heartbeat_timeout: Optional[int] = None,
          shutdown_timeout: Optional[int] = None, **options: Any) -> Service:
    """Start the service at ``address`` (``host:port`` to bind) for ``num_nodes`` processes in
    a child process; return once it listens. A clear RuntimeError when it cannot (the port in
    use, most often)."""
    args = [sys.executable, os.path.abspath(__file__), address, str(num_nodes),
            str(heartbeat_timeout or 100), str(shutdown_timeout or 300),
            "1" if options.get("recoverable") else "0", str(os.getpid())]
    # stdin: the control line ("done"; rank 0's death is its end or the child's reparenting,
    # see _rank0_finished); stdout: "ready"; stderr: the reason when it cannot start. Its own
    # process group: Ctrl-C in a terminal interrupts the ranks (which then leave the run),
    # not the service they still talk to.
    process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    line: List[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()),
                              daemon=True)
    reader.start()
    reader.join(_START_TIMEOUT)
    if not line or line[0].strip() != _READY:
        if process.poll() is None:
            process.kill()
        _, err = process.communicate()
        # the child's own line (the error JAX raised), after JAX's logged errors saying why
        lines = (err or "").splitlines()
        said = [s[len(_ERROR):].strip() for s in lines if s.startswith(_ERROR)]
        said += [_LOG_ERROR.sub("", s).strip() for s in lines if _LOG_ERROR.match(s)]
        raise RuntimeError(
            f"the coordination service could not start at {address} for {num_nodes} processes"
            + (f": {'; '.join(said)}" if said else f" within {_START_TIMEOUT}s")
            + " (another process listening on that port?)")
    process.stdout.close()
    process.stderr.close()
    return Service(process)


# --- the child ---------------------------------------------------------------------------------
def _connected(port: int) -> Optional[int]:
    """Established TCP connections whose local port is ``port`` (the service's clients), or
    None where ``/proc/net/tcp`` is not available."""
    count, found = 0, False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        found = True
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "01" and \
                    int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count if found else None


def _rank0_finished(parent: int) -> bool:
    """Wait for rank 0's word: True when it shut the run down ("done"), False when it is gone
    -- its pipe closed, or this process no longer its child (a process rank 0 forked, a data
    loader's worker, may still hold the pipe open)."""
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], _POLL)
        if readable:
            return sys.stdin.readline().strip() == "done"  # ("" at the end of the pipe)
        if os.getppid() != parent:
            return False


def _serve(address: str, num_nodes: int, heartbeat: int, shutdown: int,
           recoverable: bool, rank0: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from jax._src.lib import _jax
    try:
        service = _jax.get_distributed_runtime_service(
            address, num_nodes, heartbeat_timeout=heartbeat, shutdown_timeout=shutdown,
            recoverable=recoverable)
    except Exception as e:  # noqa: BLE001 -- said to rank 0, which raises it
        print(f"{_ERROR}{e}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(_READY, flush=True)
    # from here on nobody reads this process's output: JAX's logging goes nowhere
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    done = _rank0_finished(rank0)
    port = int(address.rsplit(":", 1)[1])
    deadline = time.monotonic() + (DONE_LINGER if done else heartbeat + 5)
    idle = 0
    while time.monotonic() < deadline:
        clients = _connected(port)
        idle = idle + 1 if clients == 0 else 0
        if idle >= 2:  # twice in a row: not a client reconnecting
            break
        time.sleep(_POLL)
    service.shutdown()


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a script: this package's modules are not top-level ones
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
           sys.argv[5] == "1", int(sys.argv[6]))
