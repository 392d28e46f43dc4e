"""The coordination service's own process: it starts and listens, says why when it cannot,
and ends on its own -- soon after a normal shutdown, and once no client is connected after
rank 0 vanished (its control pipe closed without the shutdown line)."""
import socket
import time

import pytest

from singa_jax._src.runtime import coordination_service


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    assert service.process.poll() is None and not _port_free(port)  # listening
    if ending == "shutdown":
        service.shutdown()
    else:  # what rank 0's death does to the pipe: closed, no shutdown line
        service.process.stdin.close()
    started = time.monotonic()
    assert service.process.wait(timeout=30) == 0
    # no client connected: it ends within a few polls, not after the heartbeat time-out
    assert time.monotonic() - started < 10
    assert _port_free(port)
