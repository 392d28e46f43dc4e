"""Decay schedules of ``singa_jax.opt`` and the hyper-parameter table they are checked against.

Holds :class:`DecayScheduler` (a value of the step count), the built-ins :class:`Constant` and
:class:`ExponentialDecay`, the jitted kernels that evaluate pure schedules (``eval_schedules``,
``step_schedules``), and ``as_schedule``, which turns a constructor argument into a validated schedule
using the valid interval of each hyper-parameter in ``HYPER_SPECS``.
"""
from __future__ import annotations

import math
import numbers
from functools import partial
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.tensor.tensor import Tensor


def check_real(owner: str, what: str, value: Any) -> float:
    """``value`` as a finite float, or a TypeError/ValueError naming ``owner`` and ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {what} must be a real number, got {type(value).__name__} "
                        f"{value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {what} must be finite, got {value}")
    return value


class DecayScheduler:
    """A value that changes with the step count (learning rate, momentum, weight decay, ...).

    ``scheduler(step)`` takes the step counter Tensor and returns the value as a float32 Tensor
    of the same shape. A subclass implements either :meth:`call` on Tensors (SINGA's way; it is
    then called eagerly, or on tracers in graph mode) or the pure :meth:`value` on a jax array
    (then it is evaluated inside the optimizer's jitted step kernel, as the built-ins are).
    """

    def __init__(self, init_value: float):
        self.init_value = check_real(type(self).__name__, "init_value", init_value)

    def __call__(self, step: Tensor) -> Tensor:
        if not isinstance(step, Tensor):
            raise TypeError(f"{type(self).__name__}: step must be a Tensor (the step counter), "
                            f"got {type(step).__name__}")
        return self.call(step)

    def call(self, step: Tensor) -> Tensor:
        """The value at ``step`` (a Tensor) as a Tensor, computed by :meth:`value`."""
        if type(self).value is DecayScheduler.value:
            raise NotImplementedError(f"{type(self).__name__}: implement call(step) or value(step)")
        return Tensor(device=step.device, data=self.value(step.array), requires_grad=False)

    def value(self, step: jax.Array) -> jax.Array:
        """The value at ``step`` (a float array, possibly traced) as a float32 array."""
        out = self.call(Tensor(data=step, requires_grad=False))
        return out.array.astype(jnp.float32)

    @property
    def _pure(self) -> bool:
        """Whether the value is the pure jnp function :meth:`value` (jit-able, makes no Tensors)."""
        cls = type(self)
        return cls.call is DecayScheduler.call and cls.value is not DecayScheduler.value

    @property
    def _constant(self) -> bool:
        """Whether the value never changes (then the optimizer never rewrites its ``*_value``)."""
        return False

    def _config(self) -> Optional[Tuple]:
        """Everything the value depends on, for the built-ins (None: compare by identity)."""
        return None

    # Built-ins compare by configuration, so equal schedules share one compiled step kernel.
    def __eq__(self, other: Any) -> bool:
        cfg = self._config()
        if cfg is None or not isinstance(other, DecayScheduler):
            return self is other
        return cfg == other._config()

    def __hash__(self) -> int:
        cfg = self._config()
        return id(self) if cfg is None else hash(cfg)

    def __repr__(self) -> str:
        cfg = self._config()
        args = repr(self.init_value) if cfg is None else ", ".join(repr(v) for v in cfg[1:])
        return f"{type(self).__name__}({args})"


class Constant(DecayScheduler):
    """The same value at every step: ``value(step) = init_value``."""

    @property
    def _constant(self) -> bool:
        return type(self) is Constant  # a subclass may override value()

    def _config(self) -> Optional[Tuple]:
        return (Constant, self.init_value) if type(self) is Constant else None

    def value(self, step: jax.Array) -> jax.Array:
        return jnp.full(jnp.shape(step), self.init_value, jnp.float32)


class ExponentialDecay(DecayScheduler):
    """``init_value * decay_rate ** (step / decay_steps)``; with ``staircase=True`` the exponent
    is ``floor(step / decay_steps)``, so the value drops once every ``decay_steps`` steps."""

    def __init__(self, init_value: float, decay_steps: int, decay_rate: float,
                 staircase: bool = False):
        super().__init__(init_value)
        name = type(self).__name__
        self.decay_steps = check_real(name, "decay_steps", decay_steps)
        if self.decay_steps <= 0:
            raise ValueError(f"{name}: decay_steps must be > 0, got {decay_steps}")
        self.decay_rate = check_real(name, "decay_rate", decay_rate)
        if self.decay_rate < 0:
            raise ValueError(f"{name}: decay_rate must be >= 0, got {decay_rate}")
        self.staircase = bool(staircase)

    def value(self, step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        exponent = step / jnp.float32(self.decay_steps)
        if self.staircase:
            exponent = jnp.floor(exponent)
        return jnp.float32(self.init_value) * jnp.power(jnp.float32(self.decay_rate), exponent)

    def _config(self) -> Optional[Tuple]:
        if type(self) is not ExponentialDecay:  # a subclass may depend on more than these
            return None
        return (ExponentialDecay, self.init_value, self.decay_steps, self.decay_rate,
                self.staircase)


@partial(jax.jit, static_argnums=0)
def eval_schedules(schedules: Tuple[DecayScheduler, ...], step: jax.Array) -> Tuple[jax.Array, ...]:
    return tuple(s.value(step) for s in schedules)


@partial(jax.jit, static_argnums=0)
def step_schedules(schedules: Tuple[DecayScheduler, ...], step: jax.Array):
    """One kernel for :meth:`Optimizer.step`: the next counter and every schedule's value there."""
    nxt = step + jnp.ones_like(step)
    return nxt, tuple(s.value(nxt) for s in schedules)


# --------------------------------------------------------------------------------------------
# Hyper-parameters: (name, SINGA's *_value attribute, valid interval) -- one table for all
# --------------------------------------------------------------------------------------------
_INF = math.inf
# name -> (value attribute, low, high, low inclusive, high inclusive)
HYPER_SPECS: Dict[str, Tuple[str, float, float, bool, bool]] = {
    "lr": ("lr_value", 0.0, _INF, True, False),
    "momentum": ("mom_value", 0.0, 1.0, True, False),
    "dampening": ("dam_value", 0.0, 1.0, True, True),
    "weight_decay": ("decay_value", 0.0, _INF, True, False),
    "rho": ("rho_value", 0.0, 1.0, True, False),
    "epsilon": ("epsilon_value", 0.0, _INF, False, False),
    "beta_1": ("beta_1_value", 0.0, 1.0, True, False),
    "beta_2": ("beta_2_value", 0.0, 1.0, True, False),
}


def _interval(lo: float, hi: float, lo_in: bool, hi_in: bool) -> str:
    return f"{'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def as_schedule(owner: str, name: str, value: Any) -> DecayScheduler:
    """A number becomes :class:`Constant`; a DecayScheduler is kept. Its (initial) value must lie
    in the interval of ``HYPER_SPECS[name]``."""
    if isinstance(value, DecayScheduler):
        sched, first = value, value.init_value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        first = check_real(owner, name, value)
        sched = Constant(first)
    else:
        raise TypeError(f"{owner}: {name} must be a number or a DecayScheduler, got "
                        f"{type(value).__name__} {value!r}")
    _, lo, hi, lo_in, hi_in = HYPER_SPECS[name]
    ok = (first >= lo if lo_in else first > lo) and (first <= hi if hi_in else first < hi)
    if not ok:
        raise ValueError(f"{owner}: invalid {name} value {value!r} (initial value {first:g}); "
                         f"expected a value in {_interval(lo, hi, lo_in, hi_in)}")
    return sched
