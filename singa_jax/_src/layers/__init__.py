"""SINGA's layers (``Layer`` and its families), SINGA 3.0's ``autograd.Layer`` classes, the
initializers and SINGA's ``utils`` helpers."""
