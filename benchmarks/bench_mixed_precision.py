"""ResNet training steps in mixed precision: singa_jax graph mode under ``autocast`` vs a
hand-written ``jax.jit`` step computing in the same dtype vs PyTorch eager (its own process),
float32 and autocast, NCHW and channels_last.

The acceptance numbers of mixed precision (docs/mixed_precision.md) are taken on a GPU:
ResNet-50, batch 64, 224x224, ``autocast='bfloat16'`` in graph mode against the hand-written
bfloat16 step (``benchmarks/resnet_jax.py``: float32 parameters, bfloat16 convolutions and
linear layer, batch norm and the loss in float32) and against PyTorch's
``torch.autocast(bfloat16)`` with channels_last. On a CPU the same script runs small
(``--depth 18 --batch 2 --size 32``) to check that everything runs; XLA:CPU computes bfloat16
products by converting to float32, so its times say nothing about a GPU.

The singa_jax model is SINGA's example ResNet (``examples/cnn/model/resnet.py``); the
hand-written step starts from its parameters (``resnet_jax.state_from``). Every timed step waits
for ALL of its state (parameters, statistics, momentum buffers, the loss). The JAX variants run
in one process, taking turns in blocks of steps; PyTorch runs in its own process between the
blocks. Medians and img/s are printed with the ratios::

    python benchmarks/bench_mixed_precision.py [--depth 50] [--batch 64] [--size 224]
        [--steps 30] [--rounds 3] [--dtypes float32,bfloat16] [--no-torch]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from torch_child import child_step_times, print_step_times

_HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK_STEPS = 5  # steps of one variant before the next variant's turn


# --- PyTorch, in its own process -----------------------------------------------------------------
def _torch_child(depth: int, batch: int, size: int, steps: int, dtype: str,
                 channels_last: bool) -> None:
    """Print one JSON list of PyTorch step times (None without torch): SGD with momentum,
    under ``torch.autocast(dtype)`` unless float32, on the GPU when there is one."""
    try:
        import torch
    except ImportError:
        print(json.dumps(None))
        return
    sys.path.insert(0, _HERE)
    import resnet_torch
    torch.manual_seed(0)
    where = "cuda" if torch.cuda.is_available() else "cpu"
    net = resnet_torch.build(depth).to(where)
    x = torch.randn(batch, 3, size, size, device=where)
    y = torch.randint(0, 10, (batch,), device=where)
    if channels_last:
        net, x = net.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    cast = None if dtype == "float32" else getattr(torch, dtype)

    def step() -> None:
        sgd.zero_grad()
        with torch.autocast(where, dtype=cast, enabled=cast is not None):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        sgd.step()
        if where == "cuda":
            torch.cuda.synchronize()  # the update included

    print_step_times(step, steps)


def torch_times(depth: int, batch: int, size: int, steps: int, dtype: str,
                channels_last: bool) -> List[float]:
    return child_step_times([os.path.abspath(__file__), "--torch-child", "--depth", str(depth),
                             "--batch", str(batch), "--size", str(size), "--steps", str(steps),
                             "--dtypes", dtype] + (["--channels-last"] if channels_last else []))


# --- the JAX variants ----------------------------------------------------------------------------
def singa_stepper(depth: int, batch: int, size: int, dtype: str) -> Callable[[], None]:
    """SINGA's example ResNet in graph mode, compiled with ``autocast`` (None for float32)."""
    import jax
    import resnet_jax
    from singa_jax import tensor
    net = resnet_jax.singa_model(depth, batch, size,
                                 autocast=None if dtype == "float32" else dtype)
    rng = np.random.default_rng(0)
    tx = tensor.from_numpy(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    ty = tensor.from_numpy(rng.integers(0, 10, batch).astype(np.int32))

    def step() -> None:
        _, loss = net(tx, ty)
        jax.block_until_ready([loss.array] + [t.array for t in net.get_states().values()]
                              + [t.array for t in net.optimizer.get_states().values()])

    step.net = net
    return step


def jax_stepper(net, depth: int, batch: int, size: int, dtype: str) -> Callable[[], None]:
    """The hand-written step (benchmarks/resnet_jax.py) from ``net``'s parameters."""
    import jax
    sys.path.insert(0, _HERE)
    import resnet_jax
    params, stats, buffers = resnet_jax.state_from(net, depth)
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    y = jax.device_put(rng.integers(0, 10, batch).astype(np.int32))
    run = resnet_jax.make_step(depth, dtype)
    state = {"s": jax.device_put((params, stats, buffers))}

    def step() -> None:
        *new, loss = run(*state["s"], x, y)
        state["s"] = tuple(new)
        jax.block_until_ready((state["s"], loss))

    return step


def bench(args: argparse.Namespace) -> Dict[str, float]:
    import jax
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    variants: Dict[str, Callable[[], None]] = {}
    for dtype in dtypes:
        singa = singa_stepper(args.depth, args.batch, args.size, dtype)
        variants[f"singa graph {dtype}"] = singa
        variants[f"jax.jit {dtype}"] = jax_stepper(singa.net, args.depth, args.batch, args.size,
                                                   dtype)
    for name, fn in variants.items():  # compile and warm up
        t0 = time.perf_counter()
        fn()
        print(f"first call {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        for _ in range(2):
            fn()
    times: Dict[str, List[float]] = {k: [] for k in variants}
    torch_variants = [] if args.no_torch else \
        [(f"torch {d}{' channels_last' if cl else ''}", d, cl)
         for d in dtypes for cl in ((False, True) if d == "float32" else (True,))]
    per_round = max(1, args.steps // args.rounds)
    for _ in range(args.rounds):
        for _ in range(max(1, per_round // BLOCK_STEPS)):
            for name, fn in variants.items():
                for _ in range(BLOCK_STEPS):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
        for name, d, cl in torch_variants:
            found = torch_times(args.depth, args.batch, args.size, per_round, d, cl)
            if found:
                times.setdefault(name, []).extend(found)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; ResNet-{args.depth}, batch "
          f"{args.batch}, {args.size}x{args.size}")
    for k, v in med.items():
        print(f"{k:32s} median {v * 1e3:9.2f} ms/step  {args.batch / v:9.1f} img/s")
    for dtype in dtypes:
        s, j = med[f"singa graph {dtype}"], med[f"jax.jit {dtype}"]
        print(f"{dtype}: singa graph / jax.jit speed = {j / s:.3f}", end="")
        t = med.get(f"torch {dtype} channels_last")
        print(f"   singa graph / torch channels_last speed = {t / s:.3f}" if t else "")
    return med


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, choices=(18, 50), default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224, help="image side (a multiple of 32)")
    ap.add_argument("--steps", type=int, default=30, help="per variant, over all rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_child:
        _torch_child(args.depth, args.batch, args.size, args.steps, args.dtypes,
                     args.channels_last)
        return
    bench(args)


if __name__ == "__main__":
    main()
