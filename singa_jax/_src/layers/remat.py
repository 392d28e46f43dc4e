"""Rematerialised Layer calls: a layer's forward as ONE operator whose backward recomputes it.

Memory in a training step is mostly the residuals every operator keeps for its backward (a
convolution's input, a ReLU's output, ...), all alive from the forward until the backward
reaches them. A rematerialised call keeps only what its policy allows -- by default nothing
but the call's own inputs -- and the backward runs the layer's forward again to get the rest
(``jax.checkpoint``). A network whose blocks are rematerialised holds the blocks' inputs plus
ONE block's residuals at a time, for a second forward's arithmetic.

The call is a :class:`~singa_jax._src.autodiff.function.Function` like any other operator:
its pure function binds the layer's parameters and state (batch-norm statistics) to the given
arrays (:mod:`.pure`), runs the layer's own ``forward`` on them with nothing recorded, and
returns the outputs and the new state; the kit stores the state and keeps the pullback of
``jax.checkpoint`` of that function. So it works wherever operators do: eager (one kernel per
call), replayed eager steps and graph mode. Random draws inside (dropout) take a key the
operator draws from the device, so the recomputation draws the same masks.

Policies (:data:`POLICIES`): ``"nothing"`` saves nothing but the call's inputs (the least
memory, the most recomputation); ``"dots"`` also saves the results of matrix products and
convolutions without batch dimensions (recomputes the cheap elementwise work only);
``"offload"`` saves those products in host memory (``pinned_host``) where the backend has one
(GPUs, TPUs), copied back for the backward.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import numpy as np

from singa_jax._src.autodiff.function import Function
from singa_jax._src.layers.pure import run_forward
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["POLICIES", "checked_policy", "inside", "call"]

POLICIES: Dict[str, Callable[[], Any]] = {
    "nothing": lambda: jax.checkpoint_policies.nothing_saveable,
    "dots": lambda: jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "offload": lambda: jax.checkpoint_policies.offload_dot_with_no_batch_dims(
        "device", "pinned_host"),
}


def checked_policy(owner: str, policy: Any) -> Optional[str]:
    """``policy`` as a name of :data:`POLICIES` (True: ``"nothing"``), None for off (None,
    False), or a ValueError naming the choices. ``"offload"`` needs a backend with host memory
    spaces: on the CPU it is refused here."""
    if policy is None or policy is False:
        return None
    if policy is True:
        return "nothing"
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"{owner}: remat policy must be one of {sorted(POLICIES)} (or True, "
                         f"None), got {policy!r}")
    if policy == "offload" and jax.default_backend() == "cpu":
        raise ValueError(f"{owner}: remat policy 'offload' keeps saved values in host memory, "
                         f"which the CPU backend does not have apart from its device memory; "
                         f"use 'nothing' or 'dots' on the CPU")
    return policy


_local = threading.local()


def inside() -> bool:
    """Whether this thread is running a rematerialised call's forward (its sublayers then run
    plainly inside it)."""
    return getattr(_local, "depth", 0) > 0


class _Spec:
    """What a layer's rematerialised calls share: the layer, its policy, its parameters and
    state Tensors, and per input signature the outputs' structure and whether it draws random
    numbers. Static argument of the operator, hashed by identity."""

    __slots__ = ("layer", "policy", "params", "states", "home", "signatures", "_last")

    def __init__(self, layer: Any, policy: str):
        self.layer, self.policy = layer, policy
        params = layer.get_params()
        self.params = params
        self.states = {k: t for k, t in layer.get_states().items() if k not in params}
        tensors = list(params.values()) + list(self.states.values())
        self.home = tensors[0].device if tensors else None
        self.signatures: Dict[Tuple, Tuple[Any, bool]] = {}

    def run(self, params: Tuple, state: Tuple, inputs: Tuple, key: Any) -> Tuple[list, list]:
        """The layer's forward on arrays: (its flat outputs, its state after the call)."""
        values = {**dict(zip(self.params, params)), **dict(zip(self.states, state))}
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            out, new_state, drew = run_forward(self.layer, {**self.params, **self.states}, values,
                                               self.states, inputs, True, key, self.home)
        finally:
            _local.depth -= 1
        outputs, treedef = jax.tree_util.tree_flatten(out)
        self._last = (treedef, drew)
        return outputs, list(new_state.values())


class RematCall(Function):
    """One rematerialised call of a Layer (see the module docstring)."""

    backward_is_pullback = True

    def __init__(self, spec: _Spec, n_inputs: int, draws: bool):
        super().__init__(name=f"{type(spec.layer).__name__} (remat)", spec=spec,
                         n_inputs=n_inputs, draws=draws)
        self._spec, self._draws = spec, draws

    def reads(self) -> Tuple[Tensor, ...]:
        return tuple(self._spec.states.values())

    def writes(self) -> Tuple[Tensor, ...]:
        return tuple(self._spec.states.values())

    def needs_key(self) -> bool:
        return self._draws

    @staticmethod
    def fn(*arrays: Any, spec: _Spec, n_inputs: int, draws: bool) -> Any:
        n_params, n_state = len(spec.params), len(spec.states)
        params = arrays[:n_params]
        inputs = arrays[n_params:n_params + n_inputs]
        state = arrays[n_params + n_inputs:n_params + n_inputs + n_state]
        key = arrays[-1] if draws else None

        def forward(params, state, inputs, key):
            outputs, new_state = spec.run(params, state, inputs, key)
            return tuple(outputs), tuple(new_state)

        if spec.policy == "nothing":
            outputs, new_state = _recomputed(forward)(params, state, inputs, key)
        else:
            policy = POLICIES[spec.policy]()
            outputs, new_state = jax.checkpoint(forward, policy=policy)(params, state, inputs,
                                                                        key)
        flat = outputs + new_state
        return flat if len(flat) > 1 else flat[0]


def _is_float(x: Any) -> bool:
    return jax.numpy.issubdtype(jax.numpy.result_type(x), jax.numpy.inexact)


def _recomputed(forward: Callable) -> Callable:
    """``forward`` whose backward keeps only its arguments and recomputes the rest.

    Not ``jax.checkpoint``: its recomputation is kept apart from the forward's by optimization
    barriers, which XLA:CPU removes, and the two then merge again (the forward's values are
    kept, at more memory than without remat). Here the recomputation's inputs depend on the
    backward's incoming gradient (``x + 0 * sum(g)``, which XLA does not fold for floats), so
    no compiler can hoist it into the forward on any backend."""
    @jax.custom_vjp
    def rematerialised(params, state, inputs, key):
        return forward(params, state, inputs, key)

    def keep_arguments(params, state, inputs, key):
        return forward(params, state, inputs, key), (params, state, inputs, key)

    def recompute(saved, cotangents):
        params, state, inputs, key = saved
        leaves = [g for g in jax.tree_util.tree_leaves(cotangents) if _is_float(g)]
        zero = sum(jax.numpy.sum(g).astype(jax.numpy.float32) for g in leaves) * 0.0
        after = lambda xs: tuple(x + zero.astype(x.dtype) if _is_float(x) else x for x in xs)
        if any(_is_float(x) for x in inputs):
            inputs = after(inputs)
        else:
            params = after(params)
        _, pullback = jax.vjp(lambda p, x: forward(p, state, x, key), params, inputs)
        grad_params, grad_inputs = pullback(cotangents)
        return grad_params, _zeros_like(state), grad_inputs, _zeros_like(key)

    rematerialised.defvjp(keep_arguments, recompute)
    return rematerialised


def _zeros_like(tree: Any) -> Any:
    """Zero cotangents for arguments without a gradient (float0 for integer arrays)."""
    def zero(x: Any) -> Any:
        if _is_float(x):
            return jax.numpy.zeros_like(x)
        return np.zeros(np.shape(x), dtype=jax.dtypes.float0)
    return jax.tree_util.tree_map(zero, tree)


def call(layer: Any, args: Tuple, kwargs: Dict[str, Any]) -> Any:
    """``layer(*args)`` as one rematerialised operator, or None when the call cannot be one
    (keyword arguments, inputs that are not Tensors): the caller then runs it plainly."""
    if kwargs or not args or not all(type(a) is Tensor for a in args):
        return None
    spec = layer.__dict__.get("_remat_spec")
    if spec is None or spec.policy != layer._remat or spec.layer is not layer:
        spec = _Spec(layer, layer._remat)
        layer.__dict__["_remat_spec"] = spec  # (no structure bump: derived, not configuration)
    signature = tuple((a.shape, a.dtype) for a in args)
    known = spec.signatures.get(signature)
    if known is None:  # the outputs' structure, and whether the forward draws random numbers
        params = tuple(t.array for t in spec.params.values())
        state = tuple(t.array for t in spec.states.values())
        inputs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
        key = jax.random.PRNGKey(0)
        jax.eval_shape(lambda p, s, x, k: spec.run(p, s, x, k), params, state, inputs, key)
        treedef, drew = spec._last
        known = spec.signatures[signature] = (treedef, bool(drew and drew[0]))
    treedef, draws = known
    op = RematCall(spec, len(args), draws)
    outs = op(*spec.params.values(), *args)
    leaves = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    return jax.tree_util.tree_unflatten(treedef, leaves[:treedef.num_leaves])
