"""A hand-written ``jax.jit`` ResNet (18 or 50): the reference singa_jax's first step and steady
step are measured against.

The architecture is that of ``examples/cnn/model/resnet.py`` (SINGA's, after torchvision):
7x7/2 convolution, batch norm, ReLU, 3x3/2 max pooling (padding 1), four stages of basic (18)
or bottleneck (50) blocks with the stride on the 3x3 convolution and a 1x1 strided
convolution + batch norm shortcut where the shape changes, average pooling over the final
feature map, a linear layer; no convolution has a bias. Training is softmax cross-entropy and
SINGA's SGD with momentum (``buf = momentum * buf + g; p -= lr * buf``), batch norm with SINGA's
running update (``running = (1 - m) * running + m * batch``, m = 0.9, the unbiased batch
variance into ``running_var``, eps 1e-5).

Parameters and batch-norm statistics are flat dicts keyed by singa_jax's names
(``conv1.W``, ``BasicBlock_2.downsample.bn.scale``, ...), so they can be initialised from a
compiled singa_jax model (:func:`state_from`) or from NumPy (:func:`random_state`, no XLA
program run: a fresh process's first call then compiles only the step).

``dtype='bfloat16'`` computes convolutions, the linear layer, ReLU and pooling in bfloat16 from
float32 parameters (batch norm and the loss in float32, gradients and the update in float32):
the mixed-precision comparison.

    python benchmarks/resnet_jax.py --check [--depth 18] [--batch 2]
    python benchmarks/resnet_jax.py --first-call [--depth 18] [--batch 2] [--dtype bfloat16]
                                    [--steps 20]

``--check`` runs one step here and one in singa_jax's graph mode from the same parameters and
batch and compares the loss, every parameter, running statistic and momentum buffer (1e-4 on
CPU). ``--first-call`` prints one JSON line: the hand-written step's first call (trace, XLA
compile, run) and second call, in this process, and with ``--steps N`` the time from the first
call's start to the end of call N (benchmarks/bench_compile.py runs it in a fresh process with a
cold compilation cache).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# depth -> (block kind, blocks per stage, expansion)
CONFIGS = {18: ("BasicBlock", (2, 2, 2, 2), 1), 50: ("Bottleneck", (3, 4, 6, 3), 4)}
BN_MOMENTUM, BN_EPS = 0.9, 1e-5
LR, MOMENTUM = 0.01, 0.9


# --- the architecture as a list of layers with singa_jax's names --------------------------------
def _block_specs(depth: int) -> List[Dict[str, Any]]:
    """Each residual block: its name, convolutions ``(out, in, k, stride, pad)`` and, where the
    shape changes, its shortcut ``(out, in, stride)``."""
    kind, counts, expansion = CONFIGS[depth]
    blocks, inplanes, index = [], 64, 0
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), counts)):
        for j in range(count):
            stride = 2 if stage and not j else 1
            if kind == "BasicBlock":
                convs = [(planes, inplanes, 3, stride, 1), (planes, planes, 3, 1, 1)]
            else:
                convs = [(planes, inplanes, 1, 1, 0), (planes, planes, 3, stride, 1),
                         (planes * 4, planes, 1, 1, 0)]
            out = planes * expansion
            down = (out, inplanes, stride) if j == 0 and (stride != 1 or inplanes != out) \
                else None
            blocks.append({"name": f"{kind}_{index}", "convs": convs, "down": down})
            inplanes, index = out, index + 1
    return blocks


def shapes(depth: int, num_classes: int = 10, channels: int = 3
           ) -> Tuple[Dict[str, Tuple[int, ...]], Dict[str, Tuple[int, ...]]]:
    """``(parameter shapes, batch-norm statistic shapes)`` keyed by singa_jax's names."""
    params: Dict[str, Tuple[int, ...]] = {"conv1.W": (64, channels, 7, 7)}
    stats: Dict[str, Tuple[int, ...]] = {}

    def bn(prefix: str, c: int) -> None:
        params[f"{prefix}.scale"] = params[f"{prefix}.bias"] = (c,)
        stats[f"{prefix}.running_mean"] = stats[f"{prefix}.running_var"] = (c,)

    bn("bn1", 64)
    width = 64
    for block in _block_specs(depth):
        n = len(block["convs"])
        for j, (out, cin, k, _, _) in enumerate(block["convs"]):
            params[f"{block['name']}.Conv2d_{j}.W"] = (out, cin, k, k)
            bn(f"{block['name']}.BatchNorm2d_{n + j}", out)
            width = out
        if block["down"] is not None:
            out, cin, _ = block["down"]
            params[f"{block['name']}.downsample.conv.W"] = (out, cin, 1, 1)
            bn(f"{block['name']}.downsample.bn", out)
    params["fc.W"], params["fc.b"] = (width, num_classes), (num_classes,)
    return params, stats


# --- the step ------------------------------------------------------------------------------------
def _conv(x, w, stride: int, pad: int, dtype):
    from jax import lax
    return lax.conv_general_dilated(x.astype(dtype), w.astype(dtype), (stride, stride),
                                    [(pad, pad), (pad, pad)],
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


def _batchnorm(x, scale, bias, mean_run, var_run, training: bool):
    """SINGA's batch norm, computed in float32, returned in ``x``'s dtype; the new statistics."""
    import jax.numpy as jnp
    from jax import lax
    xf = x.astype(jnp.float32)
    if training:
        mean = jnp.mean(xf, axis=(0, 2, 3))
        var = jnp.mean(jnp.square(xf - mean[None, :, None, None]), axis=(0, 2, 3))
    else:
        mean, var = mean_run, var_run
    inv = lax.rsqrt(var + BN_EPS)
    y = (xf - mean[None, :, None, None]) * (inv * scale)[None, :, None, None] + \
        bias[None, :, None, None]
    if not training:
        return y.astype(x.dtype), mean_run, var_run
    n = x.size // x.shape[1]
    mean, var = lax.stop_gradient(mean), lax.stop_gradient(var)
    new_mean = (1.0 - BN_MOMENTUM) * mean_run + BN_MOMENTUM * mean
    new_var = (1.0 - BN_MOMENTUM) * var_run + BN_MOMENTUM * var * (n / max(n - 1, 1))
    return y.astype(x.dtype), new_mean, new_var


def forward(depth: int, params: Dict[str, Any], stats: Dict[str, Any], x, training: bool = True,
            dtype: Any = "float32"):
    """Logits (float32) and the new batch-norm statistics."""
    import jax.numpy as jnp
    from jax import lax
    new_stats: Dict[str, Any] = {}

    def bn(prefix: str, h):
        y, m, v = _batchnorm(h, params[f"{prefix}.scale"], params[f"{prefix}.bias"],
                             stats[f"{prefix}.running_mean"], stats[f"{prefix}.running_var"],
                             training)
        new_stats[f"{prefix}.running_mean"], new_stats[f"{prefix}.running_var"] = m, v
        return y

    dtype = jnp.dtype(dtype)
    h = jax_relu(bn("bn1", _conv(x, params["conv1.W"], 2, 3, dtype)))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                          [(0, 0), (0, 0), (1, 1), (1, 1)])
    for block in _block_specs(depth):
        name, n = block["name"], len(block["convs"])
        out = h
        for j, (_, _, _, stride, pad) in enumerate(block["convs"]):
            out = bn(f"{name}.BatchNorm2d_{n + j}",
                     _conv(out, params[f"{name}.Conv2d_{j}.W"], stride, pad, dtype))
            if j < n - 1:
                out = jax_relu(out)
        residual = h
        if block["down"] is not None:
            residual = bn(f"{name}.downsample.bn",
                          _conv(h, params[f"{name}.downsample.conv.W"], block["down"][2], 0,
                                dtype))
        h = jax_relu(out + residual)
    pooled = jnp.mean(h.astype(jnp.float32), axis=(2, 3))  # the final feature map, whole
    logits = pooled.astype(dtype) @ params["fc.W"].astype(dtype) + params["fc.b"].astype(dtype)
    return logits.astype(jnp.float32), new_stats


def jax_relu(x):
    import jax.numpy as jnp
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def loss_fn(depth: int, params, stats, x, y, dtype: Any = "float32"):
    """Softmax cross-entropy (mean over the batch) and the new statistics."""
    import jax
    import jax.numpy as jnp
    logits, new_stats = forward(depth, params, stats, x, True, dtype)
    logp = jax.nn.log_softmax(logits, axis=1)
    loss = -jnp.sum(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1)) / x.shape[0]
    return loss, new_stats


def make_step(depth: int, dtype: Any = "float32", lr: float = LR, momentum: float = MOMENTUM):
    """The jitted step ``(params, stats, buffers, x, y) -> (params, stats, buffers, loss)``
    (SINGA's SGD with momentum; the three state dicts are donated)."""
    import jax

    def step(params, stats, buffers, x, y):
        (loss, new_stats), grads = jax.value_and_grad(
            partial(loss_fn, depth, dtype=dtype), has_aux=True)(params, stats, x, y)
        new_buffers = {k: momentum * buffers[k] + grads[k] for k in params}
        new_params = {k: params[k] - lr * new_buffers[k] for k in params}
        return new_params, new_stats, new_buffers, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


# XLA:CPU's YNNPACK convolution fusions (on by default in this jaxlib) computed this network's
# gradients up to 2.8% away from a float64 evaluation on singa_jax's initial parameters (batch
# 2; 6e-6 without them); singa_jax compiles its CPU steps without them (see xla_options.py).
# ``--check`` compiles the step so; ``--first-call`` times JAX's defaults unless asked.
NO_YNN_CONVOLUTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiled(step: Any, args: Sequence[Any], options: Optional[Dict[str, Any]]) -> Any:
    """``step`` compiled for ``args``: with JAX's defaults (``options`` None: the jitted function
    itself, compiled by its first call) or with these XLA options on CPU (lowered and compiled
    here)."""
    import jax
    if options is None or jax.default_backend() != "cpu":
        return step
    return step.lower(*args).compile(options)


# --- state ---------------------------------------------------------------------------------------
def random_state(depth: int, seed: int = 0, num_classes: int = 10
                 ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """``(params, stats, buffers)`` as NumPy arrays (He-style weights, SINGA's batch-norm
    initial values, zero buffers): nothing runs on a device."""
    rng = np.random.default_rng(seed)
    pshapes, sshapes = shapes(depth, num_classes)
    params = {}
    for k, s in pshapes.items():
        if k.endswith(".scale"):
            params[k] = np.ones(s, np.float32)
        elif k.endswith(".bias") or k == "fc.b":
            params[k] = np.zeros(s, np.float32)
        else:
            fan = int(np.prod(s[1:])) if len(s) == 4 else s[0]
            params[k] = (rng.standard_normal(s) * np.sqrt(2.0 / fan)).astype(np.float32)
    stats = {k: (np.ones if k.endswith("running_var") else np.zeros)(s, np.float32)
             for k, s in sshapes.items()}
    buffers = {k: np.zeros_like(v) for k, v in params.items()}
    return params, stats, buffers


def state_from(net: Any, depth: int) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray],
                                              Dict[str, np.ndarray]]:
    """``(params, stats, buffers)`` copied from a compiled singa_jax ResNet of ``depth`` (every
    name and shape checked against this architecture; zero buffers)."""
    pshapes, sshapes = shapes(depth, net.fc.W.shape[1], net.conv1.W.shape[1])
    states = net.get_states()
    expected = {**pshapes, **sshapes}
    got = {k: tuple(t.shape) for k, t in states.items()}
    if got != expected:
        raise ValueError(f"resnet_jax: the singa_jax model's states differ from ResNet-{depth}'s: "
                         f"missing {sorted(set(expected) - set(got))}, unexpected "
                         f"{sorted(set(got) - set(expected))}, shapes "
                         f"{sorted(k for k in got if k in expected and got[k] != expected[k])}")
    params = {k: np.array(states[k].array) for k in pshapes}
    stats = {k: np.array(states[k].array) for k in sshapes}
    return params, stats, {k: np.zeros_like(v) for k, v in params.items()}


# --- command line --------------------------------------------------------------------------------
def singa_model(depth: int, batch: int, size: int = 224, autocast: Optional[str] = None,
                optimizer: Any = None):
    """SINGA's example ResNet (``examples/cnn/model/resnet.py``, 18 or 50 layers, 10 classes,
    seed 0) with ``optimizer`` (default: this step's SGD), compiled for graph mode at ``batch``
    x 3 x ``size`` x ``size`` (under ``autocast``, a dtype name, when given)."""
    sys.path[:0] = [os.path.join(_ROOT, "examples", "cnn"), os.path.join(_ROOT, "examples")]
    from singa_jax import device, opt, tensor
    from model import resnet
    device.get_default_device().SetRandSeed(0)
    net = {18: resnet.resnet18, 50: resnet.resnet50}[depth](num_channels=3, input_size=size)
    net.set_optimizer(optimizer or opt.SGD(lr=LR, momentum=MOMENTUM))
    net.compile([tensor.Tensor((batch, 3, size, size))], is_train=True, use_graph=True,
                autocast=autocast)
    return net


def check(depth: int, batch: int, tol: float = 1e-4, grad_tol: float = 2e-3) -> float:
    """One step here and one in singa_jax's graph mode from the same state and batch; returns
    the largest difference of the loss, parameters and statistics (each relative to
    ``max(1, |singa_jax's value|)``) and raises past ``tol``. The momentum buffers (after one
    step: the gradients) are compared to ``grad_tol``: singa_jax's CPU step sums with YNNPACK's
    reduction fusions, whose gradients here lie up to 8.4e-4 from a float64 evaluation (1.3e-6
    without them; measured on resnet18, batch 2, see docs/performance.md)."""
    import jax.numpy as jnp
    from singa_jax import tensor
    net = singa_model(depth, batch)
    params, stats, buffers = state_from(net, depth)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    _, loss_singa = net(tensor.from_numpy(x), tensor.from_numpy(y))
    args = ({k: jnp.asarray(v) for k, v in params.items()},
            {k: jnp.asarray(v) for k, v in stats.items()},
            {k: jnp.asarray(v) for k, v in buffers.items()}, jnp.asarray(x), jnp.asarray(y))
    new_p, new_s, new_b, loss = compiled(make_step(depth), args, NO_YNN_CONVOLUTIONS)(*args)
    ours = {"loss": np.asarray(loss).reshape(1), **new_p, **new_s,
            **{f"moments/{k}": v for k, v in new_b.items()}}
    theirs = {"loss": np.asarray(loss_singa.array).reshape(1),
              **{k: np.asarray(t.array) for k, t in net.get_states().items()},
              **{k: np.asarray(t.array) for k, t in net.optimizer.get_states().items()
                 if k.startswith("moments/")}}
    worst = {False: 0.0, True: 0.0}  # by "is a momentum buffer"
    for k, a in ours.items():
        b = theirs[k]
        diff = float(np.max(np.abs(np.asarray(a, np.float64) - b))) / \
            max(1.0, float(np.max(np.abs(b))))
        moment = k.startswith("moments/")
        worst[moment] = max(worst[moment], diff)
        if diff > (grad_tol if moment else tol):
            raise AssertionError(f"resnet_jax --check: {k} differs by {diff:.3g} (relative to "
                                 f"max(1, |singa_jax|)) > {grad_tol if moment else tol:g}")
    print(f"resnet{depth} batch {batch}: one step equals singa_jax's graph step: loss "
          f"{float(ours['loss'][0]):.6f} vs {float(theirs['loss'][0]):.6f}; largest difference "
          f"{worst[False]:.2e} over the loss, {len(new_p)} parameters and {len(new_s)} "
          f"statistics, {worst[True]:.2e} over the momentum buffers (the gradients)")
    return worst[False]


def first_call(depth: int, batch: int, dtype: str, options: Optional[Dict[str, Any]] = None,
               steps: int = 2) -> Dict[str, float]:
    """Time the step's first call (trace, compile, run) and second call from NumPy state, and
    ``to_n``: from the first call's start to the end of call ``steps`` (>= 2); with
    ``options``, the first call includes lowering and compiling with them (CPU)."""
    import jax
    import jax.numpy as jnp
    params, stats, buffers = random_state(depth)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    step = make_step(depth, dtype)
    # the state on the device before the clock starts (a transfer, no program)
    state = jax.device_put((params, stats, buffers))
    xs, ys = jax.device_put((x, y))
    jax.block_until_ready((state, xs, ys))
    t0, c0 = time.perf_counter(), time.process_time()
    step = compiled(step, (*state, xs, ys), options)
    *state, loss = step(*state, xs, ys)
    jax.block_until_ready((state, loss))
    t1, c1 = time.perf_counter(), time.process_time()
    *state, loss = step(*state, xs, ys)
    jax.block_until_ready((state, loss))
    t2 = time.perf_counter()
    for _ in range(steps - 2):
        *state, loss = step(*state, xs, ys)
    jax.block_until_ready((state, loss))
    t3 = time.perf_counter()
    return {"model": f"resnet{depth}", "first": t1 - t0, "first_cpu": c1 - c0,
            "second": t2 - t1, "to_n": t3 - t0, "steps": max(steps, 2),
            "loss": float(jnp.asarray(loss))}


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, choices=sorted(CONFIGS), default=18)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--steps", type=int, default=2,
                    help="--first-call: also time the calls up to this one (to_n)")
    ap.add_argument("--no-ynn", action="store_true",
                    help="--first-call: compile without XLA:CPU's YNNPACK convolution fusions, "
                         "as singa_jax does")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true",
                      help="compare one step with singa_jax's graph step")
    what.add_argument("--first-call", action="store_true",
                      help="print the first and second call's seconds as JSON")
    args = ap.parse_args(argv)
    if args.check:
        check(args.depth, args.batch)
    else:
        print(json.dumps(first_call(args.depth, args.batch, args.dtype,
                                    NO_YNN_CONVOLUTIONS if args.no_ynn else None,
                                    steps=args.steps)))


if __name__ == "__main__":
    main()
