"""The XLA compile options graph mode compiles a step with, chosen by backend.

* On CPU, XLA turns convolutions into YNNPACK fusions that are 2-3x slower than its own Eigen
  convolutions on the CPUs measured (LeNet's conv2 forward 4.2 vs 1.7 ms, its weight gradient 5.7
  vs 1.8 ms; see docs/performance.md); an empty fusion type turns them off. Never applied on
  GPU/TPU.
* A program that will run only once (its trace met new state, so the next call retraces) is
  compiled without the backend's expensive optimisations: compiling is then most of its cost.

An option the installed jaxlib does not know (an experimental flag renamed or removed) is left
out: each option is probed once per platform by compiling a trivial program with it, so no
error message is ever parsed.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Hashable, Sequence

import jax
import jax.numpy as jnp

__all__ = ["compile_options", "platform_of"]

CPU_OPTIONS: Dict[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": ""}
ONE_OFF_OPTIONS: Dict[str, Any] = {"xla_backend_optimization_level": 0,
                                   "xla_llvm_disable_expensive_passes": True}


@lru_cache(maxsize=None)
def supported(platform: str, name: str, value: Hashable) -> bool:
    """Whether ``platform``'s compiler accepts the option (probed once, on a trivial program)."""
    try:
        x = jax.device_put(jnp.zeros((), jnp.float32), jax.devices(platform)[0])
        jax.jit(lambda v: v + 1).lower(x).compile({name: value})
    except Exception:  # noqa: BLE001 -- any refusal means: do not use this option here
        return False
    return True


def compile_options(platform: str, one_off: bool = False) -> Dict[str, Any]:
    """The options for a step on ``platform`` ('cpu', 'gpu', 'tpu'): the CPU ones (never on
    another backend), plus the cheap-compile ones for a program that runs once; only those this
    jaxlib supports."""
    options = dict(CPU_OPTIONS) if platform == "cpu" else {}
    if one_off:
        options.update(ONE_OFF_OPTIONS)
    return {k: v for k, v in options.items() if supported(platform, k, v)}


def platform_of(arrays: Sequence[Any]) -> str:
    """The platform the step's arrays live on (the default backend's for a step without any)."""
    for a in arrays:
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
            return next(iter(a.devices())).platform
    return jax.default_backend()
