"""The graph-mode training step of ``examples/cnn/train_cnn.py resnet`` alone: SINGA's ResNet-50
(``examples/cnn/model/resnet.py``, 10 classes) at batch B and the given image side, the
example's SGD (lr 0.005, momentum 0.9, weight decay 1e-5), every step waiting for all of its
state. Its img/s is what the example's loop (``train_cnn.py resnet cifar10 -b B``, which resizes
32x32 images to 224 on the device) is compared with (docs/performance.md, "Input pipeline
and training loop"). Meant for an accelerator (a CPU takes seconds a step)::

    python benchmarks/bench_resnet_step.py [--batch 128] [--size 224] [--steps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import resnet_jax
from singa_jax import opt, tensor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    net = resnet_jax.singa_model(  # the example's SGD
        50, args.batch, args.size, optimizer=opt.SGD(lr=0.005, momentum=0.9, weight_decay=1e-5))
    rng = np.random.default_rng(0)
    shape = (args.batch, 3, args.size, args.size)
    tx = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
    ty = tensor.from_numpy(rng.integers(0, 10, args.batch).astype(np.int32))
    net.train()

    def step() -> None:
        out, loss = net(tx, ty, "plain", None)
        jax.block_until_ready([loss.array, out.array] +
                              [t.array for t in net.get_states().values()] +
                              [t.array for t in net.optimizer.get_states().values()])

    for _ in range(3):
        step()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"step alone: ResNet-50 batch {args.batch} {args.size}x{args.size} graph float32 on "
          f"{jax.devices()[0].device_kind}: median {med * 1e3:.2f} ms, "
          f"{args.batch / med:.0f} img/s")


if __name__ == "__main__":
    main()
