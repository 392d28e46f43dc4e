"""singa_jax's implementation. Nothing here is public: import from SINGA's modules
(``singa_jax.tensor``, ``autograd``, ``layer``, ``model``, ``opt``, ...), which re-export it.

Packages are named by the stage the data has reached, and each imports only those before it:
base, backend -> runtime -> eager -> tensor -> autodiff -> ops -> layers; autodiff -> optim;
graph; dist; model; data; swig; onnx (see docs/architecture.md)."""
