"""SINGA's ``layer`` module on JAX: ``from singa_jax import layer; layer.Linear(10)``.

:mod:`.base` holds the Layer machinery (lazy initialisation, names, params/states); the layers
are grouped by family in :mod:`.core` (dense and parameter-free), :mod:`.conv` (convolution,
batch-norm, pooling) and :mod:`.rnn` (recurrent).
"""
from .base import Layer, LayerMeta  # noqa: F401
from .core import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from . import core as _core, conv as _conv, rnn as _rnn

__all__ = ["Layer", "LayerMeta"] + _core.__all__ + _conv.__all__ + _rnn.__all__
