"""What a public module does with the names it re-exports from ``singa_jax._src``."""
from __future__ import annotations

import sys
import types
from typing import Iterable

__all__ = ["publish"]


def publish(module: str, names: Iterable[str]) -> None:
    """Make ``module`` the reported home (``__module__``) of each class and function of
    ``names`` that ``singa_jax._src`` defines, so that reprs, pickles and the API docs name the
    public path. A name exported under another name (an alias, such as ``Operation``) or
    already published by another public module keeps its home."""
    namespace = vars(sys.modules[module])
    for name in names:
        obj = namespace[name]
        if isinstance(obj, (type, types.FunctionType)) and obj.__name__ == name and \
                obj.__module__.startswith("singa_jax._src."):
            obj.__module__ = module
