"""ONNX import: an ONNX model becomes ONE pure JAX function, run as one singa_jax operator.

``prepare(model)`` checks the model (``onnx.checker``), looks every node up in the op table
(:mod:`.tensor_ops`, :mod:`.nn_ops`, :mod:`.cast_ops`,
:mod:`singa_jax._src.onnx.sequence_ops`) and rejects, before anything runs, an op type, attribute or
attribute value it cannot run, naming the node, op type and opset (the checked graph:
:class:`~singa_jax.sonnx.GraphProgram`).
It sorts the initializers: float ones feeding computations become trainable parameters (singa_jax
Tensors named as in the ONNX file), batch-norm statistics become states, and everything else
(integer tensors, shapes, axes, scales...) stays a NumPy constant. Values computed only from
constants and shapes (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains) are folded
while tracing, so the compiled program sees static shapes and the batch size can change.

``SingaRep.run`` calls :class:`GraphOp`: an autograd Operator whose forward is the whole graph as
one cached ``jax.jit`` kernel and whose backward is that kernel's ``jax.vjp``. Parameters are its
inputs, so ``autograd.backward`` yields their gradients and any singa_jax optimizer trains them;
inside a Model in graph mode the kernel is traced into the compiled training step.

Sequences and optionals (ONNX's ``seq(...)`` and ``optional(...)`` types) are tuples of arrays and
None inside the kernel (:mod:`singa_jax._src.onnx.sequence_ops`); the operator's inputs and outputs
are their arrays, flattened: a sequence input of k Tensors is k inputs of the operator.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from singa_jax._src.runtime import device as device_module
from singa_jax._src.base import modes
from singa_jax._src.autodiff import residuals
from singa_jax._src.autodiff.kernels import pullback_kernel
from singa_jax._src.layers.base import Layer
from singa_jax._src.backend.xla_options import kernel
from singa_jax._src.onnx.cast_ops import LOW_BIT_TYPES
from singa_jax._src.onnx.opsets import default_opset, make_model_at_opset
from singa_jax._src.onnx.registry import OpSpec, jax_dtype
# the graph program (re-exported: SINGA's names OnnxNode, OnnxAttributes live in its backend)
from singa_jax._src.onnx.program import (GraphProgram, HostValues, OnnxAttributes, OnnxNode,
                                         ValueInfo, lookup_spec)
from singa_jax._src.onnx.sequence_ops import (SEQUENCE, base_kind, feed_value, map_tensors,
                                              output_value, run_node_type)
from singa_jax._src.onnx.singa_names import RENAME_OPERATORS
from singa_jax._src.autodiff.operator import Operator
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.ops.elementwise import cast

__all__ = ["OnnxNode", "OnnxAttributes", "GraphProgram", "GraphOp", "GraphWeights", "SingaBackend", "SingaRep",
           "onnx_type_to_singa_type", "NP_TYPE_TO_SINGA_SUPPORT_TYPE"]

#: the dtype each NumPy dtype takes inside singa_jax (JAX without x64); None: unsupported
NP_TYPE_TO_SINGA_SUPPORT_TYPE: Dict[np.dtype, Optional[np.dtype]] = {
    np.dtype("float32"): np.dtype("float32"), np.dtype("float16"): np.dtype("float16"),
    np.dtype("float64"): np.dtype("float32"), np.dtype("int8"): np.dtype("int8"),
    np.dtype("int16"): np.dtype("int16"), np.dtype("int32"): np.dtype("int32"),
    np.dtype("int64"): np.dtype("int32"), np.dtype("uint8"): np.dtype("uint8"),
    np.dtype("uint16"): np.dtype("uint16"), np.dtype("uint32"): np.dtype("uint32"),
    np.dtype("uint64"): np.dtype("uint32"), np.dtype("bool"): np.dtype("bool"),
    np.dtype("complex64"): np.dtype("complex64"), np.dtype("complex128"): np.dtype("complex64"),
    np.dtype(jnp.bfloat16): np.dtype(jnp.bfloat16), np.dtype("object"): None,
    # ONNX's float8, float4, int4 and int2 types: JAX arrays of ml_dtypes' types, as they are
    **{dt: dt for dt in LOW_BIT_TYPES},
}

_INT32 = np.iinfo(np.int32)


def onnx_type_to_singa_type(onnx_type: int) -> Optional[np.dtype]:
    """The dtype an ONNX element type (``TensorProto.FLOAT``...) has in singa_jax."""
    return NP_TYPE_TO_SINGA_SUPPORT_TYPE.get(np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type)))


# ------------------------------------------------------------------------------------------
# the autograd operator: the whole graph as one kernel
# ------------------------------------------------------------------------------------------
@kernel(static_argnums=(0, 1, 2, 3))
def _graph_forward(program: GraphProgram, wanted, training, host, key, inputs, params, states):
    return program.evaluate(wanted, training, host, key, inputs, params, states)


@kernel(static_argnums=(0, 1, 2, 3, 4))
def _graph_forward_vjp(program, wanted, training, host, diff, key, inputs, params, states):
    # inputs: one pytree per dynamic input (a sequence: a tuple); diff marks the flat arrays
    flat, tree = jax.tree_util.tree_flatten(tuple(inputs))
    n_in = len(flat)

    def f(*xs):
        return program.evaluate(wanted, training, host, key, tree.unflatten(xs[:n_in]),
                                xs[n_in:], states)

    # no copies of the inputs or outputs the pullback keeps
    return residuals.vjp(f, diff, flat + list(params))


def _cotangent(dy: Any, aval: jax.ShapeDtypeStruct) -> Any:
    if not jnp.issubdtype(aval.dtype, jnp.inexact):
        return np.zeros(aval.shape, jax.dtypes.float0)
    if dy is None:
        return jnp.zeros(aval.shape, aval.dtype)
    return jnp.asarray(dy, aval.dtype)


class GraphOp(Operator):
    """The imported graph as one autograd operator. Inputs: the arrays of the graph's dynamic
    inputs, then its parameters, then its states; outputs: the arrays of the wanted values,
    then the states' new values. A sequence (or optional) input or output contributes its
    arrays, flattened: ``in_tree`` (the treedef of the dynamic inputs' values, a tuple with a
    tuple per sequence and None per empty optional; None: one array each) puts them back
    together, and the forward sets ``out_tree``, the wanted values' treedef."""

    takes_arrays = True  # forward/backward see jax.Arrays (not SINGA's CTensors)

    def __init__(self, program: GraphProgram, wanted: Tuple[str, ...], host: HostValues,
                 in_tree: Any = None):
        super().__init__(name=f"ONNX:{program.name or 'graph'}")
        self.program, self.wanted, self.host = program, wanted, host
        self.in_tree = in_tree
        self.out_tree = None
        self._vjp = None

    def __call__(self, *xs: Tensor):
        self._diff = tuple(bool(x.requires_grad) and jnp.issubdtype(x.dtype, jnp.inexact)
                           for x in xs[:len(xs) - len(self.program.states)])
        return super().__call__(*xs)

    def forward(self, *arrays):
        p = self.program
        n_in = len(p.dynamic_inputs()) if self.in_tree is None else self.in_tree.num_leaves
        n_par = len(p.params)
        flat_inputs, params = list(arrays[:n_in]), arrays[n_in:n_in + n_par]
        inputs = tuple(flat_inputs) if self.in_tree is None else \
            tuple(self.in_tree.unflatten(flat_inputs))
        states = arrays[n_in + n_par:]
        training = modes.is_training()
        key, differentiated = None, False
        if (p.needs_key and training) or p.key_in_eval:
            key = (self.device or device_module.get_default_device()).next_key()
        if p.value_dependent:  # output shapes depend on values: run op by op, no jit
            outs, updates = p.evaluate(self.wanted, training, self.host, key, inputs, params,
                                       states)
        elif self.requires_grad and training and any(self._diff):
            outs, vjp, updates = _graph_forward_vjp(p, self.wanted, training, self.host,
                                                    self._diff, key, inputs, params, states)
            self._vjp = residuals.join(vjp, flat_inputs + list(params), outs)
            differentiated = True
        else:
            outs, updates = _graph_forward(p, self.wanted, training, self.host, key, inputs,
                                           params, states)
        flat_outs, self.out_tree = jax.tree_util.tree_flatten(outs)
        flat_outs = [jnp.asarray(o) for o in flat_outs]
        if differentiated:
            self._avals = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in flat_outs)
        return tuple(flat_outs) + tuple(updates)

    def backward(self, *dys):
        if self._vjp is None:
            raise RuntimeError(f"{self.name}: backward needs a forward run in training mode "
                               f"(autograd.training = True) with an input that requires grad")
        cts = [_cotangent(d, a) for d, a in zip(dys, self._avals)]
        grads = iter(pullback_kernel(self._vjp, self.out_tree.unflatten(cts)))
        self._vjp = None
        dxs = [next(grads) if d else None for d in self._diff]
        return tuple(dxs) + (None,) * len(self.program.states)

    def release(self) -> None:
        super().release()
        self._vjp = None


# ------------------------------------------------------------------------------------------
# SingaRep: the prepared model (a Layer holding the parameters)
# ------------------------------------------------------------------------------------------
class GraphWeights(Layer):
    """The parameters and states of an imported graph as a Layer, under their ONNX names (so a
    Model holding it saves, loads and trains them like any layer's)."""

    def __init__(self, params: Dict[str, Tensor], states: Dict[str, Tensor]):
        super().__init__()
        self.params, self.states = params, states
        self._initialized = True

    def get_params(self) -> Dict[str, Tensor]:
        return dict(self.params)

    def get_states(self) -> Dict[str, Tensor]:
        return {**self.states, **self.params}


class SingaRep(BackendRep):
    """A prepared ONNX model. ``run(x)`` runs it; its parameters (``get_params()``, named as in
    the ONNX file) and batch-norm statistics (``get_states()``) are singa_jax Tensors held by
    the layer ``weights``, so it trains like a layer. Args follow SINGA's: ``params`` (initial values ``{name: ndarray}``),
    ``inputs`` and ``outputs`` (value infos), ``layers`` (the :class:`GraphProgram`), ``device``.

    Device: the weights start on ``device`` (``dev``), where NumPy inputs go too. The first run
    with Tensor inputs moves them to those Tensors' device, as SINGA's first ``run`` does; later
    runs keep them there (an optimizer's slots live beside them) and reject Tensors elsewhere.
    """

    def __init__(self, params: Dict[str, np.ndarray], inputs: Sequence[ValueInfo],
                 outputs: Sequence[ValueInfo], layers: GraphProgram, device: Any = "CPU"):
        super().__init__()
        self.program = layers
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.dev = _device(device)
        self.init_values = params
        self.params: Dict[str, Tensor] = {}
        self.states: Dict[str, Tensor] = {}
        self.tensor_count: Dict[str, int] = {}
        self.has_initialized = False
        self.is_graph = False
        # set by the first run with Tensor inputs, which moves the weights to their device
        self._placed = False
        self.initialize()

    # --- SINGA's helpers ------------------------------------------------------------------
    def initialize(self) -> None:
        """Create the parameter and state Tensors (once) from the initial values."""
        if self.has_initialized:
            return
        p = self.program
        for name in p.params:
            self.params[name] = Tensor(data=_to_jax(self.init_values[name]), device=self.dev,
                                              requires_grad=True, stores_grad=True, name=name)
        for name in p.states:
            self.states[name] = Tensor(data=_to_jax(self.init_values[name]), device=self.dev,
                                              requires_grad=False, name=name)
        self.outputs_info = {o.name: o for o in self.outputs}
        self.weights = GraphWeights(self.params, self.states)
        self.init_tensor_count()
        self.has_initialized = True

    def init_tensor_count(self) -> Dict[str, int]:
        """How many nodes read each value (SINGA frees a value when its count reaches zero; XLA
        does that here, the counts are informational)."""
        self.tensor_count = collections.Counter(n for node, _ in self.program.nodes
                                                for n in node.inputs if n)
        return self.tensor_count

    def get_s(self, name: str, node: OnnxNode, tensor_dict: Dict[str, Any]) -> Any:
        """The value of ``name`` for ``node``: from ``tensor_dict``, else a parameter, state or
        constant of the model."""
        for store in (tensor_dict, self.params, self.states, self.program.constants):
            if name in store:
                return store[name]
        raise KeyError(f"node '{node.name}' ({node.op_type}): no value named '{name}'")

    def handle_special_ops(self, node: OnnxNode, op: OpSpec, tensor_dict: Dict[str, Any]) -> None:
        """Check that the values ``node`` reads exist (SINGA fixed layer sizes up here; every
        op of the table infers them from its inputs)."""
        for name in node.inputs:
            if name:
                self.get_s(name, node, tensor_dict)

    def to_input_tensor(self, x: Sequence[Any]) -> Dict[str, Any]:
        """``{input name: Tensor}`` from the arrays or Tensors ``x`` (arrays go to ``dev``),
        checked against the graph's declared inputs (count, rank, fixed dimensions but the
        leading, batch one, element kind). A sequence input's value is a tuple of Tensors, an
        empty optional's None."""
        self._check_count(x)
        return self._feeds(x, self.dev)

    def _feeds(self, x: Sequence[Any], dev: device_module.Device) -> Dict[str, Any]:
        return {info.name: feed_value(info.kind, value, f"{self._what()}: input '{info.name}'",
                                      lambda v, elem: self._check_input(info, v, dev, elem))
                for info, value in zip(self.inputs, x)}

    def _check_count(self, x: Sequence[Any]) -> None:
        if len(x) != len(self.inputs):
            raise ValueError(f"{self._what()}: expects {len(self.inputs)} input(s) "
                             f"{[v.name for v in self.inputs]}, got {len(x)}")

    def to_output_tensor(self, y: Tensor, out_name: str) -> np.ndarray:
        """A result (or one tensor of a sequence result) as a NumPy array of the graph's
        declared element type."""
        arr = np.asarray(y.array if isinstance(y, Tensor) else y)
        info = self.outputs_info.get(out_name)
        if info is not None and info.dtype:
            arr = arr.astype(helper.tensor_dtype_to_np_dtype(info.dtype))
        return arr

    # --- running --------------------------------------------------------------------------
    def run(self, x: Sequence[Any], **kwargs: Any) -> List[Any]:
        """Run the model on ``x`` (a list of arrays or Tensors, in the graph's input order).

        Returns the graph outputs as NumPy arrays (when ``x`` holds arrays) or Tensors (when it
        holds Tensors; differentiable, for training). A sequence (input or output) is a list of
        them, an empty optional None. ``last_layers=k`` stops after node k and returns its
        outputs; a negative k is node (k + 1) mod n, SINGA's rule: -1 is the first node
        (SINGA's test_inference expects the first conv's output), -2 the whole graph, -3 all
        but the last node. ``aux_output`` adds the values of other names."""
        as_numpy = not any(isinstance(v, Tensor) for _, v in _tensors_of(self.inputs, x))
        if as_numpy:  # arrays in: inference (the ONNX backend API), whatever modes.is_training()
            with modes.training_mode(False):
                return self._run(x, as_numpy, **kwargs)
        return self._run(x, as_numpy, **kwargs)

    def _run(self, x: Sequence[Any], as_numpy: bool, **kwargs: Any) -> List[Any]:
        x = list(x)
        self._check_count(x)
        dev = self._run_device(x)
        feeds = self._feeds(x, dev)
        wanted = self._wanted(kwargs.get("last_layers"), kwargs.get("aux_output", ()))
        host = HostValues({n: _host_value(self._what(), n, feeds[n]) for n in
                           self.program.host_inputs})
        # the dynamic inputs' Tensors, flattened (a sequence gives its Tensors, an empty
        # optional none); the treedef puts them back together inside the kernel
        dynamic = tuple(feeds[v.name] for v in self.program.dynamic_inputs())
        flat, in_tree = jax.tree_util.tree_flatten(
            dynamic, is_leaf=lambda v: isinstance(v, Tensor))
        # every check passed: only now may the weights move
        if dev is not self.dev:
            self._move_weights(dev)
        if not as_numpy:
            self._placed = True
        op = GraphOp(self.program, wanted, host, in_tree)
        args = flat + [self.params[n] for n in self.program.params]
        args += [self.states[n] for n in self.program.states]
        ys = op(*args)
        n_out = op.out_tree.num_leaves
        outs = op.out_tree.unflatten(ys[:n_out])
        new_states = ys[n_out:]
        if modes.is_training():
            for name, t in zip(self.program.states, new_states):
                self.states[name].array = t.array
        if as_numpy:
            return [output_value(y, lambda t, n=n: self.to_output_tensor(t, n))
                    for y, n in zip(outs, wanted)]
        return [output_value(y, lambda t: t) for y in outs]

    def _run_device(self, x: Sequence[Any]) -> device_module.Device:
        """The device this run computes on: that of its Tensor inputs (which must share one),
        else ``dev``. Raises when the weights cannot follow it there."""
        tensors = [(n, v) for n, v in _tensors_of(self.inputs, x) if isinstance(v, Tensor)]
        if not tensors:
            return self.dev
        name, first = tensors[0]
        dev = first.device
        elsewhere = [f"'{n}' on {t.device}" for n, t in tensors[1:] if t.device is not dev]
        if elsewhere:
            raise ValueError(f"{self._what()}: the Tensor inputs are on different devices: "
                             f"'{name}' on {dev}, {', '.join(elsewhere)}; move them to one "
                             f"device with Tensor.to_device")
        if dev is self.dev:
            return dev
        if self._placed:
            raise ValueError(f"{self._what()}: input '{name}' is on {dev}, but the model's "
                             f"weights are on {self.dev}, where its first run with Tensors put "
                             f"them (they follow the inputs' device on that run only, as in "
                             f"SINGA); move the input with Tensor.to_device({self.dev})")
        weights = list(self.params.values()) + list(self.states.values())
        if any(isinstance(t.array, jax.core.Tracer) for t in weights):
            raise ValueError(f"{self._what()}: input '{name}' is on {dev}, but the model's "
                             f"weights are on {self.dev} and cannot move inside a compiled "
                             f"(graph mode) step; run the model once eagerly first, e.g. "
                             f"Model.compile([x]) with x on {dev}")
        return dev

    def _move_weights(self, dev: device_module.Device) -> None:
        """Move every parameter and state to ``dev`` in place (the same Tensors: layers and
        optimizers holding them see the move). Concrete even when the first run is traced
        (``Model.compile`` runs it under ``jax.eval_shape``): the weights are no values of the
        trace, and a traced copy would leak out of it."""
        with jax.ensure_compile_time_eval():
            for t in list(self.params.values()) + list(self.states.values()):
                t.to_device(dev)
        self.dev = dev

    def _wanted(self, last_layers: Optional[int], aux_output: Sequence[str]) -> Tuple[str, ...]:
        nodes = self.program.nodes
        k = len(nodes) - 1 if last_layers is None else int(last_layers)
        if not -len(nodes) <= k < len(nodes):
            raise ValueError(f"{self._what()}: last_layers={last_layers} is out of range for a "
                             f"graph of {len(nodes)} nodes")
        if k < 0:  # SINGA's rule, kept as it is: -1 is node 0, -2 the last node, -3 the one before
            k = (k + 1) % len(nodes)
        if k == len(nodes) - 1:
            names = [o.name for o in self.outputs]
        else:
            names = [n for n in nodes[k][0].outputs if n]
        names += [a for a in aux_output if a not in names]
        known = set(self.program.producer) | {v.name for v in self.inputs} | \
            set(self.program.constants) | set(self.params) | set(self.states)
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"{self._what()}: no value named {missing} in the graph")
        return tuple(names)

    def _check_input(self, info: ValueInfo, value: Any, dev: device_module.Device,
                     element: str = "") -> Tensor:
        """One tensor of input ``info`` (``element`` names a sequence's element) as a Tensor
        on ``dev``, checked against the declared shape and element type."""
        what = f"{self._what()}: input '{info.name}'{element}"
        t = value if isinstance(value, Tensor) else None
        arr_shape = tuple(t.shape) if t is not None else np.shape(value)
        want = jax_dtype(info.dtype) if info.dtype else None
        got = np.dtype(t.dtype) if t is not None else np.asarray(value).dtype
        if info.shape is not None:
            # the leading (batch) axis is free: exported files often declare batch 1, and
            # SINGA checks no shape at all; every other fixed axis must match
            bad = len(arr_shape) != len(info.shape) or any(
                d is not None and d != 0 and d != s
                for d, s in list(zip(info.shape, arr_shape))[1:])
            if bad:
                shown = tuple("?" if d is None else d for d in info.shape)
                raise ValueError(f"{what} expects shape {shown}, got {arr_shape} (the "
                                 f"leading, batch axis may have any size)")
        if want is not None and got != want:
            if got.kind != want.kind and not (got.kind in "iu" and want.kind in "iu"):
                raise TypeError(f"{what} expects dtype {np.dtype(helper.tensor_dtype_to_np_dtype(info.dtype))}, "
                                f"got {got}")
        if t is None:
            arr = np.asarray(value)
            t = Tensor(data=_to_jax(arr.astype(want) if want is not None else arr),
                              device=dev, requires_grad=False)
        elif want is not None and got != want:
            t = cast(t, want)
        return t

    def _what(self) -> str:
        return f"ONNX model '{self.program.name}'" if self.program.name else "ONNX model"

    # --- parameters and states by their ONNX names (see GraphWeights) ----------------------
    def get_params(self) -> Dict[str, Tensor]:
        return self.weights.get_params()

    def get_states(self) -> Dict[str, Tensor]:
        return self.weights.get_states()

    def set_params(self, parameters: Dict[str, Any]) -> None:
        self.weights.set_params(parameters)

    def set_states(self, states: Dict[str, Any]) -> None:
        self.weights.set_states(states)


def _to_jax(arr: np.ndarray) -> np.ndarray:
    """A host array in the dtype singa_jax holds (64-bit -> 32-bit)."""
    dt = NP_TYPE_TO_SINGA_SUPPORT_TYPE.get(arr.dtype)
    if dt is None:
        raise TypeError(f"ONNX tensor of dtype {arr.dtype} is not supported")
    if arr.dtype == np.int64:
        arr = np.clip(arr, _INT32.min, _INT32.max)
    return arr.astype(dt)


def _host_value(what: str, name: str, value: Any) -> Any:
    """A host input's value on the host (a sequence's: a tuple of arrays; an empty optional's:
    None)."""
    def read(t: Tensor) -> np.ndarray:
        if isinstance(t.array, jax.core.Tracer):
            raise ValueError(f"{what}: input '{name}' decides output shapes, so its value must "
                             f"be known: pass it as an array (graph mode traces it)")
        return np.asarray(t.array).astype(np.int64) if np.issubdtype(t.dtype, np.integer) \
            else np.asarray(t.array)
    return map_tensors(read, value)


def _tensors_of(inputs: Sequence[ValueInfo], x: Sequence[Any]) -> List[Tuple[str, Any]]:
    """``(input name, value)`` for every tensor of the run's inputs ``x``: a sequence input's
    items one by one (a list of arrays or Tensors given for a tensor input is one array)."""
    out = []
    for info, value in zip(inputs, x):
        if base_kind(info.kind) == SEQUENCE and isinstance(value, (list, tuple)):
            out += [(f"{info.name}[{i}]", v) for i, v in enumerate(value)]
        else:
            out.append((info.name, value))
    return out


def _device(device: Any):
    if isinstance(device, device_module.Device):
        return device
    if device in (None, "CPU", "cpu"):
        return device_module.create_cpu_device()
    if str(device).upper() in ("CUDA", "GPU"):
        return device_module.create_cuda_gpu()
    raise ValueError(f"unknown device {device!r}: use 'CPU', 'CUDA' or a singa_jax Device")


# ------------------------------------------------------------------------------------------
# SingaBackend
# ------------------------------------------------------------------------------------------
class SingaBackend(Backend):
    """ONNX's backend interface for singa_jax: ``prepare`` a model, ``run_node`` one node."""

    _opset_version = 11  # SINGA's; any opset from 7 to the newest onnx defines is accepted
    #: SINGA's table: ONNX op type -> the SINGA operator / layer that runs it (every key is in
    #: the op table; SINGA's test_onnx_backend.py selects onnx's node tests by its keys)
    _rename_operators = RENAME_OPERATORS

    @classmethod
    def supports_device(cls, device: str) -> bool:
        platforms = {d.platform for d in jax.devices()}
        return str(device).upper() == "CPU" or ("gpu" in platforms and
                                                str(device).upper() in ("CUDA", "GPU"))

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: Any = "CPU", **kwargs: Any) -> SingaRep:
        """Check ``model`` and build its :class:`SingaRep`; every unsupported node is reported
        here, before anything runs."""
        if not isinstance(model, onnx.ModelProto):
            raise TypeError(f"prepare: expects an onnx.ModelProto, got {type(model).__name__}")
        super().prepare(model, device if isinstance(device, str) else "CPU", **kwargs)
        program = GraphProgram(model.graph, default_opset(model))
        init = {**program.params, **program.states}
        return SingaRep(init, program.inputs, program.outputs, program, device)

    @classmethod
    def _onnx_node_to_singa_op(cls, onnx_node: Any, opset_version: int = _opset_version) -> OpSpec:
        """The table row that runs ``onnx_node`` (a NodeProto or OnnxNode); UnsupportedOnnx when
        there is none or it cannot run this node."""
        node = onnx_node if isinstance(onnx_node, OnnxNode) else OnnxNode(onnx_node)
        return lookup_spec(node, opset_version)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[Any], device: str = "CPU",
                 opset_version: int = _opset_version, **kwargs: Any
                 ) -> "collections.OrderedDict[str, np.ndarray]":
        """Run one node on ``inputs`` (arrays, in the node's non-empty input order); returns
        ``{output name: array}``. Where the op takes a sequence, a list of arrays is one (and
        the output a list of arrays); None is an empty optional (an output too)."""
        named = [(i, n) for i, n in enumerate(node.input) if n]
        if len(named) != len(inputs):
            raise ValueError(f"run_node: node '{node.name}' ({node.op_type}) takes {len(named)} "
                             f"inputs, got {len(inputs)}")
        typed = [run_node_type(node, i, opset_version, v) for (i, _), v in zip(named, inputs)]
        vis = [helper.make_value_info(n, tp) for (_, n), (tp, _) in zip(named, typed)]
        arrays = [value for _, value in typed]
        outs = [onnx.ValueInfoProto(name=n) for n in node.output if n]
        graph = helper.make_graph([node], "run_node", vis, outs)
        # the IR version of the opset, not onnx's newest: the model stays loadable by any
        # runtime that reads the opset (onnxruntime 1.18 reads IR <= 10)
        model = make_model_at_opset(graph, opset_version)
        model = onnx.shape_inference.infer_shapes(model)  # types the outputs for the checker
        rep = SingaBackend.prepare(model, device)
        return collections.OrderedDict(zip([o.name for o in outs], rep.run(arrays)))
