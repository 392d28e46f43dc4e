"""Every supported ONNX op, gathered: importing this module registers each op family in
:data:`~.registry.OPS`; the op table docs/onnx.md embeds is made from it."""
from __future__ import annotations

from typing import Sequence, Tuple

from singa_jax._src.onnx import cast_ops, nn_ops, sequence_ops, tensor_ops  # noqa: F401 (they register their ops)
from singa_jax._src.onnx.registry import OPS

__all__ = ["op_table_rows", "op_table_markdown"]


def op_table_rows() -> Sequence[Tuple[str, str, str, str]]:
    """(op type, attributes, inputs that must be constants, summary) for every supported op,
    sorted by op type."""
    rows = []
    for name in sorted(OPS):
        spec = OPS[name]
        static = ", ".join(str(i) for i in spec.static) or "-"
        rows.append((name, ", ".join(spec.attrs) or "-", static, spec.doc))
    return rows


def op_table_markdown() -> str:
    """The markdown table docs/onnx.md embeds (a test checks they agree)."""
    lines = ["| ONNX op | attributes | constant inputs | notes |", "| --- | --- | --- | --- |"]
    lines += [f"| {n} | {a} | {s} | {d} |" for n, a, s, d in op_table_rows()]
    return "\n".join(lines) + "\n"
