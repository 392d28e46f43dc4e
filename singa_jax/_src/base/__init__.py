"""The bottom of the engine: scoped modes (training, grad, fused walks, eager replay, autocast,
graph mode's trace hook), SINGA's dtypes, the creator-graph node (``Dummy``), value checks,
the host PRNG, the environment switches and what a public module does with its names. Imports
nothing of singa_jax."""
