"""Shared pytest fixtures (keep tiny)."""
import os
import subprocess
import sys

import numpy as np
import pytest

# The tests check what programs compute, never how fast they run, and most programs here run a
# few times: compile each for compile time (JAX's jax_disable_most_optimizations, which singa_jax
# extends with no XLA:CPU library fusions; see backend.xla_options). Set before JAX is imported,
# so processes the tests start inherit it; JAX_DISABLE_MOST_OPTIMIZATIONS=0 tests the optimised
# programs instead.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import backend_precision  # noqa: E402

if backend_precision.emulating_tf32():  # the CPU proxy of a GPU run (see backend_precision)
    backend_precision.install_tf32_emulation()


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed, for reproducible random test inputs."""
    return np.random.default_rng(0)


def _with_training_flag(value: bool):
    from singa_jax import autograd
    saved = autograd.training
    autograd.training = value
    yield
    autograd.training = saved


@pytest.fixture
def training_mode():
    """Run a test with ``autograd.training = True`` and restore the flag afterwards."""
    yield from _with_training_flag(True)


@pytest.fixture
def eval_mode():
    """Run a test with ``autograd.training = False`` and restore the flag afterwards."""
    yield from _with_training_flag(False)


@pytest.fixture(autouse=True)
def _modes_reset_after_each_test():
    """SINGA's ``autograd.training`` default is process-wide (``Model.train()`` sets it, as in
    SINGA); reset it after every test so that no test depends on the ones before it."""
    yield
    from singa_jax._src.base import modes
    modes.set_training(False)


@pytest.fixture
def run_on_two_host_devices():
    """``run(script)``: run the Python ``script`` in a fresh process with two host CPU devices
    and assert that it ends by printing OK (its stderr is shown when it does not)."""
    def run(script: str) -> None:
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
                   JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
    return run
