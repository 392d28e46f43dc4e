"""The XLA compile options graph mode compiles a step with, chosen by backend.

* On CPU, XLA turns convolutions into YNNPACK fusions that are 2-3x slower than its own Eigen
  convolutions on the CPUs measured (LeNet's conv2 forward 4.2 vs 1.7 ms, its weight gradient 5.7
  vs 1.8 ms; see docs/performance.md); an empty fusion type turns them off. A compiled step
  whose program holds no depthwise convolution takes YNNPACK for single dots and reductions
  (``CPU_STEP_OPTIONS``: LeNet's step 10-16% faster, ResNet-50's ~5%; Xception's, with
  depthwise convolutions, 25-30% slower). Never applied on GPU/TPU.
* Eager kernels (each op's forward and pullback, a backward walk's replay, the ONNX backend's
  and the CTensor layer's convolution kernels) are made by :func:`kernel`: ``jax.jit`` with the
  default backend's kernel options, resolved at the first call (importing singa_jax must not
  initialise a backend: XLA_FLAGS and ``jax.distributed.initialize`` come first). On CPU that
  is YNNPACK for single dots only (``CPU_KERNEL_OPTIONS``): no convolution fusions (eager
  LeNet's step 31.7 -> 17.4 ms), and YNNPACK's dot, which multiplies the MLP's 64x256 by
  256x784 in 0.5-0.6x Eigen's time (eager MLP step 0-10% faster; LeNet's, ResNet-50's and
  Xception's unchanged) and compiles a small dot kernel in 0.4x the time. A kernel is one op,
  so the whole-program effect that keeps a depthwise step off YNNPACK does not arise.
* On CPU, the first compile also pins glibc's malloc thresholds (:mod:`.host_memory`): XLA:CPU's
  buffers are host allocations, and without it each fresh one is faulted in page by page
  (eager MLP step 2.1 -> 1.2 ms).
* A program that will run only once (its trace met new state, so the next call retraces) is
  compiled without the backend's expensive optimisations: compiling is then most of its cost.
* A step compiled in two tiers (:mod:`.graph_tiers`) runs its first call(s) compiled with
  :func:`quick_options`: the one-off options with no library fusions, on CPU only (ResNet-18's
  step at batch 2 on a 2-core CPU: 4-6 s to compile instead of 7-10, 2-2.5x the optimised
  step's run time; on an H200 GPU skipping autotuning saved nothing).
  :func:`quick_steps_while_compiling` says whether the quick program keeps serving calls while
  the optimised one compiles.
* Under JAX's own ``jax_disable_most_optimizations`` (``JAX_DISABLE_MOST_OPTIMIZATIONS=1``: a
  program's compile time matters more than its run time, as in a test suite or a debugging
  session), every program on CPU is compiled as that one-off one is, with XLA's library fusions
  off as well (``COMPILE_FIRST_OPTIONS``): a small convolution's forward-and-pullback kernel
  compiles in 120 ms instead of 0.9 s. Only speed changes, never what a program computes.
* Backend rules of the eager engine, beside the options: which backward walks are fused
  (:func:`fuses_heavy_walks`: every walk on an accelerator, only walks of small operators on
  a CPU) and in what pieces eager replay dispatches an evaluation forward
  (:func:`replay_piece_calls`: every 64 recorded calls on an accelerator, one program on a CPU).

An option the installed jaxlib does not know (an experimental flag renamed or removed) is left
out: each option is probed once per platform by compiling a trivial program with it, so no
error message is ever parsed.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.backend import host_memory

__all__ = ["compile_options", "compile_time_first", "called_functions", "kernel",
           "no_trace_running", "platform_of", "fuses_heavy_walks", "replay_piece_calls",
           "launches_in_thread",
           "quick_options", "quick_steps_while_compiling", "quick_tier_saving"]

# Each CPU option with its values, best first: the first one this jaxlib accepts is used.
CPU_OPTIONS: Dict[str, Tuple[Any, ...]] = {
    # no YNNPACK fusions (see the module docstring)
    "xla_cpu_experimental_ynn_fusion_type": ("",),
}
# What an eager kernel takes instead of CPU_OPTIONS, on CPU (see the module docstring).
CPU_KERNEL_OPTIONS: Dict[str, Tuple[Any, ...]] = {
    "xla_cpu_experimental_ynn_fusion_type": ("LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT", ""),
}
# What a compiled step (graph mode's program) takes instead, on CPU, unless its program calls a
# function named with one of the given words: each option's values (best first) and those
# words. YNNPACK for single dots and reductions made LeNet's step 10-16% and ResNet-50's ~5%
# faster, but a program with depthwise convolutions 25-30% slower (XLA then materialises every
# tap; autograd/conv_cpu.py names their function so).
DEPTHWISE_CONVOLUTION = "depthwise_convolution"
CPU_STEP_OPTIONS: Dict[str, Tuple[Tuple[Any, ...], Tuple[str, ...]]] = {
    "xla_cpu_experimental_ynn_fusion_type": (
        ("LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE",),
        (DEPTHWISE_CONVOLUTION,)),
}
ONE_OFF_OPTIONS: Dict[str, Any] = {"xla_backend_optimization_level": 0,
                                   "xla_llvm_disable_expensive_passes": True}
# What the quick tier of a step compiled in two tiers takes instead of the step's own options, by
# platform (each option only where this jaxlib accepts it): on CPU the one-off options with no
# library fusions (their code generation is a large share of a compile: see below). None on GPU:
# without autotuning (xla_gpu_autotune_level 0) SINGA's ResNet-50 step at batch 64 compiled no
# faster on an NVIDIA H200 (first call 10.88 s tiered vs 10.78 s not; the second call then
# waited 4.9 s for the optimised program) and its convolutions fell back to slow algorithms.
QUICK_OPTIONS: Dict[str, Dict[str, Any]] = {
    "cpu": {**ONE_OFF_OPTIONS, "xla_cpu_experimental_ynn_fusion_type": ""},
}
# What the quick tier saves and costs, by platform: XLA compile time saved per operation of the
# step's traced program, and the quick program's extra run time per byte its operations output
# (fitted on a loaded 2-core CPU, the optimised and quick compiles and runs of LeNet at batch 64,
# ResNet-18 at batch 2 and ResNet-50 at batch 8: 1.0-3.3 ms saved per operation, 0.55-0.57 s
# more per GB; see docs/performance.md). GPU: no quick tier (above).
QUICK_TIER_SECONDS_SAVED_PER_OPERATION: Dict[str, float] = {"cpu": 1.0e-3}
QUICK_TIER_SECONDS_PER_BYTE: Dict[str, float] = {"cpu": 0.55e-9}
# A CPU step's quick program serves the calls made while its optimised program compiles only
# with at least this many cores: on 2 cores the two slowed each other down 2.5x (docs/
# performance.md), and the second call waiting for the optimised program came first sooner.
QUICK_STEPS_MIN_CPU_CORES = 8
# What every CPU program takes under jax_disable_most_optimizations (see the module docstring):
# YNNPACK's fusions cost compile time that a program run a few times never wins back.
COMPILE_FIRST_OPTIONS: Dict[str, Tuple[Any, ...]] = {
    "xla_cpu_experimental_ynn_fusion_type": ("",),
}


def compile_time_first() -> bool:
    """Whether JAX was told to spend as little as it can on compiling
    (``jax_disable_most_optimizations``)."""
    try:
        return bool(jax.config.read("jax_disable_most_optimizations"))
    except (AttributeError, KeyError):  # a JAX without the flag: compile as usual
        return False


@lru_cache(maxsize=None)
def supported(platform: str, name: str, value: Hashable) -> bool:
    """Whether ``platform``'s compiler accepts the option (probed once, on a trivial program)."""
    try:
        x = jax.device_put(jnp.zeros((), jnp.float32), jax.devices(platform)[0])
        jax.jit(lambda v: v + 1).lower(x).compile({name: value})
    except Exception:  # noqa: BLE001 -- any refusal means: do not use this option here
        return False
    return True


def compile_options(platform: str, one_off: bool = False, program: Any = None,
                    eager: bool = False, for_compile_time: Optional[bool] = None
                    ) -> Dict[str, Any]:
    """The options for a program on ``platform`` ('cpu', 'gpu', 'tpu'): the CPU ones (never on
    another backend; an eager kernel's when ``eager``), those of a compiled step when
    ``program`` (its ``jax.stages.Lowered``) is given and calls none of the functions that make
    them slower, plus the cheap-compile ones for a program that runs once (every program, with
    no library fusions, under ``jax_disable_most_optimizations``; ``for_compile_time`` says
    whether that flag counts, None: as set); only those this jaxlib supports."""
    options: Dict[str, Any] = {}
    first = compile_time_first() if for_compile_time is None else for_compile_time
    if platform == "cpu":
        host_memory.tune()  # XLA:CPU's buffers are host allocations (see host_memory)
        _choose(options, platform, COMPILE_FIRST_OPTIONS if first else
                CPU_KERNEL_OPTIONS if eager else CPU_OPTIONS)
        called = None if program is None or first else called_functions(program)
        if called is not None:
            _choose(options, platform, {
                name: values for name, (values, unless) in CPU_STEP_OPTIONS.items()
                if not any(word in f for f in called for word in unless)})
    if one_off or first:
        options.update((k, v) for k, v in ONE_OFF_OPTIONS.items() if supported(platform, k, v))
    return options


# Whether an eager backward walk of heavy operators (outputs past autograd's FUSED_WALK_SMALL_OP
# elements, walks past FUSED_WALK_MAX_OPS operators) runs as one fused kernel, by platform. On a
# CPU such a walk's kernels dominate its time and its fused program compiles for seconds: op by
# op. On an accelerator the device runs the kernels asynchronously and the host's dispatch per
# pullback is the walk's cost even for heavy operators (SINGA's ResNet-50 at batch 64 on an
# NVIDIA H200: eager training 61 ms a step against graph mode's 26 with the walk op by op).
HEAVY_WALKS_FUSED: Dict[str, bool] = {"cpu": False}


def fuses_heavy_walks(platform: str) -> bool:
    """Whether backward walks of heavy operators on ``platform`` are fused (see above)."""
    return HEAVY_WALKS_FUSED.get(platform, True)


# Eager replay's segments, by platform: how many recorded kernel calls a segment that keeps no
# backward state (an evaluation forward) gathers before it is dispatched as one program and the
# next calls start another (None: one program until a value is needed). On an accelerator the
# device runs each piece while the host records the next, instead of waiting for the whole
# forward's Python: SINGA's ResNet-50 eval forward at batch 64 on an NVIDIA H200, 7.2 ms in
# pieces of 64 calls vs 9.3 ms in one program (graph mode 5.9; pieces of 32: 14.0, of 128: 8.1).
# A training step stays one program: there a piece boundary makes every residual of the pieces
# before it an output, and the backward walk's inputs, whose host cost outweighed the overlap
# (the same step 38.1 ms in pieces of 64, 40.8 of 128, 44.8 of 32, vs 34.8 in one program).
# On a CPU the "device" is the host's other cores: the deep network's evaluation was no
# faster in pieces (2-core CPU). ``SINGA_JAX_REPLAY_PIECE=N`` sets it for every platform (0:
# one program).
REPLAY_PIECE_CALLS: Dict[str, Optional[int]] = {"cpu": None}
REPLAY_PIECE_CALLS_ELSEWHERE = 64


def _piece_setting(value: Optional[str]) -> Optional[int]:
    """``SINGA_JAX_REPLAY_PIECE`` read: None when unset, else its calls (0: one program);
    ValueError (at import) for anything but a whole number >= 0."""
    if value is None:
        return None
    try:
        calls = int(value)
    except ValueError:
        calls = -1
    if calls < 0:
        raise ValueError(f"SINGA_JAX_REPLAY_PIECE must be a whole number of recorded calls >= 0 "
                         f"(0: one program), got {value!r}")
    return calls


_PIECE_ENV = _piece_setting(os.environ.get("SINGA_JAX_REPLAY_PIECE"))


def _cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Platforms where eager replay starts a speculated program (see replay._Plan) from a thread of
# its own, so that the call overlaps the host's recording of the rest of the step instead of
# preceding it. JAX releases the GIL for part of a call. On XLA:GPU the call launches the
# kernels one by one (~10 ms for SINGA's ResNet-50 training step on an H200, measured as graph
# mode's time until its call returns). On XLA:CPU the call only enqueues the program, but a
# recurring step's has a thousand-odd inputs and outputs: ~3 ms of the dispatch-bound network's
# step, of which the thread takes a quarter off the recording thread (its step 0.87-0.97x in
# turns, same process) -- on two cores or more; on one, the thread has nothing to overlap.
# A TPU runs a program as one launch.
LAUNCHES_IN_THREAD: Dict[str, bool] = {"gpu": True, "cpu": _cpu_cores() >= 2}


def launches_in_thread(platform: str) -> bool:
    """Whether eager replay starts speculated programs on ``platform`` from a thread (see
    :data:`LAUNCHES_IN_THREAD`)."""
    return LAUNCHES_IN_THREAD.get(platform, False)


def replay_piece_calls(platform: str) -> Optional[int]:
    """The recorded calls after which eager replay dispatches a segment on ``platform`` (see
    :data:`REPLAY_PIECE_CALLS`); None: only when a value is needed."""
    if _PIECE_ENV is not None:
        return _PIECE_ENV or None
    return REPLAY_PIECE_CALLS.get(platform, REPLAY_PIECE_CALLS_ELSEWHERE)


def quick_options(platform: str, options: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """``options`` (a step's, on ``platform``) with :data:`QUICK_OPTIONS` of that platform in
    force, those this jaxlib supports; None when that changes nothing (no quick options for the
    platform, or the step's are quick already, as under ``jax_disable_most_optimizations``)."""
    quick = dict(options)
    for name, value in QUICK_OPTIONS.get(platform, {}).items():
        if supported(platform, name, value):
            quick[name] = value
    return None if quick == options else quick


def quick_tier_saving(platform: str, operations: int, output_bytes: int) -> float:
    """Seconds the quick tier is expected to take off a first call of a step program of
    ``operations`` operations whose operations output ``output_bytes`` bytes: the compile time
    it saves less the quick program's slower run (0 for a platform not measured)."""
    return (operations * QUICK_TIER_SECONDS_SAVED_PER_OPERATION.get(platform, 0.0) -
            output_bytes * QUICK_TIER_SECONDS_PER_BYTE.get(platform, 0.0))


def quick_steps_while_compiling(platform: str) -> bool:
    """Whether a step's quick program should serve calls while its optimised program compiles
    on a background thread: not when both compete for the few cores of a CPU
    (:data:`QUICK_STEPS_MIN_CPU_CORES`)."""
    if platform != "cpu":
        return True  # the step runs on the accelerator, the compiler on the host
    return _cpu_cores() >= QUICK_STEPS_MIN_CPU_CORES


def _choose(options: Dict[str, Any], platform: str, table: Dict[str, Tuple[Any, ...]]) -> None:
    """Set each option of ``table`` to its first value ``platform`` accepts (if any)."""
    for name, choices in table.items():
        for value in choices:
            if supported(platform, name, value):
                options[name] = value
                break


def called_functions(program: Any) -> Optional[Tuple[str, ...]]:
    """The names of the functions in a lowered program's module (``jax.jit`` lowers each jitted
    function it calls to one, named after it: ``depthwise_convolution``,
    ``depthwise_convolution_0``...); None when the module cannot be read."""
    try:
        module = program.compiler_ir("stablehlo")
        return tuple(str(op.attributes["sym_name"]).strip('"')
                     for op in module.body.operations)
    except Exception:  # noqa: BLE001 -- unknown: the step keeps the options of every program
        return None


def platform_of(arrays: Sequence[Any]) -> str:
    """The platform the step's arrays live on (the default backend's for a step without any)."""
    for a in arrays:
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
            return next(iter(a.devices())).platform
    return jax.default_backend()


try:  # jax.jit refuses compiler_options on a jit called inside another trace
    from jax._src import core as _core
    from jax._src.core import trace_ctx as _trace_ctx
    _trace_state, _axis_env_state = _core.trace_state_strong_ref, _core.axis_env_state

    def no_trace_running() -> bool:
        """``trace_ctx.is_top_level()`` without its two property calls (half its ~0.4 us: every
        eager operator asks)."""
        return _trace_state.value is _core.eval_trace and \
            _axis_env_state.value is _core.top_axis_env

    if not (no_trace_running() and _trace_ctx.is_top_level()):  # (not both at import: JAX's)
        no_trace_running = _trace_ctx.is_top_level
except (ImportError, AttributeError):  # a JAX without it: answers "a trace may be running"
    def no_trace_running() -> bool:
        return False


def kernel(fun: Optional[Callable] = None, **jit_kwargs: Any) -> Callable:
    """``jax.jit(fun, **jit_kwargs)`` compiled with the default backend's kernel options when
    called outside any trace (inside one, jax.jit takes no options: the enclosing program's
    apply); usable as a decorator with or without arguments. The jitted functions are made at
    the first call, when a backend may be initialised."""
    if fun is None:
        return lambda f: kernel(f, **jit_kwargs)
    plain = jax.jit(fun, **jit_kwargs)
    tuned: Dict[bool, Callable] = {}  # by compile_time_first(): a program follows the flag

    def jitted_now() -> Callable:
        """The jitted function a call from this thread would use now."""
        if not no_trace_running():
            return plain
        first = compile_time_first()
        jitted = tuned.get(first)
        if jitted is None:
            options = compile_options(jax.default_backend(), eager=True)
            jitted = tuned[first] = (jax.jit(fun, compiler_options=options, **jit_kwargs)
                                     if options else plain)
        return jitted

    def call(*args: Any, **kwargs: Any) -> Any:
        return jitted_now()(*args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(fun, "__name__", "kernel")
    call.__doc__ = fun.__doc__
    call.__wrapped__ = fun
    call.jitted_now = jitted_now
    return call
