"""What a checkpoint costs the training loop: steps during a background save against plain steps.

The model is an MLP whose state passes 100 MB (``--width`` 2304: three 2304x2304 layers and
their SGD momentum slots, 64 MB of parameters and 64 MB of slots). Rounds alternate: ``--steps``
plain steps, then a ``CheckpointManager.save`` followed by steps until its file is written (the
first of them includes the ``save`` call itself: taking the values and starting the writer). Each
timed step waits for all of its results (loss, parameters, slots). Printed: the medians of
plain steps and of steps during a save, their ratio, the longest step during a save, how long a
save took to be written, and the same save made on the training thread (``background=False``)
for comparison; with the load average.

    python benchmarks/bench_checkpoint.py [--width 2304] [--batch 64] [--rounds 5] [--steps 8]
        [--eager] [--folder DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import List

import jax
import numpy as np

from singa_jax import device, layer, model, opt, tensor
from singa_jax.checkpoint import CheckpointManager


class WideMLP(model.Model):
    def __init__(self, width: int):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = layer.Linear(width), layer.Linear(width), layer.Linear(width)
        self.relu, self.out = layer.ReLU(), layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.out(self.relu(self.fc3(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _step(net: WideMLP, tx: tensor.Tensor, ty: tensor.Tensor) -> float:
    start = time.perf_counter()
    _, loss = net(tx, ty)
    jax.block_until_ready([loss.array] + [t.array for t in net.get_states().values()]
                          + [t.array for t in net.optimizer.get_states().values()])
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=2304)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--eager", action="store_true", help="eager mode (default: graph mode)")
    p.add_argument("--folder", default="", help="where to write (default: a temporary folder)")
    args = p.parse_args()

    dev = device.get_default_device()
    r = np.random.default_rng(0)
    tx = tensor.from_numpy(r.normal(size=(args.batch, args.width)).astype(np.float32))
    ty = tensor.from_numpy(r.integers(0, 10, args.batch).astype(np.int32))
    tx.to_device(dev)
    ty.to_device(dev)
    net = WideMLP(args.width)
    net.set_optimizer(opt.SGD(lr=0.001, momentum=0.9))
    net.compile([tx], is_train=True, use_graph=not args.eager)
    for _ in range(3):
        _step(net, tx, ty)
    state_mb = sum(t.array.nbytes for t in list(net.get_states().values())
                   + list(net.optimizer.get_states().values())) / 2 ** 20

    folder = args.folder or tempfile.mkdtemp(prefix="bench_checkpoint_")
    ckpt = CheckpointManager(folder, max_to_keep=2)
    plain: List[float] = []
    during: List[float] = []
    firsts: List[float] = []
    written: List[float] = []
    step = 0
    for _ in range(args.rounds):
        plain += [_step(net, tx, ty) for _ in range(args.steps)]
        start = time.perf_counter()
        save_started = start
        ckpt.save(step, net)
        first = True
        while True:
            t = _step(net, tx, ty)
            if first:  # the save call and the step after it
                t, first = time.perf_counter() - start, False
                firsts.append(t)
            during.append(t)
            writer = ckpt._writer
            if writer is None or not writer.is_alive():
                break
        ckpt.wait()
        written.append(time.perf_counter() - save_started)
        step += 1
    blocking = CheckpointManager(os.path.join(folder, "blocking"), max_to_keep=1,
                                 background=False)
    start = time.perf_counter()
    blocking.save(0, net)
    on_thread = time.perf_counter() - start
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    shutil.rmtree(folder, ignore_errors=True) if not args.folder else None

    med_plain, med_during = statistics.median(plain), statistics.median(during)
    mode = "eager" if args.eager else "graph"
    print(f"{mode} mode, {state_mb:.0f} MB of state, {args.rounds} saves, load average "
          f"{load:.2f}, {jax.default_backend()}")
    print(f"  plain step            {med_plain * 1e3:8.1f} ms  (median of {len(plain)})")
    print(f"  step during a save    {med_during * 1e3:8.1f} ms  ({med_during / med_plain:.2f}x; "
          f"median of {len(during)}, longest {max(during) * 1e3:.1f} ms)")
    print(f"  save call + its step  {statistics.median(firsts) * 1e3:8.1f} ms  (median)")
    print(f"  save written after    {statistics.median(written):8.2f} s   (median)")
    print(f"  save on the thread    {on_thread:8.2f} s   (background=False, one save)")


if __name__ == "__main__":
    main()
