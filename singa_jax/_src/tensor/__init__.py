"""The ``Tensor`` handle over an immutable ``jax.Array``, the arithmetic behind its operators,
and SINGA's tensor module functions (creation and conversion, math)."""
