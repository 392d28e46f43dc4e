"""SINGA 3.0's ``Module`` and its ``Graph`` metaclass, public in :mod:`singa_jax.module` (see
there for how it runs)."""
from __future__ import annotations

from typing import Any

from singa_jax._src.runtime.device import Device, get_default_device
from singa_jax._src.base import modes

__all__ = ["Graph", "Module"]


class Graph(type):
    """SINGA 3.0's metaclass that wrapped ``forward``/``loss``/``optim`` to buffer their
    operations. The methods run eagerly here, so it leaves the class unchanged; it exists so
    that code naming it (``class M(metaclass=module.Graph)``) still runs."""


class Module(metaclass=Graph):
    """Base class of SINGA 3.0 networks.

    Subclasses define ``forward(*inputs)`` and usually ``loss(out, target)`` and
    ``optim(loss, ...)``; ``module(x)`` calls ``forward``. ``train()``/``eval()`` set
    ``autograd.training`` as SINGA 3.0 does.
    """

    def __init__(self) -> None:
        self.training = True
        self.graph_mode = True
        self.sequential = False
        self.initialized = False
        self._device = get_default_device()
        self._results: dict = {}
        self._called: set = set()

    def forward(self, *input: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward: subclasses of Module define "
                                  f"the forward pass")

    def loss(self, *args: Any, **kwargs: Any) -> Any:
        """The training loss of the forward output (SINGA 3.0's hook; none by default)."""

    def optim(self, *args: Any, **kwargs: Any) -> Any:
        """The backward pass and update (SINGA 3.0's hook; none by default)."""

    def train(self, mode: bool = True) -> None:
        """Set the training flag to ``mode``; like SINGA 3.0, ``autograd.training`` becomes True
        (``eval()`` turns it off)."""
        self.training = mode
        modes.set_training(True)

    def eval(self) -> None:
        self.train(mode=False)
        modes.set_training(False)

    def graph(self, mode: bool = True, sequential: bool = False) -> None:
        """Record SINGA's graph switches (the methods run eagerly either way; see the module
        docstring)."""
        self.graph_mode = mode
        self.sequential = sequential

    def on_device(self, device: Device) -> None:
        """The device the module trains on."""
        if not isinstance(device, Device):
            raise TypeError(f"Module.on_device: expected a singa_jax Device, got "
                            f"{type(device).__name__}")
        self._device = device

    def __get_name__(self) -> str:
        return type(self).__name__

    def __call__(self, *input: Any, **kwargs: Any) -> Any:
        self.initialized = True
        return self.forward(*input, **kwargs)
