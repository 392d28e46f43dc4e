"""The benchmarks' PyTorch step times, taken in a child process: PyTorch never shares a process
with JAX there (in one process JAX's CPU threads starve torch's). The child times its steps with
:func:`print_step_times`, which prints them as one JSON line; the parent runs the child with
:func:`child_step_times`, which reads that line back."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence


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


class StepServer:
    """A child process that keeps its PyTorch steps warm and times a block of them on request.

    Timing a block right after the JAX side's block of the same work pairs the two in one
    stretch of the host's load (a 2-core machine's load swings the same step 1.5-2x within
    seconds); a fresh child per block would also time its first steps cold. Only one side
    runs at a time: the other waits on the pipe. The child runs :func:`serve_steps`."""

    def __init__(self, argv: Sequence[str]):
        self._proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        ready = self._proc.stdout.readline().strip()
        self.available = ready == "ready"  # (else PyTorch is not installed: "null")
        if not self.available:
            self.close()

    def times(self, kind: str, steps: int) -> List[float]:
        """Seconds of ``steps`` steps of the child's ``kind`` (after its warm-up at start)."""
        self._proc.stdin.write(f"{kind} {steps}\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=60)


def serve_steps(steps: Optional[Dict[str, Callable[[], Any]]], warmup: int = 3) -> None:
    """The child's side of :class:`StepServer`: ``steps`` maps a kind to its step (None: PyTorch
    is missing). Warms each up, prints ``ready``, then answers each ``<kind> <n>`` line of stdin
    with the JSON list of ``n`` step times, until stdin closes."""
    if steps is None:
        print("null", flush=True)
        return
    for step in steps.values():
        for _ in range(warmup):
            step()
    print("ready", flush=True)
    for line in sys.stdin:
        kind, n = line.split()
        print(json.dumps(step_times(steps[kind], int(n), warmup=0)), flush=True)
