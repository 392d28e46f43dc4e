"""``DistOpt`` of ``singa_jax.opt``: SINGA's data-parallel optimizer wrapper on JAX's machinery.

A *rank* is a process (SINGA's). ``world_size`` counts processes; each process may own several
local devices (a TPU host's chips, a multi-GPU box, ``--xla_force_host_platform_device_count``).

Joining (:func:`_join`)
    ``DistOpt(sgd, nccl_id=holder, local_rank=r, world_size=w)`` calls
    ``jax.distributed.initialize(holder.address, w, r)`` (CPU collectives over gloo);
    ``DistOpt(sgd)`` joins the cluster a launcher describes (mpirun, SLURM, TPU pods, or
    ``JAX_COORDINATOR_ADDRESS``), or runs as the only rank. This must happen before JAX's backend
    starts, so DistOpt is constructed before any Tensor exists, as in SINGA's examples.

Collectives
    *Eager*: a gradient is summed over the ranks by one jitted reduction over a global array
    assembled (without copies) from every process's piece (:meth:`_Cluster.sum_over_ranks`).
    Eager steps compute on the rank's first local device.
    *Graph mode*: a Model whose optimizer is a DistOpt compiles its whole training step, collectives
    included, as ONE program per process: the step runs under ``shard_map`` over the mesh
    ``('rank', 'local')`` of all devices, the batch split along its first dimension, and
    DistOpt's sums become ``lax.psum`` (:class:`SpmdStep`, used by :mod:`singa_jax.graph`).

The numbers are SINGA's: gradients summed over ranks and divided by ``world_size``; ``half`` sends
float16; ``partialUpdate`` averages one round-robin partition of the parameters per step;
``sparseTopK``/``sparseThreshold`` send the top-k / above-threshold values with the residual
kept for the next step (``corr``). A rank with several local devices contributes the mean of its
devices' gradients (the gradient of its own batch). Consistency between ranks (same shapes, all
present) is checked through the coordination service with a bounded time-out
(:func:`_agree`), so a wrong launch raises on every rank instead of hanging.
"""
from __future__ import annotations

import contextvars
import math
import multiprocessing.util
import numbers
import os
import sys
import threading
import weakref
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import tensor as _tensor
from ..autograd.engine import backward as _backward
from ..ctensor import CTensor
from ..tensor import Tensor
from .optimizers import SGD, Optimizer, _state_tensor
from .schedules import _check_real

__all__ = ["DistOpt", "SpmdStep", "TIMEOUT_ENV"]

TIMEOUT_ENV = "SINGA_JAX_DIST_TIMEOUT"  # seconds a rank waits for the others (default 120)
_DEFAULT_TIMEOUT = 120
RANK, LOCAL = "rank", "local"           # mesh axes: processes, devices of one process
_LAUNCHER_ENV = "JAX_COORDINATOR_ADDRESS"


def _timeout() -> int:
    return int(float(os.environ.get(TIMEOUT_ENV, _DEFAULT_TIMEOUT)))


# ------------------------------------------------------------------------------------------
# Local kernels: float16 round trip and sparsification of one rank's values
# ------------------------------------------------------------------------------------------
@partial(jax.jit, static_argnums=(1,))
def _round_half(arrays: List[jax.Array], clip_value: Optional[float]) -> List[jax.Array]:
    """What an all-reduce in float16 over one replica returns: each value (first clipped to
    ``[-clip_value, clip_value]`` unless ``clip_value`` is None) rounded to float16."""
    if clip_value is not None:
        arrays = [jnp.clip(a, -clip_value, clip_value) for a in arrays]
    return [a.astype(jnp.float16).astype(a.dtype) for a in arrays]


@partial(jax.jit, static_argnums=(2, 3))
def _sparsify(arrays: List[jax.Array], accumulation: Optional[jax.Array], spars: float,
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
        s = x.astype(jnp.float16).sum(0).astype(x.dtype) if half else x.sum(0)
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
                local_device_ids: Optional[List[int]]) -> None:
    """``jax.distributed.initialize`` with CPU collectives over gloo and a bounded time-out."""
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
    try:
        jax.distributed.initialize(address, num_processes=world_size, process_id=rank,
                                   local_device_ids=local_device_ids,
                                   initialization_timeout=timeout + 30,
                                   heartbeat_timeout_seconds=max(10, timeout))
        # Leave the run together at exit (a shutdown barrier): without it the first process to
        # exit takes the coordination service down and JAX kills the others. multiprocessing's
        # finalizers also run in forked workers, which skip atexit.
        multiprocessing.util.Finalize(None, jax.distributed.shutdown, exitpriority=100)
    except Exception as e:  # JAX raises several types (XlaRuntimeError, ValueError, ...)
        raise RuntimeError(
            f"DistOpt: {where} could not join the rendezvous at {address or '(auto-detected)'} "
            f"within {timeout}s ({TIMEOUT_ENV}). Every rank 0..{(world_size or 0) - 1} must start "
            f"and pass the same world_size; ranks missing or a world_size that does not match "
            f"the number of processes launched time out here. JAX said: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    finally:
        watchdog.cancel()


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
        self.agreements = 0        # numbering of _agree's exchanges (the same on every rank)
        self.agreed: set = set()   # signatures already agreed on (eager reductions)

    @staticmethod
    def current() -> "_Cluster":
        """The run this process belongs to (one object per process: the agreement numbering
        must continue across DistOpt objects)."""
        if _CLUSTER[0] is None:
            _CLUSTER[0] = _Cluster()
        return _CLUSTER[0]

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
        _agree(self, "all-reduce", repr([(tuple(a.shape), str(a.dtype)) for a in arrays]
                                        + [half, clip]), once=True)
        stacked = [jax.make_array_from_single_device_arrays(
            (self.world_size,) + tuple(a.shape), self.rank_split,
            [self.on_rank_device(a)[None]]) for a in arrays]
        out = self._sum_program(stacked, half, clip, float(scale))
        return [o.addressable_data(0) for o in out]


# The process's _Cluster, made when the first DistOpt joins (a process is in one run only).
_CLUSTER: List[Optional[_Cluster]] = [None]


def _agree(cluster: _Cluster, what: str, mine: str, once: bool = False) -> None:
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
    timeout_ms = _timeout() * 1000
    answers: Dict[int, str] = {}
    missing = []
    for r in range(cluster.world_size):
        try:
            answers[r] = client.blocking_key_value_get(prefix + str(r), timeout_ms)
        except Exception:  # a time-out: that rank never reached this point
            missing.append(r)
            timeout_ms = 1  # the others had as long already
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


def _join(nccl_id: Any, local_rank: Any, world_size: Any) -> Tuple[_Cluster, int]:
    """Join (or start) the run this process belongs to; returns the cluster and the local rank."""
    if nccl_id is not None:
        rank, size = _check_rank_args(local_rank, world_size)
        address = _address_of(nccl_id)
        if size > 1 and not jax.distributed.is_initialized():
            # SINGA's mapping on a GPU box: process r drives GPU r (JAX_LOCAL_DEVICE_IDS
            # overrides); CPU and TPU processes keep all their devices
            ids = None if os.environ.get("JAX_LOCAL_DEVICE_IDS") else [rank]
            _initialize(address, size, rank, ids)
    elif not jax.distributed.is_initialized() and _launcher_detected():
        # JAX_NUM_PROCESSES / JAX_PROCESS_ID complete JAX_COORDINATOR_ADDRESS for a manual
        # launch (one shell per process); launchers (mpirun, SLURM, TPU pods) need neither
        count, rank = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
        _initialize(None, int(count) if count else None, int(rank) if rank else None, None)
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


# ------------------------------------------------------------------------------------------
# Graph mode: the whole data-parallel step as one SPMD program
# ------------------------------------------------------------------------------------------
# The SpmdStep whose shard_map body is being traced on this thread (DistOpt's sums become psum).
_SPMD_BODY: contextvars.ContextVar[Optional["SpmdStep"]] = contextvars.ContextVar(
    "singa_jax.spmd_body", default=None)


class SpmdStep:
    """How graph mode runs a training step of a Model whose optimizer is a DistOpt.

    :meth:`trace` traces the step under ``shard_map`` over the mesh ``(rank, local)``: state and
    device keys replicated (each process passes its own copy, so per-rank state such as batch-norm
    statistics stays per rank), every Tensor argument split along its first dimension over all
    devices (each rank's batch over its local devices). Results with the batch as first dimension
    are gathered back to the rank's batch; other results (the loss) are the mean of the rank's
    devices. :meth:`compile` compiles it; the returned :class:`_SpmdProgram` takes and returns
    this process's arrays, so graph mode's bookkeeping is the same as for one device.
    """

    def __init__(self, dist: "DistOpt"):
        self._dist = weakref.ref(dist)
        self.cluster = dist._cluster
        mesh = self.cluster.mesh
        self.replicated = NamedSharding(mesh, P())
        self.split = NamedSharding(mesh, P((RANK, LOCAL)))
        self.by_rank = NamedSharding(mesh, P(RANK))
        self._result_order: List[int] = []

    # -- inside the body: what DistOpt's sums do ----------------------------------------------
    def rank_values(self, arrays: List[Any]) -> List[Any]:
        """A rank's value of per-device values: the mean over its local devices."""
        if self.cluster.num_local == 1:
            return list(arrays)
        return jax.lax.pmean(list(arrays), LOCAL)

    def sum_over_ranks(self, arrays: List[Any], of_rank_values: bool = False) -> List[Any]:
        """Sum over the ranks of each rank's value (``of_rank_values``: ``arrays`` already are)."""
        if of_rank_values or self.cluster.num_local == 1:
            return jax.lax.psum(list(arrays), RANK)
        # one collective: the sum over all devices of the per-device values, / devices per rank
        return [s / self.cluster.num_local for s in jax.lax.psum(list(arrays), (RANK, LOCAL))]

    # -- tracing and compiling (called by graph.GraphRunner) ----------------------------------
    def trace(self, step: Callable, where: str, state: Sequence[Tensor], state_arrays: list,
              keys: list, batch: list):
        """The closed jaxpr of ``step`` under shard_map, over global arrays (see the class)."""
        cluster, m = self.cluster, self.cluster.num_local
        problem = None
        if not batch:
            problem = f"{where}: graph mode with DistOpt needs Tensor arguments (the batch)"
        for a in batch:
            if problem is None and (a.ndim == 0 or a.shape[0] % m):
                problem = (f"{where}: DistOpt splits every Tensor argument along its first "
                           f"dimension over this rank's {m} local device(s), but an argument has "
                           f"shape {tuple(a.shape)}; use a batch size divisible by {m}")
        signature = (f"{where} state={[(tuple(a.shape), str(a.dtype)) for a in state_arrays]} "
                     f"batch={[(tuple(a.shape), str(a.dtype)) for a in batch]}")
        _agree(cluster, f"compiling {where}", "ERROR: " + problem if problem else signature)
        if problem:
            raise ValueError(problem)
        per_shard_batch = batch[0].shape[0] // m
        dist = self._dist()
        optimizer_ids = {id(t) for t in _tensors_of(dist)} if dist is not None else set()
        layer_state = [i for i, t in enumerate(state)
                       if not t.stores_grad and id(t) not in optimizer_ids
                       and jnp.issubdtype(t.dtype, jnp.floating)]

        def body(state_arrays, keys, batch):
            token = _SPMD_BODY.set(self)
            try:
                new_state, new_keys, extra, results = step(state_arrays, keys, batch)
            finally:
                _SPMD_BODY.reset(token)
            if m > 1:  # per-rank statistics (batch norm): the mean of the rank's devices
                new_state = list(new_state)
                for i in layer_state:
                    new_state[i] = jax.lax.pmean(new_state[i], LOCAL)
            # per-example results (first dimension = the device's batch) are gathered; a
            # one-value result is a per-batch value (a loss) even when that batch is one example
            batched = [i for i, r in enumerate(results)
                       if r.ndim > 0 and r.shape[0] == per_shard_batch and r.size > 1]
            others = [i for i in range(len(results)) if i not in batched]
            self._result_order = batched + others
            gather = (lambda r: r) if m == 1 else \
                (lambda r: jax.lax.all_gather(r, LOCAL, axis=0, tiled=True))
            mean = (lambda r: r) if m == 1 else \
                (lambda r: jax.lax.pmean(r, LOCAL) if jnp.issubdtype(r.dtype, jnp.inexact)
                 else r)
            return (new_state, new_keys, extra, [gather(results[i]) for i in batched],
                    [mean(results[i]) for i in others])

        program = jax.shard_map(body, mesh=cluster.mesh,
                                in_specs=(P(), P(), P((RANK, LOCAL))),
                                out_specs=(P(), P(), P(), P(RANK), P()), check_vma=False)
        return jax.jit(program).trace(self._global_avals(state_arrays, self.replicated),
                                      self._global_avals(keys, self.replicated),
                                      self._global_avals(batch, self.split)).jaxpr

    def _global_avals(self, arrays: list, sharding: NamedSharding) -> list:
        world = self.cluster.world_size
        out = []
        for a in arrays:
            shape = tuple(a.shape)
            if sharding is self.split:
                shape = (shape[0] * world,) + shape[1:]
            out.append(jax.ShapeDtypeStruct(shape, a.dtype, sharding=sharding))
        return out

    def compile(self, program: Callable, donated: list, read: list, batch: list,
                options: Optional[dict]) -> "_SpmdProgram":
        """Compile ``program(donated, read, batch)`` (graph mode's trimmed step) for the mesh."""
        repl, split = self.replicated, self.split
        lowered = jax.jit(program, donate_argnums=0,
                          in_shardings=([repl] * len(donated), [repl] * len(read),
                                        [split] * len(batch))).lower(
            self._global_avals(donated, repl), self._global_avals(read, repl),
            self._global_avals(batch, split))
        return _SpmdProgram(self, lowered.compile(options), donated, read, batch,
                            list(self._result_order))


def _tensors_of(dist: "DistOpt") -> List[Tensor]:
    """Every Tensor a DistOpt and its optimizer hold (slots, counters, accumulations)."""
    from ..graph import tensors_in  # graph imports opt's package indirectly; import late
    return tensors_in([dist.opt, {k: v for k, v in vars(dist).items() if k != "opt"}])


class _SpmdProgram:
    """A compiled SPMD step taking and returning this process's arrays.

    State arrays (on the rank's first device) become global replicated arrays -- without a copy
    on one local device, with one copy per extra local device, cached between steps by identity
    -- and the batch a global array split over the devices; outputs come back as the arrays of
    the rank's first device."""

    def __init__(self, plan: SpmdStep, compiled, donated: list, read: list, batch: list,
                 result_order: List[int]):
        self.plan = plan
        self.cluster = plan.cluster
        self.compiled = compiled
        self._expected = [[(tuple(a.shape), np.dtype(a.dtype)) for a in group]
                          for group in (donated, read, batch)]
        self.args_info = tuple([jax.ShapeDtypeStruct(s, d) for s, d in group]
                               for group in self._expected)
        self._restore_order = np.argsort(result_order).tolist() if result_order else []
        self._globals: Dict[int, Tuple[jax.Array, jax.Array]] = {}

    def _replicated(self, a: jax.Array) -> jax.Array:
        cached = self._globals.get(id(a))
        if cached is not None and cached[0] is a:
            return cached[1]
        cl = self.cluster
        first = cl.on_rank_device(a)
        pieces = [first] + (jax.device_put([first] * (cl.num_local - 1), cl.local_devices[1:])
                            if cl.num_local > 1 else [])
        return jax.make_array_from_single_device_arrays(tuple(a.shape), self.plan.replicated,
                                                        pieces)

    def _split(self, a: jax.Array) -> jax.Array:
        cl = self.cluster
        shape = (a.shape[0] * cl.world_size,) + tuple(a.shape[1:])
        if cl.num_local == 1:
            return jax.make_array_from_single_device_arrays(shape, self.plan.split,
                                                            [cl.on_rank_device(a)])
        return jax.make_array_from_process_local_data(self.plan.split, a, shape)

    def _local(self, x: jax.Array) -> jax.Array:
        for shard in x.addressable_shards:
            if shard.device == self.cluster.rank_device:
                return shard.data
        return x.addressable_data(0)  # pragma: no cover - the rank device holds every output

    def __call__(self, donated: list, read: list, batch: list):
        got = [[(tuple(a.shape), np.dtype(a.dtype)) for a in group]
               for group in (donated, read, batch)]
        if got != self._expected:
            raise TypeError("graph mode (DistOpt): the step's inputs changed shape or dtype")
        g_donated = [self._replicated(a) for a in donated]
        g_read = [self._replicated(a) for a in read]
        self._globals = {id(a): (a, g) for a, g in zip(read, g_read)}
        new_state, new_keys, extra, results = self.compiled(g_donated, g_read,
                                                            [self._split(a) for a in batch])
        local_state = [self._local(g) for g in new_state]
        local_keys = [self._local(g) for g in new_keys]
        for a, g in zip(local_state + local_keys, list(new_state) + list(new_keys)):
            self._globals[id(a)] = (a, g)
        local_results = [self._local(r) for r in results]
        local_results = [local_results[i] for i in self._restore_order]
        return local_state, local_keys, [self._local(g) for g in extra], local_results


def spmd_of(static: Tuple) -> Optional[SpmdStep]:
    """The SPMD layout a Model's training step needs: that of its DistOpt, when the run has
    several ranks or several local devices (``static`` is the Model's optimizers' static keys)."""
    for key in static:
        if type(key) is tuple and key and key[0] is DistOpt and key[1] is not None:
            return key[1]
    return None


# ------------------------------------------------------------------------------------------
# Helpers for tensors and lists
# ------------------------------------------------------------------------------------------
def _arrays_of(items: Any) -> Tuple[List[Any], bool]:
    """``items`` (a Tensor, an array, or a list of them) as a list, and whether it was a list."""
    if isinstance(items, (list, tuple)):
        return list(items), True
    return [items], False


def _data(x: Any) -> jax.Array:
    if isinstance(x, Tensor):
        return x.array
    if isinstance(x, CTensor):  # SINGA's examples pass ``t.data``
        return x._array
    return jnp.asarray(x)


def _write_back(items: List[Any], new: List[jax.Array], as_list: bool) -> Any:
    """Rebind each Tensor of ``items`` to its new array (in place, as SINGA's communicator
    writes into the buffers); return the items in the caller's shape, arrays replaced by their
    new values (arrays are immutable, so that is how a caller passing arrays gets the result)."""
    out = []
    for t, a in zip(items, new):
        if isinstance(t, Tensor):
            t.array = a
            out.append(t)
        elif isinstance(t, CTensor):  # a Tensor's ``.data`` rebinds its Tensor
            t._array = a
            out.append(t)
        else:
            out.append(a)
    return out if as_list else out[0]


def _partitions(sizes: Sequence[int], threshold: int) -> List[List[int]]:
    """SINGA's fusion groups of tensors (indices, in backward order): a tensor larger than
    ``threshold`` values is a group on its own; smaller ones are fused in order until the group
    holds more than ``threshold`` values; the remainder forms the last group."""
    groups: List[List[int]] = []
    pending, pending_size = [], 0
    for i, size in enumerate(sizes):
        if size > threshold:
            groups.append([i])
            continue
        pending.append(i)
        pending_size += size
        if pending_size > threshold:
            groups.append(pending)
            pending, pending_size = [], 0
    if pending:
        groups.append(pending)
    return groups


def _is_traced(arrays: Sequence[Any]) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


# ------------------------------------------------------------------------------------------
# DistOpt
# ------------------------------------------------------------------------------------------
class DistOpt:
    """SINGA's distributed optimizer wrapper: data-parallel training over processes and devices.

    Args:
        opt: the optimizer to wrap (default ``SGD()``, made here, not at import).
        nccl_id: a ``singa_wrap.NcclIdHolder`` made in the parent process (its coordinator
            address); None joins the cluster a launcher describes, or runs as the only rank.
        local_rank: this process's rank (with ``nccl_id``); SINGA's rank on its node.
        world_size: the number of processes.
        buffSize: SINGA's fusion buffer size; accepted (XLA combines all-reduces itself).

    Attributes ``world_size``, ``global_rank`` and ``local_rank`` are SINGA's. Attributes not
    defined here (``step_counter``, ``get_states``, ...) are those of the wrapped optimizer.
    """

    def __init__(self, opt: Optional[Optimizer] = None, nccl_id: Any = None,
                 local_rank: Optional[int] = None, world_size: Optional[int] = None,
                 buffSize: int = 4194304):
        if opt is None:
            opt = SGD()
        if not isinstance(opt, Optimizer):
            raise TypeError(f"DistOpt: opt must be an Optimizer, got {type(opt).__name__}")
        if isinstance(buffSize, bool) or not isinstance(buffSize, numbers.Integral) or buffSize <= 0:
            raise ValueError(f"DistOpt: buffSize must be a positive int, got {buffSize!r}")
        if nccl_id is None and local_rank is not None and world_size is None:
            raise ValueError("DistOpt: local_rank without nccl_id/world_size; pass "
                             "nccl_id=NcclIdHolder(), local_rank and world_size together")
        cluster, local = _join(nccl_id, local_rank, world_size)
        self.opt = opt
        self.nccl_id = nccl_id
        self.buffSize = int(buffSize)
        self._cluster = cluster
        self.world_size = cluster.world_size
        self.global_rank = cluster.global_rank
        self.local_rank = local
        self._spmd = SpmdStep(self) if cluster.world_size * cluster.num_local > 1 else None

    def __getattr__(self, name: str) -> Any:
        opt = self.__dict__.get("opt")
        if opt is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(opt, name)

    def _static_key(self) -> Tuple:
        """What a compiled step bakes in: the SPMD layout and the wrapped optimizer's key."""
        return (DistOpt, self._spmd, self.opt._static_key())

    def __call__(self, loss: Tensor) -> None:
        self.backward_and_update(loss)

    def update(self, param: Tensor, grad: Tensor) -> None:
        """Update one parameter with an all-reduced gradient: ``grad`` is divided by
        ``world_size`` in place (as SINGA does), then the wrapped optimizer updates."""
        if self.world_size != 1:
            grad.array = grad.array / self.world_size
        self.opt.update(param, grad)

    # --- the sums over ranks (eager, or psum inside a compiled SPMD step) -----------------------
    def _sum(self, arrays: List[Any], half: bool = False, clip: Optional[float] = None,
             scale: float = 1.0, of_rank_values: bool = False) -> List[Any]:
        """Each array summed over the ranks (optionally clipped and sent as float16), times
        ``scale``."""
        spmd = _SPMD_BODY.get()
        if spmd is not None:
            if half or clip is not None:
                if not of_rank_values:
                    arrays, of_rank_values = spmd.rank_values(arrays), True
                if clip is not None:
                    arrays = [jnp.clip(a, -clip, clip) for a in arrays]
                dtypes = [a.dtype for a in arrays]
                arrays = [s.astype(d) for s, d in zip(spmd.sum_over_ranks(
                    [a.astype(jnp.float16) for a in arrays], True), dtypes)]
            else:
                arrays = spmd.sum_over_ranks(arrays, of_rank_values)
            return [a * scale for a in arrays] if scale != 1 else arrays
        if self.world_size > 1 and _is_traced(arrays):
            raise RuntimeError(
                "DistOpt: a collective inside a jax trace that is not graph mode's SPMD step; "
                "with several ranks, train through Model (graph or eager mode)")
        if self.world_size == 1 and not half and clip is None:
            return [a * scale for a in arrays] if scale != 1 else list(arrays)
        return self._cluster.sum_over_ranks(list(arrays), half, clip, scale)

    def _rank_values(self, arrays: List[Any]) -> List[Any]:
        spmd = _SPMD_BODY.get()
        return spmd.rank_values(arrays) if spmd is not None else list(arrays)

    # --- SINGA's collectives ------------------------------------------------------------------
    def all_reduce(self, tensor: Any) -> Any:
        """Sum ``tensor`` (a Tensor, rebound in place, or an array) over all ranks; returns it."""
        return self.fused_all_reduce(tensor)

    def fused_all_reduce(self, tensor: Any, send: bool = True) -> Any:
        """Sum a list of tensors over all ranks in one collective; ``send=False`` only stages
        them (SINGA's buffer filling: nothing changes until a call with ``send=True``)."""
        items, as_list = _arrays_of(tensor)
        if not send or not items:
            return tensor
        return _write_back(items, self._sum([_data(t) for t in items]), as_list)

    def all_reduce_half(self, tensor: Any) -> Any:
        """All-reduce in float16 (each rank's values rounded to float16, summed in float16)."""
        return self.fused_all_reduce_half(tensor)

    def fused_all_reduce_half(self, tensor: Any, send: bool = True) -> Any:
        """Fused float16 all-reduce; ``send=False`` only stages the tensors (no change yet)."""
        items, as_list = _arrays_of(tensor)
        if not send or not items:
            return tensor
        return _write_back(items, self._sum([_data(t) for t in items], half=True), as_list)

    def sparsification(self, tensor: Any, accumulation: Any, spars: float, topK: bool) -> Any:
        """Sparsified all-reduce of one tensor (see :meth:`fused_sparsification`)."""
        return self.fused_sparsification(tensor, accumulation, spars, topK)

    def fused_sparsification(self, tensor: Any, accumulation: Any, spars: float,
                             topK: bool) -> Any:
        """Sparsified all-reduce of the concatenation of ``tensor`` (a tensor or a list).

        Each rank keeps the values with ``|x| >= spars`` (``topK=False``) or its
        ``ceil(spars * size)`` largest by magnitude (``topK=True``), the others become zero, and
        the kept values are summed over the ranks. When ``accumulation`` is given it is added
        first and receives what the rank did not send (SINGA's ``corr``).
        """
        items, as_list = _arrays_of(tensor)
        spars = _check_real("DistOpt.sparsification", "spars", spars)
        if spars < 0 or (topK and spars > 1):
            raise ValueError(f"DistOpt.sparsification: spars must be >= 0 (and <= 1 with topK), "
                             f"got {spars}")
        arrays = [_data(t) for t in items]
        acc = None if accumulation is None else _data(accumulation)
        total = sum(int(a.size) for a in arrays)
        if acc is not None and acc.size != total:
            raise ValueError(f"DistOpt.sparsification: accumulation has {acc.size} values but the "
                             f"tensors have {total}")
        sent, new_acc = _sparsify(self._rank_values(arrays), acc, spars, bool(topK))
        if isinstance(accumulation, Tensor):
            accumulation.array = new_acc
        return _write_back(items, self._sum(sent, of_rank_values=True), as_list)

    def wait(self) -> None:
        """SINGA waits for its communication streams; XLA orders the collectives itself."""

    # --- backward + update --------------------------------------------------------------------
    def _update_averaged(self, pairs: List[Tuple[Tensor, Tensor]], summed: List[Any]) -> None:
        """Update every parameter with its summed gradient / world_size (one fused kernel)."""
        for (_, g), s in zip(pairs, summed):
            g.array = s
        self.opt._apply_all(pairs)
        self.opt.step()

    def backward_and_update(self, loss: Tensor, threshold: int = 2097152) -> None:
        """Backward from ``loss``, sum the gradients over the ranks, divide by ``world_size``,
        update every parameter and step. ``threshold`` (SINGA's fusion size) is accepted: XLA
        combines the all-reduces of one step itself."""
        pairs = list(_backward(loss))
        summed = self._sum([g.array for _, g in pairs], scale=1.0 / self.world_size)
        self._update_averaged(pairs, summed)

    def backward_and_update_half(self, loss: Tensor, threshold: int = 2097152,
                                 clipping: bool = False, clip_Value: float = 100) -> None:
        """As :meth:`backward_and_update`, with gradients optionally clipped to
        ``[-clip_Value, clip_Value]`` and communicated (so rounded and summed) in float16."""
        pairs = list(_backward(loss))
        for p, _ in pairs:
            if p.dtype != _tensor.float32:
                raise TypeError(f"DistOpt.backward_and_update_half: param {p.name!r} is "
                                f"{p.dtype}; only float32 params are sent as float16")
        clip = _check_real("DistOpt", "clip_Value", clip_Value) if clipping else None
        summed = self._sum([g.array for _, g in pairs], half=True, clip=clip,
                           scale=1.0 / self.world_size) if pairs else []
        self._update_averaged(pairs, summed)

    def backward_and_partial_update(self, loss: Tensor, threshold: int = 2097152) -> None:
        """SINGA's model averaging: every parameter is updated with its rank's own gradient, then
        one partition of the parameters (SINGA's fusion groups by ``threshold``, round robin, one
        per call) is averaged over the ranks. ``self.partial`` (a Tensor, so a compiled step
        advances it) is SINGA's counter: the partition averaged last, 0 after a full cycle."""
        pairs = list(_backward(loss))
        if _SPMD_BODY.get() is not None:  # the rank's gradient: the mean of its devices'
            for (_, g), v in zip(pairs, self._rank_values([g.array for _, g in pairs])):
                g.array = v
        self.opt._apply_all(pairs)
        params = [p for p, _ in pairs]
        groups = _partitions([p.size() for p in params], threshold)
        if "partial" not in self.__dict__:
            self.partial = _state_tensor(jnp.zeros((1,), jnp.int32), self.opt.step_counter.device)
        if groups:
            counter = self.partial.array
            new_values, counter = self._average_partition([p.array for p in params], groups,
                                                          counter)
            for p, a in zip(params, new_values):
                p.array = a
            self.partial.array = counter
        self.opt.step()

    def _average_partition(self, values: List[Any], groups: List[List[int]], counter: Any):
        """``values`` with partition ``counter + 1`` (1-based, round robin) averaged over the
        ranks, and the next counter (0 after the last partition)."""
        count = len(groups)

        def average(j: int, vals: List[Any]) -> List[Any]:
            vals = list(vals)
            idx = groups[j]
            for i, a in zip(idx, self._sum([vals[i] for i in idx], scale=1.0 / self.world_size,
                                           of_rank_values=True)):
                vals[i] = a
            return vals

        if not _is_traced([counter]):
            j = int(np.asarray(counter).reshape(-1)[0]) % count
            nxt = 0 if j + 1 == count else j + 1
            return average(j, values), jnp.full((1,), nxt, jnp.int32)
        j = counter.reshape(()) % count
        branches = [partial(average, k) for k in range(count)]
        new_values = jax.lax.switch(j, branches, list(values))
        nxt = jnp.where(j + 1 == count, 0, j + 1).astype(jnp.int32).reshape((1,))
        return new_values, nxt

    def backward_and_sparse_update(self, loss: Tensor, threshold: int = 2097152,
                                   spars: float = 0.05, topK: bool = False,
                                   corr: bool = True) -> None:
        """Backward, sparsified all-reduce of the gradients, update, step.

        As in SINGA, the gradients are grouped like :meth:`backward_and_partial_update`'s
        partitions and each group is sparsified as one vector (see
        :meth:`fused_sparsification`). With ``corr`` each group keeps a local accumulation of
        what the rank did not send (``self.gradAccumulation``), added back at the next call.
        """
        pairs = list(_backward(loss))
        grads = [g for _, g in pairs]
        groups = [[grads[i] for i in grp] for grp in _partitions([g.size() for g in grads],
                                                                  threshold)]
        if corr and not getattr(self, "sparsInit", False):
            self.gradAccumulation = [
                _state_tensor(jnp.zeros((sum(g.size() for g in grp),), jnp.float32), grp[0].device)
                for grp in groups]
            self.sparsInit = True
        if corr and [a.size() for a in self.gradAccumulation] != [
                sum(g.size() for g in grp) for grp in groups]:
            raise ValueError(f"DistOpt.backward_and_sparse_update: the gradient groups changed "
                             f"since the accumulations were made (threshold={threshold}); keep the "
                             f"model and threshold fixed when corr=True")
        for k, grp in enumerate(groups):
            acc = self.gradAccumulation[k] if corr else None
            self.fused_sparsification(grp, acc, spars, topK)
        if self.world_size != 1:
            for g in grads:
                g.array = g.array / self.world_size
        self.opt._apply_all(pairs)
        self.opt.step()
