"""SINGA's ``model`` module: :class:`Model`, a Layer that trains itself.

Usage is SINGA's::

    class MLP(model.Model):
        def __init__(self):
            super().__init__()
            self.fc1, self.relu, self.fc2 = layer.Linear(256), layer.ReLU(), layer.Linear(10)
            self.loss = layer.SoftMaxCrossEntropy()

        def forward(self, x):
            return self.fc2(self.relu(self.fc1(x)))

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = self.loss(out, y)
            self.optimizer(loss)
            return out, loss

    m = MLP()
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    m.compile([placeholder_x], is_train=True, use_graph=True)
    out, loss = m(x, y)          # training: train_one_batch, one compiled XLA program per step
    m.eval(); out = m(x)          # evaluation: forward, compiled too

With ``use_graph=True`` (:meth:`Model.compile` or :meth:`Model.graph`) a call is compiled into
one ``jax.jit`` program; otherwise every operator runs eagerly. Both give the same numbers.
:class:`GraphModeError` is what graph mode raises for a step that branches on a tensor's value;
:class:`DeviceMemoryError` what a step raises when it does not fit in device memory (no state
changed: a smaller batch can be tried);
:class:`tiered_compilation` chooses whether a step's first call runs a quickly compiled
program while the optimised one compiles.
"""
from singa_jax._src.model.model import ModelMeta as ModelMeta, Model as Model
from singa_jax._src.graph.runner import GraphModeError as GraphModeError
from singa_jax._src.graph.errors import DeviceMemoryError as DeviceMemoryError
from singa_jax._src.backend.tiers import tiered_compilation as tiered_compilation
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "ModelMeta", "Model", "GraphModeError", "DeviceMemoryError", "tiered_compilation"]

_publish(__name__, __all__)
