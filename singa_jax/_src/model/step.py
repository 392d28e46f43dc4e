"""What a Model's graph-mode step wraps around the user's step: value checks that gate every
state write (a failing step applies nothing, then raises), the optimizers' skip reports as
outputs, and which optimizers hold state."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax

from singa_jax._src.base import checks, modes
from singa_jax._src.optim.optimizers import Optimizer
from singa_jax._src.runtime import device as device_mod
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["checked_step", "StateWatch", "with_wrapped", "plain_optimizers"]


def checked_step(fn: Callable, optimizers: Sequence[Any] = ()) -> Callable:
    """``fn`` for graph mode, returning ``(result, checks, skip reports)``: the value checks its
    ops make while traced (class labels, embedding indices; see base.checks) become
    outputs of the program, and every state tensor and device key the step rewrites keeps its
    old value unless all of them pass -- so a failing step applies nothing, and raises once it
    has run. The skip reports are each of ``optimizers``' non-finite guard state after the
    step, as outputs of their own (see ``Optimizer._expect_skip_report``; None when
    unguarded)."""
    def step(*args: Any, **kwargs: Any) -> Tuple[Any, Any, Any]:
        devices = device_mod.all_devices()
        with checks.collecting() as found:
            before = [(d, d.key) for d in devices]
            watched = StateWatch()
            with modes.trace_hook(watched.chain(modes.current_trace_hook())):
                result = fn(*args, **kwargs)
        reports = tuple(o._skip_report_output() for o in optimizers)
        if not found:
            return result, (), reports
        ok = checks.all_passed(found)
        for t, old in watched.first_values.items():
            t.array = jax.numpy.where(ok, t.array, old)
        for d, old in before:
            if d.key is not old:  # only keys the step drew from (a gated key is state to it)
                d.key = jax.numpy.where(ok, d.key, old)
        return result, checks.outputs(found), reports
    return step


class StateWatch(modes.TraceHook):
    """Inside a traced step: the value each Tensor the step rewrites had before its first
    write (Tensors the step creates excluded); every event also goes on to the outer hook."""

    def chain(self, outer: Optional[modes.TraceHook]) -> "StateWatch":
        self.outer = outer or modes.TraceHook()
        self.first_values: Dict[Tensor, Any] = {}
        self.created_ids: set = set()
        return self

    def read(self, t: Tensor) -> None:
        self.outer.read(t)

    def write(self, t: Tensor) -> None:
        if t not in self.first_values and id(t) not in self.created_ids:
            self.first_values[t] = t._data  # called before the new value is bound
        self.outer.write(t)

    def created(self, t: Tensor) -> None:
        self.created_ids.add(id(t))
        self.outer.created(t)


def with_wrapped(optimizers: List[Any]) -> List[Any]:
    """The optimizers and, for a DistOpt, the optimizer it wraps (which holds the slots)."""
    return optimizers + [o.opt for o in optimizers if isinstance(getattr(o, "opt", None),
                                                                 Optimizer)]


def plain_optimizers(optimizers: List[Any]) -> List[Any]:
    """The :class:`~singa_jax.opt.Optimizer` objects among ``optimizers`` and those a DistOpt
    wraps: the ones that hold their own state (slots, step counter, guard state)."""
    return [o for o in with_wrapped(optimizers) if isinstance(o, Optimizer)]
