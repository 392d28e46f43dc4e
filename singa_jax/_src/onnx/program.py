"""The checked ONNX graph the importer runs: nodes looked up in the op table, initializers
sorted, host inputs found, and :meth:`GraphProgram.evaluate`, the whole graph as one pure function
(see :mod:`singa_jax._src.onnx.backend` for how it runs as one autograd operator).

Values are arrays, or for ONNX's sequence and optional types tuples of arrays and None
(:mod:`singa_jax._src.onnx.sequence_ops`).
"""
from __future__ import annotations

import collections
import contextlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper

from singa_jax._src.onnx import catalog  # noqa: F401 (every op family registered in OPS)
from singa_jax._src.onnx.registry import OPS, NodeCall, OpSpec, UnsupportedOnnx
from singa_jax._src.onnx.sequence_ops import (STRUCTURE_OPS, TENSOR, is_known, map_tensors,
                                              shapes_of, value_kind)

__all__ = ["OnnxNode", "OnnxAttributes", "ValueInfo", "GraphProgram", "HostValues",
           "node_call", "lookup_spec"]

# ops whose outputs are known before running whatever their inputs are (they read shapes, a
# sequence's length, whether an optional is empty)
_SHAPE_OPS = ("Shape", "Size") + STRUCTURE_OPS
_INT32 = np.iinfo(np.int32)


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


#: a declared graph input or output: ``dtype`` and ``shape`` are its tensor's (a sequence's or
#: an optional's element's); ``kind`` is "tensor", "sequence", "optional tensor" or
#: "optional sequence" (sequence_ops.value_kind)
ValueInfo = collections.namedtuple("ValueInfo", ["name", "dtype", "shape", "kind"],
                                   defaults=(TENSOR,))


def _value_info(vi: onnx.ValueInfoProto, where: str) -> ValueInfo:
    kind, t = value_kind(vi.type, f"{where} '{vi.name}'")
    if t is None:
        return ValueInfo(vi.name, 0, None, kind)
    shape = None if not t.HasField("shape") else \
        tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    return ValueInfo(vi.name, t.elem_type, shape, kind)


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
        self.proto = graph  # what an export of the imported graph writes again
        init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.inputs = [_value_info(v, "graph input") for v in graph.input
                       if v.name not in init]
        self.outputs = [_value_info(v, "graph output") for v in graph.output]
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
        """(values of ``wanted``, new values of the states) — pure; jit-able. ``inputs``: one
        value per dynamic input, an array, a tuple of arrays (a sequence) or None (an empty
        optional); so are the values returned."""
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
                shapes = [shapes_of(a) for a in args]
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
        shape_op = node.op_type in _SHAPE_OPS
        folded = (shape_op and args and args[0] is not None) or \
            (not spec.needs_key and all(is_known(a) for a in args))
        if shape_op:  # reads only static structure: runs on the host, whatever its inputs
            out = spec.fn(call, *args)
        else:
            # a node of known inputs is folded to constants while tracing
            with jax.ensure_compile_time_eval() if folded else contextlib.nullcontext():
                out = spec.fn(call, *[a if i in spec.static else _as_dynamic(a)
                                      for i, a in enumerate(args)])
        outs = out if isinstance(out, tuple) else (out,)
        if folded:
            outs = tuple(map_tensors(np.asarray, o) for o in outs)
        return outs

    def dynamic_inputs(self) -> List[ValueInfo]:
        return [v for v in self.inputs if v.name not in self.host_inputs]


def _as_dynamic(a: Any) -> Any:
    """A constant as JAX takes it: 64-bit NumPy values become 32-bit (ints clipped, so that
    ONNX's INT64_MAX sentinels stay "very large"); a sequence's arrays each."""
    if isinstance(a, tuple):
        return tuple(_as_dynamic(v) for v in a)
    if not isinstance(a, np.ndarray):
        return a
    if a.dtype == np.int64:
        return jnp.asarray(np.clip(a, _INT32.min, _INT32.max).astype(np.int32))
    if a.dtype == np.uint64:
        return jnp.asarray(np.minimum(a, np.iinfo(np.uint32).max).astype(np.uint32))
    return jnp.asarray(a)


class HostValues:
    """The host inputs' values (arrays, or tuples of them for sequences), hashable by content:
    a static argument of the kernels."""

    def __init__(self, values: Dict[str, Any]):
        self.values = values
        self._key = tuple((k, _content_key(v)) for k, v in values.items())

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, HostValues) and self._key == other._key


def _content_key(value: Any) -> Any:
    return map_tensors(lambda v: (v.dtype.str, v.shape, v.tobytes()), value)
