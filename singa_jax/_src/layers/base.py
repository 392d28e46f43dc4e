"""SINGA's ``Layer`` base: lazy initialisation, sublayer registration, hierarchical names, and
parameter/state access.

* **Lazy initialisation.** :class:`LayerMeta` wraps every ``forward`` so that the first call runs
  ``initialize(*inputs)`` — which creates parameters from the input's shape, dtype and device —
  and wraps every ``initialize`` so it runs with the device's graph buffering switched off.
* **Sublayers and names.** Assigning a Layer to an attribute registers it (``self._layers``) and
  names it ``<parent name>.<attribute>`` (the root's children are named by attribute alone);
  a Tensor assigned to an attribute that still has a ``Dummy#N`` name is named the same way, so a
  parameter is called e.g. ``block1.conv.W``.
* **Parameters and states.** Built-in layers list their parameter attributes in
  ``_param_attrs`` and their non-trainable state attributes (BatchNorm running statistics) in
  ``_state_attrs``. ``get_params`` / ``get_states`` return ``{name: Tensor}`` for the layer and all
  initialised sublayers; ``set_params`` / ``set_states`` accept Tensors or arrays and check every
  name and shape before changing anything.
* **Structure versions.** Every layer counts the attribute assignments made on it and on every
  layer below it (``structure_version``): an assignment bumps the layer's own counter and those
  of all its parents, transitively, through weak parent links set when a layer is registered.
  A Model caches its list of state Tensors against its own counter, so one int compare tells it
  whether anything in its tree changed, and assignments in unrelated models do not disturb it.
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings
import weakref
from collections.abc import Mapping
from functools import partial, wraps
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import jax.numpy as jnp
import numpy as np

from singa_jax._src.base import observe
from singa_jax._src.base.modes import (autocast_dtype, compile_time_eval, is_grad_enabled,
                                       is_training, parameter_initialization)
from singa_jax._src.layers import last_call, remat
from singa_jax._src.tensor.tensor import Tensor

__all__ = ["LayerMeta", "Layer", "move_to_device", "positive_int", "concrete_initialization",
           "layer_tree"]

# Set by Model.compile(), whose placeholder forward is traced on shapes only: layers initialised
# during it still compute their parameters concretely (the same values an eager forward gives).
_CONCRETE_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "singa_jax.concrete_init", default=False)


@contextlib.contextmanager
def concrete_initialization():
    """Within the block, ``initialize`` runs concretely even inside a JAX trace (its arrays are
    computed, not staged), so a forward traced abstractly still builds real parameters."""
    token = _CONCRETE_INIT.set(True)
    try:
        yield
    finally:
        _CONCRETE_INIT.reset(token)


@contextlib.contextmanager
def _initialization_scope() -> Iterator[None]:
    """Where ``initialize`` runs: its random fills drawn on the host
    (:func:`modes.parameter_initialization`), and concretely under
    :func:`concrete_initialization`."""
    concrete = compile_time_eval() if _CONCRETE_INIT.get() else contextlib.nullcontext()
    with parameter_initialization(), concrete:
        yield

# Float dtypes a layer's parameters may follow (SINGA's dtype_check casts parameters to the
# input's dtype: its mixed-precision training feeds float16 batches to a model).
_MIXED_PRECISION = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
# (input dtype, parameter dtypes) whose in-place downcast has been warned about: once each
_WARNED_DOWNCASTS: set = set()


def positive_int(owner: str, what: str, value: Any) -> int:
    """``value`` as an int >= 1, or a TypeError/ValueError naming ``owner`` and ``what``
    (layer sizes: ``Linear(0)`` or ``Conv2d(kernel_size=0)`` would build empty weights)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {what} must be a positive int, got {type(value).__name__} "
                        f"{value!r}")
    if value < 1:
        raise ValueError(f"{owner}: {what} must be a positive int, got {value}")
    return int(value)


def _first_tensor_in(args: Iterable[Any]) -> Optional[Tensor]:
    """The first Tensor among ``args``, searched depth-first into lists and tuples (SINGA's layers
    also take a list of Tensors, e.g. an RNN's sequence), or None if there is none."""
    for a in args:
        if isinstance(a, Tensor):
            return a
        if isinstance(a, (list, tuple)):
            found = _first_tensor_in(a)
            if found is not None:
                return found
    return None


class LayerMeta(type):
    """Metaclass of :class:`Layer`: wraps ``initialize`` and ``forward`` of every subclass."""

    @staticmethod
    def init_wrapper(func):
        """``initialize`` runs once, with graph buffering off on the input's device, its random
        fills drawn on the host (:func:`modes.parameter_initialization`), and marks the layer
        initialised."""

        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if len(args) == 0:
                return None
            x = _first_tensor_in(args)
            if x is None:  # no Tensor input: nothing to take a device from
                with _initialization_scope():
                    func(self, *args, **kwargs)
                self._initialized = True
                return None
            dev = x.device
            prev = dev.graph_enabled()
            dev.EnableGraph(False)
            try:
                with _initialization_scope():
                    func(self, *args, **kwargs)
                self._initialized = True
            finally:
                dev.EnableGraph(prev)
            return None

        return wrapper

    @staticmethod
    def forward_wrapper(func):
        """``forward`` first initialises the layer from its inputs if that has not happened."""

        @wraps(func)
        def wrapper(self, *args, **kwargs):
            if observe.on and not observe.in_layer(self):  # (a profiler, a trace naming layers)
                return observe.layer_call(self, partial(wrapper, self, *args, **kwargs))
            x = args[0] if args else None
            if type(x) is not Tensor:  # (a list of Tensors, a keyword input, a subclass)
                x = _first_tensor_in(args)
            if x is not None:
                shape = x.shape
                if not shape or 0 in shape:  # _check_batch's test, inlined: every call runs it
                    _check_batch(self, x)
            if not self.__dict__.get("_initialized", False):
                self.initialize(*args, **kwargs)
                self._initialized = True
            elif self.__dict__.get("_remat") is not None and not remat.inside() and \
                    is_training() and is_grad_enabled():
                out = remat.call(self, args, kwargs)  # one operator, recomputed in backward
                if out is not None:
                    return out
            return func(self, *args, **kwargs)

        return wrapper

    def __new__(mcs, name, bases, attrs):
        if "initialize" in attrs:
            attrs["initialize"] = LayerMeta.init_wrapper(attrs["initialize"])
        if "forward" in attrs:
            attrs["forward"] = LayerMeta.forward_wrapper(attrs["forward"])
        return super().__new__(mcs, name, bases, attrs)


def _check_batch(layer: "Layer", x: Optional[Tensor]) -> None:
    """A layer's (first) input must be a non-empty batch: a 0-d input has no batch axis, and an
    empty one would build empty parameters or write NaN statistics (BatchNorm)."""
    if x is None:
        return
    if x.ndim() == 0:
        raise ValueError(f"{layer._describe()}: expected a batch (an input with at least one "
                         f"axis), got a 0-d input of dtype {x.dtype}")
    if 0 in x.shape:
        raise ValueError(f"{layer._describe()}: got an empty input of shape {x.shape}; a batch "
                         f"needs at least one example and no zero-sized axis")


def move_to_device(*inputs: Tensor) -> None:
    """SINGA's device_check: move every Tensor to the device of the first one (in place)."""
    target = inputs[0].device
    for t in inputs[1:]:
        if t is not None and t.device is not target:
            t.to_device(target)


def _as_array(value: Any):
    """The array behind a Tensor, NumPy array, JAX array or nested list."""
    if isinstance(value, Tensor):
        return value.array
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return value
    return np.asarray(value)


def assign_values(owner: str, what: str, targets: Dict[str, Tensor], values: Any) -> None:
    """Copy ``values`` (``{name: Tensor | array}``) into the Tensors ``targets`` of the same names.

    Every name and shape is checked first; nothing changes unless all of them fit.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{owner}.{what}: expects a dict {{name: Tensor or array}}, got "
                        f"{type(values).__name__}")
    unknown = [k for k in values if k not in targets]
    if unknown:
        known = sorted(targets)
        listed = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
        raise ValueError(f"{owner}.{what}: unknown name(s) {sorted(map(str, unknown))}; this layer "
                         f"has [{listed}] (is every sublayer initialised? call the model once, "
                         f"or compile it, before setting its values)")
    staged = []
    for name, value in values.items():
        arr = _as_array(value)
        target = targets[name]
        if tuple(arr.shape) != target.shape:
            raise ValueError(f"{owner}.{what}: '{name}' expects shape {target.shape}, got "
                             f"{tuple(arr.shape)}")
        staged.append((target, arr))
    for target, arr in staged:
        target.array = target.device.put(jnp.asarray(arr, dtype=target.dtype))


class Layer(object, metaclass=LayerMeta):
    """Base of every layer (SINGA 5.x API). Subclasses implement ``initialize(*inputs)`` (create
    parameters from the inputs) and ``forward(*inputs)``; calling the layer runs ``forward``."""

    sep = "."
    _param_attrs: Tuple[str, ...] = ()  # attributes holding trainable Tensors
    _state_attrs: Tuple[str, ...] = ()  # attributes holding non-trainable state Tensors

    # Per object (an instance's own entry shadows this 0 once bumped); see structure_version.
    _structure_version: int = 0

    def __init__(self):
        self.__dict__.setdefault("_layers", dict())
        # {id(parent): weak reference}: every layer this one is registered in (a layer may be
        # shared); they only carry structure-version bumps upwards, so they are weak
        self.__dict__.setdefault("_parents", dict())
        self.name = None
        self._initialized = False
        self._parent = None

    # --- the two methods subclasses implement ----------------------------------------------
    def initialize(self, *input) -> None:
        """Create parameters, states and handles from the first inputs (called once, by forward)."""

    def forward(self, *input):
        """Forward propagation on Tensors; returns Tensor(s)."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    # a class declared with last_call.one_operator (and the forward it was declared with): its
    # calls may be recorded from the last one
    _one_operator_class: Optional[type] = None
    _one_operator_forward: Any = None

    def __call__(self, *args, **kwargs):
        if not kwargs:
            last = self.__dict__.get(last_call.ATTRIBUTE)
            if last is not None:
                y = last.again(self, args)
                if y is not None:
                    return y
            if type(self)._one_operator_class is type(self):
                return last_call.learn(self, args)
        return self.forward(*args, **kwargs)

    def rematerialize(self, policy: Any = "nothing") -> "Layer":
        """Beyond SINGA: in training, run each call of this layer (with its sublayers) as one
        operator that keeps only what ``policy`` allows for the backward and recomputes the
        rest there -- less memory for a second forward's arithmetic. ``"nothing"`` keeps only
        the call's inputs; ``"dots"`` also keeps matrix products' and convolutions' results;
        ``"offload"`` keeps those in host memory (GPUs, TPUs); None turns it off. Values and
        gradients are those of the plain call. Returns the layer. See ``docs/memory.md``."""
        self._remat = remat.checked_policy(f"{type(self).__name__}.rematerialize", policy)
        return self

    # --- parameters and states -------------------------------------------------------------
    def _own(self, attrs: Iterable[str]) -> Dict[str, Tensor]:
        out = {}
        for attr in attrs:
            t = self.__dict__.get(attr)
            if isinstance(t, Tensor):
                out[t.name] = t
        return out

    def get_params(self) -> Dict[str, Tensor]:
        """``{name: Tensor}`` of the trainable parameters of this layer and its sublayers."""
        params = self._own(self._param_attrs)
        for sublayer in self._layers.values():
            if sublayer._initialized:
                params.update(sublayer.get_params())
        return params

    def set_params(self, parameters: Dict[str, Any]) -> None:
        """Set parameters by name from Tensors or arrays (all names and shapes checked first)."""
        assign_values(self._describe(), "set_params", self.get_params(), parameters)

    def get_states(self) -> Dict[str, Tensor]:
        """``{name: Tensor}`` of parameters plus non-trainable states (e.g. BN running stats)."""
        states = {}
        for sublayer in self._layers.values():
            if sublayer._initialized:
                states.update(sublayer.get_states())
        states.update(self._own(self._state_attrs))
        states.update(self.get_params())
        return states

    def set_states(self, states: Dict[str, Any]) -> None:
        """Set parameters and states by name (all names and shapes checked first)."""
        assign_values(self._describe(), "set_states", self.get_states(), states)

    # --- PyTorch-style access to the parameters ----------------------------------------------
    def named_parameters(self) -> Iterator[Tuple[str, Tensor]]:
        """``(name, parameter)`` for every trainable parameter, with SINGA's hierarchical names
        (``hidden.W``): the items of :meth:`get_params`. Parameters are created by the layer's
        first call, so an uninitialised layer has none."""
        return iter(self.get_params().items())

    def parameters(self) -> Iterator[Tensor]:
        """Every trainable parameter (see :meth:`named_parameters`)."""
        return iter(self.get_params().values())

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Reset the ``.grad`` of every parameter: to zeros (the gradient Tensors are kept, so a
        compiled step keeps them as state) or, with ``set_to_none``, to None."""
        for p in self.get_params().values():
            if set_to_none:
                p.grad = None
            else:
                p.zero_grad()

    # --- device / dtype --------------------------------------------------------------------
    def _on_device_and_dtype_of(self, x: Tensor, *params: Optional[Tensor]) -> bool:
        """Whether every Tensor of ``params`` (None skipped) already has ``x``'s device and
        dtype, so that :meth:`device_check` and :meth:`dtype_check` would change nothing (a
        layer's usual call, tested in one pass; False when a subclass overrides either)."""
        cls = type(self)
        if cls.device_check is not Layer.device_check or cls.dtype_check is not Layer.dtype_check:
            return False
        # (the arrays' avals: a Tensor's dtype and its array's are properties, two frames each)
        dev, dtype = x.device, x._data.aval.dtype
        for t in params:
            if t is not None and (t.device is not dev or t._data.aval.dtype != dtype):
                return False
        return True

    def device_check(self, *inputs: Tensor) -> None:
        """Move every Tensor to the device of the first input (SINGA copies them over)."""
        move_to_device(*inputs)

    def dtype_check(self, *inputs: Tensor) -> None:
        """SINGA's rule: cast every Tensor (the parameters) to the dtype of the first input, in
        place -- here only among float16, bfloat16 and float32, the dtypes of SINGA's
        mixed-precision training. Any other mismatch (an integer batch, float64) is a TypeError
        naming the layer and the dtypes; parameters are never cast to an integer dtype. A cast
        that lowers their precision (a float16 batch into float32 parameters) warns, once per
        pair of dtypes, naming autocast, which keeps float32 master weights; under autocast
        nothing is cast here (the operators cast inside their kernels)."""
        x_dtype = inputs[0].dtype
        others = [t for t in inputs[1:] if t is not None and t.dtype != x_dtype]
        if not others:
            return
        mixed = x_dtype in _MIXED_PRECISION and all(t.dtype in _MIXED_PRECISION for t in others)
        if mixed and autocast_dtype() is not None:
            return  # autocast: the parameters stay as they are, the operators cast (float32 master)
        if not mixed:
            params = ", ".join(sorted({str(t.dtype) for t in others}))
            raise TypeError(f"{self._describe()}: input of dtype {x_dtype} does not match its "
                            f"parameters ({params}); feed a floating-point batch of the "
                            f"parameters' dtype (e.g. x.as_type(tensor.float32)). Parameters "
                            f"follow the input only among float16, bfloat16 and float32 "
                            f"(mixed precision)")
        downcast = sorted({str(t.dtype) for t in others if t.dtype.itemsize > x_dtype.itemsize})
        if downcast and (x_dtype, tuple(downcast)) not in _WARNED_DOWNCASTS:
            _WARNED_DOWNCASTS.add((x_dtype, tuple(downcast)))
            warnings.warn(
                f"{self._describe()}: a {x_dtype} input casts its {', '.join(downcast)} parameters "
                f"to {x_dtype} in place (SINGA's dtype_check), losing their precision; to train "
                f"in mixed precision with {', '.join(downcast)} master weights use "
                f"Model.compile(..., autocast='{x_dtype}') or autograd.autocast('{x_dtype}') "
                f"with a {', '.join(downcast)} batch", UserWarning, stacklevel=3)
        for t in others:
            t.array = t.array.astype(x_dtype)

    # --- naming and sublayers --------------------------------------------------------------
    def _describe(self) -> str:
        """How errors name this layer: ``Conv2d 'block1.conv'`` or just ``Conv2d``."""
        name = self.__dict__.get("name")
        return f"{type(self).__name__} '{name}'" if name else type(self).__name__

    def _get_name_prefix(self) -> str:
        if self.__dict__.get("name") and self.__dict__.get("_parent") is not None:
            return self.name + Layer.sep
        return ""

    def __getattr__(self, name: str):
        layers = self.__dict__.get("_layers")
        if layers is not None and name in layers:
            return layers[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    # --- structure versions --------------------------------------------------------------------
    @property
    def structure_version(self) -> int:
        """A counter that changes whenever an attribute of this layer or of any layer in its
        subtree is assigned or deleted (a sublayer added, a parameter replaced, a layer
        initialised). Graph mode re-collects a model's state tensors only when it has changed;
        a compiled step runs no layer code, so in steady state it never does."""
        return self._structure_version

    def _bump_structure_version(self) -> None:
        """Count a change here and in every layer above (all parents, transitively)."""
        pending, seen = [self], set()
        while pending:
            layer = pending.pop()
            if id(layer) in seen:  # a layer reached through two parents is counted once
                continue
            seen.add(id(layer))
            state = layer.__dict__
            state["_structure_version"] = state.get("_structure_version", 0) + 1
            for parent_ref in state.get("_parents", {}).values():
                parent = parent_ref()
                if parent is not None:
                    pending.append(parent)

    def __getstate__(self) -> Dict[str, Any]:
        # the weak parent links are left out: a copy would point at the original's parents, and
        # pickle rejects them; __setstate__ relinks every restored layer to its sublayers
        state = dict(self.__dict__)
        state.pop("_parents", None)
        state.pop(last_call.ATTRIBUTE, None)  # (its recipe holder is the original's)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """Restore a copied or unpickled layer: its sublayers (copied along) get their parent
        link to this copy; its own parents relink it when they are restored."""
        self.__dict__.update(state)
        self.__dict__["_parents"] = dict()
        for sublayer in self.__dict__.get("_layers", {}).values():
            sublayer._link_parent(self)

    def _link_parent(self, parent: "Layer") -> None:
        self.__dict__.setdefault("_parents", dict())[id(parent)] = weakref.ref(parent)

    def _unlink_parent(self, parent: "Layer") -> None:
        self.__dict__.get("_parents", {}).pop(id(parent), None)

    # --- attribute assignment --------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        state = self.__dict__
        if name in state and state[name] is value and not isinstance(value, (Layer, Tensor)):
            # restating a plain attribute (``model.eval()`` on every evaluation step) changes
            # nothing: no structure version bump, so cached state lists stay valid
            return
        self._bump_structure_version()
        layers = self.__dict__.setdefault("_layers", dict())
        if isinstance(value, Layer):
            self.__dict__.pop(name, None)  # (a plain value it replaces)
            self._add_sublayer(name, value)
            return
        object.__setattr__(self, name, value)
        if isinstance(value, Tensor) and value.is_dummy():
            # parameters created in initialize() are named after the attribute holding them
            self._name_tensor(name, value)
        elif name == "name" and value:
            for attr, sublayer in layers.items():  # a renamed layer renames its subtree
                sublayer.name = self._get_name_prefix() + attr
            for attr in self._param_attrs + self._state_attrs:
                t = self.__dict__.get(attr)
                if isinstance(t, Tensor):
                    self._name_tensor(attr, t)

    def _add_sublayer(self, name: str, layer: "Layer") -> None:
        """Register ``layer`` under ``name`` and name it ``<this layer's name>.<name>``."""
        replaced = self._layers.get(name)
        if replaced is not None and replaced is not layer:
            replaced._unlink_parent(self)
        self._layers[name] = layer
        # also an instance attribute: ``self.conv1`` is then found by Python's own lookup
        # (through __getattr__ it cost ~1.2 us, paid on every call of every sublayer) -- unless
        # that would hide what the name already means: a class attribute (a method, a
        # property) or, for register_layers, a plain value of the instance
        state = self.__dict__
        if not hasattr(type(self), name) and not (
                name in state and not isinstance(state[name], Layer)):
            state[name] = layer
        layer.__dict__["_parent"] = self
        layer._link_parent(self)
        self._bump_structure_version()
        layer.name = self._get_name_prefix() + name

    def _name_tensor(self, attr: str, t: Tensor) -> None:
        t.name = self._get_name_prefix() + attr
        t.creator.name = t.name

    def __delattr__(self, name: str) -> None:
        if name in self._layers:
            sublayer = self._layers.pop(name)
            sublayer._unlink_parent(self)
            if self.__dict__.get(name) is sublayer:
                del self.__dict__[name]
        else:
            object.__delattr__(self, name)
        self._bump_structure_version()

    def register_layers(self, *args) -> None:
        """Register sublayers: a dict ``{name: layer}`` (kept in order) or layers as arguments,
        which are named ``<ClassName>_<index>``."""
        if len(args) == 1 and isinstance(args[0], Mapping):
            items = list(args[0].items())
        else:
            items = [(f"{type(v).__name__}_{i}", v) for i, v in enumerate(args)]
        for name, value in items:
            if isinstance(value, Layer):
                self._add_sublayer(name, value)

    # --- helpers for subclasses ------------------------------------------------------------
    def _input_error(self, what: str, expected: Any, x: Tensor) -> ValueError:
        return ValueError(f"{self._describe()}: expected an input with {what} {expected}, got an "
                          f"input of shape {x.shape}")

    @staticmethod
    def _new_param(shape: Tuple[int, ...], device, dtype: Any = None,
                   trainable: bool = True) -> Tensor:
        """A zero Tensor on ``device``: a parameter (requires and stores its gradient), or a
        state when not ``trainable``. ``dtype`` is used when it is a float dtype, else float32."""
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            dtype = jnp.float32
        elif jnp.dtype(dtype).itemsize < 4 and autocast_dtype() is not None:
            dtype = jnp.float32  # autocast: a half-precision activation, float32 master weights
        return Tensor(shape=tuple(int(s) for s in shape), device=device, dtype=dtype,
                      requires_grad=trainable, stores_grad=trainable)


def layer_tree(root: "Layer") -> List[Layer]:
    """``root`` and every layer registered below it."""
    found, stack, seen = [], [root], set()
    while stack:
        layer = stack.pop()
        if id(layer) not in seen:
            seen.add(id(layer))
            found.append(layer)
            stack.extend(layer.__dict__.get("_layers", {}).values())
    return found
