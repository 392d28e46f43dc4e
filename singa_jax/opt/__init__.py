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
parameters with ONE jitted kernel (:func:`_fused_update`) over the lists of
params/grads/slots; :meth:`Optimizer.update` runs the same kernel on a single parameter.

Slot keys and name clashes: SINGA keys slots by ``param.name``. Here the first parameter seen
with a name owns that key; a *different* live parameter with the same name gets ``name~1``,
``name~2``, ... in order of first update (deterministic for a given model, so checkpoints
restore onto a freshly built model). A key whose owner has been garbage-collected passes to
the next parameter of that name.

See docs/optimizers.md for the update rules and how they differ from PyTorch's.

The package is split by topic: :mod:`~singa_jax.opt.schedules` (decay schedules),
:mod:`~singa_jax.opt.optimizers` (the optimizers), :mod:`~singa_jax.opt.update` (their update
rules and the fused update kernel) and :mod:`~singa_jax.opt.dist` (``DistOpt``). Import
everything from ``singa_jax.opt``.
"""
from .dist import DistOpt
from .optimizers import SGD, AdaGrad, Adam, NonFiniteStepWarning, Optimizer, RMSProp
from .schedules import Constant, DecayScheduler, ExponentialDecay
from .optax import OptaxOptimizer, from_optax  # noqa: F401 (optax-backed optimizers)

# Outside __all__, as in the single-module layout: the update-rule type, and the fused kernel that
# tests read. To replace the kernel (e.g. monkeypatch) patch ``singa_jax.opt.optimizers``'s
# ``_fused_update``: that is the name the optimizers call.
from .update import UpdateRule, _fused_update  # noqa: F401

__all__ = ["DecayScheduler", "Constant", "ExponentialDecay", "Optimizer", "SGD", "RMSProp",
           "AdaGrad", "Adam", "DistOpt", "NonFiniteStepWarning",
           # not in SINGA: an Optimizer backed by an optax GradientTransformation
           "OptaxOptimizer", "from_optax"]
