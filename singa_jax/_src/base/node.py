"""Creators: what every Tensor's ``creator`` attribute points to.

A :class:`Node` is the bookkeeping the autograd engine reads off a creator: its ``name``, the
inputs it recorded (``src``), which output is which (``y_id2idx``) and whether it needs a
gradient. ``autograd.Operator`` is the Node of a computed tensor; a :class:`Dummy` is the Node of
a leaf (a tensor nobody computed).

This module imports nothing from :mod:`singa_jax.tensor` or :mod:`singa_jax.autograd`, so that
``tensor`` can give every new Tensor its Dummy without importing the engine (which imports
``tensor``).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["Node", "Dummy"]


class Node:
    """A node of the autograd graph: the creator of one or more tensors.

    Attributes:
        name: the node's name; its outputs are named ``f"{name}:{idx}"``.
        src: one ``(creator, id(x), x or None, x.stores_grad)`` per input, recorded by the
            forward pass (empty for a leaf, and after :meth:`release`).
        y_id2idx: ``{id(output): output index}``.
        requires_grad: whether any input needs a gradient (backward runs only then).
    """

    name: str
    src: List[Tuple["Node", int, Any, bool]]
    y_id2idx: Dict[int, int]
    requires_grad: bool

    def __init__(self, name: str):
        self.name = name
        self.src = []
        self.y_id2idx = {}
        self.requires_grad = False

    def output_name(self, idx: int) -> str:
        """Name of output ``idx``: ``"<node name>:<idx>"``."""
        return f"{self.name}:{idx}"

    def grad_name(self, idx: int) -> str:
        """Name of the gradient of output ``idx``: its output name plus ``"_g"``."""
        return f"{self.output_name(idx)}_g"

    def get_params(self) -> list:
        """The parameters the node owns (none by default)."""
        return []

    def release(self) -> None:
        """Drop what the graph holds once backward has passed this node (called by the engine)."""
        self.src = []


class Dummy(Node):
    """Creator of a leaf Tensor. Holds the tensor weakly, so a leaf and its Dummy form no cycle.

    Attributes it does not have are looked up on its tensor (as SINGA's Dummy, which stores the
    tensor's attributes), e.g. ``t.creator.shape``.
    """

    def __init__(self, tensor: Any, name: Optional[str] = None):
        # tensor: the singa_jax Tensor this Dummy creates (untyped: no import of tensor here)
        super().__init__(name if name is not None else tensor.name)
        self.y_id2idx = {id(tensor): 0}
        self._tensor = weakref.ref(tensor)

    @property
    def tensor(self) -> Any:
        """The leaf Tensor, or None once it has been freed."""
        return self._tensor()

    def output_name(self, idx: int) -> str:
        """A leaf's single output is the tensor itself: the Dummy's name."""
        return self.name

    def grad_name(self, idx: int) -> str:
        return f"{self.name}_g"

    def __getattr__(self, name: str) -> Any:
        # reached only when normal lookup fails; __dict__ is read directly because __getattr__
        # also runs while the object is half built (copy, pickle)
        t = self.__dict__["_tensor"]() if "_tensor" in self.__dict__ else None
        if t is None:
            raise AttributeError(name)
        return getattr(t, name)
