"""What the observation tools cost a training step: off, and each one on.

The network is ``bench_eager.py``'s dispatch-bound one (``--depth`` blocks of Conv2d 8->8 3x3,
BatchNorm2d and ReLU on one 8x8x8 image, then Linear(10), SGD with momentum): its step is the
host's work per operator, where a per-operator check would show first. Variants take turns in
rounds, each round timing ``--steps`` steps of each (every timed step waits for all of its
results: loss, parameters, buffers, optimizer slots); the medians of the rounds are printed
with the load average.

* ``off``: nothing attached (the engine reads one flag per operator and Layer call);
* ``watched``: an observer attached that does nothing: every operator goes through the
  observed path (the upper bound of what an attached tool adds before doing its own work);
* ``explain``: ``debug.explain_compiles()`` on (nothing compiles in a warm step);
* ``trace``: inside ``debug.trace(folder)`` (a ``jax.profiler`` session records the steps);
* ``anomaly``: inside ``autograd.detect_anomaly()`` (every operator's outputs checked).

"off" against the code without the observation hooks is a comparison of two checkouts: run this
script's ``off`` variant from each, in turns (the benchmarks page quotes one such run)::

    python benchmarks/bench_observability.py [--depth 100] [--steps 20] [--rounds 5]
        [--graph] [--variants off,watched,explain,trace,anomaly]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List

import jax
import numpy as np

from singa_jax import autograd, debug, device, layer, model, opt, tensor
from singa_jax._src.base import observe


class Deep(model.Model):
    def __init__(self, depth: int):
        super().__init__()
        self.blocks = []
        for i in range(depth):
            blocks = (layer.Conv2d(8, 3, padding=1), layer.BatchNorm2d(), layer.ReLU())
            for name, lay in zip(("conv", "bn", "relu"), blocks):
                setattr(self, f"{name}{i}", lay)
            self.blocks.append(blocks)
        self.flat, self.fc = layer.Flatten(), layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        for conv, bn, relu in self.blocks:
            x = relu(bn(conv(x)))
        return self.fc(self.flat(x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _wait(m: Deep, loss: Any) -> None:
    jax.block_until_ready([t.array for t in m.get_states().values()] +
                          [t.array for t in m.optimizer.get_states().values()] + [loss.array])


@contextlib.contextmanager
def _variant(name: str, folder: str) -> Iterator[None]:
    if name == "off":
        yield
    elif name == "watched":
        with observe.attached(observe.Observer()):
            yield
    elif name == "explain":
        with debug.explain_compiles():
            yield
    elif name == "trace":
        with debug.trace(folder):
            yield
    elif name == "anomaly":
        with autograd.detect_anomaly():
            yield
    else:
        raise SystemExit(f"unknown variant {name!r}")


def _time(m: Deep, x: Any, y: Any, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _, loss = m(x, y)
        _wait(m, loss)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--graph", action="store_true", help="the model in graph mode")
    parser.add_argument("--variants", default="off,watched,explain,trace,anomaly")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")

    device.get_default_device().SetRandSeed(0)
    m = Deep(args.depth)
    m.set_optimizer(opt.SGD(lr=0.01, momentum=0.9))
    rng = np.random.default_rng(0)
    x = tensor.from_numpy(rng.normal(size=(1, 8, 8, 8)).astype(np.float32))
    y = tensor.from_numpy(np.array([3], np.int32))
    m.compile([x], is_train=True, use_graph=args.graph)
    results: Dict[str, List[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as folder:
        for v in variants:  # warm: each variant's programs compiled before timing
            with _variant(v, os.path.join(folder, f"warm-{v}")):
                _time(m, x, y, 8)
        for r in range(args.rounds):
            for v in variants:
                with _variant(v, os.path.join(folder, f"{v}-{r}")):
                    results[v].append(_time(m, x, y, args.steps))
    load = os.getloadavg()[0]
    mode = "graph" if args.graph else "eager"
    print(f"{args.depth}-block network, {mode} training step, {args.rounds} rounds of "
          f"{args.steps} steps, load average {load:.2f}, {jax.devices()[0].platform}")
    base = statistics.median(results[variants[0]])
    for v in variants:
        med = statistics.median(results[v])
        rounds = ", ".join(f"{t * 1e3:.2f}" for t in results[v])
        print(f"  {v:8s} {med * 1e3:8.2f} ms  ({med / base:5.2f}x {variants[0]})  rounds: "
              f"{rounds}")


if __name__ == "__main__":
    main(sys.argv[1:])
