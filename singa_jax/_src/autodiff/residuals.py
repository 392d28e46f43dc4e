"""A forward kernel's pullback, returned without copies of the kernel's own inputs and outputs.

An eager op's forward kernel returns its pullback (``jax.vjp``'s, a pytree of residual arrays)
next to its outputs, so that backward does not recompute the forward. Many residuals ARE one of
the kernel's inputs (matmul keeps ``x`` and ``W``, mul both factors, a convolution its input and
kernel) or one of its outputs (exp, tanh and sigmoid keep ``y``). A jitted program cannot return
an input as itself, nor one value twice: every output is a new buffer, so each such residual was
copied on every forward (the MLP's 64x784 batch, a CNN's activations) and held twice until
backward.

Inside the kernel, :func:`split` keeps in the pullback only the residuals the kernel computed and
records, in the pytree's static part, where each of the others comes from; after the call,
:func:`join` puts the caller's own arrays (the same values: arrays are immutable) back in.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax

__all__ = ["Residuals", "split", "join", "leaves", "forwarded", "vjp", "register_lean", "lean"]

_INPUT, _OUTPUT = 0, 1


@jax.tree_util.register_pytree_node_class
class Residuals:
    """A pullback without its forwarded residuals: ``computed`` are the kernel's own residual
    arrays; ``layout`` is ``(the pullback's treedef, per leaf: None for the next computed array,
    or (_INPUT | _OUTPUT, index))``."""

    __slots__ = ("computed", "layout")

    def __init__(self, computed: Sequence[Any], layout: Tuple[Any, Tuple]):
        self.computed, self.layout = computed, layout

    def tree_flatten(self):
        return tuple(self.computed), self.layout

    @classmethod
    def tree_unflatten(cls, layout, computed):
        return cls(computed, layout)


def split(pullback: Any, inputs: Sequence[Any], outputs: Any) -> Any:
    """Inside a kernel: ``pullback`` as :class:`Residuals`, without those of its leaves that
    are the kernel's ``inputs`` or leaves of its ``outputs`` (a pytree), compared by identity
    (they are traced values). Also when none is: the pullback's own structure (``jax.vjp``'s
    closures) is then never built or flattened by an eager call, only the layout's leaves."""
    leaves, treedef = jax.tree_util.tree_flatten(pullback)
    source = {id(y): (_OUTPUT, i) for i, y in enumerate(jax.tree_util.tree_leaves(outputs))}
    source.update((id(x), (_INPUT, i)) for i, x in enumerate(inputs))  # an input first
    where = tuple(source.get(id(leaf)) for leaf in leaves)
    return Residuals([leaf for leaf, w in zip(leaves, where) if w is None], (treedef, where))


def join(residuals: Any, inputs: Sequence[Any], outputs: Any) -> Any:
    """After the kernel's call: the pullback :func:`split` gave, with ``inputs`` and the leaves
    of ``outputs`` (what the kernel was called with and returned) back in their places."""
    if type(residuals) is not Residuals:
        return residuals
    return residuals.layout[0].unflatten(
        leaves(residuals, inputs, jax.tree_util.tree_leaves(outputs)))


def leaves(residuals: Residuals, inputs: Sequence[Any], outputs: Sequence[Any]) -> list:
    """The leaves of the joined pullback, without building it: each computed residual, or the
    input or output (a leaf of the kernel's ``outputs``) it is."""
    positions = _layout(residuals.layout[1], len(inputs), len(outputs))[2]
    return list(map((*inputs, *outputs, *residuals.computed).__getitem__, positions))


def forwarded(residuals: Any, inputs: Tuple, outputs: Any) -> Tuple[Tuple, Any]:
    """``(inputs, outputs)`` -- a kernel's, ``outputs`` one value or a tuple -- with None for
    each that the pullback does not forward (all of them, for a pullback not split): what a
    pullback kept until a backward must hold of them. The others -- an input only the forward
    read, an output only its Tensor holds -- are then freed with their last other holder, and
    an eager replay segment's program need not return them."""
    if type(residuals) is not Residuals:
        return (), None
    several = isinstance(outputs, tuple)  # (else one value: as Unjoined.flat reads them)
    _, _, _, keep_in, keep_out = _layout(residuals.layout[1], len(inputs),
                                         len(outputs) if several else 1)
    if not all(keep_in):
        inputs = tuple([x if k else None for x, k in zip(inputs, keep_in)])
    if several:
        if not all(keep_out):
            outputs = tuple([y if k else None for y, k in zip(outputs, keep_out)])
    elif not keep_out[0]:
        outputs = None
    return inputs, outputs


def _layout(where: Tuple, n_inputs: int, n_outputs: int) -> Tuple:
    """``(where, sizes, positions, inputs forwarded, outputs forwarded)`` of a pullback of
    layout ``where`` for a kernel of ``n_inputs`` inputs and ``n_outputs`` output leaves: where
    each of its leaves sits in ``(*inputs, *outputs, *computed)``, and which inputs and outputs
    are among them -- worked out once per layout."""
    sizes = (n_inputs, n_outputs)
    known = _LAYOUTS.get(id(where))
    if known is None or known[0] is not where or known[1] != sizes:
        used = set(w for w in where if w is not None)
        known = _LAYOUTS[id(where)] = (
            where, sizes, _positions(where, n_inputs, n_outputs),
            tuple((_INPUT, i) in used for i in range(n_inputs)),
            tuple((_OUTPUT, i) in used for i in range(n_outputs)))
    return known


# a layout's ``where`` (by id: a kernel's layouts live as long as its cached output treedef,
# and each entry keeps its own, checked to be it) -> what _layout works out
_LAYOUTS: Dict[int, Tuple] = {}


def _positions(where: Tuple, n_inputs: int, n_outputs: int) -> Tuple[int, ...]:
    """Where each leaf of a pullback of layout ``where`` sits in ``(*inputs, *outputs,
    *computed)``."""
    positions, computed = [], n_inputs + n_outputs
    for w in where:
        if w is None:
            positions.append(computed)
            computed += 1
        else:
            positions.append(w[1] if w[0] == _INPUT else n_inputs + w[1])
    return tuple(positions)


# an op's function -> ``form(static)``: the function of its arrays alone (``static`` bound)
# with the same values and gradients but a hand-written pullback that keeps fewer residuals
# than JAX's own, or None to keep ``fn`` (see register_lean)
_LEAN: Dict[Callable, Callable[[Tuple], Optional[Callable]]] = {}


def register_lean(fn: Callable, form: Callable[[Tuple], Optional[Callable]]) -> None:
    """Give the op function ``fn`` a lean form for eager forward kernels: ``form(static)``
    returns a function of the arrays (``static``'s keywords bound) computing what ``fn`` does,
    as a ``jax.custom_vjp`` whose residuals are fewer (kernel inputs and outputs, which
    :func:`split` does not copy, and small statistics), or None for ``fn`` itself. Only the
    pullback an eager forward kernel keeps takes it: ``fn`` stays what a user's ``jax.jvp``
    (forward mode, which a custom_vjp lacks) and ``jax.grad`` of :func:`Model.apply` see."""
    _LEAN[fn] = form


def lean(fn: Callable, static: Tuple) -> Callable:
    """Inside a forward kernel: ``fn`` with ``static`` (``(keyword, value)`` pairs) bound, in
    its lean form when it has one (see :func:`register_lean`)."""
    form = _LEAN.get(fn)
    f = None if form is None else form(static)
    if f is not None:
        return f
    kwargs = dict(static)
    return lambda *xs: fn(*xs, **kwargs)


def vjp(f: Callable, diff: Sequence[bool], xs: Sequence[Any]) -> Tuple[Any, Any, Any]:
    """Inside a kernel: ``jax.vjp`` of ``f(*xs)`` (which returns ``(outputs, aux)``) with
    respect to the ``xs`` marked in ``diff``, the others held fixed; returns ``(outputs,
    pullback as split against xs and the outputs, aux)``."""
    fixed = [x for d, x in zip(diff, xs) if not d]

    def over_marked(*dxs):
        it_d, it_f = iter(dxs), iter(fixed)
        return f(*[next(it_d) if d else next(it_f) for d in diff])

    ys, pullback, aux = jax.vjp(over_marked, *[x for d, x in zip(diff, xs) if d], has_aux=True)
    return ys, split(pullback, xs, ys), aux
