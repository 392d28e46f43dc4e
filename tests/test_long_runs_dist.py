"""A two-process ``DistOpt`` run (graph mode, ZeRO-sharded optimizer slots, dropout, a shuffling
``DeviceLoader`` per rank) checkpointed with ``CheckpointManager``: rank 1 is killed with SIGKILL,
the launcher stops the job, a new job resumes from the last checkpoint, and every rank ends with
parameters and slots bitwise equal to an uninterrupted job's (CPU, float32)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = textwrap.dedent('''
    import multiprocessing, os, signal, sys, time
    import numpy as np
    from singa_jax.singa_wrap import NcclIdHolder
    STEPS, SAVE_EVERY = 12, 3

    def child(rank, holder, folder, kill_at, out):
        from singa_jax import autograd, data, device, layer, model, opt, tensor
        from singa_jax.checkpoint import CheckpointManager

        class Net(model.Model):
            def __init__(self):
                super().__init__()
                self.fc1, self.relu = layer.Linear(16), layer.ReLU()
                self.drop, self.fc2 = layer.Dropout(0.3), layer.Linear(4)
                self.loss = layer.SoftMaxCrossEntropy()
            def forward(self, x):
                return self.fc2(self.drop(self.relu(self.fc1(x))))
            def train_one_batch(self, x, y):
                out = self.forward(x)
                loss = self.loss(out, y)
                self.optimizer(loss)
                return out, loss

        with autograd.reproducible():
            dist = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9), nccl_id=holder, local_rank=rank,
                               world_size=2, shard_optimizer_state=True)
            dev = device.get_default_device()
            dev.SetRandSeed(0)
            r = np.random.RandomState(1)
            x, y = r.randn(64, 6).astype(np.float32), r.randint(0, 4, 64).astype(np.int32)
            loader = data.DeviceLoader(x[rank::2], y[rank::2], 4, shuffle=True, seed=7)
            net = Net()
            net.set_optimizer(dist)
            tx = tensor.Tensor((4, 6), dev)
            ty = tensor.Tensor((4,), dev, tensor.int32)
            net.compile([tx], is_train=True, use_graph=True)
            ckpt = CheckpointManager(folder, max_to_keep=2)
            run = ckpt.restore(net, loader=loader)
            step, epoch = (run.step, run.epoch) if run else (0, 0)
            print(f"rank {rank} starts at step {step}", flush=True)
            while step < STEPS:
                for xb, yb in loader.epoch(epoch):  # 8 batches an epoch
                    tx.array, ty.array = xb, yb
                    net(tx, ty)
                    step += 1
                    if step % SAVE_EVERY == 0:
                        ckpt.save(step, net, loader=loader)
                    if step == kill_at and rank == 1:
                        ckpt.wait()
                        os.kill(os.getpid(), signal.SIGKILL)
                    if step == STEPS:
                        break
                epoch += 1
            ckpt.close()
            states = {"m/" + k: tensor.to_numpy(v) for k, v in net.get_states().items()}
            states.update({"o/" + k: tensor.to_numpy(v) for k, v in dist.get_states().items()})
            np.savez(out % rank, **states)

    if __name__ == "__main__":
        folder, kill_at, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        holder = NcclIdHolder()
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=child, args=(r, holder, folder, kill_at, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        # the launcher's part: when a rank dies, stop the job (it is restarted from the
        # checkpoint); an elastic launcher does the same
        deadline = time.time() + 240
        while any(p.is_alive() for p in procs) and time.time() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    if p.is_alive():
                        p.kill()
                break
            time.sleep(0.1)
        for p in procs:
            p.join(10)
        sys.exit(max(abs(p.exitcode or 0) for p in procs))
''')


def _job(tmp_path, folder, kill_at, out):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, JAX_PLATFORMS="cpu", SINGA_JAX_DIST_TIMEOUT="20", PYTHONPATH=path,
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run([sys.executable, str(script), str(folder), str(kill_at), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_killed_distopt_job_resumes_bit_for_bit(tmp_path):
    whole = _job(tmp_path, tmp_path / "whole", -1, tmp_path / "whole%d.npz")
    assert whole.returncode == 0, whole.stderr[-4000:]
    killed = _job(tmp_path, tmp_path / "job", 7, tmp_path / "unused%d.npz")
    assert killed.returncode == 9, (killed.returncode, killed.stderr[-4000:])  # SIGKILL
    assert sorted(os.listdir(tmp_path / "job")) == ["ckpt-3.rank0.zip", "ckpt-3.rank1.zip",
                                                    "ckpt-6.rank0.zip", "ckpt-6.rank1.zip"]
    resumed = _job(tmp_path, tmp_path / "job", -1, tmp_path / "resumed%d.npz")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "rank 0 starts at step 6" in resumed.stdout and "rank 1 starts at step 6" in \
        resumed.stdout, resumed.stdout
    for rank in range(2):
        a, b = np.load(tmp_path / f"whole{rank}.npz"), np.load(tmp_path / f"resumed{rank}.npz")
        assert sorted(a.files) == sorted(b.files) and len(a.files) >= 9
        assert any(k.startswith("o/moments") for k in a.files)
        for name in a.files:
            np.testing.assert_array_equal(b[name], a[name], err_msg=f"rank {rank} {name}")
