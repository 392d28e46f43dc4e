"""SINGA's ``autograd`` module on JAX: the engine plus the operator catalogue.

``training`` is SINGA's module flag: operators keep what backward needs only while it is True.
It is a view of :mod:`singa_jax.modes` (reading gives this thread's training mode; assigning sets
it, see there), so ``autograd.training = True`` works as in SINGA while the mode stays scoped.
The engine (engine.py) knows nothing about particular ops; the operator kit is function.py; the
catalogue is split by family. PyTorch-style autograd (``Tensor.backward``, ``.grad``, :func:`grad`,
grad mode) is in torch_style.py.
"""
import sys
import types

from .. import modes as _modes
from .engine import (Operator, Operation, Dummy, infer_dependency, gradients, backward,  # noqa: F401
                     fused_backward, is_training)
from ..modes import eager_replay, replay_speculation  # noqa: F401
from ..replay import stats as replay_stats  # noqa: F401
from .function import (Function, InvalidInput, make_function, CTensor, axis_helper, back_broadcast,  # noqa: F401
                       ctensor2numpy)
from .elementwise import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .torch_style import (grad, no_grad, enable_grad, set_grad_enabled,  # noqa: F401
                          is_grad_enabled)
from .mixed_precision import autocast, declare_policy as _declare_policy  # noqa: F401

_declare_policy()  # which op classes compute in half precision under autocast



class _AutogradModule(types.ModuleType):
    """This module's type: makes ``training`` a live view of the scoped training mode."""

    @property
    def training(self) -> bool:
        return _modes.is_training()

    @training.setter
    def training(self, mode: bool) -> None:
        _modes.set_training(mode)


sys.modules[__name__].__class__ = _AutogradModule


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
