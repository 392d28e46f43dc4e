"""Eager-mode cost of one optimizer step: one fused kernel vs one kernel per parameter.

    .venv/bin/python benchmarks/bench_opt.py [--params 50] [--size 64] [--steps 50]

For each optimizer it times ``Optimizer._apply_all`` (what ``opt(loss)`` does after backward:
one jitted update over all parameters) against calling ``opt.update(p, g)`` per parameter,
both followed by ``opt.step()``. Gradients are fixed arrays, so only the update is measured.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, List, Tuple

import jax
import numpy as np

from singa_jax import opt
from singa_jax.tensor import Tensor


def make(n: int, size: int) -> List[Tuple[Tensor, Tensor]]:
    rng = np.random.default_rng(0)
    return [(Tensor(data=rng.standard_normal((size, size)).astype(np.float32), stores_grad=True,
                    name=f"p{i}"),
             Tensor(data=rng.standard_normal((size, size)).astype(np.float32)))
            for i in range(n)]


def timed(fn: Callable[[], None], pairs, steps: int) -> float:
    """Median wall time of one step in ms (median: the machine may be shared)."""
    for _ in range(3):  # compile and warm up
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        jax.block_until_ready([p.data for p, _ in pairs])
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=50)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    makers = {"SGD(momentum=0.9)": lambda: opt.SGD(lr=0.01, momentum=0.9),
              "RMSProp": lambda: opt.RMSProp(lr=0.01), "AdaGrad": lambda: opt.AdaGrad(lr=0.01),
              "Adam": lambda: opt.Adam(lr=0.01)}
    print(f"{a.params} params of {a.size}x{a.size} on {jax.devices()[0]}; ms per step")
    print(f"{'optimizer':20s} {'fused':>8s} {'per-param':>10s} {'speed-up':>9s}")
    for name, build in makers.items():
        fused_pairs, single_pairs = make(a.params, a.size), make(a.params, a.size)
        fused_opt, single_opt = build(), build()

        def fused() -> None:
            fused_opt._apply_all(fused_pairs)
            fused_opt.step()

        def per_param() -> None:
            for p, g in single_pairs:
                single_opt.update(p, g)
            single_opt.step()

        t_fused = timed(fused, fused_pairs, a.steps)
        t_single = timed(per_param, single_pairs, a.steps)
        print(f"{name:20s} {t_fused:8.3f} {t_single:10.3f} {t_single / t_fused:8.1f}x")


if __name__ == "__main__":
    main()
