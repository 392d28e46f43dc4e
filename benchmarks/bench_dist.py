"""Data-parallel throughput of SINGA's LeNet CNN (examples/cnn/model/cnn.py) with opt.DistOpt,
graph mode, SGD with momentum, on simulated CPU devices:

* 1 process x 1, 2 and 4 devices (``--xla_force_host_platform_device_count``; one rank whose
  batch is split over its devices, one SPMD program),
* 2 processes x 1 device (two ranks over loopback, gloo all-reduce).

Weak scaling: every device gets ``--per-device-batch`` images, so a step of D devices trains
D times as many images. Each configuration runs in its own process(es) (the device count is
fixed when JAX starts); the median step time after warm-up is reported. Usage::

    python benchmarks/bench_dist.py [--steps 30] [--per-device-batch 32]
    python benchmarks/bench_dist.py --collectives [--devices 4]

``--collectives`` reports instead, for each DistOpt option (and ``shard_optimizer_state``,
ZeRO-1, and ``shard_parameters``, FSDP), the collectives of the compiled step read from its HLO
(``opt.spmd.collectives``): per kind and dtype the bytes each device hands to them per step, the
optimizer-state and parameter bytes per device, and the median step time of each (all in one
process, so the times compare with each other).

On a CPU host the "devices" share the same cores, so this measures the overhead of the SPMD
program and of the collectives rather than a speed-up; see docs/distributed.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = textwrap.dedent('''
    import json, multiprocessing, os, statistics, sys, time
    import numpy as np
    sys.path[:0] = [os.path.join(REPO, "examples", "cnn"), os.path.join(REPO, "examples")]

    def rank_main(rank, world, holder, steps, per_device, out):
        from singa_jax import device, opt, tensor
        from model.cnn import CNN
        sgd = opt.SGD(lr=0.05, momentum=0.9)
        dist = (opt.DistOpt(sgd, nccl_id=holder, local_rank=rank, world_size=world)
                if holder is not None else opt.DistOpt(sgd))
        import jax
        local = len(jax.local_devices())
        batch = per_device * local
        dev = device.get_default_device()
        dev.SetRandSeed(0)
        net = CNN()
        rng = np.random.RandomState(rank)
        x = rng.randn(batch, 1, 28, 28).astype(np.float32)
        y = rng.randint(0, 10, batch).astype(np.int32)
        tx, ty = tensor.from_numpy(x, dev), tensor.from_numpy(y, dev)
        net.set_optimizer(dist)
        net.compile([tx], is_train=True, use_graph=True)
        times = []
        for step in range(steps + 3):
            start = time.perf_counter()
            _, loss = net(tx, ty)
            tensor.to_numpy(loss)  # waits for the step
            times.append(time.perf_counter() - start)
        median = statistics.median(times[3:])
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"step_ms": median * 1e3,
                           "images_per_s": batch * world / median,
                           "loss": float(tensor.to_numpy(loss).reshape(-1)[0])}, f)

    if __name__ == "__main__":
        world, steps, per_device, out = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                         sys.argv[4])
        if world == 1:
            rank_main(0, 1, None, steps, per_device, out)
        else:
            from singa_jax.singa_wrap import NcclIdHolder
            holder = NcclIdHolder()
            procs = [multiprocessing.get_context("fork").Process(
                target=rank_main, args=(r, world, holder, steps, per_device, out))
                for r in range(world)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
''')


COLLECTIVES = textwrap.dedent('''
    import sys, os, statistics, time
    sys.path[:0] = [os.path.join(REPO, "examples", "cnn"), os.path.join(REPO, "examples")]
    import numpy as np
    from singa_jax import device, opt, tensor
    from singa_jax._src.dist import spmd
    from model.cnn import CNN
    import jax

    def per_device_bytes(arrays):
        return max(sum(s.data.nbytes for a in arrays for s in a.addressable_shards
                       if s.device == d) for d in jax.local_devices())

    for option, level in [("plain", 0), ("half", 0), ("sparseTopK", 0),
                          ("plain", 1), ("half", 1), ("plain", 2), ("half", 2)]:
        dist = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9), shard_optimizer_state=level >= 1,
                           shard_parameters=level == 2)
        dev = device.get_default_device()
        net = CNN()
        n = 4 * jax.local_device_count()
        x = tensor.from_numpy(np.random.RandomState(0).randn(n, 1, 28, 28).astype(np.float32))
        y = tensor.from_numpy(np.zeros(n, np.int32))
        net.set_optimizer(dist)
        net.compile([x], is_train=True, use_graph=True)
        times = []
        for _ in range(2 + STEPS):
            start = time.perf_counter()
            _, loss = net(x, y, option, 0.05)
            tensor.to_numpy(loss)  # waits for the step
            times.append(time.perf_counter() - start)
        kinds = {}
        for c in spmd.collectives(dist._spmd.last_compiled.as_text()):
            k = c["kind"] + " " + "/".join(c["dtypes"])
            kinds[k] = kinds.get(k, 0) + c["bytes"]
        slots = [t.array for k, t in dist.get_states().items() if k != "step_counter"]
        params = [p.array for p in net.get_params().values()]
        grads = sum(a.nbytes for a in params)
        name = option + ["", " +shard_optimizer_state", " +shard_parameters"][level]
        print(f"{name:>28}  step {statistics.median(times[2:]) * 1e3:.1f} ms  parameters "
              f"{grads} B, {per_device_bytes(params)} B per device  optimizer state "
              f"{sum(a.nbytes for a in slots)} B, {per_device_bytes(slots)} B per device  " +
              ", ".join(f"{k}: {v} B" for k, v in sorted(kinds.items())), flush=True)
''')


def collectives(devices: int, steps: int) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    print(f"LeNet CNN, 1 process x {devices} devices: collectives per step and device (HLO)")
    subprocess.run([sys.executable, "-c", f"REPO = {REPO!r}\nSTEPS = {steps}\n" + COLLECTIVES],
                   env=env, check=True, timeout=900)


def run_config(processes: int, devices: int, steps: int, per_device: int) -> dict:
    out = os.path.join(os.path.abspath(os.curdir), f".bench_dist_{processes}x{devices}.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    code = f"REPO = {REPO!r}\n" + WORKER
    subprocess.run([sys.executable, "-c", code, str(processes), str(steps), str(per_device),
                    out], env=env, check=True, timeout=900)
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-device-batch", type=int, default=32)
    parser.add_argument("--collectives", action="store_true",
                        help="report each option's collectives (from the HLO) instead")
    parser.add_argument("--devices", type=int, default=4)
    args = parser.parse_args(argv)
    if args.collectives:
        collectives(args.devices, args.steps)
        return
    configs = [(1, 1), (1, 2), (1, 4), (2, 1)]
    print(f"LeNet CNN, graph mode, {args.per_device_batch} images per device, "
          f"median of {args.steps} steps, {os.cpu_count()} CPU cores")
    print(f"{'processes x devices':>20} {'step (ms)':>10} {'images/s':>10} {'vs 1x1':>8}")
    base = None
    for processes, devices in configs:
        r = run_config(processes, devices, args.steps, args.per_device_batch)
        base = base or r["images_per_s"]
        print(f"{f'{processes} x {devices}':>20} {r['step_ms']:>10.1f} "
              f"{r['images_per_s']:>10.0f} {r['images_per_s'] / base:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
