"""Tests of singa_jax.opt: every optimizer against a NumPy implementation of SINGA's rule,
schedules, checkpoint round trips, the fused update, graph-mode tracing and DistOpt."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax import autograd, opt
from singa_jax.precision import float32_matmul_precision_scope
from singa_jax.tensor import Tensor

# A tiny model built from pure functions: loss = sum((x @ W + b)^2)
Affine = autograd.make_function("Affine", lambda x, w, b: x @ w + b)
SqSum = autograd.make_function("SqSum", lambda y: jnp.sum(y * y))

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 3)).astype(np.float32)
W0 = (0.5 * RNG.standard_normal((3, 2))).astype(np.float32)
B0 = (0.1 * RNG.standard_normal(2)).astype(np.float32)
STEPS = 6


pytestmark = pytest.mark.usefixtures("training_mode")


def make_params(w=W0, b=B0, names=("W", "b")):
    return [Tensor(data=np.array(w), stores_grad=True, name=names[0]),
            Tensor(data=np.array(b), stores_grad=True, name=names[1])]


def forward(params, x=X):
    w, b = params
    return SqSum()(Affine()(Tensor(data=x, requires_grad=False), w, b)[0])[0]


def np_grads(w, b, x=X):
    """Gradients of sum((x w + b)^2), in float64 then float32."""
    y = x.astype(np.float64) @ w + b
    dy = 2 * y
    return [(x.T @ dy).astype(np.float32), dy.sum(0).astype(np.float32)]


# ---------------------------------------------------------------------------------------------
# NumPy reference of SINGA's update rules (float32 arithmetic, like the kernels)
# ---------------------------------------------------------------------------------------------
def sched_value(spec, t):
    """A scheduler spec (number or ("exp", init, steps, rate, staircase)) at step t."""
    if not isinstance(spec, tuple):
        return np.float32(spec)
    _, init, steps, rate, stair = spec
    e = np.float32(t) / np.float32(steps)
    if stair:
        e = np.floor(e)
    return np.float32(init) * np.power(np.float32(rate), e, dtype=np.float32)


def make_sched(spec):
    return spec if not isinstance(spec, tuple) else opt.ExponentialDecay(*spec[1:])


def ref_step(kind, hp, t, p, g, slots):
    """One update of one param at step counter t; returns (p, slots)."""
    f = np.float32
    h = {k: sched_value(v, t) for k, v in hp.items() if k != "nesterov"}
    if h.get("weight_decay", 0) != 0:
        g = g + h["weight_decay"] * p
    if kind == "SGD":
        if sched_value(hp.get("momentum", 0), 0) != 0:
            buf = h["momentum"] * slots.get("moments", np.zeros_like(p)) + \
                (f(1) - h.get("dampening", f(0))) * g
            slots["moments"] = buf
            g = g + h["momentum"] * buf if hp.get("nesterov") else buf
        return p - h["lr"] * g, slots
    if kind == "RMSProp":
        r = h["rho"] * slots.get("running_average", np.zeros_like(p)) + (f(1) - h["rho"]) * g * g
        slots["running_average"] = r
        return p - h["lr"] * g / np.sqrt(r + h["epsilon"]), slots
    if kind == "AdaGrad":
        s = slots.get("history", np.zeros_like(p)) + g * g
        slots["history"] = s
        return p - h["lr"] * g / np.sqrt(s + h["epsilon"]), slots
    if kind == "Adam":
        b1, b2 = h["beta_1"], h["beta_2"]
        m = b1 * slots.get("m", np.zeros_like(p)) + (f(1) - b1) * g
        v = b2 * slots.get("v", np.zeros_like(p)) + (f(1) - b2) * g * g
        slots["m"], slots["v"] = m, v
        step = f(t + 1)
        m_hat = m / (f(1) - np.power(b1, step))
        v_hat = v / (f(1) - np.power(b2, step))
        return p - h["lr"] * m_hat / (np.sqrt(v_hat) + h["epsilon"]), slots
    raise AssertionError(kind)


DEFAULTS = {"SGD": {"lr": 0.1}, "RMSProp": {"lr": 0.1, "rho": 0.9, "epsilon": 1e-8},
            "AdaGrad": {"lr": 0.1, "epsilon": 1e-8},
            "Adam": {"lr": 0.1, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8}}


def ref_trajectory(kind, hp, steps=STEPS):
    hp = {**DEFAULTS[kind], **hp}
    params = [W0.copy(), B0.copy()]
    slots = [{}, {}]
    out = []
    for t in range(steps):
        grads = np_grads(*params)
        for i in range(2):
            params[i], slots[i] = ref_step(kind, hp, t, params[i], grads[i], slots[i])
        out.append([p.copy() for p in params])
    return out


def build(kind, hp):
    kwargs = {k: (v if k == "nesterov" else make_sched(v)) for k, v in hp.items()}
    return getattr(opt, kind)(**kwargs)


CONFIGS = [
    ("SGD", {"lr": 0.05}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.02, "nesterov": True}),
    ("SGD", {"lr": ("exp", 0.05, 2, 0.5, True), "momentum": ("exp", 0.9, 3, 0.8, False)}),
    ("RMSProp", {"lr": 0.01}),
    ("RMSProp", {"lr": 0.01, "rho": 0.8, "epsilon": 1e-2, "weight_decay": 0.05}),
    ("AdaGrad", {"lr": 0.1, "weight_decay": 0.01}),
    ("AdaGrad", {"lr": 0.1, "epsilon": 0.05}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": ("exp", 0.02, 2, 0.7, False), "beta_1": 0.8, "beta_2": 0.99,
              "epsilon": 1e-2, "weight_decay": 0.01}),
]


# The tests below check update rules to 1e-6 against NumPy's float32 gradients: the model's
# products compute in float32 on any backend (TF32's ~1e-3 would exceed an Adam step's 1e-2)
@pytest.mark.parametrize("kind,hp", CONFIGS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CONFIGS)])
@float32_matmul_precision_scope("float32")
def test_trajectory_matches_numpy_reference(kind, hp):
    params = make_params()
    o = build(kind, hp)
    ref = ref_trajectory(kind, hp)
    losses = []
    for t in range(STEPS):
        loss = forward(params)
        losses.append(float(loss.array))
        o(loss)
        for got, want in zip(params, ref[t]):
            np.testing.assert_allclose(np.asarray(got.array), want, rtol=1e-6, atol=1e-6)
        assert float(o.step_counter.array[0]) == t + 1
        assert float(o.lr_value.array[0]) == pytest.approx(float(sched_value(hp["lr"], t + 1)))
    assert float(forward(params).array) < losses[0]  # the optimizer actually descends


def test_adam_equals_pytorch_formulation():
    """PyTorch writes Adam as p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps): the same rule."""
    params = make_params()
    o = opt.Adam(lr=0.01)
    p, m, v = W0.astype(np.float64), 0.0, 0.0
    for t in range(1, 5):
        g = np_grads(p.astype(np.float32), B0)[0].astype(np.float64)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        bc1, bc2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        p = p - (0.01 / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + 1e-8)
        o.update(params[0], Tensor(data=np_grads(np.asarray(params[0].array), B0)[0]))
        o.step()
    np.testing.assert_allclose(np.asarray(params[0].array), p, rtol=1e-5, atol=1e-6)


def test_sgd_dampening_differs_from_pytorch_on_first_step():
    """SINGA's buffer starts at 0, so the first step moves by lr*(1-dampening)*g (PyTorch: lr*g)."""
    p = Tensor(data=np.ones(3, np.float32), stores_grad=True, name="p")
    g = Tensor(data=np.full(3, 2.0, np.float32))
    o = opt.SGD(lr=0.1, momentum=0.9, dampening=0.5)
    o.update(p, g)
    np.testing.assert_allclose(np.asarray(p.array), 1 - 0.1 * 0.5 * 2.0, rtol=1e-7)


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_decay_at_several_steps(staircase):
    sched = opt.ExponentialDecay(0.5, 3, 0.8, staircase=staircase)
    for step in [0, 1, 2, 3, 4, 7, 10, 31]:
        got = sched(Tensor(data=np.array([step], np.float32), requires_grad=False))
        assert got.shape == (1,) and got.dtype == np.float32
        exponent = (step // 3) if staircase else step / 3
        np.testing.assert_allclose(np.asarray(got.array), [0.5 * 0.8 ** exponent], rtol=1e-6)


def test_constant_at_several_steps():
    sched = opt.Constant(0.25)
    for step in [0, 1, 5, 1000]:
        got = sched(Tensor(data=np.array([step], np.float32), requires_grad=False))
        assert got.shape == (1,)
        np.testing.assert_array_equal(np.asarray(got.array), [0.25])
    with pytest.raises(TypeError, match="Constant: step must be a Tensor"):
        sched(3)


def test_optimizer_schedule_follows_step_counter():
    o = opt.SGD(lr=opt.ExponentialDecay(1.0, 2, 0.5, staircase=True),
                weight_decay=opt.ExponentialDecay(0.1, 1, 0.9))
    seen = []
    for _ in range(5):
        seen.append((float(o.lr_value.array[0]), float(o.decay_value.array[0])))
        o.step()
    np.testing.assert_allclose([s[0] for s in seen], [1, 1, .5, .5, .25])
    np.testing.assert_allclose([s[1] for s in seen], [0.1 * 0.9 ** t for t in range(5)], rtol=1e-6)


class StepDrop(opt.DecayScheduler):
    """A user schedule written SINGA's way (call on Tensors): halve after step 2."""

    def call(self, step):
        return Tensor(data=jnp.where(step.array < 2, 1.0, 0.5) * self.init_value,
                      requires_grad=False)


def test_user_scheduler_written_on_tensors():
    o = opt.SGD(lr=StepDrop(0.2))
    p = Tensor(data=np.zeros(2, np.float32), stores_grad=True, name="p")
    g = Tensor(data=np.ones(2, np.float32))
    for _ in range(4):
        o.update(p, g)
        o.step()
    np.testing.assert_allclose(np.asarray(p.array), -(0.2 + 0.2 + 0.1 + 0.1), rtol=1e-6)
    assert StepDrop(1.0) != StepDrop(1.0)  # identity-compared: never share a compiled kernel
    assert opt.Constant(0.1) == opt.Constant(0.1)


class Warmup(opt.DecayScheduler):
    """A user schedule written as a pure jnp function of the step (runs inside the step kernel)."""

    def value(self, step):
        return jnp.minimum(step + 1, 3.0) / 3.0 * self.init_value


def test_update_evaluates_each_schedule_at_the_current_step():
    # pure schedules run inside the update kernel; a Tensor-written one is read from *_value
    o = opt.SGD(lr=Warmup(0.3), momentum=StepDropMomentum(0.5))
    p = Tensor(data=np.zeros(2, np.float32), stores_grad=True, name="p")
    g = Tensor(data=np.ones(2, np.float32))
    buf, expected = 0.0, 0.0
    for t in range(4):
        o.update(p, g)
        o.step()
        buf = (0.5 if t < 2 else 0.25) * buf + 1.0
        expected -= [0.1, 0.2, 0.3, 0.3][t] * buf
    np.testing.assert_allclose(np.asarray(p.array), expected, rtol=1e-6)


class StepDropMomentum(opt.DecayScheduler):
    def call(self, step):
        return Tensor(data=jnp.where(step.array < 2, 1.0, 0.5) * self.init_value,
                      requires_grad=False)


def test_constant_values_are_set_once_and_moving_ones_every_step():
    o = opt.SGD(lr=0.1, momentum=0.9, weight_decay=opt.ExponentialDecay(0.1, 1, 0.5))
    lr_array, mom_array, decay_array = o.lr_value.array, o.mom_value.array, o.decay_value.array
    for _ in range(3):
        o.step()
    # a constant's value tensor is never rewritten (so a compiled step need not carry it)...
    assert o.lr_value.array is lr_array and o.mom_value.array is mom_array
    np.testing.assert_allclose(np.asarray(o.lr_value.array), [0.1], rtol=1e-7)
    # ...a moving schedule's is, at every step
    assert o.decay_value.array is not decay_array
    np.testing.assert_allclose(np.asarray(o.decay_value.array), [0.1 * 0.5 ** 3], rtol=1e-6)
    o.set_states({"step_counter": 1.0})  # set_states refreshes all of them
    np.testing.assert_allclose(np.asarray(o.decay_value.array), [0.05], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(o.lr_value.array), [0.1], rtol=1e-7)


# ---------------------------------------------------------------------------------------------
# State: checkpoint round trip, set_states forms and validation
# ---------------------------------------------------------------------------------------------
ROUND_TRIP = [("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
              ("RMSProp", {"lr": 0.01, "weight_decay": 0.01}),
              ("AdaGrad", {"lr": 0.1}),
              ("Adam", {"lr": ("exp", 0.02, 2, 0.7, True)})]


@pytest.mark.parametrize("kind,hp", ROUND_TRIP, ids=[k for k, _ in ROUND_TRIP])
def test_get_set_states_continues_bit_for_bit(kind, hp):
    params_a, opt_a = make_params(), build(kind, hp)
    for _ in range(6):
        opt_a(forward(params_a))

    params_b, opt_b = make_params(), build(kind, hp)
    for _ in range(3):
        opt_b(forward(params_b))
    saved_params = [np.asarray(p.array).copy() for p in params_b]
    saved_states = {k: np.asarray(v.array).copy() for k, v in opt_b.get_states().items()}
    assert "step_counter" in saved_states and saved_states["step_counter"].tolist() == [3.0]

    params_c, opt_c = make_params(*saved_params), build(kind, hp)
    opt_c.set_states(saved_states)
    assert float(opt_c.lr_value.array[0]) == float(opt_b.lr_value.array[0])
    for _ in range(3):
        opt_c(forward(params_c))
    for a, c in zip(params_a, params_c):
        np.testing.assert_array_equal(np.asarray(a.array), np.asarray(c.array))
    states_a, states_c = opt_a.get_states(), opt_c.get_states()
    assert sorted(states_a) == sorted(states_c)
    for k in states_a:
        np.testing.assert_array_equal(np.asarray(states_a[k].array), np.asarray(states_c[k].array))


def test_state_naming_and_singa_nested_form():
    params, o = make_params(), opt.Adam(lr=0.01)
    o(forward(params))
    assert sorted(o.get_states()) == ["m/W", "m/b", "step_counter", "v/W", "v/b"]
    assert o.m["W"] is o.get_states()["m/W"]

    fresh = opt.Adam(lr=0.01)
    fresh.set_states({"step_counter": np.float32(1.0),
                      "m": {k: np.asarray(t.array) for k, t in o.m.items()},
                      "v": {k: t for k, t in o.v.items()}})
    assert sorted(fresh.get_states()) == sorted(o.get_states())
    p2 = make_params(*[np.asarray(p.array) for p in params])
    o(forward(params))
    fresh(forward(p2))
    for a, b in zip(params, p2):
        np.testing.assert_array_equal(np.asarray(a.array), np.asarray(b.array))


def test_set_states_rejects_bad_input_without_changing_state():
    params, o = make_params(), opt.SGD(lr=0.1, momentum=0.9)
    o(forward(params))
    before = {k: np.asarray(v.array).copy() for k, v in o.get_states().items()}
    with pytest.raises(ValueError, match=r"SGD.set_states: unknown state 'm/W'"):
        o.set_states({"step_counter": 5.0, "m/W": np.zeros((3, 2))})
    with pytest.raises(ValueError, match="step_counter must hold one value"):
        o.set_states({"step_counter": np.zeros(3)})
    with pytest.raises(TypeError, match="must be numeric"):
        o.set_states({"moments/W": "abc"})
    after = o.get_states()
    for k, v in before.items():
        np.testing.assert_array_equal(np.asarray(after[k].array), v)


def test_loaded_slot_with_wrong_shape_is_reported():
    o = opt.SGD(lr=0.1, momentum=0.9)
    o.set_states({"step_counter": 0.0, "moments/W": np.zeros((2, 2), np.float32)})
    params = make_params()
    with pytest.raises(ValueError, match=r"slot 'moments' of param 'W'.*\(2, 2\).*\(3, 2\)"):
        o(forward(params))
    np.testing.assert_array_equal(np.asarray(params[0].array), W0)


# ---------------------------------------------------------------------------------------------
# The fused update
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,hp", ROUND_TRIP, ids=[k for k, _ in ROUND_TRIP])
def test_fused_update_equals_per_param_update(kind, hp):
    fused_params, fused = make_params(), build(kind, hp)
    single_params, single = make_params(), build(kind, hp)
    for _ in range(3):
        fused(forward(fused_params))
        for p, g in autograd.backward(forward(single_params)):
            single.update(p, g)
        single.step()
    for a, b in zip(fused_params, single_params):
        np.testing.assert_allclose(np.asarray(a.array), np.asarray(b.array), rtol=1e-7, atol=1e-7)


def test_params_sharing_a_name_get_their_own_slots():
    p1 = Tensor(data=np.ones((2, 2), np.float32), stores_grad=True, name="W")
    p2 = Tensor(data=np.ones(3, np.float32), stores_grad=True, name="W")
    g1 = Tensor(data=np.full((2, 2), 1.0, np.float32))
    g2 = Tensor(data=np.full(3, 3.0, np.float32))
    o = opt.SGD(lr=0.1, momentum=0.5)
    for _ in range(2):
        o.update(p1, g1)
        o.update(p2, g2)
        o.step()
    assert sorted(o.moments) == ["W", "W~1"]
    assert o.moments["W"].shape == (2, 2) and o.moments["W~1"].shape == (3,)
    # buf1 = g, buf2 = 1.5 g -> p = 1 - 0.1 * 2.5 g
    np.testing.assert_allclose(np.asarray(p1.array), 1 - 0.25 * 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(p2.array), 1 - 0.25 * 3.0, rtol=1e-6)


def test_update_rejects_mismatched_grad_before_any_change():
    p = Tensor(data=np.ones((2, 2), np.float32), stores_grad=True, name="W")
    o = opt.Adam(lr=0.1)
    with pytest.raises(ValueError, match=r"Adam: shape mismatch for param 'W': param \(2, 2\), "
                                         r"grad \(4,\)"):
        o.update(p, Tensor(data=np.ones(4, np.float32)))
    with pytest.raises(TypeError, match="must be floating point"):
        o.update(p, Tensor(data=np.ones((2, 2), np.int32)))
    assert o.m == {} and o.v == {}
    np.testing.assert_array_equal(np.asarray(p.array), 1.0)


def test_low_precision_params_keep_their_dtype():
    """A float16 param and its slot stay float16; the arithmetic runs in float32."""
    p = Tensor(data=np.array([1.0, -2.0, 0.5], np.float16), stores_grad=True, name="h")
    g = Tensor(data=np.array([0.3, 0.1, -0.7], np.float16))
    o = opt.SGD(lr=0.1, momentum=0.9)
    o.update(p, g)
    o.update(p, g)
    assert p.dtype == np.float16 and o.moments["h"].dtype == np.float16
    g32 = np.asarray(g.array).astype(np.float32)
    buf1 = g32.astype(np.float16).astype(np.float32)
    p1 = (np.array([1.0, -2.0, 0.5], np.float32) - np.float32(0.1) * g32).astype(np.float16)
    buf2 = np.float32(0.9) * buf1 + g32  # rounded to float16 only when stored
    p2 = (p1.astype(np.float32) - np.float32(0.1) * buf2).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(p.array), p2)


def test_user_optimizer_overriding_apply_is_used_per_param():
    class SignSGD(opt.Optimizer):
        def apply(self, param_name, param_value, param_grad):
            param_value.array = param_value.array - self.lr_value.array * jnp.sign(param_grad.array)

    params = make_params()
    o = SignSGD(0.01)
    o(forward(params))
    grads = np_grads(W0, B0)
    np.testing.assert_allclose(np.asarray(params[0].array), W0 - 0.01 * np.sign(grads[0]), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="base Optimizer has no update rule"):
        opt.Optimizer(0.1).update(params[0], Tensor(data=np.ones((3, 2), np.float32)))


# ---------------------------------------------------------------------------------------------
# Bad hyper-parameters
# ---------------------------------------------------------------------------------------------
BAD = [
    (opt.SGD, {"lr": -0.1}, "SGD: invalid lr value -0.1"),
    (opt.SGD, {"momentum": 1.0}, r"SGD: invalid momentum value 1.0.*\[0, 1\)"),
    (opt.SGD, {"momentum": -0.5}, "SGD: invalid momentum value -0.5"),
    (opt.SGD, {"dampening": 1.5}, "SGD: invalid dampening value 1.5"),
    (opt.SGD, {"weight_decay": -1e-4}, "SGD: invalid weight_decay value -0.0001"),
    (opt.SGD, {"nesterov": True}, "SGD: Nesterov momentum requires a momentum > 0"),
    (opt.SGD, {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, "zero dampening"),
    (opt.RMSProp, {"rho": 1.2}, "RMSProp: invalid rho value 1.2"),
    (opt.RMSProp, {"epsilon": 0}, r"RMSProp: invalid epsilon value 0.*\(0, inf\)"),
    (opt.AdaGrad, {"epsilon": -1e-8}, "AdaGrad: invalid epsilon value -1e-08"),
    (opt.AdaGrad, {"lr": float("nan")}, "AdaGrad: lr must be finite"),
    (opt.Adam, {"beta_1": 1.0}, "Adam: invalid beta_1 value 1.0"),
    (opt.Adam, {"beta_2": -0.1}, "Adam: invalid beta_2 value -0.1"),
    (opt.Adam, {"lr": opt.ExponentialDecay(-1.0, 2, 0.5)}, "Adam: invalid lr value"),
]


@pytest.mark.parametrize("cls,kwargs,message", BAD)
def test_bad_hyperparameters_rejected_at_construction(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_bad_types_and_schedules():
    with pytest.raises(TypeError, match="SGD: lr must be a number or a DecayScheduler, got str"):
        opt.SGD(lr="0.1")
    with pytest.raises(TypeError, match="Adam: beta_1 must be a number"):
        opt.Adam(beta_1=True)
    with pytest.raises(ValueError, match="ExponentialDecay: decay_steps must be > 0, got 0"):
        opt.ExponentialDecay(0.1, 0, 0.5)
    with pytest.raises(ValueError, match="ExponentialDecay: decay_rate must be >= 0"):
        opt.ExponentialDecay(0.1, 10, -0.5)
    with pytest.raises(TypeError, match="Constant: init_value must be a real number"):
        opt.Constant("x")


# ---------------------------------------------------------------------------------------------
# DistOpt: single-device pass-through
# ---------------------------------------------------------------------------------------------
def test_distopt_equals_wrapped_optimizer():
    plain_params, plain = make_params(), opt.SGD(lr=0.05, momentum=0.9)
    dist_params, dist = make_params(), opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
    assert (dist.world_size, dist.local_rank, dist.global_rank) == (1, 0, 0)
    for _ in range(3):
        plain(forward(plain_params))
        dist(forward(dist_params))
    for a, b in zip(plain_params, dist_params):
        np.testing.assert_array_equal(np.asarray(a.array), np.asarray(b.array))
    assert float(dist.step_counter.array[0]) == 3  # delegated to the wrapped optimizer
    partial_params = make_params()
    d2 = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
    for _ in range(3):
        d2.backward_and_partial_update(forward(partial_params))
    for a, b in zip(plain_params, partial_params):
        np.testing.assert_array_equal(np.asarray(a.array), np.asarray(b.array))


def test_distopt_rejects_several_processes():
    with pytest.raises(ValueError, match="DistOpt: world_size=2 but this run has 1 process"):
        opt.DistOpt(opt.SGD(), world_size=2)
    with pytest.raises(TypeError, match="DistOpt: opt must be an Optimizer"):
        opt.DistOpt("sgd")
    assert isinstance(opt.DistOpt().opt, opt.SGD)


@float32_matmul_precision_scope("float32")  # NumPy's float32 products, to 1e-6
def test_distopt_half_precision_rounds_and_clips():
    params, d = make_params(), opt.DistOpt(opt.SGD(lr=0.05))
    d.backward_and_update_half(forward(params), clipping=True, clip_Value=1.5)
    for p0, p, g in zip([W0, B0], params, np_grads(W0, B0)):
        sent = np.clip(g, -1.5, 1.5).astype(np.float16).astype(np.float32)
        np.testing.assert_allclose(np.asarray(p.array), p0 - np.float32(0.05) * sent, rtol=1e-6)
    t = Tensor(data=np.array([1.0001, 3.14159], np.float32))
    d.all_reduce_half(t)
    np.testing.assert_array_equal(np.asarray(t.array),
                                  np.array([1.0001, 3.14159], np.float16).astype(np.float32))
    assert d.all_reduce(t) is t and d.fused_all_reduce([t])[0] is t


def test_distopt_sparsification_threshold_and_topk():
    d = opt.DistOpt(opt.SGD())
    g = np.array([0.5, -2.0, 0.1, 3.0, -0.05, 1.0], np.float32)
    acc0 = np.array([0.6, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    t, acc = Tensor(data=g), Tensor(data=acc0)
    d.sparsification(t, acc, 1.0, False)
    total = g + acc0
    np.testing.assert_array_equal(np.asarray(t.array), np.where(np.abs(total) >= 1.0, total, 0))
    np.testing.assert_array_equal(np.asarray(acc.array), np.where(np.abs(total) >= 1.0, 0, total))

    a, b = Tensor(data=g[:2]), Tensor(data=g[2:])
    d.fused_sparsification([a, b], None, 0.5, True)  # keep ceil(0.5 * 6) = 3 largest |g|
    kept = np.zeros_like(g)
    top = np.argsort(-np.abs(g))[:3]
    kept[top] = g[top]
    np.testing.assert_array_equal(np.concatenate([np.asarray(a.array), np.asarray(b.array)]), kept)
    with pytest.raises(ValueError, match="accumulation has 2 values but the tensors have 6"):
        d.fused_sparsification([a, b], Tensor(data=np.zeros(2, np.float32)), 0.5, True)


@float32_matmul_precision_scope("float32")  # NumPy's products: the same values pass |g| >= 1
def test_distopt_sparse_update_keeps_residual():
    params, d = make_params(), opt.DistOpt(opt.SGD(lr=0.05))
    grads = np_grads(W0, B0)
    d.backward_and_sparse_update(forward(params), threshold=4, spars=1.0, topK=False, corr=True)
    # W (6 values > threshold 4) is its own group; b (2 values) forms the last group
    assert [a.shape for a in d.gradAccumulation] == [(6,), (2,)]
    for p0, p, g, acc in zip([W0, B0], params, grads, d.gradAccumulation):
        sent = np.where(np.abs(g) >= 1.0, g, 0)
        np.testing.assert_allclose(np.asarray(p.array), p0 - np.float32(0.05) * sent, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(acc.array), (g - sent).reshape(-1), rtol=1e-6)
