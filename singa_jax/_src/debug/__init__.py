"""Seeing what a run does: SINGA's time profiling, traces with SINGA's names, why something
compiled, a run's summary, and where a non-finite value came from. Importing the package
installs the tools the engine reaches through :mod:`singa_jax._src.base.observe`."""
from singa_jax._src.debug import anomaly, capture, compiles, profiling, stats  # noqa: F401
