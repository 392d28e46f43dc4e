"""SINGA 2.x's per-parameter optimizers and their update rules, public in
:mod:`singa_jax.optimizer` (see there)."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from singa_jax._src.tensor.tensor import Tensor

__all__ = ["Optimizer", "SGD", "Nesterov", "RMSProp", "AdaGrad", "Adam", "Regularizer",
           "CppRegularizer", "L2Regularizer", "Constraint", "CppConstraint", "L2Constraint"]


# --- update kernels (SINGA 2.x's formulas) --------------------------------------------------------
@jax.jit
def _sgd(value, grad, lr):
    return value - lr * grad


@jax.jit
def _sgd_momentum(value, grad, history, lr, mom):
    history = mom * history + lr * grad
    return value - history, history


@jax.jit
def _nesterov(value, grad, history, lr, mom):
    new_history = mom * history + lr * grad
    return value - ((1 + mom) * new_history - mom * history), new_history


@jax.jit
def _rmsprop(value, grad, history, lr, rho, delta):
    history = rho * history + (1 - rho) * jnp.square(grad)
    return value - lr * grad / jnp.sqrt(history + delta), history


@jax.jit
def _adagrad(value, grad, history, lr, delta):
    history = history + jnp.square(grad)
    return value - lr * grad / jnp.sqrt(history + delta), history


@jax.jit
def _adam(value, grad, m, v, alpha, beta_1, beta_2, epsilon):
    m = beta_1 * m + (1 - beta_1) * grad
    v = beta_2 * v + (1 - beta_2) * jnp.square(grad)
    return value - alpha * m / (jnp.sqrt(v) + epsilon), m, v


def _check_pair(op: str, grad: Any, value: Any) -> None:
    for what, t in (("grad", grad), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {what} must be a Tensor, got {type(t).__name__}")
    if grad.shape != value.shape:
        raise ValueError(f"{op}: grad of shape {grad.shape} does not match value of shape "
                         f"{value.shape}")


# --- regularizers and constraints ---------------------------------------------------------------
class Regularizer:
    """Base of the gradient regularizers."""

    def apply(self, epoch: int, value: Tensor, grad: Tensor, step: int = -1) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__}.apply: subclasses implement it")


class CppRegularizer(Regularizer):
    """SINGA's regularizer configured by a ``RegularizerConf`` protobuf: not supported."""

    def __init__(self, conf: Any):
        raise NotImplementedError("optimizer.CppRegularizer: SINGA's protobuf-configured "
                                  "regularizers are not supported; use "
                                  "optimizer.L2Regularizer(coefficient) or opt.SGD(weight_decay=)")


class L2Regularizer(Regularizer):
    """grad += coefficient * value (in place)."""

    def __init__(self, coefficient: float):
        self.coefficient = coefficient

    def apply(self, epoch: int, value: Tensor, grad: Tensor, step: int = -1) -> Tensor:
        if self.coefficient != 0:
            grad.array = grad.array + self.coefficient * value.array
        return grad


class Constraint:
    """Base of the gradient constraints (the identity)."""

    def apply(self, epoch: int, value: Tensor, grad: Tensor, step: int = -1) -> Tensor:
        return grad


class CppConstraint(Constraint):
    """SINGA's constraint configured by a ``ConstraintConf`` protobuf: not supported."""

    def __init__(self, conf: Any):
        raise NotImplementedError("optimizer.CppConstraint: SINGA's protobuf-configured "
                                  "constraints are not supported; use "
                                  "optimizer.L2Constraint(threshold)")


class L2Constraint(Constraint):
    """Rescale the gradient by ``threshold / l2`` with SINGA's ``l2`` (norm / size)."""

    def __init__(self, threshold: Optional[float] = None):
        self.threshold = threshold

    def apply(self, epoch: int, value: Tensor, grad: Tensor, step: int = -1) -> Tensor:
        if self.threshold is None:
            raise ValueError("L2Constraint.apply: no threshold was given")
        nrm = float(jnp.linalg.norm(grad.array.reshape(-1))) / grad.size()
        grad.array = grad.array * (self.threshold / nrm)
        return grad


# --- optimizers ---------------------------------------------------------------------------------
class Optimizer:
    """Base of SINGA 2.x's optimizers.

    Args:
        lr: the learning rate ``apply`` uses.
        momentum: the momentum (SGD, Nesterov).
        weight_decay: L2 coefficient (exclusive with ``regularizer``).
        regularizer: a :class:`Regularizer` applied to every gradient.
        constraint: a :class:`Constraint` applied to every gradient.
    """

    def __init__(self, lr: Optional[float] = None, momentum: Optional[float] = None,
                 weight_decay: Optional[float] = None, regularizer: Optional[Regularizer] = None,
                 constraint: Optional[Constraint] = None):
        if weight_decay is not None:
            if regularizer is not None:
                raise ValueError(f"{type(self).__name__}: cannot set weight_decay and "
                                 f"regularizer at the same time")
            regularizer = L2Regularizer(weight_decay)
        for what, obj, base in (("regularizer", regularizer, Regularizer),
                                ("constraint", constraint, Constraint)):
            if obj is not None and not isinstance(obj, base):
                raise TypeError(f"{type(self).__name__}: {what} must be a {base.__name__} "
                                f"(protobuf configurations are not supported; use "
                                f"L2Regularizer/L2Constraint), got {type(obj).__name__}")
        self.lr = lr
        self.momentum = momentum
        self.regularizer = regularizer
        self.constraint = constraint
        self.regularizers: Dict[str, Regularizer] = {}
        self.constraints: Dict[str, Constraint] = {}
        self.decay_multiplier: Dict[str, float] = {}
        self.learning_rate_multiplier: Dict[str, float] = {}
        self.history: Dict[str, jax.Array] = {}

    def register(self, name: str, specs: Any) -> None:
        """Per-parameter settings from a ``ParamSpec``-like object (``lr_mult``, ``decay_mult``);
        protobuf regularizer/constraint fields are not supported."""
        has = getattr(specs, "HasField", lambda field: False)
        if has("regularizer") or has("constraint"):
            raise NotImplementedError(f"{type(self).__name__}.register({name!r}): protobuf "
                                      f"regularizers/constraints are not supported; pass "
                                      f"regularizer=L2Regularizer(...) or "
                                      f"constraint=L2Constraint(...) to the optimizer")
        decay_mult = getattr(specs, "decay_mult", 1)
        if decay_mult != 1:
            if not isinstance(self.regularizer, L2Regularizer):
                raise ValueError(f"{type(self).__name__}.register({name!r}): decay_mult needs "
                                 f"the optimizer's weight_decay to be set")
            self.regularizers[name] = L2Regularizer(decay_mult * self.regularizer.coefficient)
        lr_mult = getattr(specs, "lr_mult", 1)
        if lr_mult != 1:
            self.learning_rate_multiplier[name] = lr_mult

    def apply_regularizer_constraint(self, epoch: int, value: Tensor, grad: Tensor,
                                     name: Optional[str] = None, step: int = -1) -> Tensor:
        """The parameter's own constraint/regularizer if registered, else the global ones."""
        constraint = self.constraints.get(name, self.constraint)
        if constraint is not None:
            grad = constraint.apply(epoch, value, grad, step)
        regularizer = self.regularizers.get(name, self.regularizer)
        if regularizer is not None:
            grad = regularizer.apply(epoch, value, grad, step)
        return grad

    def _prepare(self, epoch: int, lr: float, grad: Tensor, value: Tensor,
                 name: Optional[str], step: int) -> float:
        _check_pair(f"{type(self).__name__}.apply_with_lr", grad, value)
        self.apply_regularizer_constraint(epoch, value, grad, name, step)
        return lr * self.learning_rate_multiplier.get(name, 1.0)

    def _history(self, name: Optional[str], value: Tensor) -> jax.Array:
        h = self.history.get(name)
        return jnp.zeros_like(value.array) if h is None else h

    # a rule with one history slot: jitted (value, grad, history, lr, *hyper) -> (value, history)
    _rule: Optional[Callable] = None

    def _hyper(self) -> Tuple[float, ...]:
        return ()

    def apply_with_lr(self, epoch: int, lr: float, grad: Tensor, value: Tensor,
                      name: Optional[str] = None, step: int = -1) -> Tensor:
        """Update ``value`` in place with ``grad`` at learning rate ``lr``; returns value."""
        if type(self)._rule is None:
            raise NotImplementedError(f"{type(self).__name__}.apply_with_lr: use a subclass "
                                      f"(SGD, Nesterov, RMSProp, AdaGrad, Adam)")
        if grad.is_empty():
            return value
        lr = self._prepare(epoch, lr, grad, value, name, step)
        value.array, self.history[name] = type(self)._rule(
            value.array, grad.array, self._history(name, value), lr, *self._hyper())
        return value

    def apply(self, epoch: int, grad: Tensor, value: Tensor, name: Optional[str] = None,
              step: int = -1) -> Tensor:
        """``apply_with_lr`` at the optimizer's ``lr``."""
        if self.lr is None:
            raise ValueError(f"{type(self).__name__}.apply: the learning rate 'lr' was not set")
        return self.apply_with_lr(epoch, self.lr, grad, value, name, step)


class SGD(Optimizer):
    """SGD with momentum: history = momentum * history + lr * grad; value -= history."""

    _rule = staticmethod(_sgd_momentum)

    def _hyper(self) -> Tuple[float, ...]:
        return (self.momentum,)

    def apply_with_lr(self, epoch: int, lr: float, grad: Tensor, value: Tensor,
                      name: Optional[str] = None, step: int = -1) -> Tensor:
        if self.momentum:
            return super().apply_with_lr(epoch, lr, grad, value, name, step)
        if grad.is_empty():
            return value
        lr = self._prepare(epoch, lr, grad, value, name, step)  # regularises grad first
        value.array = _sgd(value.array, grad.array, lr)
        return value


class Nesterov(Optimizer):
    """SGD with Nesterov momentum (SINGA 2.x's C++ rule)."""

    def __init__(self, lr: Optional[float] = None, momentum: float = 0.9,
                 weight_decay: Optional[float] = None, regularizer: Optional[Regularizer] = None,
                 constraint: Optional[Constraint] = None):
        super().__init__(lr, momentum, weight_decay, regularizer, constraint)

    _rule = staticmethod(_nesterov)

    def _hyper(self) -> Tuple[float, ...]:
        return (self.momentum,)


class RMSProp(Optimizer):
    """history = rho * history + (1 - rho) * grad^2; value -= lr * grad / sqrt(history + eps)."""

    def __init__(self, rho: float = 0.9, epsilon: float = 1e-8, lr: Optional[float] = None,
                 weight_decay: Optional[float] = None, regularizer: Optional[Regularizer] = None,
                 constraint: Optional[Constraint] = None):
        super().__init__(lr, None, weight_decay, regularizer, constraint)
        self.rho = rho
        self.epsilon = epsilon

    _rule = staticmethod(_rmsprop)

    def _hyper(self) -> Tuple[float, ...]:
        return (self.rho, self.epsilon)


class AdaGrad(Optimizer):
    """history += grad^2; value -= lr * grad / sqrt(history + eps)."""

    def __init__(self, epsilon: float = 1e-8, lr: Optional[float] = None,
                 weight_decay: Optional[float] = None, lr_gen: Any = None,
                 regularizer: Optional[Regularizer] = None,
                 constraint: Optional[Constraint] = None):
        super().__init__(lr, None, weight_decay, regularizer, constraint)
        self.epsilon = epsilon

    _rule = staticmethod(_adagrad)

    def _hyper(self) -> Tuple[float, ...]:
        return (self.epsilon,)


class Adam(Optimizer):
    """Adam; the step count ``t`` advances whenever (epoch, step) changes, as in SINGA 2.x."""

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8,
                 lr: Optional[float] = None, weight_decay: Optional[float] = None,
                 regularizer: Optional[Regularizer] = None,
                 constraint: Optional[Constraint] = None):
        super().__init__(lr, None, weight_decay, regularizer, constraint)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.m: Dict[str, jax.Array] = {}
        self.v: Dict[str, jax.Array] = {}
        self.t = 0
        self.last_epoch = -1
        self.last_step = -1

    def apply_with_lr(self, epoch: int, lr: float, grad: Tensor, value: Tensor,
                      name: Optional[str] = None, step: int = -1) -> Tensor:
        if grad.is_empty():
            return value
        if step == -1:
            raise ValueError("Adam.apply_with_lr: step must be given (>= 0): it counts the "
                             "iterations for the bias correction")
        if epoch != self.last_epoch or step != self.last_step:
            self.t += 1
            self.last_step, self.last_epoch = step, epoch
        lr = self._prepare(epoch, lr, grad, value, name, step)
        zeros = jnp.zeros_like(value.array)
        alpha = lr * math.sqrt(1 - self.beta_2 ** self.t) / (1 - self.beta_1 ** self.t)
        value.array, self.m[name], self.v[name] = _adam(
            value.array, grad.array, self.m.get(name, zeros), self.v.get(name, zeros), alpha,
            self.beta_1, self.beta_2, self.epsilon)
        return value
