"""An imported ONNX graph written out again: the export of the operator that runs it
(``GraphOp``, what ``SingaRep.run`` and ``SONNXModel`` record) emits the graph's own nodes, one
by one, wired to the values around it, with the current values of its parameters and states
-- so a model imported, fine-tuned (also under new layers) and exported holds its trained
weights. A graph imported at another opset is converted to the export's first (onnx's version
converter)."""
from __future__ import annotations

from typing import Any, Dict, List

import jax
import onnx
from onnx import numpy_helper, version_converter

from singa_jax._src.onnx.opsets import make_model_at_opset

__all__ = ["export_graph_op"]

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def _graph_at(program: Any, opset: int) -> onnx.GraphProto:
    """The imported graph with its nodes at ``opset`` (converted once per opset)."""
    if program.opset == opset:
        return program.proto
    converted = program.__dict__.setdefault("_converted", {})
    if opset not in converted:
        try:
            model = version_converter.convert_version(
                make_model_at_opset(program.proto, program.opset), opset)
        except Exception as e:  # noqa: BLE001 -- onnx's converter raises several kinds
            raise ValueError(
                f"export: the imported graph '{program.name}' (opset {program.opset}) cannot be "
                f"written at opset {opset}: {str(e).splitlines()[0] if str(e) else e!r}; "
                f"export with opset_version={program.opset}") from e
        converted[opset] = model.graph
    return converted[opset]


def _flat(tree: Any) -> bool:
    return tree is None or tree == jax.tree_util.tree_structure((0,) * tree.num_leaves)


def export_graph_op(ctx: Any, op: Any, ins: List[str], outs: List[str]) -> None:
    """Emit the nodes of the imported graph ``op.program`` into the export ``ctx``: its inputs
    are ``ins`` (the graph's dynamic inputs, then its parameters, then its states: the current
    values), its wanted values become ``outs``, and the states' new values their current ones
    (an exported model infers)."""
    program = op.program
    if not (_flat(op.in_tree) and _flat(op.out_tree)):
        raise ValueError(f"export of {op.name}: an imported graph run on sequence or optional "
                         f"values cannot be written again (tensors only)")
    graph = _graph_at(program, ctx.opset)
    dynamic = [v.name for v in program.dynamic_inputs()]
    n_in, n_params = len(dynamic), len(program.params)
    name_of: Dict[str, str] = dict(zip(dynamic, ins[:n_in]))
    name_of.update(zip(program.params, ins[n_in:n_in + n_params]))
    name_of.update(zip(program.states, ins[n_in + n_params:]))
    constants = {t.name: t for t in graph.initializer}

    def value(name: str) -> str:
        if name not in name_of:
            if name in op.host.values:  # a host input: the value this call was given
                name_of[name] = ctx.const(name, op.host.values[name])
            elif name in constants:
                name_of[name] = ctx.const(name, numpy_helper.to_array(constants[name]))
            else:
                raise ValueError(f"export of {op.name}: the imported graph reads '{name}', "
                                 f"which it neither computes nor holds")
        return name_of[name]

    for node in graph.node:
        if any(a.type in _SUBGRAPHS for a in node.attribute):
            raise ValueError(f"export of {op.name}: node '{node.name}' ({node.op_type}) holds a "
                             f"subgraph, which cannot be written again")
        written = onnx.NodeProto()
        written.CopyFrom(node)
        written.name = ctx.unique(node.name or node.op_type)
        del written.input[:]
        written.input.extend(value(n) if n else "" for n in node.input)
        del written.output[:]
        for n in node.output:
            if n:
                name_of[n] = ctx.unique(n)
            written.output.append(name_of[n] if n else "")
        ctx.add(written)
    for name, out in zip(op.wanted, outs):
        ctx.node("Identity", [value(name)], [out])
    for state, out in zip(program.states, outs[len(op.wanted):]):
        ctx.node("Identity", [name_of[state]], [out])
