"""The shape of a traced step's program: which state it takes, donates and returns
(:class:`Layout`), the values of the state it created (:func:`birth_values`), and what lowering
it again needs (:class:`StepLowering`: for other platforms, with ``jax.export``).

Split from :mod:`.graph`, which traces, compiles, caches and runs; nothing here holds a Tensor
after it returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

import jax
import jax.extend.core as jex_core
import numpy as np

from . import device as device_mod
from .tensor import Tensor

if TYPE_CHECKING:  # graph imports this module
    from .graph import _Recorder

__all__ = ["Layout", "StepLowering", "birth_values"]


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


def birth_values(closed, recorder: "_Recorder", alive: List[Tensor]) -> Optional[list]:
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
    return [t.device.put(np.asarray(b) if isinstance(b, np.ndarray) else b)
            for t, b in zip(alive, values)]


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
