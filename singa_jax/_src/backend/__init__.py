"""Backend-specific tuning, each piece behind its own switch: XLA compile options per backend,
every backend's convolution forms, glibc malloc thresholds, Python's garbage collector, tiered
compilation, the float32 matmul precision policy, the compilation cache and the exit hook.
Imports only :mod:`~singa_jax._src.base`; the semantics never branch on the platform here."""
