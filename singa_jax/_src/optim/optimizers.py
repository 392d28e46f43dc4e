"""The optimizers of ``singa_jax.opt``: :class:`Optimizer`, :class:`SGD`, :class:`RMSProp`,
:class:`AdaGrad` and :class:`Adam`.

Holds the :class:`Optimizer` base with its hyper-parameters, step counter, per-parameter slots
and ``get_states``/``set_states``, and the state helpers ``state_tensor`` and ``param_name``;
the update rules and kernels they call are in :mod:`~singa_jax._src.optim.update`. How state is kept
and keyed is described in the package docstring (:mod:`singa_jax.opt`).
"""
from __future__ import annotations

import operator
import weakref
from functools import partial
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax._src.autodiff.backward import backward as _backward
from singa_jax._src.base import observe
from singa_jax._src.runtime.device import Device
from singa_jax._src.base.dtypes import is_inexact
from singa_jax._src.base.modes import autocast_dtype, current_trace_hook
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.eager import replay
from singa_jax._src.optim.schedules import (HYPER_SPECS, DecayScheduler, as_schedule,
                                            step_schedules, eval_schedules)


from singa_jax._src.optim.update import (UpdateRule, advance_unless_skipped, fused_update,
                                         SEPARATE_TEST_FROM, finite_test)
from singa_jax._src.optim.replayed_update import (record_update, recording_device,
                                                  step_recording_device)
from singa_jax._src.optim.guard import SKIP_FIELDS, SkipReports
from singa_jax._src.optim.update_layout import UpdateLayout, aval_of, device_of
from singa_jax._src.base.dtypes import float32, to_dtype


# --------------------------------------------------------------------------------------------
# Optimizer base
# --------------------------------------------------------------------------------------------
_KEY_SEP = "/"  # get_states() key of a slot: "<slot kind>/<param key>", e.g. "moments/W"
# float16 loss scaling's state: one float32 Tensor ``_loss_scale`` of these two fields, made at
# the first update under ``autograd.autocast('float16')``: the scale, and the count of clean
# (finite) updates since the scale last changed.
_SCALE_FIELDS = ("scale", "clean_steps")


def _backend_started() -> bool:
    """Whether a JAX backend runs already (then an optimizer makes its state at once)."""
    from jax._src import xla_bridge  # no public query exists; it is a plain flag read
    return xla_bridge.backends_are_initialized()


def state_tensor(data: jax.Array, device: Optional[Device]) -> Tensor:
    return Tensor(device=device, data=data, requires_grad=False)


def param_name(p: Tensor) -> Any:
    """SINGA's slot name of a parameter: its name, or its id when it has none."""
    return p.name if p.name is not None else id(p)


class Optimizer(SkipReports):
    """Base optimizer (SINGA's): a learning rate schedule, a step counter and per-param slots.

    Args:
        lr: learning rate, a number or a :class:`DecayScheduler` of the step count.
        dtype: SINGA's parameter dtype of the optimizer (kept for API compatibility; every
            param is updated in its own dtype, with at least float32 arithmetic).

    Non-finite steps: while ``skip_nonfinite`` is True (the default), an update whose
    gradients -- or loss, for ``opt(loss)`` -- hold NaN or inf changes nothing: parameters,
    slots and ``step_counter`` keep their values (decided inside the fused kernel, without a
    host sync). ``skipped_steps`` (an int32 Tensor of shape (1,)) counts such steps, and a
    :class:`NonFiniteStepWarning` names each one at the next optimizer call (or graph-mode
    step) after it has finished. ``opt.skip_nonfinite = False`` restores SINGA's behaviour
    (the NaN is applied). A user subclass overriding :meth:`apply` is never guarded.

    float16 loss scaling: an optimizer called inside ``autograd.autocast('float16')`` (or by a
    Model compiled with ``autocast='float16'``) back-propagates ``loss * scale``, divides the
    gradients by ``scale`` in the fused update, and on a non-finite gradient skips the step
    (counted in ``skipped_steps``, even with ``skip_nonfinite = False``; not warned about: it
    is how the scale finds its level) and halves the scale; after
    ``loss_scale_growth_interval`` clean updates in a row it doubles it. The scale starts at
    ``init_loss_scale``, is readable as :attr:`loss_scale` and is saved by :meth:`get_states`
    (key ``loss_scale``) once it exists.

    Subclasses declare ``_rule`` (a pure update of one param, see ``sgd_rule``), the names of
    their slots (``_slot_kinds``) and call :meth:`_init_hypers` for their hyper-parameters. A
    user subclass may instead override :meth:`apply` (SINGA's way); :meth:`call` then applies
    it parameter by parameter.
    """

    _rule: Optional[UpdateRule] = None
    _slot_kinds: Tuple[str, ...] = ()
    skip_nonfinite: bool = True  # skip (and count) steps with NaN/inf gradients or loss
    init_loss_scale: float = 2.0 ** 16  # float16 loss scaling (PyTorch's GradScaler's values)
    loss_scale_growth_interval: int = 2000

    def __setattr__(self, name: str, value: Any) -> None:
        self._bump_states_version()
        if name in self.__dict__.get("_hyper_names", ()):
            # a new schedule (or number) for a hyper-parameter: validated like the
            # constructor's, and its *_value follows at once
            object.__setattr__(self, name, as_schedule(type(self).__name__, name, value))
            self._refresh_values()
            return
        object.__setattr__(self, name, value)

    def _static_key(self) -> Tuple:
        """What a compiled step bakes in of this optimizer (its rule's switches and schedules):
        graph mode keys its programs on it, so assigning ``sgd.lr = ...`` compiles anew."""
        return (type(self), self._config(), tuple(self._schedules()), self._guarded())

    def _bump_states_version(self) -> None:
        # read from __dict__: a subclass may assign attributes before calling __init__
        version = self.__dict__.get("states_version", 0)
        object.__setattr__(self, "states_version", version + 1)

    def __init__(self, lr: Any, dtype: Any = float32):
        # Per-object counter, bumped whenever the set of state Tensors may change (an attribute
        # assigned, a slot created, set_states): graph mode re-collects an optimizer's state
        # only then (Model reads ``optimizer.states_version``).
        object.__setattr__(self, "states_version", self.__dict__.get("states_version", 0))
        self.dtype = to_dtype(dtype)
        self._hyper_names: List[str] = []
        self._key_owner: Dict[str, "weakref.ref[Tensor]"] = {}
        # step_counter and the *_value tensors are made on first use (see __getattr__), so that
        # constructing an optimizer starts no JAX backend: DistOpt, wrapping it afterwards, must
        # call jax.distributed.initialize before the backend starts
        self._lazy_state: List[str] = ["step_counter", "_skip_state"]
        self._init_hypers(lr=lr)
        if _backend_started():
            self._make_state()

    def __getattr__(self, name: str) -> Any:
        # reached only when normal lookup fails: a state tensor not made yet
        if name in self.__dict__.get("_lazy_state", ()):
            self._make_state()
            return self.__dict__[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _make_state(self) -> None:
        """Create the step counter and the ``*_value`` tensors (at the counter's values)."""
        lazy = self.__dict__["_lazy_state"]
        self.__dict__["_lazy_state"] = []
        if "step_counter" in lazy:
            self.step_counter = state_tensor(jnp.zeros((1,), jnp.float32), None)
            self._skip_state = state_tensor(jnp.zeros((len(SKIP_FIELDS),), jnp.float32),
                                             self.step_counter.device)
        for name in lazy:
            if name not in ("step_counter", "_skip_state"):
                setattr(self, name,
                        state_tensor(jnp.zeros((1,), jnp.float32), self.step_counter.device))
        self._refresh_values()

    @property
    def skipped_steps(self) -> Tensor:
        """How many updates ``skip_nonfinite`` skipped: a new int32 Tensor of shape (1,) (reading
        its value waits for the steps before it). Not part of :meth:`get_states`, whose keys
        are SINGA's."""
        return Tensor(device=self._skip_state.device, data=self._skip_state.array[:1].astype(
            jnp.int32), requires_grad=False)

    @property
    def loss_scale(self) -> Optional[Tensor]:
        """float16 loss scaling's current scale: a new float32 Tensor of shape (1,), or None
        before the first update under ``autocast('float16')``."""
        state = self.__dict__.get("_loss_scale")
        if state is None:
            return None
        return Tensor(device=state.device, data=state.array[:1], requires_grad=False)

    def _scaling(self) -> bool:
        """Whether this update is loss-scaled: inside ``autocast('float16')``, fused kernel."""
        return autocast_dtype() == jnp.float16 and self._uses_fused_update()

    def _scale_state(self) -> Tensor:
        """The loss scale's state Tensor (fields ``_SCALE_FIELDS``), made on first use."""
        state = self.__dict__.get("_loss_scale")
        if state is None:
            state = self._loss_scale = state_tensor(self._initial_scale(),
                                                     self.step_counter.device)
        return state

    def _initial_scale(self) -> np.ndarray:
        """The loss scale's state a scaled run starts from: the scale, no clean steps yet."""
        return np.array([self.init_loss_scale, 0.0], np.float32)

    def _gradients(self, loss: Tensor) -> List[Tuple[Tensor, Tensor]]:
        """Back-propagate from ``loss`` -- times the loss scale when loss-scaled (the update
        divides it out) -- and return every ``(param, grad)``."""
        if not self._scaling():
            return list(_backward(loss))
        scale = Tensor(device=loss.device, data=self._scale_state().array[0],
                       requires_grad=False)
        return list(_backward(loss, scale))

    # --- hyper-parameters -------------------------------------------------------------------
    def _init_hypers(self, **values: Any) -> None:
        """Turn each value into a schedule (validated) stored as ``self.<name>``, with its current
        value as the Tensor ``self.<SINGA value attribute>``."""
        owner = type(self).__name__
        scheds = {name: as_schedule(owner, name, v) for name, v in values.items()}
        for name, sched in scheds.items():
            setattr(self, name, sched)
            if name not in self._hyper_names:
                self._hyper_names.append(name)
            self.__dict__.pop(HYPER_SPECS[name][0], None)
            self._lazy_state.append(HYPER_SPECS[name][0])
        if "step_counter" not in self._lazy_state or _backend_started():
            self._make_state()  # the state exists already, or creating it starts nothing

    def _schedules(self) -> List[DecayScheduler]:
        return [getattr(self, n) for n in self._hyper_names]

    def _value_tensors(self) -> List[Tensor]:
        return [getattr(self, HYPER_SPECS[n][0]) for n in self._hyper_names]

    def _store_values(self, only_moving: bool, advance: bool) -> None:
        """Rebind the ``*_value`` tensors to their schedules' values at the step counter (after
        incrementing it when ``advance``): pure schedules in one kernel, the others by calling
        them on the counter Tensor. With ``only_moving``, constants are skipped: their value
        tensors already hold it, and leaving them untouched keeps them out of a compiled step."""
        pairs = [(s, t) for s, t in zip(self._schedules(), self._value_tensors())
                 if not (only_moving and s._constant)]
        pure = tuple(s for s, _ in pairs if s._pure)
        if advance:
            # the counter (and, under the guard, its state) advanced by one kernel
            state = [self.step_counter] + ([self._skip_state] if self._guarded() else [])
            kernel = advance_unless_skipped if len(state) == 2 else step_schedules
            device = step_recording_device(state) if len(pure) == len(pairs) else None
            if device is not None:
                # the update this step follows was recorded (see .replayed_update): so is the
                # step, whose outputs the next step's program can then be predicted to take
                # (see replay._Plan)
                nxt, values, *rest = replay.run(kernel, (pure,), [t._data for t in state],
                                                device)
                if rest and self.__dict__.get("_skip_watch") is state[1]._data:
                    # (the report watches the cleared state: the same counts, and one output
                    # fewer for the program to return)
                    self.__dict__["_skip_watch"] = rest[0]
                replay.bind_all(state + [t for _, t in pairs], [nxt, *rest, *values])
                return
            nxt, values, *rest = kernel(pure, *[t.array for t in state])
            for t, a in zip(state, [nxt, *rest]):
                t.array = a
        else:
            values = eval_schedules(pure, self.step_counter.array) if pure else ()
        it = iter(values)
        for sched, t in pairs:
            t.array = next(it) if sched._pure else sched(self.step_counter).array

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
                values[name] = tensor.array
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
        if type(self).call is not Optimizer.call:  # (a subclass's own call)
            self.call(loss)
            self.step()
            return
        # call()'s work, with step() before the flush: a recorded update's step joins the
        # step's program (see _store_values)
        self._apply_all(self._gradients(loss), loss)
        self.step()
        replay.flush()

    def backward_and_update(self, loss: Tensor) -> None:
        """SINGA's older name of ``__call__``: backward, update all parameters, step."""
        self.__call__(loss)

    def call(self, loss: Tensor) -> None:
        """Back-propagate from ``loss`` and update every parameter (one fused kernel), without
        advancing the step counter. The graph is kept (SINGA's rule), so the same loss can be
        back-propagated again; a graph freed by ``loss.backward()`` raises RuntimeError."""
        self._apply_all(self._gradients(loss), loss)
        # a step that eager replay recorded (forward, walk, update) ends here: it runs now
        # (asynchronously), so a loop that reads nothing between steps still records each
        # step as one recurring segment
        replay.flush()

    def _apply_all(self, pairs: Sequence[Tuple[Tensor, Tensor]],
                   loss: Optional[Tensor] = None) -> None:
        """Update every ``(param, grad)``: one fused kernel, or a user subclass's ``apply``.
        ``loss`` (when known) is checked for NaN/inf along with the gradients."""
        if observe.on and not observe.inside("update"):  # (a profiler, a trace naming it)
            return observe.update_call(self, partial(self._apply_all, pairs, loss))
        if self._uses_fused_update():
            self._update_pairs([(param_name(p), p, g) for p, g in pairs], loss)
        else:
            for p, g in pairs:
                self.apply(param_name(p), p, g)

    def update(self, param: Tensor, grad: Tensor) -> None:
        """Update one parameter with its gradient (keyed by ``param.name``); no step()."""
        self.apply(param_name(param), param, grad)

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
        if "_loss_scale" in self.__dict__:
            states["loss_scale"] = self._loss_scale
        return states

    def set_states(self, states: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_states` returned (Tensors, NumPy or jax arrays). SINGA's nested
        form ``{'step_counter': 3.0, 'moments': {name: tensor}}`` is accepted too.

        The whole dict is validated first -- names, that slots are floating point, and shapes
        against the slot (or parameter) already known under that key -- and nothing changes
        on error. Exactly the entries given are set: a slot or ``step_counter`` the dict does
        not mention keeps its value (SINGA, too, leaves the kinds a dict omits alone; here
        that holds per slot). A value is cast to the dtype of the slot or parameter it replaces.
        """
        owner = type(self).__name__
        if not isinstance(states, Mapping):
            raise TypeError(f"{owner}.set_states: expected a dict, got {type(states).__name__}")
        counter = scale = None
        staged: List[Tuple[str, str, jax.Array]] = []  # (kind, key, array), all validated
        for key, value in states.items():
            if key == "step_counter":
                counter = self._checked_counter(value)
                continue
            if key == "loss_scale":
                scale = self._checked_scale(value)
                continue
            kind, sep, pkey = str(key).partition(_KEY_SEP)
            if kind in self._slot_kinds and isinstance(value, Mapping) and not sep:  # nested form
                staged += [(kind, str(k), self._checked_slot(f"{kind}[{k!r}]", kind, str(k), v))
                           for k, v in value.items()]
            elif kind in self._slot_kinds and sep:
                staged.append((kind, pkey, self._checked_slot(key, kind, pkey, value)))
            else:
                raise ValueError(f"{owner}.set_states: unknown state {key!r}; expected "
                                 f"'step_counter' or '<kind>{_KEY_SEP}<param name>' with kind in "
                                 f"{list(self._slot_kinds)}")
        # everything is valid: only now does any state change
        if counter is not None:
            self.step_counter.array = self.step_counter.device.put(counter)
        if scale is not None:
            self._scale_state().array = self.step_counter.device.put(scale)
        for kind, key, arr in staged:
            slots = self._slot_dict(kind)  # the dict object stays: SINGA exposes it
            if key in slots:
                slots[key].array = slots[key].device.put(arr)
            else:
                slots[key] = state_tensor(arr, self.step_counter.device)
        self._bump_states_version()
        self._refresh_values()

    def _checked_counter(self, value: Any) -> jax.Array:
        """``value`` as the (1,) float32 step counter, or an error naming the problem."""
        owner = type(self).__name__
        counter = self._state_array("step_counter", value)
        if counter.size != 1:
            raise ValueError(f"{owner}.set_states: step_counter must hold one value, got "
                             f"shape {tuple(counter.shape)}")
        counter = counter.reshape((1,)).astype(jnp.float32)
        if not isinstance(counter, jax.core.Tracer):
            number = float(counter[0])
            if not np.isfinite(number) or number < 0:
                raise ValueError(f"{owner}.set_states: step_counter must be a finite count >= 0, "
                                 f"got {number}")
        return counter

    def _checked_scale(self, value: Any) -> jax.Array:
        """``value`` (a scale, or the saved ``(scale, clean_steps)``) as the loss scale's state,
        or an error naming the problem."""
        owner = type(self).__name__
        arr = self._state_array("loss_scale", value).reshape(-1).astype(jnp.float32)
        if arr.size not in (1, 2):
            raise ValueError(f"{owner}.set_states: loss_scale must hold (scale,) or (scale, "
                             f"clean_steps), got {arr.size} values")
        if arr.size == 1:
            arr = jnp.concatenate([arr, jnp.zeros((1,), jnp.float32)])
        if not isinstance(arr, jax.core.Tracer):
            scale = float(arr[0])
            if not np.isfinite(scale) or scale <= 0:
                raise ValueError(f"{owner}.set_states: loss_scale must be a finite number > 0, "
                                 f"got {scale}")
        return arr

    def _checked_slot(self, what: str, kind: str, key: str, value: Any) -> jax.Array:
        """``value`` as the array of slot ``kind`` under ``key``: floating point, of the shape
        of the slot (or else of the parameter) known under ``key``, in its dtype."""
        owner = type(self).__name__
        arr = self._state_array(what, value)
        if not jnp.issubdtype(arr.dtype, jnp.floating):
            raise TypeError(f"{owner}.set_states: {what} must be a floating-point array (an "
                            f"optimizer slot), got dtype {arr.dtype}")
        current = self._slot_dict(kind).get(key)
        ref = self._key_owner.get(key)
        param = ref() if ref is not None else None
        expected = current if current is not None else param
        if expected is None:
            return arr
        if tuple(arr.shape) != tuple(expected.shape):
            which = "the slot it replaces" if current is not None else f"param {param.name!r}"
            raise ValueError(f"{owner}.set_states: {what} has shape {tuple(arr.shape)} but "
                             f"{which} has shape {tuple(expected.shape)}")
        return arr.astype(expected.dtype)

    def _state_array(self, what: str, value: Any) -> jax.Array:
        if isinstance(value, Tensor):
            return value.array
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
        already owns that name (see the docstring of :mod:`singa_jax.opt`)."""
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

    @classmethod
    def _own_checks_and_slots(cls) -> bool:
        """Whether the class keeps Optimizer's own pair checks and slots (then an update whose
        layout is the last one's skips them: see :class:`~.update_layout.UpdateLayout`)."""
        return cls._check_pair is Optimizer._check_pair and cls._get_slot is Optimizer._get_slot \
            and cls._slot_key is Optimizer._slot_key

    def _check_pair(self, name: Any, p: Tensor, g: Tensor) -> None:
        owner = type(self).__name__
        if not isinstance(p, Tensor) or not isinstance(g, Tensor):
            raise TypeError(f"{owner}: param and grad must be Tensors, got "
                            f"{type(p).__name__} and {type(g).__name__} for {name!r}")
        # the arrays' metadata is read directly: cheaper than the properties, and no value is
        # read (graph mode's trace hook needs to see values only)
        pa, ga = p._data, g._data
        if not (is_inexact(pa.dtype) and is_inexact(ga.dtype)):
            raise TypeError(f"{owner}: param {name!r} ({pa.dtype}) and its grad ({ga.dtype}) must "
                            f"be floating point")
        if pa.shape != ga.shape:
            raise ValueError(f"{owner}: shape mismatch for param {name!r}: param "
                             f"{tuple(pa.shape)}, grad {tuple(ga.shape)}")

    def _update_pairs(self, triples: Sequence[Tuple[Any, Tensor, Tensor]],
                      loss: Optional[Tensor] = None) -> None:
        """Update every ``(name, param, grad)`` with one kernel per device (skipped inside the
        kernel when non-finite, see the class docstring; ``loss`` is checked too).

        Eager SINGA programs call this once per step: it reads and writes the arrays directly
        unless graph mode is tracing (whose hook must see every read and write). When the
        gradients come from a backward walk that eager replay recorded into the segment of
        the step's forward, the update is recorded there too (see :mod:`.replayed_update`):
        the step's forward, walk and update then run as one program when it recurs."""
        if not triples:
            return
        if observe.on and not observe.inside("update"):
            return observe.update_call(self, partial(self._update_pairs, triples, loss))
        recording = recording_device(self, triples)
        if recording is None:
            replay.flush()  # the arrays are read directly below: nothing may be pending
        self._warn_skipped_steps()
        kinds = self._active_slot_kinds()
        layout = UpdateLayout.of(self, triples, kinds) if self._own_checks_and_slots() else None
        slot_tensors = self._remembered_slots(layout)
        if slot_tensors is None:
            slot_tensors = self._validated_slots(triples, kinds)
            if layout is not None:
                layout.remember(self, slot_tensors)
        schedules, hyper = self._update_hypers()
        step = self.step_counter.array
        guard = self._guarded()
        scaling = self._scaling()
        scale_state = self._scale_state() if scaling else None
        checked = ()
        if guard and isinstance(loss, Tensor) and is_inexact(loss.dtype):
            checked = (loss._data if recording is not None else loss.array,)
        if recording is not None:
            record_update(self, recording, triples, slot_tensors, schedules, hyper, guard,
                          checked, scale_state)
            return
        # outside a trace the arrays are read and rebound directly (the kernel's outputs are on
        # its inputs' device, so the property's checks hold); a trace goes through the property,
        # whose hook must see every read and write
        field = "array" if current_trace_hook() is not None else "_data"
        read = operator.attrgetter(field)
        by_device: Dict[Device, List[int]] = {}
        for i, (_, p, _) in enumerate(triples):
            by_device.setdefault(p.device, []).append(i)
        for dev, idx in by_device.items():
            # with params on several devices, each device's kernel decides (and counts) alone
            h, s, c = hyper, step, checked
            skip_state = self._skip_state.array if guard else None
            scale = scale_state.array if scaling else None
            if dev is not self.step_counter.device:  # arrays of one kernel share a device
                h = {k: dev.put(v) for k, v in hyper.items()}
                s = dev.put(step)
                c = tuple(dev.put(a) for a in checked)
                skip_state = None if skip_state is None else dev.put(skip_state)
                scale = None if scale is None else dev.put(scale)
            grads = [read(triples[i][2]) for i in idx]
            ok = None
            if guard and field == "_data" and len(idx) > SEPARATE_TEST_FROM:
                ok = finite_test(grads + list(c))  # eagerly, many arrays: see update.py
            new_ps, new_slots, new_skip, new_scale = fused_update(
                type(self)._rule, self._config(), self._decay_on(), schedules, h, s,
                [read(triples[i][1]) for i in idx], grads,
                [tuple(map(read, slot_tensors[i])) for i in idx], guard, c, skip_state,
                field == "array", ok=ok, loss_scale=scale,
                growth_interval=self.loss_scale_growth_interval if scaling else 0)
            # (traced: graph mode's step, whose state is donated)
            for i, np_, nss in zip(idx, new_ps, new_slots):
                setattr(triples[i][1], field, np_)
                for t, a in zip(slot_tensors[i], nss):
                    setattr(t, field, a)
            if guard:
                home = self._skip_state.device
                self._skip_state.array = new_skip if dev is home else home.put(new_skip)
            if scaling and dev is scale_state.device:  # the home device's kernel decides
                scale_state.array = new_scale
        if guard:
            self._watch_skipped_steps()

    # --- non-finite steps -------------------------------------------------------------------
    def _guarded(self) -> bool:
        """Whether updates are skipped on NaN/inf (``skip_nonfinite``, or loss scaling; the
        fused kernel only)."""
        return (bool(self.skip_nonfinite) or self._scaling()) and self._uses_fused_update()

    def _rebound_state(self) -> List[Tensor]:
        """The Tensors besides :meth:`get_states` that an update or :meth:`step` rebinds (the
        guard state, the ``*_value`` tensors of the hyper-parameters): graph mode declares
        them as a step's state."""
        made = [] if self.__dict__.get("_lazy_state") else self._value_tensors()
        skip = self.__dict__.get("_skip_state")
        return made + ([skip] if skip is not None else [])

    def _validated_slots(self, triples: Sequence[Tuple[Any, Tensor, Tensor]],
                         kinds: Sequence[str]) -> List[List[Tensor]]:
        """Check every ``(name, param, grad)`` -- all before any state changes -- and return
        each param's slot Tensors of ``kinds`` (made, moved or reported where needed)."""
        for name, p, g in triples:
            self._check_pair(name, p, g)
        keys = [self._slot_key(name, p) for name, p, _ in triples]
        for key, (name, p, _) in zip(keys, triples):
            for kind in kinds:
                s = self._slot_dict(kind).get(key)
                if s is not None and s._data.shape != p._data.shape:
                    raise ValueError(f"{type(self).__name__}: slot {kind!r} of param {name!r} "
                                     f"(key {key!r}) has shape {s.shape} but the param has "
                                     f"shape {p.shape}")
        return [[self._get_slot(kind, key, p) for kind in kinds]
                for key, (_, p, _) in zip(keys, triples)]

    def _remembered_slots(self, layout: Optional["UpdateLayout"]
                          ) -> Optional[List[List[Tensor]]]:
        """The slot Tensors of the last update validated with ``layout`` when this one has it
        too and its slots still hold arrays of the same avals on the same devices (see
        :class:`UpdateLayout`), else None."""
        last = self.__dict__.get("_update_layout")
        if layout is None or last is None or last.key != layout.key or \
                list(map(aval_of, last.flat_slots)) != last.slot_avals or \
                list(map(device_of, last.flat_slots)) != last.slot_devices:
            return None
        return last.slot_tensors

    def _get_slot(self, kind: str, key: str, p: Tensor) -> Tensor:
        d = self._slot_dict(kind)
        t = d.get(key)
        if t is None:  # created lazily; a new Tensor, so graph mode sees it as new state
            t = d[key] = state_tensor(jnp.zeros(p.shape, p.dtype), p.device)
            self._bump_states_version()
        elif t.device is not p.device:
            t.to_device(p.device)
        return t


