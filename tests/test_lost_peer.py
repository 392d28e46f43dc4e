"""A rank of a 2-process DistOpt run dies (SIGKILL; rank 0, which started the coordination
service, included): the other rank stops within the peer time-out with ONE line on stderr
naming the lost rank and its last checkpoint, never hangs and never dies by JAX's SIGABRT; its
main thread, when in Python, gets ``PeerLostError`` and can react; a blocked one ends with exit
status 75. A normal run whose ranks finish seconds apart exits 0 on both, with no such line.

Each rank is its own ``python`` process started here (the launcher-env path for one run,
``nccl_id='host:port'`` for the others), with subprocess time-outs so that no test can hang.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from test_dist import COMMON, REPO

PEER_TIMEOUT = 5     # SINGA_JAX_PEER_TIMEOUT of the runs
LIMIT = 90           # s: a run (import, compile, the kill, the stop) ends well within this

SCRIPT = COMMON.replace("THRESHOLD", "20") + textwrap.dedent('''
    import json, os, signal, sys, time
    scenario, rank, address, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    from singa_jax import device, opt, tensor
    from singa_jax._src.base import last_checkpoint

    sgd = opt.SGD(lr=0.05, momentum=0.9)
    if scenario == "graph_kill":  # the launcher-env path (JAX_COORDINATOR_ADDRESS, ...)
        dist = opt.DistOpt(sgd)
    else:
        dist = opt.DistOpt(sgd, nccl_id=address, local_rank=rank, world_size=2)
    assert (dist.world_size, dist.global_rank) == (2, rank)
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    net = Net()
    x, y = global_batches(2, 1, 4)
    tx = tensor.Tensor((4, 1, 5, 5), dev)
    ty = tensor.Tensor((4,), dev, tensor.int32)
    tx.copy_from_numpy(x[0, rank * 4:(rank + 1) * 4])
    ty.copy_from_numpy(y[0, rank * 4:(rank + 1) * 4])
    net.set_optimizer(dist)
    net.compile([tx], is_train=True, use_graph=scenario != "eager_catch")

    def die():
        with open(os.path.join(work, "killed"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    KILL_AT = 12
    for step in range(40):
        if step == 5:  # a checkpoint, recorded as the checkpoint writers do
            path = os.path.join(work, f"rank{rank}.zip")
            net.save_states(path)
            last_checkpoint.record(path)
        if scenario != "finish" and step == KILL_AT:
            ready = os.path.join(work, "ready")
            victim = 0 if scenario in ("raise0", "kill0") else 1
            if rank == victim:  # graph_kill: at once, the other trains on; else: it waits
                while scenario != "graph_kill" and not os.path.exists(ready):
                    time.sleep(0.05)
                if scenario.startswith("raise"):
                    raise RuntimeError(f"a bug on rank {rank}")
                die()
            tensor.to_numpy(net.get_params()["fc.W"])  # this rank's steps are complete
            open(ready, "w").close()
            if scenario.startswith("raise") or scenario == "kill0":
                # between steps, in Python; PeerLostError uncaught
                while True:
                    time.sleep(0.05)
            if scenario == "eager_catch":  # between steps, in Python
                try:
                    while True:
                        time.sleep(0.05)
                except opt.PeerLostError as e:
                    with open(os.path.join(work, "caught.json"), "w") as f:
                        json.dump({"lost": list(e.lost_ranks), "rank": e.rank,
                                   "checkpoint": e.checkpoint, "message": str(e)}, f)
                    raise
            if scenario == "blocked":  # in a C call that does not return for long
                time.sleep(600)
        net(tx, ty, "plain", 0.0)
    if scenario != "finish":
        # training on after the kill (CPU collectives fail at once, GPU ones block); never here
        print("TRAINED ON", flush=True)
    if rank == 1:
        time.sleep(3)  # the ranks finish at different times
    print("DONE", rank, flush=True)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def freed_within(port: int, seconds: float) -> bool:
    """Whether ``port`` is free now or becomes free within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not port_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def run_pair(tmp_path, scenario):
    """Start both ranks; return ({rank: (exit status, stderr, stdout, end time)}, kill time)."""
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    address = f"127.0.0.1:{_free_port()}"
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    procs = {}
    for rank in (0, 1):
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path,
                   SINGA_JAX_PEER_TIMEOUT=str(PEER_TIMEOUT), SINGA_JAX_DIST_TIMEOUT="60",
                   XLA_FLAGS="--xla_force_host_platform_device_count=1")
        if scenario == "graph_kill":
            env.update(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2",
                       JAX_PROCESS_ID=str(rank))
        procs[rank] = subprocess.Popen(
            [sys.executable, str(script), scenario, str(rank), address, str(tmp_path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results, deadline = {}, time.time() + LIMIT
    try:
        for rank in (0, 1):
            out, err = procs[rank].communicate(timeout=max(1, deadline - time.time()))
            results[rank] = (procs[rank].returncode, err, out, time.time())
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()
    results["address"] = address
    killed = tmp_path / "killed"
    return results, float(killed.read_text()) if killed.exists() else None


def lost_lines(stderr):
    return [line for line in stderr.splitlines()
            if line.startswith("DistOpt: rank ") and " lost rank" in line]


def check_stopped(results, killed, status=None, victim=1):
    """Rank ``victim`` died by SIGKILL; the other stopped, soon, with one line and not by a
    signal."""
    other = 1 - victim
    code_v, _, _, _ = results[victim]
    code_o, err_o, out_o, end_o = results[other]
    assert code_v == -signal.SIGKILL, (code_v, results[victim][1][-2000:])
    assert killed is not None
    assert code_o > 0 if status is None else code_o == status, (code_o, err_o[-3000:])
    assert "TRAINED ON" not in out_o
    assert "Terminating process because the JAX distributed service" not in err_o
    lines = lost_lines(err_o)
    assert len(lines) == 1, err_o[-3000:]
    line = lines[0]
    assert line.startswith(f"DistOpt: rank {other} of 2 lost rank {victim}: no heartbeat for "), \
        line
    assert f"SINGA_JAX_PEER_TIMEOUT={PEER_TIMEOUT}" in line, line
    took = end_o - killed
    print(f"kill -> rank {other} exit: {took:.1f}s (status {code_o})")
    assert took < 4 * PEER_TIMEOUT + 10, took  # ~ timeout + beat interval + grace
    return line


def test_graph_mode_rank_killed_other_rank_stops_with_one_line_and_checkpoint(tmp_path):
    results, killed = run_pair(tmp_path, "graph_kill")
    line = check_stopped(results, killed)
    checkpoint = str(tmp_path / "rank0.zip")
    assert line.endswith(f"Resume from the last checkpoint: {checkpoint}"), line
    # the checkpoint is intact: it loads into the model it came from
    from singa_jax import device, tensor
    namespace = {}
    exec(COMMON.replace("THRESHOLD", "20"), namespace)
    net = namespace["Net"]()
    tx = tensor.Tensor((4, 1, 5, 5), device.get_default_device())
    net.compile([tx], is_train=True, use_graph=False)
    net.load_states(checkpoint)
    assert all(np.isfinite(tensor.to_numpy(v)).all() for v in net.get_states().values())


def test_rank0_killed_other_rank_stops_with_one_line_and_the_service_ends(tmp_path):
    """Rank 0 started the coordination service in a process of its own: its death is a lost
    peer like any other (JAX's client on rank 1 does not abort), and the service's process
    ends once no rank is connected, freeing the port."""
    results, killed = run_pair(tmp_path, "kill0")
    line = check_stopped(results, killed, victim=0)
    assert line.endswith(f"Resume from the last checkpoint: {tmp_path / 'rank1.zip'}"), line
    port = int(results["address"].rsplit(":", 1)[1])
    assert freed_within(port, 15), "the coordination service still holds its port"


def test_main_thread_in_python_catches_peer_lost_error(tmp_path):
    """Eager mode; rank 0 waits in a Python loop when rank 1 dies: ``except PeerLostError``
    runs (it writes a file and re-raises), and the process still ends with status 75."""
    results, killed = run_pair(tmp_path, "eager_catch")
    line = check_stopped(results, killed, status=75)
    caught = json.loads((tmp_path / "caught.json").read_text())
    assert caught["lost"] == [1] and caught["rank"] == 0, caught
    assert caught["checkpoint"] == str(tmp_path / "rank0.zip"), caught
    assert caught["message"] == line.replace(
        "; this rank stops (PeerLostError in the main thread, then exit status 75)", ""), line
    assert "PeerLostError" in results[0][1]  # the re-raised error's traceback


def test_main_thread_blocked_in_a_call_ends_with_status_75(tmp_path):
    results, killed = run_pair(tmp_path, "blocked")
    check_stopped(results, killed, status=75)
    assert "Traceback" not in results[0][1]  # PeerLostError never taken: the process was ended


@pytest.mark.parametrize("victim", [1, 0])
def test_rank_ending_with_an_error_stops_the_other_at_once(tmp_path, victim):
    """A rank raises: it publishes that it failed as it exits, so the other stops within a
    beat or two instead of waiting for it (alive in its exit) in its next collective."""
    results, _ = run_pair(tmp_path, "raise0" if victim == 0 else "raise")
    other = 1 - victim
    code_v, err_v, _, _ = results[victim]
    code_o, err_o, _, end_o = results[other]
    assert code_v == 1 and f"RuntimeError: a bug on rank {victim}" in err_v, err_v[-3000:]
    assert code_o == 75, (code_o, err_o[-3000:])
    lines = lost_lines(err_o)
    assert len(lines) == 1, err_o[-3000:]
    assert lines[0] == (
        f"DistOpt: rank {other} of 2 lost rank {victim}: its program ended with an error; this "
        f"rank stops (PeerLostError in the main thread, then exit status 75). Resume from the "
        f"last checkpoint: {tmp_path / f'rank{other}.zip'}"), lines[0]
    assert "PeerLostError" in err_o  # the uncaught error's traceback
    assert not lost_lines(err_v), err_v[-3000:]
    for err in (err_v, err_o):
        assert "Terminating process because the JAX distributed service" not in err
    ready = (tmp_path / "ready").stat().st_mtime
    print(f"rank {victim} raised -> rank {other} exit: {end_o - ready:.1f}s")
    assert end_o - ready < PEER_TIMEOUT + 10


def test_ranks_finishing_seconds_apart_exit_cleanly(tmp_path):
    results, killed = run_pair(tmp_path, "finish")
    assert killed is None
    for rank in (0, 1):
        code, err, out, _ = results[rank]
        assert code == 0, (rank, err[-3000:])
        assert f"DONE {rank}" in out
        assert not lost_lines(err), err[-3000:]
    # rank 0 waited for rank 1 (3 s later) at exit, and both left together
    assert abs(results[0][3] - results[1][3]) < 2.5


def test_peer_timeout_is_validated_before_joining(monkeypatch):
    from singa_jax import opt
    for bad in (0, 0.5, -1, float("nan"), "soon", True):
        with pytest.raises(ValueError, match=r"peer_timeout must be a number of seconds >= 1"):
            opt.DistOpt(opt.SGD(), nccl_id="127.0.0.1:1", local_rank=0, world_size=2,
                        peer_timeout=bad)
    monkeypatch.setenv("SINGA_JAX_PEER_TIMEOUT", "30s")
    with pytest.raises(ValueError, match=r"SINGA_JAX_PEER_TIMEOUT must be a number of seconds "
                                         r">= 1 .*got '30s'"):
        opt.DistOpt(opt.SGD(), nccl_id="127.0.0.1:1", local_rank=0, world_size=2)
    monkeypatch.setenv("SINGA_JAX_PEER_TIMEOUT", "12.5")
    assert opt.DistOpt(opt.SGD(), peer_timeout=7).world_size == 1  # one rank: nothing to watch
    assert issubclass(opt.PeerLostError, RuntimeError)
