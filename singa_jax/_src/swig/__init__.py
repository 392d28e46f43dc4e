"""SINGA's SWIG module (``singa_wrap``) on JAX: the C++ tensor functions on CTensors, the
handle operations, platform and build flags, and the binary ``Snapshot`` format."""
