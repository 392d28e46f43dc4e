"""The coordination service's own process: it starts and listens, says why when it cannot,
and ends on its own -- soon after a normal shutdown, and once no client is connected after
rank 0 vanished (its control pipe closed without the shutdown line)."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from singa_jax._src.runtime import coordination_service
from test_lost_peer import _free_port, freed_within, port_free


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"coordination service could not start at "
                                               rf"\[::\]:{port} for 2 processes: .*Failed to "
                                               rf"add port .*another process listening"):
            coordination_service.start(f"[::]:{port}", 2)


@pytest.mark.parametrize("ending", ["shutdown", "rank 0 vanished"])
def test_the_service_listens_then_ends_by_itself(ending):
    port = _free_port()
    service = coordination_service.start(f"[::]:{port}", 2, heartbeat_timeout=60)
    assert service.process.poll() is None and not port_free(port)  # listening
    if ending == "shutdown":
        service.shutdown()
    else:  # what rank 0's death does to the pipe: closed, no shutdown line
        service.process.stdin.close()
    started = time.monotonic()
    assert service.process.wait(timeout=30) == 0
    # no client connected: it ends within a few polls, not after the heartbeat time-out
    assert time.monotonic() - started < 10
    assert port_free(port)


def test_the_service_ends_when_rank_0_dies_while_a_forked_worker_holds_its_pipe(tmp_path):
    """Rank 0 forked a process (a data loader's worker) that outlives it, holding the write end
    of the service's pipe: the service still sees rank 0 gone (no longer its child)."""
    port = _free_port()
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from singa_jax._src.runtime import coordination_service
        coordination_service.start("[::]:{port}", 2, heartbeat_timeout=60)
        worker = os.fork()
        if worker == 0:  # (its output elsewhere: the test reads rank 0's to its end)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            time.sleep(60)
            os._exit(0)
        print(worker, flush=True)
        os._exit(0)  # rank 0 gone, without shutting the run down
    """))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo,
                                                                   os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    worker = int(done.stdout.split()[0])
    try:
        assert freed_within(port, 10), "the service outlived rank 0"
    finally:
        os.kill(worker, signal.SIGKILL)
