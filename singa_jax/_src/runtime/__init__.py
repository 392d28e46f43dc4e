"""What runs the arrays: ``Device`` (one jax.Device and its PRNG key), SINGA's ``CTensor``, the
random samplers, DistOpt's cluster (processes, launchers) and arrays laid out over its mesh."""
