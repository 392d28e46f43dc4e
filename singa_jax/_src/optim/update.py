"""The update kernels of ``singa_jax.opt``: the pure update rules (one per optimizer), the
non-finite test, ``fused_update`` (the one jitted kernel that updates every parameter of a
step) and ``advance_unless_skipped`` (the step counter under ``skip_nonfinite``). The
optimizers (:mod:`~singa_jax._src.optim.optimizers`) call them.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.optim.schedules import DecayScheduler


# --------------------------------------------------------------------------------------------
# Update rules: pure functions of (config, hyper values, step, param, grad, slots)
# --------------------------------------------------------------------------------------------
UpdateRule = Callable[[Tuple, Dict[str, jax.Array], jax.Array, jax.Array, jax.Array, Tuple],
                      Tuple[jax.Array, Tuple]]


def sgd_rule(config, h, step, p, g, slots):
    """``buf = momentum*buf + (1-dampening)*g``; ``g = g + momentum*buf`` (nesterov) or ``buf``;
    ``p = p - lr*g``. Without momentum: ``p = p - lr*g``."""
    use_momentum, nesterov = config
    if use_momentum:
        (buf,) = slots
        buf = h["momentum"] * buf + (1 - h["dampening"]) * g
        g = g + h["momentum"] * buf if nesterov else buf
        slots = (buf,)
    return p - h["lr"] * g, slots


def rmsprop_rule(config, h, step, p, g, slots):
    """``r = rho*r + (1-rho)*g^2``; ``p = p - lr * g / sqrt(r + epsilon)``."""
    (r,) = slots
    r = h["rho"] * r + (1 - h["rho"]) * jnp.square(g)
    return p - h["lr"] * g / jnp.sqrt(r + h["epsilon"]), (r,)


def adagrad_rule(config, h, step, p, g, slots):
    """``s = s + g^2``; ``p = p - lr * g / sqrt(s + epsilon)``."""
    (s,) = slots
    s = s + jnp.square(g)
    return p - h["lr"] * g / jnp.sqrt(s + h["epsilon"]), (s,)


def adam_rule(config, h, step, p, g, slots):
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


# An eager update of more parameters than this runs the non-finite test as a kernel of its own
# and passes its result in: XLA:CPU's compile time grows superlinearly when one program both sums
# every gradient and selects every parameter and slot on the result (measured: 200 arrays 40-70 s,
# 400 arrays of a 100-block CNN ~5 min; with the result an input, 200 arrays 1.7 s). Below it the
# one kernel is kept: a second dispatch would cost a small model's step more than it saves.
SEPARATE_TEST_FROM = 48


@jax.jit
def finite_test(arrays: List[jax.Array]) -> jax.Array:
    """:func:`_all_finite` as a kernel of its own (see :data:`SEPARATE_TEST_FROM`)."""
    return _all_finite(arrays)


# arrays from this size on are summed by a matrix-vector product (see _all_finite)
_SUM_BY_PRODUCT_SIZE = 1 << 14


def _all_finite(arrays: Sequence[jax.Array]) -> jax.Array:
    """A scalar bool: no NaN or inf in any of the floating ``arrays``.

    Tested on the sums (in at least float32): a NaN or inf makes a sum NaN or inf. A sum reads
    each array once, the cheapest reduction XLA's CPU backend has (measured ~30% faster than
    ``all(isfinite)``), and a large array is summed as its rows times a vector of ones, then
    the row sums: a matrix-vector product reads it at a dot's speed, where XLA:CPU's reduction
    of a large array is split into a slower windowed pass (the MLP's 784x256 gradient: 70 us
    -> the guarded graph step 35 us shorter). Finite values summing beyond float32's range
    (~3e38) also count as non-finite: a gradient that large has diverged anyway.
    """
    sums = [_sum_of(a) for a in arrays if jnp.issubdtype(a.dtype, jnp.inexact)]
    return jnp.isfinite(sum(sums)) if sums else jnp.array(True)


def _all_finite_as_one_sum(arrays: Sequence[jax.Array]) -> jax.Array:
    """:func:`_all_finite` with few kernels, for graph mode's step (``in_place``), whose
    compile time each kernel adds to: each large array's row sums by its matrix-vector product
    (as there), then those and every small array, flattened, in ONE vector summed once. Behind
    an optimisation barrier, or XLA splits the sum of the concatenation back into one reduction
    per piece. ResNet-18's step: 183 -> 125 reductions, its guard's compile time (CPU, step
    options) ~2.9 -> ~1.3 s; the same test."""
    parts = [_row_sums(a).reshape(-1).astype(jnp.float32) for a in arrays
             if jnp.issubdtype(a.dtype, jnp.inexact)]
    if not parts:
        return jnp.array(True)
    return jnp.isfinite(jnp.sum(jax.lax.optimization_barrier(jnp.concatenate(parts))))


def _sum_of(a: jax.Array) -> jax.Array:
    """The sum of ``a`` in at least float32 (as float32); NaN or inf when an element is."""
    return jnp.sum(_row_sums(a)).astype(jnp.float32)


def _row_sums(a: jax.Array) -> jax.Array:
    """``a`` in at least float32, a large one (``_SUM_BY_PRODUCT_SIZE`` elements, 2-d or more)
    reduced to its rows' sums by a matrix-vector product: what is left to sum has the same
    sum, NaN or inf as ``a``."""
    a = a.astype(jnp.promote_types(a.dtype, jnp.float32))
    if a.ndim >= 2 and a.size >= _SUM_BY_PRODUCT_SIZE:
        rows = a.reshape(a.shape[0], -1)
        a = rows @ jnp.ones(rows.shape[1], rows.dtype)
    return a


@partial(jax.jit, static_argnums=(0, 1, 2, 3, 9, 12), static_argnames=("growth_interval",))
def fused_update(rule: UpdateRule, config: Tuple, decay: bool,
                  schedules: Tuple[Tuple[str, DecayScheduler], ...], hyper: Dict[str, jax.Array],
                  step: jax.Array, params: List[jax.Array], grads: List[jax.Array],
                  slots: List[Tuple[jax.Array, ...]], guard: bool, checked: Tuple[jax.Array, ...],
                  skip_state: Optional[Tuple[jax.Array, jax.Array, jax.Array]],
                  in_place: bool = True, ok: Optional[jax.Array] = None,
                  loss_scale: Optional[jax.Array] = None, growth_interval: int = 0):
    """One kernel updating every parameter of a step.

    Hyper-parameters with a pure schedule are evaluated here at ``step`` (the value SINGA keeps
    in ``*_value``), so the kernel needs no value tensors: a constant folds into the program;
    ``hyper`` holds the values of the other schedules. L2 weight decay
    (``g = g + weight_decay * p``) is applied first when ``decay``. Arithmetic runs in at least
    float32; results are cast back to each param's/slot's dtype.

    With ``guard`` (``Optimizer.skip_nonfinite``) the step is skipped inside the kernel when a
    gradient or an array of ``checked`` (the loss) holds NaN/inf: every param and slot comes
    back unchanged, and the guard's state ``skip_state`` (fields: ``optimizers._SKIP_FIELDS``)
    comes back counted; without ``guard`` it is returned as given. No host sync. ``in_place``
    says the params and slots are donated (graph mode's program), which decides how the step
    is skipped. ``ok``: the non-finite test's result when the caller computed it (see
    :data:`SEPARATE_TEST_FROM`; ``checked`` is then not read).

    ``loss_scale`` (float16 loss scaling; fields ``optimizers._SCALE_FIELDS``): the gradients
    are of ``loss * scale`` and are divided by it first; a skipped step halves the scale, the
    ``growth_interval``-th clean step in a row doubles it. Returns ``(params, slots,
    skip_state, loss_scale)``, the last None without loss scaling.
    """
    step_counter = step
    hyper = {**{name: sched.value(step) for name, sched in schedules}, **hyper}
    step = step.reshape(()).astype(jnp.float32)

    def update():
        new_params, new_slots = [], []
        for p, g, ss in zip(params, grads, slots):
            ct = jnp.promote_types(p.dtype, jnp.float32)
            h = {k: v.reshape(()).astype(ct) for k, v in hyper.items()}
            pc, gc = p.astype(ct), g.astype(ct)
            if loss_scale is not None:
                gc = gc / loss_scale[0].astype(ct)
            if decay:
                gc = gc + h["weight_decay"] * pc
            np_, nss = rule(config, h, step.astype(ct), pc, gc,
                            tuple(s.astype(ct) for s in ss))
            new_params.append(np_.astype(p.dtype))
            new_slots.append(tuple(n.astype(s.dtype) for n, s in zip(nss, ss)))
        return new_params, new_slots

    if not guard:
        new_params, new_slots = update()
        return new_params, new_slots, skip_state, loss_scale
    if ok is None:
        ok = (_all_finite_as_one_sum if in_place else _all_finite)(list(grads) + list(checked))
    # In graph mode's program (``in_place``: the params and slots are donated) a cond, not
    # where(ok, new, old) per array: the update runs in place inside the taken branch, where a
    # select keeps every old value alive next to its new one (XLA then copies each slot that
    # two fusions read, ~15% of a small MLP's step). Eagerly nothing is donated, and a cond
    # copies every param and slot up front (its skip branch would return the inputs): there a
    # select, fused into the update, is the cheaper (eager MLP step -4%).
    if in_place:
        new_params, new_slots = jax.lax.cond(
            ok, update, lambda: (list(params), [tuple(ss) for ss in slots]))
    else:
        new_params, new_slots = update()
        new_params = [jnp.where(ok, n, o) for n, o in zip(new_params, params)]
        new_slots = [tuple(jnp.where(ok, n, o) for n, o in zip(ns, ss))
                     for ns, ss in zip(new_slots, slots)]
    skipped = jnp.where(ok, 0.0, 1.0)
    counted = jnp.stack([skip_state[0] + skipped, jnp.maximum(skip_state[1], skipped),
                         jnp.where(ok, skip_state[2], step_counter.reshape(()))])
    if loss_scale is not None:
        clean = jnp.where(ok, loss_scale[1] + 1.0, 0.0)
        grow = clean >= growth_interval
        scale = loss_scale[0] * jnp.where(ok, jnp.where(grow, 2.0, 1.0), 0.5)
        loss_scale = jnp.stack([scale, jnp.where(grow, 0.0, clean)])
    return new_params, new_slots, counted, loss_scale


@partial(jax.jit, static_argnums=0)
def advance_unless_skipped(schedules: Tuple[DecayScheduler, ...], step: jax.Array,
                            skip_state: jax.Array):
    """:meth:`Optimizer.step` under ``skip_nonfinite``: the counter advances only when no update
    since the last step was skipped (the ``pending`` field of ``skip_state``); returns the
    counter, every schedule's value there and ``skip_state`` with ``pending`` cleared."""
    nxt = step + (1 - skip_state[1])
    return nxt, tuple(s.value(nxt) for s in schedules), skip_state.at[1].set(0.0)


def _recorded_update(spec: Tuple, *arrays: jax.Array):
    """:func:`fused_update` over flat arrays, for eager replay to record into the segment of
    the step's forward and backward walk (see ``Optimizer._update_pairs``): ``spec`` is
    ``(rule, config, decay, schedules, hyper names, params, slots per param, guard, checked,
    has loss_scale, growth_interval)`` and ``arrays`` are the hyper values, the step, the
    params, the grads, the slots, the checked arrays, then the skip state (with the guard) and
    the loss scale where present.

    The guard takes its ``lax.cond`` form (``in_place``): in one program with the gradients'
    sums, the per-array select form compiles superlinearly in the number of arrays (200
    params: 15 s against 1.5 s), as it did with the test inside the update kernel (see
    :data:`SEPARATE_TEST_FROM`)."""
    (rule, config, decay, schedules, names, n, per, guard, n_checked, has_scale,
     growth_interval) = spec
    it = iter(arrays)
    hyper = {name: next(it) for name in names}
    step = next(it)
    params = [next(it) for _ in range(n)]
    grads = [next(it) for _ in range(n)]
    slots = [tuple(next(it) for _ in range(per)) for _ in range(n)]
    checked = tuple(next(it) for _ in range(n_checked))
    skip_state = next(it) if guard else None
    loss_scale = next(it) if has_scale else None
    return fused_update(rule, config, decay, schedules, hyper, step, params, grads, slots, guard,
                         checked, skip_state, True, loss_scale=loss_scale,
                         growth_interval=growth_interval)


recorded_update_kernel = jax.jit(_recorded_update, static_argnums=0)
