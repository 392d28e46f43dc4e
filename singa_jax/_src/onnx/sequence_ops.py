"""The import op table, sequence and optional family, and how such values travel.

Besides tensors, the importer runs two more kinds of ONNX values: a **sequence** of tensors
(``seq(tensor(float))``) and an **optional** tensor or sequence (``optional(...)``, possibly
empty). Inside the one JAX function the importer builds they are:

* a sequence: a Python ``tuple`` of arrays. Its length is static, part of the program's structure
  as shapes are (``jax.jit`` traces a program per length; a SplitToSequence's length follows from
  its input's shape and its static ``split``);
* an optional: its value (an array or a tuple) when it holds one, ``None`` when empty. Whether it
  is empty is static too (an empty optional graph input is passed as ``None``).

So the function stays pure over a pytree of arrays: ``jax.vjp`` differentiates through
SplitToSequence, SequenceAt, ConcatFromSequence... like through Split and Concat (a sequence of a
trained parameter trains). A function returns a sequence as a one-output tuple ``(seq,)``: a bare
tuple means several outputs (:mod:`.registry`' convention). Positions (SequenceAt,
SequenceInsert, SequenceErase) and SplitToSequence's ``split`` are static inputs: they decide
which arrays come out and how many.

Outside the function (``SingaRep.run``, ``run_node``) a sequence is a Python list of arrays or
Tensors and an empty optional is ``None``; see :func:`feed_value` and :func:`output_value`.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import jax.numpy as jnp
import numpy as np
import onnx
from jax import lax
from onnx import TensorProto, helper

from singa_jax._src.onnx.registry import UnsupportedOnnx, checked_axis, register, static_ints

__all__ = ["TENSOR", "SEQUENCE", "STRUCTURE_OPS", "value_kind", "type_name", "is_optional",
           "base_kind", "is_known", "map_tensors", "shapes_of", "feed_value", "output_value",
           "run_node_type"]

TENSOR, SEQUENCE = "tensor", "sequence"
_OPTIONAL = "optional "
#: ops whose output is known before running whatever their inputs' values are (they read a
#: sequence's length or whether an optional is empty: both static), like Shape and Size
STRUCTURE_OPS = ("SequenceLength", "OptionalHasElement")
#: element types a JAX array cannot hold
_UNSUPPORTED_ELEMENTS = {TensorProto.STRING: "string", TensorProto.UNDEFINED: "undefined"}


# ------------------------------------------------------------------------------------------
# value kinds (of graph inputs and outputs)
# ------------------------------------------------------------------------------------------
def value_kind(tp: onnx.TypeProto, where: str) -> Tuple[str, Optional[onnx.TypeProto.Tensor]]:
    """``(kind, tensor type)`` of a declared ONNX type: kind is ``"tensor"``, ``"sequence"``
    (of tensors), ``"optional tensor"`` or ``"optional sequence"``; the tensor type is the
    (element) tensor's, None when the declaration has no type at all (read as a tensor of
    unknown type). UnsupportedOnnx naming ``where`` for maps, sparse tensors and nested
    sequences."""
    if tp.WhichOneof("value") is None:
        return TENSOR, None
    declared, prefix = tp, ""
    if tp.HasField("optional_type"):
        prefix, tp = _OPTIONAL, tp.optional_type.elem_type
    kind = TENSOR
    if tp.HasField("sequence_type"):
        kind, tp = SEQUENCE, tp.sequence_type.elem_type
    if not tp.HasField("tensor_type"):
        raise UnsupportedOnnx(f"{where}: values of type {type_name(declared)} are not "
                              f"supported (tensors, sequences of tensors and optionals of "
                              f"either are)")
    return prefix + kind, tp.tensor_type


def type_name(tp: onnx.TypeProto) -> str:
    """An ONNX type as the spec writes it: ``seq(tensor(float))``, ``map``..."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({TensorProto.DataType.Name(tp.tensor_type.elem_type).lower()})"
    if which == "sequence_type":
        return f"seq({type_name(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({type_name(tp.optional_type.elem_type)})"
    return (which or "untyped").replace("_type", "")


def is_optional(kind: str) -> bool:
    return kind.startswith(_OPTIONAL)


def base_kind(kind: str) -> str:
    """``"tensor"`` or ``"sequence"``: what an optional of ``kind`` holds (or ``kind`` itself)."""
    return kind[len(_OPTIONAL):] if is_optional(kind) else kind


# ------------------------------------------------------------------------------------------
# values inside the traced function: array, tuple of arrays (sequence) or None (empty optional)
# ------------------------------------------------------------------------------------------
def is_known(value: Any) -> bool:
    """Whether a value is known before running: None, a NumPy array or a tuple of them."""
    if isinstance(value, tuple):
        return all(isinstance(v, np.ndarray) for v in value)
    return value is None or isinstance(value, np.ndarray)


def map_tensors(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` applied to each tensor of a value (an array, a sequence's arrays; None stays)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(fn(v) for v in value)
    return fn(value)


def shapes_of(value: Any) -> Any:
    """A value's shape for error messages: a tuple, a list of them (a sequence) or None."""
    return output_value(value, lambda v: tuple(np.shape(v)))


# ------------------------------------------------------------------------------------------
# values outside it: SingaRep.run's inputs and outputs, run_node's inputs
# ------------------------------------------------------------------------------------------
def feed_value(kind: str, value: Any, what: str, tensor: Callable[[Any, str], Any]) -> Any:
    """A graph input of ``kind`` as the traced function takes it: ``tensor(v, label)`` checks
    and converts one tensor (label names a sequence's element). A sequence is a list or tuple
    (-> tuple), an optional may be None (empty)."""
    if is_optional(kind):
        if value is None:
            return None
        kind = base_kind(kind)
    if kind == SEQUENCE:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{what} is a sequence of tensors: pass a list of arrays or Tensors, "
                            f"got {type(value).__name__}")
        return tuple(tensor(v, f" element {i}") for i, v in enumerate(value))
    if value is None:
        raise TypeError(f"{what} is a tensor, got None (only an optional input may be empty)")
    return tensor(value, "")


def output_value(value: Any, convert: Callable[[Any], Any]) -> Any:
    """A result as ``run`` returns it: ``convert(t)`` of a tensor, a list of them for a sequence,
    None for an empty optional."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return [convert(v) for v in value]
    return convert(value)


def run_node_type(node: onnx.NodeProto, position: int, opset: int, value: Any
                  ) -> Tuple[onnx.TypeProto, Any]:
    """The ONNX type ``run_node`` declares for ``value``, the node's input ``position``, and the
    value as the node is fed it: a list or tuple is a sequence (a list of arrays) where the op's
    schema takes one there (elsewhere it is one array), None an empty optional (of float
    tensors: nothing says which type), and a value is wrapped in an optional where the schema
    takes only optionals (OptionalHasElement before opset 18)."""
    allowed = _allowed_types(node, position, opset)
    takes_seq = any(t.startswith(("seq(", "optional(seq(")) for t in allowed)
    if value is None:
        return helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT,
                                                                              None)), None
    if takes_seq and isinstance(value, (list, tuple)):
        value = [np.asarray(v) for v in value]
        elem = helper.np_dtype_to_tensor_dtype(value[0].dtype) if value else TensorProto.FLOAT
        tp = helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None))
        base = "seq("
    else:
        value = np.asarray(value)
        tp = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(value.dtype),
                                           value.shape)
        base = "tensor("
    if allowed and not any(t.startswith(base) for t in allowed) and \
            any(t.startswith("optional(" + base) for t in allowed):
        tp = helper.make_optional_type_proto(tp)
    return tp, value


def _allowed_types(node: onnx.NodeProto, position: int, opset: int) -> List[str]:
    """The type strings the node's schema accepts at input ``position`` ([] when unknown)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return []
    if not schema.inputs:
        return []
    formal = schema.inputs[min(position, len(schema.inputs) - 1)]
    for tc in schema.type_constraints:
        if tc.type_param_str == formal.type_str:
            return list(tc.allowed_type_strs)
    return [formal.type_str]


# ------------------------------------------------------------------------------------------
# the ops
# ------------------------------------------------------------------------------------------
def _position(call, value: Any, n: int, what: str, end_ok: bool) -> int:
    """A static position in a sequence of ``n``: ``[-n, n - 1]`` (``[-n, n]`` when ``end_ok``,
    for SequenceInsert), negative from the back."""
    ints = static_ints(call, value, what)
    if ints is None or len(ints) != 1:
        raise ValueError(f"{call.describe()}: '{what}' must hold one integer, got "
                         f"{np.asarray(value).tolist()}")
    p = ints[0]
    hi = n if end_ok else n - 1
    if not -n <= p <= hi:
        raise ValueError(f"{call.describe()}: {what} {p} is out of range [{-n}, {hi}] for a "
                         f"sequence of {n} tensors")
    return p + n if p < 0 else p


def _split_to_sequence(call, x, split=None):
    """Split along axis: pieces of 1 (keepdims=0 drops the axis), of ``split`` (a scalar: the
    last piece may be shorter) or of the lengths in ``split`` (1-d)."""
    ax = checked_axis(call, call.attr("axis", 0), x.ndim)
    n = x.shape[ax]
    if split is None:
        parts = [1] * n
    else:
        sizes = static_ints(call, split, "split")
        if np.ndim(split) == 0:
            size = sizes[0]
            if size <= 0:
                raise ValueError(f"{call.describe()}: split {size} must be positive")
            parts = [size] * (n // size) + ([n % size] if n % size else [])
        else:
            parts = list(sizes)
            if any(p < 0 for p in parts) or sum(parts) != n:
                raise ValueError(f"{call.describe()}: split {parts} must be non-negative "
                                 f"lengths summing to {n}, the input's axis {ax} (shape "
                                 f"{tuple(x.shape)})")
    starts = np.cumsum([0] + parts[:-1])
    pieces = tuple(lax.slice_in_dim(x, int(s), int(s) + p, axis=ax) for s, p in zip(starts, parts))
    if split is None and not call.attr("keepdims", 1):
        pieces = tuple(jnp.squeeze(p, ax) for p in pieces)
    return (pieces,)


def _check_split_to_sequence(call):
    keep = call.attr("keepdims", 1)
    return None if keep in (0, 1) else f"keepdims={keep}"


def _sequence_construct(call, *xs):
    """A sequence of the inputs."""
    return (tuple(xs),)


def _sequence_empty(call):
    """An empty sequence (of element type dtype)."""
    return ((),)


def _check_dtype(call):
    dtype = call.attr("dtype", TensorProto.FLOAT)
    if dtype in _UNSUPPORTED_ELEMENTS:
        return f"dtype {_UNSUPPORTED_ELEMENTS[dtype]} (a JAX array holds no strings)"
    try:
        helper.tensor_dtype_to_np_dtype(dtype)
    except (KeyError, ValueError):
        return f"dtype {dtype}"
    return None


def _sequence_at(call, seq, position):
    """The tensor at position (negative from the back)."""
    return seq[_position(call, position, len(seq), "position", end_ok=False)]


def _sequence_length(call, seq):
    """The number of tensors (a constant)."""
    return np.asarray(len(seq), np.int64)


def _sequence_insert(call, seq, x, position=None):
    """Insert a tensor at position (default: the back)."""
    p = len(seq) if position is None else _position(call, position, len(seq), "position",
                                                    end_ok=True)
    return (seq[:p] + (x,) + seq[p:],)


def _sequence_erase(call, seq, position=None):
    """Remove the tensor at position (default: the last)."""
    if not seq:
        raise ValueError(f"{call.describe()}: cannot erase from an empty sequence")
    p = len(seq) - 1 if position is None else _position(call, position, len(seq), "position",
                                                        end_ok=False)
    return (seq[:p] + seq[p + 1:],)


def _concat_from_sequence(call, seq):
    """Concatenate along axis (new_axis=1: stack along a new axis)."""
    if not seq:
        raise ValueError(f"{call.describe()}: cannot concatenate an empty sequence")
    stack = call.attr("new_axis", 0) == 1
    ax = checked_axis(call, call.attr("axis"), seq[0].ndim + stack)
    return jnp.stack(seq, ax) if stack else jnp.concatenate(seq, ax)


def _check_concat_from_sequence(call):
    if call.attr("axis") is None:
        return "a missing axis (required)"
    new_axis = call.attr("new_axis", 0)
    return None if new_axis in (0, 1) else f"new_axis={new_axis}"


def _identity(call, x=None):
    """The input (a tensor, sequence or optional). As Optional: an optional holding the input,
    or empty (None; of attribute type) without one."""
    return (x,)


def _check_optional(call):
    tp = call.attr("type")
    if tp is None:
        return None
    inner = tp.sequence_type.elem_type if tp.HasField("sequence_type") else tp
    if not inner.HasField("tensor_type") or \
            inner.tensor_type.elem_type in _UNSUPPORTED_ELEMENTS:
        return f"attribute type {type_name(tp)}"
    return None


def _optional_has_element(call, x=None):
    """Whether the input holds a value (a tensor or sequence does; a constant)."""
    return np.asarray(x is not None)


def _optional_get_element(call, x):
    """The optional's value (a tensor or sequence passes through)."""
    if x is None:
        raise ValueError(f"{call.describe()}: the optional input is empty: it holds no value "
                         f"to get (check it with OptionalHasElement)")
    return (x,)


register("SplitToSequence", _split_to_sequence, attrs=("axis", "keepdims"), static=(1,),
         check=_check_split_to_sequence,
         doc="a sequence of pieces along axis: of 1 (keepdims=0 drops the axis), of a scalar "
             "split (the last may be shorter) or of split's lengths")
register("SequenceConstruct", _sequence_construct, doc="a sequence of the inputs")
register("SequenceEmpty", _sequence_empty, attrs=("dtype",), check=_check_dtype,
         doc="an empty sequence")
register("SequenceAt", _sequence_at, static=(1,), doc="the tensor at position (negative: from "
                                                      "the back)")
register("SequenceLength", _sequence_length, doc="the number of tensors (a constant)")
register("SequenceInsert", _sequence_insert, static=(2,),
         doc="insert a tensor at position (default: the back)")
register("SequenceErase", _sequence_erase, static=(1,),
         doc="remove the tensor at position (default: the last)")
register("ConcatFromSequence", _concat_from_sequence, attrs=("axis", "new_axis"),
         check=_check_concat_from_sequence,
         doc="concatenate along axis (new_axis=1: stack along a new axis)")
# Identity lives here: its input may be a sequence or an optional
register("Identity", _identity, doc="the input (a tensor, sequence or optional)")
register("Optional", _identity, attrs=("type",), check=_check_optional,
         doc="an optional holding the input, or empty (of attribute type) without one")
register("OptionalHasElement", _optional_has_element,
         doc="whether the input holds a value (a constant)")
register("OptionalGetElement", _optional_get_element,
         doc="the optional's value (a tensor or sequence passes through)")
