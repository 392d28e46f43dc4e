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
    *Graph mode*: a Model whose optimizer is a DistOpt compiles its whole training step, collectives
    included, as ONE program per process: the step runs under ``shard_map`` over the mesh
    ``('rank', 'local')`` of all devices, the batch split along its first dimension, and
    DistOpt's sums become ``lax.psum`` (:class:`SpmdStep`, used by :mod:`singa_jax._src.graph.runner`). The
    model's parameters, buffers and optimizer slots then live on the mesh as global arrays
    (replicated; with ``shard_optimizer_state`` the slots sharded, ZeRO stage 1; with
    ``shard_parameters`` the parameters too, FSDP) and the step updates them in place (donated),
    so a step moves only its collectives' bytes. A call that is not this step (eager, graph-mode
    evaluation) first brings the model's state back to its device (:mod:`.spmd`).
    *Eager*: a gradient is summed over the ranks by one jitted reduction over a global array
    assembled (without copies) from every process's piece (:meth:`_Cluster.sum_over_ranks`).
    An eager step computes on one device per rank: a rank with several local devices computes
    on the first and is told once to use graph mode for all (:meth:`DistOpt._eager_check`).

The numbers are SINGA's: gradients summed over ranks and divided by ``world_size``; ``half`` sends
float16; ``partialUpdate`` averages one round-robin partition of the parameters per step;
``sparseTopK``/``sparseThreshold`` send the top-k / above-threshold values with the residual
kept for the next step (``corr``). A rank with several local devices contributes the mean of its
devices' gradients (the gradient of its own batch). Consistency between ranks (same shapes, all
present) is checked through the coordination service with a bounded time-out
(:func:`agree`), so a wrong launch raises on every rank instead of hanging.

A lost rank (killed, crashed, ended by an error) is noticed by every other rank within
``peer_timeout`` seconds (``SINGA_JAX_PEER_TIMEOUT``, default 20) through heartbeats in the
coordination service's key-value store: one line on stderr, ``PeerLostError`` in the main
thread, exit status 75 (:mod:`singa_jax._src.runtime.peer_watch`).
"""
from __future__ import annotations

import numbers
import warnings
from functools import partial
from typing import Any, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.runtime.ctensor import CTensor
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.optim.algorithms import SGD
from singa_jax._src.optim.optimizers import Optimizer, param_name, state_tensor
from singa_jax._src.optim.schedules import check_real
from singa_jax._src.runtime.cluster import TIMEOUT_ENV, join_run, sparsify, to_half
from singa_jax._src.dist.spmd import SPMD_BODY, ZERO_AXES, SpmdStep, zero_dim, zero_spec
from singa_jax._src.runtime.cluster import LOCAL, RANK
from singa_jax._src.base.dtypes import float32

__all__ = ["DistOpt", "SpmdStep", "TIMEOUT_ENV"]
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
        shard_optimizer_state: beyond SINGA (ZeRO stage 1, graph mode): every optimizer slot is
            split over all devices of the run along its first dimension divisible by their
            number (a slot with none stays replicated), each device updates its part of each
            parameter from a reduce-scattered gradient, and the updated parts are all-gathered.
            For models whose optimizer state does not fit one device; the numbers are those of
            ``plain`` (and ``half``). Slots keep their parameters' shapes: ``get_states()`` and
            checkpoints read and write them whole.
        shard_parameters: beyond SINGA (FSDP, graph mode; implies ``shard_optimizer_state``):
            the parameters are split like their slots between steps; the step all-gathers each
            for the forward and backward, reduce-scatters its gradient and updates the device's
            part, which it keeps. Reading a parameter (``to_numpy``, ``get_params``,
            checkpoints) gives its whole value.
        peer_timeout: beyond SINGA: seconds another rank may stay silent (no heartbeat) before
            it counts as lost (>= 1); then this rank writes one line to stderr, raises
            ``PeerLostError`` in its main thread and exits with status 75 (after a grace of a
            few seconds when the main thread is blocked in a collective). None:
            ``$SINGA_JAX_PEER_TIMEOUT``, else 20. Fixed when the process joins the run (the
            first DistOpt).

    Attributes ``world_size``, ``global_rank`` and ``local_rank`` are SINGA's. Attributes not
    defined here (``step_counter``, ``get_states``, ...) are those of the wrapped optimizer.
    """

    def __init__(self, opt: Optional[Optimizer] = None, nccl_id: Any = None,
                 local_rank: Optional[int] = None, world_size: Optional[int] = None,
                 buffSize: int = 4194304, shard_optimizer_state: bool = False,
                 shard_parameters: bool = False, peer_timeout: Optional[float] = None):
        if opt is None:
            opt = SGD()
        if not isinstance(opt, Optimizer):
            raise TypeError(f"DistOpt: opt must be an Optimizer, got {type(opt).__name__}")
        if isinstance(buffSize, bool) or not isinstance(buffSize, numbers.Integral) or buffSize <= 0:
            raise ValueError(f"DistOpt: buffSize must be a positive int, got {buffSize!r}")
        if nccl_id is None and local_rank is not None and world_size is None:
            raise ValueError("DistOpt: local_rank without nccl_id/world_size; pass "
                             "nccl_id=NcclIdHolder(), local_rank and world_size together")
        for name, value in (("shard_optimizer_state", shard_optimizer_state),
                            ("shard_parameters", shard_parameters)):
            if not isinstance(value, bool):
                raise TypeError(f"DistOpt: {name} must be a bool, got {value!r}")
        cluster, local = join_run(nccl_id, local_rank, world_size, peer_timeout)
        # sharded parameters are updated by the device holding their part, so their slots are
        # split alike: FSDP includes ZeRO stage 1
        self.shard_optimizer_state = shard_optimizer_state or shard_parameters
        self.shard_parameters = shard_parameters
        self.opt = opt
        self.nccl_id = nccl_id
        self.buffSize = int(buffSize)
        self._cluster = cluster
        self.world_size = cluster.world_size
        self.global_rank = cluster.global_rank
        self.local_rank = local
        self._spmd = SpmdStep(self) if cluster.world_size * cluster.num_local > 1 else None

    @property
    def mesh(self) -> "jax.sharding.Mesh":
        """The data-parallel mesh a graph-mode step runs over: axes ``('rank', 'local')``,
        every process's local devices (not in SINGA). A batch placed with
        ``NamedSharding(mesh, PartitionSpec(('rank', 'local')))`` is taken by the step as it
        is (see ``singa_jax.data.DeviceLoader``'s ``sharding=``)."""
        return self._cluster.mesh

    def __getattr__(self, name: str) -> Any:
        opt = self.__dict__.get("opt")
        if opt is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(opt, name)

    def _static_key(self) -> Tuple:
        """What a compiled step bakes in: the SPMD layout and the wrapped optimizer's key."""
        return (DistOpt, self._spmd, self.shard_optimizer_state, self.shard_parameters,
                self.opt._static_key())

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
        spmd = SPMD_BODY.get()
        if spmd is not None:
            if half or clip is not None:
                if not of_rank_values:
                    arrays, of_rank_values = spmd.rank_values(arrays), True
                if clip is not None:
                    arrays = [jnp.clip(a, -clip, clip) for a in arrays]
                dtypes = [a.dtype for a in arrays]
                arrays = [s.astype(d) for s, d in zip(spmd.sum_over_ranks(
                    [to_half(a) for a in arrays], True), dtypes)]
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
        spmd = SPMD_BODY.get()
        return spmd.rank_values(arrays) if spmd is not None else list(arrays)

    def _eager_check(self, what: str) -> None:
        """Training eagerly is one device per rank: a rank with several local devices computes
        on one of them (the same update from the same rank batch; batch-norm statistics over
        the whole rank batch) and is told once how to use them all; the sharded optimizer
        state (and sharded parameters) are graph mode's only. (docs/distributed.md says why
        eager mode is not SPMD.)"""
        if SPMD_BODY.get() is not None:
            return
        if self.shard_optimizer_state and self._spmd is not None:
            which = "shard_parameters" if self.shard_parameters else "shard_optimizer_state"
            raise RuntimeError(f"DistOpt.{what}: {which}=True needs graph mode "
                               f"(model.compile(..., use_graph=True))")
        if self._cluster.num_local > 1 and not self.__dict__.get("_warned_one_device"):
            self._warned_one_device = True
            warnings.warn(
                f"DistOpt.{what}: eager training computes on one device per rank, but this rank "
                f"has {self._cluster.num_local} local devices; compile the model with "
                f"use_graph=True (one program over every device, the batch split between them), "
                f"or start one process per device (JAX_LOCAL_DEVICE_IDS, one GPU per process) "
                f"to use them all", RuntimeWarning, stacklevel=3)

    def _zero_check(self, what: str) -> None:
        if self.shard_optimizer_state and SPMD_BODY.get() is not None:
            raise NotImplementedError(
                f"DistOpt.{what}: shard_optimizer_state=True (and shard_parameters=True) support "
                f"backward_and_update ('plain') and backward_and_update_half ('half'); partial "
                f"and sparse updates keep per-rank state, so construct the DistOpt without "
                f"them for those")

    def _zero_update(self, pairs: List[Tuple[Tensor, Tensor]], half: bool = False,
                     clip: Optional[float] = None) -> None:
        """ZeRO stage 1 inside the SPMD step: each device updates its part of every parameter
        (and holds only that part of its slots) from the reduce-scattered mean gradient, then
        the parts are all-gathered. A parameter with no dimension divisible by the device count
        is summed and updated whole, as in plain data parallelism. With ``shard_parameters``
        the part comes from the step's input (the parameter arrived as it) and the step
        returns the updated part: the final all-gather then has no use and is left out."""
        spmd = SPMD_BODY.get()
        world, m, devices = self.world_size, self._cluster.num_local, spmd.devices
        dims = [zero_dim(tuple(p.shape), devices) for p, _ in pairs]
        whole = [i for i, d in enumerate(dims) if d is None]
        if whole:
            summed = self._sum([pairs[i][1].array for i in whole], half=half, clip=clip,
                               scale=1.0 / world)
            for i, v in zip(whole, summed):
                pairs[i][1].array = v
        full_shapes = {}
        bad = jnp.zeros((), jnp.int32)
        for (p, g), d in zip(pairs, dims):
            if d is None:
                continue
            full_shapes[id(p)] = tuple(p.shape)
            grad = g.array
            if half:  # the rank's value rounded to float16, summed over the ranks in float16
                if m > 1:
                    grad = jax.lax.psum_scatter(grad, LOCAL, scatter_dimension=d, tiled=True) / m
                if clip is not None:
                    grad = jnp.clip(grad, -clip, clip)
                grad = to_half(grad)
                if world > 1:  # (over one rank: the rounding alone, no collective)
                    grad = jax.lax.psum_scatter(grad, RANK, scatter_dimension=d, tiled=True)
                grad = grad.astype(g.dtype) / world
            else:  # the mean over every device's gradient (= over the ranks' mean gradients)
                grad = jax.lax.psum_scatter(grad, ZERO_AXES, scatter_dimension=d,
                                            tiled=True) / (world * m)
            bad = bad + jnp.sum(~jnp.isfinite(grad)).astype(jnp.int32)
            p.array = spmd.shard_of(p.array, d)  # this device's part (local major, rank minor)
            g.array = grad
        loss = None
        if full_shapes and self.opt._guarded():
            # each device sees only its part: skip (or apply) the update on every device alike
            bad = jax.lax.psum(bad, ZERO_AXES)
            loss = Tensor(data=jnp.where(bad > 0, jnp.nan, 0.0).astype(jnp.float32),
                          device=pairs[0][0].device, requires_grad=False)
        self.opt._apply_all(pairs, loss)
        kinds = self.opt._active_slot_kinds()
        for (p, _), d in zip(pairs, dims):
            if d is None:
                continue
            shape = full_shapes[id(p)]
            key = self.opt._slot_key(param_name(p), p)
            for kind in kinds:  # a slot born in this step leaves it split, as it will stay
                spmd.register_born(self.opt._slot_dict(kind)[key].array,
                                   zero_spec(shape, devices))
            full = jax.lax.all_gather(p.array, ZERO_AXES, axis=d, tiled=True)
            spmd.register_gathered(full, p.array)
            p.array = full  # (the whole value for the rest of the step)
        self.opt.step()

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
        spars = check_real("DistOpt.sparsification", "spars", spars)
        if spars < 0 or (topK and spars > 1):
            raise ValueError(f"DistOpt.sparsification: spars must be >= 0 (and <= 1 with topK), "
                             f"got {spars}")
        arrays = [_data(t) for t in items]
        acc = None if accumulation is None else _data(accumulation)
        total = sum(int(a.size) for a in arrays)
        if acc is not None and acc.size != total:
            raise ValueError(f"DistOpt.sparsification: accumulation has {acc.size} values but the "
                             f"tensors have {total}")
        sent, new_acc = sparsify(self._rank_values(arrays), acc, spars, bool(topK))
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
        self._eager_check("backward_and_update")
        pairs = self.opt._gradients(loss)  # (loss-scaled under float16 autocast)
        if self.shard_optimizer_state and SPMD_BODY.get() is not None:
            return self._zero_update(pairs)
        summed = self._sum([g.array for _, g in pairs], scale=1.0 / self.world_size)
        self._update_averaged(pairs, summed)

    def backward_and_update_half(self, loss: Tensor, threshold: int = 2097152,
                                 clipping: bool = False, clip_Value: float = 100) -> None:
        """As :meth:`backward_and_update`, with gradients optionally clipped to
        ``[-clip_Value, clip_Value]`` and communicated (so rounded and summed) in float16."""
        self._eager_check("backward_and_update_half")
        pairs = self.opt._gradients(loss)  # (loss-scaled under float16 autocast)
        for p, _ in pairs:
            if p.dtype != float32:
                raise TypeError(f"DistOpt.backward_and_update_half: param {p.name!r} is "
                                f"{p.dtype}; only float32 params are sent as float16")
        clip = check_real("DistOpt", "clip_Value", clip_Value) if clipping else None
        if self.shard_optimizer_state and SPMD_BODY.get() is not None:
            return self._zero_update(pairs, half=True, clip=clip)
        summed = self._sum([g.array for _, g in pairs], half=True, clip=clip,
                           scale=1.0 / self.world_size) if pairs else []
        self._update_averaged(pairs, summed)

    def backward_and_partial_update(self, loss: Tensor, threshold: int = 2097152) -> None:
        """SINGA's model averaging: every parameter is updated with its rank's own gradient, then
        one partition of the parameters (SINGA's fusion groups by ``threshold``, round robin, one
        per call) is averaged over the ranks. ``self.partial`` (a Tensor, so a compiled step
        advances it) is SINGA's counter: the partition averaged last, 0 after a full cycle."""
        self._eager_check("backward_and_partial_update")
        self._zero_check("backward_and_partial_update")
        pairs = self.opt._gradients(loss)  # (loss-scaled under float16 autocast)
        if SPMD_BODY.get() is not None:  # the rank's gradient: the mean of its devices'
            for (_, g), v in zip(pairs, self._rank_values([g.array for _, g in pairs])):
                g.array = v
        self.opt._apply_all(pairs)
        params = [p for p, _ in pairs]
        groups = _partitions([p.size() for p in params], threshold)
        if "partial" not in self.__dict__:
            self.partial = state_tensor(jnp.zeros((1,), jnp.int32), self.opt.step_counter.device)
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
        self._eager_check("backward_and_sparse_update")
        self._zero_check("backward_and_sparse_update")
        pairs = self.opt._gradients(loss)  # (loss-scaled under float16 autocast)
        grads = [g for _, g in pairs]
        groups = [[grads[i] for i in grp] for grp in _partitions([g.size() for g in grads],
                                                                  threshold)]
        if corr and not getattr(self, "sparsInit", False):
            self.gradAccumulation = [
                state_tensor(jnp.zeros((sum(g.size() for g in grp),), jnp.float32), grp[0].device)
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


def spmd_of(static: Tuple) -> Optional[SpmdStep]:
    """The SPMD layout a Model's training step needs: that of its DistOpt, when the run has
    several ranks or several local devices (``static`` is the Model's optimizers' static keys)."""
    for key in static:
        if type(key) is tuple and key and key[0] is DistOpt and key[1] is not None:
            return key[1]
    return None
