"""benchmarks/accelerator_check.py: one command runs the parts in processes of their own and sums
them up in one table with the real counts; a part that fails is reported, never fatal."""
import importlib.util
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "accelerator_check.py")


def _load():
    spec = importlib.util.spec_from_file_location("accelerator_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _load()


def test_quick_info_and_tests_report_the_real_counts(tmp_path):
    out = tmp_path / "check"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--parts", "info,tests",
                           "--pytest-args", "tests/test_utils.py", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("singa_jax accelerator check on"):]
    assert "2 x cpu (backend cpu)" in table.splitlines()[0]  # named from jax.devices()

    # the counts of the pytest run the check made, as pytest itself printed them
    log = (out / "tests.log").read_text()
    assert log.startswith("$ ") and "tests/test_utils.py" in log.splitlines()[0]
    last = [line for line in log.splitlines() if re.search(r" in [\d.]+s", line)][-1]
    passed = int(re.search(r"(\d+) passed", last).group(1))
    assert passed > 0 and "failed" not in last
    row = re.search(r"^tests\s+(\S+)\s+[\d.]+s\s+(.*)$", table, re.M)
    assert row and row.group(1) == "ok", table
    assert row.group(2) == f"{passed} passed, 0 failed, 0 skipped"
    info_row = re.search(r"^info\s+ok\s+[\d.]+s\s+(.*)$", table, re.M)
    assert info_row and "backend cpu (2 device(s))" in info_row.group(1), table
    assert "float32 matmul in float32" in info_row.group(1)

    assert (out / "summary.txt").read_text().strip() == table.strip()
    summary = json.loads((out / "summary.json").read_text())
    tests = [p for p in summary["parts"] if p["part"] == "tests"][0]
    assert tests["numbers"]["passed"] == passed and tests["numbers"]["failing"] == []
    assert [p["part"] for p in summary["parts"]] == ["info", "tests"]  # --parts chose these


def test_a_failing_child_is_reported_with_its_tail(tmp_path):
    log = str(tmp_path / "child.log")
    script = "import sys; print('line one'); print('the error', file=sys.stderr); sys.exit(3)"
    code, seconds, text = check.run_child([sys.executable, "-c", script], log, timeout=120)
    assert code == 3 and seconds > 0
    result = check._finish(check.Result("x", log=log), code, seconds, text, ok=True)
    assert result.status == "FAILED" and result.tail[-2:] == ["line one", "the error"]
    assert result.details == ["exit status 3"]
    table = check.summary_table("1 x cpu (backend cpu)", str(tmp_path), [result], seconds)
    assert re.search(r"^x\s+FAILED", table, re.M) and "  | the error" in table

    # a child past its time limit is ended (with what it started) and reported as TIMEOUT
    code, seconds, text = check.run_child(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
        log, timeout=3)
    assert code is None and seconds < 30 and "started" in text
    assert check._finish(check.Result("y"), code, seconds, text, ok=True).status == "TIMEOUT"

    # a command that cannot start at all
    code, _, text = check.run_child([str(tmp_path / "no-such-program")], log, timeout=10)
    assert code == 127 and "could not start" in text


def test_parsers_read_the_children_output():
    pytest_out = "\n".join([
        "..F.s.E", "=== short test summary info ===",
        "FAILED tests/test_a.py::test_x[1] - AssertionError: no",
        "ERROR tests/test_b.py::test_y - RuntimeError",
        "1 failed, 4 passed, 1 skipped, 2 warnings, 1 error in 3.21s"])
    assert check.parse_pytest(pytest_out) == {
        "passed": 4, "failed": 1, "skipped": 1, "errors": 1,
        "failing": ["tests/test_a.py::test_x[1]", "tests/test_b.py::test_y"]}

    train_out = ("No --data-dir: training on ...\r Epoch 0:  50%|###\r\n"
                 "Epoch 0: training loss = 0.9000, training accuracy = 0.7000, "
                 "test accuracy = 0.9100, 850 img/s, 12.0s, checkpoint c.zip\n"
                 "Epoch 1: training loss = 0.2000, training accuracy = 0.9400, "
                 "test accuracy = 0.9700, 1234 img/s, 5.0s\n")
    assert check.parse_train(train_out) == {"epochs": 2, "test_accuracy": [0.91, 0.97],
                                            "img_per_s": [850.0, 1234.0]}

    step_out = ("[mlp] graph            median    0.812 ms/step\n"
                "[mlp] jax.jit          median    0.700 ms/step\n"
                "[mlp] torch eager      median    1.000 ms/step\n"
                "[mlp] graph / jax.jit = 1.160   eager / jax.jit = 2.000\n")
    found = check.parse_train_step(step_out)
    assert found["ms_per_step"] == {"mlp": {"graph": 0.812, "jax.jit": 0.7, "torch eager": 1.0}}
    assert found["summary"] == ["[mlp] graph / jax.jit = 1.160   eager / jax.jit = 2.000"]

    ops_out = ("case                                      autograd us     jit us  overhead us"
               "   ratio   (median of 30, 64x64, cpu)\n"
               "matmul + relu + sum                              80.0       20.0         60.0"
               "     4.0x\n")
    assert check.parse_ops(ops_out)["cases"] == {"matmul + relu + sum": [80.0, 20.0, 60.0, 4.0]}

    mixed_out = ("singa graph bfloat16             median     17.40 ms/step     3678.2 img/s\n"
                 "float32: singa graph / jax.jit speed = 1.012   singa graph / torch "
                 "channels_last speed = 1.055\n"
                 "bfloat16: singa graph / jax.jit speed = 0.981\n")
    found = check.parse_mixed_precision(mixed_out)
    assert found["vs_jax"] == {"float32": 1.012, "bfloat16": 0.981}
    assert len(found["summary"]) == 3

    info_out = ("  jax:             0.10.2\n  default backend: gpu\n"
                "  gpu:0:           kind NVIDIA H100 80GB HBM3, compute capability 9.0\n"
                "  cpu:0:           kind cpu\n  gpu arithmetic:  tensorfloat32\n")
    assert check.parse_info(info_out) == {"jax": "0.10.2", "backend": "gpu",
                                          "device_kinds": ["NVIDIA H100 80GB HBM3"],
                                          "arithmetic": "tensorfloat32"}
    result = check.Result("info", numbers=check.parse_info(info_out))
    assert check.device_name(result, 10) == "1 x NVIDIA H100 80GB HBM3 (backend gpu)"


def test_children_share_a_gpu_and_run_this_checkout(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    env = check.child_env()
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # the user's own stands
    assert check.child_env()["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
