"""A training run that survives being killed: checkpoints in the background, resumes bit for bit.

    python examples/long_run/train_resume.py                 # trains; checkpoints every 20 steps
    python examples/long_run/train_resume.py --kill-at 70    # ... and dies (SIGKILL) at step 70
    python examples/long_run/train_resume.py                 # resumes from step 60, ends at 200

Run it, kill it at any moment (``--kill-at`` does it for you, or ``kill -9``), run it again: it
continues from its newest checkpoint and ends with the same parameters, bit for bit, as a run
that was never interrupted (``--out`` writes them to compare). What makes that hold:

* :class:`singa_jax.checkpoint.CheckpointManager` saves the model's and optimizer's states,
  every Device's random key (the dropout masks), the ``DeviceLoader``'s position (it resumes
  mid-epoch with the same remaining batches and augmentation keys) and the global random
  generators, on a background thread, keeping the newest three;
* :class:`singa_jax.autograd.reproducible` makes every step compute the same bits whatever ran
  before it in the process.

The data: scikit-learn's bundled 8x8 digits (no download); the model: a small CNN with dropout,
SGD with momentum and an exponentially decaying learning rate; eager mode by default,
``--graph`` for graph mode.
"""
import argparse
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common.digits import load_digits_images  # noqa: E402
from singa_jax import autograd, data, device, layer, model, opt, tensor  # noqa: E402
from singa_jax.checkpoint import CheckpointManager  # noqa: E402


class SmallCNN(model.Model):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = layer.Conv2d(16, 3, padding=1, activation="RELU")
        self.pool = layer.MaxPool2d(2, 2)
        self.flatten = layer.Flatten()
        self.drop = layer.Dropout(0.3)
        self.hidden = layer.Linear(64)
        self.relu = layer.ReLU()
        self.out = layer.Linear(num_classes)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        h = self.drop(self.flatten(self.pool(self.conv(x))))
        return self.out(self.relu(self.hidden(h)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def train(args: argparse.Namespace) -> None:
    train_x, train_y, test_x, test_y = load_digits_images(size=8)
    dev = device.get_default_device()
    dev.SetRandSeed(args.seed)
    np.random.seed(args.seed)
    loader = data.DeviceLoader(train_x, train_y, args.batch_size, shuffle=True, seed=args.seed,
                               transform=data.random_shift(1))
    net = SmallCNN()
    net.set_optimizer(opt.SGD(lr=opt.ExponentialDecay(0.05, 100, 0.5), momentum=0.9))
    tx = tensor.Tensor((args.batch_size, 1, 8, 8), dev)
    ty = tensor.Tensor((args.batch_size,), dev, tensor.int32)
    net.compile([tx], is_train=True, use_graph=args.graph)

    ckpt = CheckpointManager(args.folder, max_to_keep=3)
    run = ckpt.restore(net, loader=loader)
    step, epoch = (run.step, run.epoch) if run else (0, 0)
    print(f"resumed from {run.path} at step {step} (epoch {epoch}, batch {run.batch})"
          if run else "starting a new run", flush=True)
    while step < args.steps:
        for x, y in loader.epoch(epoch):
            tx.array, ty.array = x, y
            _, loss = net(tx, ty)
            step += 1
            if step % args.save_every == 0:
                ckpt.save(step, net, loader=loader)
            if step == args.kill_at:
                print(f"killed at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # no clean-up: a crash
            if step % 50 == 0:
                print(f"step {step}: loss {tensor.to_numpy(loss).item():.4f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    ckpt.close()

    net.eval()
    correct = 0
    for i in range(0, len(test_x) - args.batch_size + 1, args.batch_size):
        tx.copy_from_numpy(test_x[i:i + args.batch_size])
        pred = tensor.to_numpy(net(tx)).argmax(axis=1)
        correct += int((pred == test_y[i:i + args.batch_size]).sum())
    tested = (len(test_x) // args.batch_size) * args.batch_size
    print(f"done at step {step}: test accuracy {correct / tested:.3f}", flush=True)
    if args.out:
        states = {f"model/{k}": tensor.to_numpy(v) for k, v in net.get_states().items()}
        states.update({f"opt/{k}": tensor.to_numpy(v)
                       for k, v in net.optimizer.get_states().items()})
        np.savez(args.out, **states)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--folder", default="checkpoints/long_run", help="checkpoint folder")
    p.add_argument("--steps", type=int, default=200, help="train this many steps in all")
    p.add_argument("--save-every", type=int, default=20, help="checkpoint every N steps")
    p.add_argument("--kill-at", type=int, default=-1, help="SIGKILL this process after step N")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graph", action="store_true", help="graph mode (default: eager)")
    p.add_argument("--out", default="", help="write the final states to this .npz")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    with autograd.reproducible():  # the same bits whatever ran before a step (see the docstring)
        train(args)


if __name__ == "__main__":
    main()
