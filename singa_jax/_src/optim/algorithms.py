"""SINGA's optimizers: :class:`SGD`, :class:`RMSProp`, :class:`AdaGrad`, :class:`Adam` -- each
an update rule (:mod:`.update`), its hyper-parameters and its slots over the
:class:`~singa_jax.opt.Optimizer` base."""
from __future__ import annotations

from typing import Any, Tuple

from singa_jax._src.base.dtypes import float32
from singa_jax._src.optim.optimizers import Optimizer
from singa_jax._src.optim.update import adagrad_rule, adam_rule, rmsprop_rule, sgd_rule

__all__ = ["SGD", "RMSProp", "AdaGrad", "Adam"]


# --------------------------------------------------------------------------------------------
# The optimizers
# --------------------------------------------------------------------------------------------
class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (SINGA's form).

    With ``g`` the gradient plus ``weight_decay * p``::

        buf = momentum * buf + (1 - dampening) * g       (buf starts at 0)
        g   = g + momentum * buf   if nesterov   else   buf
        p   = p - lr * g

    Without momentum (``momentum`` whose initial value is 0): ``p = p - lr * g``. Unlike PyTorch,
    the first step also dampens (``buf = (1 - dampening) * g``, not ``buf = g``).
    """

    _rule = staticmethod(sgd_rule)
    _slot_kinds = ("moments",)

    def __init__(self, lr: Any = 0.1, momentum: Any = 0, dampening: Any = 0,
                 weight_decay: Any = 0, nesterov: bool = False, dtype: Any = float32):
        super().__init__(lr, dtype)
        self._init_hypers(momentum=momentum, dampening=dampening, weight_decay=weight_decay)
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum.init_value <= 0 or self.dampening.init_value != 0):
            raise ValueError(f"SGD: Nesterov momentum requires a momentum > 0 and zero dampening, "
                             f"got momentum={momentum!r}, dampening={dampening!r}")
        self.moments = self._slot_dict("moments")

    def _config(self) -> Tuple:
        return (self._momentum_on(), self.nesterov)

    def _momentum_on(self) -> bool:
        return self.momentum.init_value != 0  # SINGA's switch: the initial momentum

    def _active_slot_kinds(self) -> Tuple[str, ...]:
        return self._slot_kinds if self._momentum_on() else ()


class RMSProp(Optimizer):
    """RMSProp (SINGA's form; epsilon inside the square root)::

        r = rho * r + (1 - rho) * g^2
        p = p - lr * g / sqrt(r + epsilon)
    """

    _rule = staticmethod(rmsprop_rule)
    _slot_kinds = ("running_average",)

    def __init__(self, lr: Any = 0.1, rho: Any = 0.9, epsilon: Any = 1e-8, weight_decay: Any = 0):
        super().__init__(lr)
        self._init_hypers(weight_decay=weight_decay, rho=rho, epsilon=epsilon)
        self.running_average = self._slot_dict("running_average")


class AdaGrad(Optimizer):
    """AdaGrad (SINGA's form; epsilon inside the square root)::

        s = s + g^2
        p = p - lr * g / sqrt(s + epsilon)
    """

    _rule = staticmethod(adagrad_rule)
    _slot_kinds = ("history",)

    def __init__(self, lr: Any = 0.1, epsilon: Any = 1e-8, weight_decay: Any = 0):
        super().__init__(lr)
        self._init_hypers(weight_decay=weight_decay, epsilon=epsilon)
        self.history = self._slot_dict("history")


class Adam(Optimizer):
    """Adam (bias-corrected; the same rule as PyTorch's ``Adam`` with L2 weight decay)::

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g^2
        t = step_counter + 1
        p = p - lr * (m / (1 - beta_1^t)) / (sqrt(v / (1 - beta_2^t)) + epsilon)
    """

    _rule = staticmethod(adam_rule)
    _slot_kinds = ("m", "v")

    def __init__(self, lr: Any = 0.1, beta_1: Any = 0.9, beta_2: Any = 0.999,
                 epsilon: Any = 1e-8, weight_decay: Any = 0):
        super().__init__(lr)
        self._init_hypers(weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
                          epsilon=epsilon)
        self.m = self._slot_dict("m")
        self.v = self._slot_dict("v")
