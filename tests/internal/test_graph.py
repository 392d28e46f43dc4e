"""Graph mode's runner (graph/runner.py) against the core contracts only: hand-made ops,
layers and optimizers.

Every test runs the same step eagerly and through :class:`GraphRunner` from the same seeds and
compares the numbers, and checks a trap of whole-step compilation.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax import autograd, device, tensor
from singa_jax._src.graph import runner as graph_mod
from singa_jax.autograd import make_function
from singa_jax._src.graph.runner import GraphModeError, GraphRunner
from singa_jax._src.graph.layout import tensors_in
from singa_jax.tensor import Tensor

# --- tiny op catalogue (pure functions -> autograd Functions) --------------------------------
MatMul = make_function("MatMul", lambda x, w: x @ w)
AddBias = make_function("AddBias", lambda x, b: x + b)
Relu = make_function("Relu", lambda x: jnp.maximum(x, 0))
Mask = make_function("Mask", lambda x, key, p=0.5: jnp.where(
    jax.random.bernoulli(key, 1 - p, x.shape), x / (1 - p), 0.0))


def _xent(logits, labels):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.sum(logp * labels, axis=-1))


XEnt = make_function("XEnt", _xent)
Norm = make_function("Norm", lambda x, g: g * (x - x.mean(0)) / jnp.sqrt(x.var(0) + 1e-5))


def param(rng, *shape):
    return Tensor(data=rng.standard_normal(shape).astype(np.float32) * 0.3, stores_grad=True)


class Net:
    """Linear-Relu-Dropout-Norm-Linear, with running statistics like batch-norm."""

    def __init__(self, seed=0, dropout=True):
        rng = np.random.default_rng(seed)
        self.w1, self.b1 = param(rng, 6, 8), param(rng, 8)
        self.g = Tensor(data=np.ones(8, np.float32), stores_grad=True)
        self.w2, self.b2 = param(rng, 8, 3), param(rng, 3)
        self.running_mean = Tensor(data=np.zeros(8, np.float32), requires_grad=False)
        self.dropout = dropout

    def get_states(self):
        return {"w1": self.w1, "b1": self.b1, "g": self.g, "w2": self.w2, "b2": self.b2,
                "running_mean": self.running_mean}

    def forward(self, x):
        h = Relu()(AddBias()(MatMul()(x, self.w1)[0], self.b1)[0])[0]
        if self.dropout and autograd.is_training():
            key = Tensor(data=h.device.next_key(), requires_grad=False)
            h = Mask(p=0.25)(h, key)[0]
        if autograd.is_training():
            self.running_mean.array = 0.9 * self.running_mean.array + 0.1 * h.array.mean(0)
        h = Norm()(h, self.g)[0]
        return AddBias()(MatMul()(h, self.w2)[0], self.b2)[0]


class MomentumSGD:
    """SINGA-style SGD: lazily created momentum slots, a step counter, a decaying lr Tensor."""

    def __init__(self, lr=0.1, momentum=0.9, decay_rate=None):
        self.lr, self.momentum, self.decay_rate = lr, momentum, decay_rate
        self.step_counter = Tensor(data=np.zeros((), np.float32), requires_grad=False)
        self.moments = {}

    def lr_value(self):
        if self.decay_rate is None:
            return self.lr
        return self.lr * self.decay_rate ** self.step_counter.array  # traced in graph mode

    def __call__(self, loss):
        lr = self.lr_value()
        for p, g in autograd.backward(loss):
            if id(p) not in self.moments:
                self.moments[id(p)] = Tensor(data=jnp.zeros_like(p.array), requires_grad=False)
            buf = self.moments[id(p)]
            buf.array = self.momentum * buf.array + g.array
            p.array = p.array - lr * buf.array
        self.step_counter.array = self.step_counter.array + 1


class Adam:
    def __init__(self, lr=0.01, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.t = Tensor(data=np.zeros((), np.float32), requires_grad=False)
        self.m, self.v = {}, {}

    def __call__(self, loss):
        self.t.array = self.t.array + 1
        for p, g in autograd.backward(loss):
            for slots in (self.m, self.v):
                slots.setdefault(id(p), Tensor(data=jnp.zeros_like(p.array), requires_grad=False))
            m, v = self.m[id(p)], self.v[id(p)]
            m.array = self.b1 * m.array + (1 - self.b1) * g.array
            v.array = self.b2 * v.array + (1 - self.b2) * g.array ** 2
            mh = m.array / (1 - self.b1 ** self.t.array)
            vh = v.array / (1 - self.b2 ** self.t.array)
            p.array = p.array - self.lr * mh / (jnp.sqrt(vh) + self.eps)


def train_one_batch(net, opt, x, y):
    out = net.forward(x)
    loss = XEnt()(out, y)[0]
    opt(loss)
    return out, loss


def batch(step, n=5):
    rng = np.random.default_rng(100 + step)
    x = Tensor(data=rng.standard_normal((n, 6)).astype(np.float32), requires_grad=False)
    y = Tensor(data=np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)], requires_grad=False)
    return x, y


@pytest.fixture(autouse=True)
def training_mode():
    prev = autograd.training
    autograd.training = True
    device.get_default_device().SetRandSeed(7)
    yield
    autograd.training = prev


def run_steps(make_opt, use_graph, steps=10, dropout=True, sizes=None):
    dev = device.get_default_device()
    dev.SetRandSeed(7)
    net, opt = Net(dropout=dropout), make_opt()
    runner = GraphRunner("net")
    losses = []
    for s in range(steps):
        x, y = batch(s, n=(sizes[s] if sizes else 5))
        if use_graph:
            out, loss = runner.run(lambda a, b: train_one_batch(net, opt, a, b), "train_one_batch",
                                   (x, y), {}, list(net.get_states().values()) + tensors_in(opt),
                                   training=True)
        else:
            out, loss = train_one_batch(net, opt, x, y)
        losses.append(float(loss.array))
    final = {k: np.asarray(v.array) for k, v in net.get_states().items()}
    return np.array(losses), final, runner, opt, np.asarray(dev.key)


def assert_same(a, b):
    la, fa, _, _, ka = a
    lb, fb, _, _, kb = b
    np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-6)
    for k in fa:
        np.testing.assert_allclose(fa[k], fb[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_array_equal(ka, kb)  # dropout consumed the same keys


@pytest.mark.parametrize("make_opt", [lambda: MomentumSGD(), lambda: Adam()], ids=["sgd", "adam"])
def test_graph_equals_eager_over_steps(make_opt):
    eager = run_steps(make_opt, use_graph=False)
    graph = run_steps(make_opt, use_graph=True)
    assert_same(eager, graph)
    assert eager[0][-1] < eager[0][0]  # it trains
    # the first trace meets the lazily created slots: that program runs once (its slots leave it
    # as outputs); the second trace takes them as inputs and is reused for the remaining 8 steps
    assert graph[2].trace_count == 2 and len(graph[2].programs) == 1


def test_lr_schedule_is_traced():
    eager = run_steps(lambda: MomentumSGD(lr=0.5, decay_rate=0.5), use_graph=False, dropout=False)
    graph = run_steps(lambda: MomentumSGD(lr=0.5, decay_rate=0.5), use_graph=True, dropout=False)
    assert_same(eager, graph)
    assert float(graph[3].step_counter.array) == 10.0
    # a baked-in lr would make graph mode diverge from eager after the second step
    frozen = run_steps(lambda: MomentumSGD(lr=0.5, decay_rate=1.0), use_graph=False, dropout=False)
    assert not np.allclose(frozen[0], graph[0], rtol=1e-3)


def test_dropout_key_advances_every_step():
    dev = device.get_default_device()
    net, opt, runner = Net(), MomentumSGD(), GraphRunner()
    x, y = batch(0)
    keys, outs = [], []
    for _ in range(4):
        out, _ = runner.run(lambda a, b: train_one_batch(net, opt, a, b), "step", (x, y), {},
                            list(net.get_states().values()) + tensors_in(opt), True)
        keys.append(np.asarray(dev.key))
        outs.append(np.asarray(out.array))
    assert len({k.tobytes() for k in keys}) == 4
    # same parameters would give the same output without fresh masks; masks differ per step
    assert not np.allclose(outs[2], outs[3])


def test_running_statistics_updated_as_in_eager():
    eager = run_steps(lambda: MomentumSGD(), use_graph=False, steps=4)
    graph = run_steps(lambda: MomentumSGD(), use_graph=True, steps=4)
    assert np.abs(graph[1]["running_mean"]).sum() > 0
    np.testing.assert_allclose(eager[1]["running_mean"], graph[1]["running_mean"], rtol=1e-5)


def test_retrace_on_new_batch_size_and_reuse():
    sizes = [5, 5, 7, 5, 7]
    eager = run_steps(lambda: MomentumSGD(), use_graph=False, steps=5, sizes=sizes)
    graph = run_steps(lambda: MomentumSGD(), use_graph=True, steps=5, sizes=sizes)
    assert_same(eager, graph)
    assert graph[2].trace_count == 3  # batch 5 (twice: the first one-off), batch 7
    assert len(graph[2].programs) == 2


def test_static_arguments_select_programs():
    net, opt, runner = Net(dropout=False), MomentumSGD(), GraphRunner()
    x, y = batch(0)
    state = list(net.get_states().values())

    def step(a, mode):
        out = net.forward(a)
        return out if mode == "plain" else Relu()(out)[0]

    runner.run(step, "f", (x, "plain"), {}, state, True)  # eager first call
    plain = runner.run(step, "f", (x, "plain"), {}, state, True)
    relu = runner.run(step, "f", (x, "relu"), {}, state, True)
    assert runner.trace_count == 2
    np.testing.assert_allclose(np.asarray(relu.array), np.maximum(np.asarray(plain.array), 0))
    assert (np.asarray(plain.array) < 0).any()
    runner.run(step, "f", (x, "plain"), {}, state, True)
    assert runner.trace_count == 2
    with pytest.raises(TypeError, match="not hashable"):
        runner.run(step, "f", (x, {1, 2}), {}, state, True)


def test_value_dependent_control_flow_is_rejected_clearly():
    net, runner = Net(dropout=False), GraphRunner("MyModel")
    before = {k: np.asarray(v.array) for k, v in net.get_states().items()}
    key_before = np.asarray(device.get_default_device().key)

    def step(a):
        out = net.forward(a)
        if out.array.sum() > 0:  # Python branch on a traced value
            return out
        return out

    with pytest.raises(GraphModeError, match="use_graph=False") as info:
        runner.run(step, "train_one_batch", batch(0)[:1], {}, list(net.get_states().values()),
                   True)
    assert "MyModel.train_one_batch" in str(info.value)
    for k, v in net.get_states().items():  # nothing changed, nothing holds a tracer
        assert not isinstance(v.array, jax.core.Tracer)
        np.testing.assert_array_equal(before[k], np.asarray(v.array))
    np.testing.assert_array_equal(key_before, np.asarray(device.get_default_device().key))


def test_stale_constant_trap():
    """A tensor read by the step but declared by nobody must not be frozen into the program."""
    net = Net(dropout=False)
    scale = Tensor(data=np.float32(1.0), requires_grad=False)  # undeclared
    runner = GraphRunner()
    x, _ = batch(0)

    def step(a):
        return tensor.Tensor(data=net.forward(a).array * scale.array, requires_grad=False)

    autograd.training = False
    state = list(net.get_states().values())
    first = np.asarray(runner.run(step, "f", (x,), {}, state, False).array)
    scale.array = jnp.asarray(3.0, jnp.float32)
    second = np.asarray(runner.run(step, "f", (x,), {}, state, False).array)
    np.testing.assert_allclose(second, 3 * first, rtol=1e-5)
    scale.array = jnp.asarray(-1.0, jnp.float32)
    third = np.asarray(runner.run(step, "f", (x,), {}, state, False).array)
    np.testing.assert_allclose(third, -first, rtol=1e-5)
    # the program with the constant runs once, then scale is an input
    assert runner.trace_count == 2


def test_undeclared_written_tensor_gets_concrete_value():
    counter = Tensor(data=np.float32(0), requires_grad=False)  # undeclared, written each step
    runner = GraphRunner()
    x, _ = batch(0)

    def step(a):
        counter.array = counter.array + a.array.shape[0]
        return a

    for _ in range(3):
        runner.run(step, "f", (x,), {}, [], False)
        assert not isinstance(counter.array, jax.core.Tracer)
    assert float(counter.array) == 15.0


def test_a_failed_trace_gives_an_undeclared_written_tensor_its_value_back():
    """A step that writes a Tensor nobody declared and then fails to trace (a branch on a
    traced value) leaves that Tensor as it was before the call, not zeros."""
    counter = Tensor(data=np.float32(5), requires_grad=False)  # undeclared, written
    runner = GraphRunner()
    x, _ = batch(0)

    def step(a):
        counter.array = counter.array + 1.0
        float(np.asarray(a.array).sum())  # reads a value: this step cannot be traced
        return a

    with pytest.raises(GraphModeError):
        runner.run(step, "f", (x,), {}, [], False)
    assert not isinstance(counter.array, jax.core.Tracer)
    assert float(counter.array) == 5.0


def test_lazily_created_slots_become_state():
    net, opt, runner = Net(dropout=False), MomentumSGD(), GraphRunner()
    declared = list(net.get_states().values()) + tensors_in(opt)
    x, y = batch(0)
    runner.run(lambda a, b: train_one_batch(net, opt, a, b), "t", (x, y), {}, declared, True)
    assert len(opt.moments) == 5
    for m in opt.moments.values():  # concrete, not tracers, and non-zero after one step
        assert isinstance(m.array, jax.Array) and not isinstance(m.array, jax.core.Tracer)
        assert np.abs(np.asarray(m.array)).sum() > 0
    assert {id(m) for m in opt.moments.values()} <= {id(t) for t in runner.discovered}
    # the slots now carry momentum between steps: compare with eager from the same start
    eager_net, eager_opt = Net(dropout=False), MomentumSGD()
    train_one_batch(eager_net, eager_opt, x, y)
    for s in range(1, 4):
        xs, ys = batch(s)
        runner.run(lambda a, b: train_one_batch(net, opt, a, b), "t", (xs, ys), {}, declared, True)
        train_one_batch(eager_net, eager_opt, xs, ys)
    for k, v in net.get_states().items():
        np.testing.assert_allclose(np.asarray(v.array), np.asarray(eager_net.get_states()[k].array),
                                   rtol=1e-5, atol=1e-6)


def test_results_are_concrete_pytrees():
    net, runner = Net(dropout=False), GraphRunner()
    x, _ = batch(0)

    def step(a):
        out = net.forward(a)
        return {"out": out, "pair": [out, "tag"], "n": 3}

    for _ in range(2):  # the second call runs the compiled program
        res = runner.run(step, "f", (x,), {}, list(net.get_states().values()), True)
    assert runner.trace_count == 1
    assert res["n"] == 3 and res["pair"][1] == "tag"
    assert isinstance(res["out"], Tensor) and not isinstance(res["out"].array, jax.core.Tracer)
    assert isinstance(res["out"].creator, autograd.Dummy)
    np.testing.assert_allclose(np.asarray(res["out"].array), np.asarray(res["pair"][0].array))


def test_old_buffers_are_donated_and_aliases_handled():
    net, opt, runner = Net(dropout=False), MomentumSGD(), GraphRunner()
    w1_start = np.asarray(net.w1.array)
    tied = Tensor(data=net.w1.array, stores_grad=True)  # the same buffer as w1, not trained
    declared = list(net.get_states().values()) + [tied] + tensors_in(opt)
    x, y = batch(0)
    donated = []
    real_copy_shared = graph_mod._copy_shared

    def spy(arrays):  # what the step is about to donate, after copying shared arrays
        real_copy_shared(arrays)
        donated.extend(arrays)

    graph_mod._copy_shared = spy
    try:
        for _ in range(3):
            runner.run(lambda a, b: train_one_batch(net, opt, a, b), "t", (x, y), {}, declared,
                       True)
            held_b1 = net.b1.array  # the user holds a state array across the next step
            b1_values = np.asarray(held_b1)
    finally:
        graph_mod._copy_shared = real_copy_shared
    assert runner.trace_count == 2  # the first program meets the momentum slots
    np.testing.assert_array_equal(np.asarray(tied.array), w1_start)  # copied, not donated
    assert not np.allclose(np.asarray(net.w1.array), w1_start)
    assert donated and all(a.is_deleted() for a in donated)  # the buffers went to the program
    # an array someone else holds is copied before donation: theirs stays valid, unchanged
    runner.run(lambda a, b: train_one_batch(net, opt, a, b), "t", (x, y), {}, declared, True)
    assert not held_b1.is_deleted()
    np.testing.assert_array_equal(np.asarray(held_b1), b1_values)


def test_state_rebound_to_a_new_shape_retraces():
    net = Net(dropout=False)
    runner = GraphRunner()
    x, _ = batch(0)
    state = list(net.get_states().values())
    autograd.training = False
    for _ in range(3):
        first = np.asarray(runner.run(net.forward, "f", (x,), {}, state, False).array)
    assert runner.trace_count == 1
    net.b2.array = jnp.reshape(net.b2.array + 1.0, (1, 3))  # same object, new shape
    second = np.asarray(runner.run(net.forward, "f", (x,), {}, state, False).array)
    assert runner.trace_count == 2
    np.testing.assert_allclose(second, first + 1.0, rtol=1e-5)


def test_unalias_copies_arrays_sharing_a_buffer():
    from singa_jax._src.graph.layout import buffer_id as _buffer_id, unalias as _unalias
    a, b = jnp.ones(3), jnp.zeros(3)
    key = jax.random.PRNGKey(0)
    donated, others = [a, a, b, key], [b, key]
    _unalias(donated, others, id)
    assert donated[0] is a and donated[1] is not a  # copies...
    assert donated[2] is not b and donated[3] is not key  # ...of what other inputs also hold...
    np.testing.assert_array_equal(np.asarray(donated[1]), np.asarray(a))  # ...of the same values
    assert len({_buffer_id(x) for x in donated + others}) == 6
    fresh = [jnp.ones(2), jnp.ones(2) + 1]
    before = list(fresh)
    _unalias(fresh, [jnp.zeros(2)], _buffer_id)  # nothing shared: nothing copied
    assert all(x is y for x, y in zip(fresh, before))


def test_program_takes_only_the_state_it_uses_and_returns_only_what_it_rewrites():
    net, opt, runner = Net(dropout=False), MomentumSGD(), GraphRunner()
    frozen = Tensor(data=np.ones(3, np.float32), requires_grad=False)  # read, never written
    unused = Tensor(data=np.zeros(2, np.float32), requires_grad=False)  # declared, never touched
    counter = Tensor(data=np.zeros((), np.float32), requires_grad=False)  # written, never read

    def step(a, b):
        out, loss = train_one_batch(net, opt, a, b)
        counter.array = jnp.full((), 7.0)  # overwritten without being read
        return AddBias()(out, frozen)[0], loss

    declared = list(net.get_states().values()) + tensors_in(opt) + [frozen, unused, counter]
    x, y = batch(0)
    frozen_array, unused_array = frozen.array, unused.array
    for _ in range(3):
        out, _ = runner.run(step, "t", (x, y), {}, declared, True)
    (prog,) = runner.programs.values()
    names = lambda ts: {id(t) for t in ts}  # noqa: E731
    assert id(frozen) in names(prog.read) and id(frozen) not in names(prog.written)
    assert id(unused) not in names(prog.read + prog.donated + prog.written)
    assert id(counter) in names(prog.written) and id(counter) not in names(prog.donated)
    assert id(net.w1) in names(prog.donated) and id(net.w1) in names(prog.written)
    # no dropout: the device key is neither passed nor returned, and stays as it was
    assert prog.donated_devices == prog.read_devices == prog.written_devices == []
    # read-only and untouched state keeps its (not donated) arrays; the rewritten one is concrete
    assert frozen.array is frozen_array and not frozen_array.is_deleted()
    assert unused.array is unused_array and not unused_array.is_deleted()
    assert float(counter.array) == 7.0
    # the same three steps eagerly give the same output
    eager_net, eager_opt = Net(dropout=False), MomentumSGD()
    for _ in range(3):
        eager_out, _ = train_one_batch(eager_net, eager_opt, x, y)
    np.testing.assert_allclose(np.asarray(out.array), np.asarray(eager_out.array) + 1.0,
                               rtol=1e-5, atol=1e-6)


def test_compiled_eval_does_not_donate_parameters():
    net, runner = Net(dropout=False), GraphRunner()
    autograd.training = False
    x, _ = batch(0)
    state = list(net.get_states().values())
    arrays = [t.array for t in state]
    out = runner.run(net.forward, "f", (x,), {}, state, False)
    assert runner.trace_count == 1  # an evaluation call compiles at once (it is not explored)
    for _ in range(2):
        out = runner.run(net.forward, "f", (x,), {}, state, False)
    assert runner.trace_count == 1
    (prog,) = runner.programs.values()
    assert prog.donated == [] and prog.written == []
    assert all(t.array is a and not a.is_deleted() for t, a in zip(state, arrays))
    np.testing.assert_allclose(np.asarray(out.array), np.asarray(net.forward(x).array), rtol=1e-6)


def test_a_compiled_model_called_inside_another_step_is_traced_inline():
    inner_net = Net(dropout=False)
    inner = GraphRunner("inner")
    outer_opt, outer = MomentumSGD(), GraphRunner("outer")

    def inner_forward(a):
        return inner.run(inner_net.forward, "f", (a,), {},
                         list(inner_net.get_states().values()), True)

    def outer_step(a, b):  # trains the inner network's parameters through the outer program
        loss = XEnt()(inner_forward(a), b)[0]
        outer_opt(loss)
        return loss

    eager_net, eager_opt = Net(dropout=False), MomentumSGD()
    for s in range(4):
        x, y = batch(s)
        loss = outer.run(outer_step, "t", (x, y), {}, [], True)
        eager_loss = XEnt()(eager_net.forward(x), y)[0]
        eager_opt(eager_loss)
        np.testing.assert_allclose(float(loss.array), float(eager_loss.array), rtol=1e-5)
    # inner ran inside outer's programs (the first meets the momentum slots, the second keeps)
    assert outer.trace_count == 2 and inner.trace_count == 0
    np.testing.assert_allclose(np.asarray(inner_net.w1.array), np.asarray(eager_net.w1.array),
                               rtol=1e-5, atol=1e-6)


def test_a_step_that_keeps_new_state_every_call_is_correct_and_warned_about():
    history = []  # a Tensor created and kept by every step: each call meets new state

    def step(a):
        out = Tensor(data=a.array * 2.0, requires_grad=False)
        history.append(out)
        return out

    runner, x = GraphRunner(), batch(0)[0]
    with pytest.warns(RuntimeWarning, match=r"met new state on each of its last 5 calls"):
        for _ in range(5):
            runner.run(step, "f", (x,), {}, [], False)
    assert runner.trace_count == 5 and not runner.programs
    for t in history:  # every kept Tensor got its concrete value
        np.testing.assert_allclose(np.asarray(t.array), 2 * np.asarray(x.array), rtol=1e-6)
