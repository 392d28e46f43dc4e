"""The core numerical tests once more with XLA's optimisations on, as users run them: the rest of
the suite compiles every program for compile time (``JAX_DISABLE_MOST_OPTIMIZATIONS=1``, set by
conftest.py), and an optimising compiler fuses and reorders what the tests check."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# the operator catalogue, the losses, the neural-network operators and the optimizers, each
# against NumPy references or jax.grad
CORE = ["tests/test_autograd_ops.py", "tests/test_autograd_loss.py", "tests/test_autograd_nn.py",
        "tests/test_opt.py"]


def test_core_numerics_hold_with_xla_optimisations_on():
    env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="0")
    probe = ("import os, jax; import singa_jax; "
             "print(os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'], "
             "jax.config.read('jax_disable_most_optimizations'))")
    flags = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, timeout=120, check=True).stdout.split()
    assert flags == ["0", "False"]  # the run below compiles optimised programs
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                           "0", *CORE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) > 100, proc.stdout[-2000:]
