"""Eager mode's host cost: a dispatch-bound network (and, on an accelerator, SINGA's ResNet-50),
singa_jax eager vs graph mode vs PyTorch eager, each framework in a process of its own.

Eager mode runs with replay (the default) and op by op (``autograd.eager_replay(False)``).

``deep``: a SINGA Model of 100 x [Conv2d 8->8 3x3 pad 1, BatchNorm2d, ReLU] on one 8x8x8 image,
then a Linear(10) and softmax cross-entropy, SGD with momentum. Its arithmetic is negligible, so
a step's time is the host's work between the user's calls and the kernels: the per-operator
host cost printed is (eager evaluation forward time) / (operators in it).

``resnet50``: ``examples/cnn/model/resnet.py``'s ResNet-50 (batch ``--batch``, 224x224); slow on
a CPU, meant for a GPU.

How it times: the script's own process imports neither JAX nor PyTorch; each round it starts
one singa_jax process and one PyTorch process, one after the other (the first has exited
before the second starts, and the order alternates between rounds), so a framework is never
timed beside the other's threads, even idle ones. Each process builds its networks, warms
them up, times ``--steps`` steps of every variant and exits. Every timed step waits for ALL of
its results (loss, parameters, buffers, optimizer slots); the evaluation forward waits for its
output. PyTorch runs at its default intra-op threads unless ``--torch-threads`` is given.

Each process reports the 1-minute load average at the start and end of its timing, and the
CPU the rest of the machine used meanwhile (from /proc/stat, less the process's own CPU time:
the direct measure, since the load average lags and counts this benchmark's own earlier
processes, about 1 after a minute of them). A process whose load average exceeds ``LOADED``
is marked LOADED, one beside which other processes kept more than ``OTHERS_BUSY`` cores busy
is marked BUSY; their numbers are still used. Each also times a fixed pure-Python loop before
and after (``sum(range(10**6))``, best of 5): a virtual machine's speed can drift by tens of
percent with no load in sight, and the yardstick shows it. Per round: each variant's median,
and eager against PyTorch; then the medians over rounds (of the rounds' medians and ratios)
with their range, and the ratios' median over the rounds not marked BUSY.

singa_jax tunes Python's garbage collector at the first eager backward (a higher young
threshold: singa_jax/_src/backend/gc_tuning.py); run with ``SINGA_JAX_GC_TUNING=0`` to time without it.
``--gc-freeze`` also moves every object alive after the warm-up out of the collector's reach
(``gc.freeze()``, a lever of the user's program): without either, its full collections
traverse JAX's own objects too, every few steps. Medians and means are printed (a
median skips the full collections). An eager training step becomes one replayed program at
about its sixth call, so every variant is warmed up ``WARMUP`` calls. Usage::

    python benchmarks/bench_eager.py [--nets deep,resnet50] [--steps 30] [--rounds 5]
        [--batch 64] [--depth 100] [--gc-freeze] [--torch-threads N] [--pieces 0,32,128]
        [--split] [--no-speculation]

``--steps``: timed steps of each variant in each round's process.
``--pieces`` adds eager variants whose replayed segments are dispatched every N recorded calls
(``xla_options.REPLAY_PIECE_CALLS``; 0: one program a step): on an accelerator the device
runs each piece while the host records the next. ``--split`` prints each training step's
time until its call returns (the host's recording, and on an accelerator the program's
dispatch: the device is then running it), then waiting for its results, then dropping the
step before's autograd graph (Python objects and arrays the timed steps free as they go).
``--no-speculation`` adds eager variants with replay's speculation off (``autograd.replay_speculation(False)``: a
recurring step's program then starts only once its recording ended).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# JAX, NumPy, singa_jax and PyTorch are imported inside the functions that run in the child
# processes: the parent process must not hold either framework's runtime.

LR, MOMENTUM = 0.05, 0.9
WARMUP = 8  # calls of each variant before timing
LOADED = 1.0  # 1-minute load average above which a round is marked LOADED (a 2-core host)
OTHERS_BUSY = 0.2  # cores other processes kept busy, above which a round is marked BUSY
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
_DEEP: Optional[type] = None


def _deep_class() -> type:
    """The ``Deep`` model class, defined at first use (it subclasses singa_jax's Model)."""
    global _DEEP
    if _DEEP is not None:
        return _DEEP
    from singa_jax import layer, model

    class Deep(model.Model):
        """``depth`` x [Conv2d(8, 8, 3, padding=1), BatchNorm2d(8), ReLU], Flatten, Linear(10)."""

        def __init__(self, depth: int = 100, channels: int = 8, bias: bool = True) -> None:
            super().__init__()
            self.depth = depth
            for i in range(depth):
                setattr(self, f"conv{i}", layer.Conv2d(channels, channels, 3, padding=1,
                                                       bias=bias))
                setattr(self, f"bn{i}", layer.BatchNorm2d(channels))
                setattr(self, f"relu{i}", layer.ReLU())
            self.flatten = layer.Flatten()
            self.fc = layer.Linear(10)
            self.loss = layer.SoftMaxCrossEntropy()

        def forward(self, x: Any) -> Any:
            for i in range(self.depth):
                x = getattr(self, f"relu{i}")(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
            return self.fc(self.flatten(x))

        def train_one_batch(self, x: Any, y: Any) -> Tuple[Any, Any]:
            out = self.forward(x)
            loss = self.loss(out, y)
            self.optimizer(loss)
            return out, loss

    Deep.__qualname__ = "Deep"
    _DEEP = Deep
    return Deep


def __getattr__(name: str) -> Any:
    # ``bench_eager.Deep`` for the scripts that import this one (the same class build() uses)
    if name == "Deep":
        return _deep_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _resnet50() -> Any:
    sys.path[:0] = [os.path.join(_EXAMPLES, "cnn"), _EXAMPLES]
    from model import resnet  # SINGA's examples/cnn/model/resnet.py
    return resnet.resnet50(num_classes=1000, num_channels=3)


def _shape(net_kind: str, batch: int, depth: int) -> tuple:
    return (1, 8, 8, 8) if net_kind == "deep" else (batch, 3, 224, 224)


def build(net_kind: str, batch: int, depth: int, use_graph: bool, seed: int = 0,
          bias: bool = True) -> Any:
    """``bias``: the deep network's convolutions with biases (their state arrays)."""
    from singa_jax import device, opt, tensor
    device.get_default_device().SetRandSeed(seed)
    net = _deep_class()(depth, bias=bias) if net_kind == "deep" else _resnet50()
    net.set_optimizer(opt.SGD(lr=LR, momentum=MOMENTUM))
    net.compile([tensor.Tensor(_shape(net_kind, batch, depth))], is_train=True,
                use_graph=use_graph)
    return net


def _state(net: Any) -> list:
    return list(net.get_states().values()) + list(net.optimizer.get_states().values())


def count_ops(net: Any, x: Any) -> int:
    """Operators in one evaluation forward (counted from the creator graph of a training-mode
    forward, which has the same operators)."""
    from singa_jax import autograd
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


# --- what a child process measures around its timing -----------------------------------------
def _busy_cpu_s() -> float:
    """Seconds of CPU the whole machine spent busy so far (/proc/stat; NaN elsewhere). Steal
    time counts as busy: on a shared virtual machine it is CPU taken from this one."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _host_speed() -> float:
    """Milliseconds of a fixed pure-Python loop (best of 5): a yardstick of this host's
    single-thread speed, to tell whether two runs' absolute times are comparable."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        sum(range(1_000_000))
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _timed(fns: Dict[str, Callable[[], Any]], steps: int) -> Dict[str, Any]:
    """Time ``steps`` calls of each of ``fns`` in turn; the step times with the load around
    them: the load average at start and end, the cores the rest of the machine kept busy
    meanwhile (busy CPU less this process's own, over the wall time), and the host-speed
    yardstick before and after (a virtual machine's speed can drift with no load in sight)."""
    speed0 = _host_speed()
    load0, busy0, own0, wall0 = os.getloadavg()[0], _busy_cpu_s(), time.process_time(), \
        time.perf_counter()
    times: Dict[str, List[float]] = {}
    for name, fn in fns.items():
        times[name] = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    wall = time.perf_counter() - wall0
    # (clamped: /proc/stat counts in clock ticks, so a quiet host can read slightly below 0)
    others = max(0.0, (_busy_cpu_s() - busy0 - (time.process_time() - own0)) / wall)
    load1 = os.getloadavg()[0]
    return {"times": times, "load": [load0, load1], "others": others,
            "speed": [speed0, _host_speed()]}


def _emit(result: Dict[str, Any]) -> None:
    """The child's result, as the last line of its output (the lines before it are printed by
    the parent as they are)."""
    print(json.dumps(result), flush=True)


# --- PyTorch's process -----------------------------------------------------------------------
def _torch_net(net_kind: str, depth: int) -> Any:
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

    def train() -> None:
        net.train()
        sgd.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        sgd.step()
        loss.item()
        if dev == "cuda":
            torch.cuda.synchronize()

    def evaluate() -> Any:
        net.eval()
        with torch.no_grad():
            out = net(x)
        if dev == "cuda":
            torch.cuda.synchronize()
        return out

    return {"train": train, "eval": evaluate}


def torch_child(net_kind: str, batch: int, depth: int, steps: int, threads: int) -> None:
    """One round's PyTorch process: warm up and time its training step and evaluation forward;
    print the result as the last line."""
    steps_of = _torch_steps(net_kind, batch, depth, threads)
    if steps_of is None:
        _emit({"missing": True})
        return
    import torch
    for fn in steps_of.values():
        for _ in range(WARMUP):
            fn()
    result = _timed(steps_of, steps)
    result["threads"] = torch.get_num_threads()
    result["version"] = torch.__version__
    _emit(result)


# --- singa_jax's process ---------------------------------------------------------------------
def _print_split(net_kind: str, nets: Dict[str, Any], x: Any, y: Any, held: Dict[str, list],
                 steps: int) -> None:
    """Where a training step's time goes: until the call returns (the host's work; on an
    accelerator the step's program is then dispatched and running), then waiting for every
    result, then dropping the step before's autograd graph (its loss: a loop that keeps the
    last loss drops it when the next replaces it, as the timed steps do). On a CPU the
    program runs inside the call."""
    import jax
    for key, net in nets.items():
        until, waiting, dropping = [], [], []
        net.train()
        losses = [net(x, y)[1]]  # (the last step's: its graph lives until it is dropped)
        for _ in range(steps):
            t0 = time.perf_counter()
            net.train()
            losses.append(net(x, y)[1])
            t1 = time.perf_counter()
            jax.block_until_ready([losses[-1].array] + [t.array for t in held[key]])
            t2 = time.perf_counter()
            del losses[0]  # the last reference to the step before's graph
            t3 = time.perf_counter()
            until.append(t1 - t0)
            waiting.append(t2 - t1)
            dropping.append(t3 - t2)
        until_ms, wait_ms, drop_ms = (statistics.median(v) * 1e3
                                      for v in (until, waiting, dropping))
        print(f"[{net_kind}] {key} train split (medians of {steps}): {until_ms:.2f} ms until "
              f"the call returns + {wait_ms:.2f} waiting + {drop_ms:.2f} dropping the step "
              f"before's graph")


def jax_child(net_kind: str, batch: int, depth: int, steps: int, gc_freeze: bool = False,
              pieces: Sequence[int] = (), split: bool = False,
              no_speculation: bool = False) -> None:
    """One round's singa_jax process: build, warm up and time every variant; print the result
    as the last line."""
    import gc
    from unittest import mock

    import jax
    import numpy as np

    from singa_jax import autograd, model, tensor
    from singa_jax._src.backend import gc_tuning, xla_options
    from singa_jax._src.eager import replay

    rng = np.random.default_rng(0)
    shape = _shape(net_kind, batch, depth)
    x = tensor.from_numpy(rng.standard_normal(shape).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 10, shape[0]).astype(np.int32))
    eager, graph = build(net_kind, batch, depth, False), build(net_kind, batch, depth, True)
    n_ops = count_ops(eager, x)
    held: Dict[str, list] = {}

    def trainer(net: model.Model, key: str) -> Callable[[], None]:
        def run() -> None:
            net.train()
            _, loss = net(x, y)
            jax.block_until_ready([loss.array] + [t.array for t in held[key]])
        return run

    def evaluator(net: model.Model) -> Callable[[], None]:
        def run() -> None:
            net.eval()
            jax.block_until_ready(net(x).array)
        return run

    def op_by_op(fn: Callable[[], None]) -> Callable[[], None]:
        return autograd.eager_replay(False)(fn)

    platform = jax.devices()[0].platform

    def in_pieces(fn: Callable[[], None], calls: int) -> Callable[[], None]:
        """``fn`` with replay's segments dispatched every ``calls`` calls (0: one program)."""
        return mock.patch.dict(xla_options.REPLAY_PIECE_CALLS, {platform: calls or None})(fn)

    def unspeculated(fn: Callable[[], None]) -> Callable[[], None]:
        """``fn`` with replay's speculation off (each program dispatched at its flush)."""
        return autograd.replay_speculation(False)(fn)

    variants = {"eager train": trainer(eager, "eager"), "graph train": trainer(graph, "graph"),
                "op-by-op train": op_by_op(trainer(eager, "eager")),
                "eager eval": evaluator(eager), "graph eval": evaluator(graph),
                "op-by-op eval": op_by_op(evaluator(eager))}
    for calls in pieces:
        variants[f"eager train p{calls}"] = in_pieces(trainer(eager, "eager"), calls)
        variants[f"eager eval p{calls}"] = in_pieces(evaluator(eager), calls)
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
    result = _timed(variants, steps)
    if split:
        _print_split(net_kind, {"eager": eager, "graph": graph}, x, y, held, steps)
    dev = jax.devices()[0]
    piece = xla_options.replay_piece_calls(dev.platform)
    result.update(n_ops=n_ops, platform=dev.platform, device_kind=dev.device_kind,
                  jax=jax.__version__, piece=piece, gc_tuned=gc_tuning.tuned(),
                  replay=replay.stats())
    _emit(result)


# --- the parent: rounds of child processes ---------------------------------------------------
def _child(argv: Sequence[str]) -> Dict[str, Any]:
    """Run this script as a child with ``argv``; echo the lines it printed before its result
    and return the result (its last line)."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise RuntimeError(f"child {' '.join(argv)} exited with status {out.returncode}")
    lines = out.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(f"    {line}")
    return json.loads(lines[-1])


def _load_note(r: Dict[str, Any]) -> str:
    l0, l1 = r["load"]
    flag = ("  LOADED" if max(l0, l1) > LOADED else "") + \
        ("  BUSY" if r["others"] > OTHERS_BUSY else "")
    s0, s1 = r["speed"]
    return (f"load {l0:.2f} -> {l1:.2f}, other processes {r['others']:.2f} cores, host speed "
            f"{s0:.1f} -> {s1:.1f} ms{flag}")


def _ms(times: List[float]) -> float:
    return statistics.median(times) * 1e3


def _spread(values: List[float], fmt: str = "{:.2f}") -> str:
    """The median of ``values`` with their range."""
    med = fmt.format(statistics.median(values))
    if len(values) < 2:
        return med
    return f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def bench(net_kind: str, batch: int, depth: int, steps: int, rounds: int,
          gc_freeze: bool = False, torch_threads: int = 0,
          pieces: Sequence[int] = (), split: bool = False,
          no_speculation: bool = False) -> Dict[str, float]:
    """``rounds`` rounds of a singa_jax process and a PyTorch process in turns; the medians over
    rounds of each variant's per-round median (seconds)."""
    common = [net_kind, "--batch", str(batch), "--depth", str(depth), "--steps", str(steps)]
    jax_argv = ["--child", "jax", *common, "--pieces", ",".join(map(str, pieces))]
    jax_argv += ["--gc-freeze"] * gc_freeze + ["--split"] * split
    jax_argv += ["--no-speculation"] * no_speculation
    torch_argv = ["--child", "torch", *common, "--torch-threads", str(torch_threads)]
    jax_runs: List[Dict[str, Any]] = []
    torch_runs: List[Dict[str, Any]] = []
    tag = f"[{net_kind}]"
    print(f"{tag} {rounds} rounds of {steps} timed steps per variant; load average at start "
          f"{os.getloadavg()[0]:.2f}; host speed: sum(range(10**6)) {_host_speed():.1f} ms")
    for r in range(rounds):
        # alternate which framework goes first: neither always follows the other's load
        order = ("jax", "torch") if r % 2 == 0 else ("torch", "jax")
        for side in order:
            if side == "jax":
                jax_runs.append(_child(jax_argv))
            else:
                res = _child(torch_argv)
                torch_runs.append(res)
        j = jax_runs[-1]
        t = j["times"]
        print(f"{tag} round {r + 1}: singa_jax ({_load_note(j)})")
        print(f"{tag}   singa_jax eager train {_ms(t['eager train']):7.2f} ms   eval "
              f"{_ms(t['eager eval']):6.2f} ms   graph train {_ms(t['graph train']):6.2f} ms   "
              f"op-by-op train {_ms(t['op-by-op train']):7.2f} ms   eval "
              f"{_ms(t['op-by-op eval']):6.2f} ms")
        p = torch_runs[-1]
        if not p.get("missing"):
            pt = p["times"]
            print(f"{tag} round {r + 1}: PyTorch, {p['threads']} threads ({_load_note(p)})")
            print(f"{tag}   PyTorch train {_ms(pt['train']):7.2f} ms   eval {_ms(pt['eval']):6.2f}"
                  f" ms   eager / PyTorch: train {_ms(t['eager train']) / _ms(pt['train']):.2f}x"
                  f"   eval {_ms(t['eager eval']) / _ms(pt['eval']):.2f}x   graph train / "
                  f"PyTorch train {_ms(t['graph train']) / _ms(pt['train']):.2f}x")

    j0 = jax_runs[-1]
    per_round = {k: [statistics.median(j["times"][k]) for j in jax_runs] for k in j0["times"]}
    every = {k: [v for j in jax_runs for v in j["times"][k]] for k in j0["times"]}
    has_torch = not torch_runs[-1].get("missing")
    if has_torch:
        for k in ("train", "eval"):
            per_round[f"torch {k}"] = [statistics.median(p["times"][k]) for p in torch_runs]
            every[f"torch {k}"] = [v for p in torch_runs for v in p["times"][k]]
    med = {k: statistics.median(v) for k, v in per_round.items()}
    n_ops = j0["n_ops"]
    loads = [v for run in jax_runs + torch_runs for v in run["load"]]
    others = [run["others"] for run in jax_runs + torch_runs]
    evaluation = f"in pieces of {j0['piece']} calls" if j0["piece"] else "as one program"
    print(f"{tag} jax {j0['jax']}, {j0['platform']} ({j0['device_kind']}); {n_ops} operators per "
          f"forward; replay runs an evaluation {evaluation}"
          f"{'; gc.freeze() after the warm-up' if gc_freeze else ''}; singa_jax's GC tuning "
          f"{'on' if j0['gc_tuned'] else 'off'}"
          + (f"; PyTorch {torch_runs[-1]['version']}" if has_torch else ""))
    print(f"{tag} load average during the timings: {min(loads):.2f}-{max(loads):.2f}"
          f"{'  LOADED' if max(loads) > LOADED else ''}; other processes' CPU "
          f"{min(others):.2f}-{max(others):.2f} cores"
          f"{'  BUSY' if max(others) > OTHERS_BUSY else ''}")
    print(f"{tag} medians over {rounds} rounds of each round's median (range), and the mean of "
          f"every step (with Python's full collections, which a median skips):")
    for k, v in per_round.items():
        print(f"{tag} {k:20s} {_spread([s * 1e3 for s in v], '{:.3f}'):>26s} ms   mean "
              f"{statistics.fmean(every[k]) * 1e3:9.3f} ms")
    print(f"{tag} host time per operator, eval forward: eager (replay) "
          f"{med['eager eval'] / n_ops * 1e6:.1f} us, op by op "
          f"{med['op-by-op eval'] / n_ops * 1e6:.1f} us")
    print(f"{tag} host time per operator, train step (forward + backward + update): "
          f"eager {med['eager train'] / n_ops * 1e6:.1f} us")
    print(f"{tag} eager / op-by-op: train {med['eager train'] / med['op-by-op train']:.2f}"
          f"   eval {med['eager eval'] / med['op-by-op eval']:.2f}")
    print(f"{tag} eager train / graph train = {med['eager train'] / med['graph train']:.2f}"
          f"   graph train / eager train = {med['graph train'] / med['eager train']:.2f}")
    if "eager train unspec" in med:
        print(f"{tag} speculation off: eager train / graph train = "
              f"{med['eager train unspec'] / med['graph train']:.2f}   speculated / not: train "
              f"{med['eager train'] / med['eager train unspec']:.2f}   eval "
              f"{med['eager eval'] / med['eager eval unspec']:.2f}")
    stats = j0["replay"]
    print(f"{tag} replay (last singa_jax process): {stats['replayed']} programs run, "
          f"{stats['speculated']} of them started before their recording ended, "
          f"{stats['mispredicted']} mispredicted")
    if has_torch:
        print(f"{tag} torch eval: {med['torch eval'] / n_ops * 1e6:.1f} us per operator")
        # the rounds in which no other process kept the machine busy beside either side
        quiet = [i for i, (j, p) in enumerate(zip(jax_runs, torch_runs))
                 if max(j["others"], p["others"]) <= OTHERS_BUSY]
        pairs = [("eager train", "torch train"), ("eager eval", "torch eval"),
                 ("graph train", "torch train")]
        for a, b in pairs:
            ratios = [x / y for x, y in zip(per_round[a], per_round[b])]
            line = (f"{tag} {a} / {b}, each round: {' '.join(f'{r:.2f}' for r in ratios)} "
                    f"(median {statistics.median(ratios):.2f}")
            if len(quiet) < len(ratios):
                line += (f"; of the {len(quiet)} rounds not BUSY: "
                         + (f"{statistics.median([ratios[i] for i in quiet]):.2f}" if quiet
                            else "none"))
            print(line + ")")
    return med


def _parse() -> Tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="deep")
    ap.add_argument("--steps", type=int, default=30,
                    help="timed steps of each variant in each round")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of a singa_jax process and a PyTorch process in turns")
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
    # a child process's role and network: ``--child jax|torch NET``
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return ap, ap.parse_args()


def main() -> None:
    _, args = _parse()
    pieces = [int(n) for n in args.pieces.split(",") if n.strip()]
    if args.child:
        role, net_kind = args.child
        if role == "torch":
            torch_child(net_kind, args.batch, args.depth, args.steps, args.torch_threads)
        else:
            jax_child(net_kind, args.batch, args.depth, args.steps, args.gc_freeze, pieces,
                      args.split, args.no_speculation)
        return
    for net_kind in args.nets.split(","):
        bench(net_kind.strip(), args.batch, args.depth, args.steps, args.rounds,
              args.gc_freeze, args.torch_threads, pieces, args.split, args.no_speculation)


if __name__ == "__main__":
    main()
