"""The eager call path's caches and one-time checks, each keyed by what it derives from. (This tier
imports singa_jax._src.)"""
from __future__ import annotations
import gc
import jax
import numpy as np
import pytest
from backend_precision import matmul_tolerance
from singa_jax import autograd, layer, tensor
from singa_jax._src.eager import replay
from singa_jax._src.autodiff import fused
from singa_jax._src.autodiff import kernels
from singa_jax.tensor import Tensor
from test_eager_fast_paths import _conv_reference  # noqa: F401 (fixtures too)


RTOL = ATOL = 1e-6


def test_a_window_op_makes_its_static_key_once_per_handle_and_odd_padding(rng):
    x = rng.normal(size=(2, 4, 6, 6)).astype(np.float32)
    w = rng.normal(size=(4, 4, 3, 3)).astype(np.float32)
    b = rng.normal(size=(4,)).astype(np.float32)
    h1 = autograd.ConvHandle(x, (3, 3), (1, 1), (1, 1), 4, 4, True)
    h2 = autograd.ConvHandle(x, (3, 3), (2, 2), (1, 1), 4, 4, True)
    a, c = autograd._Conv2d(h1), autograd._Conv2d(h1)
    assert a._static is c._static  # one key for the handle's ops
    # the same key the general freezing makes from the op's static arguments
    assert dict(a._static) == dict(kernels._freeze(a.static)) == {
        "odd_padding": (0, 0, 0, 0), "stride": (1, 1), "padding": (1, 1), "dilation": (1, 1),
        "group": 1}
    assert autograd._Conv2d(h2)._static != a._static  # another handle: its own configuration
    odd = autograd._Conv2d(h1, [0, 1, 0, 1])
    assert dict(odd._static)["odd_padding"] == (0, 1, 0, 1) and odd._static != a._static
    with pytest.raises(ValueError, match="odd_padding"):
        autograd._Conv2d(h1, (0, -1, 0, 0))
    tx, tw, tb = Tensor(data=x), Tensor(data=w), Tensor(data=b)
    for _ in range(2):  # alternating handles: each op keeps its own configuration
        for h, stride in ((h1, 1), (h2, 2)):
            got = np.asarray(autograd.conv2d(h, tx, tw, tb).array)
            np.testing.assert_allclose(got, _conv_reference(x, w, b, (stride, stride), 1),
                                       **matmul_tolerance(1e-5, 1e-5))  # TF32 on a GPU


@pytest.mark.usefixtures("training_mode")
def test_gradient_masks_are_derived_again_for_other_inputs(rng):
    """An op class's gradient masks are cached per (needs, dtypes): each call's own inputs say
    which gradients its pullback takes, and the gradients match NumPy."""
    xa = rng.normal(size=(3, 4)).astype(np.float32)
    wa = rng.normal(size=(3, 4)).astype(np.float32)
    x = Tensor(data=xa)  # a plain input: no gradient
    w = Tensor(data=wa, stores_grad=True)
    calls = [((w, x), (True, False)), ((x, w), (False, True)), ((w, w), (True, True)),
             ((w, x), (True, False))]
    for inputs, mask in calls:
        y = autograd.mul(*inputs)
        assert y.creator._diff == mask
        (p, g), = autograd.backward(autograd.reduce_sum(y))
        other = inputs[1] if inputs[0] is w else inputs[0]
        want = 2 * wa if other is w else np.asarray(other.array)
        assert p is w
        np.testing.assert_allclose(np.asarray(g.array), want, rtol=RTOL)
    # an integer input is never differentiated, whatever needs it
    idx = Tensor(data=np.array([0, 2], np.int32), requires_grad=False)
    e = autograd.embedding(idx, Tensor(data=wa, stores_grad=True))
    assert e.creator._diff == (False, True)


def test_equal_static_keys_are_one_tuple_with_their_values(rng):
    x = Tensor(data=rng.normal(size=(4, 6)).astype(np.float32))
    a, b = autograd.reshape(x, [3, 8]), autograd.reshape(x, (3, 8))
    c = autograd.reshape(x, [8, 3])
    assert a.creator._static is b.creator._static
    assert dict(c.creator._static) == {"shape": (8, 3)}
    assert a.shape == b.shape == (3, 8) and c.shape == (8, 3)
    np.testing.assert_array_equal(np.asarray(c.array), np.asarray(x.array).reshape(8, 3))


@pytest.fixture
def record_every_sequence(monkeypatch):
    monkeypatch.setattr(replay, "MIN_RECORDS", 1)


def _relu_chain(x: Tensor, n: int, keep=()):
    kept, y = [], x
    for i in range(n):
        y = autograd.relu(autograd.add(y, y)) if i % 2 else autograd.tanh(y)
        if i in keep:
            kept.append(y)
    return y, kept


def _numpy_chain(x: np.ndarray, n: int, keep=()):
    kept, y = [], x
    for i in range(n):
        y = np.maximum(y + y, 0) if i % 2 else np.tanh(y)
        if i in keep:
            kept.append(y)
    return y, kept


@pytest.mark.usefixtures("record_every_sequence")
def test_a_segment_program_returns_only_the_outputs_still_referenced(monkeypatch):
    compiled = []
    compile_ = replay._compile

    def recording_compile(segment, live):
        compiled.append(live)
        return compile_(segment, live)

    monkeypatch.setattr(replay, "_compile", recording_compile)
    xa = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    x = Tensor(data=xa)
    for _ in range(4):  # recorded from the second run, one program from the third
        y, kept = _relu_chain(x, 10, keep=(3,))
        replay.flush()
        want, want_kept = _numpy_chain(xa, 10, keep=(3,))
        np.testing.assert_allclose(np.asarray(y.array), want, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(kept[0].array), want_kept[0], rtol=1e-5)
    # the program returns the kept intermediate and the result: 2 of the segment's outputs
    assert compiled and all(live is not None and len(live) == 2 for live in compiled)


def test_referenced_counts_references_from_outside_the_segment():
    leaves = [object() for _ in range(4)]
    held = leaves[2]
    assert replay._referenced(leaves) == (2,)
    del held
    assert replay._referenced(leaves) == ()


@pytest.mark.usefixtures("record_every_sequence")
def test_ever_other_kept_outputs_stay_correct_and_bound_the_programs():
    xa = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    x = Tensor(data=xa)
    for keep in range(8):  # another intermediate kept on every run
        y, kept = _relu_chain(x, 9, keep=(keep,))
        want, want_kept = _numpy_chain(xa, 9, keep=(keep,))
        np.testing.assert_allclose(np.asarray(kept[0].array), want_kept[0], rtol=1e-5)
        np.testing.assert_allclose(np.asarray(y.array), want, rtol=1e-5)
    # the sequence got programs for a few output sets, then one returning every output: the
    # test's only sequence is the only node of the (fresh) tree where segments ended
    ended, stack = [], [replay._ROOT]
    while stack:
        step = stack.pop()
        stack.extend(step.next.values())
        if step.programs:
            ended.append(step)
    assert len(ended) == 1
    assert 2 <= len(ended[0].programs) <= replay._OUTPUT_SETS + 1


def test_a_changed_shape_takes_another_branch_of_the_sequence_tree(monkeypatch):
    monkeypatch.setattr(replay, "MIN_RECORDS", 1)
    for rows in (2, 3, 2, 3, 2, 3):
        xa = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
        y, _ = _relu_chain(Tensor(data=xa), 6)
        np.testing.assert_allclose(np.asarray(y.array), _numpy_chain(xa, 6)[0], rtol=1e-5)


@pytest.fixture
def replays_counted(monkeypatch):
    counts = {"replays": 0}
    replay_kernel = fused.fused_backward_walk

    def counting(*args):
        counts["replays"] += 1
        return replay_kernel(*args)

    monkeypatch.setattr(fused, "fused_backward_walk", counting)
    return counts


@pytest.mark.usefixtures("training_mode")
@pytest.mark.parametrize("small", [True, False])
def test_a_long_walk_is_fused_when_its_operators_are_small(small, replays_counted, monkeypatch):
    """70 operators: over FUSED_WALK_MAX_OPS, so fused only as a walk of small operators (the
    threshold lowered below their size: op by op) where the platform fuses no heavy walk (a
    CPU's rule, set here for whatever platform runs the test); the same gradient either way."""
    from singa_jax import device
    from singa_jax._src.backend import xla_options
    monkeypatch.setitem(xla_options.HEAVY_WALKS_FUSED,
                        device.get_default_device().platform, False)
    if not small:
        monkeypatch.setattr(fused, "FUSED_WALK_SMALL_OP", 2)
    wa = np.linspace(-0.5, 0.5, 6, dtype=np.float32).reshape(2, 3)
    w = Tensor(data=wa, stores_grad=True)
    want = np.ones_like(wa)  # d/dw of tanh^70(w) by the chain rule, in NumPy
    values = [wa]
    for _ in range(70):
        values.append(np.tanh(values[-1]))
    for v in reversed(values[:-1]):
        want = want * (1 - np.tanh(v) ** 2)
    with autograd.fused_backward(True):
        for _ in range(3):
            y = w
            for _ in range(70):
                y = autograd.tanh(y)
            (p, g), = autograd.backward(autograd.reduce_sum(y))
            np.testing.assert_allclose(np.asarray(g.array), want, rtol=1e-5, atol=1e-7)
    assert (replays_counted["replays"] > 0) is small


@pytest.mark.usefixtures("training_mode", "record_every_sequence")
def test_a_pullback_kept_as_leaves_serves_every_later_backward(rng, replays_counted):
    """A recorded op holds its pullback as leaves (from its call, or after a fused walk); an
    op-by-op walk, a SINGA-style ``creator.backward`` and ``_vjp`` rebuild it, with the same
    values."""
    xa, wa = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(3, 2)).astype(
        np.float32)
    w = Tensor(data=wa, stores_grad=True)
    x = Tensor(data=xa)
    for _ in range(2):  # the second forward is recorded (its kernels ran before)
        h = autograd.matmul(x, w)
        loss = autograd.reduce_sum(autograd.mul(h, h))
    # (made from its kind's recipe, the recorded call holds its pullback as the walk's leaves
    # at once; the generic path holds an _Unjoined until a walk asks)
    assert h.creator._pullback is kernels.FLAT and h.creator._flat is not None
    want = xa.T @ (2 * (xa @ wa))
    with autograd.fused_backward(True):
        grads = [np.asarray(g.array) for _ in range(3) for _, g in autograd.backward(loss)]
    assert replays_counted["replays"] > 0
    assert h.creator._flat is not None  # the leaves the fused walks took
    h = autograd.matmul(x, w)  # recorded again; its walk's plan is known: fused at once
    loss = autograd.reduce_sum(autograd.mul(h, h))
    with autograd.fused_backward(True):
        grads += [np.asarray(g.array) for _, g in autograd.backward(loss)]
    assert h.creator._pullback is kernels.FLAT  # held as its leaves alone
    with autograd.fused_backward(False):
        (_, g), = autograd.backward(loss)
    for got in grads + [np.asarray(g.array)]:  # (NumPy's float32 products; TF32 on a GPU)
        np.testing.assert_allclose(got, want, **matmul_tolerance(1e-5))
    dy = tensor.from_numpy(np.ones((4, 2), np.float32))
    dx, dw = h.creator.backward(dy.data)  # SINGA style: CTensors in and out
    np.testing.assert_allclose(np.asarray(dw), xa.T @ np.ones((4, 2)), **matmul_tolerance(1e-5))
    np.testing.assert_allclose(np.asarray(dx), np.ones((4, 2)) @ wa.T, **matmul_tolerance(1e-5))
    assert jax.tree_util.tree_leaves(h.creator._vjp)  # a pytree of arrays again


@pytest.mark.usefixtures("eval_mode", "record_every_sequence")
def test_fewer_objects_for_the_garbage_collector_per_operator(rng):
    """An eager op keeps shared tuples (static keys, masks, specs) rather than its own and its
    output no dict: a recorded convolution leaves 12 tracked objects behind (20 before)."""
    conv = layer.Conv2d(4, 3, padding=1)
    x = Tensor(data=rng.normal(size=(1, 3, 5, 5)).astype(np.float32))
    outs = [conv(x) for _ in range(3)]
    replay.flush()  # (a sequence ran: the next one is recorded)
    gc.collect()
    before = len(gc.get_objects())
    outs += [conv(x) for _ in range(50)]
    per_call = (len(gc.get_objects()) - before) / 50
    assert per_call < 16, per_call
    assert type(outs[-1]._data) is replay.Deferred  # (what was counted was recorded)
    np.testing.assert_allclose(np.asarray(outs[-1].array), np.asarray(outs[0].array), rtol=1e-6)
