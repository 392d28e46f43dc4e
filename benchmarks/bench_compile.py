"""First-step times of the example models in graph mode: ``Model.compile()``, the first training
call (trace + XLA compile + run) and the second call (a cached program: the steady state).

Each model runs in a fresh Python process, so nothing compiled by an earlier model (or an
earlier run) is reused except through JAX's persistent compilation cache. With ``--cache cold``
every process gets a new, empty cache folder (a first run on a new machine); ``--cache warm``
runs each model twice over one folder and reports the second run (a re-run of the same
program); ``--cache both`` reports both; ``--cache off`` disables the cache
(``SINGA_JAX_COMPILATION_CACHE=0``).

    python benchmarks/bench_compile.py [--models resnet50,xception] [--batch 8] [--cache both]
                                       [--torch 5] [--repeat 3] [--no-reference]
                                       [--steps 20] [--tiers both]

For the ResNets (18, 50) the reference is a hand-written ``jax.jit`` step of the same network
(benchmarks/resnet_jax.py: JAX's default compile options, parameters from NumPy) whose FIRST
call -- trace, XLA compile, run -- is timed in a fresh process with a cold cache of its own,
right after singa_jax's cold run; "ratio" is singa_jax's ``compile()`` + first call over it
(the first-step target). ``--repeat N`` alternates the two N times (a loaded machine: compare
the ratios of each pair and their median). Times are wall-clock seconds; "cpu" is the
process's CPU time (all its threads), steadier than wall time when other work shares the
machine.

``--steps N`` also times the calls up to the N-th (``to N``: from ``compile()``'s start to the
end of call N; the reference's from its first call's start) -- what a slower first call or a
background compile costs a training loop. ``--tiers on|off|both`` runs singa_jax with tiered
compilation of the step (singa_jax/graph_tiers.py: the first call runs a quickly compiled
program while the optimised one compiles in the background; ``SINGA_JAX_TIERED_COMPILE``),
without, or both, alternating (``both``: the ratios of each). ``--baseline DIR`` adds, in the
same turns, a run of another checkout's singa_jax (its folder put first on ``PYTHONPATH``, e.g.
``git archive HEAD | tar -x -C DIR``): before against after on one loaded machine.

``--unguarded`` adds, in the same turns, a run with the optimizer's non-finite guard off
(``skip_nonfinite = False``, SINGA's update): what the guard costs the first step.

``--torch N`` also times N steps of PyTorch's eager ResNet of the same layers (SGD with
momentum, batch ``--batch``), in its own process, after one warm-up step: the steady step
to compare the "second call" with (ResNets only; skipped without torch).

Models: cnn (LeNet, 28x28), alexnet (224), resnet18/50/101 (224), xception (299), as SINGA's
examples/cnn/model builds them; SGD with momentum, softmax cross-entropy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

from torch_child import child_step_times, print_step_times

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("cnn", "alexnet", "resnet18", "resnet50", "resnet101", "xception")


def _child(name: str, batch: int, steps: int) -> None:
    """Build, compile and run ``steps`` (>= 2) steps of one model; print one JSON line of
    timings."""
    start = time.perf_counter()
    sys.path[:0] = [os.path.join(_ROOT, "examples", "cnn"), os.path.join(_ROOT, "examples")]
    import numpy as np
    import jax
    from singa_jax import device, opt, tensor
    from model import alexnet, cnn, resnet, xceptionnet

    builders = {"cnn": (cnn.create_model, 1, 28), "alexnet": (alexnet.create_model, 3, 224),
                "resnet18": (resnet.resnet18, 3, 224), "resnet50": (resnet.resnet50, 3, 224),
                "resnet101": (resnet.resnet101, 3, 224),
                "xception": (xceptionnet.create_model, 3, 299)}
    create, channels, size = builders[name]
    imported = time.perf_counter()
    device.get_default_device().SetRandSeed(0)
    net = create(num_channels=channels) if name != "cnn" else create(num_channels=channels)
    sgd = opt.SGD(lr=0.01, momentum=0.9)
    sgd.skip_nonfinite = os.environ.get("SINGA_BENCH_UNGUARDED") != "1"
    net.set_optimizer(sgd)
    rng = np.random.default_rng(0)
    x = tensor.from_numpy(rng.standard_normal((batch, channels, size, size)).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 10, batch).astype(np.int32))

    def wait_all() -> None:
        jax.block_until_ready([t.array for t in net.get_states().values()] +
                              [t.array for t in net.optimizer.get_states().values()])

    t0, c0 = time.perf_counter(), time.process_time()
    net.compile([tensor.Tensor((batch, channels, size, size))], is_train=True, use_graph=True)
    wait_all()
    t1, c1 = time.perf_counter(), time.process_time()
    net(x, y)
    wait_all()
    t2, c2 = time.perf_counter(), time.process_time()
    net(x, y)
    wait_all()
    t3 = time.perf_counter()
    for _ in range(steps - 2):
        net(x, y)
    wait_all()
    t4, c4 = time.perf_counter(), time.process_time()
    stats = net.graph_stats()
    print(json.dumps({"model": name, "import": imported - start, "compile": t1 - t0,
                      "first": t2 - t1, "second": t3 - t2, "compile_cpu": c1 - c0,
                      "first_cpu": c2 - c1, "to_n": t4 - t0, "to_n_cpu": c4 - c0,
                      "steps": max(steps, 2), "traces": stats["traces"],
                      "compiles": stats["compiles"],
                      "tiered": stats["tiered"],
                      "programs": stats["programs"]}))


def _torch_child(name: str, batch: int, steps: int) -> None:
    """PyTorch's steps of SINGA's ResNet (benchmarks/resnet_torch.py: torchvision's layers, the
    stride on the 3x3 convolution); prints one JSON list of step times."""
    try:
        import torch
    except ImportError:
        print(json.dumps(None))
        return
    import resnet_torch
    torch.manual_seed(0)
    net = resnet_torch.build({"resnet50": 50, "resnet101": 101}[name])
    sgd = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 10, (batch,))

    def step() -> None:
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        sgd.step()  # synchronous on the CPU: every parameter and slot is updated on return

    print_step_times(step, steps, warmup=1)


def _torch_steps(name: str, batch: int, steps: int) -> list:
    return child_step_times([os.path.abspath(__file__), "--torch-child", name, "--batch",
                             str(batch), "--torch", str(steps)])


# the hand-written jax.jit reference (benchmarks/resnet_jax.py) of these models: their depth
REFERENCE_DEPTHS = {"resnet18": 18, "resnet50": 50}


def _reference(name: str, batch: int, steps: int) -> dict:
    """The hand-written step's first call (and calls up to ``steps``) in a fresh process with
    a new, empty cache."""
    with tempfile.TemporaryDirectory(prefix="jax_xla_") as folder:
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=folder,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
        out = subprocess.run([sys.executable, os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "resnet_jax.py"), "--first-call", "--depth",
            str(REFERENCE_DEPTHS[name]), "--batch", str(batch), "--steps", str(steps)],
            env=env, capture_output=True,
            text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"resnet_jax {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run(name: str, batch: int, cache_dir: str, steps: int, tiers: Optional[str],
         baseline: Optional[str] = None) -> dict:
    env = dict(os.environ)
    env["SINGA_JAX_COMPILATION_CACHE"] = cache_dir
    if tiers == "baseline":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [baseline, env.get("PYTHONPATH")]))
    elif tiers == "unguarded":
        env["SINGA_BENCH_UNGUARDED"] = "1"
    elif tiers is not None:
        env["SINGA_JAX_TIERED_COMPILE"] = "1" if tiers == "on" else "0"
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name,
                          "--batch", str(batch), "--steps", str(steps)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _report(tag: str, r: dict, ref: Optional[dict] = None) -> None:
    line = (f"{r['model']:10s} {tag:8s} compile() {r['compile']:6.2f}s  first call "
            f"{r['first']:6.2f}s  compile+first {r['compile'] + r['first']:6.2f}s "
            f"(cpu {r['compile_cpu'] + r['first_cpu']:6.2f}s)  second call "
            f"{r['second']:6.3f}s  to {r['steps']} {r['to_n']:6.2f}s (cpu {r['to_n_cpu']:6.2f}s)"
            f"  traces {r['traces']} compiles {r['compiles']} tiered {r['tiered']} "
            f"programs {r['programs']}")
    if ref is not None:
        line += (f"  ratio first {(r['compile'] + r['first']) / ref['first']:.2f} (cpu "
                 f"{(r['compile_cpu'] + r['first_cpu']) / ref['first_cpu']:.2f}), to "
                 f"{r['steps']} {r['to_n'] / ref['to_n']:.2f}")
    print(line, flush=True)


def _report_reference(name: str, ref: dict) -> None:
    print(f"{name:10s} jax.jit  first call {ref['first']:6.2f}s (cpu {ref['first_cpu']:6.2f}s)  "
          f"second call {ref['second']:6.3f}s  to {ref['steps']} {ref['to_n']:6.2f}s",
          flush=True)


def _tag(cache: str, tiers: Optional[str]) -> str:
    names = {"on": "tiered", "off": "once", "baseline": "before", "unguarded": "unguard"}
    return cache if tiers is None else f"{cache} {names[tiers]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn,resnet50,xception")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cache", choices=("cold", "warm", "both", "off"), default="both")
    ap.add_argument("--torch", type=int, default=0, metavar="N",
                    help="also time N steps of PyTorch's ResNet (ResNets only)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run each model N times (with its reference, alternating)")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the hand-written jax.jit first call")
    ap.add_argument("--steps", type=int, default=2, metavar="N",
                    help="also time the calls up to the N-th (to N)")
    ap.add_argument("--tiers", choices=("on", "off", "both", "default"), default="default",
                    help="tiered compilation of the step: on, off, both (alternating) or as "
                         "the environment says")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run the singa_jax of this checkout (before/after)")
    ap.add_argument("--unguarded", action="store_true",
                    help="also run singa_jax without the non-finite guard (skip_nonfinite="
                         "False): what the guard costs the first step")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.batch, args.steps)
        return
    if args.torch_child:
        _torch_child(args.torch_child, args.batch, args.torch)
        return
    print(f"batch {args.batch}; each model in a fresh process (seconds)")
    for name in args.models.split(","):
        name = name.strip()
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        variants = {"both": ["on", "off"], "default": [None]}.get(args.tiers, [args.tiers])
        if args.baseline:
            variants.append("baseline")
        if args.unguarded:
            variants.append("unguarded")
        ratios: dict = {v: [] for v in variants}
        for _ in range(args.repeat):
            with_ref = not args.no_reference and name in REFERENCE_DEPTHS and \
                args.cache in ("cold", "both")
            if args.cache == "off":
                for v in variants:
                    _report(_tag("off", v),
                            _run(name, args.batch, "0", args.steps, v, args.baseline))
                continue
            ref = _reference(name, args.batch, args.steps) if with_ref else None
            if ref is not None:
                _report_reference(name, ref)
            for v in variants:
                with tempfile.TemporaryDirectory(prefix="singa_jax_xla_") as folder:
                    cold = _run(name, args.batch, folder, args.steps, v, args.baseline)
                    if args.cache in ("cold", "both"):
                        _report(_tag("cold", v), cold, ref)
                    if ref is not None:
                        ratios[v].append((
                            (cold["compile"] + cold["first"]) / ref["first"],
                            (cold["compile_cpu"] + cold["first_cpu"]) / ref["first_cpu"],
                            cold["to_n"] / ref["to_n"]))
                    if args.cache in ("warm", "both"):
                        _report(_tag("warm", v), _run(name, args.batch, folder, args.steps, v,
                                                      args.baseline))
        for v, rs in ratios.items():
            if len(rs) > 1:
                print(f"{name:10s} {_tag('', v).strip():8s} first step / jax.jit's first call: "
                      f"median {statistics.median(r[0] for r in rs):.2f} wall, "
                      f"{statistics.median(r[1] for r in rs):.2f} cpu; to {args.steps}: "
                      f"{statistics.median(r[2] for r in rs):.2f} ({len(rs)} runs)", flush=True)
        if args.torch and name in ("resnet50", "resnet101"):
            steps = _torch_steps(name, args.batch, args.torch)
            if steps:
                print(f"{name:10s} PyTorch step: median {statistics.median(steps):.3f}s "
                      f"({', '.join(f'{t:.2f}' for t in steps)})", flush=True)
            else:
                print(f"{name:10s} PyTorch not installed: skipped", flush=True)


if __name__ == "__main__":
    main()
