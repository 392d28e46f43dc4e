"""SINGA's operator catalogue, by family (elementwise, shape, reduce, nn, loss), with the
handles SINGA's layers configure them by, PyTorch-style autograd over them, and how the
families declare their operators."""
