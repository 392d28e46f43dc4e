"""Eager mode's host cost: a dispatch-bound network (and, on an accelerator, SINGA's ResNet-50),
singa_jax eager vs graph mode vs PyTorch eager (in its own process).

Eager mode runs with replay (the default) and op by op (``autograd.eager_replay(False)``).

``deep``: a SINGA Model of 100 x [Conv2d 8->8 3x3 pad 1, BatchNorm2d, ReLU] on one 8x8x8 image,
then a Linear(10) and softmax cross-entropy, SGD with momentum. Its arithmetic is negligible, so
a step's time is the host's work between the user's calls and the kernels: the per-operator
host cost printed is (eager evaluation forward time) / (operators in it).

``resnet50``: ``examples/cnn/model/resnet.py``'s ResNet-50 (batch ``--batch``, 224x224); slow on
a CPU, meant for a GPU.

Every timed step waits for ALL of its results (loss, parameters, buffers, optimizer slots); the
evaluation forward waits for its output. Variants take turns in blocks; PyTorch runs in its own
process, which stays up with its steps warm and times a block of the same work right after
eager mode's block (``torch_child.StepServer``; one side waits while the other runs). Medians
are printed with the ratios, and eager against PyTorch also block by block (each eager
block's median over the PyTorch block's right after it: on a host whose load swings within
seconds, steadier than the ratio of the whole run's medians; more rounds of fewer steps pair
more closely).

singa_jax tunes Python's garbage collector at the first eager backward (a higher young
threshold: singa_jax/_src/backend/gc_tuning.py); run with ``SINGA_JAX_GC_TUNING=0`` to time without it.
``--gc-freeze`` also moves every object alive after the warm-up out of the collector's reach
(``gc.freeze()``, a lever of the user's program): without either, its full collections
traverse JAX's own objects too, every few steps. Medians and means are printed (a
median skips the full collections). An eager training step becomes one replayed program at
about its sixth call, so every variant is warmed up ``WARMUP`` calls. ``--torch-threads``
sets PyTorch's intra-op threads (default: PyTorch's own choice). Usage::

    python benchmarks/bench_eager.py [--nets deep,resnet50] [--steps 30] [--rounds 3]
        [--batch 64] [--depth 100] [--gc-freeze] [--torch-threads N] [--pieces 0,32,128]
        [--split] [--no-speculation]

``--pieces`` adds eager variants whose replayed segments are dispatched every N recorded calls
(``xla_options.REPLAY_PIECE_CALLS``; 0: one program a step): on an accelerator the device
runs each piece while the host records the next. ``--split`` prints each training step's
time until its call returns (the host's recording, and on an accelerator the program's
dispatch: the device is then running it) and then waiting for its results.
``--no-speculation`` adds eager variants with replay's speculation off (``autograd.replay_speculation(False)``: a
recurring step's program then starts only once its recording ended).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence
from unittest import mock

import jax
import numpy as np

from singa_jax import autograd, device, layer, model, opt, tensor
from singa_jax._src.backend import gc_tuning, xla_options
from singa_jax._src.eager import replay
from torch_child import StepServer, serve_steps

LR, MOMENTUM = 0.05, 0.9
WARMUP = 8  # calls of each variant before timing
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


class Deep(model.Model):
    """``depth`` x [Conv2d(8, 8, 3, padding=1), BatchNorm2d(8), ReLU], Flatten, Linear(10)."""

    def __init__(self, depth: int = 100, channels: int = 8, bias: bool = True):
        super().__init__()
        self.depth = depth
        for i in range(depth):
            setattr(self, f"conv{i}", layer.Conv2d(channels, channels, 3, padding=1, bias=bias))
            setattr(self, f"bn{i}", layer.BatchNorm2d(channels))
            setattr(self, f"relu{i}", layer.ReLU())
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        for i in range(self.depth):
            x = getattr(self, f"relu{i}")(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
        return self.fc(self.flatten(x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def _resnet50():
    sys.path[:0] = [os.path.join(_EXAMPLES, "cnn"), _EXAMPLES]
    from model import resnet  # SINGA's examples/cnn/model/resnet.py
    return resnet.resnet50(num_classes=1000, num_channels=3)


def _shape(net_kind: str, batch: int, depth: int) -> tuple:
    return (1, 8, 8, 8) if net_kind == "deep" else (batch, 3, 224, 224)


def build(net_kind: str, batch: int, depth: int, use_graph: bool, seed: int = 0,
          bias: bool = True):
    """``bias``: the deep network's convolutions with biases (their state arrays)."""
    device.get_default_device().SetRandSeed(seed)
    net = Deep(depth, bias=bias) if net_kind == "deep" else _resnet50()
    net.set_optimizer(opt.SGD(lr=LR, momentum=MOMENTUM))
    net.compile([tensor.Tensor(_shape(net_kind, batch, depth))], is_train=True,
                use_graph=use_graph)
    return net


def _state(net: model.Model) -> list:
    return list(net.get_states().values()) + list(net.optimizer.get_states().values())


def count_ops(net: model.Model, x: tensor.Tensor) -> int:
    """Operators in one evaluation forward (counted from the creator graph of a training-mode
    forward, which has the same operators)."""
    autograd.training = True
    try:
        out = net.forward(x)
    finally:
        autograd.training = False
    seen, todo = set(), [out.creator]
    while todo:
        op = todo.pop()
        if op in seen or isinstance(op, autograd.Dummy):
            continue
        seen.add(op)
        todo.extend(src for src, *_ in op.src)
    return len(seen)


# --- PyTorch, in its own process -------------------------------------------------------------
def _torch_net(net_kind: str, depth: int):
    import torch
    nn = torch.nn
    if net_kind == "deep":
        blocks = []
        for _ in range(depth):
            blocks += [nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8, momentum=0.1), nn.ReLU()]
        return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    import torchvision  # noqa: F401  (optional)
    return torchvision.models.resnet50()


def _torch_steps(net_kind: str, batch: int, depth: int, threads: int = 0
                 ) -> Optional[Dict[str, Callable[[], Any]]]:
    """PyTorch's training step and evaluation forward of ``net_kind`` (None: no PyTorch)."""
    try:
        import torch
        net = _torch_net(net_kind, depth)
    except ImportError:
        return None
    if threads:
        torch.set_num_threads(threads)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    net = net.to(dev)
    sgd = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    shape = _shape(net_kind, batch, depth)
    x = torch.randn(*shape, device=dev)
    y = torch.randint(0, 10, (shape[0],), device=dev)

    def train():
        net.train()
        sgd.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        sgd.step()
        loss.item()
        if dev == "cuda":
            torch.cuda.synchronize()

    def evaluate():
        net.eval()
        with torch.no_grad():
            out = net(x)
        if dev == "cuda":
            torch.cuda.synchronize()
        return out

    return {"train": train, "eval": evaluate}


def torch_server(net_kind: str, batch: int, depth: int, threads: int = 0
                 ) -> Optional[StepServer]:
    """A child process serving PyTorch's steps (see torch_child.StepServer), or None without
    PyTorch."""
    server = StepServer([os.path.abspath(__file__), "--torch-child", net_kind, "--batch",
                         str(batch), "--depth", str(depth), "--torch-threads", str(threads)])
    return server if server.available else None


# --- timing ----------------------------------------------------------------------------------
def _print_split(net_kind: str, nets: Dict[str, model.Model], x: tensor.Tensor,
                 y: tensor.Tensor, held: Dict[str, list], steps: int) -> None:
    """Where a training step's time goes: until the call returns (the host's work; on an
    accelerator the step's program is then dispatched and running) and then waiting for every
    result. On a CPU the program runs inside the call."""
    for key, net in nets.items():
        until, total = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            net.train()
            _, loss = net(x, y)
            t1 = time.perf_counter()
            jax.block_until_ready([loss.array] + [t.array for t in held[key]])
            until.append(t1 - t0)
            total.append(time.perf_counter() - t0)
        until_ms, total_ms = statistics.median(until) * 1e3, statistics.median(total) * 1e3
        print(f"[{net_kind}] {key} train split: {total_ms:.2f} ms = {until_ms:.2f} until the "
              f"call returns + {total_ms - until_ms:.2f} waiting (medians of {steps})")


def bench(net_kind: str, batch: int, depth: int, steps: int, rounds: int,
          gc_freeze: bool = False, torch_threads: int = 0,
          pieces: Sequence[int] = (), split: bool = False,
          no_speculation: bool = False) -> Dict[str, float]:
    rng = np.random.default_rng(0)
    shape = _shape(net_kind, batch, depth)
    x = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 10, shape[0]).astype(np.int32))
    eager, graph = build(net_kind, batch, depth, False), build(net_kind, batch, depth, True)
    n_ops = count_ops(eager, x)
    held = {}

    def trainer(net: model.Model, key: str) -> Callable[[], None]:
        def run():
            net.train()
            _, loss = net(x, y)
            jax.block_until_ready([loss.array] + [t.array for t in held[key]])
        return run

    def evaluator(net: model.Model) -> Callable[[], None]:
        def run():
            net.eval()
            jax.block_until_ready(net(x).array)
        return run

    def op_by_op(fn: Callable[[], None]) -> Callable[[], None]:
        return autograd.eager_replay(False)(fn)

    platform = jax.devices()[0].platform

    def in_pieces(fn: Callable[[], None], calls: int) -> Callable[[], None]:
        """``fn`` with replay's segments dispatched every ``calls`` calls (0: one program)."""
        return mock.patch.dict(xla_options.REPLAY_PIECE_CALLS, {platform: calls or None})(fn)

    variants = {"eager train": trainer(eager, "eager"), "graph train": trainer(graph, "graph"),
                "op-by-op train": op_by_op(trainer(eager, "eager")),
                "eager eval": evaluator(eager), "graph eval": evaluator(graph),
                "op-by-op eval": op_by_op(evaluator(eager))}
    for calls in pieces:
        variants[f"eager train p{calls}"] = in_pieces(trainer(eager, "eager"), calls)
        variants[f"eager eval p{calls}"] = in_pieces(evaluator(eager), calls)

    def unspeculated(fn: Callable[[], None]) -> Callable[[], None]:
        """``fn`` with replay's speculation off (each program dispatched at its flush)."""
        return autograd.replay_speculation(False)(fn)

    if no_speculation:
        variants["eager train unspec"] = unspeculated(trainer(eager, "eager"))
        variants["eager eval unspec"] = unspeculated(evaluator(eager))
    held["eager"], held["graph"] = _state(eager), _state(graph)
    for fn in variants.values():
        fn()
    held["eager"], held["graph"] = _state(eager), _state(graph)  # now with the slots
    # an eager training step becomes one program at its third call or so (a sequence runs op
    # by op once and is compiled at its second occurrence; a backward walk's plan fuses from
    # its second walk on, and joins the step's program from then)
    for fn in variants.values():
        for _ in range(WARMUP):
            fn()
    if gc_freeze:
        gc.collect()
        gc.freeze()
    times: Dict[str, List[float]] = {k: [] for k in variants}
    torch_t: Dict[str, List[float]] = {"train": [], "eval": []}
    per_round = max(1, steps // rounds)
    # each round's medians, eager against PyTorch: the host's load drifts between rounds, and a
    # ratio of two medians taken in the same round is steadier than one of whole-run medians
    paired: Dict[str, List[float]] = {"train": [], "eval": []}
    server = torch_server(net_kind, batch, depth, torch_threads)
    try:
        for _ in range(rounds):
            for name, fn in variants.items():
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
                kind = name.split()[1]
                if server is not None and name == f"eager {kind}":  # PyTorch's block next
                    v = server.times(kind, per_round)
                    torch_t[kind] += v
                    paired[kind].append(statistics.median(times[name][-per_round:])
                                        / statistics.median(v))
    finally:
        if server is not None:
            server.close()
    if torch_t["train"]:
        times["torch train"], times["torch eval"] = torch_t["train"], torch_t["eval"]
    if split:
        _print_split(net_kind, {"eager": eager, "graph": graph}, x, y, held, per_round)
    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    dev = jax.devices()[0]
    piece = xla_options.replay_piece_calls(dev.platform)
    evaluation = f"in pieces of {piece} calls" if piece else "as one program"
    print(f"[{net_kind}] {dev.platform} ({dev.device_kind}); {n_ops} operators per forward; "
          f"replay runs an evaluation {evaluation}"
          f"{'; gc.freeze() after the warm-up' if gc_freeze else ''}; singa_jax's GC tuning "
          f"{'on' if gc_tuning.tuned() else 'off'}; load average {os.getloadavg()[0]:.1f}")
    for k, v in med.items():
        # (the mean includes Python's full garbage collections, which a median skips)
        print(f"[{net_kind}] {k:16s} median {v * 1e3:9.3f} ms   mean {mean[k] * 1e3:9.3f} ms")
    print(f"[{net_kind}] host time per operator, eval forward: eager (replay) "
          f"{med['eager eval'] / n_ops * 1e6:.1f} us, op by op "
          f"{med['op-by-op eval'] / n_ops * 1e6:.1f} us")
    print(f"[{net_kind}] host time per operator, train step (forward + backward + update): "
          f"eager {med['eager train'] / n_ops * 1e6:.1f} us")
    print(f"[{net_kind}] eager / op-by-op: train {med['eager train'] / med['op-by-op train']:.2f}"
          f"   eval {med['eager eval'] / med['op-by-op eval']:.2f}")
    print(f"[{net_kind}] eager train / graph train = {med['eager train'] / med['graph train']:.2f}"
          f"   graph train / eager train = {med['graph train'] / med['eager train']:.2f}")
    if "eager train unspec" in med:
        print(f"[{net_kind}] speculation off: eager train / graph train = "
              f"{med['eager train unspec'] / med['graph train']:.2f}   speculated / not: train "
              f"{med['eager train'] / med['eager train unspec']:.2f}   eval "
              f"{med['eager eval'] / med['eager eval unspec']:.2f}")
    stats = replay.stats()
    print(f"[{net_kind}] replay: {stats['replayed']} programs run, {stats['speculated']} of them "
          f"started before their recording ended, {stats['mispredicted']} mispredicted")
    if "torch train" in med:
        print(f"[{net_kind}] torch eval: {med['torch eval'] / n_ops * 1e6:.1f} us per operator")
        print(f"[{net_kind}] eager train / torch train = "
              f"{med['eager train'] / med['torch train']:.2f}   eager eval / torch eval = "
              f"{med['eager eval'] / med['torch eval']:.2f}")
        for k in ("train", "eval"):
            print(f"[{net_kind}] eager {k} / torch {k}, each round's medians: "
                  f"{' '.join(f'{r:.2f}' for r in paired[k])} (median "
                  f"{statistics.median(paired[k]):.2f})")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="deep")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="ResNet-50's batch")
    ap.add_argument("--depth", type=int, default=100, help="blocks of the deep network")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after the warm-up (see the module docstring)")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="PyTorch's intra-op threads (0: PyTorch's default)")
    ap.add_argument("--pieces", default="",
                    help="also time eager mode with replay dispatching every N calls, for "
                         "each N of this comma list (0: one program a step)")
    ap.add_argument("--split", action="store_true",
                    help="also print each training step's time until its call returns and "
                         "then waiting for its results (eager and graph)")
    ap.add_argument("--no-speculation", action="store_true",
                    help="also time eager mode with replay's speculation off")
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_child:
        serve_steps(_torch_steps(args.torch_child, args.batch, args.depth, args.torch_threads))
        return
    print(f"jax {jax.__version__}; {jax.devices()[0]}")
    for net_kind in args.nets.split(","):
        bench(net_kind.strip(), args.batch, args.depth, args.steps, args.rounds,
              args.gc_freeze, args.torch_threads,
              [int(n) for n in args.pieces.split(",") if n.strip()], args.split,
              args.no_speculation)


if __name__ == "__main__":
    main()
