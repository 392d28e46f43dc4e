"""singa_jax: Apache SINGA's Python API on JAX (CPU, GPU and TPU through XLA)."""
from . import device, tensor, autograd  # noqa: F401

__version__ = "0.1.0"
