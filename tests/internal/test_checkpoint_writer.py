"""CheckpointManager's writer thread when the write fails midway (the disk fills up): the error
reaches the training thread at the next wait/save, the earlier checkpoints are intact and no
temporary file is left."""
from __future__ import annotations

import os

import numpy as np
import pytest

from singa_jax import device, layer, model, opt, tensor
from singa_jax.checkpoint import CheckpointManager


class _Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(x)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_a_failed_background_write_is_raised_and_leaves_the_earlier_checkpoints(tmp_path,
                                                                             monkeypatch):
    dev = device.get_default_device()
    net = _Net()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    x = tensor.from_numpy(np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32))
    y = tensor.from_numpy(np.array([0, 1, 2, 0], np.int32))
    x.to_device(dev)
    y.to_device(dev)
    net.compile([x], is_train=True, use_graph=False)
    net(x, y)
    ckpt = CheckpointManager(tmp_path)
    ckpt.save(1, net)
    ckpt.wait()
    good = open(ckpt.path(1), "rb").read()
    net(x, y)
    written = []
    real_write_array = np.lib.format.write_array

    def disk_full(fp, array, *a, **k):
        written.append(array.shape)
        if len(written) == 3:  # two arrays are in the file already
            raise OSError(28, "No space left on device")
        return real_write_array(fp, array, *a, **k)

    monkeypatch.setattr(np.lib.format, "write_array", disk_full)
    ckpt.save(2, net)
    with pytest.raises(RuntimeError, match="No space left on device"):
        ckpt.wait()
    monkeypatch.undo()
    assert len(written) == 3
    assert ckpt.steps() == [1] and open(ckpt.path(1), "rb").read() == good
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1.zip"]  # no temporary file left
    assert ckpt.restore(net).step == 1
