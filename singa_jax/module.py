"""SINGA 3.0's ``singa.module``: ``Module``, the base class of the 3.0 examples' networks, whose
``forward``, ``loss`` and ``optim`` methods the training loop calls one after the other.

SINGA 3.0 buffers those three calls into one operator graph on the first iteration and replays
it on later ones (the inputs are copied into the same Tensors each time). The replay computes
exactly what running the methods again computes, so here they simply run, eagerly, on every
call: results are the same, and the graph switches (``graph(mode, sequential)``) are recorded
for code that reads them. For a compiled training step, port the class to
:class:`singa_jax.model.Model` (``train_one_batch`` + ``compile(..., use_graph=True)``), which
SINGA 3.1 replaced ``Module`` with.
"""
from singa_jax._src.model.module import Graph as Graph, Module as Module
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Graph", "Module"]

_publish(__name__, __all__)
