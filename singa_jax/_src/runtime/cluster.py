"""Joining a multi-process run for ``DistOpt``: the rendezvous (``jax.distributed``), the
launchers it detects (mpirun, SLURM, TPU pods), the bounded time-outs, the cross-process sums
of eager mode, and the consistency check between ranks (:func:`agree`)."""
from __future__ import annotations

import contextlib
import math
import multiprocessing.util
import numbers
import os
import sys
import threading
import time
from functools import partial
from typing import Any, Dict, Iterator, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from singa_jax._src.runtime import coordination_service, peer_watch


TIMEOUT_ENV = "SINGA_JAX_DIST_TIMEOUT"  # seconds a rank waits for the others (default 120)
_DEFAULT_TIMEOUT = 120
RANK, LOCAL = "rank", "local"           # mesh axes: processes, devices of one process
_LAUNCHER_ENV = "JAX_COORDINATOR_ADDRESS"


def _timeout() -> int:
    return int(float(os.environ.get(TIMEOUT_ENV, _DEFAULT_TIMEOUT)))


# ------------------------------------------------------------------------------------------
# Local kernels: float16 round trip and sparsification of one rank's values
# ------------------------------------------------------------------------------------------
def to_half(a: jax.Array) -> jax.Array:
    """``a`` as float16, rounded there for certain. A plain ``astype(float16)`` whose result
    returns to float32 inside a program may be dropped by XLA ("excess precision", on by
    default: on an NVIDIA GPU, jit kept the float32 values); ``lax.reduce_precision`` to
    float16's 5 exponent and 10 mantissa bits is an operation XLA keeps."""
    return jax.lax.reduce_precision(a, exponent_bits=5, mantissa_bits=10).astype(jnp.float16)


@partial(jax.jit, static_argnums=(1,))
def _round_half(arrays: List[jax.Array], clip_value: Optional[float]) -> List[jax.Array]:
    """What an all-reduce in float16 over one replica returns: each value (first clipped to
    ``[-clip_value, clip_value]`` unless ``clip_value`` is None) rounded to float16."""
    if clip_value is not None:
        arrays = [jnp.clip(a, -clip_value, clip_value) for a in arrays]
    return [to_half(a).astype(a.dtype) for a in arrays]


@partial(jax.jit, static_argnums=(2, 3))
def sparsify(arrays: List[jax.Array], accumulation: Optional[jax.Array], spars: float,
              top_k: bool):
    """SINGA's sparsification of one rank's values, on the concatenation of ``arrays``.

    ``x = concat(arrays) (+ accumulation)``; the values sent are those with ``|x| >= spars``
    (``top_k=False``) or the ``ceil(spars * x.size)`` largest ``|x|`` (``top_k=True``); the rest
    is zeroed and, with an accumulation, becomes the new accumulation (error feedback).
    """
    flat = jnp.concatenate([a.reshape(-1) for a in arrays])
    if accumulation is not None:
        flat = flat + accumulation.reshape(-1).astype(flat.dtype)
    if top_k:
        k = min(flat.size, int(math.ceil(spars * flat.size)))
        mask = jnp.zeros(flat.shape, bool)
        if k > 0:
            mask = mask.at[jax.lax.top_k(jnp.abs(flat), k)[1]].set(True)
    else:
        mask = jnp.abs(flat) >= spars
    sent = jnp.where(mask, flat, jnp.zeros_like(flat))
    new_acc = None if accumulation is None else (flat - sent).astype(accumulation.dtype).reshape(
        accumulation.shape)
    outs, start = [], 0
    for a in arrays:
        outs.append(sent[start:start + a.size].reshape(a.shape).astype(a.dtype))
        start += a.size
    return outs, new_acc


@partial(jax.jit, static_argnums=(1, 2, 3))
def _stacked_sum(stacked: List[jax.Array], half: bool, clip: Optional[float], scale: float):
    """Sum of every ``(world_size, ...)`` array over its first axis (the ranks), optionally
    clipped and sent in float16, times ``scale``."""
    out = []
    for x in stacked:
        if clip is not None:
            x = jnp.clip(x, -clip, clip)
        s = to_half(x).sum(0).astype(x.dtype) if half else x.sum(0)
        out.append(s * scale if scale != 1 else s)
    return out


# ------------------------------------------------------------------------------------------
# The cluster: joining it, its meshes, eager sums and agreement between ranks
# ------------------------------------------------------------------------------------------
def _launcher_detected() -> bool:
    """Whether a launcher describes a cluster that ``jax.distributed.initialize()`` can join by
    itself (OpenMPI, SLURM, Cloud TPU pods, Kubernetes, or JAX's own environment variables)."""
    if os.environ.get(_LAUNCHER_ENV):
        return True
    from jax._src import clusters  # JAX's own detectors; no public listing exists
    return any(not env.opt_in_only_method and env.is_env_present()
               for env in clusters.ClusterEnv._cluster_types)


def _address_of(nccl_id: Any) -> str:
    """The coordinator address an ``NcclIdHolder`` (or a ``"host:port"`` string) stands for."""
    address = nccl_id if isinstance(nccl_id, str) else getattr(nccl_id, "address", None)
    if not isinstance(address, str) or ":" not in address:
        raise TypeError(f"DistOpt: nccl_id must be a singa_wrap.NcclIdHolder (or a 'host:port' "
                        f"string), got {type(nccl_id).__name__}")
    return address


def _check_rank_args(local_rank: Any, world_size: Any) -> Tuple[int, int]:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or \
            world_size < 1:
        raise ValueError(f"DistOpt: world_size must be a positive int (the number of processes), "
                         f"got {world_size!r}")
    if isinstance(local_rank, bool) or not isinstance(local_rank, numbers.Integral) or \
            not 0 <= local_rank < world_size:
        raise ValueError(f"DistOpt: local_rank must be an int in [0, {world_size}) for "
                         f"world_size={world_size}, got {local_rank!r}")
    return int(local_rank), int(world_size)


def _initialize(address: Optional[str], world_size: Optional[int], rank: Optional[int],
                local_device_ids: Optional[List[int]], peer_timeout: float) -> None:
    """``jax.distributed.initialize`` with CPU collectives over gloo and a bounded time-out,
    then the watch over the other ranks (:mod:`.peer_watch`)."""
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            "DistOpt: JAX's backend has already started in this process, so it can no longer join "
            "a multi-process run. Construct DistOpt before creating any Tensor, device or model "
            "(as SINGA's train_multiprocess.py / train_mpi.py do), and do not touch JAX in the "
            "parent process before starting the workers.")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = _timeout()
    where = f"rank {rank} of world_size {world_size}" if rank is not None else "this process"
    # JAX aborts the process (a C++ fatal error, no Python exception) when the rendezvous times
    # out; a watchdog firing first says why, on every rank, and exits with status 1.
    watchdog = threading.Timer(timeout, _rendezvous_timed_out,
                               (where, address or "(auto-detected)", world_size, timeout))
    watchdog.daemon = True
    watchdog.start()
    # JAX's own detection of a dead rank aborts every process: the watch must act first
    heartbeat = peer_watch.jax_heartbeat_timeout(peer_timeout, max(10, timeout))
    try:
        with _service_in_own_process():
            jax.distributed.initialize(address, num_processes=world_size, process_id=rank,
                                       local_device_ids=local_device_ids,
                                       initialization_timeout=timeout + 30,
                                       heartbeat_timeout_seconds=heartbeat)
        # Leave the run together at exit (a shutdown barrier, once every rank is done): without
        # it the first process to exit takes the coordination service down and JAX kills the
        # others. multiprocessing's finalizers also run in forked workers, which skip atexit.
        multiprocessing.util.Finalize(None, peer_watch.leave, exitpriority=100)
    except Exception as e:  # JAX raises several types (XlaRuntimeError, ValueError, ...)
        raise RuntimeError(
            f"DistOpt: {where} could not join the rendezvous at {address or '(auto-detected)'} "
            f"within {timeout}s ({TIMEOUT_ENV}). Every rank 0..{(world_size or 0) - 1} must start "
            f"and pass the same world_size; ranks missing or a world_size that does not match "
            f"the number of processes launched time out here. JAX said: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    finally:
        watchdog.cancel()
    from jax._src.distributed import global_state  # the coordination client JAX started
    peer_watch.start(global_state.client, global_state.process_id, global_state.num_processes,
                     peer_timeout, heartbeat)


@contextlib.contextmanager
def _service_in_own_process() -> Iterator[None]:
    """While JAX initializes: process 0 starts the coordination service in a child process
    (:mod:`.coordination_service`) where JAX would start it in this one, so that this
    process's death leaves the other ranks a service to notice it through."""
    from jax._src import distributed  # the module JAX's initialize looks the factory up in
    lib = getattr(distributed, "_jax", None)
    own = getattr(lib, "get_distributed_runtime_service", None)
    if own is None:  # (a JAX that starts it otherwise: in this process, as JAX does)
        yield
        return
    lib.get_distributed_runtime_service = coordination_service.start
    try:
        yield
    finally:
        lib.get_distributed_runtime_service = own


def _rendezvous_timed_out(where: str, address: str, world_size: Optional[int],
                          timeout: int) -> None:
    ranks = f"0..{world_size - 1}" if world_size else "of the launch"
    sys.stderr.write(
        f"DistOpt: {where} gave up waiting at the rendezvous {address} after {timeout}s "
        f"({TIMEOUT_ENV}): not every rank {ranks} joined. Start exactly world_size processes "
        f"with ranks 0..world_size-1 and the same world_size and NcclIdHolder; a world_size "
        f"larger than the number of processes launched waits here.\n")
    sys.stderr.flush()
    os._exit(1)


class _Cluster:
    """This process's place in the run: world size, rank, the devices of every rank and the
    meshes over them, plus the eager sum over ranks and the agreement counter."""

    def __init__(self) -> None:
        self.world_size = jax.process_count()
        self.global_rank = jax.process_index()
        by_rank: Dict[int, List[jax.Device]] = {}
        for d in jax.devices():
            by_rank.setdefault(d.process_index, []).append(d)
        counts = {r: len(ds) for r, ds in by_rank.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"DistOpt: every rank must have the same number of devices for the "
                             f"data-parallel mesh; devices per rank: {counts}")
        grid = np.array([sorted(by_rank[r], key=lambda d: d.id) for r in sorted(by_rank)],
                        dtype=object)
        self.local_devices: List[jax.Device] = list(grid[self.global_rank])
        self.num_local = len(self.local_devices)
        self.rank_device = self.local_devices[0]
        self.mesh = Mesh(grid, (RANK, LOCAL))
        rank_mesh = Mesh(grid[:, 0], (RANK,))
        self.rank_split = NamedSharding(rank_mesh, P(RANK))
        self.rank_replicated = NamedSharding(rank_mesh, P())
        # _stacked_sum returning arrays replicated on every rank
        self._sum_program = jax.jit(_stacked_sum.__wrapped__, static_argnums=(1, 2, 3),
                                    out_shardings=self.rank_replicated)
        self.agreements = 0        # numbering of agree's exchanges (the same on every rank)
        self.agreed: set = set()   # signatures already agreed on (eager reductions)

    @staticmethod
    def current() -> "_Cluster":
        """The run this process belongs to (one object per process: the agreement numbering
        must continue across DistOpt objects)."""
        if CLUSTER[0] is None:
            CLUSTER[0] = _Cluster()
        return CLUSTER[0]

    def on_rank_device(self, a: jax.Array) -> jax.Array:
        if a.devices() == {self.rank_device}:
            return a
        return jax.device_put(a, self.rank_device)

    def sum_over_ranks(self, arrays: List[jax.Array], half: bool = False,
                       clip: Optional[float] = None, scale: float = 1.0) -> List[jax.Array]:
        """Eager all-reduce: every rank's ``arrays`` summed (times ``scale``), on each rank."""
        if self.world_size == 1:
            if half or clip is not None:
                arrays = _round_half(arrays, clip)
            return [a * scale for a in arrays] if scale != 1 else list(arrays)
        agree(self, "all-reduce", repr([(tuple(a.shape), str(a.dtype)) for a in arrays]
                                        + [half, clip]), once=True)
        stacked = [jax.make_array_from_single_device_arrays(
            (self.world_size,) + tuple(a.shape), self.rank_split,
            [self.on_rank_device(a)[None]]) for a in arrays]
        out = self._sum_program(stacked, half, clip, float(scale))
        return [o.addressable_data(0) for o in out]


# The process's _Cluster, made when the first DistOpt joins (a process is in one run only).
CLUSTER: List[Optional[_Cluster]] = [None]


def agree(cluster: _Cluster, what: str, mine: str, once: bool = False) -> None:
    """Every rank publishes what it is about to run (``mine``, or an error) in the coordination
    service's key-value store and reads the others' within the time-out: missing ranks or
    different answers raise on every rank instead of hanging in a collective.

    With ``once``, a signature already agreed on is not checked again (eager reductions reuse
    their program every step)."""
    if cluster.world_size == 1 or (once and mine in cluster.agreed):
        return
    from jax._src.distributed import global_state  # the coordination client JAX started
    client = global_state.client
    cluster.agreements += 1
    prefix = f"singa_jax/distopt/{cluster.agreements}/"
    client.key_value_set(prefix + str(cluster.global_rank), mine)
    deadline = time.monotonic() + _timeout()
    answers: Dict[int, str] = {}
    missing = []
    for r in range(cluster.world_size):
        while True:  # in slices of a second: a lost peer raises PeerLostError here at once
            asked = time.monotonic()
            left_ms = int((deadline - asked) * 1000)
            try:
                answers[r] = client.blocking_key_value_get(prefix + str(r),
                                                           max(1, min(1000, left_ms)))
                break
            except Exception:  # a time-out: that rank has not reached this point yet
                peer_watch.raise_if_lost()
                if left_ms <= 1000:  # past the deadline (later ranks: one 1 ms try each)
                    missing.append(r)
                    break
                if time.monotonic() - asked < 0.1:  # failed at once (not a time-out): no spin
                    time.sleep(0.1)
    if missing:
        raise TimeoutError(
            f"DistOpt ({what}): rank {cluster.global_rank} waited {_timeout()}s ({TIMEOUT_ENV}) "
            f"for rank(s) {missing} of {cluster.world_size}; they never reached this step (they "
            f"failed, run different code, or fewer processes were launched than world_size)")
    failed = {r: a for r, a in answers.items() if a.startswith("ERROR:")}
    if failed:
        raise RuntimeError(f"DistOpt ({what}): rank(s) {sorted(failed)} failed: " +
                           "; ".join(f"rank {r}: {a[6:].strip()}" for r, a in failed.items()))
    if len(set(answers.values())) > 1:
        raise ValueError(f"DistOpt ({what}): the ranks must run the same step on arrays of the "
                         f"same shapes and dtypes, but they differ: " +
                         "; ".join(f"rank {r}: {a}" for r, a in sorted(answers.items())))
    if once:
        cluster.agreed.add(mine)


def join_run(nccl_id: Any, local_rank: Any, world_size: Any,
             peer_timeout: Any = None) -> Tuple[_Cluster, int]:
    """Join (or start) the run this process belongs to; returns the cluster and the local rank.
    ``peer_timeout`` (seconds; None: ``$SINGA_JAX_PEER_TIMEOUT`` or 20) is how long another rank
    may stay silent before it counts as lost; it is fixed when the process joins."""
    silence = peer_watch.peer_timeout(peer_timeout)  # a bad value raises before joining
    running = peer_watch.running_timeout()
    if peer_timeout is not None and running is not None and silence != running:
        raise ValueError(f"DistOpt: peer_timeout={peer_timeout!r}, but this process joined the "
                         f"run with a peer time-out of {running:g}s, fixed at the first DistOpt")
    if nccl_id is not None:
        rank, size = _check_rank_args(local_rank, world_size)
        address = _address_of(nccl_id)
        if size > 1 and not jax.distributed.is_initialized():
            # SINGA's mapping on a GPU box: process r drives GPU r (JAX_LOCAL_DEVICE_IDS
            # overrides); CPU and TPU processes keep all their devices
            ids = None if os.environ.get("JAX_LOCAL_DEVICE_IDS") else [rank]
            _initialize(address, size, rank, ids, silence)
    elif not jax.distributed.is_initialized() and _launcher_detected():
        # JAX_NUM_PROCESSES / JAX_PROCESS_ID complete JAX_COORDINATOR_ADDRESS for a manual
        # launch (one shell per process); launchers (mpirun, SLURM, TPU pods) need neither
        count, rank = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
        _initialize(None, int(count) if count else None, int(rank) if rank else None, None,
                    silence)
    cluster = _Cluster.current()
    if world_size is not None and world_size != cluster.world_size:
        raise ValueError(f"DistOpt: world_size={world_size!r} but this run has "
                         f"{cluster.world_size} process(es)")
    if nccl_id is not None and local_rank != cluster.global_rank:
        raise ValueError(f"DistOpt: local_rank={local_rank!r} but this process joined the run as "
                         f"rank {cluster.global_rank}")
    if local_rank is None:
        local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK",
                                        os.environ.get("SLURM_LOCALID", cluster.global_rank)))
    return cluster, int(local_rank)


