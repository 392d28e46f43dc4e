"""What a public module does with the names it re-exports from ``singa_jax._src``."""
from __future__ import annotations

import sys
import types
from typing import Any, Iterable

__all__ = ["publish"]


def publish(module: str, names: Iterable[str]) -> None:
    """Make ``module`` the reported home (``__module__``) of each class and function of
    ``names`` that ``singa_jax._src`` defines -- and of a class's own methods -- so that reprs,
    pickles and the API docs name the public path. A name exported under another name (an
    alias, such as ``Operation``) or already published by another public module keeps its
    home."""
    namespace = vars(sys.modules[module])
    for name in names:
        obj = namespace[name]
        if not isinstance(obj, (type, types.FunctionType)) or obj.__name__ != name:
            continue
        home = obj.__module__
        if not home.startswith("singa_jax._src."):
            continue
        obj.__module__ = module
        if isinstance(obj, type):
            for member in vars(obj).values():
                for fn in _functions_of(member):
                    if fn.__module__ == home:
                        fn.__module__ = module


def _functions_of(member: Any) -> Iterable[types.FunctionType]:
    """The plain functions a class attribute holds (a method, a static or class method, a
    property's accessors)."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        return [f for f in (member.fget, member.fset, member.fdel) if isinstance(f, types.FunctionType)]
    return [member] if isinstance(member, types.FunctionType) else []
