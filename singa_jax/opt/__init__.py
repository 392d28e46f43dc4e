"""SINGA's ``opt`` module on JAX: optimizers and decay schedules.

An optimizer updates every parameter (a Tensor with ``stores_grad=True``) from the gradient that
``autograd.backward`` yields for it::

    sgd = opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-5)
    loss = ...                     # forward pass in training mode
    sgd(loss)                      # backward, update every parameter, step()

Everything the optimizer remembers is a plain :class:`~singa_jax.tensor.Tensor`:

* ``step_counter`` -- a float32 tensor of shape ``(1,)`` (SINGA's), incremented by :meth:`step`;
* one ``<hyper>_value`` tensor per hyper-parameter (``lr_value``, ``mom_value``, ...), the value of
  its :class:`DecayScheduler` at the current step, recomputed by :meth:`Optimizer.step` (a
  :class:`Constant`'s is set once and never rewritten). The update kernel evaluates the built-in
  (pure) schedules itself from ``step_counter``, so it reads only the values of user schedules
  that implement ``call`` on Tensors;
* per-parameter slots (``moments``, ``running_average``, ``history``, ``m``/``v``), dicts keyed by
  the parameter's name, created (zero) on the parameter's first update.

State only ever changes by rebinding ``tensor.data``, so graph mode can run the same code on
tracers inside one ``jax.jit`` and the schedule keeps advancing. One step updates all
parameters with ONE jitted kernel over the lists of params/grads/slots;
:meth:`Optimizer.update` runs the same kernel on a single parameter.

Slot keys and name clashes: SINGA keys slots by ``param.name``. Here the first parameter seen
with a name owns that key; a *different* live parameter with the same name gets ``name~1``,
``name~2``, ... in order of first update (deterministic for a given model, so checkpoints
restore onto a freshly built model). A key whose owner has been garbage-collected passes to
the next parameter of that name.

See docs/optimizers.md for the update rules and how they differ from PyTorch's. Besides
SINGA's names: :class:`NonFiniteStepWarning` (an update skipped on NaN or inf),
:func:`from_optax` (an optimizer backed by an optax transformation) and :class:`UpdateRule`.
"""
from singa_jax._src.optim.schedules import (
    DecayScheduler as DecayScheduler, Constant as Constant, ExponentialDecay as ExponentialDecay)
from singa_jax._src.optim.optimizers import Optimizer as Optimizer
from singa_jax._src.optim.algorithms import (
    SGD as SGD, RMSProp as RMSProp, AdaGrad as AdaGrad, Adam as Adam)
from singa_jax._src.optim.guard import NonFiniteStepWarning as NonFiniteStepWarning
from singa_jax._src.dist.dist import DistOpt as DistOpt
from singa_jax._src.runtime.peer_watch import PeerLostError as PeerLostError
from singa_jax._src.optim.optax import OptaxOptimizer as OptaxOptimizer, from_optax as from_optax
from singa_jax._src.optim.update import UpdateRule as UpdateRule
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "DecayScheduler", "Constant", "ExponentialDecay", "Optimizer", "SGD", "RMSProp",
    "AdaGrad", "Adam", "DistOpt", "PeerLostError", "NonFiniteStepWarning", "OptaxOptimizer",
    "from_optax", "UpdateRule"]

_publish(__name__, __all__)
