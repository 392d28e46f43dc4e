"""The benchmarks' PyTorch step times, taken in a child process: PyTorch never shares a process
with JAX there (in one process JAX's CPU threads starve torch's). The child times its steps with
:func:`print_step_times`, which prints them as one JSON line; the parent runs the child with
:func:`child_step_times`, which reads that line back."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable, List, Sequence


def step_times(step: Callable[[], Any], steps: int, warmup: int = 3) -> List[float]:
    """Run ``step`` ``warmup`` times untimed (cuDNN's algorithm choice, allocator growth), then
    ``steps`` times; the seconds of those. ``step`` must wait for its work
    (``torch.cuda.synchronize()`` on a GPU)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def print_step_times(step: Callable[[], Any], steps: int, warmup: int = 3) -> None:
    """:func:`step_times`, printed as one JSON list."""
    print(json.dumps(step_times(step, steps, warmup)))


def child_step_times(argv: Sequence[str]) -> List[float]:
    """The step times a child ``python *argv`` printed on its last line ([] where it printed
    ``null``: PyTorch is not installed)."""
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]) or []
