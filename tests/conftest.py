"""Shared pytest fixtures (keep tiny)."""
import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed, for reproducible random test inputs."""
    return np.random.default_rng(0)
