"""What a training step holds at its peak: graph mode, graph mode with rematerialisation, eager
mode (replayed), and PyTorch eager, for SINGA's ResNet-50 (``examples/cnn``) and a
GPT-2-small-like Transformer (``benchmarks/transformer.py``); and, on a GPU, the largest batch
that trains.

Every variant runs in a process of its own (a device's peak is per process; PyTorch never
shares a process with JAX). Reported per variant:

* on a GPU or TPU: the device's peak bytes in use over the steps (``memory_stats``;
  PyTorch: ``torch.cuda.max_memory_allocated``) and the median step time;
* on the CPU, where XLA reports no peak: the compiled step's own memory analysis --
  arguments, outputs, temporaries (what the step allocates besides its inputs and outputs),
  aliased bytes (donated state updated in place) -- and the median step time; for eager mode,
  the analysis of the largest program eager replay ran the step as (``debug.stats()``: on
  the CPU a convolutional network's forward is one program whose outputs are the residuals,
  and its backward runs op by op; a step of fewer than 32 operators, as a rematerialised
  network's, runs op by op and has no program to analyse); an array read at two points of the
  step (a parameter read by the forward and by the update) is one of its arguments twice
  there. PyTorch: time only.

``--largest`` searches the largest batch that trains (doubling, then bisecting) under the
memory cap ``--cap-gib`` (JAX: ``XLA_PYTHON_CLIENT_MEM_FRACTION``; PyTorch:
``torch.cuda.set_per_process_memory_fraction``); GPU only.

    python benchmarks/bench_memory.py [--models resnet50,gpt] [--batch 8] [--steps 3]
        [--input-size 224] [--seq 128] [--vocab 8192] [--policies none,nothing]
        [--eager] [--torch] [--largest] [--cap-gib 16]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# --- a child: one variant, one batch size ------------------------------------------------------
def _singa_child(a: argparse.Namespace) -> Dict[str, Any]:
    import jax
    import numpy as np
    sys.path[:0] = [HERE, os.path.join(ROOT, "examples", "cnn")]
    from singa_jax import debug, device, model, opt, tensor
    dev = device.get_default_device()
    r = np.random.default_rng(0)
    if a.model == "resnet50":
        from model.resnet import resnet50
        net = resnet50(num_classes=10, input_size=a.input_size)
        x = r.normal(size=(a.batch, 3, a.input_size, a.input_size)).astype(np.float32)
        y = r.integers(0, 10, a.batch).astype(np.int32)
    else:
        from transformer import gpt
        net = gpt("gpt2-small", vocab=a.vocab, seq=a.seq)
        x = r.integers(0, a.vocab, (a.batch, a.seq)).astype(np.int32)
        y = r.integers(0, a.vocab, (a.batch, a.seq)).astype(np.int32)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
    tx.to_device(dev)
    ty.to_device(dev)
    net.set_optimizer(opt.SGD(lr=0.01, momentum=0.9))
    policy = None if a.policy == "none" else a.policy
    net.compile([tx], is_train=True, use_graph=a.graph == 1, remat=policy)
    times: List[float] = []
    try:
        for _ in range(a.steps + 1):
            start = time.perf_counter()
            _, loss = net(tx, ty)
            jax.block_until_ready([loss.array] + [t.array for t in net.get_states().values()])
            times.append(time.perf_counter() - start)
    except model.DeviceMemoryError as e:
        return {"ok": False, "error": str(e).splitlines()[0]}
    result: Dict[str, Any] = {"ok": True, "step_s": statistics.median(times[1:])}
    found = debug.stats()
    steps = found["graph_steps"]
    programs = found["replay_programs"]  # (eager: the step ran as one or a few programs)
    if steps:
        result.update(next(iter(steps.values())))
    elif programs:  # the one holding the most (a forward's residuals may be its outputs)
        result.update(max(programs, key=lambda m: m["argument_bytes"] + m["output_bytes"] +
                          m["temp_bytes"]))
    result["replay_programs"] = len(programs)
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        result["peak_bytes"] = int(stats["peak_bytes_in_use"])
    return result


def _torch_child(a: argparse.Namespace) -> Dict[str, Any]:
    import torch
    sys.path.insert(0, HERE)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    if cuda and a.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_gib * 2 ** 30 / total))
    if a.model == "resnet50":
        import resnet_torch
        net = resnet_torch.build(50).to(dev)
        x = torch.randn(a.batch, 3, a.input_size, a.input_size, device=dev)
        y = torch.randint(0, 10, (a.batch,), device=dev)
    else:
        net = _torch_gpt(a.vocab, a.seq).to(dev)
        x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    times = []
    try:
        for _ in range(a.steps + 1):
            start = time.perf_counter()
            sgd.zero_grad()
            out = net(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                     y.reshape(-1))
            loss.backward()
            sgd.step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    except torch.cuda.OutOfMemoryError as e:
        return {"ok": False, "error": str(e).splitlines()[0]}
    result = {"ok": True, "step_s": statistics.median(times[1:])}
    if cuda:
        result["peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return result


def _torch_gpt(vocab: int, seq: int) -> Any:
    """The Transformer of transformer.py in PyTorch (GPT-2 small's width, heads, depth)."""
    import torch
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=True)
            self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
            return x + self.ff(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, d: int = 768, heads: int = 12, layers: int = 12):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
            return self.head(self.ln(self.blocks(x)))

    return GPT()


# --- the parent ---------------------------------------------------------------------------------
def _run(a: argparse.Namespace, framework: str, model_name: str, policy: str, batch: int,
         graph: bool = True) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", framework, "--model",
           model_name, "--policy", policy, "--graph", str(int(graph)), "--batch", str(batch),
           "--steps", str(a.steps),
           "--input-size", str(a.input_size), "--seq", str(a.seq), "--vocab", str(a.vocab),
           "--cap-gib", str(a.cap_gib or 0)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                   os.environ.get("PYTHONPATH")])))
    if a.cap_gib and framework == "singa_jax":
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{_fraction(a.cap_gib):.4f}"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"ok": False, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(lines[-1])


_PROBE = ("import json, jax; s = jax.local_devices()[0].memory_stats() or {}; "
          "print(json.dumps(s.get('bytes_limit')))")


@functools.lru_cache(maxsize=None)
def _device_bytes() -> Optional[int]:
    """The device's memory in bytes (None where JAX reports none: the CPU), asked in a process
    of its own -- this one must not hold a device: JAX would reserve most of its memory here --
    with nothing reserved and the whole device allowed, so that its allocator's limit is the
    device's memory."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_PYTHON_CLIENT_MEM_FRACTION="1.0")
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         env=env).stdout.strip().splitlines()
    return json.loads(out[-1]) if out else None


def _fraction(cap_gib: float) -> float:
    """``XLA_PYTHON_CLIENT_MEM_FRACTION`` for a cap of ``cap_gib``: its share of the device's
    whole memory."""
    return min(1.0, cap_gib * 2 ** 30 / (_device_bytes() or cap_gib * 2 ** 30))


def _largest(a: argparse.Namespace, framework: str, model_name: str, policy: str,
             start: int, graph: bool) -> int:
    """The largest batch that trains: doubling from ``start``, then bisecting."""
    good, bad = 0, None
    batch = start
    while bad is None and batch <= 1 << 14:
        if _run(a, framework, model_name, policy, batch, graph)["ok"]:
            good, batch = batch, batch * 2
        else:
            bad = batch
    while bad is not None and bad - good > max(1, good // 16):
        mid = (good + bad) // 2
        if _run(a, framework, model_name, policy, mid, graph)["ok"]:
            good = mid
        else:
            bad = mid
    return good


def _mib(v: Optional[int]) -> str:
    return "-" if v is None else f"{v / 2 ** 20:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet50,gpt")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--input-size", type=int, default=224)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--policies", default="none,nothing")
    p.add_argument("--eager", action="store_true", help="singa_jax eager mode (replayed) too")
    p.add_argument("--torch", action="store_true", help="PyTorch eager too")
    p.add_argument("--largest", action="store_true", help="search the largest batch (GPU)")
    p.add_argument("--cap-gib", type=float, default=0.0, help="memory cap for --largest")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    p.add_argument("--policy", default="none", help=argparse.SUPPRESS)
    p.add_argument("--graph", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        result = (_singa_child if a.child == "singa_jax" else _torch_child)(a)
        print(json.dumps(result), flush=True)
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"batch {a.batch}, {a.steps} steps, ResNet-50 at {a.input_size}x{a.input_size}, GPT "
          f"seq {a.seq} vocab {a.vocab}; load average {load:.2f}")
    header = (f"{'model':9} {'variant':20} {'step s':>7} {'peak MiB':>9} {'args MiB':>9} "
              f"{'out MiB':>8} {'temp MiB':>9} {'alias MiB':>9}")
    print(header)
    for model_name in a.models.split(","):
        variants = [("singa_jax", pol, True) for pol in a.policies.split(",")]
        if a.eager:
            variants += [("singa_jax", pol, False) for pol in a.policies.split(",")]
        if a.torch:
            variants.append(("torch", "none", False))
        plain_temp = plain_time = None
        for framework, policy, graph in variants:
            r = _run(a, framework, model_name, policy, a.batch, graph)
            mode = "graph" if graph else "eager"
            name = "pytorch eager" if framework == "torch" else (
                mode if policy == "none" else f"{mode} remat={policy}")
            if not r.get("ok"):
                print(f"{model_name:9} {name:20} failed: {r.get('error')}")
                continue
            extra = ""
            if framework == "singa_jax" and policy == "none" and graph:
                plain_temp, plain_time = r.get("temp_bytes"), r["step_s"]
            elif framework == "singa_jax" and graph and plain_temp:
                extra = (f"  temp {r.get('temp_bytes', 0) / plain_temp:.2f}x, time "
                         f"{r['step_s'] / plain_time:.2f}x of graph")
            elif framework == "singa_jax":
                programs = r.get("replay_programs", 0)
                extra = (f"  the largest of {programs} replay programs" if programs else
                         "  run op by op: no program to analyse") + (
                    f", time {r['step_s'] / plain_time:.2f}x of graph" if plain_time else "")
            print(f"{model_name:9} {name:20} {r['step_s']:7.3f} {_mib(r.get('peak_bytes')):>9} "
                  f"{_mib(r.get('argument_bytes')):>9} {_mib(r.get('output_bytes')):>8} "
                  f"{_mib(r.get('temp_bytes')):>9} {_mib(r.get('alias_bytes')):>9}{extra}",
                  flush=True)
            if a.largest:
                print(f"{'':9} {name:20} largest batch: "
                      f"{_largest(a, framework, model_name, policy, a.batch, graph)}",
                      flush=True)


if __name__ == "__main__":
    main()
