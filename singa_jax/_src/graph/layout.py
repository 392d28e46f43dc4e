"""The shape of a traced step's program: which state it takes, donates and returns
(:class:`Layout`), the values of the state it created (:func:`birth_values`), and what lowering
it again needs (:class:`StepLowering`: for other platforms, with ``jax.export``).

It also holds how a program's inputs and outputs meet Python objects: the call's Tensors over
traced arrays (:func:`rebuild_leaves`), the result's leaves (:func:`result_outputs`,
:func:`build_result`) and the donated buffers' checks (:func:`copy_shared`, :func:`unalias`).

Split from :mod:`.graph`, which traces, compiles, caches and runs; nothing here holds a Tensor
after it returns.
"""
from __future__ import annotations

from dataclasses import dataclass
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

import jax
import jax.extend.core as jex_core
import numpy as np

from singa_jax._src.runtime import device as device_mod
from singa_jax._src.tensor.tensor import Tensor

if TYPE_CHECKING:  # graph imports this module
    from singa_jax._src.graph.recorder import Recorder

__all__ = ["Layout", "StepLowering", "birth_values", "rebuild_leaves", "result_outputs",
           "build_result", "unalias", "copy_shared", "avals_of", "buffer_id", "tensors_in"]


class Layout:
    """Which state a traced step uses and rewrites, and the program over just those.

    ``closed`` is the step traced over ALL state: inputs (state, keys, batch), outputs (state,
    keys, extra, results). Holder ``i`` (a state tensor or a device key) is
        donated    when the step reads and rewrites it (its old buffer can be reused),
        read       when it only reads it (not donated: the Tensor keeps its array),
        write-only when it rewrites it without reading (an output only),
    and is left out of the program when the step does neither. Every input and output costs
    a few microseconds per call, which shows on small models, and donating a buffer the step
    does not rewrite would free an array the Tensor still holds."""

    def __init__(self, closed, rewritten: List[bool], n_state: int, n_devices: int,
                 n_extra: int, n_births: int = 0):
        jaxpr = closed.jaxpr
        n_holders = n_state + n_devices
        outvars = jaxpr.outvars
        kept_out = [i for i in range(n_holders) if rewritten[i]]
        kept_out += range(n_holders, len(outvars) - n_births)  # births: never outputs
        used = {v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, jex_core.Var)}
        used.update(outvars[i] for i in kept_out if isinstance(outvars[i], jex_core.Var))
        is_used = [v in used for v in jaxpr.invars[:n_holders]]
        self.donated = [i for i in range(n_holders) if rewritten[i] and is_used[i]]
        self.read = [i for i in range(n_holders) if is_used[i] and not rewritten[i]]
        self.written = [i for i in range(n_holders) if rewritten[i]]
        self._closed = closed
        self._n_state = n_state
        self._n_holders = n_holders
        self._kept_out = kept_out
        # output slices: new state values, new keys, extra outputs, results
        self._n_state_out = sum(i < n_state for i in self.written)
        self._n_written = len(self.written)
        self._n_extra = n_extra

    @property
    def closed(self):
        """The step traced over all state (a ``ClosedJaxpr``), as given."""
        return self._closed

    def pick(self, indices: List[int], state: List[Tensor], devices: List[device_mod.Device]
             ) -> Tuple[List[Tensor], List[device_mod.Device]]:
        """The state tensors and the devices (whose keys) that ``indices`` name."""
        return ([state[i] for i in indices if i < self._n_state],
                [devices[i - self._n_state] for i in indices if i >= self._n_state])

    def program(self, donated: list, read: list, batch: list) -> Tuple[list, list, list, list]:
        """The trimmed step: ``(new state values, new keys, extra outputs, results)``."""
        flat: list = [None] * self._n_holders  # unused inputs: never read by the jaxpr
        for i, a in zip(self.donated, donated):
            flat[i] = a
        for i, a in zip(self.read, read):
            flat[i] = a
        outs = jex_core.jaxpr_as_fun(self._closed)(*flat, *batch)
        outs = [outs[i] for i in self._kept_out]
        n_s, n_w, n_e = self._n_state_out, self._n_written, self._n_written + self._n_extra
        return outs[:n_s], outs[n_s:n_w], outs[n_w:n_e], outs[n_e:]


def birth_values(closed, recorder: "Recorder", alive: List[Tensor]) -> Optional[list]:
    """Concrete birth values of the new Tensors a trace kept (the last outputs of ``closed``),
    or None when the trace's program alone computes this call exactly: a kept new Tensor is a
    parameter (built inside the step from the device's key), was first WRITTEN after its birth
    (its birth value is not what the step used), or was born from the step's inputs."""
    for t in alive:
        if t.stores_grad or recorder.first_access.get(id(t), "read") != "read":
            return None
    jaxpr = closed.jaxpr
    outvars = jaxpr.outvars[len(jaxpr.outvars) - len(alive):]
    producer = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}
    env = dict(zip(jaxpr.constvars, closed.consts))
    inputs = set(jaxpr.invars)

    def value(v):
        if isinstance(v, jex_core.Literal):
            return v.val
        if v in env:
            return env[v]
        if v in inputs:
            raise _BornFromInputs
        eqn = producer[v]
        operands = [value(x) for x in eqn.invars]
        if eqn.primitive.name == "broadcast_in_dim" and np.ndim(operands[0]) == 0:
            # the usual birth (zeros, ones, a fill): built on the host, no kernel compiled
            outs = [np.full(eqn.params["shape"], operands[0], v.aval.dtype)]
        else:
            outs = eqn.primitive.bind(*operands, **eqn.primitive.get_bind_params(eqn.params))
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
        return env[v]

    try:
        values = [value(v) for v in outvars]
    except _BornFromInputs:
        return None
    return [t.device.put(b) for t, b in zip(alive, values)]


class _BornFromInputs(Exception):
    """A new Tensor's birth value depends on the step's inputs (see birth_values)."""


@dataclass(frozen=True)
class StepLowering:
    """What lowering a compiled step again needs, without its arrays: the trimmed program
    (:meth:`Layout.program`, a pure function of its inputs) and the shapes and dtypes of those
    inputs, ``(donated, read, batch)``. ``program`` is None for a step compiled as one SPMD
    program over several devices (:mod:`.opt.spmd`), which is not exported."""
    program: Optional[Callable]
    avals: Tuple[list, list, list]
    where: str  # "Model.method", for messages

    @staticmethod
    def of(program: Optional[Callable], where: str, donated: list, read: list,
           batch: list) -> "StepLowering":
        """The record of ``program`` traced over these arrays (only their avals are kept:
        keeping the arrays would keep donated buffers alive)."""
        avals = tuple([jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
                      for arrays in (donated, read, batch))
        return StepLowering(program, avals, where)

    def export(self, platforms: Sequence[str]) -> jax.export.Exported:
        """The step lowered for ``platforms`` (e.g. ``("cuda", "tpu")``; none need be present):
        the same program graph mode compiles here, donation included, with each
        ``lax.platform_dependent`` choice made for those platforms. Shardings are left
        unspecified, so the module names no device of this machine."""
        if self.program is None:
            raise NotImplementedError(
                f"graph mode: {self.where} runs as one SPMD program over several devices "
                f"(DistOpt); exporting it is not supported -- export the step of the same model "
                f"without DistOpt")
        platforms = tuple(platforms)
        if not platforms:
            raise ValueError("export: name at least one platform, e.g. ('cuda', 'tpu')")
        jitted = jax.jit(self.program, donate_argnums=0)
        return jax.export.export(jitted, platforms=platforms)(*self.avals)


# --- the state a step may touch ----------------------------------------------------------------
def tensors_in(obj: Any) -> List[Tensor]:
    """Every Tensor reachable from ``obj`` through dicts, lists, tuples and objects' attributes
    (how graph mode finds an optimizer's state: slots, step counter, schedule values)."""
    if isinstance(obj, dict):  # fast path: a flat {name: Tensor} dict (Optimizer.get_states)
        values = list(obj.values())
        if all(type(v) is Tensor for v in values):
            return values
    seen: set = set()
    found: List[Tensor] = []
    stack = [obj]
    while stack:
        cur = stack.pop()
        if id(cur) in seen or isinstance(cur, _OPAQUE):
            continue
        seen.add(id(cur))
        if isinstance(cur, Tensor):
            found.append(cur)
        elif isinstance(cur, dict):
            stack.extend(reversed(list(cur.values())))
        elif isinstance(cur, (list, tuple)):
            stack.extend(reversed(cur))
        elif hasattr(cur, "__dict__"):
            stack.extend(reversed(list(vars(cur).values())))
    return found


# Objects whose attributes hold no model state worth walking into.
_OPAQUE = (type, types.FunctionType, types.MethodType, types.ModuleType, device_mod.Device,
           jax.Array, np.ndarray, str, bytes)


# --- a program's inputs and outputs as Python objects -----------------------------------------
def rebuild_leaves(leaves: list, arrays: list) -> list:
    """The call's leaves with each tensor argument replaced by a new Tensor over its tracer."""
    it = iter(arrays)
    out = []
    for x in leaves:
        if isinstance(x, Tensor):
            out.append(Tensor(data=next(it), device=x.device, requires_grad=x.requires_grad,
                              stores_grad=x.stores_grad, name=x.name))
        elif isinstance(x, (jax.Array, np.ndarray)):
            out.append(next(it))
        else:
            out.append(x)
    return out


def result_outputs(res_leaves: list) -> Tuple[List[Tuple], list]:
    """What a traced method's result leaves are -- ("T", a Tensor's attributes), ("A",) an
    array, ("S", value) anything else -- and the arrays the program returns for them."""
    kinds, arrays = [], []
    for r in res_leaves:
        if isinstance(r, Tensor):
            arrays.append(r.array)
            # every attribute of the traced result except its value and its traced graph (a
            # Tensor without a creator gets its Dummy when first asked, see Tensor.__getattr__)
            template = {k: v for k, v in vars(r).items() if k not in ("_data", "creator")}
            kinds.append(("T", template))
        elif isinstance(r, (jax.Array, jax.core.Tracer)):
            kinds.append(("A",))
            arrays.append(r)
        else:
            kinds.append(("S", r))
    return kinds, arrays


def build_result(result_kinds: List[Tuple], result_tree: Any, arrays: list) -> Any:
    """The method's result: each leaf of ``result_kinds`` (see :func:`result_outputs`) rebuilt
    over the program's result ``arrays``."""
    it = iter(arrays)
    leaves = []
    for kind in result_kinds:
        if kind[0] == "T":
            # filling a bare Tensor from the template is much cheaper than Tensor(...), which
            # re-places the array on its device; the array already is where the program put it
            t = object.__new__(Tensor)
            t.__dict__.update(kind[1])
            t._data = next(it)  # a program output: already an array on its device
            leaves.append(t)
        elif kind[0] == "A":
            leaves.append(next(it))
        else:
            leaves.append(kind[1])
    return jax.tree_util.tree_unflatten(result_tree, leaves)


def unalias(donated: list, others: list, buffer_id: Callable) -> bool:
    """Donated buffers must be distinct from each other and from every other input: copy a
    donated array whose buffer is also passed elsewhere (tied weights, a Tensor built over
    another's array). Returns whether any was copied."""
    if len(set(map(buffer_id, donated + others))) == len(donated) + len(others):
        return False  # the usual case: all distinct
    seen = set(map(buffer_id, others))
    for i, a in enumerate(donated):
        if buffer_id(a) in seen:
            donated[i] = a = a.copy()
        seen.add(buffer_id(a))
    return True


def copy_shared(donated: list) -> None:
    """Donating a buffer deletes its array, so donate only arrays nothing else holds: an array
    also held by another Tensor (``set_states`` from the user's tensors, ``Tensor(data=p.array)``)
    or by the user (``w = p.array``) is copied first, and theirs stays valid. Python's reference
    count tells: the list slot, the owner (``Tensor._data`` or ``Device.key``) and getrefcount's
    own argument make 3."""
    for i in range(len(donated)):
        if sys.getrefcount(donated[i]) > 3:
            donated[i] = donated[i].copy()


def avals_of(tree: Any) -> list:
    """(shape, dtype) of every leaf of ``tree`` (arrays or a compiled program's args_info)."""
    return [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(tree)]


def buffer_id(a) -> int:
    try:
        return a.unsafe_buffer_pointer()
    except Exception:  # sharded or non-jax arrays: identity is the best we can tell
        return id(a)
