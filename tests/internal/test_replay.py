"""Eager replay white-box: the switch, pending values, fused walks where the backend fuses them.
(This tier imports singa_jax._src.)"""
import jax
import numpy as np
import pytest
from singa_jax import autograd, device, tensor
from singa_jax._src.eager import replay
from test_replay import (  # noqa: F401 (shared helpers and fixtures)
    ATOL, Net, RTOL, _TOLERANCE, _assert_same, _data, _train)

pytestmark = pytest.mark.usefixtures("record_every_sequence")


def test_no_tensor_holds_a_pending_value_after_a_model_call():
    *_, net = _train(Net, True, [2], steps=4)
    tensors = list(net.get_states().values()) + list(net.optimizer.get_states().values())
    assert all(isinstance(t._data, jax.Array) for t in tensors)


def test_switch_is_scoped_and_a_decorator():
    assert autograd.eager_replay(False)(lambda: replay.active())() is False
    with autograd.eager_replay(False):
        assert not replay.active()
        with autograd.eager_replay(True):
            assert replay.active()
    assert replay.active()


def test_only_long_sequences_are_recorded(monkeypatch):
    """With the default threshold a short sequence runs op by op from then on (on a CPU its
    kernels overlap with the Python of the next ops) and a long one is recorded again."""
    monkeypatch.setattr(replay, "MIN_RECORDS", 8)
    x = tensor.from_numpy(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))

    def chain(n):
        y = x
        for _ in range(n):
            y = autograd.tanh(y)
        replay.flush()  # a sequence boundary, as a Model call's end or a backward is
        return y

    chain(12)  # a long sequence: the kernel is known and the next sequence is recorded
    for n, recorded in ((12, True), (3, True), (3, False), (12, False), (12, True)):
        # a short sequence turns recording off for the next; a long one, run at once, turns it
        # back on
        before = autograd.replay_stats()["recorded"]
        y = chain(n)
        assert (autograd.replay_stats()["recorded"] > before) is recorded, (n, recorded)
        want = np.asarray(x.array)
        for _ in range(n):
            want = np.tanh(want)
        # (XLA's float32 tanh against NumPy's, twelve times over: 1e-5)
        np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-5)


@pytest.mark.parametrize("heavy", [False, True])
def test_walks_of_heavy_operators_fuse_where_the_backend_says(monkeypatch, heavy):
    """xla_options.fuses_heavy_walks: on a CPU a long walk of heavy operators goes op by op; on
    an accelerator it is fused (and recorded into the step's program) like a small one. Here
    every operator counts as heavy and walks past 4 operators as long; the switch of the
    platform the test runs on is flipped: the gradients equal op by op's either way."""
    from singa_jax._src.backend import xla_options
    from singa_jax._src.autodiff import fused
    from singa_jax._src.autodiff import backward as backward_mod
    monkeypatch.setattr(fused, "FUSED_WALK_MAX_OPS", 4)
    monkeypatch.setattr(fused, "FUSED_WALK_SMALL_OP", 0)
    platform = device.get_default_device().platform
    monkeypatch.setitem(xla_options.HEAVY_WALKS_FUSED, platform, heavy)
    walks = []
    walk = backward_mod.fused_walk

    def counting(*args, **kwargs):
        result = walk(*args, **kwargs)
        walks.append(result is not None)
        return result

    monkeypatch.setattr(backward_mod, "fused_walk", counting)  # the name backward() calls
    replayed = _train(Net, True, [2], steps=5)
    assert any(walks) is heavy  # (a plan fuses from its second walk on)
    plain = _train(Net, False, [2], steps=5)
    _assert_same(replayed, plain)
