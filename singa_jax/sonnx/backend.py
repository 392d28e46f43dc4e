"""ONNX import: an ONNX model becomes ONE pure JAX function, run as one singa_jax operator.

``prepare(model)`` checks the model (``onnx.checker``), looks every node up in the op table
(:mod:`singa_jax.sonnx.ops`, :mod:`singa_jax.sonnx.nn_ops`, :mod:`singa_jax.sonnx.cast_ops`) and
rejects, before anything runs, an op type, attribute or attribute value it cannot run, naming
the node, op type and opset.
It sorts the initializers: float ones feeding computations become trainable parameters (singa_jax
Tensors named as in the ONNX file), batch-norm statistics become states, and everything else
(integer tensors, shapes, axes, scales...) stays a NumPy constant. Values computed only from
constants and shapes (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains) are folded
while tracing, so the compiled program sees static shapes and the batch size can change.

``SingaRep.run`` calls :class:`GraphOp`: an autograd Operator whose forward is the whole graph as
one cached ``jax.jit`` kernel and whose backward is that kernel's ``jax.vjp``. Parameters are its
inputs, so ``autograd.backward`` yields their gradients and any singa_jax optimizer trains them;
inside a Model in graph mode the kernel is traced into the compiled training step.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep

from .. import autograd, device as device_module, modes, tensor
from ..autograd import residuals
from ..autograd.function import _pullback  # the eager ops' pullback kernel
from ..layer.base import Layer
from ..xla_options import kernel
from . import nn_ops  # noqa: F401 (registers the nn family in OPS)
from .cast_ops import LOW_BIT_TYPES  # (and registers Cast, CastLike in OPS)
from .frontend import make_model_at_opset
from .ops import OPS, NodeCall, OpSpec, UnsupportedOnnx, jax_dtype
from .singa_names import RENAME_OPERATORS

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

# ops whose outputs are known before running whatever their inputs are (they read shapes only)
_SHAPE_OPS = ("Shape", "Size")
_INT32 = np.iinfo(np.int32)


def onnx_type_to_singa_type(onnx_type: int) -> Optional[np.dtype]:
    """The dtype an ONNX element type (``TensorProto.FLOAT``...) has in singa_jax."""
    return NP_TYPE_TO_SINGA_SUPPORT_TYPE.get(np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type)))


class OnnxAttributes(dict):
    """A node's attributes as a plain ``{name: Python value}`` dict (SINGA's helper)."""

    @staticmethod
    def from_onnx(args: Iterable[onnx.AttributeProto]) -> "OnnxAttributes":
        d = OnnxAttributes()
        for arg in args:
            value = helper.get_attribute_value(arg)
            if isinstance(value, bytes):
                value = value.decode()
            elif isinstance(value, list) and value and isinstance(value[0], bytes):
                value = [v.decode() for v in value]
            d[arg.name] = value
        return d


class OnnxNode:
    """A NodeProto in a form convenient from Python (SINGA's class). ``weight_inputs`` names the
    inputs that are parameters or states, ``attr_inputs`` the ones that must be constants."""

    def __init__(self, node: onnx.NodeProto):
        self.name = str(node.name)
        self.op_type = str(node.op_type)
        self.domain = str(node.domain)
        self.attrs = OnnxAttributes.from_onnx(node.attribute)
        self.attr_inputs: Dict[str, str] = {}
        self.weight_inputs: Dict[str, str] = {}
        self.inputs = list(node.input)
        self.outputs = list(node.output)

    def getattr(self, key: str, default: Any = None) -> Any:
        return self.attrs[key] if key in self.attrs else default

    def set_attr_inputs(self, key: str, name: str) -> None:
        self.attr_inputs[key] = name

    def del_attr_inputs(self, key: str) -> None:
        del self.attr_inputs[key]

    def set_weight_inputs(self, key: str, name: str) -> None:
        self.weight_inputs[key] = name

    def del_weight_inputs(self, key: str) -> None:
        del self.weight_inputs[key]


ValueInfo = collections.namedtuple("ValueInfo", ["name", "dtype", "shape"])


def _value_info(vi: onnx.ValueInfoProto) -> ValueInfo:
    t = vi.type.tensor_type
    shape = None if not t.HasField("shape") else \
        tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    return ValueInfo(vi.name, t.elem_type, shape)


def node_call(node: OnnxNode, opset: int, training: bool = False, key: Any = None) -> NodeCall:
    """What a node's function sees (a fresh attribute dict: functions may add defaults)."""
    n_out = len(node.outputs)
    while n_out > 1 and not node.outputs[n_out - 1]:  # omitted trailing optional outputs
        n_out -= 1
    return NodeCall(node.name, node.op_type, opset, dict(node.attrs), n_out, training, key)


def lookup_spec(node: OnnxNode, opset: int) -> OpSpec:
    """The op-table row that runs ``node``; UnsupportedOnnx naming the node, op type, opset and
    what is missing when there is none or it cannot run this node."""
    where = f"node '{node.name}' ({node.op_type}, opset {opset})"
    if node.domain not in ("", "ai.onnx"):
        raise UnsupportedOnnx(f"{where}: operator domain '{node.domain}' is not supported "
                              f"(only the default ONNX domain)")
    spec = OPS.get(node.op_type)
    if spec is None:
        raise UnsupportedOnnx(f"{where}: op type '{node.op_type}' is not supported (see the "
                              f"op table in docs/onnx.md)")
    unknown = sorted(set(node.attrs) - set(spec.attrs))
    if unknown:
        raise UnsupportedOnnx(f"{where}: attribute(s) {unknown} not supported (this op "
                              f"understands {list(spec.attrs) or 'none'})")
    reason = spec.check(node_call(node, opset)) if spec.check else None
    if reason:
        raise UnsupportedOnnx(f"{where}: {reason} is not supported")
    if node.op_type == "LSTM" and len(node.inputs) > 7 and node.inputs[7]:
        raise UnsupportedOnnx(f"{where}: peephole weights (input P) are not supported")
    return spec


# ------------------------------------------------------------------------------------------
# the program: a checked, sorted graph that evaluates as one pure function
# ------------------------------------------------------------------------------------------
class GraphProgram:
    """An ONNX graph ready to run: nodes with their table rows, constants, and which names are
    inputs, host inputs (graph inputs whose values decide shapes), parameters and states.
    Hashed by identity: it is a static argument of the jitted kernels."""

    def __init__(self, graph: onnx.GraphProto, opset: int):
        self.opset = opset
        self.name = graph.name
        init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.inputs = [_value_info(v) for v in graph.input if v.name not in init]
        self.outputs = [_value_info(v) for v in graph.output]
        self.nodes: List[Tuple[OnnxNode, OpSpec]] = []
        for i, proto in enumerate(graph.node):
            node = OnnxNode(proto)
            node.name = node.name or f"{node.op_type}_{i}"
            self.nodes.append((node, lookup_spec(node, opset)))
        self.params, self.states, self.constants = self._sort_initializers(init)
        self.host_inputs = self._find_host_inputs()
        self.value_dependent = any(spec.value_dependent and not self._all_const(node)
                                   for node, spec in self.nodes)
        self.needs_key = any(spec.needs_key for _, spec in self.nodes)
        # a Dropout told to train by its training_mode input draws a key in inference too
        self.key_in_eval = any(node.op_type == "Dropout" and len(node.inputs) > 2 and
                               node.inputs[2] for node, _ in self.nodes)
        self.producer = {out: k for k, (node, _) in enumerate(self.nodes) for out in node.outputs}

    # --- prepare-time checks --------------------------------------------------------------
    def _call(self, node: OnnxNode, training: bool = False, key: Any = None) -> NodeCall:
        return node_call(node, self.opset, training, key)

    def _sort_initializers(self, init: Dict[str, np.ndarray]):
        """Float initializers used in a computed position -> parameters; used as batch-norm
        statistics -> states; everything else stays a NumPy constant."""
        weight_use, state_use = set(), set()
        for node, spec in self.nodes:
            for pos, name in enumerate(node.inputs):
                if name not in init:
                    continue
                if pos in spec.state:
                    state_use.add(name)
                    node.set_weight_inputs(name, name)
                elif pos in spec.static or pos in spec.const:
                    node.set_attr_inputs(name, name)
                else:
                    weight_use.add(name)
                    node.set_weight_inputs(name, name)
        params, states, consts = {}, {}, {}
        for name, arr in init.items():
            floating = np.issubdtype(arr.dtype, np.floating)
            if floating and name in state_use:
                states[name] = arr
            elif floating and name in weight_use:
                params[name] = arr
            else:
                consts[name] = arr
        return params, states, consts

    def _all_const(self, node: OnnxNode, const: Optional[set] = None) -> bool:
        const = self._const_names() if const is None else const
        return all(not n or n in const for n in node.inputs)

    def _const_names(self, host: Iterable[str] = ()) -> set:
        """Names whose values are known before running (given the host inputs)."""
        const = set(self.constants) | set(host)
        for node, spec in self.nodes:
            if node.op_type in _SHAPE_OPS or (not spec.needs_key and
                                              all(not n or n in const for n in node.inputs)):
                const.update(node.outputs)
        return const

    def _find_host_inputs(self) -> Tuple[str, ...]:
        """Graph inputs that reach an input that must be constant: their values are read on the
        host and key the compiled program. Anything else reaching one is an error."""
        inputs = {v.name for v in self.inputs}
        producer = {o: node for node, _ in self.nodes for o in node.outputs}
        const, host = self._const_names(), set()
        for node, spec in self.nodes:
            for pos in spec.static:
                if pos >= len(node.inputs) or not node.inputs[pos] or node.inputs[pos] in const:
                    continue
                stack, seen = [node.inputs[pos]], set()
                while stack:
                    name = stack.pop()
                    if name in seen or name in const:
                        continue
                    seen.add(name)
                    if name in inputs:
                        host.add(name)
                    elif name in producer and producer[name].op_type not in _SHAPE_OPS:
                        stack.extend(n for n in producer[name].inputs if n)
                    else:
                        raise UnsupportedOnnx(
                            f"node '{node.name}' ({node.op_type}, opset {self.opset}): input "
                            f"{pos} ('{node.inputs[pos]}') must be known before running, but it "
                            f"depends on '{name}', a trained or computed value")
        return tuple(v.name for v in self.inputs if v.name in host)

    # --- evaluation ------------------------------------------------------------------------
    def evaluate(self, wanted: Tuple[str, ...], training: bool, host: "HostValues", key: Any,
                 inputs: Sequence[Any], params: Sequence[Any], states: Sequence[Any]
                 ) -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
        """(values of ``wanted``, new values of the states) — pure; jit-able."""
        env: Dict[str, Any] = dict(self.constants)
        env.update(zip([v.name for v in self.dynamic_inputs()], inputs))
        env.update(host.values)
        env.update(zip(self.params, params))
        env.update(zip(self.states, states))
        updates = {}
        keys = iter(jax.random.split(key, len(self.nodes))) if key is not None else None
        for node, spec in self.nodes[:self._last_needed(wanted) + 1]:
            args = [env[n] if n else None for n in node.inputs]
            call = self._call(node, training, next(keys) if keys is not None else None)
            call.state_updates = {}
            try:
                outs = self._run_node(node, spec, call, args)
            except (TypeError, ValueError) as e:
                # JAX's own shape errors (a Gemm fed a batch that a Reshape constant folded into
                # another axis) name no node: say which one, and the shapes it was given
                if type(e) not in (TypeError, ValueError) or str(e).startswith("node '"):
                    raise
                shapes = [None if a is None else tuple(np.shape(a)) for a in args]
                raise type(e)(f"node '{node.name}' ({node.op_type}, opset {self.opset}) on "
                              f"inputs of shapes {shapes}: {e}") from e
            env.update(zip(node.outputs, outs))
            for pos, value in call.state_updates.items():
                updates[node.inputs[pos]] = value
        outs = tuple(env[n] for n in wanted)
        return outs, tuple(updates.get(n, env[n]) for n in self.states)

    def _last_needed(self, wanted: Sequence[str]) -> int:
        return max([self.producer[n] for n in wanted if n in self.producer], default=-1)

    @staticmethod
    def _run_node(node: OnnxNode, spec: OpSpec, call: NodeCall, args: List[Any]):
        folded = (node.op_type in _SHAPE_OPS and args and args[0] is not None) or \
            (not spec.needs_key and all(a is None or isinstance(a, np.ndarray) for a in args))
        if node.op_type in _SHAPE_OPS:
            out = spec.fn(call, *args)
        elif folded:
            with jax.ensure_compile_time_eval():
                out = spec.fn(call, *[a if i in spec.static else _as_dynamic(a)
                                      for i, a in enumerate(args)])
        else:
            out = spec.fn(call, *[a if i in spec.static else _as_dynamic(a)
                                  for i, a in enumerate(args)])
        outs = out if isinstance(out, tuple) else (out,)
        if folded:
            outs = tuple(np.asarray(o) for o in outs)
        return outs

    def dynamic_inputs(self) -> List[ValueInfo]:
        return [v for v in self.inputs if v.name not in self.host_inputs]


def _as_dynamic(a: Any) -> Any:
    """A constant as JAX takes it: 64-bit NumPy values become 32-bit (ints clipped, so that
    ONNX's INT64_MAX sentinels stay "very large")."""
    if not isinstance(a, np.ndarray):
        return a
    if a.dtype == np.int64:
        return jnp.asarray(np.clip(a, _INT32.min, _INT32.max).astype(np.int32))
    if a.dtype == np.uint64:
        return jnp.asarray(np.minimum(a, np.iinfo(np.uint32).max).astype(np.uint32))
    return jnp.asarray(a)


class HostValues:
    """The host inputs' values, hashable by content: a static argument of the kernels."""

    def __init__(self, values: Dict[str, np.ndarray]):
        self.values = values
        self._key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in values.items())

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, HostValues) and self._key == other._key


# ------------------------------------------------------------------------------------------
# the autograd operator: the whole graph as one kernel
# ------------------------------------------------------------------------------------------
@kernel(static_argnums=(0, 1, 2, 3))
def _graph_forward(program: GraphProgram, wanted, training, host, key, inputs, params, states):
    return program.evaluate(wanted, training, host, key, inputs, params, states)


@kernel(static_argnums=(0, 1, 2, 3, 4))
def _graph_forward_vjp(program, wanted, training, host, diff, key, inputs, params, states):
    n_in = len(inputs)

    def f(*xs):
        return program.evaluate(wanted, training, host, key, xs[:n_in], xs[n_in:], states)

    # no copies of the inputs or outputs the pullback keeps
    return residuals.vjp(f, diff, list(inputs) + list(params))


def _cotangent(dy: Any, aval: jax.ShapeDtypeStruct) -> Any:
    if not jnp.issubdtype(aval.dtype, jnp.inexact):
        return np.zeros(aval.shape, jax.dtypes.float0)
    if dy is None:
        return jnp.zeros(aval.shape, aval.dtype)
    return jnp.asarray(dy, aval.dtype)


class GraphOp(autograd.Operator):
    """The imported graph as one autograd operator. Inputs: the graph's dynamic inputs, then its
    parameters, then its states; outputs: the wanted values, then the states' new values."""

    takes_arrays = True  # forward/backward see jax.Arrays (not SINGA's CTensors)

    def __init__(self, program: GraphProgram, wanted: Tuple[str, ...], host: HostValues):
        super().__init__(name=f"ONNX:{program.name or 'graph'}")
        self.program, self.wanted, self.host = program, wanted, host
        self._vjp = None

    def __call__(self, *xs: tensor.Tensor):
        self._diff = tuple(bool(x.requires_grad) and jnp.issubdtype(x.dtype, jnp.inexact)
                           for x in xs[:len(xs) - len(self.program.states)])
        return super().__call__(*xs)

    def forward(self, *arrays):
        p = self.program
        n_in, n_par = len(p.dynamic_inputs()), len(p.params)
        inputs, params = arrays[:n_in], arrays[n_in:n_in + n_par]
        states = arrays[n_in + n_par:]
        training = bool(autograd.training)
        key = None
        if (p.needs_key and training) or p.key_in_eval:
            key = (self.device or device_module.get_default_device()).next_key()
        if p.value_dependent:  # output shapes depend on values: run op by op, no jit
            outs, updates = p.evaluate(self.wanted, training, self.host, key, inputs, params,
                                       states)
        elif self.requires_grad and training and any(self._diff):
            outs, vjp, updates = _graph_forward_vjp(p, self.wanted, training, self.host,
                                                    self._diff, key, inputs, params, states)
            self._vjp = residuals.join(vjp, list(inputs) + list(params), outs)
            self._avals = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
        else:
            outs, updates = _graph_forward(p, self.wanted, training, self.host, key, inputs,
                                           params, states)
        return tuple(jnp.asarray(o) for o in outs) + tuple(updates)

    def backward(self, *dys):
        if self._vjp is None:
            raise RuntimeError(f"{self.name}: backward needs a forward run in training mode "
                               f"(autograd.training = True) with an input that requires grad")
        cts = tuple(_cotangent(d, a) for d, a in zip(dys, self._avals))
        grads = iter(_pullback(self._vjp, cts))
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

    def __init__(self, params: Dict[str, tensor.Tensor], states: Dict[str, tensor.Tensor]):
        super().__init__()
        self.params, self.states = params, states
        self._initialized = True

    def get_params(self) -> Dict[str, tensor.Tensor]:
        return dict(self.params)

    def get_states(self) -> Dict[str, tensor.Tensor]:
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
        self.params: Dict[str, tensor.Tensor] = {}
        self.states: Dict[str, tensor.Tensor] = {}
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
            self.params[name] = tensor.Tensor(data=_to_jax(self.init_values[name]), device=self.dev,
                                              requires_grad=True, stores_grad=True, name=name)
        for name in p.states:
            self.states[name] = tensor.Tensor(data=_to_jax(self.init_values[name]), device=self.dev,
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

    def to_input_tensor(self, x: Sequence[Any]) -> Dict[str, tensor.Tensor]:
        """``{input name: Tensor}`` from the arrays or Tensors ``x`` (arrays go to ``dev``),
        checked against the graph's declared inputs (count, rank, fixed dimensions but the
        leading, batch one, element kind)."""
        self._check_count(x)
        return self._feeds(x, self.dev)

    def _feeds(self, x: Sequence[Any], dev: device_module.Device) -> Dict[str, tensor.Tensor]:
        return {info.name: self._check_input(info, value, dev)
                for info, value in zip(self.inputs, x)}

    def _check_count(self, x: Sequence[Any]) -> None:
        if len(x) != len(self.inputs):
            raise ValueError(f"{self._what()}: expects {len(self.inputs)} input(s) "
                             f"{[v.name for v in self.inputs]}, got {len(x)}")

    def to_output_tensor(self, y: tensor.Tensor, out_name: str) -> np.ndarray:
        """A result as a NumPy array of the graph's declared element type."""
        arr = np.asarray(y.array if isinstance(y, tensor.Tensor) else y)
        info = self.outputs_info.get(out_name)
        if info is not None and info.dtype:
            arr = arr.astype(helper.tensor_dtype_to_np_dtype(info.dtype))
        return arr

    # --- running --------------------------------------------------------------------------
    def run(self, x: Sequence[Any], **kwargs: Any) -> List[Any]:
        """Run the model on ``x`` (a list of arrays or Tensors, in the graph's input order).

        Returns the graph outputs as NumPy arrays (when ``x`` holds arrays) or Tensors (when it
        holds Tensors; differentiable, for training). ``last_layers=k`` stops after node k and
        returns its outputs; a negative k is node (k + 1) mod n, SINGA's rule: -1 is the first
        node (SINGA's test_inference expects the first conv's output), -2 the whole graph, -3
        all but the last node. ``aux_output`` adds the values of other names."""
        as_numpy = not any(isinstance(v, tensor.Tensor) for v in x)
        if as_numpy:  # arrays in: inference (the ONNX backend API), whatever autograd.training
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
        # every check passed: only now may the weights move
        if dev is not self.dev:
            self._move_weights(dev)
        if not as_numpy:
            self._placed = True
        op = GraphOp(self.program, wanted, host)
        args = [feeds[v.name] for v in self.program.dynamic_inputs()]
        args += [self.params[n] for n in self.program.params]
        args += [self.states[n] for n in self.program.states]
        ys = op(*args)
        outs, new_states = ys[:len(wanted)], ys[len(wanted):]
        if autograd.training:
            for name, t in zip(self.program.states, new_states):
                self.states[name].array = t.array
        if as_numpy:
            return [self.to_output_tensor(y, n) for y, n in zip(outs, wanted)]
        return list(outs)

    def _run_device(self, x: Sequence[Any]) -> device_module.Device:
        """The device this run computes on: that of its Tensor inputs (which must share one),
        else ``dev``. Raises when the weights cannot follow it there."""
        tensors = [(info.name, v) for info, v in zip(self.inputs, x)
                   if isinstance(v, tensor.Tensor)]
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

    def _check_input(self, info: ValueInfo, value: Any, dev: device_module.Device
                     ) -> tensor.Tensor:
        what = f"{self._what()}: input '{info.name}'"
        t = value if isinstance(value, tensor.Tensor) else None
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
            t = tensor.Tensor(data=_to_jax(arr.astype(want) if want is not None else arr),
                              device=dev, requires_grad=False)
        elif want is not None and got != want:
            t = autograd.cast(t, want)
        return t

    def _what(self) -> str:
        return f"ONNX model '{self.program.name}'" if self.program.name else "ONNX model"

    # --- parameters and states by their ONNX names (see GraphWeights) ----------------------
    def get_params(self) -> Dict[str, tensor.Tensor]:
        return self.weights.get_params()

    def get_states(self) -> Dict[str, tensor.Tensor]:
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


def _host_value(what: str, name: str, t: tensor.Tensor) -> np.ndarray:
    if isinstance(t.array, jax.core.Tracer):
        raise ValueError(f"{what}: input '{name}' decides output shapes, so its value must be "
                         f"known: pass it as an array (graph mode traces it)")
    return np.asarray(t.array).astype(np.int64) if np.issubdtype(t.dtype, np.integer) \
        else np.asarray(t.array)


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
        program = GraphProgram(model.graph, _default_opset(model))
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
        ``{output name: array}``."""
        names = [n for n in node.input if n]
        if len(names) != len(inputs):
            raise ValueError(f"run_node: node '{node.name}' ({node.op_type}) takes {len(names)} "
                             f"inputs, got {len(inputs)}")
        arrays = [np.asarray(a) for a in inputs]
        vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(names, arrays)]
        outs = [onnx.ValueInfoProto(name=n) for n in node.output if n]
        graph = helper.make_graph([node], "run_node", vis, outs)
        # the IR version of the opset, not onnx's newest: the model stays loadable by any
        # runtime that reads the opset (onnxruntime 1.18 reads IR <= 10)
        model = make_model_at_opset(graph, opset_version)
        model = onnx.shape_inference.infer_shapes(model)  # types the outputs for the checker
        rep = SingaBackend.prepare(model, device)
        return collections.OrderedDict(zip([o.name for o in outs], rep.run(arrays)))


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise UnsupportedOnnx("the model imports no version of the default ONNX operator set")
