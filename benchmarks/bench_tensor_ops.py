"""Plain Tensor arithmetic's host cost: ``a + b``, ``a * 2.0``, ``a < b`` ... on small tensors.

Outside autograd a Tensor operator checks its operands, broadcasts, runs one cached kernel and
wraps the result in a new Tensor. Each case is timed against the bare ``jax.jit`` call of the
same jnp function on the arrays and against JAX's eager jnp call, the three taking turns in
blocks; medians of ``--rounds`` blocks of ``--reps`` calls, in microseconds per call. Each call
only dispatches (on a CPU an (8, 8) kernel runs in a few microseconds on a worker thread).

    .venv/bin/python benchmarks/bench_tensor_ops.py [--size 8] [--reps 2000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import operator
import statistics
import time
from typing import Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax import tensor

# case -> (Tensor call on (a, b), jnp function, its second operand: "b" or a scalar)
CASES = {"a + b": (operator.add, jnp.add, "b"), "a * 2.0": (operator.mul, jnp.multiply, 2.0),
         "2.0 - a": (lambda a, _: 2.0 - a, None, None), "a / b": (operator.truediv,
                                                                 jnp.true_divide, "b"),
         "a < b": (operator.lt, jnp.less, "b"), "a += b": (operator.iadd, jnp.add, "b"),
         "a ** 2": (operator.pow, jnp.power, 2)}


def _per_call(fn: Callable[[], object], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a_np, b_np = (rng.uniform(1, 2, (args.size, args.size)).astype(np.float32) for _ in "ab")
    a, b = tensor.from_numpy(a_np), tensor.from_numpy(b_np)
    x, y = a.array, b.array
    print(f"jax {jax.__version__}; {jax.devices()[0].platform}; ({args.size}, {args.size}) "
          f"float32; us per call, medians of {args.rounds} blocks of {args.reps}")
    print(f"{'case':10s} {'Tensor':>8s} {'jit':>8s} {'jnp':>8s}")
    for name, (call, fn, other) in CASES.items():
        rhs = b if other == "b" else other
        variants: Dict[str, Callable[[], object]] = {"Tensor": lambda: call(a, rhs)}
        if fn is not None:
            arg = y if other == "b" else other
            jitted = jax.jit(fn)
            variants["jit"] = lambda: jitted(x, arg)
            variants["jnp"] = lambda: fn(x, arg)
        times: Dict[str, List[float]] = {k: [] for k in variants}
        for v in variants.values():  # compiled, cached
            v()
        for _ in range(args.rounds):
            for k, v in variants.items():
                times[k].append(_per_call(v, args.reps))
        cells = [f"{statistics.median(times[k]):8.1f}" if k in times else f"{'':8s}"
                 for k in ("Tensor", "jit", "jnp")]
        print(f"{name:10s} {' '.join(cells)}")
        a.array = jnp.asarray(a_np)  # (undo a += b)


if __name__ == "__main__":
    main()
