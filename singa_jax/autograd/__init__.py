"""SINGA's ``autograd`` module on JAX: the engine plus the operator catalogue.

``training`` is SINGA's module flag: operators keep what backward needs only while it is True.
The engine (engine.py) knows nothing about particular ops; the catalogue is split by family.
"""
from .engine import (Operator, Operation, Dummy, infer_dependency, gradients, backward,  # noqa: F401
                     is_training)
from .function import Function, make_function  # noqa: F401
from .elementwise import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403

training = False


def __getattr__(name: str):
    """SINGA re-exports its layer classes (Linear, Conv2d, ...) and the legacy ``Layer`` base
    from autograd; they live in :mod:`singa_jax.autograd.legacy`, imported on first use because
    the layer module itself imports autograd."""
    if name.startswith("__") or name == "legacy":
        raise AttributeError(name)
    import importlib
    legacy = importlib.import_module(__name__ + ".legacy")
    try:
        return getattr(legacy, name)
    except AttributeError:
        raise AttributeError(f"module 'singa_jax.autograd' has no attribute {name!r}") from None
