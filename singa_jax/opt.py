"""SINGA's ``opt`` module on JAX: optimizers and decay schedules.

An optimizer updates every parameter (a Tensor with ``stores_grad=True``) from the gradient that
``autograd.backward`` yields for it::

    sgd = opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-5)
    loss = ...                     # forward pass in training mode
    sgd(loss)                      # backward, update every parameter, step()

Everything the optimizer remembers is a plain :class:`~singa_jax.tensor.Tensor`:

* ``step_counter`` -- a float32 tensor of shape ``(1,)`` (SINGA's), incremented by :meth:`step`;
* one ``<hyper>_value`` tensor per hyper-parameter (``lr_value``, ``mom_value``, ...), the value of
  its :class:`DecayScheduler` at the current step, recomputed by :meth:`Optimizer.step` (a
  :class:`Constant`'s is set once and never rewritten). The update kernel evaluates the built-in
  (pure) schedules itself from ``step_counter``, so it reads only the values of user schedules
  that implement ``call`` on Tensors;
* per-parameter slots (``moments``, ``running_average``, ``history``, ``m``/``v``), dicts keyed by
  the parameter's name, created (zero) on the parameter's first update.

State only ever changes by rebinding ``tensor.data``, so graph mode can run the same code on
tracers inside one ``jax.jit`` and the schedule keeps advancing. One step updates all
parameters with ONE jitted kernel (:func:`_fused_update`) over the lists of
params/grads/slots; :meth:`Optimizer.update` runs the same kernel on a single parameter.

Slot keys and name clashes: SINGA keys slots by ``param.name``. Here the first parameter seen
with a name owns that key; a *different* live parameter with the same name gets ``name~1``,
``name~2``, ... in order of first update (deterministic for a given model, so checkpoints
restore onto a freshly built model). A key whose owner has been garbage-collected passes to
the next parameter of that name.

See docs/optimizers.md for the update rules and how they differ from PyTorch's.
"""
from __future__ import annotations

import math
import numbers
import weakref
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import tensor as _tensor
from .autograd.engine import backward as _backward
from .device import Device
from .tensor import Tensor

__all__ = ["DecayScheduler", "Constant", "ExponentialDecay", "Optimizer", "SGD", "RMSProp",
           "AdaGrad", "Adam", "DistOpt"]


# --------------------------------------------------------------------------------------------
# Decay schedules
# --------------------------------------------------------------------------------------------
def _check_real(owner: str, what: str, value: Any) -> float:
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
        self.init_value = _check_real(type(self).__name__, "init_value", init_value)

    def __call__(self, step: Tensor) -> Tensor:
        if not isinstance(step, Tensor):
            raise TypeError(f"{type(self).__name__}: step must be a Tensor (the step counter), "
                            f"got {type(step).__name__}")
        return self.call(step)

    def call(self, step: Tensor) -> Tensor:
        """The value at ``step`` (a Tensor) as a Tensor, computed by :meth:`value`."""
        if type(self).value is DecayScheduler.value:
            raise NotImplementedError(f"{type(self).__name__}: implement call(step) or value(step)")
        return Tensor(device=step.device, data=self.value(step.data), requires_grad=False)

    def value(self, step: jax.Array) -> jax.Array:
        """The value at ``step`` (a float array, possibly traced) as a float32 array."""
        out = self.call(Tensor(data=step, requires_grad=False))
        return out.data.astype(jnp.float32)

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
        self.decay_steps = _check_real(name, "decay_steps", decay_steps)
        if self.decay_steps <= 0:
            raise ValueError(f"{name}: decay_steps must be > 0, got {decay_steps}")
        self.decay_rate = _check_real(name, "decay_rate", decay_rate)
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
def _eval_schedules(schedules: Tuple[DecayScheduler, ...], step: jax.Array) -> Tuple[jax.Array, ...]:
    return tuple(s.value(step) for s in schedules)


@partial(jax.jit, static_argnums=0)
def _advance(schedules: Tuple[DecayScheduler, ...], step: jax.Array):
    """One kernel for :meth:`Optimizer.step`: the next counter and every schedule's value there."""
    nxt = step + jnp.ones_like(step)
    return nxt, tuple(s.value(nxt) for s in schedules)


# --------------------------------------------------------------------------------------------
# Hyper-parameters: (name, SINGA's *_value attribute, valid interval) -- one table for all
# --------------------------------------------------------------------------------------------
_INF = math.inf
# name -> (value attribute, low, high, low inclusive, high inclusive)
_HYPER_SPECS: Dict[str, Tuple[str, float, float, bool, bool]] = {
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


def _as_schedule(owner: str, name: str, value: Any) -> DecayScheduler:
    """A number becomes :class:`Constant`; a DecayScheduler is kept. Its (initial) value must lie
    in the interval of ``_HYPER_SPECS[name]``."""
    if isinstance(value, DecayScheduler):
        sched, first = value, value.init_value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        first = _check_real(owner, name, value)
        sched = Constant(first)
    else:
        raise TypeError(f"{owner}: {name} must be a number or a DecayScheduler, got "
                        f"{type(value).__name__} {value!r}")
    _, lo, hi, lo_in, hi_in = _HYPER_SPECS[name]
    ok = (first >= lo if lo_in else first > lo) and (first <= hi if hi_in else first < hi)
    if not ok:
        raise ValueError(f"{owner}: invalid {name} value {value!r} (initial value {first:g}); "
                         f"expected a value in {_interval(lo, hi, lo_in, hi_in)}")
    return sched


# --------------------------------------------------------------------------------------------
# Update rules: pure functions of (config, hyper values, step, param, grad, slots)
# --------------------------------------------------------------------------------------------
UpdateRule = Callable[[Tuple, Dict[str, jax.Array], jax.Array, jax.Array, jax.Array, Tuple],
                      Tuple[jax.Array, Tuple]]


def _sgd_rule(config, h, step, p, g, slots):
    """``buf = momentum*buf + (1-dampening)*g``; ``g = g + momentum*buf`` (nesterov) or ``buf``;
    ``p = p - lr*g``. Without momentum: ``p = p - lr*g``."""
    use_momentum, nesterov = config
    if use_momentum:
        (buf,) = slots
        buf = h["momentum"] * buf + (1 - h["dampening"]) * g
        g = g + h["momentum"] * buf if nesterov else buf
        slots = (buf,)
    return p - h["lr"] * g, slots


def _rmsprop_rule(config, h, step, p, g, slots):
    """``r = rho*r + (1-rho)*g^2``; ``p = p - lr * g / sqrt(r + epsilon)``."""
    (r,) = slots
    r = h["rho"] * r + (1 - h["rho"]) * jnp.square(g)
    return p - h["lr"] * g / jnp.sqrt(r + h["epsilon"]), (r,)


def _adagrad_rule(config, h, step, p, g, slots):
    """``s = s + g^2``; ``p = p - lr * g / sqrt(s + epsilon)``."""
    (s,) = slots
    s = s + jnp.square(g)
    return p - h["lr"] * g / jnp.sqrt(s + h["epsilon"]), (s,)


def _adam_rule(config, h, step, p, g, slots):
    """``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*g^2``; with ``t = step_counter + 1``:
    ``p = p - lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + epsilon)``."""
    m, v = slots
    b1, b2 = h["beta_1"], h["beta_2"]
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * jnp.square(g)
    t = step + 1
    m_hat = m / (1 - jnp.power(b1, t))
    v_hat = v / (1 - jnp.power(b2, t))
    return p - h["lr"] * m_hat / (jnp.sqrt(v_hat) + h["epsilon"]), (m, v)


@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _fused_update(rule: UpdateRule, config: Tuple, decay: bool,
                  schedules: Tuple[Tuple[str, DecayScheduler], ...], hyper: Dict[str, jax.Array],
                  step: jax.Array, params: List[jax.Array], grads: List[jax.Array],
                  slots: List[Tuple[jax.Array, ...]]):
    """One kernel updating every parameter of a step.

    Hyper-parameters with a pure schedule are evaluated here at ``step`` (the value SINGA keeps
    in ``*_value``), so the kernel needs no value tensors: a constant folds into the program;
    ``hyper`` holds the values of the other schedules. L2 weight decay
    (``g = g + weight_decay * p``) is applied first when ``decay``. Arithmetic runs in at least
    float32; results are cast back to each param's/slot's dtype.
    """
    hyper = {**{name: sched.value(step) for name, sched in schedules}, **hyper}
    new_params, new_slots = [], []
    step = step.reshape(()).astype(jnp.float32)
    for p, g, ss in zip(params, grads, slots):
        ct = jnp.promote_types(p.dtype, jnp.float32)
        h = {k: v.reshape(()).astype(ct) for k, v in hyper.items()}
        pc, gc = p.astype(ct), g.astype(ct)
        if decay:
            gc = gc + h["weight_decay"] * pc
        np_, nss = rule(config, h, step.astype(ct), pc, gc, tuple(s.astype(ct) for s in ss))
        new_params.append(np_.astype(p.dtype))
        new_slots.append(tuple(n.astype(s.dtype) for n, s in zip(nss, ss)))
    return new_params, new_slots


# --------------------------------------------------------------------------------------------
# Optimizer base
# --------------------------------------------------------------------------------------------
_KEY_SEP = "/"  # get_states() key of a slot: "<slot kind>/<param key>", e.g. "moments/W"


def _state_tensor(data: jax.Array, device: Optional[Device]) -> Tensor:
    return Tensor(device=device, data=data, requires_grad=False)


def _param_name(p: Tensor) -> Any:
    """SINGA's slot name of a parameter: its name, or its id when it has none."""
    return p.name if p.name is not None else id(p)


class Optimizer:
    """Base optimizer (SINGA's): a learning rate schedule, a step counter and per-param slots.

    Args:
        lr: learning rate, a number or a :class:`DecayScheduler` of the step count.
        dtype: SINGA's parameter dtype of the optimizer (kept for API compatibility; every
            param is updated in its own dtype, with at least float32 arithmetic).

    Subclasses declare ``_rule`` (a pure update of one param, see ``_sgd_rule``), the names of
    their slots (``_slot_kinds``) and call :meth:`_init_hypers` for their hyper-parameters. A
    user subclass may instead override :meth:`apply` (SINGA's way); :meth:`call` then applies
    it parameter by parameter.
    """

    _rule: Optional[UpdateRule] = None
    _slot_kinds: Tuple[str, ...] = ()
    # Bumped whenever the set of state Tensors may change (an attribute assigned, a slot created,
    # set_states): graph mode re-collects an optimizer's state only then.
    states_version = 0

    def __setattr__(self, name: str, value: Any) -> None:
        self._bump_states_version()
        if name in self.__dict__.get("_hyper_names", ()):
            # a new schedule (or number) for a hyper-parameter: validated like the
            # constructor's, and its *_value follows at once
            object.__setattr__(self, name, _as_schedule(type(self).__name__, name, value))
            self._refresh_values()
            return
        object.__setattr__(self, name, value)

    def _static_key(self) -> Tuple:
        """What a compiled step bakes in of this optimizer (its rule's switches and schedules):
        graph mode keys its programs on it, so assigning ``sgd.lr = ...`` compiles anew."""
        return (type(self), self._config(), tuple(self._schedules()))

    def _bump_states_version(self) -> None:
        object.__setattr__(self, "states_version", self.states_version + 1)

    def __init__(self, lr: Any, dtype: Any = _tensor.float32):
        self.dtype = _tensor.to_dtype(dtype)
        self._hyper_names: List[str] = []
        self._key_owner: Dict[str, "weakref.ref[Tensor]"] = {}
        self.step_counter = _state_tensor(jnp.zeros((1,), jnp.float32), None)
        self._init_hypers(lr=lr)

    # --- hyper-parameters -------------------------------------------------------------------
    def _init_hypers(self, **values: Any) -> None:
        """Turn each value into a schedule (validated) stored as ``self.<name>``, with its current
        value as the Tensor ``self.<SINGA value attribute>``."""
        owner = type(self).__name__
        scheds = {name: _as_schedule(owner, name, v) for name, v in values.items()}
        for name, sched in scheds.items():
            setattr(self, name, sched)
            if name not in self._hyper_names:
                self._hyper_names.append(name)
            setattr(self, _HYPER_SPECS[name][0],
                    _state_tensor(jnp.zeros((1,), jnp.float32), self.step_counter.device))
        self._refresh_values()

    def _schedules(self) -> List[DecayScheduler]:
        return [getattr(self, n) for n in self._hyper_names]

    def _value_tensors(self) -> List[Tensor]:
        return [getattr(self, _HYPER_SPECS[n][0]) for n in self._hyper_names]

    def _store_values(self, only_moving: bool, advance: bool) -> None:
        """Rebind the ``*_value`` tensors to their schedules' values at the step counter (after
        incrementing it when ``advance``): pure schedules in one kernel, the others by calling
        them on the counter Tensor. With ``only_moving``, constants are skipped: their value
        tensors already hold it, and leaving them untouched keeps them out of a compiled step."""
        pairs = [(s, t) for s, t in zip(self._schedules(), self._value_tensors())
                 if not (only_moving and s._constant)]
        pure = tuple(s for s, _ in pairs if s._pure)
        if advance:
            nxt, values = _advance(pure, self.step_counter.data)
            self.step_counter.data = nxt
        else:
            values = _eval_schedules(pure, self.step_counter.data) if pure else ()
        it = iter(values)
        for sched, t in pairs:
            t.data = next(it) if sched._pure else sched(self.step_counter).data

    def _refresh_values(self) -> None:
        self._store_values(only_moving=False, advance=False)

    def _update_hypers(self) -> Tuple[Tuple[Tuple[str, DecayScheduler], ...],
                                      Dict[str, jax.Array]]:
        """What the update kernel needs of the hyper-parameters: the pure schedules (static,
        evaluated inside it) and the current values of the others."""
        pure, values = [], {}
        for name, tensor in zip(self._hyper_names, self._value_tensors()):
            sched = getattr(self, name)
            if sched._pure:
                pure.append((name, sched))
            else:
                values[name] = tensor.data
        return tuple(pure), values

    def _config(self) -> Tuple:
        """Static switches of the update rule (part of the compiled kernel's cache key)."""
        return ()

    def _decay_on(self) -> bool:
        # SINGA applies weight decay only when its (initial) value is non-zero
        return "weight_decay" in self._hyper_names and self.weight_decay.init_value != 0

    def _active_slot_kinds(self) -> Tuple[str, ...]:
        return self._slot_kinds

    def _slot_dict(self, kind: str) -> Dict[str, Tensor]:
        return self.__dict__.setdefault(kind, {})

    # --- SINGA's API --------------------------------------------------------------------------
    def __call__(self, loss: Tensor) -> None:
        """Back-propagate from ``loss``, update every parameter, then :meth:`step`."""
        self.call(loss)
        self.step()

    def backward_and_update(self, loss: Tensor) -> None:
        """SINGA's older name of ``__call__``: backward, update all parameters, step."""
        self.__call__(loss)

    def call(self, loss: Tensor) -> None:
        """Back-propagate from ``loss`` and update every parameter (one fused kernel), without
        advancing the step counter."""
        self._apply_all(list(_backward(loss)))

    def _apply_all(self, pairs: Sequence[Tuple[Tensor, Tensor]]) -> None:
        """Update every ``(param, grad)``: one fused kernel, or a user subclass's ``apply``."""
        if self._uses_fused_update():
            self._update_pairs([(_param_name(p), p, g) for p, g in pairs])
        else:
            for p, g in pairs:
                self.apply(_param_name(p), p, g)

    def update(self, param: Tensor, grad: Tensor) -> None:
        """Update one parameter with its gradient (keyed by ``param.name``); no step()."""
        self.apply(_param_name(param), param, grad)

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        """Update ``param_value`` in place (its ``.data`` is rebound) from ``param_grad``, using
        the slots kept under ``param_name``. The gradient is left unchanged."""
        if self._rule is None:
            raise NotImplementedError(f"{type(self).__name__}: the base Optimizer has no update "
                                      f"rule; use SGD, RMSProp, AdaGrad or Adam, or override apply")
        self._update_pairs([(param_name, param_value, param_grad)])

    def step(self) -> None:
        """Increment the step counter and recompute every scheduled hyper-parameter at it."""
        self._store_values(only_moving=True, advance=True)

    def device_check(self, *inputs: Tensor) -> None:
        """Move every Tensor of ``inputs`` onto the device of the first one (SINGA's helper)."""
        if not inputs:
            return
        target = inputs[0].device
        for t in inputs[1:]:
            if t.device is not target:
                t.to_device(target)

    def get_states(self) -> Dict[str, Tensor]:
        """``{'step_counter': Tensor, '<slot kind>/<param key>': Tensor, ...}``.

        A flat dict of the optimizer's own Tensors (not copies; they are rebound by later steps),
        so it can go straight into a checkpoint (e.g. ``Model.save_states(path, aux_states=...)``).
        Slot kinds use SINGA's names: ``moments`` (SGD), ``running_average`` (RMSProp),
        ``history`` (AdaGrad), ``m`` and ``v`` (Adam). Schedules have no state besides the step.
        """
        states: Dict[str, Tensor] = {"step_counter": self.step_counter}
        for kind in self._slot_kinds:
            for key, t in self._slot_dict(kind).items():
                states[f"{kind}{_KEY_SEP}{key}"] = t
        return states

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_states` returned (Tensors, NumPy or jax arrays). SINGA's nested
        form ``{'step_counter': 3.0, 'moments': {name: tensor}}`` is accepted too. Everything is
        validated before any state changes."""
        owner = type(self).__name__
        if not isinstance(states, Mapping):
            raise TypeError(f"{owner}.set_states: expected a dict, got {type(states).__name__}")
        slots: Dict[str, Dict[str, jax.Array]] = {k: {} for k in self._slot_kinds}
        counter = None
        for key, value in states.items():
            if key == "step_counter":
                counter = self._state_array(key, value)
                if counter.size != 1:
                    raise ValueError(f"{owner}.set_states: step_counter must hold one value, got "
                                     f"shape {tuple(counter.shape)}")
                counter = counter.reshape((1,)).astype(jnp.float32)
                continue
            kind, sep, pkey = str(key).partition(_KEY_SEP)
            if kind in slots and isinstance(value, Mapping) and not sep:  # SINGA's nested form
                for k, v in value.items():
                    slots[kind][str(k)] = self._state_array(f"{kind}[{k!r}]", v)
            elif kind in slots and sep:
                slots[kind][pkey] = self._state_array(key, value)
            else:
                raise ValueError(f"{owner}.set_states: unknown state {key!r}; expected "
                                 f"'step_counter' or '<kind>{_KEY_SEP}<param name>' with kind in "
                                 f"{list(self._slot_kinds)}")
        if counter is not None:
            self.step_counter.data = self.step_counter.device.put(counter)
        self._bump_states_version()
        for kind, new in slots.items():
            d = self._slot_dict(kind)
            d.clear()  # keep the dict object: SINGA exposes it as an attribute
            d.update({k: _state_tensor(a, self.step_counter.device) for k, a in new.items()})
        self._refresh_values()

    def _state_array(self, what: str, value: Any) -> jax.Array:
        if isinstance(value, Tensor):
            return value.data
        if isinstance(value, (jax.Array, jax.core.Tracer)):
            return value
        try:
            arr = np.asarray(value)
        except Exception as e:  # pragma: no cover - exotic objects
            raise TypeError(f"{type(self).__name__}.set_states: {what} is not an array "
                            f"({type(value).__name__})") from e
        if not np.issubdtype(arr.dtype, np.number):
            raise TypeError(f"{type(self).__name__}.set_states: {what} must be numeric, got "
                            f"dtype {arr.dtype}")
        return jnp.asarray(arr)

    # --- the fused update ---------------------------------------------------------------------
    def _uses_fused_update(self) -> bool:
        return self._rule is not None and type(self).apply is Optimizer.apply

    def _slot_key(self, name: Any, param: Tensor) -> str:
        """The slot key of ``param``: its name, or ``name~N`` when another live parameter
        already owns that name (see the module docstring)."""
        base = str(name)
        key, n = base, 0
        while True:
            ref = self._key_owner.get(key)
            owner = ref() if ref is not None else None
            if owner is None or owner is param:
                if owner is None:
                    self._key_owner[key] = weakref.ref(param)
                return key
            n += 1
            key = f"{base}~{n}"

    def _check_pair(self, name: Any, p: Tensor, g: Tensor) -> None:
        owner = type(self).__name__
        if not isinstance(p, Tensor) or not isinstance(g, Tensor):
            raise TypeError(f"{owner}: param and grad must be Tensors, got "
                            f"{type(p).__name__} and {type(g).__name__} for {name!r}")
        if not jnp.issubdtype(p.dtype, jnp.inexact) or not jnp.issubdtype(g.dtype, jnp.inexact):
            raise TypeError(f"{owner}: param {name!r} ({p.dtype}) and its grad ({g.dtype}) must "
                            f"be floating point")
        if p.shape != g.shape:
            raise ValueError(f"{owner}: shape mismatch for param {name!r}: param {p.shape}, "
                             f"grad {g.shape}")

    def _update_pairs(self, triples: Sequence[Tuple[Any, Tensor, Tensor]]) -> None:
        """Update every ``(name, param, grad)`` with one kernel per device."""
        if not triples:
            return
        for name, p, g in triples:  # validate everything before any state changes
            self._check_pair(name, p, g)
        kinds = self._active_slot_kinds()
        keys = [self._slot_key(name, p) for name, p, _ in triples]
        for key, (name, p, _) in zip(keys, triples):
            for kind in kinds:
                s = self._slot_dict(kind).get(key)
                if s is not None and s.shape != p.shape:
                    raise ValueError(f"{type(self).__name__}: slot {kind!r} of param {name!r} "
                                     f"(key {key!r}) has shape {s.shape} but the param has "
                                     f"shape {p.shape}")
        slot_tensors = [[self._get_slot(kind, key, p) for kind in kinds]
                        for key, (_, p, _) in zip(keys, triples)]
        by_device: Dict[Device, List[int]] = {}
        for i, (_, p, _) in enumerate(triples):
            by_device.setdefault(p.device, []).append(i)
        schedules, hyper = self._update_hypers()
        step = self.step_counter.data
        for dev, idx in by_device.items():
            h, s = hyper, step
            if dev is not self.step_counter.device:  # arrays of one kernel share a device
                h = {k: dev.put(v) for k, v in hyper.items()}
                s = dev.put(step)
            new_ps, new_slots = _fused_update(
                type(self)._rule, self._config(), self._decay_on(), schedules, h, s,
                [triples[i][1].data for i in idx], [triples[i][2].data for i in idx],
                [tuple(t.data for t in slot_tensors[i]) for i in idx])
            for i, np_, nss in zip(idx, new_ps, new_slots):
                triples[i][1].data = np_
                for t, a in zip(slot_tensors[i], nss):
                    t.data = a

    def _get_slot(self, kind: str, key: str, p: Tensor) -> Tensor:
        d = self._slot_dict(kind)
        t = d.get(key)
        if t is None:  # created lazily; a new Tensor, so graph mode sees it as new state
            t = d[key] = _state_tensor(jnp.zeros(p.shape, p.dtype), p.device)
            self._bump_states_version()
        elif t.device is not p.device:
            t.to_device(p.device)
        return t


# --------------------------------------------------------------------------------------------
# The optimizers
# --------------------------------------------------------------------------------------------
class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (SINGA's form).

    With ``g`` the gradient plus ``weight_decay * p``::

        buf = momentum * buf + (1 - dampening) * g       (buf starts at 0)
        g   = g + momentum * buf   if nesterov   else   buf
        p   = p - lr * g

    Without momentum (``momentum`` whose initial value is 0): ``p = p - lr * g``. Unlike PyTorch,
    the first step also dampens (``buf = (1 - dampening) * g``, not ``buf = g``).
    """

    _rule = staticmethod(_sgd_rule)
    _slot_kinds = ("moments",)

    def __init__(self, lr: Any = 0.1, momentum: Any = 0, dampening: Any = 0,
                 weight_decay: Any = 0, nesterov: bool = False, dtype: Any = _tensor.float32):
        super().__init__(lr, dtype)
        self._init_hypers(momentum=momentum, dampening=dampening, weight_decay=weight_decay)
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum.init_value <= 0 or self.dampening.init_value != 0):
            raise ValueError(f"SGD: Nesterov momentum requires a momentum > 0 and zero dampening, "
                             f"got momentum={momentum!r}, dampening={dampening!r}")
        self.moments = self._slot_dict("moments")

    def _config(self) -> Tuple:
        return (self._momentum_on(), self.nesterov)

    def _momentum_on(self) -> bool:
        return self.momentum.init_value != 0  # SINGA's switch: the initial momentum

    def _active_slot_kinds(self) -> Tuple[str, ...]:
        return self._slot_kinds if self._momentum_on() else ()


class RMSProp(Optimizer):
    """RMSProp (SINGA's form; epsilon inside the square root)::

        r = rho * r + (1 - rho) * g^2
        p = p - lr * g / sqrt(r + epsilon)
    """

    _rule = staticmethod(_rmsprop_rule)
    _slot_kinds = ("running_average",)

    def __init__(self, lr: Any = 0.1, rho: Any = 0.9, epsilon: Any = 1e-8, weight_decay: Any = 0):
        super().__init__(lr)
        self._init_hypers(weight_decay=weight_decay, rho=rho, epsilon=epsilon)
        self.running_average = self._slot_dict("running_average")


class AdaGrad(Optimizer):
    """AdaGrad (SINGA's form; epsilon inside the square root)::

        s = s + g^2
        p = p - lr * g / sqrt(s + epsilon)
    """

    _rule = staticmethod(_adagrad_rule)
    _slot_kinds = ("history",)

    def __init__(self, lr: Any = 0.1, epsilon: Any = 1e-8, weight_decay: Any = 0):
        super().__init__(lr)
        self._init_hypers(weight_decay=weight_decay, epsilon=epsilon)
        self.history = self._slot_dict("history")


class Adam(Optimizer):
    """Adam (bias-corrected; the same rule as PyTorch's ``Adam`` with L2 weight decay)::

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g^2
        t = step_counter + 1
        p = p - lr * (m / (1 - beta_1^t)) / (sqrt(v / (1 - beta_2^t)) + epsilon)
    """

    _rule = staticmethod(_adam_rule)
    _slot_kinds = ("m", "v")

    def __init__(self, lr: Any = 0.1, beta_1: Any = 0.9, beta_2: Any = 0.999,
                 epsilon: Any = 1e-8, weight_decay: Any = 0):
        super().__init__(lr)
        self._init_hypers(weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
                          epsilon=epsilon)
        self.m = self._slot_dict("m")
        self.v = self._slot_dict("v")


# --------------------------------------------------------------------------------------------
# DistOpt: SINGA's data-parallel wrapper, on one process and one device
# --------------------------------------------------------------------------------------------
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
    """SINGA's sparsified all-reduce over one replica, on the concatenation of ``arrays``.

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


def _arrays_of(items: Any) -> Tuple[List[Any], bool]:
    """``items`` (a Tensor, an array, or a list of them) as a list, and whether it was a list."""
    if isinstance(items, (list, tuple)):
        return list(items), True
    return [items], False


def _data(x: Any) -> jax.Array:
    return x.data if isinstance(x, Tensor) else jnp.asarray(x)


def _write_back(items: List[Any], new: List[jax.Array], as_list: bool) -> Any:
    """Rebind each Tensor of ``items`` to its new array (in place, as SINGA's communicator
    writes into the buffers); return the new arrays in the caller's shape."""
    for t, a in zip(items, new):
        if isinstance(t, Tensor):
            t.data = a
    return list(new) if as_list else new[0]


class DistOpt:
    """SINGA's distributed optimizer wrapper, as a documented single-device pass-through.

    SINGA all-reduces gradients across ``world_size`` processes with NCCL. This implementation
    runs ONE process on ONE device (even when several JAX devices exist): the all-reduce of one
    replica is the identity, so :meth:`backward_and_update` equals the wrapped optimizer's step.
    The half-precision variants round gradients to float16 (what a float16 all-reduce of one
    replica returns) and the sparse variants keep only the values SINGA would send (with its
    gradient accumulation). ``world_size`` other than 1 is rejected. Attributes not defined
    here (``step_counter``, ``get_states``, ...) are those of the wrapped optimizer.
    """

    def __init__(self, opt: Optional[Optimizer] = None, nccl_id: Any = None,
                 local_rank: Optional[int] = None, world_size: Optional[int] = None,
                 buffSize: int = 4194304):
        if opt is None:
            opt = SGD()
        if not isinstance(opt, Optimizer):
            raise TypeError(f"DistOpt: opt must be an Optimizer, got {type(opt).__name__}")
        if world_size not in (None, 1):
            raise ValueError(f"DistOpt: world_size={world_size!r} is not supported: singa_jax's "
                             f"DistOpt runs one process on one device (world_size 1)")
        if local_rank not in (None, 0):
            raise ValueError(f"DistOpt: local_rank={local_rank!r} is not supported: the only "
                             f"process has rank 0")
        if isinstance(buffSize, bool) or not isinstance(buffSize, numbers.Integral) or buffSize <= 0:
            raise ValueError(f"DistOpt: buffSize must be a positive int, got {buffSize!r}")
        self.opt = opt
        self.nccl_id = nccl_id
        self.buffSize = int(buffSize)
        self.world_size = 1
        self.local_rank = 0
        self.global_rank = 0

    def __getattr__(self, name: str) -> Any:
        opt = self.__dict__.get("opt")
        if opt is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(opt, name)

    def __call__(self, loss: Tensor) -> None:
        self.backward_and_update(loss)

    def update(self, param: Tensor, grad: Tensor) -> None:
        """Update one parameter with the (all-reduced, averaged) gradient."""
        self.opt.update(param, grad)  # the average over world_size == 1 replica is grad itself

    # --- collectives over one replica ---------------------------------------------------------
    def all_reduce(self, tensor: Any) -> Any:
        """Sum ``tensor`` over all replicas: with one replica, ``tensor`` itself."""
        return tensor

    def fused_all_reduce(self, tensor: Any, send: bool = True) -> Any:
        """All-reduce a list of tensors through one fused buffer: the identity on one replica."""
        return tensor

    def all_reduce_half(self, tensor: Any) -> Any:
        """All-reduce in float16: on one replica each value is rounded to float16."""
        return self.fused_all_reduce_half(tensor)

    def fused_all_reduce_half(self, tensor: Any, send: bool = True) -> Any:
        """Fused float16 all-reduce; ``send=False`` only stages the tensors (no change yet)."""
        items, as_list = _arrays_of(tensor)
        if not send or not items:
            return tensor
        return _write_back(items, _round_half([_data(t) for t in items], None), as_list)

    def sparsification(self, tensor: Any, accumulation: Any, spars: float, topK: bool) -> Any:
        """Sparsified all-reduce of one tensor (see :meth:`fused_sparsification`)."""
        return self.fused_sparsification(tensor, accumulation, spars, topK)

    def fused_sparsification(self, tensor: Any, accumulation: Any, spars: float,
                             topK: bool) -> Any:
        """Sparsified all-reduce of the concatenation of ``tensor`` (a tensor or a list).

        With ``topK=False`` the values with ``|x| >= spars`` are kept, with ``topK=True`` the
        ``ceil(spars * size)`` largest by magnitude; the others become zero. When
        ``accumulation`` is given it is added first and receives what was not sent.
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
        new, new_acc = _sparsify(arrays, acc, spars, bool(topK))
        if isinstance(accumulation, Tensor):
            accumulation.data = new_acc
        return _write_back(items, new, as_list)

    def wait(self) -> None:
        """Wait for the communication streams: nothing is in flight on one replica."""

    # --- backward + update --------------------------------------------------------------------
    def _finish(self, pairs: List[Tuple[Tensor, Tensor]]) -> None:
        self.opt._apply_all(pairs)
        self.opt.step()

    def backward_and_update(self, loss: Tensor, threshold: int = 2097152) -> None:
        """Backward from ``loss``, all-reduce the gradients (identity), update every parameter
        in one fused kernel and step. ``threshold`` (fusion size) has no effect on one replica."""
        self._finish(list(_backward(loss)))

    def backward_and_update_half(self, loss: Tensor, threshold: int = 2097152,
                                 clipping: bool = False, clip_Value: float = 100) -> None:
        """As :meth:`backward_and_update`, with gradients optionally clipped to
        ``[-clip_Value, clip_Value]`` and communicated (so rounded) in float16."""
        pairs = list(_backward(loss))
        for p, _ in pairs:
            if p.dtype != _tensor.float32:
                raise TypeError(f"DistOpt.backward_and_update_half: param {p.name!r} is "
                                f"{p.dtype}; only float32 params are sent as float16")
        clip = _check_real("DistOpt", "clip_Value", clip_Value) if clipping else None
        if pairs:
            new = _round_half([g.data for _, g in pairs], clip)
            _write_back([g for _, g in pairs], new, True)
        self._finish(pairs)

    def backward_and_partial_update(self, loss: Tensor, threshold: int = 2097152) -> None:
        """SINGA's asynchronous variant: every parameter is updated locally and one partition of
        them is all-reduced per call. On one replica every partition is already in sync, so this
        is a local update of every parameter and a step."""
        self._finish(list(_backward(loss)))

    def backward_and_sparse_update(self, loss: Tensor, threshold: int = 2097152,
                                   spars: float = 0.05, topK: bool = False,
                                   corr: bool = True) -> None:
        """Backward, sparsified all-reduce of the gradients, update, step.

        As in SINGA, a gradient larger than ``threshold`` values is sparsified on its own; the
        smaller ones are fused in order into groups of more than ``threshold`` values (the last
        group may be smaller). With ``corr`` each group keeps a local accumulation of what it did
        not send (``self.gradAccumulation``), added back at the next call.
        """
        pairs = list(_backward(loss))
        groups: List[List[Tensor]] = []
        pending, pending_size = [], 0
        for _, g in pairs:
            if g.size() > threshold:
                groups.append([g])
                continue
            pending.append(g)
            pending_size += g.size()
            if pending_size > threshold:
                groups.append(pending)
                pending, pending_size = [], 0
        if pending:
            groups.append(pending)
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
        self._finish(pairs)
