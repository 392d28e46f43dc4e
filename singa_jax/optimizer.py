"""SINGA 2.x's ``singa.optimizer``: per-parameter optimizers keyed by parameter name,
``apply_with_lr(epoch, lr, grad, value, name, step)`` updating ``value`` in place.

The update rules are SINGA 2.x's C++ ones (SGD and Nesterov accumulate ``lr * grad`` in their
history, so they differ from SINGA 5's ``opt.SGD`` when the learning rate changes); each is one
cached ``jax.jit`` kernel. New code should use :mod:`singa_jax.opt`. Configuration through
SINGA's protobuf messages (``CppRegularizer``, ``CppConstraint``, ``ParamSpec`` regularizers)
is not supported and says which class to use instead.
"""
from singa_jax._src.optim.legacy import (
    Optimizer as Optimizer, SGD as SGD, Nesterov as Nesterov, RMSProp as RMSProp,
    AdaGrad as AdaGrad, Adam as Adam, Regularizer as Regularizer, CppRegularizer as CppRegularizer,
    L2Regularizer as L2Regularizer, Constraint as Constraint, CppConstraint as CppConstraint,
    L2Constraint as L2Constraint)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "Optimizer", "SGD", "Nesterov", "RMSProp", "AdaGrad", "Adam", "Regularizer",
    "CppRegularizer", "L2Regularizer", "Constraint", "CppConstraint", "L2Constraint"]

_publish(__name__, __all__)
