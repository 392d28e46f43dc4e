"""Every exit is clean: a run that ends (returns, ``sys.exit``, raises, is interrupted) while
its last steps still compute waits for them before JAX shuts down (backend.shutdown), and
never dies with SIGSEGV at exit."""
import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The parent imports singa_jax once and forks every run from there (an import costs seconds on
# 2 cores; a run's own exit is what is tested): each child starts the backend, trains a
# graph-mode Model for two steps, dispatches matmul chains on both host devices and ends
# at once, in the way its mode says, without reading any result.
SCRIPT = r'''
import atexit
import json
import os
import sys

import jax
from jax._src import xla_bridge

REPORTS = sys.argv[1]
MODES = sys.argv[2].split(",")


def report():
    """Registered before singa_jax is imported, so it runs after singa_jax's exit hook and
    before JAX's: how many live arrays are still being computed, and whether a backend is up."""
    started = xla_bridge.backends_are_initialized()
    pending = sum(not a.is_ready() for b in list(xla_bridge._backends.values())
                  for a in b.live_arrays())
    with open(os.path.join(REPORTS, str(os.getpid())), "w") as f:
        json.dump({"started": started, "pending": pending}, f)


atexit.register(report)

import numpy as np  # noqa: E402

from singa_jax import autograd, device, layer, model, opt, tensor  # noqa: E402


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layer.Linear(32)
        self.relu = layer.ReLU()
        self.fc = layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.relu(self.hidden(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def work():
    devs = device.create_cpu_devices(2)
    rng = np.random.default_rng(0)
    tx = tensor.Tensor((8, 20), devs[0])
    tx.copy_from_numpy(rng.normal(size=(8, 20)).astype(np.float32))
    ty = tensor.Tensor((8,), devs[0], tensor.int32)
    ty.copy_from_numpy(rng.integers(0, 10, 8).astype(np.int32))
    net = Net()
    net.set_optimizer(opt.SGD(lr=0.01, momentum=0.9))
    net.compile([tx], is_train=True, use_graph=True, sequential=False)
    for _ in range(2):
        net.train_one_batch(tx, ty)
    chains = []
    for dev in devs:  # ~0.1 s of work on each device, dispatched in microseconds
        x = tensor.Tensor((768, 768), dev)
        x.set_value(0.001)
        y = x
        for _ in range(3):
            y = autograd.matmul(y, x)
        chains.append(y)
    return net, chains


def parent():
    """Fork a run per mode, two at a time; print each run's exit status and report. Returns
    only in a child, with its mode."""
    statuses, running = [], {}
    for mode in MODES + [None, None]:
        if len(running) == 2 or mode is None:
            if running:
                pid, status = os.wait()
                statuses.append((running.pop(pid), pid, os.waitstatus_to_exitcode(status)))
        if mode is None:
            continue
        pid = os.fork()
        if pid == 0:
            return mode
        running[pid] = mode
    runs = []
    for mode, pid, code in statuses:
        try:
            with open(os.path.join(REPORTS, str(pid))) as f:
                runs.append(dict(json.load(f), mode=mode, code=code))
        except FileNotFoundError:  # it died before its exit hooks ran
            runs.append(dict(started=None, pending=None, mode=mode, code=code))
    print(json.dumps({"parent": os.getpid(), "runs": runs}))
    sys.exit(0)  # through the exit hooks: the parent never started a backend


mode = parent()
state = work()
if mode == "exit":
    sys.exit(0)
if mode == "raise":
    raise RuntimeError("the run failed")
if mode == "interrupt":
    raise KeyboardInterrupt
# "end": the script's last line
'''

EXPECTED = {"end": 0, "exit": 0, "raise": 1, "interrupt": -signal.SIGINT}


def test_every_exit_waits_for_dispatched_work_and_is_clean(tmp_path):
    """Eight runs, each ending in one of four ways with work still dispatched: each
    exits with its own status (never a signal such as SIGSEGV), nothing is still computing when
    JAX's exit hooks run, and a process that never computed starts no backend at exit."""
    modes = list(EXPECTED) * 2
    (tmp_path / "reports").mkdir()
    (tmp_path / "runs.py").write_text(SCRIPT)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(tmp_path / "runs.py"), str(tmp_path / "reports"),
                           ",".join(modes)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    runs = result["runs"]
    assert sorted(r["mode"] for r in runs) == sorted(modes)
    codes = [(r["mode"], r["code"]) for r in runs]
    assert all(code == EXPECTED[mode] for mode, code in codes), codes
    assert all(r["started"] for r in runs)
    assert [r["pending"] for r in runs] == [0] * len(runs), runs
    with open(tmp_path / "reports" / str(result["parent"])) as f:
        assert json.load(f) == {"started": False, "pending": 0}
