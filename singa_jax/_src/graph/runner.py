"""Graph mode: one training step (or one evaluation forward) as ONE compiled XLA program.

SINGA buffers the operators of ``train_one_batch`` into a graph and replays it. Here the very same
eager Python code runs once on JAX tracers inside ``jax.jit``; the resulting program is a pure
function

    (state arrays, device PRNG keys, batch arrays) -> (new state arrays, new keys, results)

and every later call with the same signature runs that program and writes the new arrays back
into the same :class:`~singa_jax.tensor.Tensor` objects. The compiled program is that function
trimmed by :class:`~.graph_layout.Layout`: it takes only the state (tensors and keys) the step
uses, donates the old buffers of only the state it rewrites, and returns only those new values.
:meth:`GraphRunner.export` lowers the last compiled program of a method again for other
platforms (``jax.export``), e.g. to show on a CPU machine that a step lowers for GPU and TPU.

What is state
    * the tensors the caller declares (a Model passes its parameters and layer states, e.g.
      batch-norm running statistics, and every Tensor reachable from its optimizers: slots, step
      counters, learning-rate values),
    * every Device's PRNG key (dropout masks and random fills advance it),
    * anything else the step touches, found by :class:`~.recorder.Recorder`, which is installed as
      ``tensor``'s trace hook and sees every ``Tensor.data`` read/write and Tensor creation.
      A first trace may meet such state: a layer first used inside the step builds its
      parameters, a pre-existing Tensor nobody declared (a mask kept on the model, a counter)
      is read, an optimizer creates its slots on its first update (a Model makes those before
      the trace and passes them as ``provisional`` state, so its usual step is traced and
      compiled once; see :meth:`GraphRunner.run`). A
      Tensor the trace reads is baked into that program as a constant (correct for this call:
      it equals the tensor's current value); one it writes, or creates and keeps, leaves the
      program as an extra output and gets its concrete value after the call. All of them join
      the state, that program runs once (compiled without the backend's expensive
      optimisations, since compiling is most of its cost) and the next call retraces with them
      as inputs; that program is the one reused from then on.

    :meth:`GraphRunner.prepare` traces and compiles a call without running it (a program
    compiled ahead: ``Model.compile_step``); a trace that meets state only a run could give
    values to is then undone and not compiled (:class:`ProgramNotKept`).

    Why not "discard the trace and retrace before running": a discarded trace cannot undo its
    Python side effects (a momentum buffer created during it stays in the optimizer holding a
    tracer). Running the first call eagerly instead was measured slower on this project's LeNet
    and MLP (6.6 s against about 4 s to the second step for LeNet), so it was removed.

What retraces
    The cache key is (method, training flag, the pytree structure and shapes/dtypes of the tensor
    arguments, the values of the non-tensor arguments, the identity/shape/dtype of every state
    tensor, the devices, the float32 matmul precision and the autocast dtype in force
    (:mod:`.precision`, ``autograd.autocast``), and what the caller says the program bakes in:
    a Model's optimizers' schedules and switches). A new batch size, a new static argument, a
    replaced or reshaped parameter, a new learning-rate schedule, a new precision, or newly
    discovered state gives a new program; programs live in
    the :class:`GraphRunner` owned by each Model.

What is not allowed
    Python control flow on tensor VALUES (``if loss > 0``, ``float(t)``, ``np.asarray(t.data)``)
    inside the step: it raises :class:`GraphModeError` suggesting ``use_graph=False``.
"""
from __future__ import annotations

import contextlib
import operator
import time
import warnings
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

import jax
import numpy as np

from singa_jax._src.base import checks, interrupts, observe
from singa_jax._src.backend import tiers as graph_tiers
from singa_jax._src.runtime import device as device_mod
from singa_jax._src.base.node import Dummy
from singa_jax._src.graph.compile_cause import describe
from singa_jax._src.graph import errors
from singa_jax._src.graph.recorder import Recorder
from singa_jax._src.graph.layout import (Layout, StepLowering, avals_of, birth_values, buffer_id,
                                         build_result, copy_shared, rebuild_leaves, result_outputs,
                                         unalias)
from singa_jax._src.backend.xla_options import compile_options, platform_of
from singa_jax._src.backend.precision import float32_matmul_precision
from singa_jax._src.base.modes import autocast_dtype, current_trace_hook, trace_hook
from singa_jax._src.tensor.tensor import Tensor

# (looked up here per call, so a test can watch what a step donates)
_copy_shared = copy_shared

__all__ = ["GraphRunner", "GraphModeError", "ProgramNotKept", "NOT_CACHED"]

# Errors JAX raises when Python code asks for the concrete value of a traced array.
_CONCRETE_VALUE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                          jax.errors.TracerArrayConversionError,
                          jax.errors.TracerIntegerConversionError)


# How many programs one call signature may keep for different sets of state tensors.
_PROGRAMS_PER_CALL = 4

# After this many consecutive one-off programs of a method, warn that every call compiles.
_ONE_OFFS_BEFORE_WARNING = 5
# After this many Model calls in a row that each compiled a new program of the same method
_COMPILES_BEFORE_WARNING = 5

class GraphModeError(TypeError):
    """The step cannot be compiled as one program (it branches on a tensor's value)."""


class ProgramNotKept(Exception):
    """:meth:`GraphRunner.prepare`: the traced step met state it can only take as input once it
    has run, so its program serves that one call and was not kept."""

    def __init__(self, where: str):
        super().__init__(f"graph mode: {where} meets new state on its first call (a layer or "
                         f"Tensor first made inside the step), so its program can only be "
                         f"kept once it has run")


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


# --- arguments: tensors are traced, everything else is static ------------------------------
def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


_STATIC_SCALARS = (str, int, float, bool)


@lru_cache(maxsize=None)
def _flat_tree(n: int):
    return jax.tree_util.tree_structure(((0,) * n, {}))


def _call_signature(args: tuple, kwargs: dict, owner: str, method: str
                    ) -> Tuple[Sequence[Any], Any, Tuple[Hashable, ...], list]:
    """The call's leaves (``tree_flatten((args, kwargs))`` with Tensors as leaves), their tree,
    what a program is compiled for (each Tensor's shape, dtype, autograd flags and device, each
    array's shape and dtype, each other value itself) and the arrays to pass (of the Tensors
    and arrays, in order).

    This runs on every step, so SINGA's usual call -- positional Tensors and plain values,
    ``train_one_batch(x, y, 'plain')`` -- skips the pytree flattening: its leaves are the
    arguments themselves."""
    if not kwargs and all(type(a) is Tensor or type(a) in _STATIC_SCALARS for a in args):
        leaves, tree = args, _flat_tree(len(args))
    else:
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_tensor)
    sig, arrays = [], []
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            data = leaf._data
            sig.append(("T", data.shape, data.dtype, leaf.requires_grad, leaf.stores_grad,
                        leaf.device))
            arrays.append(data)
        elif isinstance(leaf, (jax.Array, np.ndarray)):
            sig.append(("A", tuple(leaf.shape), np.dtype(leaf.dtype)))
            arrays.append(leaf)
        else:
            sig.append(_static_signature(leaf, owner, method))
    return leaves, tree, tuple(sig), arrays


def _static_signature(leaf: Any, owner: str, method: str) -> Hashable:
    try:
        hash(leaf)
    except TypeError:
        raise TypeError(f"graph mode: {owner}.{method} has a non-tensor argument of type "
                        f"{type(leaf).__name__} that is not hashable; non-tensor arguments are "
                        f"compiled in as constants and must be hashable (use tuples, not sets or "
                        f"arrays)") from None
    return ("S", type(leaf), leaf)


@dataclass
class _Program:
    """One compiled step and how its inputs/outputs map onto Python objects.

    ``compiled(donated, read, batch)`` takes the arrays of ``donated``/``donated_devices`` (state
    the step rewrites: its buffers are given to XLA), of ``read``/``read_devices`` (state it only
    reads) and the batch; it returns ``(new values of written, new keys of written_devices,
    values of extra_out, result arrays)``. ``written`` is the donated state plus state the step
    writes without reading it; state it neither reads nor writes is not passed at all."""
    compiled: Any
    donated: List[Tensor]
    donated_devices: List[device_mod.Device]
    read: List[Tensor]
    read_devices: List[device_mod.Device]
    written: List[Tensor]
    written_devices: List[device_mod.Device]
    extra_out: List[Tensor]          # outputs only: undeclared written / created-alive tensors
    result_tree: Any                 # treedef of the method's result
    result_kinds: List[Tuple]        # per result leaf: ("T", attributes) | ("A",) | ("S", value)
    cacheable: bool                  # False when the trace revealed state it did not take as input
    where: str                       # "Model.method", for messages
    state_ids: frozenset = frozenset()  # ids of the state Tensors it was traced over
    checked: bool = False            # outputs verified free of tracers (first run)
    input_checks: tuple = ()         # (batch position, check): run on the host before a run
    # the optimised program compiling in the background while ``compiled`` is the quick one
    # (graph_tiers); None once it serves the step, or for a step compiled once
    pending: Optional[graph_tiers.Pending] = None
    ran: Any = None  # the compiled program that has run once (its memory need fits)


class GraphRunner:
    """Compiles and caches one Model's steps; ``trace_count`` counts traces (for tests/logs)."""

    @property
    def active(self) -> bool:
        """Whether this thread is inside a trace (a compiled model called then runs inline)."""
        return current_trace_hook() is not None

    def __init__(self, owner_name: str = "model"):
        self.owner_name = owner_name
        self.programs: Dict[Hashable, _Program] = {}
        self._discovered: List[weakref.ref] = []  # state found by the recorder (weakly held)
        self.trace_count = 0
        self.compile_count = 0  # XLA compilations of whole steps (one per signature, normally)
        self.tiered_count = 0  # of them, steps compiled in two tiers (graph_tiers): 2 each
        self.last_compile_seconds = 0.0
        self.last_compile_options: Dict[str, Any] = {}  # XLA options of the last compile
        self._declared_ids: Tuple[Any, Tuple[int, ...]] = (None, ())
        self._last: Tuple[Any, Any] = (None, None)  # (key, program) of the last compiled call
        self._one_offs: Dict[str, int] = {}  # consecutive non-cacheable traces, per method
        # per method: the key of its last traced call, and (Model step of its last compile,
        # compiles on consecutive steps) -- a loop that compiles every step is told
        self._last_keys: Dict[str, Tuple] = {}
        self._compiled_at: Dict[str, Tuple[int, int]] = {}
        # the last compiled program of each "Owner.method", as export() lowers it again
        self._lowerings: Dict[str, StepLowering] = {}
        self._unused_provisional: List[Tensor] = []
        # Data-parallel layout of the next traced step (an opt.dist.SpmdStep: the step runs
        # under shard_map over all ranks' devices) or None. A Model sets it from its DistOpt
        # before each call; it must be reflected in run()'s ``static`` (DistOpt's key is).
        self.spmd = None

    # -- public entry ------------------------------------------------------------------------
    def run(self, fn: Callable, name: str, args: tuple, kwargs: dict,
            declared_state: Sequence[Tensor], training: bool, static: Hashable = (),
            provisional: Sequence[Tensor] = ()) -> Any:
        """Run ``fn(*args, **kwargs)`` as one compiled program; see the module docstring.
        ``static`` is whatever else the program bakes in (a Model passes its optimizers'
        schedules), so that a change of it compiles a new program.

        Pass ``declared_state`` as a tuple (a Model passes the same tuple until its state
        changes) and its identities are not re-collected on every call. ``provisional``: the
        declared Tensors the caller made ahead of this trace in case the step uses them (a
        Model's optimizer slots, see :meth:`unused_provisional`)."""
        if current_trace_hook() is not None:
            # inside a trace (this model's or another's): run inline, so that the outer
            # program takes this model's ops (and state) in
            return fn(*args, **kwargs)
        self._unused_provisional = []
        result = self.run_cached(name, args, kwargs, declared_state, training, static)
        if result is not NOT_CACHED:
            return result
        prog, arrays = self._trace_and_keep(fn, name, args, kwargs, declared_state, training,
                                            static, provisional)
        return self._execute(prog, arrays)

    def prepare(self, fn: Callable, name: str, args: tuple, kwargs: dict,
                declared_state: Sequence[Tensor], training: bool, static: Hashable = (),
                provisional: Sequence[Tensor] = ()) -> None:
        """Trace and compile the program of the call ``fn(*args, **kwargs)`` as :meth:`run`
        would, without running it: a later call with arguments of the same signature runs it
        at once; a call already compiled is left as it is. A step that meets new state it can
        only take as input once it has run (a layer first built inside the step) is not
        compiled: :class:`ProgramNotKept` is raised after its trace, which has put back every
        state value (a Tensor it created holds zeros: the caller undoes its creation, see
        ``Model.compile_step``)."""
        self._unused_provisional = []
        key = self._call_key(name, args, kwargs, declared_state, training, static)[3]
        prog = self._program_for(key, declared_state)
        if prog is not None:
            if prog.pending is not None:  # compiled in tiers: the optimised program, now
                self._take_optimised(prog, block=True)
            return
        self._trace_and_keep(fn, name, args, kwargs, declared_state, training, static,
                             provisional, dry=True)

    @property
    def unused_provisional(self) -> List[Tensor]:
        """The ``provisional`` Tensors the last traced program neither reads nor writes (the
        caller may drop them: the program does not take them, and no longer counts them as
        its state)."""
        return self._unused_provisional

    def export(self, name: str, platforms: Sequence[str] = ("cuda", "tpu")
               ) -> jax.export.Exported:
        """The program this runner last compiled for method ``name`` (a Model's
        ``"train_one_batch"`` or ``"forward"``), lowered for ``platforms`` with
        :func:`jax.export.export`: none of them need be present, so a CPU-only machine shows
        that a step lowers for GPU and TPU (:class:`~.graph_layout.StepLowering`). The
        exported function takes and returns what the compiled step does: ``(donated, read,
        batch) -> (new state, new keys, extra outputs, results)``. Raises LookupError when no
        call of ``name`` has been compiled, NotImplementedError for a DistOpt (SPMD) step."""
        lowering = self._lowerings.get(f"{self.owner_name}.{name}")
        if lowering is None:
            raise LookupError(f"graph mode: {self.owner_name}.{name} has not been compiled yet; "
                              f"call it once in graph mode first")
        return lowering.export(platforms)

    def run_cached(self, name: str, args: tuple, kwargs: dict, declared_state: Sequence[Tensor],
                   training: bool, static: Hashable = ()) -> Any:
        """The result of a call as :meth:`run` gives it when a program compiled for it is
        cached, else :data:`NOT_CACHED` (then nothing ran, nothing changed). This is the
        per-step path of every compiled model, so it does as little Python as it can: on a
        small model every microsecond here is a visible share of the step."""
        _, _, arrays, key = self._call_key(name, args, kwargs, declared_state, training, static)
        last_key, prog = self._last
        if key != last_key:  # comparing with the last call's key is cheaper than hashing it
            prog = self._program_for(key, declared_state)
        if prog is None:
            return NOT_CACHED
        result = self._execute(prog, arrays)
        if result is _INPUTS_CHANGED:
            self._dropped([prog])
            self.programs.pop(key, None)
            self._last = (None, None)
            return NOT_CACHED
        self._last = (key, prog)
        return result

    def _trace_and_keep(self, fn: Callable, name: str, args: tuple, kwargs: dict,
                        declared_state: Sequence[Tensor], training: bool, static: Hashable,
                        provisional: Sequence[Tensor] = (), dry: bool = False
                        ) -> Tuple[_Program, list]:
        """Trace the call and keep its program (when it can serve later calls); returns the
        program and the call's batch arrays. ``dry``: see :meth:`_trace`."""
        leaves, arg_tree, arrays, key = self._call_key(name, args, kwargs, declared_state,
                                                       training, static)
        state = self._state_list(declared_state)
        where = f"{self.owner_name}.{name}"
        cause = describe(self._last_keys.get(name), key, where)
        self._last_keys[name] = key
        observe.compile_cause("graph step", where, cause)  # (for the compile's report)
        prog = self._trace(fn, where, leaves, arg_tree, arrays, state,
                           device_mod.all_devices(), dry=dry)
        if not dry:
            self._count_compile(name, where, cause)
        if provisional:  # (run and prepare have emptied _unused_provisional)
            used = {id(t) for t in [*prog.donated, *prog.read, *prog.written, *prog.extra_out]}
            self._unused_provisional = [t for t in provisional if id(t) not in used]
            # the program is the state it takes: a caller that drops the unused ones finds it
            # again under the state it declares then (see _rekeyed)
            prog.state_ids = prog.state_ids - {id(t) for t in self._unused_provisional}
        if prog.cacheable:
            self._one_offs.pop(name, None)
            # programs of the same call for other state tensors (replaced slots, ...) are most
            # likely dead: keep only the newest few, and drop the references the others hold
            same_call = [k for k in self.programs if k[:4] == key[:4]]
            for old in same_call[:max(0, len(same_call) - _PROGRAMS_PER_CALL + 1)]:
                self._dropped([self.programs.pop(old)])
            self._last = (None, None)
            self.programs[key] = prog
        else:
            self._count_one_off(name, prog)
        return prog, arrays

    def _call_key(self, name: str, args: tuple, kwargs: dict, declared_state: Sequence[Tensor],
                  training: bool, static: Hashable) -> Tuple[Sequence[Any], Any, list, Tuple]:
        """The call's leaves, their tree, the arrays to pass and the key of its program.

        State tensors enter the key by identity only: if one was rebound to another shape or
        dtype, the compiled call itself refuses the inputs, before anything is donated, and the
        step is traced again."""
        leaves, arg_tree, arg_sig, arrays = _call_signature(args, kwargs, self.owner_name, name)
        key = (name, training, arg_tree, arg_sig, self._state_ids(declared_state),
               device_mod.all_devices(), static, float32_matmul_precision(),
               autocast_dtype())
        return leaves, arg_tree, arrays, key

    def _program_for(self, key: Tuple, declared_state: Sequence[Tensor]) -> Optional[_Program]:
        """The program kept under ``key``, or one of the same call over the same state kept
        under an older key (:meth:`_rekeyed`), or None."""
        prog = self.programs.get(key)
        if prog is None and self.programs:
            prog = self._rekeyed(key, self._state_list(declared_state))
        return prog

    def _rekeyed(self, key: Tuple, state: List[Tensor]) -> Any:
        """A program of the same call traced over exactly the tensors of ``state``, filed under
        ``key`` instead of its old key (the state a first trace discovered, say an optimizer's
        new slots, is declared by the caller from the next call on: same program, new key)."""
        ids = frozenset(map(id, state))
        for old_key, prog in list(self.programs.items()):
            if old_key[:4] == key[:4] and old_key[5:] == key[5:] and prog.state_ids == ids:
                del self.programs[old_key]
                self.programs[key] = prog
                return prog
        return None

    def _count_one_off(self, name: str, prog: _Program) -> None:
        """Warn (once per method) when every trace keeps meeting new state: then every call
        compiles, which is correct but slow -- typically a Tensor created and kept per step."""
        count = self._one_offs[name] = self._one_offs.get(name, 0) + 1
        if count == _ONE_OFFS_BEFORE_WARNING:
            kept = sorted({str(t.name) for t in prog.extra_out})[:5]
            warnings.warn(
                f"graph mode: {prog.where} met new state on each of its last {count} calls, so "
                f"each call compiled a new program (Tensors such as {kept} are created and kept "
                f"by every step). Keep step state in Tensors that persist and rebind their "
                f".data, or run eagerly with model.graph(False).", RuntimeWarning, stacklevel=4)

    def _count_compile(self, name: str, where: str, cause: str) -> None:
        """Warn (once per method) when the method compiled on each of its last few Model
        calls: the step recompiles every time, typically because its input shapes change."""
        at, run = self._compiled_at.get(name, (-2, 0))
        step = observe.steps
        run = run + 1 if step - at == 1 else 1
        self._compiled_at[name] = (step, run)
        if run == _COMPILES_BEFORE_WARNING:
            warnings.warn(
                f"graph mode: {where} compiled a new program on each of its last {run} calls; "
                f"the last because of: {cause}. A step whose inputs change shape every call "
                f"compiles every call: pad batches to one shape (or drop the last, smaller "
                f"batch), or run this model eagerly with model.graph(False).",
                RuntimeWarning, stacklevel=observe.user_stacklevel())

    # -- state -------------------------------------------------------------------------------
    def _state_ids(self, declared: Sequence[Tensor]) -> Tuple[int, ...]:
        cached = self._declared_ids
        if cached[0] is declared:  # a tuple seen last call (held here, so its id is not reused)
            return cached[1]
        ids = tuple(map(id, declared))
        if type(declared) is tuple:
            self._declared_ids = (declared, ids)
        return ids

    def _state_list(self, declared: Sequence[Tensor]) -> List[Tensor]:
        # declared first, then discovered; each Tensor once (in first-seen order)
        return list({id(t): t for t in [*declared, *self.discovered]}.values())

    @property
    def discovered(self) -> List[Tensor]:
        """The live Tensors the recorder added to the state, in discovery order."""
        alive = [t for t in (r() for r in self._discovered) if t is not None]
        if len(alive) != len(self._discovered):
            self._discovered = [weakref.ref(t) for t in alive]
        return alive

    def _discover(self, tensors: Sequence[Tensor]) -> None:
        known = {id(t) for t in self.discovered}
        new = [t for t in tensors if id(t) not in known]
        if new:
            self._discovered.extend(weakref.ref(t) for t in new)
            self._dropped(list(self.programs.values()))
            self.programs.clear()  # none of them takes the new state as input
            self._last = (None, None)

    # -- tracing -----------------------------------------------------------------------------
    def _trace(self, fn: Callable, where: str, leaves: Sequence[Any], arg_tree,
               batch_arrays: list, state: List[Tensor], devices: Sequence[device_mod.Device],
               first: bool = True, dry: bool = False) -> _Program:
        """Trace the step over ``state`` and compile the program that is kept.

        When the trace meets new state (``first`` trace only) and every Tensor the step created
        and keeps is state whose value at birth is a constant that the step reads before it
        writes it (an optimizer's slot created as zeros), the step is traced once more with
        those Tensors holding their birth values as inputs: that program computes this call
        exactly too, so it is compiled once and kept. Otherwise (a parameter built inside the
        step, a Tensor first written after its creation) the first program computes this call
        alone, as a quickly compiled one-off, and the next call retraces -- or, ``dry`` (a
        program compiled ahead, not run), is not compiled: every Tensor the trace left a tracer
        in gets its value from before the trace back (zeros for one it created) and
        :class:`ProgramNotKept` is raised."""
        self.trace_count += 1
        originals = [t.array for t in state]
        original_keys = [d.key for d in devices]
        recorder = Recorder(state)
        record: Dict[str, Any] = {}
        state_ids = {id(t) for t in state}
        spmd = self.spmd
        with_births = first and spmd is None  # DistOpt's SPMD step takes the one-off path

        def step(state_arrays, keys, batch_arrays):
            for t, a in zip(state, state_arrays):
                t.array = a
            for d, k in zip(devices, keys):
                d.key = k
            call_leaves = rebuild_leaves(leaves, batch_arrays)
            args, kwargs = jax.tree_util.tree_unflatten(arg_tree, call_leaves)
            recorder.known_ids.update(id(x) for x in call_leaves if isinstance(x, Tensor))
            with trace_hook(recorder), checks.input_checks(batch_arrays) as input_checks:
                result = fn(*args, **kwargs)
            res_leaves, res_tree = jax.tree_util.tree_flatten(result, is_leaf=_is_tensor)
            kinds, res_arrays = result_outputs(res_leaves)
            # Drop our references to the step's temporaries so that only the Tensors the user's
            # objects keep (optimizer slots, lazily built parameters) are found alive below.
            # (The autograd graph holds no reference cycles -- a leaf's Dummy holds its Tensor
            # weakly, an op holds only its inputs' creators -- so no gc.collect() is needed.)
            del result, res_leaves, args, kwargs, call_leaves
            written = [t for t in recorder.undeclared_written.values() if id(t) not in state_ids]
            alive = recorder.alive_created(state_ids)
            written_ids = {id(t) for t in written}
            extra = written + [t for t in alive if id(t) not in written_ids]
            rewritten = ([t.array is not a for t, a in zip(state, state_arrays)] +
                         [d.key is not k for d, k in zip(devices, keys)])
            record.update(tree=res_tree, kinds=kinds, extra=extra, rewritten=rewritten,
                          read=list(recorder.undeclared_read.values()), alive=alive,
                          input_checks=tuple(input_checks))
            outputs = ([t.array for t in state], [d.key for d in devices],
                       [t.array for t in extra], res_arrays)
            if not with_births:
                return outputs
            # the birth values of the kept new Tensors, last (never part of a compiled program)
            return outputs + ([recorder.births[id(t)] for t in alive],)

        start = time.perf_counter()
        try:
            # the Layers' paths and the operators' names as named scopes: a profile of the
            # step shows them (compiled into the program's metadata, they cost nothing per step)
            with observe.naming():
                if spmd is None:
                    closed = jax.jit(step).trace(originals, original_keys, batch_arrays).jaxpr
                else:
                    closed = spmd.trace(step, where, state, originals, original_keys,
                                        batch_arrays)
            alive = record["alive"]
            new_state = [t for t in record["read"] if id(t) not in state_ids] + record["extra"]
            births = None
            if new_state and with_births:
                births = birth_values(closed, recorder, alive)
            if births is None and new_state and dry:
                recorder.put_back_written(record["extra"])
                raise ProgramNotKept(where)
            if births is None:
                layout = Layout(closed, record["rewritten"], len(state), len(devices),
                                len(record["extra"]), len(alive) if with_births else 0)
                compiled, pending = self._compile(layout, spmd, [*originals, *original_keys],
                                                  batch_arrays, one_off=bool(new_state),
                                                  where=where, ahead=dry)
        except _CONCRETE_VALUE_ERRORS as e:
            self._undo_trace(state, originals, devices, original_keys, recorder)
            raise GraphModeError(
                f"graph mode: {where} branches on (or converts to Python/NumPy) the VALUE of a "
                f"traced tensor, which cannot be compiled into one XLA program. Run this model "
                f"eagerly with model.compile(..., use_graph=False) or model.graph(False), or "
                f"express the choice with tensor ops (e.g. autograd.where). JAX said: "
                f"{str(e).splitlines()[0]}") from e
        except BaseException:
            self._undo_trace(state, originals, devices, original_keys, recorder)
            raise
        # Tensors now hold tracers; restore the inputs (the run writes the new values back).
        _restore(state, originals, devices, original_keys)
        if births is not None:
            # Give the new state its value from before this step (birth values for the new
            # Tensors, the current value for undeclared ones the step wrote) and trace again
            # with all of it as input: the program kept from then on serves this call too.
            recorder.put_back_written(record["extra"])
            for t, b in zip(alive, births):
                t._data = b
                _detach(t)
            self._discover(new_state)
            full = list({id(t): t for t in [*state, *self.discovered]}.values())
            return self._trace(fn, where, leaves, arg_tree, batch_arrays, full, devices,
                               first=False, dry=dry)
        self.last_compile_seconds = time.perf_counter() - start
        self._discover(new_state)
        donated, donated_devices = layout.pick(layout.donated, state, devices)
        read, read_devices = layout.pick(layout.read, state, devices)
        written, written_devices = layout.pick(layout.written, state, devices)
        return _Program(compiled=compiled, donated=donated, donated_devices=donated_devices,
                        read=read, read_devices=read_devices, written=written,
                        written_devices=written_devices, extra_out=record["extra"],
                        result_tree=record["tree"], result_kinds=record["kinds"],
                        cacheable=not new_state, where=where,
                        state_ids=frozenset(state_ids), input_checks=record["input_checks"],
                        pending=pending)

    def _compile(self, layout: Layout, spmd: Any, holders: list, batch_arrays: list,
                 one_off: bool, where: str, ahead: bool = False
                 ) -> Tuple[Any, Optional[graph_tiers.Pending]]:
        """Compile the trimmed program with this backend's options (:mod:`.xla_options`), and
        remember what lowering it again needs (:meth:`export`). A step about to run (not
        ``ahead`` of its first call), kept and not SPMD, may be compiled in two tiers
        (:mod:`.graph_tiers`): then the program returned is the quick one and the second value
        the optimised one compiling in the background (else None)."""
        self.compile_count += 1
        donated_arrays = [holders[i] for i in layout.donated]
        read_arrays = [holders[i] for i in layout.read]
        platform = platform_of(holders + batch_arrays)
        pending = None

        def options_for(lowered: Any) -> Optional[dict]:
            self.last_compile_options = compile_options(platform, one_off, program=lowered)
            return self.last_compile_options or None

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
            if spmd is None:
                lowered = jax.jit(_named(layout.program, "graph_step"), donate_argnums=0).lower(
                    donated_arrays, read_arrays, batch_arrays)
                options = options_for(lowered)
                tiers = None if one_off else graph_tiers.plan(
                    lowered, layout.closed, platform, self.last_compile_options, ahead=ahead)
                if tiers is not None and tiers.quick is not None:
                    self.last_compile_options = tiers.quick
                    compiled = tiers.compile_quick(lowered)
                    pending = tiers.start(lowered, where)
                    self.compile_count += 1
                    self.tiered_count += 1
                else:
                    compiled = lowered.compile(options)
                    if tiers is not None:
                        tiers.compiled()
            else:
                compiled = spmd.compile(layout.program, donated_arrays, read_arrays,
                                        batch_arrays, options_for, layout.donated, layout.read)
        observe.notify("compiled", where, compiled)  # (its memory analysis, for debug.stats)
        self._lowerings[where] = StepLowering.of(layout.program if spmd is None else None,
                                                 where, donated_arrays, read_arrays,
                                                 batch_arrays)
        return compiled, pending

    def _take_optimised(self, prog: _Program, block: bool) -> None:
        """Let ``prog`` run its optimised program from now on, if it is ready (``block``: wait
        for it). A failed optimised compilation leaves the quick program (warned)."""
        pending = prog.pending
        if not (block or pending.ready()):
            return
        prog.pending = None
        compiled = pending.result()
        if compiled is not None:
            prog.compiled = compiled
            self.last_compile_options = pending.options

    def finish_compiling(self) -> None:
        """Wait until every step of this runner compiling in the background (tiered
        compilation, :mod:`.graph_tiers`) is compiled; each call from then on runs its
        optimised program."""
        for prog in list(self.programs.values()):
            if prog.pending is not None:
                self._take_optimised(prog, block=True)

    @staticmethod
    def _dropped(programs: Sequence[_Program]) -> None:
        """Programs no call will run again: their optimised compilations, if not started, are
        not needed."""
        for prog in programs:
            if prog.pending is not None:
                prog.pending.cancel()

    @staticmethod
    def _undo_trace(state, originals, devices, original_keys, recorder: Recorder) -> None:
        """After a failed trace no Tensor the user can see keeps a tracer: the declared state
        and every undeclared Tensor the step wrote hold what they held before the step; a
        Tensor the step created, whose value was never computed, holds zeros."""
        _restore(state, originals, devices, original_keys)
        written = list(recorder.undeclared_written.values())
        recorder.put_back_written(written)
        for t in written + recorder.alive_created(set()):
            if _is_tracer(t.array):  # a value never computed: zeros
                t.array = jax.numpy.zeros(t.shape, t.dtype)

    # -- running -----------------------------------------------------------------------------
    def _execute(self, prog: _Program, batch: list) -> Any:
        if prog.pending is not None and prog.checked:  # the first run is the quick program's
            self._take_optimised(prog, block=prog.pending.wait)
        checks.run_input_checks(prog.input_checks, batch)  # raises before anything is donated
        # From the call that donates the state's buffers until the new arrays are bound, a
        # Ctrl-C waits (until the caller's outermost scope exits: a Model's step, whole)
        with interrupts.deferred():
            if not (prog.donated_devices or prog.read_devices):
                return self._execute_program(prog, batch)
            # Device keys are shared by every model: another thread's step (or eager next_key)
            # must not read a key this step is about to donate, so read-run-write holds the
            # devices' locks. The run is only dispatched (asynchronous): they are held briefly.
            with _key_locks(prog.donated_devices + prog.read_devices):
                return self._execute_program(prog, batch)

    def _execute_program(self, prog: _Program, batch: list) -> Any:
        # no trace hook is installed here (see run), so the arrays are read directly
        donated = list(map(_array_of, prog.donated))
        if prog.donated_devices:
            donated += map(_key_of, prog.donated_devices)
        read = [*map(_array_of, prog.read), *map(_key_of, prog.read_devices)]
        # a failed run may consume what it was donated: the first run keeps host copies and
        # is waited for (see graph.errors)
        kept = None if prog.ran is prog.compiled else \
            errors.host_copies([*prog.donated, *prog.donated_devices])
        _copy_shared(donated)
        unalias(donated, read + batch, id)
        if observe.on:  # (a profiler reads which program ran: its metadata names the ops)
            observe.program_ran("graph", prog.compiled)
        try:
            try:
                outputs = prog.compiled(donated, read, batch)
            except TypeError:
                if avals_of(prog.compiled.args_info) != avals_of((donated, read, batch)):
                    return _INPUTS_CHANGED  # a state tensor was rebound to another shape/dtype
                raise
            except jax.errors.JaxRuntimeError as e:
                # two Tensors over one buffer that the cheap identity check missed (reading
                # buffer pointers waits for pending work: only done when XLA refuses the call)
                if errors.is_out_of_memory(e) or not unalias(donated, read + batch, buffer_id):
                    raise
                outputs = prog.compiled(donated, read, batch)
            if kept is not None:  # (XLA:CPU reports a failed allocation in the outputs)
                jax.block_until_ready(outputs)
        except jax.errors.JaxRuntimeError as e:
            if not errors.is_out_of_memory(e):
                raise
            error = errors.run_failed(prog.where, [*prog.donated, *prog.donated_devices], kept,
                                      batch, e)
            del donated, read, kept  # (the traceback keeps this frame: let it hold no copies)
            raise error from e
        prog.ran = prog.compiled
        new_state, new_keys, extra, res_arrays = outputs
        placed = getattr(prog.compiled, "placed_read", None)  # DistOpt: state put on the mesh
        if placed is not None:
            for t, a in zip(prog.read, placed):
                t._data = a
        for t, a in zip(prog.written, new_state):
            t._data = a  # a program output, on its device, no hook installed: skip the setter
        for d, k in zip(prog.written_devices, new_keys):
            d.key = k
        for t, a in zip(prog.extra_out, extra):
            t.array = a
            _detach(t)
        if not prog.checked:  # outputs of a compiled program are concrete; check the first run
            _assert_no_tracers(prog)
            prog.checked = True
            if prog.pending is not None and not prog.pending.started:
                prog.pending.start(after=[*res_arrays, *new_state])  # the quick run's end
        return build_result(prog.result_kinds, prog.result_tree, res_arrays)


def _named(fn: Callable, name: str) -> Callable:
    """``fn`` under the name ``name`` (the name of its compiled program: what profiles show and
    what a compilation is reported as)."""
    def program(*args: Any) -> Any:
        return fn(*args)
    program.__name__ = program.__qualname__ = name
    return program


def _restore(state: List[Tensor], arrays: list, devices: List[device_mod.Device],
             keys: list) -> None:
    """Put the pre-trace values back into the state Tensors and the devices' keys."""
    for t, a in zip(state, arrays):
        t.array = a
    for d, k in zip(devices, keys):
        d.key = k


_array_of = operator.attrgetter("_data")
_key_of = operator.attrgetter("key")


@contextlib.contextmanager
def _key_locks(devices: Sequence[device_mod.Device]) -> Iterator[None]:
    """Hold the locks of ``devices`` (each once, in one global order: no deadlock)."""
    with contextlib.ExitStack() as stack:
        for d in sorted(set(devices), key=id):
            stack.enter_context(d._lock)
        yield


# what _execute returns when a cached program no longer fits its state (it is then retraced)
_INPUTS_CHANGED = object()

# what GraphRunner.run_cached returns when no compiled program serves the call
NOT_CACHED = object()


def _detach(t: Tensor) -> None:
    """A Tensor created during the trace keeps no traced autograd graph (like SINGA's
    remove_creator after buffering)."""
    if not isinstance(t.creator, Dummy):
        t.creator = Dummy(t)


def _assert_no_tracers(prog: _Program) -> None:
    leaked = [t.name for t in prog.written + prog.extra_out if _is_tracer(t.array)]
    leaked += [repr(d) for d in prog.written_devices if _is_tracer(d.key)]
    if leaked:
        raise RuntimeError(f"graph mode: {prog.where} left traced values in {leaked}; this is a "
                           f"bug in singa_jax's graph mode")
