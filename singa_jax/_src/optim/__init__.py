"""SINGA's optimizers: the ``Optimizer`` base with its slots and non-finite guard, the update
rules and their fused kernel, decay schedules, an eager update recorded by replay, optax, and
SINGA 2.x's ``optimizer`` module."""
