"""Check a checkout on whatever accelerator this machine has, with one command::

    python benchmarks/accelerator_check.py [--quick] [--out DIR] [--parts info,tests,main,bench]
                                           [--pytest-args "tests/test_layer.py -k conv"]
                                           [--main-args "-m 3"] [--timeout SECONDS]

Each part runs in a process of its own, its output (stdout and stderr) written to a log under
``--out`` (default: a new temporary folder):

* ``info``  -- ``python -m singa_jax.info``: versions, devices, precision, settings;
* ``tests`` -- ``python -m pytest -q -p no:cacheprovider``, the whole suite (``--quick``:
  tests/test_layer.py and tests/test_model.py; ``--pytest-args`` chooses): passed / failed /
  skipped counts and the failing test ids;
* ``main``  -- the main job, ``python examples/cnn/train_cnn.py`` (its default 10 epochs;
  ``--quick``: 2 epochs, the second one free of compilation): final test accuracy and
  the last epoch's images/s;
* ``bench`` -- ``benchmarks/bench_train_step.py --rounds 1`` (graph mode, eager, a hand-written
  ``jax.jit`` step and PyTorch; ``--quick``: 30 steps per variant),
  ``benchmarks/bench_ops.py`` (100 repetitions; ``--quick``: 30) and
  ``benchmarks/bench_mixed_precision.py`` (ResNet-50, batch 64, float32 and bfloat16: singa_jax
  graph mode under autocast, the hand-written step, PyTorch; ``--quick`` or on a CPU: a small
  ResNet-18 run): their summary lines.

The device is the default JAX backend's, as ``jax.devices()`` names it. A part that fails, times
out or cannot start is reported as such with the tail of its log; the script itself does not
stop. At the end ONE table sums up each part's status, key numbers and wall time; it is also
written to ``summary.txt`` (and every parsed number to ``summary.json``) in the output folder.
The exit status is 0 when every part passed, 1 otherwise.

The script itself imports neither JAX nor singa_jax: it holds no device while its children
run, and a broken installation is reported by the children instead of stopping it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, asdict
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("info", "tests", "main", "bench")
QUICK_TESTS = ["tests/test_layer.py", "tests/test_model.py"]
# wall-clock limits per part (seconds); --timeout overrides them all
TIMEOUTS = {"info": 300, "tests": 4 * 3600, "main": 3600, "bench": 1800}
TAIL_LINES = 25

# Run when the info part is not chosen: the default backend and its devices, for the table.
_PROBE = ("import json, jax; ds = jax.devices(); "
          "print(json.dumps([jax.default_backend(), [d.device_kind for d in ds]]))")


@dataclass
class Result:
    """One row of the summary table."""
    part: str
    status: str = "not run"  # ok, FAILED, TIMEOUT
    seconds: float = 0.0
    lines: List[str] = field(default_factory=list)  # key numbers, one table line each
    details: List[str] = field(default_factory=list)  # printed under the table (failing ids)
    numbers: Dict[str, object] = field(default_factory=dict)  # for summary.json
    log: str = ""
    tail: List[str] = field(default_factory=list)  # the log's last lines, when it failed


# --- running a child ------------------------------------------------------------------------
def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    # JAX preallocates 75% of a GPU's memory in every process that starts its GPU backend. The
    # test suite's pytest process holds the GPU while some tests start Python processes of
    # their own (the examples, distributed runs), and bench_train_step runs PyTorch in another
    # process: with preallocation the second process finds the GPU full. Allocating on demand
    # lets them share it (a user's own setting stands).
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # the checkout's singa_jax, whether or not it is installed (`pip install -e .` or not)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"  # a child killed at its time limit leaves its output so far
    return env


def _kill(proc: subprocess.Popen) -> None:
    """End the child and every process it started (its own session)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(argv: Sequence[str], log: str, timeout: float,
              env: Optional[Dict[str, str]] = None) -> Tuple[Optional[int], float, str]:
    """Run ``argv`` in the checkout with stdout and stderr written to ``log``. Returns (exit
    status, None when it ran past ``timeout``; seconds; the log's text)."""
    start = time.perf_counter()
    code: Optional[int]
    with open(log, "w", encoding="utf-8", errors="replace") as out:
        out.write("$ " + shlex.join(argv) + "\n")
        out.flush()
        try:
            # its own session, so that a timeout ends the grandchildren too
            proc = subprocess.Popen(list(argv), cwd=ROOT, env=env or child_env(),
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            out.write(f"could not start: {e}\n")
            proc = None
            code = 127  # the shell's status for a command it cannot run
        if proc is not None:
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                code = None
            except BaseException:  # Ctrl-C: leave no child behind
                _kill(proc)
                raise
    return code, time.perf_counter() - start, _read(log)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _lines(text: str) -> List[str]:
    """The log's lines as a terminal would show them (a progress bar's \\r rewrites: the
    last)."""
    return [line.split("\r")[-1].rstrip() for line in text.splitlines()]


def tail(text: str, count: int = TAIL_LINES) -> List[str]:
    return [line for line in _lines(text) if line.strip()][-count:]


# --- reading each part's output --------------------------------------------------------------
def _value(text: str, name: str) -> Optional[str]:
    found = re.search(rf"^\s+{re.escape(name)}:\s+(.*)$", text, re.M)
    return found.group(1).strip() if found else None


def parse_info(text: str) -> Dict[str, object]:
    """The default backend, its devices' kinds and the float32 matmul arithmetic there, from
    ``python -m singa_jax.info``'s report."""
    backend = _value(text, "default backend")
    kinds = []
    if backend:
        kinds = re.findall(rf"^\s+{re.escape(backend)}:\d+:\s+kind ([^,\n]+)", text, re.M)
    return {"jax": _value(text, "jax"), "backend": backend, "device_kinds": kinds,
            "arithmetic": _value(text, f"{backend} arithmetic") if backend else None}


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def parse_pytest(text: str) -> Dict[str, object]:
    """Counts from pytest's last summary line (``3 failed, 120 passed, 2 skipped in 9.1s``) and
    the ids of the failing tests (``-rfE``'s ``FAILED id - message`` lines)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for line in reversed(_lines(text)):
        if re.search(r"\bin [\d.]+s\b", line) and _COUNT.search(line):
            for number, what in _COUNT.findall(line):
                counts["errors" if what.startswith("error") else what] = int(number)
            break
    failing = []
    for line in _lines(text):
        found = re.match(r"^(FAILED|ERROR) (\S+)", line)
        if found and found.group(2) not in failing:
            failing.append(found.group(2))
    return {**counts, "failing": failing}


_EPOCH = re.compile(r"^Epoch (\d+): .*test accuracy = ([\d.]+), ([\d.]+) img/s")


def parse_train(text: str) -> Dict[str, object]:
    """The epochs' test accuracies and throughputs from train_cnn.py's per-epoch lines."""
    epochs = [(int(e), float(a), float(s)) for e, a, s in
              (m.groups() for m in map(_EPOCH.match, _lines(text)) if m)]
    return {"epochs": len(epochs), "test_accuracy": [a for _, a, _ in epochs],
            "img_per_s": [s for _, _, s in epochs]}


_STEP = re.compile(r"^\[(\w+)\] (.+?)\s+median\s+([\d.]+) ms/step")


def parse_train_step(text: str) -> Dict[str, object]:
    """bench_train_step.py: each net's median ms/step per variant and its ratio lines."""
    medians: Dict[str, Dict[str, float]] = {}
    for found in map(_STEP.match, _lines(text)):
        if found:
            medians.setdefault(found.group(1), {})[found.group(2)] = float(found.group(3))
    ratios = [line for line in _lines(text) if re.match(r"^\[\w+\] .* = [\d.]+", line)]
    return {"ms_per_step": medians, "summary": ratios}


_OP = re.compile(r"^(.+?)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)\s+([\d.]+)x$")


def parse_ops(text: str) -> Dict[str, object]:
    """bench_ops.py's rows: case -> (autograd us, jit us, overhead us, ratio)."""
    rows = {}
    for line in _lines(text):
        found = _OP.match(line)
        if found:
            rows[found.group(1).strip()] = [float(v) for v in found.groups()[1:]]
    summary = [line for line in _lines(text) if _OP.match(line) or line.startswith("case ")]
    return {"cases": rows, "summary": summary}


_MIXED = re.compile(r"^(\w+): singa graph / jax.jit speed = ([\d.]+)")


def parse_mixed_precision(text: str) -> Dict[str, object]:
    """bench_mixed_precision.py: per dtype, singa_jax's speed over the hand-written step's, and
    its median lines."""
    ratios = {m.group(1): float(m.group(2)) for m in map(_MIXED.match, _lines(text)) if m}
    summary = [line for line in _lines(text) if " median " in line or _MIXED.match(line)]
    return {"vs_jax": ratios, "summary": summary}


def _ms(value: float) -> str:
    """Milliseconds with about three significant digits, never in e-notation."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# --- the parts -------------------------------------------------------------------------------
def _finish(result: Result, code: Optional[int], seconds: float, text: str, ok: bool) -> Result:
    result.seconds = seconds
    result.status = "TIMEOUT" if code is None else ("ok" if code == 0 and ok else "FAILED")
    if code is not None and code != 0:
        result.details.insert(0, f"exit status {code}")
    if result.status != "ok":
        result.tail = tail(text)
    return result


def check_info(out: str, timeout: float) -> Result:
    result = Result("info", log=os.path.join(out, "info.log"))
    code, seconds, text = run_child([sys.executable, "-m", "singa_jax.info"], result.log,
                                    timeout)
    found = parse_info(text)
    result.numbers = found
    kinds = found["device_kinds"]
    if found["backend"]:
        result.lines.append(f"jax {found['jax']}, backend {found['backend']} "
                            f"({len(kinds)} device(s)), float32 matmul in "
                            f"{found['arithmetic']}")
    return _finish(result, code, seconds, text, ok=bool(found["backend"]))


def check_tests(out: str, timeout: float, pytest_args: List[str]) -> Result:
    result = Result("tests", log=os.path.join(out, "tests.log"))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
            *pytest_args]
    code, seconds, text = run_child(argv, result.log, timeout)
    found = parse_pytest(text)
    result.numbers = found
    result.lines.append(f"{found['passed']} passed, {found['failed']} failed, "
                        f"{found['skipped']} skipped"
                        + (f", {found['errors']} errors" if found["errors"] else ""))
    if pytest_args:
        result.lines.append("subset: " + shlex.join(pytest_args))
    result.details += [f"failing: {test}" for test in found["failing"]]
    ran = found["passed"] + found["failed"] + found["errors"] > 0
    if code == 5:
        result.details.append("pytest collected no tests")
    return _finish(result, code, seconds, text, ok=ran)


def check_main(out: str, timeout: float, quick: bool, main_args: List[str]) -> Result:
    result = Result("main", log=os.path.join(out, "main.log"))
    # the checkpoint goes to the output folder: the checkout stays clean, and no earlier
    # run's checkpoint is picked up
    argv = [sys.executable, os.path.join("examples", "cnn", "train_cnn.py"),
            "-c", os.path.join(out, "cnn_mnist.zip")]
    argv += (["-m", "2"] if quick else []) + main_args
    code, seconds, text = run_child(argv, result.log, timeout)
    found = parse_train(text)
    result.numbers = found
    if found["epochs"]:
        result.lines.append(f"cnn, {found['epochs']} epoch(s): test accuracy "
                            f"{found['test_accuracy'][-1]:.4f}, "
                            f"{found['img_per_s'][-1]:.0f} img/s (last epoch)")
    return _finish(result, code, seconds, text, ok=found["epochs"] > 0)


def check_train_step(out: str, timeout: float, quick: bool) -> Result:
    result = Result("bench step", log=os.path.join(out, "bench_train_step.log"))
    argv = [sys.executable, os.path.join("benchmarks", "bench_train_step.py"), "--rounds", "1"]
    argv += ["--steps", "30"] if quick else []
    code, seconds, text = run_child(argv, result.log, timeout)
    found = parse_train_step(text)
    result.numbers = found
    for net, medians in found["ms_per_step"].items():
        shown = ", ".join(f"{name} {_ms(ms)}" for name, ms in medians.items()
                          if name in ("graph", "eager", "jax.jit", "torch eager"))
        result.lines.append(f"{net} ms/step: {shown}")
    return _finish(result, code, seconds, text, ok=bool(found["ms_per_step"]))


def check_ops(out: str, timeout: float, quick: bool) -> Result:
    result = Result("bench ops", log=os.path.join(out, "bench_ops.log"))
    argv = [sys.executable, os.path.join("benchmarks", "bench_ops.py"),
            "--reps", "30" if quick else "100"]
    code, seconds, text = run_child(argv, result.log, timeout)
    found = parse_ops(text)
    result.numbers = found
    cases = found["cases"]
    if cases:
        overheads = [row[2] for row in cases.values()]
        ratios = [row[3] for row in cases.values()]
        result.lines.append(f"{len(cases)} ops: eager overhead median "
                            f"{_median(overheads):.0f} us/step, "
                            f"{min(ratios):.1f}-{max(ratios):.1f}x a bare jax.jit step")
    return _finish(result, code, seconds, text, ok=bool(cases))


def check_mixed_precision(out: str, timeout: float, small: bool) -> Result:
    result = Result("bench mixed", log=os.path.join(out, "bench_mixed_precision.log"))
    argv = [sys.executable, os.path.join("benchmarks", "bench_mixed_precision.py")]
    argv += ["--depth", "18", "--batch", "4", "--size", "64", "--steps", "10",
             "--rounds", "1"] if small else []
    code, seconds, text = run_child(argv, result.log, timeout)
    found = parse_mixed_precision(text)
    result.numbers = found
    for dtype, ratio in found["vs_jax"].items():
        result.lines.append(f"{dtype}: singa graph / jax.jit speed {ratio:.3f}")
    return _finish(result, code, seconds, text, ok=bool(found["vs_jax"]))


def device_name(info: Optional[Result], timeout: float) -> str:
    """The default backend's devices, from the info part's report, else a small probe."""
    backend, kinds = None, []
    if info is not None:
        backend, kinds = info.numbers.get("backend"), info.numbers.get("device_kinds") or []
    if not backend or not kinds:
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            log = f.name
        try:
            code, _, text = run_child([sys.executable, "-c", _PROBE], log, timeout)
        finally:
            os.unlink(log)
        try:
            backend, kinds = json.loads(_lines(text)[-1])
        except (ValueError, IndexError, TypeError):
            last = tail(text, 1)
            return f"unknown (no backend started: {last[0] if last else f'exit {code}'})"
    groups: Dict[str, int] = {}
    for kind in kinds:
        groups[kind] = groups.get(kind, 0) + 1
    return ", ".join(f"{n} x {kind}" for kind, n in groups.items()) + f" (backend {backend})"


# --- the summary -----------------------------------------------------------------------------
def summary_table(device: str, out: str, results: Sequence[Result], total: float) -> str:
    width = max([len(r.part) for r in results] + [len("part")])
    rows = [f"singa_jax accelerator check on {device}",
            f"logs: {out}", "",
            f"{'part':{width}s}  {'status':7s} {'time':>8s}  result",
            f"{'-' * width}  {'-' * 7} {'-' * 8}  {'-' * 40}"]
    for r in results:
        lines = r.lines or ["-"]
        rows.append(f"{r.part:{width}s}  {r.status:7s} {r.seconds:7.1f}s  {lines[0]}")
        rows += [f"{'':{width}s}  {'':7s} {'':8s}  {line}" for line in lines[1:]]
    rows.append(f"{'total':{width}s}  {'':7s} {total:7.1f}s")
    for r in results:
        if r.details:
            rows += ["", f"{r.part}:"] + [f"  {line}" for line in r.details]
    for r in results:  # the benchmarks' own summary lines, as they printed them
        summary = r.numbers.get("summary") if isinstance(r.numbers, dict) else None
        if summary and r.status == "ok":
            rows += ["", f"{r.part} ({os.path.basename(r.log)}):"] + [f"  {s}" for s in summary]
    for r in results:
        if r.status != "ok":
            rows += ["", f"{r.part} {r.status}: last lines of {r.log}:"]
            rows += [f"  | {line}" for line in r.tail]
    return "\n".join(rows)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"a test subset ({' '.join(QUICK_TESTS)}), two epochs of the main job, "
                    "short benchmarks")
    ap.add_argument("--out", default=None, help="folder for the logs (default: a new temp one)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated, among {','.join(PARTS)} (default: all)")
    ap.add_argument("--pytest-args", default=None,
                    help="arguments for pytest instead of the default (the whole suite, or "
                    "the --quick subset), e.g. \"tests/test_layer.py -k conv\"")
    ap.add_argument("--main-args", default="",
                    help="extra arguments for examples/cnn/train_cnn.py, e.g. \"-m 3\"")
    ap.add_argument("--timeout", type=float, default=None,
                    help="wall-clock limit per part in seconds (default: "
                    + ", ".join(f"{k} {v}" for k, v in TIMEOUTS.items()) + ")")
    args = ap.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        ap.error(f"--parts: unknown {','.join(unknown)}; choose among {','.join(PARTS)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="singa_jax_check_"))
    os.makedirs(out, exist_ok=True)

    def limit(part: str) -> float:
        return args.timeout or TIMEOUTS[part]

    if args.pytest_args is not None:
        pytest_args = shlex.split(args.pytest_args)
    else:
        pytest_args = list(QUICK_TESTS) if args.quick else []
    print(f"singa_jax accelerator check: parts {','.join(args.parts)}"
          f"{' (quick)' if args.quick else ''}; logs in {out}", flush=True)

    start = time.perf_counter()
    results: List[Result] = []
    info: Optional[Result] = None
    steps = {
        "info": lambda: [check_info(out, limit("info"))],
        "tests": lambda: [check_tests(out, limit("tests"), pytest_args)],
        "main": lambda: [check_main(out, limit("main"), args.quick, shlex.split(args.main_args))],
        "bench": lambda: [check_train_step(out, limit("bench"), args.quick),
                          check_ops(out, limit("bench"), args.quick),
                          check_mixed_precision(out, limit("bench"), args.quick or (
                              info is not None and info.numbers.get("backend") == "cpu"))],
    }
    for part in PARTS:  # in this order whatever --parts says: the info first
        if part not in args.parts:
            continue
        print(f"[{part}] running ...", flush=True)
        try:
            done = steps[part]()
        except Exception as e:  # a bug of this script's own: report it, go on with the rest
            done = [Result(part, status="FAILED", details=[f"{type(e).__name__}: {e}"])]
        for r in done:
            print(f"[{r.part}] {r.status} in {r.seconds:.1f}s"
                  + (f": {r.lines[0]}" if r.lines else ""), flush=True)
            if r.part == "info":
                info = r
        results += done

    device = device_name(info, TIMEOUTS["info"])
    table = summary_table(device, out, results, time.perf_counter() - start)
    print("\n" + table)
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"device": device, "parts": [asdict(r) for r in results]}, f, indent=1)
    return 0 if results and all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
