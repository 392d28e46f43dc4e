"""SINGA optimizers backed by optax: :func:`from_optax` and :class:`OptaxOptimizer`.

``opt.from_optax(optax.adam(1e-3))`` is an :class:`~singa_jax.opt.Optimizer` like SGD or Adam:
``optimizer(loss)``, ``update(p, g)`` + ``step()``, ``Model.compile(..., use_graph=True)``, and
``get_states``/``set_states`` (so ``Model.save_states(path, aux_states=opt.get_states())``).

Its state follows SINGA's layout: the optax state of each parameter (``tx.init(param)``) is
flattened into arrays, each a Tensor slot keyed ``"<leaf path>/<param name>"`` -- e.g.
``"0.mu/hidden.W"`` and ``"0.count/hidden.W"`` for ``optax.adam`` -- plus SINGA's
``step_counter``. Like SINGA's optimizers, a transformation is applied to one parameter at a time
(one jitted kernel updates all the parameters of a step), so transformations that couple
parameters (``optax.clip_by_global_norm``, ``optax.multi_transform``) see each parameter alone.
``lr`` (default 1) multiplies optax's updates and may be a SINGA schedule; optax's own learning
rate applies too. optax itself is only needed to build ``tx``: ``pip install optax``.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.runtime.device import Device
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.optim.optimizers import Optimizer, param_name, state_tensor
from singa_jax._src.optim.schedules import DecayScheduler

__all__ = ["OptaxOptimizer", "from_optax"]


def _leaf_kind(path: Tuple[Any, ...]) -> str:
    """A slot kind for the state leaf at ``path``: its keys joined by dots (``"0.mu"``)."""
    parts = []
    for k in path:
        for attr in ("name", "key", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts).replace("/", "_") or "state"


@partial(jax.jit, static_argnums=(0, 1, 2))
def _optax_update(tx: Any, treedef: Any, schedules: Tuple[Tuple[str, DecayScheduler], ...],
                  hyper: Dict[str, jax.Array], step: jax.Array, params: List[jax.Array],
                  grads: List[jax.Array], states: List[Tuple[jax.Array, ...]]):
    """One kernel: ``tx.update`` for every (param, grad, state leaves), ``p + lr * updates``."""
    h = {**{name: sched.value(step) for name, sched in schedules}, **hyper}
    lr = h["lr"].reshape(())
    new_params, new_states = [], []
    for p, g, leaves in zip(params, grads, states):
        updates, state = tx.update(g, jax.tree_util.tree_unflatten(treedef, leaves), p)
        ct = jnp.promote_types(p.dtype, jnp.float32)
        new_params.append((p.astype(ct) + lr.astype(ct) * updates.astype(ct)).astype(p.dtype))
        new_states.append(tuple(jax.tree_util.tree_leaves(state)))
    return new_params, new_states


class OptaxOptimizer(Optimizer):
    """A SINGA Optimizer whose update is the optax ``GradientTransformation`` ``tx``.

    Args:
        tx: an optax GradientTransformation (anything with ``init(params)`` and
            ``update(updates, state, params)``), applied to each parameter as a single array.
        lr: a multiplier of optax's updates (a number or a SINGA schedule; default 1).

    Not supported: ``skip_nonfinite`` (use ``optax.apply_if_finite``) and ``DistOpt``.
    """

    def __init__(self, tx: Any, lr: Any = 1.0):
        if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
            raise TypeError(f"OptaxOptimizer: tx must be an optax GradientTransformation (with "
                            f"init and update), got {type(tx).__name__}")
        super().__init__(lr)
        # The state's structure for one array parameter, found abstractly (no backend starts).
        abstract = jax.eval_shape(tx.init, jax.ShapeDtypeStruct((), jnp.float32))
        paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        kinds = tuple(_leaf_kind(path) for path, _ in paths)
        if len(set(kinds)) != len(kinds) or "step_counter" in kinds:
            raise ValueError(f"OptaxOptimizer: cannot name the state leaves of tx uniquely "
                             f"({list(kinds)})")
        self.tx = tx
        self._treedef = treedef
        self._slot_kinds = kinds
        for kind in kinds:
            self._slot_dict(kind)

    def _config(self) -> Tuple:
        return (self.tx,)  # graph mode bakes the transformation into the compiled step

    def _state_avals(self, p: Tensor) -> List[jax.ShapeDtypeStruct]:
        """Shapes and dtypes of ``tx.init`` of a parameter like ``p`` (cached per shape/dtype)."""
        cache = self.__dict__.setdefault("_aval_cache", {})
        key = (p.shape, jnp.dtype(p.dtype))
        if key not in cache:
            cache[key] = jax.tree_util.tree_leaves(
                jax.eval_shape(self.tx.init, jax.ShapeDtypeStruct(p.shape, p.dtype)))
        return cache[key]

    def _param_state(self, name: Any, key: str, p: Tensor) -> List[Tensor]:
        """The state slots of the parameter keyed ``key``, made by ``tx.init`` on its first
        update (or checked against ``tx.init``'s shapes when ``set_states`` made them)."""
        slots = [self._slot_dict(kind).get(key) for kind in self._slot_kinds]
        if any(t is None for t in slots):
            initial = jax.tree_util.tree_leaves(self.tx.init(p.array))
            for i, (kind, leaf) in enumerate(zip(self._slot_kinds, initial)):
                if slots[i] is None:
                    slots[i] = self._slot_dict(kind)[key] = state_tensor(leaf, p.device)
            self._bump_states_version()
        for kind, t, aval in zip(self._slot_kinds, slots, self._state_avals(p)):
            if t.shape != tuple(aval.shape):
                raise ValueError(f"OptaxOptimizer: state {kind!r} of param {name!r} (key "
                                 f"{key!r}) has shape {t.shape}, but tx.init gives "
                                 f"{tuple(aval.shape)} for a param of shape {p.shape}")
            if t.device is not p.device:
                t.to_device(p.device)
        return slots

    def _optax_update(self, triples: Sequence[Tuple[Any, Tensor, Tensor]]) -> None:
        """Update every ``(name, param, grad)``: one kernel per device."""
        if not triples:
            return
        for name, p, g in triples:  # validate everything before any state changes
            self._check_pair(name, p, g)
        keys = [self._slot_key(name, p) for name, p, _ in triples]
        slots = [self._param_state(name, key, p) for key, (name, p, _) in zip(keys, triples)]
        by_device: Dict[Device, List[int]] = {}
        for i, (_, p, _) in enumerate(triples):
            by_device.setdefault(p.device, []).append(i)
        schedules, hyper = self._update_hypers()
        step = self.step_counter.array
        for dev, idx in by_device.items():
            h, s = hyper, step
            if dev is not self.step_counter.device:  # arrays of one kernel share a device
                h = {k: dev.put(v) for k, v in hyper.items()}
                s = dev.put(step)
            new_ps, new_states = _optax_update(
                self.tx, self._treedef, schedules, h, s,
                [triples[i][1].array for i in idx], [triples[i][2].array for i in idx],
                [tuple(t.array for t in slots[i]) for i in idx])
            for i, new_p, new_state in zip(idx, new_ps, new_states):
                triples[i][1].array = new_p
                for t, a in zip(slots[i], new_state):
                    t.array = a

    # --- the entry points of Optimizer, all through _optax_update ----------------------------
    def _apply_all(self, pairs: Sequence[Tuple[Tensor, Tensor]], loss: Any = None) -> None:
        self._optax_update([(param_name(p), p, g) for p, g in pairs])

    def apply(self, param_name: Any, param_value: Tensor, param_grad: Tensor) -> None:
        """Update ``param_value`` from ``param_grad`` with ``tx``, using the state kept under
        ``param_name``."""
        self._optax_update([(param_name, param_value, param_grad)])

    def _checked_slot(self, what: str, kind: str, key: str, value: Any) -> jax.Array:
        """``set_states``: ``value`` as the state leaf ``kind`` of the param keyed ``key``, of
        the slot's shape and dtype (or ``tx.init``'s for a known param)."""
        arr = self._state_array(what, value)
        current = self._slot_dict(kind).get(key)
        ref = self._key_owner.get(key)
        param = ref() if ref is not None else None
        if current is not None:
            expected = (current.shape, current.dtype)
        elif param is not None:
            aval = self._state_avals(param)[self._slot_kinds.index(kind)]
            expected = (tuple(aval.shape), aval.dtype)
        else:
            return arr
        if tuple(arr.shape) != tuple(expected[0]):
            raise ValueError(f"OptaxOptimizer.set_states: {what} has shape {tuple(arr.shape)} "
                             f"but the state it replaces has shape {tuple(expected[0])}")
        return arr.astype(expected[1])


def from_optax(tx: Any, lr: Any = 1.0) -> OptaxOptimizer:
    """A SINGA :class:`~singa_jax.opt.Optimizer` applying the optax GradientTransformation
    ``tx`` (e.g. ``opt.from_optax(optax.adamw(1e-3))``); see :class:`OptaxOptimizer`."""
    return OptaxOptimizer(tx, lr)
