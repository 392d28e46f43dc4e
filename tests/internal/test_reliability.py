"""Reliability internals: the non-finite test, value checks and the checkpoint writer. (This tier
imports singa_jax._src.)"""
import os
import signal
import subprocess
import sys
import textwrap
import warnings
import zipfile
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from singa_jax import autograd, layer, opt, tensor
from singa_jax._src.model import checkpoint
from singa_jax._src.base import checks
from singa_jax.opt import NonFiniteStepWarning
from singa_jax._src.optim.update import _all_finite
from singa_jax.tensor import Tensor
from test_reliability import (  # noqa: F401 (shared helpers and fixtures)
    LOGITS, TinyNet, W_INIT, X_GOOD, arr, make_weight, mse_step, re_escape)


# ---------------------------------------------------------------------------------------------
# checks.py: eager raise, traced collection, traced without collector
# ---------------------------------------------------------------------------------------------
def test_check_raises_eagerly_and_records_when_traced():
    checks.check(jnp.array(True), "never shown")
    with pytest.raises(ValueError, match=r"^bad: got 7 and -1$"):
        checks.check(jnp.array(False), "bad: got {} and {}", jnp.array(7), jnp.array(-1))
    with pytest.raises(ValueError, match="lazy 3"):
        checks.check(np.bool_(False), lambda: f"lazy {1 + 2}")

    def traced(x):
        checks.check(jnp.all(x >= 0), "x has negatives, min {}", jnp.min(x))
        return x * 2

    jax.jit(traced).trace(jnp.ones(3))  # no collector: a user's own jit, skipped silently
    with checks.collecting() as found:
        with checks.collecting() as inner:  # nested blocks each get their own list
            out = jax.jit(lambda x: (traced(x), [(c.ok, c.values) for c in inner]))(
                jnp.array([1.0, -2.0]))
        assert found == []
    (ok, values), = out[1]
    assert not bool(ok)
    assert inner[0].format(values) == "x has negatives, min -2.0"


def test_traced_label_check_is_collected_for_graph_mode():
    def loss_of(x, t):
        return autograd.softmax_cross_entropy(Tensor(data=x), Tensor(data=t)).array

    with checks.collecting() as found:
        jax.jit(loss_of).trace(jnp.asarray(LOGITS), jnp.zeros(4, jnp.int32))
    assert len(found) == 1 and "SoftMaxCrossEntropy: class labels" in found[0].message

    def flags(x, t):
        with checks.collecting() as found:
            loss_of(x, t)
        return [c.ok for c in found], [c.values for c in found]

    oks, values = jax.jit(flags)(jnp.asarray(LOGITS), jnp.array([0, 1, 7, 2], jnp.int32))
    assert not bool(oks[0]) and [int(v) for v in values[0][:2]] == [0, 7]


def test_nonfinite_loss_alone_skips_and_singa_behaviour_can_be_restored(training_mode):
    w, o = make_weight(), opt.SGD(lr=0.1)
    grad = Tensor(data=np.ones_like(W_INIT))
    o._apply_all([(w, grad)], loss=Tensor(data=np.array([np.inf], np.float32)))
    np.testing.assert_array_equal(arr(w), W_INIT)
    o.skip_nonfinite = False  # SINGA: the NaN is applied
    bad = X_GOOD.copy()
    bad[1, 2] = np.inf
    with pytest.warns(NonFiniteStepWarning, match="skipped the update at step 0 "):
        mse_step(o, w, bad)  # reports the earlier skip, then applies this step
    assert not np.isfinite(arr(w)).all()
    assert float(arr(o.step_counter)[0]) == 1.0


@pytest.mark.parametrize("shape", [(300, 200), (64, 32, 3, 3), (5000,), (3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_finite_flag_sees_every_nan_and_inf(shape, dtype):
    """The guard's flag (a large matrix summed through a matrix-vector product, the rest by
    plain sums): any NaN, +inf, -inf, or +inf and -inf in one row, anywhere, makes it False."""
    rng = np.random.default_rng(0)
    good = rng.standard_normal(shape).astype(dtype)
    flag = jax.jit(_all_finite)
    assert bool(flag([jnp.asarray(good), jnp.ones(3)]))
    size = good.size
    for bad_values in ([np.nan], [np.inf], [-np.inf], [np.inf, -np.inf]):
        for where in (0, size // 2, size - 1):
            bad = good.copy().reshape(-1)
            start = min(where, size - len(bad_values))
            bad[start:start + len(bad_values)] = bad_values
            arrays = [jnp.ones(3), jnp.asarray(bad.reshape(shape))]
            assert not bool(flag(arrays)), (bad_values, where)
    assert not bool(flag([jnp.asarray(good), jnp.array([np.nan], np.float32)]))  # the loss


def test_graph_mode_reports_from_a_copy_that_is_never_donated():
    """The report of a compiled step is a separate output, copied to the host as the step
    ends: holding it does not hold the guard state, which the next step may donate."""
    net = TinyNet()
    net.set_optimizer(opt.SGD(lr=0.1))
    x = tensor.from_numpy(np.ones((4, 5), np.float32))
    y = tensor.from_numpy(np.array([0, 1, 2, 1], np.int32))
    net.compile([x], is_train=True, use_graph=True)
    for _ in range(4):
        net(x, y)
    pending = list(net.optimizer.__dict__["_skip_reports"])
    assert 1 <= len(pending) <= 4
    state = net.optimizer._skip_state.array
    assert all(r is not state for r in pending)
    net(x, y)  # may donate ``state``: the reports are buffers of their own and stay readable
    for r in pending + net.optimizer.__dict__["_skip_reports"]:
        np.testing.assert_array_equal(np.asarray(r), [0.0, 0.0, 0.0])


@pytest.mark.parametrize("data,message", [
    (np.float32(1.0), "Linear: expected a batch .* got a 0-d input"),
    (np.ones((0, 4), np.float32), r"Linear: got an empty input of shape \(0, 4\)"),
])
def test_zero_d_and_empty_inputs_to_layers_are_rejected(data, message):
    lin = layer.Linear(3)
    with pytest.raises(ValueError, match=message):
        lin(Tensor(data=data))
    assert not lin._initialized
    bn = layer.BatchNorm2d(2)
    with pytest.raises(ValueError, match="BatchNorm2d: got an empty input"):
        bn(Tensor(data=np.ones((0, 2, 3, 3), np.float32)))


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def test_checkpoint_paths_that_are_not_files_are_named(tmp_path):
    states = {"a": np.ones(2, np.float32)}
    with pytest.raises(TypeError, match="save_states: the checkpoint path must be a str or "
                                        "os.PathLike, got NoneType None"):
        checkpoint.save_states(None, states)
    with pytest.raises(TypeError, match="load_states: the checkpoint path .* NoneType"):
        checkpoint.read_states(None)
    for call in (lambda: checkpoint.save_states(tmp_path, states, overwrite=True),
                 lambda: checkpoint.read_states(tmp_path)):
        with pytest.raises(IsADirectoryError, match=rf"{re_escape(repr(str(tmp_path)))} is a "
                                                    rf"directory, not a checkpoint file"):
            call()
    net = TinyNet()
    net.compile([Tensor(data=np.ones((2, 5), np.float32))], is_train=False, use_graph=False)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        net.save_states(str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("member,payload,message", [
    ("tensor_dict.npz", b"garbage!!", r"member tensor_dict.npz is not a NumPy .npz archive "
                                      r"\(9 bytes starting b'garbage!'\)"),
    ("tensor_dict.npz", b"PK\x03\x04garbage", r"member tensor_dict.npz is damaged"),
    ("states_attr.json", b"{not json", r"member states_attr.json is not valid UTF-8 JSON"),
])
def test_garbage_member_is_named(tmp_path, member, payload, message):
    path = tmp_path / "ckpt.zip"
    checkpoint.save_states(path, {"a": np.ones(2, np.float32)})
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members[member] = payload
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(ValueError, match=rf"{re_escape(repr(str(path)))} is not a valid SINGA "
                                         rf"checkpoint: {message}"):
        checkpoint.read_states(path)


KILLED_SAVE = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from singa_jax._src.model import checkpoint
    def stall(src, dst):  # the archive is written; die before moving it into place
        print("written", flush=True)
        time.sleep(60)
    os.replace = stall
    checkpoint.save_states(sys.argv[1], {"w": np.ones((256, 256), np.float32)}, overwrite=True)
""")


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL and pid probing are POSIX")
def test_save_killed_midway_leaves_no_temp_file_after_the_next_save(tmp_path):
    target = tmp_path / "model.zip"
    checkpoint.save_states(target, {"w": np.zeros(3, np.float32)})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(target)],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stray = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(stray) == 1 and stray[0].startswith(".model.zip.")  # what a kill leaves
    np.testing.assert_array_equal(checkpoint.read_states(target)[0]["w"], np.zeros(3))
    checkpoint.save_states(tmp_path / "other.zip", {"w": np.ones(3, np.float32)})
    assert sorted(os.listdir(tmp_path)) == ["model.zip", "other.zip"]


def test_nonfinite_guard_of_many_parameters_runs_its_test_apart_and_decides_the_same():
    """An eager update of more than update.SEPARATE_TEST_FROM parameters tests the gradients in
    a kernel of its own (XLA:CPU compiles one program doing both superlinearly slowly): the
    same update for finite gradients, nothing changed and the step counted for a NaN."""
    from singa_jax._src.optim import update
    n = update.SEPARATE_TEST_FROM + 4
    rng = np.random.default_rng(0)
    init = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(n)]
    grads = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(n)]
    params = [Tensor(data=a.copy(), stores_grad=True, name=f"p{i}") for i, a in enumerate(init)]
    o = opt.SGD(lr=0.1, momentum=0.9)
    o._apply_all([(p, Tensor(data=g, requires_grad=False)) for p, g in zip(params, grads)])
    for p, a, g in zip(params, init, grads):  # first step: v = g, p -= lr * v
        np.testing.assert_allclose(arr(p), a - 0.1 * g, rtol=1e-6)
    after_one = [arr(p).copy() for p in params]
    slots = {k: arr(v).copy() for k, v in o.get_states().items()}
    bad = [g.copy() for g in grads]
    bad[n - 1][1, 1] = np.inf
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        o._apply_all([(p, Tensor(data=g, requires_grad=False)) for p, g in zip(params, bad)])
    for p, a in zip(params, after_one):
        np.testing.assert_array_equal(arr(p), a)
    for k, v in o.get_states().items():
        np.testing.assert_array_equal(arr(v), slots[k], err_msg=k)
    assert arr(o.skipped_steps).tolist() == [1]
