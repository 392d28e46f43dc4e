"""The MLP example (SINGA's examples/mlp): operations-only and Model versions."""
