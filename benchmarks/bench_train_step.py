"""Time one training step: singa_jax graph mode vs eager mode (with eager replay, the default, and
op by op) vs a hand-written ``jax.jit`` step
(vs PyTorch eager where installed), on SINGA's MLP (784-256-10) and LeNet CNN
(examples/cnn/model/cnn.py), batch 64, SGD with momentum.

Besides the defaults, "graph unguarded" is graph mode with ``skip_nonfinite=False`` (SINGA's
update, no NaN guard) and "jax.jit guarded" the hand-written step with the same guard as
singa_jax's default, so each is also compared with a hand-written step doing the same work.

Every timed step waits for ALL of its state -- parameters, buffers and optimizer slots, not only
the loss -- since JAX dispatches asynchronously and work left running would be billed to the
next variant. The JAX variants run in one process, taking turns in short blocks of steps
(25 MLP / 5 CNN steps: a training loop runs one model's steps back to back); PyTorch runs in
its own process (in one process JAX's CPU threads starve torch's), in ``--rounds`` blocks
alternating with the JAX blocks, so a noisy shared machine affects every variant alike. Medians
are reported, with the ratios the performance page quotes. Usage::

    python benchmarks/bench_train_step.py [--steps N] [--batch 64] [--nets mlp,cnn] [--rounds 3]
                                          [--autocast bfloat16|float16]

``--autocast DTYPE`` runs every variant in mixed precision: the singa_jax models compiled with
``autocast=DTYPE``, the hand-written steps computing their products in DTYPE from float32
parameters (logits cast to float32 for the loss), PyTorch under ``torch.autocast`` (float16
without a GradScaler: the step time, not the numbers, is compared).

``--steps`` (per variant, over all rounds) defaults to 600 for the MLP (a ~1 ms step, where a
few microseconds of noise are a visible ratio) and 60 for the CNN.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from typing import Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from singa_jax import autograd, device, layer, model, opt, tensor
from torch_child import child_step_times, print_step_times

LR, MOMENTUM = 0.05, 0.9
AUTOCAST = None  # --autocast: the compute dtype's name, or None (float32)
DEFAULT_STEPS = {"mlp": 600, "cnn": 60}
# Steps each JAX variant runs back to back before the next variant's turn. A training loop runs
# one model's steps back to back; interleaving single steps billed each variant the others'
# cache and heap footprint (eager MLP 5-20% slower interleaved than in blocks, measured).
BLOCK_STEPS = {"mlp": 25, "cnn": 5}


# --- the networks, SINGA style: the examples' own model classes ---------------------------------
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path[:0] = [os.path.join(_EXAMPLES, "cnn"), _EXAMPLES]
from common.classifier import Classifier  # noqa: E402  (softmax cross-entropy train_one_batch)
from model.cnn import CNN  # noqa: E402  (SINGA's examples/cnn/model/cnn.py, LeNet-style)


class MLP(Classifier):
    """784-256-10 with ReLU, trained like every example classifier."""

    def __init__(self, hidden=256, num_classes=10):
        super().__init__(num_classes=num_classes, input_size=784, dimension=2)
        self.linear1 = layer.Linear(hidden)
        self.relu = layer.ReLU()
        self.linear2 = layer.Linear(num_classes)

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))


# --- the same networks, hand-written in JAX ------------------------------------------------------
def mlp_apply(params, x):
    w1, b1, w2, b2 = params
    return jax.nn.relu(x @ w1 + b1) @ w2 + b2


def _conv_relu(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return jax.nn.relu(y + b[None, :, None, None])


def _maxpool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def cnn_apply(params, x):
    cw1, cb1, cw2, cb2, w1, b1, w2, b2 = params
    y = _maxpool(_conv_relu(x, cw1, cb1))
    y = _maxpool(_conv_relu(y, cw2, cb2))
    y = jax.nn.relu(y.reshape(y.shape[0], -1) @ w1 + b1)
    return y @ w2 + b2


def make_jax_step(apply: Callable, guarded: bool = False):
    """SINGA's SGD-momentum rule (v = m v + g; p -= lr v) on softmax cross-entropy. With
    ``guarded`` the update is skipped when the loss or a gradient is not finite, as singa_jax's
    default ``skip_nonfinite`` does (a cond on the finiteness of the sum of every gradient)."""

    def loss_fn(params, x, y):
        if AUTOCAST is not None:  # products in the compute dtype, float32 master parameters
            params, x = [p.astype(AUTOCAST) for p in params], x.astype(AUTOCAST)
        logp = jax.nn.log_softmax(apply(params, x).astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def update(params, moments, grads):
        moments = [MOMENTUM * v + g for v, g in zip(moments, grads)]
        return [p - LR * v for p, v in zip(params, moments)], moments

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params, moments, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        if not guarded:
            return (*update(params, moments, grads), loss)
        ok = jnp.isfinite(sum(jnp.sum(g) for g in grads) + loss)
        params, moments = jax.lax.cond(ok, lambda: update(params, moments, grads),
                                       lambda: (params, moments))
        return params, moments, loss

    return step


def jax_params(net: model.Model, names: List[str]):
    states = net.get_states()
    return [jnp.array(states[n].array) for n in names]


# --- PyTorch, when installed, in its own process -------------------------------------------
def torch_step_fn(kind: str, batch: int):
    """A PyTorch eager step of the same network (None without torch); it returns when done
    (``loss.item()`` waits for the step; the CPU update of the parameters is synchronous)."""
    try:
        import torch
    except ImportError:
        return None
    nn = torch.nn
    if kind == "mlp":
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))
    where = "cuda" if torch.cuda.is_available() else "cpu"
    net = net.to(where)
    sgd = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    shape = (batch, 784) if kind == "mlp" else (batch, 1, 28, 28)
    x, y = torch.randn(*shape, device=where), torch.randint(0, 10, (batch,), device=where)
    cast = getattr(torch, AUTOCAST) if AUTOCAST else None

    def step():
        sgd.zero_grad()
        with torch.autocast(where, dtype=cast, enabled=cast is not None):
            loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        sgd.step()
        return loss.item()

    return step


def _torch_child(kind: str, batch: int, steps: int) -> None:
    step = torch_step_fn(kind, batch)
    if step is None:
        print(json.dumps(None))
        return
    print_step_times(step, steps)


def torch_times(kind: str, batch: int, steps: int) -> List[float]:
    """Step times of PyTorch in a fresh process ([] when torch is not installed)."""
    return child_step_times([os.path.abspath(__file__), "--torch-child", kind, "--batch",
                             str(batch), "--steps", str(steps)]
                            + (["--autocast", AUTOCAST] if AUTOCAST else []))


# --- timing --------------------------------------------------------------------------------
def build(kind: str, batch: int, use_graph: bool, seed: int = 0, guarded: bool = True):
    device.get_default_device().SetRandSeed(seed)
    net = MLP() if kind == "mlp" else CNN()
    net.set_optimizer(opt.SGD(lr=LR, momentum=MOMENTUM))
    net.optimizer.skip_nonfinite = guarded
    shape = (batch, 784) if kind == "mlp" else (batch, 1, 28, 28)
    net.compile([tensor.Tensor(shape)], is_train=True, use_graph=use_graph, autocast=AUTOCAST)
    return net, shape


def state_tensors(net: model.Model) -> list:
    """Every Tensor of the model's state: parameters, buffers and optimizer slots (the same
    objects from step to step: both modes rebind their arrays)."""
    return list(net.get_states().values()) + list(net.optimizer.get_states().values())


def bench(kind: str, batch: int, steps: int, rounds: int) -> Dict[str, float]:
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    graph_net, shape = build(kind, batch, True)
    graph_compile = time.perf_counter() - t0
    eager_net, _ = build(kind, batch, False)
    bare_net, _ = build(kind, batch, True, guarded=False)  # skip_nonfinite off: SINGA's update
    x_np = rng.standard_normal(shape).astype(np.float32)
    y_np = rng.integers(0, 10, batch).astype(np.int32)
    x, y = tensor.from_numpy(x_np), tensor.from_numpy(y_np)
    xj, yj = jnp.asarray(x_np), jnp.asarray(y_np)

    names = list(graph_net.get_params())
    order = (["linear1.W", "linear1.b", "linear2.W", "linear2.b"] if kind == "mlp" else
             ["conv1.W", "conv1.b", "conv2.W", "conv2.b", "linear1.W", "linear1.b",
              "linear2.W", "linear2.b"])
    assert set(order) == set(names), (order, names)
    jstep = make_jax_step(mlp_apply if kind == "mlp" else cnn_apply)
    jstep_guarded = make_jax_step(mlp_apply if kind == "mlp" else cnn_apply, guarded=True)
    jp = jax_params(graph_net, order)
    jm = [jnp.zeros_like(p) for p in jp]
    jpg, jmg = [jnp.array(p) for p in jp], [jnp.zeros_like(p) for p in jp]

    held = {}  # state Tensors of each model, listed once its optimizer slots exist

    def graph_step():
        _, loss = graph_net(x, y)
        jax.block_until_ready([loss.array] + [t.array for t in held["graph"]])

    def eager_step():
        _, loss = eager_net(x, y)
        jax.block_until_ready([loss.array] + [t.array for t in held["eager"]])

    def bare_step():
        _, loss = bare_net(x, y)
        jax.block_until_ready([loss.array] + [t.array for t in held["bare"]])

    def jax_stepper(step: Callable, params: list, moments: list) -> Callable[[], None]:
        state = {"p": params, "m": moments}

        def run():
            state["p"], state["m"], loss = step(state["p"], state["m"], xj, yj)
            jax.block_until_ready((loss, state["p"], state["m"]))

        return run

    jax_step = jax_stepper(jstep, jp, jm)
    jax_step_guarded = jax_stepper(jstep_guarded, jpg, jmg)

    held["graph"], held["eager"] = state_tensors(graph_net), state_tensors(eager_net)
    held["bare"] = state_tensors(bare_net)
    bare_step()
    held["bare"] = state_tensors(bare_net)  # now with the optimizer's slots
    t0 = time.perf_counter()
    graph_step()
    first = time.perf_counter() - t0
    held["graph"] = state_tensors(graph_net)  # now with the optimizer's slots
    t0 = time.perf_counter()
    graph_step()
    second = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax_step()
    jax_first = time.perf_counter() - t0
    eager_step()
    held["eager"] = state_tensors(eager_net)
    stats = graph_net.graph_stats()
    print(f"[{kind}] graph mode first step: compile() {graph_compile:.3f}s, first call "
          f"{first:.3f}s ({stats['traces']} trace(s), {stats['compiles']} XLA compile(s)), "
          f"second call {second * 1e3:.1f} ms; hand-written jax.jit first call {jax_first:.3f}s")

    variants = {"graph": graph_step, "eager": eager_step,
                "eager op-by-op": autograd.eager_replay(False)(eager_step), "jax.jit": jax_step,
                "graph unguarded": bare_step, "jax.jit guarded": jax_step_guarded}
    for fn in variants.values():  # warm-up
        for _ in range(3):
            fn()
    times: Dict[str, List[float]] = {k: [] for k in variants}
    torch_steps: List[float] = []
    per_round = max(1, steps // rounds)
    block = max(1, min(BLOCK_STEPS[kind], per_round))
    for _ in range(rounds):
        for _ in range(max(1, per_round // block)):
            for name, fn in variants.items():  # a block of each variant's steps, in turn
                for _ in range(block):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
        torch_steps += torch_times(kind, batch, per_round)
    if torch_steps:
        times["torch eager"] = torch_steps
    else:
        print(f"[{kind}] PyTorch not installed: skipping the torch eager variant")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"[{kind}] {k:16s} median {v * 1e3:8.3f} ms/step")
    print(f"[{kind}] eager (replay) / eager op-by-op = "
          f"{med['eager'] / med['eager op-by-op']:.3f}")
    print(f"[{kind}] graph / jax.jit = {med['graph'] / med['jax.jit']:.3f}   "
          f"eager / jax.jit = {med['eager'] / med['jax.jit']:.3f}")
    print(f"[{kind}] same work: graph / jax.jit guarded = "
          f"{med['graph'] / med['jax.jit guarded']:.3f}   graph unguarded / jax.jit = "
          f"{med['graph unguarded'] / med['jax.jit']:.3f}")
    if "torch eager" in med:
        print(f"[{kind}] graph / torch = {med['graph'] / med['torch eager']:.3f}   "
              f"eager / torch = {med['eager'] / med['torch eager']:.3f}   "
              f"jax.jit / torch = {med['jax.jit'] / med['torch eager']:.3f}")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="default: mlp 600, cnn 60")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nets", default="mlp,cnn")
    ap.add_argument("--rounds", type=int, default=3,
                    help="JAX blocks alternating with PyTorch processes")
    ap.add_argument("--autocast", choices=["bfloat16", "float16"], default=None,
                    help="mixed precision in every variant (see the module doc)")
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global AUTOCAST
    AUTOCAST = args.autocast
    if args.torch_child:
        _torch_child(args.torch_child, args.batch, args.steps)
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch {args.batch}"
          + (f"; autocast {AUTOCAST}" if AUTOCAST else ""))
    for kind in args.nets.split(","):
        kind = kind.strip()
        steps = args.steps or DEFAULT_STEPS[kind]
        print(f"[{kind}] {steps} steps per variant, in turns of {BLOCK_STEPS[kind]}")
        bench(kind, args.batch, steps, args.rounds)


if __name__ == "__main__":
    main()
