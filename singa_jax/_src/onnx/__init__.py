"""ONNX import and export (SINGA's ``sonnx``): the op registry and its op families, the checked
graph program, the backend that runs an ONNX graph and the frontend that writes one."""
try:
    import onnx  # noqa: F401
except ImportError as e:  # the extra is optional: say how to get it
    raise ImportError("singa_jax.sonnx needs the 'onnx' package: pip install "
                      "'singa-jax[onnx]'") from e
