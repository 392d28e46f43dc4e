"""How the op families declare their operators: an op class from a pure function
(:func:`make_function`), SINGA's functional form of an op class (:func:`functional`: the usual
call is recorded through the kind's recipe, see :mod:`singa_jax._src.autodiff.recipes`), and one
table row giving both (:func:`declare`)."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from singa_jax._src.autodiff.function import Function, NonDifferentiable
from singa_jax._src.autodiff.recipes import kind_call, new_holder, recorded_by_kind

__all__ = ["make_function", "functional", "declare"]


# --------------------------------------------------------------------------------------------
# declaration helpers used by the op tables
# --------------------------------------------------------------------------------------------
def make_function(name: str, fn: Callable, doc: str = "") -> type:
    """A Function subclass called ``name`` computing ``fn``."""
    return type(name, (Function,), {"fn": staticmethod(fn), "__doc__": doc or fn.__doc__,
                                    "__module__": "singa_jax.autograd"})


def functional(op_cls: type, name: str, params: Sequence[str], doc: str = "") -> Callable:
    """SINGA's functional form of a parameterless op: ``name(*params) == op_cls()(*params)[0]``
    with the signature SINGA declares (``params``; ``"*l"`` means variadic)."""
    sig = inspect.Signature([
        inspect.Parameter(p.lstrip("*"), inspect.Parameter.VAR_POSITIONAL if p.startswith("*")
                          else inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])

    variadic = any(p.startswith("*") for p in params)
    # the kind's recipes (see .kinds), one per input avals: a table's op is called on tensors
    # of several shapes in one model (a ResNet's relu), and each keeps its recipe
    recipes: Optional[Dict[Any, Any]] = new_holder() if recorded_by_kind(op_cls) else None

    def f(*args, **kwargs):
        if kwargs or variadic or len(args) != len(params):  # the usual call skips the binding
            try:
                args = sig.bind(*args, **kwargs).args
            except TypeError as e:
                raise TypeError(f"{name}(): {e}") from None
            return op_cls()(*args)[0]
        if recipes is None:
            return op_cls()(*args)[0]
        try:
            key = tuple([x._data.aval for x in args])
        except AttributeError:  # (not Tensors: the engine says what is wrong)
            return op_cls()(*args)[0]
        return kind_call(recipes, key, op_cls, args)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc or op_cls.__doc__
    f.__signature__ = sig
    f.__module__ = "singa_jax.autograd"
    return f


def declare(cls_name: str, func_name: str, params: Sequence[str], fn: Callable, doc: str,
            differentiable: bool = True) -> Tuple[type, Callable]:
    """One table row: the op class ``cls_name`` computing ``fn`` and its functional form
    ``func_name(*params)``; bind both by name: ``Exp, exp = declare("Exp", "exp", ...)``."""
    bases = (Function,) if differentiable else (NonDifferentiable, Function)
    cls = type(cls_name, bases, {"fn": staticmethod(fn), "__doc__": doc,
                                 "__module__": "singa_jax.autograd"})
    return cls, functional(cls, func_name, params, doc)
