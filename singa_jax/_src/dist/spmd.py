"""Graph mode under ``DistOpt``: the whole training step as one SPMD program per process,
``shard_map`` over the mesh ``('rank', 'local')`` of every device, the batch split along its first
dimension and DistOpt's sums as ``lax.psum`` (:class:`SpmdStep`, used by :mod:`singa_jax._src.graph.runner`).

Also what the state on the mesh means outside that program: a call that is not DistOpt's step
(eager, graph-mode evaluation) brings it back to each Tensor's device
(:func:`bring_state_home`), and reading a value sharded over several processes' devices gathers
it, on every rank at once (:func:`host_value`)."""
from __future__ import annotations

import contextvars
import re
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.runtime.cluster import LOCAL, RANK, agree
from singa_jax._src.runtime.mesh import gathered, on_device
from singa_jax._src.graph.layout import tensors_in

if TYPE_CHECKING:
    from singa_jax._src.dist.dist import DistOpt

# ------------------------------------------------------------------------------------------
# Graph mode: the whole data-parallel step as one SPMD program
# ------------------------------------------------------------------------------------------
# The SpmdStep whose shard_map body is being traced on this thread (DistOpt's sums become psum).
SPMD_BODY: contextvars.ContextVar[Optional["SpmdStep"]] = contextvars.ContextVar(
    "singa_jax.spmd_body", default=None)


class SpmdStep:
    """How graph mode runs a training step of a Model whose optimizer is a DistOpt.

    :meth:`trace` traces the step under ``shard_map`` over the mesh ``(rank, local)``: state
    replicated (each process holds its own copy, so per-rank state such as batch-norm statistics
    stays per rank) except, with ``DistOpt(shard_optimizer_state=True)``, the optimizer's slots,
    sharded over every device (:meth:`spec_of`); device keys replicated; every Tensor argument
    split along its first dimension over all devices (each rank's batch over its local devices).
    Results with the batch as first dimension are gathered back to the rank's batch; other
    results (the loss) are the mean of the rank's devices. :meth:`compile` compiles it; the
    returned :class:`_SpmdProgram` takes the state as global arrays laid out over the mesh (it
    places a Tensor's single-device array once, when it first meets it) and returns the new
    state the same way, in the donated buffers: the state then lives on the mesh between steps
    and a step moves only what the algorithm's collectives move.
    """

    def __init__(self, dist: "DistOpt"):
        self._dist = weakref.ref(dist)
        self.cluster = dist._cluster
        mesh = self.cluster.mesh
        self.replicated = NamedSharding(mesh, P())
        self.split = NamedSharding(mesh, P((RANK, LOCAL)))
        self.by_rank = NamedSharding(mesh, P(RANK))
        self.devices = self.cluster.world_size * self.cluster.num_local  # of the whole run
        self._result_order: List[int] = []
        self._state_specs: List[P] = []
        # specs of values the body returns as new Tensors (a ZeRO slot born in the step), by the
        # identity of the traced value (DistOpt registers them while the body is traced)
        self._born_specs: Dict[int, P] = {}
        # shard_parameters: a full parameter value inside the body -> (itself, this device's
        # shard of it), for the values gathered from a shard (the step's input, an updated
        # part), so that the step returns that shard rather than slicing the gathered value
        self._shards: Dict[int, Tuple[Any, Any]] = {}
        self.last_compiled: Any = None  # the last compiled step (its HLO: bench_dist, tests)

    # -- layout of the state over the mesh ----------------------------------------------------
    def spec_of(self, t: Tensor) -> P:
        """Where state Tensor ``t`` lives: replicated, or split over every device along its
        first dimension divisible by the device count (:func:`zero_dim`; a Tensor with none
        stays replicated) when it is a slot of the wrapped optimizer under
        ``shard_optimizer_state`` or a parameter under ``shard_parameters``."""
        dist = self._dist()
        if dist is None or not dist.shard_optimizer_state:
            return P()
        if (dist.shard_parameters and _is_parameter(t)) or id(t) in _slot_ids(dist):
            return zero_spec(tuple(t.shape), self.devices)
        return P()

    def sharding(self, spec: P) -> NamedSharding:
        return self.replicated if spec == P() else NamedSharding(self.cluster.mesh, spec)

    def register_born(self, value: Any, spec: P) -> None:
        """Inside the body: ``value`` (a new Tensor's traced array) leaves the step as ``spec``."""
        self._born_specs[id(value)] = spec

    # -- inside the body: sharded parameters (shard_parameters) ----------------------------------
    def register_gathered(self, full: Any, shard: Any) -> None:
        """Inside the body: ``full`` was all-gathered from this device's ``shard``."""
        self._shards[id(full)] = (full, shard)

    def shard_of(self, value: Any, dim: int) -> Any:
        """Inside the body: this device's part of the full value ``value`` along ``dim`` (the
        shard it was gathered from, when it was: no slicing, and the gather can go unused)."""
        known = self._shards.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        part = value.shape[dim] // self.devices
        index = jax.lax.axis_index(ZERO_AXES)
        return jax.lax.dynamic_slice_in_dim(value, index * part, part, axis=dim)

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
        agree(cluster, f"compiling {where}", "ERROR: " + problem if problem else signature)
        if problem:
            raise ValueError(problem)
        per_shard_batch = batch[0].shape[0] // m
        specs = self._state_specs = [self.spec_of(t) for t in state]
        self._born_specs = {}
        extra_specs: List[P] = []  # filled when the body returns (shard_map reads it then)
        dist = self._dist()
        optimizer_ids = {id(t) for t in _tensors_of(dist)} if dist is not None else set()
        layer_state = [i for i, t in enumerate(state)
                       if not t.stores_grad and id(t) not in optimizer_ids
                       and jnp.issubdtype(t.dtype, jnp.floating)]
        # shard_parameters: the parameters come in (and leave) as this device's shard; the step
        # computes with their whole values, all-gathered here (FSDP)
        sharded_params = [(i, zero_dim(tuple(t.shape), self.devices)) for i, t in enumerate(state)
                          if specs[i] != P() and _is_parameter(t)]

        def body(state_arrays, keys, batch):
            self._shards = {}
            state_arrays = list(state_arrays)
            for i, d in sharded_params:
                full = jax.lax.all_gather(state_arrays[i], ZERO_AXES, axis=d, tiled=True)
                self.register_gathered(full, state_arrays[i])
                state_arrays[i] = full
            token = SPMD_BODY.set(self)
            try:
                new_state, new_keys, extra, results = step(state_arrays, keys, batch)
            finally:
                SPMD_BODY.reset(token)
            if sharded_params:
                new_state = list(new_state)
                for i, d in sharded_params:  # (a parameter without gradient: its input shard)
                    new_state[i] = self.shard_of(new_state[i], d)
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
            extra_specs[:] = [self._born_specs.get(id(e), P()) for e in extra]
            gather = (lambda r: r) if m == 1 else \
                (lambda r: jax.lax.all_gather(r, LOCAL, axis=0, tiled=True))
            mean = (lambda r: r) if m == 1 else \
                (lambda r: jax.lax.pmean(r, LOCAL) if jnp.issubdtype(r.dtype, jnp.inexact)
                 else r)
            return (new_state, new_keys, extra, [gather(results[i]) for i in batched],
                    [mean(results[i]) for i in others])

        # shard_map reads out_specs after tracing the body, so the specs of the values the body
        # creates (extra_specs) can be known only then; the new state keeps its input's layout
        program = jax.shard_map(body, mesh=cluster.mesh,
                                in_specs=(specs, P(), P((RANK, LOCAL))),
                                out_specs=(specs, P(), extra_specs, P(RANK), P()),
                                check_vma=False)
        state_avals = [self._global_aval(a, self.sharding(spec))
                       for a, spec in zip(state_arrays, specs)]
        try:
            return jax.jit(program).trace(state_avals, self._global_avals(keys, self.replicated),
                                          self._global_avals(batch, self.split)).jaxpr
        finally:
            self._shards = {}  # (tracers: not kept past the trace)

    def _global_aval(self, a: Any, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
        shape = tuple(a.shape)
        if sharding is self.split:
            shape = (shape[0] * self.cluster.world_size,) + shape[1:]
        return jax.ShapeDtypeStruct(shape, a.dtype, sharding=sharding)

    def _global_avals(self, arrays: list, sharding: NamedSharding) -> list:
        return [self._global_aval(a, sharding) for a in arrays]

    def compile(self, program: Callable, donated: list, read: list, batch: list,
                options_for: Callable[[Any], Optional[dict]],
                donated_holders: Sequence[int] = (), read_holders: Sequence[int] = ()
                ) -> "_SpmdProgram":
        """Compile ``program(donated, read, batch)`` (graph mode's trimmed step) for the mesh,
        with the options ``options_for(lowered program)``. ``donated_holders`` /
        ``read_holders`` are the inputs' indices among the traced state and keys (their
        layout: :meth:`spec_of`, keys replicated)."""
        n = len(self._state_specs)

        def shardings(holders: Sequence[int], count: int) -> List[NamedSharding]:
            if len(holders) != count:  # a caller that does not say: all replicated
                return [self.replicated] * count
            return [self.sharding(self._state_specs[i]) if i < n else self.replicated
                    for i in holders]

        s_donated = shardings(donated_holders, len(donated))
        s_read = shardings(read_holders, len(read))
        lowered = jax.jit(program, donate_argnums=0,
                          in_shardings=(s_donated, s_read, [self.split] * len(batch))).lower(
            [self._global_aval(a, s) for a, s in zip(donated, s_donated)],
            [self._global_aval(a, s) for a, s in zip(read, s_read)],
            self._global_avals(batch, self.split))
        compiled = lowered.compile(options_for(lowered))
        self.last_compiled = compiled
        return _SpmdProgram(self, compiled, donated, read, batch, list(self._result_order),
                            s_donated, s_read,
                            read_keys=[i >= n for i in read_holders]
                            if len(read_holders) == len(read) else [False] * len(read),
                            n_state_donated=sum(i < n for i in donated_holders)
                            if len(donated_holders) == len(donated) else len(donated))


def _tensors_of(dist: "DistOpt") -> List[Tensor]:
    """Every Tensor a DistOpt and its optimizer hold (slots, counters, accumulations)."""
    return tensors_in([dist.opt, {k: v for k, v in vars(dist).items() if k != "opt"}])


def _is_parameter(t: Tensor) -> bool:
    """Whether state Tensor ``t`` is a trainable parameter (``shard_parameters`` splits it)."""
    return bool(t.stores_grad) and jnp.issubdtype(t.dtype, jnp.floating)


def _slot_ids(dist: "DistOpt") -> set:
    """Ids of the wrapped optimizer's slot Tensors (momentum, Adam's m and v, ...)."""
    opt = dist.opt
    return {id(t) for kind in opt._slot_kinds for t in opt._slot_dict(kind).values()}


def zero_dim(shape: Tuple[int, ...], devices: int) -> Optional[int]:
    """The dimension a ZeRO-sharded slot (and its parameter's update) is split along over
    ``devices``: the first one divisible by ``devices`` (None: kept whole and replicated).
    The slot keeps the parameter's shape (checkpoints stay SINGA's), so no padding."""
    for d, n in enumerate(shape):
        if n % devices == 0 and n > 0:
            return d
    return None


# the shard order of a ZeRO-sharded value: local device major, rank minor (the order of the
# two-level reduce-scatter of ``half``: over a rank's devices, then over the ranks)
ZERO_AXES = (LOCAL, RANK)


def zero_spec(shape: Tuple[int, ...], devices: int) -> P:
    d = zero_dim(shape, devices)
    if d is None or devices == 1:
        return P()
    return P(*([None] * d + [ZERO_AXES]))


class _SpmdProgram:
    """A compiled SPMD step over global arrays.

    State comes in as global arrays laid out over the mesh (replicated, or ZeRO-sharded) and
    leaves the same way, its buffers donated and reused: between steps nothing is moved. A
    Tensor still holding a single-device array (the first step, a checkpoint just loaded, a
    value set eagerly) is placed over the mesh once; state only read is then kept placed
    (:attr:`placed_read`, written back by graph mode). The device keys go back to their
    devices as single-device arrays (eager code draws from them); their global form is cached
    by identity, so the next step moves nothing either. The batch is split over the devices,
    results come back as this rank's arrays."""

    def __init__(self, plan: SpmdStep, compiled, donated: list, read: list, batch: list,
                 result_order: List[int], s_donated: List[NamedSharding],
                 s_read: List[NamedSharding], read_keys: List[bool], n_state_donated: int):
        self.plan = plan
        self.cluster = plan.cluster
        self.compiled = compiled
        self._expected = [[(tuple(a.shape), np.dtype(a.dtype)) for a in group]
                          for group in (donated, read, batch)]
        self.args_info = tuple([jax.ShapeDtypeStruct(s, d) for s, d in group]
                               for group in self._expected)
        self._restore_order = np.argsort(result_order).tolist() if result_order else []
        self._s_donated, self._s_read = s_donated, s_read
        self._n_state_donated = n_state_donated
        self._read_keys = read_keys
        self._keys: Dict[int, Tuple[jax.Array, jax.Array]] = {}  # local key -> its global form
        self.placed_read: Optional[list] = None  # read state placed by the last call, if any

    def place(self, a: jax.Array, sharding: NamedSharding) -> jax.Array:
        """``a`` laid out as ``sharding``: itself when it already is (every step after the
        first), else a global array made from this rank's value (a transfer, once)."""
        current = a.sharding
        if current == sharding:
            return a
        # a program's output may describe the same layout differently (its own spec form)
        if len(current.device_set) > 1 and current.is_equivalent_to(sharding, a.ndim):
            return a
        cl = self.cluster
        if not a.is_fully_addressable or len(a.sharding.device_set) > 1:
            return jax.device_put(a, sharding)  # another layout over the mesh: reshard
        first = cl.on_rank_device(a)
        if sharding is self.plan.replicated or sharding.is_fully_replicated:
            pieces = [first] + (jax.device_put([first] * (cl.num_local - 1),
                                               cl.local_devices[1:])
                                if cl.num_local > 1 else [])
            return jax.make_array_from_single_device_arrays(tuple(a.shape), sharding, pieces)
        # a ZeRO shard per device: each process supplies its own devices' slices
        return jax.make_array_from_callback(tuple(a.shape), sharding, lambda idx: first[idx])

    def _key(self, k: jax.Array) -> jax.Array:
        cached = self._keys.get(id(k))
        if cached is not None and cached[0] is k:
            return cached[1]
        return self.place(k, self.plan.replicated)

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
        n = self._n_state_donated
        g_donated = [self.place(a, s) for a, s in zip(donated[:n], self._s_donated)] + \
            [self._key(k) for k in donated[n:]]
        g_read = [self._key(a) if is_key else self.place(a, s)
                  for a, s, is_key in zip(read, self._s_read, self._read_keys)]
        changed = any(g is not a for g, a, is_key in zip(g_read, read, self._read_keys)
                      if not is_key)
        self.placed_read = g_read if changed else None
        new_state, new_keys, extra, results = self.compiled(g_donated, g_read,
                                                            [self._split(a) for a in batch])
        local_keys = [self._local(g) for g in new_keys]
        self._keys = {id(a): (a, g) for a, g in zip(local_keys, new_keys)}
        for a, g, is_key in zip(read, g_read, self._read_keys):  # keys only read: keep
            if is_key:                                              # their global form
                self._keys[id(a)] = (a, g)
        local_results = [self._local(r) for r in results]
        local_results = [local_results[i] for i in self._restore_order]
        return list(new_state), local_keys, list(extra), local_results


# ------------------------------------------------------------------------------------------
# The state on the mesh outside DistOpt's step: other calls, and reading values
# ------------------------------------------------------------------------------------------
# A Model's flag (in its __dict__): the kinds of its calls (True: training, False: evaluation)
# whose declared state may still lie on the mesh since its last DistOpt step
_ON_MESH = "_distopt_state_on_mesh"


def state_entered_mesh(model: Any) -> None:
    """Before ``model``'s DistOpt step: its state will live on the mesh afterwards."""
    model.__dict__[_ON_MESH] = {True, False}


def bring_state_home(model: Any, declared: Sequence[Tensor], training: bool) -> None:
    """Before a call of ``model`` that is not its DistOpt step (eager, or graph-mode
    evaluation, which compute on the rank's device): the state that lies on the mesh is
    brought to each Tensor's device -- an evaluation call's ``declared`` state (the layers'),
    or for a training call everything the step held (the optimizers' slots, hyper-parameter
    values and guard state, which graph mode found while tracing, too). Nothing is checked per
    call once done: a training call's state includes an evaluation call's, and the next
    DistOpt step flags both again (and places the state on the mesh once more: a copy per
    local device, or a slice per device for sharded state)."""
    pending = model.__dict__.get(_ON_MESH)
    if not pending or training not in pending:
        return
    if training:
        to_own_devices([*declared, *model._graph_runner.discovered])
        pending.clear()
    else:
        to_own_devices(declared)
        pending.discard(False)


def to_own_devices(tensors: Sequence[Tensor]) -> None:
    """Rebind every Tensor whose array lies over several devices to its whole value on its own
    device (``t.device``): a replicated array gives its shard there (no copy); a sharded one is
    gathered -- with one collective over every process when it spans other processes' devices
    (every rank must then get here: a rank alone raises TimeoutError, see :func:`~singa_jax._src.runtime.mesh.gathered`)."""
    across = []
    for t in tensors:
        a = t._data
        if not isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer) or \
                len(a.sharding.device_set) < 2:
            continue
        if a.is_fully_replicated:
            t._data = on_device(a, t.device.jax_device)
        elif a.is_fully_addressable:
            t._data = jax.device_put(a, t.device.jax_device)
        else:
            across.append(t)
    if across:
        whole = gathered([t._data for t in across],
                          "an eager or evaluation call gathering the model's state split over "
                          "the processes' devices (shard_parameters): every rank must make it")
        for t, a in zip(across, whole):
            t._data = on_device(a, t.device.jax_device)


# ------------------------------------------------------------------------------------------
# What a compiled step communicates (benchmarks/bench_dist.py, tests/test_dist_placement.py)
# ------------------------------------------------------------------------------------------
_COLLECTIVE = re.compile(
    r"=\s*(\([^()]*\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(")
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_GROUPS = re.compile(r"replica_groups=(\{\{[0-9,]*\}|\[[0-9]+,([0-9]+)\])")


def collectives(hlo_text: str) -> List[Dict[str, Any]]:
    """The collectives of a compiled step's HLO (``Compiled.as_text()``): per op its ``kind``
    (all-reduce, reduce-scatter, all-gather, collective-permute, all-to-all), ``dtypes`` and
    ``bytes``, the data one device hands to it: the reduced values of an all-reduce, the
    values to reduce and scatter of a reduce-scatter (its result times the group size), the
    gathered result of an all-gather. ``group``: how many devices take part."""
    out = []
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if m is None or "-done(" in line:
            continue
        shapes, kind = m.group(1), m.group(2)
        arrays = _ARRAY.findall(shapes)
        nbytes = 0
        for dtype, dims in arrays:
            size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
            nbytes += size * np.dtype(_HLO_DTYPES.get(dtype, "float32")).itemsize
        g = _GROUPS.search(line)
        group = 1
        if g is not None:
            group = int(g.group(2)) if g.group(2) else len(g.group(1)[2:-1].split(","))
        if kind == "reduce-scatter":
            nbytes *= group
        out.append({"kind": kind, "dtypes": sorted({d for d, _ in arrays}), "bytes": nbytes,
                    "group": group})
    return out


_HLO_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "float16", "f64": "float64",
               "s32": "int32", "u32": "uint32", "s64": "int64", "u64": "uint64", "s8": "int8",
               "u8": "uint8", "pred": "bool", "s16": "int16", "u16": "uint16"}
