"""Every environment variable that switches one of singa_jax's mechanisms, with its default and
what it changes: what ``python -m singa_jax.info`` lists as in force, and what the performance
and observability pages of the docs describe."""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

__all__ = ["Switch", "SWITCHES", "in_force"]


class Switch(NamedTuple):
    name: str
    default: str  # what holds while it is unset
    changes: str  # what it changes


SWITCHES: Tuple[Switch, ...] = (
    Switch("SINGA_JAX_EAGER_REPLAY", "on", "0: every eager operator runs at once (no replay)"),
    Switch("SINGA_JAX_REPLAY_SPECULATE", "on",
           "0: a recurring step's program starts only when its recording ends"),
    Switch("SINGA_JAX_REPLAY_PIECE", "per platform",
           "N: eager replay dispatches a segment every N recorded calls (0: one program)"),
    Switch("SINGA_JAX_KIND_RECIPES", "on", "0: every eager call takes the generic path"),
    Switch("SINGA_JAX_TIERED_COMPILE", "auto",
           "0/1/auto/always: graph mode's first step runs a quickly compiled program"),
    Switch("SINGA_JAX_COMPILATION_CACHE", "on (user cache folder)",
           "0: no persistent compilation cache; a path: the cache's folder"),
    Switch("SINGA_JAX_GC_TUNING", "on", "0: Python's garbage collector thresholds stay"),
    Switch("SINGA_JAX_MALLOC_TUNING", "on (glibc)", "0: glibc's malloc thresholds stay"),
    Switch("SINGA_JAX_STRICT_DEVICES", "off",
           "1: create_cuda_gpu*() raise without an accelerator"),
    Switch("SINGA_JAX_CUDA_FALLBACK", "off (set by singa_jax.run)",
           "1: create_cuda_gpu*() fall back to the default device"),
    Switch("SINGA_JAX_DIST_TIMEOUT", "120",
           "seconds a DistOpt rank waits for the others"),
    Switch("SINGA_JAX_PEER_TIMEOUT", "20",
           "seconds a DistOpt rank may stay silent before the others stop (opt.PeerLostError)"),
    Switch("SINGA_JAX_EXPLAIN_COMPILES", "off",
           "1: log every compilation with its cause (singa_jax.debug.explain_compiles)"),
    Switch("SINGA_JAX_REPRODUCIBLE", "off",
           "1: every step computes the same bits whatever ran before it "
           "(autograd.reproducible)"),
)


def in_force(environ: Optional[Mapping[str, str]] = None) -> List[Tuple[str, str]]:
    """``(name, value)`` for every switch: its value where it is set, else its default."""
    environ = os.environ if environ is None else environ
    rows: Dict[str, str] = {}
    for switch in SWITCHES:
        value = environ.get(switch.name)
        rows[switch.name] = (f"{value} (set)" if value is not None
                             else f"{switch.default} (default)")
    return list(rows.items())
