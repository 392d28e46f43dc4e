"""Per-op eager overhead of singa_jax's autograd.

For a few small computations (64x64 inputs), time one forward + backward step through our
autograd (Operator graph, one jitted forward+vjp kernel and one jitted pullback per op, the
engine's walk) against a bare ``jax.jit(jax.value_and_grad(f))`` call computing the same value
and gradient. The two are run interleaved, ``--reps`` times each, and the medians compared:
``overhead`` is ours minus the bare call, the eager cost per step. With ``--rounds N`` the
whole measurement is repeated and each column is the median over the rounds (a shared machine
needs several).

``--python-only`` times singa_jax's own Python per step instead: every eager kernel is replaced
by a replay of its first result, so no kernel runs and no thread is woken. That number is
steady on a loaded machine (the best of several blocks), which the wall times are not.

    .venv/bin/python benchmarks/bench_ops.py [--reps 300] [--size 64] [--rounds 1]
    .venv/bin/python benchmarks/bench_ops.py --python-only
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


def _medians(ours: Callable[[], None], bare: Callable[[], None], reps: int) -> Tuple[float, float]:
    """Median seconds of ``ours`` and ``bare``, run interleaved (load changes hit both alike)."""
    t_ours, t_bare = [], []
    for _ in range(reps):
        t_ours.append(_time(ours))
        t_bare.append(_time(bare))
    return statistics.median(t_ours), statistics.median(t_bare)


def _replay_kernels() -> None:
    """Replace the eager kernels (forward+vjp, pullback, fill, a fused walk) by replays of
    their first result, keyed by what selects the compiled kernel (the pullback: by its
    identity)."""
    from singa_jax._src.autodiff import backward, fused, kernels

    def replay(kernel: Callable, key: Callable) -> Callable:
        results: Dict = {}

        def call(*args):
            k = key(*args)
            if k not in results:
                results[k] = kernel(*args)
            return results[k]
        return call

    # the kernel, not its caller: the caller's Python (residuals.join) is ours and is timed
    kernels.forward_vjp_kernel = replay(
        kernels.forward_vjp_kernel, lambda fn, static, diff, n, *xs: (
            fn, static, diff, n, tuple((x.shape, x.dtype) for x in xs)))
    kernels.pullback_kernel = replay(kernels.pullback_kernel, lambda vjp, cts: id(vjp))
    kernels.fill_like = backward.fill_like = replay(
        kernels.fill_like, lambda value, shape, dtype: (shape, dtype))
    fused._replay = replay(fused._replay, lambda plan_id, states, roots: plan_id)


def bench_python(n: int, blocks: int = 9, calls: int = 2000) -> None:
    """Best-of-``blocks`` Python time per step of each case, with the kernels replayed."""
    _replay_kernels()
    rng = np.random.default_rng(0)
    autograd.training = True
    print(f"{'case':40s} {'python us':>10s}   (best of {blocks} blocks of {calls} steps, "
          f"kernels replayed)")
    for name, (ours, _, count) in _cases(n).items():
        params = [Tensor(data=a, stores_grad=True) for a in _inputs(n, count, rng)]

        def step(ours=ours, params=params) -> None:
            loss = ours(*params)
            [g.data for _, g in autograd.backward(loss)]

        for _ in range(100):
            step()
        best = min(_time(lambda: [step() for _ in range(calls)]) for _ in range(blocks))
        print(f"{name:40s} {best / calls * 1e6:10.1f}")


def bench(reps: int, n: int, rounds: int = 1) -> None:
    rng = np.random.default_rng(0)
    autograd.training = True
    print(f"{'case':40s} {'autograd us':>12s} {'jit us':>10s} {'overhead us':>12s} {'ratio':>7s}"
          f"   (median of {reps}{f' x {rounds} rounds' if rounds > 1 else ''}, {n}x{n}, "
          f"{jax.devices()[0].platform})")
    runs = {}
    for name, (ours, bare, count) in _cases(n).items():
        arrays = _inputs(n, count, rng)
        params = [Tensor(data=a, stores_grad=True) for a in arrays]
        device_arrays = [jnp.asarray(a) for a in arrays]
        compiled = jax.jit(jax.value_and_grad(bare, argnums=tuple(range(count))))

        def run_ours(ours=ours, params=params) -> None:
            loss = ours(*params)
            grads = [g.data for _, g in autograd.backward(loss)]
            jax.block_until_ready((loss.data, grads))

        def run_bare(compiled=compiled, device_arrays=device_arrays) -> None:
            jax.block_until_ready(compiled(*device_arrays))

        for _ in range(10):  # warm up: compile both
            run_ours()
            run_bare()
        runs[name] = (run_ours, run_bare)
    results: Dict[str, List[Tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (run_ours, run_bare) in runs.items():
            results[name].append(_medians(run_ours, run_bare, reps))
    for name, times in results.items():
        m_ours = statistics.median(t for t, _ in times) * 1e6
        m_bare = statistics.median(t for _, t in times) * 1e6
        over = statistics.median(o - b for o, b in times) * 1e6
        print(f"{name:40s} {m_ours:12.1f} {m_bare:10.1f} {over:12.1f} {m_ours / m_bare:7.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--python-only", action="store_true",
                        help="time singa_jax's Python per step, every kernel replayed")
    args = parser.parse_args()
    if args.python_only:
        bench_python(args.size)
    else:
        bench(args.reps, args.size, args.rounds)
