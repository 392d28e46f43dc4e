"""Plain Tensor arithmetic's host cost: ``a + b``, ``a * 2.0``, ``a < b``, ``reshape`` ... on
small tensors.

Outside autograd a Tensor operator or layout method checks its operands, runs one cached kernel
and wraps the result in a new Tensor. Each case is timed against the bare ``jax.jit`` call of the
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

def _set_row(a: tensor.Tensor, _: object) -> None:
    a[2] = 1.0


# case -> (the Tensor call on (a, b), the same on their arrays with jnp, or None)
CASES = {"a + b": (operator.add, jnp.add),
         "a * 2.0": (lambda a, _: a * 2.0, lambda x, _: jnp.multiply(x, 2.0)),
         "2.0 - a": (lambda a, _: 2.0 - a, lambda x, _: jnp.subtract(2.0, x)),
         "a / b": (operator.truediv, jnp.true_divide),
         "a < b": (operator.lt, jnp.less),
         "a += b": (operator.iadd, None),
         "a ** 2": (lambda a, _: a ** 2, lambda x, _: jnp.power(x, 2)),
         "reshape": (lambda a, _: a.reshape((-1,)), lambda x, _: x.reshape((-1,))),
         "transpose": (lambda a, _: a.transpose(), lambda x, _: jnp.transpose(x)),
         "as_type": (lambda a, _: a.as_type(tensor.int32), lambda x, _: x.astype(jnp.int32)),
         "a[1:3]": (lambda a, _: a[1:3], lambda x, _: x[1:3]),
         "a[2] = 1.0": (_set_row, lambda x, _: x.at[2:3].set(1.0))}


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
    for name, (call, fn) in CASES.items():
        variants: Dict[str, Callable[[], object]] = {"Tensor": lambda: call(a, b)}
        if fn is not None:
            jitted = jax.jit(fn)
            variants["jit"] = lambda: jitted(x, y)
            variants["jnp"] = lambda: fn(x, y)
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
