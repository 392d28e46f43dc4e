"""Per-op eager overhead of singa_jax's autograd.

For a few small computations (64x64 inputs), time one forward + backward step through our
autograd (Operator graph, one jitted forward+vjp kernel and one jitted pullback per op, the
engine's walk) against a bare ``jax.jit(jax.value_and_grad(f))`` call computing the same value
and gradient. The two are run interleaved, ``--reps`` times each, and the medians compared.

    .venv/bin/python benchmarks/bench_ops.py [--reps 300] [--size 64]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax import autograd
from singa_jax.tensor import Tensor


def _cases(n: int) -> Dict[str, Tuple[Callable, Callable, int]]:
    """name -> (our loss from Tensors, the same loss on jax arrays, number of inputs)."""
    return {
        "relu+sum": (lambda x: autograd.reduce_sum(autograd.relu(x)),
                     lambda x: jnp.sum(jax.nn.relu(x)), 1),
        "matmul+sum": (lambda x, w: autograd.reduce_sum(autograd.matmul(x, w)),
                       lambda x, w: jnp.sum(x @ w), 2),
        "mlp layer (matmul+add_bias+tanh+mean)": (
            lambda x, w, b: autograd.reduce_mean(autograd.tanh(
                autograd.add_bias(autograd.matmul(x, w), b))),
            lambda x, w, b: jnp.mean(jnp.tanh(x @ w + b)), 3),
    }


def _inputs(n: int, count: int, rng: np.random.Generator) -> List[np.ndarray]:
    shapes = [(n, n), (n, n), (n,)][:count]
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


def _time(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(reps: int, n: int) -> None:
    rng = np.random.default_rng(0)
    autograd.training = True
    print(f"{'case':40s} {'autograd us':>12s} {'jit us':>10s} {'ratio':>7s}   "
          f"(median of {reps}, {n}x{n}, {jax.devices()[0].platform})")
    for name, (ours, bare, count) in _cases(n).items():
        arrays = _inputs(n, count, rng)
        params = [Tensor(data=a, stores_grad=True) for a in arrays]
        device_arrays = [jnp.asarray(a) for a in arrays]
        compiled = jax.jit(jax.value_and_grad(bare, argnums=tuple(range(count))))

        def run_ours() -> None:
            loss = ours(*params)
            grads = [g.data for _, g in autograd.backward(loss)]
            jax.block_until_ready((loss.data, grads))

        def run_bare() -> None:
            jax.block_until_ready(compiled(*device_arrays))

        for _ in range(10):  # warm up: compile both
            run_ours()
            run_bare()
        t_ours, t_bare = [], []
        for _ in range(reps):  # interleaved, so load changes hit both alike
            t_ours.append(_time(run_ours))
            t_bare.append(_time(run_bare))
        m_ours, m_bare = statistics.median(t_ours) * 1e6, statistics.median(t_bare) * 1e6
        print(f"{name:40s} {m_ours:12.1f} {m_bare:10.1f} {m_ours / m_bare:7.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    bench(args.reps, args.size)
