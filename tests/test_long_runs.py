"""Long runs: a run checkpointed with ``CheckpointManager`` and killed resumes bit for bit;
saves run in the background, keep N, never leave a damaged newest file; a ``DeviceLoader``
resumes mid-epoch with the same batches; the files stay SINGA's format.

Bitwise comparisons are exact on the CPU backend (float32), where XLA's programs are
deterministic; they rely on ``autograd.reproducible`` (the example turns it on)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from singa_jax import data, device, layer, model, opt, tensor
from singa_jax.checkpoint import CheckpointManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "long_run", "train_resume.py")


# --- killed and resumed: the example, in processes of its own ----------------------------------
def _run(folder, *args, expect_kill=False):
    cmd = [sys.executable, EXAMPLE, "--folder", str(folder), "--steps", "50", "--save-every", "4",
           "--batch-size", "32", *map(str, args)]
    # XLA's usual optimisations (the suite compiles without them): with them an eager sequence
    # run op by op and the same sequence compiled as one program differ in the last bits, the
    # difference autograd.reproducible removes
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if expect_kill:
        assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    else:
        assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    return proc.stdout


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_killed_run_resumes_bit_for_bit(tmp_path, mode):
    """SIGKILL at a random step (two seeds; 44 batches an epoch, so a kill may land in either
    of two epochs), then a restart: parameters and optimizer slots equal the uninterrupted
    run's."""
    flags = ["--graph"] if mode == "graph" else []
    _run(tmp_path / "whole", "--out", tmp_path / "whole.npz", *flags)
    whole = np.load(tmp_path / "whole.npz")
    for seed in (0, 5):  # kills at steps 29 and 44 (the last batch of epoch 0)
        kill_at = random.Random(seed).randint(5, 49)
        folder = tmp_path / f"killed{seed}"
        out = _run(folder, "--kill-at", kill_at, *flags, expect_kill=True)
        assert f"killed at step {kill_at}" in out
        out = _run(folder, "--out", tmp_path / f"resumed{seed}.npz", *flags)
        saved = (kill_at // 4) * 4
        # the newest checkpoint at the kill, or the one before it if its write was cut short
        assert f"at step {saved} " in out or f"at step {saved - 4} " in out, out
        resumed = np.load(tmp_path / f"resumed{seed}.npz")
        assert sorted(resumed.files) == sorted(whole.files) and len(whole.files) >= 10
        for name in whole.files:
            np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


# --- in one process ----------------------------------------------------------------------------
class _Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop = layer.Linear(16), layer.Dropout(0.5)
        self.relu, self.fc2 = layer.ReLU(), layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc2(self.drop(self.relu(self.fc1(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _data():
    r = np.random.default_rng(0)
    return r.normal(size=(60, 5)).astype(np.float32), r.integers(0, 3, 60).astype(np.int32)


def _setup(graph=False, width=5):
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    x, y = _data()
    loader = data.DeviceLoader(x, y, 8, shuffle=True, seed=1)
    net = _Net()
    net.set_optimizer(opt.SGD(lr=opt.ExponentialDecay(0.1, 5, 0.5), momentum=0.9))
    tx = tensor.Tensor((8, width), dev)
    ty = tensor.Tensor((8,), dev, tensor.int32)
    net.compile([tx], is_train=True, use_graph=graph)
    return net, loader, tx, ty


def _train(net, batches, tx, ty, steps):
    """``steps`` training steps on the next batches of the iterator ``batches``; the losses."""
    losses = []
    for _ in range(steps):
        tx.array, ty.array = next(batches)
        losses.append(tensor.to_numpy(net(tx, ty)[1]).item())
    return losses


def _states(net):
    s = {"m/" + k: tensor.to_numpy(v) for k, v in net.get_states().items()}
    s.update({"o/" + k: tensor.to_numpy(v) for k, v in net.optimizer.get_states().items()})
    return s


def test_save_and_restore_put_back_the_whole_run(tmp_path):
    """Everything a run needs comes back: model and optimizer states, the device's key (the
    dropout masks after the restore), the loader's position, NumPy's and Python's generators
    and the caller's extras; the next steps then equal those of the run that went on."""
    net, loader, tx, ty = _setup()
    batches = loader.epoch(0)
    _train(net, batches, tx, ty, 3)
    ckpt = CheckpointManager(tmp_path)
    np.random.seed(5)
    random.seed(5)
    ckpt.save(3, net, loader=loader, extra={"best": 0.5})
    ckpt.wait()
    expected_draws = (np.random.rand(3), random.random())
    went_on = _train(net, batches, tx, ty, 4)
    went_on_states = _states(net)

    device.get_default_device().SetRandSeed(99)  # disturb everything a restore puts back
    _train(net, loader.epoch(1), tx, ty, 2)
    np.random.seed(0)
    random.seed(0)
    run = ckpt.restore(net, loader=loader)
    assert (run.step, run.epoch, run.batch) == (3, 0, 3)
    assert float(run.extra["best"]) == 0.5 and run.path == ckpt.path(3)
    np.testing.assert_array_equal(np.random.rand(3), expected_draws[0])
    assert random.random() == expected_draws[1]
    again = _train(net, iter(loader), tx, ty, 4)
    np.testing.assert_array_equal(again, went_on)
    for k, v in _states(net).items():
        np.testing.assert_array_equal(v, went_on_states[k], err_msg=k)


def test_a_checkpoint_is_singa_format_and_model_load_states_reads_it(tmp_path):
    net, loader, tx, ty = _setup()
    batches = loader.epoch(0)
    _train(net, batches, tx, ty, 2)
    path = CheckpointManager(tmp_path, background=False).save(2, net, loader=loader)
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == ["states_attr.json", "tensor_dict.npz"]
    before = _states(net)
    _train(net, batches, tx, ty, 1)
    aux = net.load_states(path)  # SINGA's call: model states back, the rest as aux states
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), before["m/" + k])
    assert int(tensor.to_numpy(aux["run/step"])) == 2
    assert "opt/step_counter" in aux and int(tensor.to_numpy(aux["loader/batch"])) == 2


def test_saves_keep_the_newest_and_a_later_save_waits_for_the_earlier(tmp_path):
    net, loader, tx, ty = _setup()
    ckpt = CheckpointManager(tmp_path, max_to_keep=2)
    batches = loader.epoch(0)
    for step in range(1, 6):
        _train(net, batches, tx, ty, 1)
        ckpt.save(step, net)
    ckpt.wait()
    assert ckpt.steps() == [4, 5] and ckpt.latest_step() == 5
    assert sorted(os.listdir(tmp_path)) == ["ckpt-4.zip", "ckpt-5.zip"]


def test_restore_checks_everything_before_changing_anything(tmp_path):
    net, loader, tx, ty = _setup()
    _train(net, loader.epoch(0), tx, ty, 1)
    CheckpointManager(tmp_path / "a", background=False).save(1, net, loader=loader)
    other, other_loader, otx, oty = _setup(width=7)  # another input width: other shapes
    before = _states(other)
    key = np.asarray(device.get_default_device().key)
    with pytest.raises(ValueError, match="does not match the model"):
        CheckpointManager(tmp_path / "a").restore(other, loader=other_loader)
    for k, v in _states(other).items():
        np.testing.assert_array_equal(v, before[k])
    np.testing.assert_array_equal(np.asarray(device.get_default_device().key), key)
    assert other_loader.get_state() == {"epoch": 0, "batch": 0}
    assert CheckpointManager(tmp_path / "empty").restore(net) is None
    with pytest.raises(TypeError, match="extra 'note' must be a Tensor, an array or a number"):
        CheckpointManager(tmp_path / "b").save(1, net, extra={"note": "text"})
    assert os.listdir(tmp_path / "b") == []


def test_graph_mode_restore_continues_as_the_run_that_went_on(tmp_path):
    net, loader, tx, ty = _setup(graph=True)
    batches = loader.epoch(0)
    _train(net, batches, tx, ty, 3)
    ckpt = CheckpointManager(tmp_path)
    ckpt.save(3, net, loader=loader)
    went_on = _train(net, batches, tx, ty, 3)
    states = _states(net)
    run = ckpt.restore(net, loader=loader)
    np.testing.assert_array_equal(_train(net, loader.epoch(run.epoch), tx, ty, 3), went_on)
    for k, v in _states(net).items():
        np.testing.assert_array_equal(v, states[k], err_msg=k)


# --- the loader's position ---------------------------------------------------------------------
def _all(batches):
    return [np.asarray(x) for x, _ in batches]


@pytest.mark.parametrize("transform", [None, "shift"])
def test_a_loader_resumes_mid_epoch_with_the_same_remaining_batches(transform):
    x = np.random.default_rng(0).normal(size=(40, 1, 4, 4)).astype(np.float32)
    y = np.arange(40, dtype=np.int32)
    kw = dict(shuffle=True, seed=3, transform=data.random_shift(1) if transform else None)
    whole = _all(data.DeviceLoader(x, y, 8, **kw).epoch(2))
    first = data.DeviceLoader(x, y, 8, **kw)
    batches = first.epoch(2)
    next(batches), next(batches)
    state = first.get_state()
    assert state == {"epoch": 2, "batch": 2}
    second = data.DeviceLoader(x, y, 8, **kw)
    second.set_state(state)
    rest = _all(iter(second))
    assert len(rest) == 3
    for a, b in zip(rest, whole[2:]):
        np.testing.assert_array_equal(a, b)
    assert second.get_state() == {"epoch": 3, "batch": 0}  # an epoch taken whole: the next one


def test_loader_positions_are_checked():
    x = np.zeros((16, 2), np.float32)
    loader = data.DeviceLoader(x, None, 4)
    with pytest.raises(ValueError, match="batch 5 is not a position"):
        loader.set_state({"epoch": 0, "batch": 5})
    with pytest.raises(ValueError, match="expected"):
        loader.set_state({"epoch": 0})
    with pytest.raises(ValueError, match="start must be"):
        loader.epoch(0, start=7)
    loader.set_state({"epoch": 1, "batch": 4})  # the end of epoch 1 is the start of epoch 2
    assert loader.get_state() == {"epoch": 2, "batch": 0}
    from_batches = data.DeviceLoader.from_batches([(x[i:i + 4], None) for i in range(0, 16, 4)],
                                                  labels=False)
    np.testing.assert_array_equal(np.asarray(next(from_batches.epoch(0, start=2))), x[8:12])


# --- reproducible steps ------------------------------------------------------------------------
class _Deep(model.Model):
    """Enough operators (12 blocks) that eager replay records its step."""

    def __init__(self):
        super().__init__()
        self.blocks = [layer.Linear(8) for _ in range(12)]
        for i, b in enumerate(self.blocks):
            setattr(self, f"fc{i}", b)
        self.relu, self.out = layer.ReLU(), layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        for b in self.blocks:
            x = self.relu(b(x))
        return self.out(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_reproducible_compiles_a_new_eager_step_at_its_first_occurrence():
    """By default a step sequence seen for the first time runs op by op and is compiled when it
    recurs; under ``autograd.reproducible`` it is compiled and run as one program at once, so
    that a resumed process's first step computes what a long-running process computes."""
    from singa_jax import autograd
    dev = device.get_default_device()
    net = _Deep()
    net.set_optimizer(opt.SGD(lr=0.01, momentum=0.9))
    r = np.random.default_rng(0)

    def step(rows):
        x = tensor.from_numpy(r.normal(size=(rows, 8)).astype(np.float32))
        y = tensor.from_numpy(r.integers(0, 3, rows).astype(np.int32))
        x.to_device(dev)
        y.to_device(dev)
        before = autograd.replay_stats()["compiled"]
        net(x, y)
        return autograd.replay_stats()["compiled"] - before

    net.compile([tensor.Tensor((4, 8), dev)], is_train=True, use_graph=False)
    step(4)
    step(4)  # the usual sequence is known and compiled
    assert step(5) == 0  # a new sequence (5 rows): op by op the first time
    with autograd.reproducible():
        assert step(6) > 0  # a new sequence (6 rows): compiled at once
