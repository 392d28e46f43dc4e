"""Graph mode under ``DistOpt``: the whole training step as one SPMD program per process,
``shard_map`` over the mesh ``('rank', 'local')`` of every device, the batch split along its first
dimension and DistOpt's sums as ``lax.psum`` (:class:`SpmdStep`, used by :mod:`singa_jax.graph`)."""
from __future__ import annotations

import contextvars
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ..tensor import Tensor
from .cluster import LOCAL, RANK, _agree

if TYPE_CHECKING:
    from .dist import DistOpt

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
                options_for: Callable[[Any], Optional[dict]]) -> "_SpmdProgram":
        """Compile ``program(donated, read, batch)`` (graph mode's trimmed step) for the mesh,
        with the options ``options_for(lowered program)``."""
        repl, split = self.replicated, self.split
        lowered = jax.jit(program, donate_argnums=0,
                          in_shardings=([repl] * len(donated), [repl] * len(read),
                                        [split] * len(batch))).lower(
            self._global_avals(donated, repl), self._global_avals(read, repl),
            self._global_avals(batch, split))
        return _SpmdProgram(self, lowered.compile(options_for(lowered)), donated, read, batch,
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
