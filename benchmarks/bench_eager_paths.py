"""Eager mode's paths on and off, taking turns in one process: the recording path per operator
kind (``autodiff/recipes.py``, ``recipes.ENABLED``), the remembered backward walk
(``autodiff/fused.py``'s ``_Shape``: a walk whose graph signature was planned before skips the
symbolic walk), the walk recorded again from the step's graph log (``autodiff/graph_log.py``,
``fused._WalkAgain``: a recurring step's walk skips reading the graph) and the lean pullbacks
(``autodiff/residuals.py``: relu's and batch norm's hand-written pullbacks; off, the forward
kernel differentiates the plain functions), a one-operator layer's call recorded from its last
call's recipe (``layers/last_call.py``; off, every call passes the layer's forward) and the
speculated program started from replay's launching thread on a CPU
(``xla_options.LAUNCHES_IN_THREAD``; off, called by the recording thread).

``deep``: ``bench_eager.py``'s dispatch-bound network (100 x [Conv2d 8->8, BatchNorm2d, ReLU]
on one 8x8x8 image, SGD with momentum): the training step, its forward and its backward walk
(``Optimizer._gradients``), and the evaluation forward. ``mlp`` / ``cnn``: SINGA's MLP and
LeNet training steps of ``bench_train_step.py`` (batch 64). Each round runs every variant for
``--steps`` steps after 3 unmeasured ones; the medians and each round's ratio (on / off) are
printed, and the median of those ratios (on a host whose load drifts, steadier than the ratio
of the medians). Every timed step waits for all of its results.

    python benchmarks/bench_eager_paths.py [--nets deep,mlp,cnn] [--rounds 8] [--steps 10]
        [--only kinds|walk|again|lean|layers|thread]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Tuple

import jax
import numpy as np

import bench_eager
import bench_train_step
from singa_jax import tensor
from singa_jax._src.autodiff import recipes as kinds, residuals
from singa_jax._src.autodiff import fused
from singa_jax._src.autodiff import kernels
from singa_jax._src.optim import optimizers
from singa_jax._src.backend import xla_options
from singa_jax._src.backend.xla_options import kernel
from singa_jax._src.layers import last_call
from torch_child import step_times


@kernel(static_argnums=(0, 1, 2, 3))
def _plain_forward_vjp_kernel(fn, static, diff, n_state, *xs):
    """The eager forward kernel without lean forms (JAX differentiates ``fn`` itself)."""
    return residuals.vjp(lambda *args: kernels.split_state(fn(*args, **dict(static)),
                                                             n_state), diff, xs)


_LEAN_KERNEL = kernels.forward_vjp_kernel
_LAYER_CALLS = (last_call.LastCall.again, last_call.learn)
_IN_THREAD = xla_options.LAUNCHES_IN_THREAD.get("cpu", False)


def _no_again(self, layer, inputs):
    return None


def _no_learning(layer, inputs):
    return layer.forward(*inputs)


class _NoMemory(dict):
    """A walk memory that remembers nothing (every walk is walked symbolically)."""

    def get(self, key, default=None):
        return None

    def __len__(self) -> int:
        return 1 << 30


def _set(on: bool, only: str, remembered: Tuple[dict, dict]) -> None:
    """Each path on, or off where ``on`` is False and it is ``only`` (None: every path);
    ``remembered``: the walks' memories to put back."""
    kinds.ENABLED = on or only not in (None, "kinds")
    fused._known_shapes = remembered[0] if (on or only not in (None, "walk")) else _NoMemory()
    fused._walks_again = remembered[1] if (on or only not in (None, "again")) else _NoMemory()
    # (the kernel is read from its module at each call: a recipe keeps only its statics)
    kernels.forward_vjp_kernel = kinds.forward_vjp_kernel = \
        _LEAN_KERNEL if (on or only not in (None, "lean")) else _plain_forward_vjp_kernel
    layers_on = on or only not in (None, "layers")
    last_call.LastCall.again, last_call.learn = \
        _LAYER_CALLS if layers_on else (_no_again, _no_learning)
    xla_options.LAUNCHES_IN_THREAD["cpu"] = _IN_THREAD and (on or only not in (None, "thread"))


def _timed(fn: Callable[[], None], steps: int) -> float:
    """The median of ``steps`` timed calls of ``fn`` after 3 untimed ones."""
    return statistics.median(step_times(fn, steps, warmup=3))


def _report(name: str, on: List[float], off: List[float]) -> None:
    ratios = [a / b for a, b in zip(on, off)]
    print(f"[{name}] on {statistics.median(on) * 1e3:8.3f} ms  off {statistics.median(off) * 1e3:8.3f}"
          f" ms | rounds on/off {' '.join(f'{r:.2f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f})")


def deep(rounds: int, steps: int, only: str) -> None:
    net = bench_eager.build("deep", 1, 100, False)
    rng = np.random.default_rng(0)
    x = tensor.from_numpy(rng.standard_normal((1, 8, 8, 8)).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 10, 1).astype(np.int32))
    state = bench_eager._state(net)
    parts: Dict[str, List[float]] = {"forward": [], "walk": []}
    forward, gradients = bench_eager.Deep.forward, optimizers.Optimizer._gradients

    def timed_forward(self, h):
        t0 = time.perf_counter()
        try:
            return forward(self, h)
        finally:
            if self.training:
                parts["forward"].append(time.perf_counter() - t0)

    def timed_gradients(self, loss):
        t0 = time.perf_counter()
        try:
            return gradients(self, loss)
        finally:
            parts["walk"].append(time.perf_counter() - t0)

    bench_eager.Deep.forward = timed_forward
    optimizers.Optimizer._gradients = timed_gradients

    def train() -> None:
        net.train()
        _, loss = net(x, y)
        jax.block_until_ready([loss.array] + [t.array for t in state])

    def evaluate() -> None:
        net.eval()
        jax.block_until_ready(net(x).array)

    remembered = (fused._known_shapes, fused._walks_again)
    results = {(k, on): [] for k in ("step", "forward", "walk", "eval") for on in (True, False)}
    for on in (True, False):  # (each variant's programs compiled before timing)
        _set(on, only, remembered)
        for _ in range(8):
            train()
            evaluate()
    for _ in range(rounds):
        for on in (True, False):
            _set(on, only, remembered)
            for v in parts.values():
                v.clear()
            results["step", on].append(_timed(train, steps))
            results["forward", on].append(statistics.median(parts["forward"][-steps:]))
            results["walk", on].append(statistics.median(parts["walk"][-steps:]))
            results["eval", on].append(_timed(evaluate, steps))
    _set(True, only, remembered)
    for k in ("step", "forward", "walk", "eval"):
        _report(f"deep {k}", results[k, True], results[k, False])


def small(kind: str, rounds: int, steps: int, only: str) -> None:
    net, shape = bench_train_step.build(kind, 64, False)
    rng = np.random.default_rng(0)
    x = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 10, 64).astype(np.int32))
    state = bench_train_step.state_tensors(net)

    def train() -> None:
        net.train()
        _, loss = net(x, y)
        jax.block_until_ready([loss.array] + [t.array for t in state])

    remembered = (fused._known_shapes, fused._walks_again)
    results = {True: [], False: []}
    for on in (True, False):
        _set(on, only, remembered)
        for _ in range(8):
            train()
    for _ in range(rounds):
        for on in (True, False):
            _set(on, only, remembered)
            results[on].append(_timed(train, steps * (4 if kind == "mlp" else 1)))
    _set(True, only, remembered)
    _report(f"{kind} step", results[True], results[False])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="deep,mlp,cnn")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", choices=["kinds", "walk", "again", "lean", "layers", "thread"],
                    default=None,
                    help="switch only the per-kind path, the remembered walk, the walk "
                         "recorded again, the lean pullbacks, the layers' last calls or the "
                         "launching thread")
    args = ap.parse_args()
    print(f"jax {jax.__version__}; {jax.devices()[0]}; switched: {args.only or 'all'}")
    for net in args.nets.split(","):
        if net == "deep":
            deep(args.rounds, args.steps, args.only)
        else:
            small(net, args.rounds, args.steps, args.only)


if __name__ == "__main__":
    main()
