"""Optimizer internals: the fused update kernel and the trace hook's view of a step. (This tier
imports singa_jax._src.)"""
import jax
import numpy as np
import pytest
from singa_jax import opt
from singa_jax._src.optim import optimizers
from singa_jax._src.base.modes import TraceHook, trace_hook
from singa_jax.precision import float32_matmul_precision_scope
from singa_jax.tensor import Tensor
pytestmark = pytest.mark.usefixtures("training_mode")
from test_opt import (  # noqa: F401 (shared helpers and fixtures)
    Affine, B0, DEFAULTS, RNG, STEPS, SqSum, W0, Warmup, X, build, forward, make_params,
    make_sched, np_grads, ref_step, ref_trajectory, sched_value)


class LoudDecay(opt.ExponentialDecay):
    """Overrides call, so its own call (not the parent's pure value) must be used."""

    def call(self, step):
        return Tensor(data=super().value(step.array) * 2, requires_grad=False)


def test_user_schedulers_pure_and_subclassed():
    o = opt.SGD(lr=Warmup(0.3), momentum=LoudDecay(0.4, 1, 0.5))
    assert o.lr._pure and not o.momentum._pure
    lrs, moms = [], []
    for _ in range(4):
        lrs.append(float(o.lr_value.array[0]))
        moms.append(float(o.mom_value.array[0]))
        o.step()
    np.testing.assert_allclose(lrs, [0.1, 0.2, 0.3, 0.3], rtol=1e-6)
    np.testing.assert_allclose(moms, [0.8, 0.4, 0.2, 0.1], rtol=1e-6)
    assert LoudDecay(0.4, 1, 0.5) != LoudDecay(0.4, 1, 0.5)


def test_one_kernel_launch_per_step(monkeypatch):
    calls = []
    real = optimizers.fused_update

    def counting(*args, **kwargs):
        calls.append(len(args[6]))  # the list of params
        return real(*args, **kwargs)

    # the name an eager update calls (a recorded update's kernel reads update.fused_update when
    # it is traced: no launch of its own)
    monkeypatch.setattr_one(optimizers, "fused_update", counting)
    params = make_params()
    o = opt.Adam(lr=0.01)
    for _ in range(3):
        o(forward(params))
    assert calls == [2, 2, 2]


def test_a_remembered_update_layout_skips_its_checks_only_while_nothing_changed(monkeypatch):
    """An update of the same params, names, avals and devices as the last checked one takes its
    slots without the checks (optimizers._UpdateLayout); a changed grad shape, a replaced slot
    or a slot holding another shape is checked again -- the error raised before any change --
    and the values are SGD's with momentum (float32, exact arithmetic in these numbers)."""
    checked = []
    validated = opt.Optimizer._validated_slots

    def counting(self, triples, kinds):
        checked.append(len(triples))
        return validated(self, triples, kinds)

    monkeypatch.setattr(opt.Optimizer, "_validated_slots", counting)
    p1 = Tensor(data=np.ones((2, 2), np.float32), stores_grad=True, name="W")
    p2 = Tensor(data=np.ones(3, np.float32), stores_grad=True, name="b")
    g1, g2 = Tensor(data=np.full((2, 2), 1.0, np.float32)), Tensor(data=np.full(3, 2.0, np.float32))
    o = opt.SGD(lr=0.5, momentum=0.5)
    for _ in range(4):
        o._update_pairs([("W", p1, g1), ("b", p2, g2)])
    assert checked == [2]  # the first makes the slots; the rest are remembered
    # momentum buffers g, 1.5g, 1.75g, 1.875g: p = 1 - 0.5 * 6.125 g
    np.testing.assert_array_equal(np.asarray(p1.array), 1 - 0.5 * 6.125 * 1.0)
    np.testing.assert_array_equal(np.asarray(p2.array), 1 - 0.5 * 6.125 * 2.0)
    before = [np.asarray(t.array) for t in (p1, p2, o.moments["W"], o.moments["b"])]
    with pytest.raises(ValueError, match=r"shape mismatch for param 'b'"):
        o._update_pairs([("W", p1, g1), ("b", p2, Tensor(data=np.ones(4, np.float32)))])
    o.moments["b"].array = np.zeros((5,), np.float32)  # a slot rebound to another shape
    with pytest.raises(ValueError, match=r"slot 'moments' of param 'b'.*\(5,\)"):
        o._update_pairs([("W", p1, g1), ("b", p2, g2)])
    for t, v in zip((p1, p2, o.moments["W"]), before):
        np.testing.assert_array_equal(np.asarray(t.array), v)
    o.moments["b"].array = np.zeros(3, np.float32)
    o.set_states({"moments/W": np.zeros((2, 2), np.float32)})  # loaded state: checked again
    n = len(checked)
    o._update_pairs([("W", p1, g1), ("b", p2, g2)])
    assert len(checked) == n + 1
    np.testing.assert_array_equal(np.asarray(o.moments["W"].array), 1.0)
    np.testing.assert_array_equal(np.asarray(o.moments["b"].array), 2.0)
    o._update_pairs([("W", p1, g1), ("b", p2, g2)])
    assert len(checked) == n + 1  # remembered again


# ---------------------------------------------------------------------------------------------
# Graph mode: the same code on tracers inside one jax.jit
# ---------------------------------------------------------------------------------------------
class _Recorder(TraceHook):
    def __init__(self):
        self.new_tensors = []

    def created(self, t):
        self.new_tensors.append(t)


def _state_of(params, o):
    held = [v for v in vars(o).values() if isinstance(v, Tensor)]  # step_counter, *_value
    return list(params) + held + list(o.get_states().values())


def _compile_step(params, o):
    """A jitted training step over the current state Tensors (as graph mode would build it);
    slots created while tracing come back as extra outputs."""
    state = _state_of(params, o)
    new_slots = []

    def pure(arrays):
        rec = _Recorder()
        with trace_hook(rec):
            for t, a in zip(state, arrays):
                t.array = a
            o(forward(params))
        kept = {id(t) for t in o.get_states().values()}
        new_slots[:] = [t for t in rec.new_tensors if id(t) in kept]
        return [t.array for t in state], [t.array for t in new_slots]

    jitted = jax.jit(pure)

    def run():
        out, created = jitted([t.array for t in state])
        for t, a in zip(list(state) + new_slots, list(out) + list(created)):
            t.array = a

    return run


@float32_matmul_precision_scope("float32")  # NumPy's float32 products, to 1e-6
def test_traced_steps_match_eager_and_schedule_advances():
    hp = {"lr": ("exp", 0.02, 1, 0.5, False), "beta_1": 0.8}
    ref = ref_trajectory("Adam", hp, steps=5)
    params, o = make_params(), build("Adam", hp)
    _compile_step(params, o)()  # first step: slots are created while tracing
    assert sorted(o.get_states()) == ["m/W", "m/b", "step_counter", "v/W", "v/b"]
    np.testing.assert_allclose(np.asarray(params[0].array), ref[0][0], rtol=1e-6, atol=1e-6)
    step = _compile_step(params, o)  # traced once, run four times
    lrs = []
    for t in range(1, 5):
        step()
        lrs.append(float(o.lr_value.array[0]))
        for got, want in zip(params, ref[t]):
            np.testing.assert_allclose(np.asarray(got.array), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lrs, [0.02 * 0.5 ** t for t in range(2, 6)], rtol=1e-6)
    assert float(o.step_counter.array[0]) == 5
