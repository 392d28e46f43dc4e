"""What a training step's state costs per array: the runtime's part.

An eager step's replayed program takes every parameter, optimizer slot and batch-norm
statistic as an input of its own and returns each new one as an output of its own (Tensors are
handles over immutable arrays), and the last step's arrays are freed when the step that
replaced them ends. This times that part alone, with no singa_jax code: one ``jax.jit`` call
over ``--arrays`` arrays in and out (each step's outputs the next step's inputs, the old ones
freed), against the same values packed into ``--groups`` flat buffers that the program takes
and returns whole -- the design docs/performance.md names for the CPU's eager step ("Eager on
the CPU: what is left is per array"). Each step waits for its results before the old arrays
are freed; call and free are timed apart, medians of ``--steps``, the two variants taking turns
``--rounds`` times.

    .venv/bin/python benchmarks/bench_state_arrays.py [--arrays 1000] [--groups 10]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List, Tuple

import jax
import jax.numpy as jnp

SHAPE = (8, 8, 3, 3)  # one parameter of the dispatch-bound network's convolutions


def _update(x: jax.Array) -> jax.Array:
    return x * 0.9 + 0.1  # an elementwise update, as an optimizer's


def _time(program: Callable, state: List[jax.Array], steps: int) -> Tuple[float, float]:
    """(call, free) medians in ms over ``steps`` steps of ``state = program(*state)``."""
    state = program(*state)
    jax.block_until_ready(state)
    calls, frees = [], []
    for _ in range(steps):
        start = time.perf_counter()
        new = program(*state)
        calls.append(time.perf_counter() - start)
        jax.block_until_ready(new)
        start = time.perf_counter()
        del state  # the last references to the old arrays
        frees.append(time.perf_counter() - start)
        state = new
    return statistics.median(calls) * 1e3, statistics.median(frees) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.arrays % args.groups:
        parser.error("--arrays must be a multiple of --groups")
    size = 1
    for d in SHAPE:
        size *= d
    per_group = args.arrays // args.groups

    each = jax.jit(lambda *arrays: [_update(a) for a in arrays])
    packed = jax.jit(lambda *buffers: [_update(b.reshape(per_group, *SHAPE)).reshape(b.shape)
                                       for b in buffers])
    print(f"jax {jax.__version__}; {jax.devices()[0].platform}; {args.arrays} arrays of "
          f"{SHAPE} or {args.groups} buffers of {per_group}")
    for r in range(args.rounds):
        per = _time(each, [jnp.full(SHAPE, float(i)) for i in range(args.arrays)], args.steps)
        whole = _time(packed, [jnp.zeros((per_group * size,)) for _ in range(args.groups)],
                      args.steps)
        print(f"round {r + 1}: an array each: call {per[0]:.3f} ms + free {per[1]:.3f} ms = "
              f"{sum(per):.3f}; packed: call {whole[0]:.3f} + free {whole[1]:.3f} = "
              f"{sum(whole):.3f} ms")


if __name__ == "__main__":
    main()
