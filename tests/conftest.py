"""Shared pytest fixtures (keep tiny)."""
import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed, for reproducible random test inputs."""
    return np.random.default_rng(0)


@pytest.fixture
def training_mode():
    """Run a test with ``autograd.training = True`` and restore the flag afterwards."""
    from singa_jax import autograd
    saved = autograd.training
    autograd.training = True
    yield
    autograd.training = saved


@pytest.fixture(autouse=True)
def _modes_reset_after_each_test():
    """SINGA's ``autograd.training`` default is process-wide (``Model.train()`` sets it, as in
    SINGA); reset it after every test so that no test depends on the ones before it."""
    yield
    from singa_jax import modes
    modes.set_training(False)
