"""What a training step's state costs per array: the runtime's part.

An eager step's replayed program takes every parameter, optimizer slot and batch-norm
statistic as an input of its own and returns each new one as an output of its own (Tensors are
handles over immutable arrays), and the last step's arrays are freed when the step that
replaced them ends. This times that part alone, with no singa_jax code: one ``jax.jit`` call
over ``--arrays`` arrays in and out (each step's outputs the next step's inputs, the old ones
freed), against the same values packed into ``--groups`` flat buffers that the program takes
and returns whole -- a design for the CPU's eager step, whose remaining host cost is per
array. Each step waits for its results before the old arrays
are freed; call and free are timed apart, medians of ``--steps``, the two variants taking turns
``--rounds`` times.

``--rows`` asks what packing would cost the step's program itself: a chain of ``--arrays``
matmuls (as the network's convolutions) over parameters with a momentum slot each, every
parameter and slot updated and returned. Three programs, each compiled and timed (call + wait +
free of the old state, median of ``--steps``): parameters and slots an array each (today's
step); both packed, each row sliced out of its buffer for its matmul and its update and the
new rows concatenated (the packed-state design); only the slots packed (a slot's row is read
by its elementwise update alone).

``--in-step`` measures the same cost inside singa_jax's eager training step instead: the
dispatch-bound network of ``bench_eager.py`` (100 x [Conv2d, BatchNorm2d, ReLU], SGD with
momentum) with and without the convolutions' biases -- the same 303 operators, 200 state
arrays fewer (100 biases and their 100 momentum slots) -- taking turns in one process, blocks
of 8 steps, each step waiting for all of its results.

    .venv/bin/python benchmarks/bench_state_arrays.py [--arrays 1000] [--groups 10]
    .venv/bin/python benchmarks/bench_state_arrays.py --rows [--arrays 400]
    .venv/bin/python benchmarks/bench_state_arrays.py --in-step [--rounds 10]
"""
from __future__ import annotations

import argparse
import math
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
        old, state = state, program(*state)
        calls.append(time.perf_counter() - start)
        jax.block_until_ready(state)
        start = time.perf_counter()
        del old  # the last references to the old arrays
        frees.append(time.perf_counter() - start)
    return statistics.median(calls) * 1e3, statistics.median(frees) * 1e3


ROW = (8, 8)  # a parameter of the --rows chain


def _chain(x: jax.Array, params: List[jax.Array], slots: List[jax.Array]
           ) -> Tuple[jax.Array, List[jax.Array], List[jax.Array]]:
    """``x`` through a matmul and tanh per parameter; each parameter's slot and the parameter
    updated as SGD with momentum would (a "gradient" that depends on the chain)."""
    new_params, new_slots = [], []
    for p, m in zip(params, slots):
        x = jnp.tanh(x @ p)
        m = 0.9 * m + p * jnp.mean(x)
        new_params.append(p - 0.01 * m)
        new_slots.append(m)
    return x, new_params, new_slots


def _rows(flat: jax.Array, n: int) -> List[jax.Array]:
    size = math.prod(ROW)
    return [jax.lax.slice(flat, (i * size,), ((i + 1) * size,)).reshape(ROW) for i in range(n)]


def _packed(arrays: List[jax.Array]) -> jax.Array:
    return jnp.concatenate([a.reshape(-1) for a in arrays])


def _row_programs(n: int) -> dict:
    """name -> (program of (x, *state) returning (x, *state), its initial state)."""
    def each(x, *state):
        x, ps, ms = _chain(x, list(state[:n]), list(state[n:]))
        return (x, *ps, *ms)

    def all_packed(x, params, slots):
        x, ps, ms = _chain(x, _rows(params, n), _rows(slots, n))
        return x, _packed(ps), _packed(ms)

    def slots_packed(x, slots, *params):
        x, ps, ms = _chain(x, list(params), _rows(slots, n))
        return (x, _packed(ms), *ps)

    params = [jnp.full(ROW, 0.01 * (i % 7)) for i in range(n)]
    slots = [jnp.zeros(ROW) for _ in range(n)]
    return {"an array each": (each, params + slots),
            "params and slots packed": (all_packed, [_packed(params), _packed(slots)]),
            "slots packed": (slots_packed, [_packed(slots)] + params)}


def _rows_report(n: int, steps: int) -> None:
    x = jnp.ones((1, ROW[0]))
    for name, (fn, state) in _row_programs(n).items():
        program = jax.jit(fn)
        start = time.perf_counter()
        compiled = program.lower(x, *state).compile()
        compile_s = time.perf_counter() - start
        out = compiled(x, *state)
        jax.block_until_ready(out)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            old, out = out, compiled(*out)
            jax.block_until_ready(out)
            del old
            times.append(time.perf_counter() - start)
        print(f"{name:24s} {len(state):5d} state inputs: compile {compile_s:6.2f} s, step "
              f"{statistics.median(times) * 1e3:.3f} ms (call + wait + free)")


def _in_step(rounds: int) -> None:
    """The eager step's time with and without 200 of its state arrays (see the docstring)."""
    import numpy as np

    import bench_eager  # (beside this script: on sys.path when it runs)
    from singa_jax import tensor

    nets = {"with biases": bench_eager.build("deep", 1, 100, use_graph=False),
            "without": bench_eager.build("deep", 1, 100, use_graph=False, bias=False)}
    rng = np.random.default_rng(0)
    xs = [tensor.from_numpy(rng.standard_normal((1, 8, 8, 8)).astype(np.float32))
          for _ in range(4)]
    ys = [tensor.from_numpy(np.array([i], np.int32)) for i in range(4)]
    held = {}
    for name, net in nets.items():
        net.train()
        net(xs[0], ys[0])
        net(xs[1], ys[1])  # (the optimizer's slots exist from the first step)
        held[name] = bench_eager._state(net)

    def train(name: str, i: int) -> None:
        _, loss = nets[name](xs[i % 4], ys[i % 4])
        jax.block_until_ready([loss.array] + [t.array for t in held[name]])

    for i in range(12):  # compiled, fused and speculated from here on
        for name in nets:
            train(name, i)
    times = {name: [] for name in nets}
    for _ in range(rounds):
        for name in nets:
            for i in range(8):
                start = time.perf_counter()
                train(name, i)
                times[name].append(time.perf_counter() - start)
    with_b, without = (statistics.median(times[k]) * 1e3 for k in nets)
    fewer = len(held["with biases"]) - len(held["without"])
    print(f"eager step: {len(held['with biases'])} state arrays {with_b:.2f} ms, "
          f"{len(held['without'])} {without:.2f} ms: {(with_b - without) / fewer * 1e3:.1f} us "
          f"per state array (with its gradient's handling)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", action="store_true",
                        help="compile and time a step's program with its state packed in rows")
    parser.add_argument("--in-step", action="store_true",
                        help="time singa_jax's eager step with and without 200 state arrays")
    args = parser.parse_args()
    if args.in_step:
        _in_step(max(args.rounds, 10))
        return
    if args.rows:
        print(f"jax {jax.__version__}; {jax.devices()[0].platform}; {args.arrays} parameters "
              f"of {ROW}, a momentum slot each")
        _rows_report(args.arrays, args.steps)
        return
    if args.arrays % args.groups:
        parser.error("--arrays must be a multiple of --groups")
    size = math.prod(SHAPE)
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
