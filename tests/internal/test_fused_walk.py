"""Fused backward walks (autodiff/fused.py): a walk that recurs runs as one replay kernel.

The first walk of a graph goes op by op and writes its plan; the same plan met again runs every
pullback and sum in one jitted replay. Gradients, their names and the order they are yielded in
must be those of the op-by-op walk (values up to rounding: XLA fuses across operators), and
every walk the replay cannot express must still go op by op.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from backend_precision import matmul_tolerance
from singa_jax import autograd, tensor
from singa_jax._src.base import modes
from singa_jax._src.autodiff import fused
from singa_jax._src.autodiff import operator as operator_mod
from singa_jax._src.autodiff.function import Function
from singa_jax.precision import float32_matmul_precision_scope
from singa_jax.tensor import Tensor

pytestmark = pytest.mark.usefixtures("training_mode")


@pytest.fixture
def counted(monkeypatch) -> Dict[str, int]:
    """Counts replay kernels run and operators' backwards called one by one."""
    counts = {"replays": 0, "op backwards": 0}
    replay, do_backward = fused.fused_backward_walk, operator_mod.Operator._do_backward

    def counting_replay(*args):
        counts["replays"] += 1
        return replay(*args)

    def counting_do_backward(self, *dys):
        counts["op backwards"] += 1
        return do_backward(self, *dys)

    monkeypatch.setattr(fused, "fused_backward_walk", counting_replay)
    monkeypatch.setattr(operator_mod.Operator, "_do_backward", counting_do_backward)
    monkeypatch.setattr(fused, "_seen_plans", {})
    monkeypatch.setattr(fused, "_known_shapes", {})
    return counts


def _arrays() -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return dict(x=rng.normal(size=(8, 5)).astype(np.float32),
                w=rng.normal(size=(5, 6)).astype(np.float32),
                b=rng.normal(size=(6,)).astype(np.float32),
                emb=rng.normal(size=(7, 2)).astype(np.float32),
                idx=rng.integers(0, 7, size=(8,)).astype(np.int32),
                labels=rng.integers(0, 2, size=(8,)).astype(np.int32))


def _loss(a: Dict[str, np.ndarray], params: Dict[str, Tensor]) -> Tensor:
    """A graph with every case the walk's bookkeeping has: a plain leaf (no gradient), a
    parameter used twice, a tensor used by two ops (its gradients summed), an op with several
    outputs one of which is unused, integer inputs, a target without gradient."""
    x = Tensor(data=a["x"])
    w, b, emb = params["w"], params["b"], params["emb"]
    h = autograd.add_bias(autograd.matmul(x, w), b)
    h = autograd.add(autograd.mul(h, h), autograd.tanh(h))  # h used three times
    left, right, _unused = autograd.split(h, 1, [2, 2, 2])
    e = autograd.reshape(autograd.embedding(Tensor(data=a["idx"], requires_grad=False), emb),
                         [8, -1])
    w2 = autograd.reshape(autograd.matmul(autograd.transpose(w, (1, 0)), w), [-1])  # w again
    logits = autograd.add(autograd.add(autograd.relu(left), autograd.sigmoid(right)), e)
    loss = autograd.softmax_cross_entropy(logits, Tensor(data=a["labels"]))
    return autograd.add(loss, autograd.mul(autograd.reduce_mean(w2), tensor.from_numpy(
        np.array([1e-3], np.float32))))


def _params(a: Dict[str, np.ndarray]) -> Dict[str, Tensor]:
    return {k: Tensor(data=a[k], stores_grad=True, name=k) for k in ("w", "b", "emb")}


def _walk(a, params, fused: bool) -> List[Tuple[str, str, np.ndarray]]:
    """(param, gradient name, gradient) in the order backward yields them."""
    names = {id(t): k for k, t in params.items()}
    with autograd.fused_backward(fused):
        loss = _loss(a, params)
        return [(names[id(p)], g.name.split("#")[0], np.asarray(g.array))
                for p, g in autograd.backward(loss)]


def _reference(a) -> Dict[str, np.ndarray]:
    def f(w, b, emb):
        h = a["x"] @ w + b
        h = h * h + jnp.tanh(h)
        z = jax.nn.relu(h[:, :2]) + jax.nn.sigmoid(h[:, 2:4]) + emb[a["idx"]]
        ce = -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(8), a["labels"]])
        return ce + 1e-3 * jnp.mean(w.T @ w)

    return dict(zip(("w", "b", "emb"), jax.grad(f, argnums=(0, 1, 2))(a["w"], a["b"],
                                                                        a["emb"])))


def test_a_recurring_walk_runs_as_one_kernel_with_the_op_by_op_gradients(counted):
    a = _arrays()
    stepwise = _walk(a, _params(a), fused=False)
    assert counted["replays"] == 0
    walked = counted["op backwards"]
    assert walked >= 12
    first = _walk(a, _params(a), fused=True)  # a new plan: op by op, and remembered
    assert counted["replays"] == 0 and counted["op backwards"] == 2 * walked
    for _ in range(2):
        again = _walk(a, _params(a), fused=True)  # the plan recurs: one replay, no op backward
        assert [(p, n) for p, n, _ in again] == [(p, n) for p, n, _ in stepwise]
        for (p, _, g), (_, _, want) in zip(again, stepwise):
            np.testing.assert_allclose(g, want, **matmul_tolerance(1e-6, 1e-7), err_msg=p)
    assert counted["replays"] == 2 and counted["op backwards"] == 2 * walked
    assert [(p, n) for p, n, _ in first] == [(p, n) for p, n, _ in stepwise]
    ref = _reference(a)
    for p, _, g in again:
        np.testing.assert_allclose(g, ref[p], **matmul_tolerance(1e-5, 1e-6), err_msg=p)


def test_a_walk_of_a_known_shape_skips_the_symbolic_walk_and_yields_this_graphs_tensors(
        counted, monkeypatch):
    """From the third walk of one graph's shape the plan is found by the graph's signature
    (fused._Shape) without walking symbolically. Each walk yields ITS graph's tensors (fresh
    parameters every time) with the op-by-op names and gradients; a parameter that stops
    storing its gradient changes the signature, and then the walk yields what op by op does."""
    symbolic = []
    plan_run = fused._Plan.run

    def counting_run(self, op, dys):
        symbolic.append(op)
        return plan_run(self, op, dys)

    monkeypatch.setattr(fused._Plan, "run", counting_run)
    a = _arrays()
    stepwise = _walk(a, _params(a), fused=False)
    for i in range(4):
        params = _params(a)
        loss = _loss(a, params)
        with autograd.fused_backward(True):
            got = list(autograd.backward(loss))
        names = {id(t): k for k, t in params.items()}
        assert [(names[id(p)], g.name.split("#")[0]) for p, g in got] == \
            [(p, n) for p, n, _ in stepwise]
        for (p, g), (_, _, want) in zip(got, stepwise):
            np.testing.assert_allclose(np.asarray(g.array), want,
                                       **matmul_tolerance(1e-6, 1e-7), err_msg=names[id(p)])
        if i == 1:
            walked_symbolically = len(symbolic)  # the first two walks wrote the plan
    assert counted["replays"] == 3 and walked_symbolically > 0
    assert len(symbolic) == walked_symbolically  # walks 3 and 4: found by signature
    params = _params(a)
    params["b"].stores_grad = False  # another signature: b's gradient is no longer yielded
    with autograd.fused_backward(True):
        got = [names for names in (p.name for p, _ in autograd.backward(_loss(a, params)))]
    assert got == [p for p, _, _ in stepwise if p != "b"]
    assert len(symbolic) > walked_symbolically


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_eager_training_steps_walk_as_one_kernel_from_the_second(optimizer, counted):
    """Eager steps through ``opt(loss)``: from the second step each walk is one kernel; fused
    and op by op end on the same weights and optimizer state."""
    from singa_jax import opt
    a = _arrays()
    ends, walked = [], []
    for fuse in (False, True):
        params = _params(a)
        o = opt.SGD(lr=0.1, momentum=0.9) if optimizer == "SGD" else opt.Adam(lr=0.01)
        losses = []
        before = counted["op backwards"]
        with autograd.fused_backward(fuse):
            for _ in range(5):
                loss = _loss(a, params)
                o(loss)
                losses.append(float(np.asarray(loss.array).reshape(())))
        walked.append(counted["op backwards"] - before)
        assert losses[-1] < losses[0]
        ends.append({**{k: np.asarray(t.array) for k, t in params.items()},
                     **{k: np.asarray(t.array) for k, t in o.get_states().items()}})
    # the first step's walk is new: op by op; steps 2-5 each one kernel
    assert counted["replays"] == 4
    assert walked[1] == walked[0] // 5
    assert ends[0].keys() == ends[1].keys() and len(ends[0]) > 3
    for k in ends[0]:
        np.testing.assert_allclose(ends[1][k], ends[0][k], **matmul_tolerance(1e-5, 1e-6), err_msg=k)


def test_a_fused_step_with_nonfinite_gradients_is_skipped(counted):
    """The non-finite guard after a fused walk: a NaN gradient leaves every param and slot as
    it was and counts the skip."""
    from singa_jax import opt
    a = _arrays()
    params = _params(a)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    scale = np.ones((1,), np.float32)
    for step in range(4):
        loss = _loss(a, params)
        if step == 3:
            scale[0] = np.nan
            before = {k: np.asarray(t.array) for k, t in {**params, **sgd.get_states()}.items()
                      if k != "step_counter"}
        with pytest.warns(opt.NonFiniteStepWarning) if step == 3 else contextlib.nullcontext():
            sgd(autograd.mul(loss, tensor.from_numpy(scale)))
            if step == 3:
                sgd._report_skipped_steps()
                jax.block_until_ready(sgd.skipped_steps.array)
                sgd._report_skipped_steps()
    assert counted["replays"] == 3
    after = {k: np.asarray(t.array) for k, t in {**params, **sgd.get_states()}.items()
             if k != "step_counter"}
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert float(np.asarray(sgd.skipped_steps.array).reshape(())) == 1


def test_pytorch_style_walks_free_the_graph_when_fused(counted):
    a = _arrays()
    for i in range(3):
        params = {k: tensor.tensor(a[k], requires_grad=True) for k in ("w", "b")}
        x = tensor.tensor(a["x"])
        y = autograd.reduce_sum(autograd.tanh(autograd.add_bias(autograd.matmul(
            x, params["w"]), params["b"])))
        y.backward()
        h = np.tanh(a["x"] @ a["w"] + a["b"])
        np.testing.assert_allclose(np.asarray(params["w"].grad.array), a["x"].T @ (1 - h * h),
                                   **matmul_tolerance(1e-5, 1e-6))
        np.testing.assert_allclose(np.asarray(params["b"].grad.array), (1 - h * h).sum(0),
                                   **matmul_tolerance(1e-5, 1e-6))
        with pytest.raises(RuntimeError, match="already freed"):
            y.backward()
    assert counted["replays"] == 2


def test_wanted_intermediates_match_the_op_by_op_walk(counted):
    a = _arrays()
    results = []
    for fuse in (False, True, True):
        with autograd.fused_backward(fuse):
            t = tensor.tensor(a["x"], requires_grad=True)
            w = tensor.tensor(a["w"], requires_grad=True)
            mid = autograd.tanh(autograd.matmul(t, w))
            out = autograd.grad(autograd.reduce_sum(autograd.mul(mid, mid)), [mid, t])
            results.append([np.asarray(g.array) for g in out])
    assert counted["replays"] == 1
    for got, want in zip(results[2], results[0]):
        np.testing.assert_allclose(got, want, **matmul_tolerance(1e-6, 1e-7))
    m = np.tanh(a["x"] @ a["w"])
    # XLA:CPU's tanh is a rational approximation: up to ~1e-5 relative from NumPy's near 0
    np.testing.assert_allclose(results[2][0], 2 * m, **matmul_tolerance(1e-5, 1e-7))


class _StraightThrough(Function):
    """round(x) with the identity as gradient: a backward that is not the pullback."""

    fn = staticmethod(jnp.round)

    def backward(self, dy):
        return (dy,)


class _UserScale(autograd.Operator):
    """A SINGA-style user operator (CTensors in and out): twice its input."""

    def forward(self, x):
        return x * 2.0

    def backward(self, dy):
        return dy * 2.0


@pytest.mark.parametrize("case", ["custom backward", "user operator", "identity dropout",
                                  "too many ops"])
@float32_matmul_precision_scope("float32")  # tanh(2 * 3.3 x @ w) magnifies TF32's rounding
def test_walks_the_replay_cannot_express_go_op_by_op(case, counted, monkeypatch):
    if case == "too many ops":
        monkeypatch.setattr(fused, "FUSED_WALK_MAX_OPS", 2)
        monkeypatch.setattr(fused, "FUSED_WALK_MAX_SMALL_OPS", 2)
    a = _arrays()
    for _ in range(3):
        w = Tensor(data=a["w"], stores_grad=True)
        h = autograd.matmul(Tensor(data=a["x"] * 3.3), w)
        if case == "custom backward":
            h = _StraightThrough()(h)[0]
        elif case == "user operator":
            h = _UserScale()(h)[0]
        elif case == "identity dropout":
            h = autograd.dropout(h, ratio=0.0)
        (p, g), = autograd.backward(autograd.reduce_sum(autograd.tanh(h)))
        hv = a["x"] * 3.3 @ a["w"]
        if case == "custom backward":
            want = (a["x"] * 3.3).T @ (1 - np.tanh(np.round(hv)) ** 2)
        elif case == "user operator":
            want = 2 * (a["x"] * 3.3).T @ (1 - np.tanh(2 * hv) ** 2)
        else:
            want = (a["x"] * 3.3).T @ (1 - np.tanh(hv) ** 2)
        np.testing.assert_allclose(np.asarray(g.array), want, rtol=1e-4, atol=1e-5)
    assert counted["replays"] == 0


def test_threads_walking_different_graphs_get_their_own_gradients(counted):
    """Plans registered by several threads at once get distinct ids: each thread's replays
    give its own graph's gradients."""
    import threading

    rng = np.random.default_rng(5)
    cases = {"tanh": (autograd.tanh, lambda h: 1 - np.tanh(h) ** 2),
             "sigmoid": (autograd.sigmoid, lambda h: (s := 1 / (1 + np.exp(-h))) * (1 - s)),
             "relu": (autograd.relu, lambda h: (h > 0).astype(np.float32))}
    data = {k: (rng.normal(size=(4, 3 + i)).astype(np.float32),
                rng.normal(size=(3 + i, 2)).astype(np.float32)) for i, k in enumerate(cases)}
    errors = []

    def work(name: str) -> None:
        op, derivative = cases[name]
        x, w = data[name]
        try:
            with modes.training_mode(True):  # the fixture's mode is this thread's
                for _ in range(6):
                    wt = Tensor(data=w, stores_grad=True)
                    (p, g), = autograd.backward(autograd.reduce_sum(op(autograd.matmul(
                        Tensor(data=x), wt))))
                    np.testing.assert_allclose(np.asarray(g.array), x.T @ derivative(x @ w),
                                               **matmul_tolerance(1e-5, 1e-6))
        except Exception as e:  # reported below: pytest sees no exception raised in a thread
            errors.append((name, e))

    threads = [threading.Thread(target=work, args=(k,)) for k in cases for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # 36 walks; per case the first (or, when two threads meet it at once, two) go op by op
    assert counted["replays"] >= 36 - 2 * 3


def test_a_fused_walk_on_another_device_stays_there(counted):
    """Operators on the second device: the replay runs there (the loss's unit gradient, made on
    the default device, follows), and training equals the op-by-op walk."""
    if len(jax.devices()) < 2:
        pytest.skip("needs two devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    from singa_jax import device, opt
    second = device.create_cpu_devices(2)[1]
    a = _arrays()
    ends = []
    for fuse in (False, True):
        w = Tensor(data=a["w"], device=second, stores_grad=True, name="w")
        x = Tensor(data=a["x"], device=second)
        sgd = opt.SGD(lr=0.1)
        with autograd.fused_backward(fuse):
            for _ in range(4):
                sgd(autograd.reduce_mean(autograd.tanh(autograd.matmul(x, w))))
        assert w.device is second and w.array.devices() == {second.jax_device}
        ends.append(np.asarray(w.array))
    assert counted["replays"] == 3
    np.testing.assert_allclose(ends[1], ends[0], **matmul_tolerance(1e-6, 1e-7))
