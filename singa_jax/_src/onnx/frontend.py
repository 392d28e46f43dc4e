"""ONNX export: a singa_jax forward (the autograd graph behind some output Tensors) as an ONNX
model.

:class:`SingaFrontend` walks the creators of the outputs back to the inputs (as SINGA's frontend
does), translating each operator by its class name through :data:`EXPORTERS` into ONNX nodes of
the chosen opset. Leaf Tensors that are not inputs (parameters, batch-norm statistics, constants)
become initializers under their singa_jax names. The batch dimension is made symbolic when the
graph allows it (checked by evaluating the exported graph's shapes at another batch size), and
the result passes ``onnx.checker.check_model(full_check=True)``.

Export a forward run in evaluation mode (``model.eval()`` / ``autograd.training = False``): ONNX
BatchNormalization and Dropout are exported in their inference form.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from singa_jax._src.onnx.graph_export import export_graph_op
from singa_jax._src.onnx.opsets import (DEFAULT_OPSET, MIN_OPSET, RUNTIME_MAX_OPSET, default_opset,
                                       ir_version_for, make_model_at_opset)
from singa_jax._src.onnx.program import GraphProgram, HostValues
from singa_jax._src.onnx.registry import jax_dtype
from singa_jax._src.ops.shape import unsqueeze_positions
from singa_jax._src.tensor.tensor import Tensor
from singa_jax._src.base.node import Dummy

__all__ = ["SingaFrontend", "EXPORTERS", "DEFAULT_OPSET", "MIN_OPSET", "RUNTIME_MAX_OPSET",
           "ir_version_for", "make_model_at_opset"]

class _Export:
    """The growing graph: nodes, initializers, names; one per export."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: List[onnx.NodeProto] = []
        self.inits: Dict[str, np.ndarray] = {}
        self.value_of: Dict[Tuple[int, int], str] = {}  # (id(creator), id(tensor)) -> name
        self.inputs: List[onnx.ValueInfoProto] = []
        self.used: set = set()
        self._count = 0
        self.keep: List[Any] = []
        self._shapes: Optional[Dict[str, Tuple]] = None
        self.autocast_seen = False  # an operator ran under autocast: the float32 model's export

    def fresh(self, hint: str) -> str:
        self._count += 1
        name = f"{hint}_{self._count}"
        while name in self.used:
            self._count += 1
            name = f"{hint}_{self._count}"
        self.used.add(name)
        return name

    def unique(self, name: str) -> str:
        if name not in self.used:
            self.used.add(name)
            return name
        return self.fresh(name)

    def const(self, hint: str, value: Any, dtype: Any = None) -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh(hint)
        self.inits[name] = arr
        return name

    def ints(self, hint: str, values: Sequence[int]) -> str:
        return self.const(hint, np.asarray(list(values), np.int64).reshape(-1))

    def node(self, op_type: str, inputs: Sequence[str], outputs: Optional[Sequence[str]] = None,
             n_out: int = 1, name: Optional[str] = None, **attrs: Any) -> List[str]:
        outs = list(outputs) if outputs is not None else \
            [self.fresh(f"{op_type.lower()}") for _ in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=self.unique(name or op_type), **attrs))
        self._shapes = None
        return outs

    def add(self, node: onnx.NodeProto) -> None:
        """Append a node made elsewhere (its names already this export's)."""
        self.nodes.append(node)
        self._shapes = None

    def shape(self, name: str) -> Optional[Tuple]:
        """The static shape of value ``name`` (ONNX shape inference over the graph so far)."""
        if self._shapes is None:
            vis = list(self.inputs) + [helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in self.inits.items()]
            graph = helper.make_graph(self.nodes, "partial", vis, [],
                                      initializer=[numpy_helper.from_array(a, n)
                                                   for n, a in self.inits.items()])
            model = make_model_at_opset(graph, self.opset)
            inferred = shape_inference.infer_shapes(model).graph
            self._shapes, self._types = {}, {}
            for vi in list(inferred.value_info) + list(inferred.input):
                t = vi.type.tensor_type
                self._types[vi.name] = t.elem_type
                if t.HasField("shape"):
                    self._shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                                  for d in t.shape.dim)
            self._shapes.update({n: a.shape for n, a in self.inits.items()})
            self._types.update({n: helper.np_dtype_to_tensor_dtype(a.dtype)
                                for n, a in self.inits.items()})
        return self._shapes.get(name)

    def elem_type(self, name: str) -> Optional[int]:
        """The ONNX element type of value ``name`` (type inference over the graph so far)."""
        self.shape(name)
        return self._types.get(name)

    def leaf(self, t: Tensor, hint: str) -> str:
        """The initializer holding the value of the leaf Tensor ``t`` (one per Tensor)."""
        key = ("leaf", id(t))
        if key not in self.value_of:
            name = self.unique(hint)
            self.inits[name] = np.asarray(t.array)
            self.value_of[key] = name
            self.keep.append(t)  # ids stay valid while the export runs
        return self.value_of[key]

    def src_name(self, op: Any, i: int) -> str:
        """The value name of input ``i`` of ``op``: a graph input, an initializer for a leaf, or
        the producing op's output."""
        src_op, x_id, x, _ = op.src[i]
        if isinstance(src_op, Dummy):
            if ("in", x_id) in self.value_of:
                return self.value_of[("in", x_id)]
            t = x if x is not None else src_op.tensor
            if t is None:
                raise ValueError(f"export of {op.name}: the value of its input {i} (a constant "
                                 f"Tensor) is no longer alive; keep a reference to it")
            return self.leaf(t, t.name)
        return src_op.output_name(src_op.y_id2idx[x_id])

    def tensor_arg(self, op: Any, i: int, arg: str, dtype: Any = None) -> str:
        """Input ``i`` of ``op`` that came from its constructor argument ``arg`` (SINGA's
        Gather(axis, indices), Where(condition), ...): a graph value when it was computed or
        given as an input, else an initializer from the argument's value."""
        src_op, x_id, _, _ = op.src[i]
        value = op.tensor_args[arg]
        live = not isinstance(src_op, Dummy) or ("in", x_id) in self.value_of
        if live:
            name = self.src_name(op, i)
            if dtype is not None:
                (name,) = self.node("Cast", [name], to=helper.np_dtype_to_tensor_dtype(
                    np.dtype(dtype)))
            return name
        arr = np.asarray(value.array if isinstance(value, Tensor) else value)
        return self.const(arg, arr.astype(dtype) if dtype is not None else arr)

    def rank(self, name: str, op: Any) -> int:
        shape = self.shape(name)
        if shape is None:
            raise ValueError(f"export of {op.name}: the rank of its input '{name}' is unknown")
        return len(shape)


# ------------------------------------------------------------------------------------------
# translators: (ctx, op, input names, output names) -> emit nodes
# ------------------------------------------------------------------------------------------
Translator = Callable[[_Export, Any, List[str], List[str]], None]


def _same(onnx_type: str, **fixed: Any) -> Translator:
    def emit(ctx, op, ins, outs):
        ctx.node(onnx_type, ins, outs, name=op.name, **fixed)
    return emit


def _float_result(onnx_type: str, bool_inputs: bool = False) -> Translator:
    """A comparison/logic op: SINGA returns 0/1 floats where ONNX returns bools."""
    def emit(ctx, op, ins, outs):
        if bool_inputs:
            ins = [ctx.node("Cast", [i], to=TensorProto.BOOL)[0] for i in ins]
        (b,) = ctx.node(onnx_type, ins, name=op.name)
        ctx.node("Cast", [b], outs, to=TensorProto.FLOAT)
    return emit


def _round_half_away(ctx, op, ins, outs):
    """sign(x) * (floor(|x|) + (|x| - floor(|x|) >= 0.5)): SINGA's round; ONNX Round is
    half-to-even."""
    (a,) = ctx.node("Abs", ins)
    (fl,) = ctx.node("Floor", [a])
    (frac,) = ctx.node("Sub", [a, fl])
    (ge,) = ctx.node("GreaterOrEqual", [frac, ctx.const("half", 0.5, np.float32)])
    (up,) = ctx.node("Cast", [ge], to=TensorProto.FLOAT)
    (mag,) = ctx.node("Add", [fl, up])
    (s,) = ctx.node("Sign", ins)
    ctx.node("Mul", [s, mag], outs, name=op.name)


def _clip(ctx, op, ins, outs):
    if ctx.opset < 11:
        ctx.node("Clip", ins, outs, name=op.name, min=op.min, max=op.max)
        return
    bounds = ["" if v is None else ctx.const("clip", v, np.float32) for v in (op.min, op.max)]
    while bounds and bounds[-1] == "":
        bounds.pop()
    ctx.node("Clip", ins + bounds, outs, name=op.name)


def _softmax(ctx, op, ins, outs):
    rank = ctx.rank(ins[0], op)
    axis = op.axis % max(rank, 1)
    if ctx.opset < 13 or axis == rank - 1:
        ctx.node("Softmax", ins, outs, name=op.name, axis=axis if ctx.opset < 13 else -1)
        return
    # SINGA normalises over all axes from ``axis`` jointly: flatten them, softmax, restore
    (flat,) = ctx.node("Flatten", ins, axis=axis)
    (sm,) = ctx.node("Softmax", [flat], axis=-1, name=op.name)
    (shape,) = ctx.node("Shape", ins)
    ctx.node("Reshape", [sm, shape], outs)


def _cast(ctx, op, ins, outs):
    ctx.node("Cast", ins, outs, name=op.name,
             to=helper.np_dtype_to_tensor_dtype(np.dtype(op.to)))


def _where(ctx, op, ins, outs):
    (cond,) = ctx.node("Cast", [ctx.tensor_arg(op, 2, "condition")], to=TensorProto.BOOL)
    ctx.node("Where", [cond, ins[0], ins[1]], outs, name=op.name)


def _add_bias(ctx, op, ins, outs):
    (b,) = ctx.node("Reshape", [ins[1], ctx.ints("shape", [-1] if op.axis == 0 else [-1, 1])])
    ctx.node("Add", [ins[0], b], outs, name=op.name)


def _gemm(ctx, op, ins, outs):
    ctx.node("Gemm", ins, outs, name=op.name, alpha=op.alpha, beta=op.beta, transA=op.transA,
             transB=op.transB)


def _axes_op(onnx_type: str, input_since: int) -> Callable:
    def emit(ctx, op, ins, outs, axes, **attrs):
        if axes is None:
            ctx.node(onnx_type, ins, outs, name=op.name, **attrs)
        elif ctx.opset >= input_since:
            ctx.node(onnx_type, ins + [ctx.ints("axes", axes)], outs, name=op.name, **attrs)
        else:
            ctx.node(onnx_type, ins, outs, name=op.name, axes=list(axes), **attrs)
    return emit


def _reduce(onnx_type: str, input_since: int) -> Translator:
    def emit(ctx, op, ins, outs):
        axes = None if op.axes is None else list(op.axes)
        _axes_op(onnx_type, input_since)(ctx, op, ins, outs, axes, keepdims=int(op.keepdims))
    return emit


def _reshape(ctx, op, ins, outs):
    target = list(op.shape)
    shape = ctx.shape(ins[0])
    # a leading dimension equal to the input's becomes 0 ("copy"), so the batch may vary
    if shape and target and shape[0] is not None and target[0] == shape[0] and len(shape) > 1:
        target[0] = 0
    ctx.node("Reshape", [ins[0], ctx.ints("shape", target)], outs, name=op.name)


def _flatten(ctx, op, ins, outs):
    ctx.node("Flatten", ins, outs, name=op.name, axis=op.axis)


def _transpose(ctx, op, ins, outs):
    ctx.node("Transpose", ins, outs, name=op.name, perm=None if op.perm is None else list(op.perm))


def _unsqueeze(ctx, op, ins, outs):
    # SINGA's axes are inserted one by one (one past the end appends): ONNX wants the final
    # positions of the new dimensions
    axes = unsqueeze_positions(ctx.rank(ins[0], op), op.axis)
    _axes_op("Unsqueeze", 13)(ctx, op, ins, outs, list(axes))


def _squeeze(ctx, op, ins, outs):
    _axes_op("Squeeze", 13)(ctx, op, ins, outs, list(op.axis) or None)


def _concat(ctx, op, ins, outs):
    ctx.node("Concat", ins, outs, name=op.name, axis=op.axis)


def _split(ctx, op, ins, outs):
    parts = op.parts
    if parts is None:
        d = ctx.shape(ins[0])[op.axis]
        parts = [d // op.num_output] * op.num_output
    total = ctx.shape(ins[0])[op.axis]
    if sum(parts) < total:  # SINGA drops a remainder: split it off into an unused output
        parts = list(parts) + [total - sum(parts)]
        outs = outs + [ctx.fresh("split_rest")]
    if ctx.opset >= 13:
        ctx.node("Split", ins + [ctx.ints("split", parts)], outs, name=op.name, axis=op.axis)
    else:
        ctx.node("Split", ins, outs, name=op.name, axis=op.axis, split=list(parts))


def _slice(ctx, op, ins, outs):
    n = len(op.starts)
    extra = [ctx.ints("starts", op.starts), ctx.ints("ends", op.ends),
             ctx.ints("axes", range(n) if op.axes is None else op.axes),
             ctx.ints("steps", [1] * n if op.steps is None else op.steps)]
    ctx.node("Slice", ins[:1] + extra, outs, name=op.name)


def _gather(ctx, op, ins, outs):
    ctx.node("Gather", [ins[0], ctx.tensor_arg(op, 1, "indices", np.int64)], outs, name=op.name,
             axis=op.axis)


def _scatter_elements(ctx, op, ins, outs):
    ctx.node("ScatterElements", [ins[0], ctx.tensor_arg(op, 1, "indices", np.int64),
                                 ctx.tensor_arg(op, 2, "updates")], outs, name=op.name,
             axis=op.axis)


def _tile(ctx, op, ins, outs):
    rank = ctx.rank(ins[0], op)
    reps = list(op.repeats) + [1] * (rank - len(op.repeats))
    x = ins[0]
    if len(reps) > rank:  # as np.tile (and SINGA): new leading axes of length 1 first
        x = ctx.fresh("tile_in")
        _axes_op("Unsqueeze", 13)(ctx, op, ins[:1], [x], list(range(len(reps) - rank)))
    ctx.node("Tile", [x, ctx.ints("repeats", reps)], outs, name=op.name)


def _expand(ctx, op, ins, outs):
    ctx.node("Expand", [ins[0], ctx.ints("shape", op.shape)], outs, name=op.name)


def _pad(ctx, op, ins, outs):
    rank = ctx.rank(ins[0], op)
    half = len(op.pads) // 2
    pads = list(op.pads[:half]) + [0] * (rank - half) + list(op.pads[half:]) + [0] * (rank - half)
    if ctx.opset < 11:
        ctx.node("Pad", ins, outs, name=op.name, mode=op.mode, pads=pads, value=op.constant)
        return
    extra = [ctx.ints("pads", pads)]
    if op.mode == "constant":
        extra.append(ctx.const("pad_value", op.constant, np.float32))
    ctx.node("Pad", ins + extra, outs, name=op.name, mode=op.mode)


def _upsample(ctx, op, ins, outs):
    rank = ctx.rank(ins[0], op)
    scales = [float(s) for s in op.scales] + [1.0] * (rank - len(op.scales))
    ctx.node("Resize", [ins[0], "", ctx.const("scales", scales, np.float32)], outs, name=op.name,
             mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _depth_space(onnx_type: str) -> Translator:
    def emit(ctx, op, ins, outs):
        mode = op.mode if onnx_type == "DepthToSpace" else None
        if onnx_type == "SpaceToDepth" and op.mode != "DCR":
            raise ValueError(f"export of {op.name}: ONNX SpaceToDepth has only the DCR order")
        ctx.node(onnx_type, ins, outs, name=op.name, blocksize=op.blocksize, mode=mode)
    return emit


def _onehot(ctx, op, ins, outs):
    # int64 indices: onnxruntime has no OneHot kernel for float indices with int64 depth (and
    # the operator truncates float indices to integers, as this cast does)
    (idx,) = ctx.node("Cast", ins[:1], to=TensorProto.INT64)
    (h,) = ctx.node("OneHot", [idx, ctx.const("depth", [op.depth], np.int64),
                               ctx.const("values", list(op.values), np.float32)],
                    name=op.name, axis=op.axis)
    ctx.node("Identity", [h], outs)


def _to_int32(onnx_type: str) -> Translator:
    def emit(ctx, op, ins, outs):
        (v,) = ctx.node(onnx_type, ins, name=op.name)
        ctx.node("Cast", [v], outs, to=TensorProto.INT32)
    return emit


def _constant_of_shape(ctx, op, ins, outs):
    (shape,) = ctx.node("Cast", ins, to=TensorProto.INT64)
    ctx.node("ConstantOfShape", [shape], outs, name=op.name,
             value=helper.make_tensor("value", TensorProto.FLOAT, [1], [op.value]))


def _conv(ctx, op, ins, outs):
    h, (top, bottom, left, right) = op.handle, op.odd_padding
    ctx.node("Conv", ins, outs, name=op.name, kernel_shape=[h.kernel_h, h.kernel_w],
             strides=[h.stride_h, h.stride_w], dilations=[h.dilation_h, h.dilation_w],
             group=h.group, pads=[h.pad_h + top, h.pad_w + left, h.pad_h + bottom, h.pad_w + right])


def _pool(ctx, op, ins, outs):
    h, odd = op.handle, op.odd_padding
    x = ins[0]
    if any(odd):  # SINGA's odd padding repeats the border rows/columns
        top, bottom, left, right = odd
        (x,) = ctx.node("Pad", [x, ctx.ints("pads", [0, 0, top, left, 0, 0, bottom, right])],
                        mode="edge")
    kind = "MaxPool" if h.is_max_pooling else "AveragePool"
    ctx.node(kind, [x], outs, name=op.name, kernel_shape=[h.kernel_h, h.kernel_w],
             strides=[h.stride_h, h.stride_w], pads=[h.pad_h, h.pad_w, h.pad_h, h.pad_w])


def _batchnorm(ctx, op, ins, outs):
    stats = [ctx.leaf(t, t.name) for t in (op.running_mean, op.running_var)]
    ctx.node("BatchNormalization", ins + stats, outs, name=op.name, epsilon=op.epsilon,
             momentum=1.0 - op.momentum)


def _global_avg(ctx, op, ins, outs):
    if op.data_format == "channels_first":
        ctx.node("GlobalAveragePool", ins, outs, name=op.name)
        return
    rank = ctx.rank(ins[0], op)
    _axes_op("ReduceMean", 18)(ctx, op, ins, outs, list(range(1, rank - 1)), keepdims=1)


def _dropout(ctx, op, ins, outs):
    if ctx.opset >= 12:
        ctx.node("Dropout", ins + [ctx.const("ratio", op.ratio, np.float32)], outs, name=op.name)
    else:
        ctx.node("Dropout", ins, outs, name=op.name, ratio=op.ratio)


def _embedding(ctx, op, ins, outs):
    (idx,) = ctx.node("Cast", [ins[0]], to=TensorProto.INT64)
    ctx.node("Gather", [ins[1], idx], outs, name=op.name, axis=0)


def _lstm_sequence(ctx, op, ins, outs):
    """layer.LSTM's fused op (inputs x_1..x_T, h0, c0, then Wx, Wh, Bx, Bh per gate i, f, o, g)
    as one ONNX LSTM (gates i, o, f, c)."""
    steps = op.n_steps
    xs, (h0, c0), w = ins[:steps], ins[steps:steps + 2], ins[steps + 2:]
    kinds = {k: dict(zip("ifog", w[4 * n:4 * n + 4])) for n, k in enumerate(("Wx", "Wh", "Bx",
                                                                            "Bh"))}
    unsq = _axes_op("Unsqueeze", 13)
    squeeze = _axes_op("Squeeze", 13)

    def one(name):  # a leading axis of length 1 (ONNX's num_directions / seq)
        out = ctx.fresh("unsqueeze")
        unsq(ctx, op, [name], [out], [0])
        return out

    def stacked(kind, transpose):
        (cat,) = ctx.node("Concat", [kinds[kind][g] for g in "iofg"], axis=1 if transpose else 0)
        if transpose:
            (cat,) = ctx.node("Transpose", [cat], perm=[1, 0])
        return one(cat)

    (x,) = ctx.node("Concat", [one(x) for x in xs], axis=0)
    (b,) = ctx.node("Concat", [stacked("Bx", False), stacked("Bh", False)], axis=1)
    y, _, yc = ctx.node("LSTM", [x, stacked("Wx", True), stacked("Wh", True), b, "", one(h0),
                                 one(c0)], n_out=3, name=op.name,
                        hidden_size=ctx.shape(h0)[-1])
    for t in range(steps):
        (yt,) = ctx.node("Gather", [y, ctx.const("t", t, np.int64)], axis=0)
        squeeze(ctx, op, [yt], [outs[t]], [0])
    squeeze(ctx, op, [yc], [outs[steps]], [0])


#: singa_jax operator class name -> translator
EXPORTERS: Dict[str, Translator] = {
    "ReLU": _same("Relu"), "Identity": _same("Identity"), "Tanh": _same("Tanh"),
    "Cos": _same("Cos"), "Cosh": _same("Cosh"), "Acos": _same("Acos"), "Acosh": _same("Acosh"),
    "Sin": _same("Sin"), "Sinh": _same("Sinh"), "Asin": _same("Asin"), "Asinh": _same("Asinh"),
    "Tan": _same("Tan"), "Atan": _same("Atan"), "Atanh": _same("Atanh"),
    "Sigmoid": _same("Sigmoid"), "Abs": _same("Abs"), "Exp": _same("Exp"), "Log": _same("Log"),
    "Sqrt": _same("Sqrt"), "Sign": _same("Sign"), "SoftSign": _same("Softsign"),
    "SoftPlus": _same("Softplus"), "Negative": _same("Neg"), "Reciprocal": _same("Reciprocal"),
    "Ceil": _same("Ceil"), "Floor": _same("Floor"), "Rounde": _same("Round"),
    "Round": _round_half_away, "Erf": _same("Erf"),
    "Add": _same("Add"), "Sub": _same("Sub"), "Mul": _same("Mul"), "Div": _same("Div"),
    "Pow": _same("Pow"), "PRelu": _same("PRelu"), "Matmul": _same("MatMul"),
    "Less": _float_result("Less"), "Greater": _float_result("Greater"),
    "Equal": _float_result("Equal"), "And": _float_result("And", True),
    "Or": _float_result("Or", True), "Xor": _float_result("Xor", True),
    "Not": _float_result("Not", True),
    "Clip": _clip,
    "Elu": lambda ctx, op, ins, outs: ctx.node("Elu", ins, outs, name=op.name, alpha=op.alpha),
    "SeLU": lambda ctx, op, ins, outs: ctx.node("Selu", ins, outs, name=op.name, alpha=op.alpha,
                                                gamma=op.gamma),
    "LeakyRelu": lambda ctx, op, ins, outs: ctx.node("LeakyRelu", ins, outs, name=op.name,
                                                     alpha=op.a),
    "HardSigmoid": lambda ctx, op, ins, outs: ctx.node("HardSigmoid", ins, outs, name=op.name,
                                                       alpha=op.alpha, beta=op.gamma),
    "SoftMax": _softmax, "Cast": _cast, "Where": _where, "AddBias": _add_bias, "Gemm": _gemm,
    "Sum": _same("Sum"), "Mean": _same("Mean"), "Max": _same("Max"), "Min": _same("Min"),
    "ReduceSum": _reduce("ReduceSum", 13), "ReduceMean": _reduce("ReduceMean", 18),
    "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose, "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze, "Concat": _concat, "Split": _split, "Slice": _slice, "Gather": _gather,
    "ScatterElements": _scatter_elements, "Tile": _tile, "Expand": _expand, "Pad": _pad,
    "UpSample": _upsample, "DepthToSpace": _depth_space("DepthToSpace"),
    "SpaceToDepth": _depth_space("SpaceToDepth"), "OneHot": _onehot,
    "Shape": _to_int32("Shape"), "NonZero": _to_int32("NonZero"),
    "ConstantOfShape": _constant_of_shape,
    "_Conv2d": _conv, "_Pooling2d": _pool, "_BatchNorm2d": _batchnorm,
    "GlobalAveragePool": _global_avg, "Dropout": _dropout, "Embedding": _embedding,
    "GraphOp": export_graph_op,
    "_LSTMSequence": _lstm_sequence,
}



# ------------------------------------------------------------------------------------------
# the frontend
# ------------------------------------------------------------------------------------------
def _ops_post_order(ys: Sequence[Tensor]) -> List[Any]:
    """The operators behind ``ys``, every op after the ops it reads (iterative DFS)."""
    order, seen = [], set()
    for y in ys:
        stack = [(y.creator, False)]
        while stack:
            op, expanded = stack.pop()
            if isinstance(op, Dummy) or (id(op) in seen and not expanded):
                continue
            if expanded:
                order.append(op)
                continue
            seen.add(id(op))
            stack.append((op, True))
            for src_op, _, _, _ in reversed(op.src):
                if not isinstance(src_op, Dummy) and id(src_op) not in seen:
                    stack.append((src_op, False))
    return order


#: the non-Tensor entries ``to_onnx``'s inputs may hold (operators' constant arguments)
_CONSTANT_ARGS = (int, float, bool, np.number, np.bool_, np.ndarray, list, tuple)


_HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _translate_float32(ctx: _Export, translator: Translator, op: Any, ins: List[str],
                       outs: List[str]) -> None:
    """An operator that ran under ``autograd.autocast``, exported as the float32 model's: its
    half-precision inputs cast up to float32, its translation in float32. Mixed precision is a
    way of running a model, not part of it (ONNX's Conv has no bfloat16 either): the file holds
    the float32 model and its float32 master weights, as a checkpoint does, and a runtime
    chooses its own precision (e.g. onnxruntime's float16 conversion)."""
    ctx.autocast_seen = True
    translator(ctx, op, [ctx.node("Cast", [n], to=TensorProto.FLOAT)[0]
                         if ctx.elem_type(n) in _HALF else n for n in ins], outs)


def _value_info(name: str, dtype: Any, shape: Sequence[Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         list(shape))


class SingaFrontend:
    """Export of singa_jax autograd graphs to ONNX (SINGA's class and method names)."""

    _target_opset_version = DEFAULT_OPSET

    @classmethod
    def _get_singa_op_type(cls, op: Any) -> str:
        return type(op).__name__

    @classmethod
    def _common_singa_tensor_to_onnx_node(cls, op: Any, op_t: Any, ctx: _Export) -> None:
        optype = cls._get_singa_op_type(op)
        translator = EXPORTERS.get(optype)
        if translator is None:
            raise ValueError(f"export: singa_jax operator {optype} ('{op.name}') has no ONNX "
                             f"translation; exportable: {sorted(EXPORTERS)}")
        n_in = len(op.src) - len(op.__dict__.get("tensor_args") or ())
        ins = [ctx.src_name(op, i) for i in range(n_in)]
        outs = [op.output_name(i) for i in range(len(op.y_id2idx))]
        if getattr(op.__dict__.get("_fn"), "autocast", None) is None:
            translator(ctx, op, ins, outs)
        else:
            _translate_float32(ctx, translator, op, ins, outs)

    @classmethod
    def singa_op_to_onnx_node(cls, op: Any, op_t: Any = None,
                              opset_version: Optional[int] = None) -> List[onnx.NodeProto]:
        """The ONNX nodes of one operator (its inputs named after their producers); constants
        it needs are not included (see :meth:`handle_special_ops`)."""
        ctx = _Export(opset_version or cls._target_opset_version)
        cls._common_singa_tensor_to_onnx_node(op, op_t, ctx)
        return list(ctx.nodes)

    @classmethod
    def handle_special_ops(cls, op: Any, X: List[onnx.ValueInfoProto],
                           W: List[onnx.TensorProto]) -> None:
        """Append to ``X`` (value infos) and ``W`` (initializers) the constants the ONNX nodes of
        ``op`` need beyond its inputs (shapes, axes, batch-norm statistics, ...)."""
        ctx = _Export(cls._target_opset_version)
        cls._common_singa_tensor_to_onnx_node(op, None, ctx)
        for name, arr in ctx.inits.items():
            W.append(numpy_helper.from_array(arr, name))
            X.append(_value_info(name, arr.dtype, arr.shape))

    @classmethod
    def singa_to_onnx_graph(cls, inputs: Sequence[Tensor], y: Any,
                            model_name: str = "sonnx", opset_version: Optional[int] = None
                            ) -> onnx.GraphProto:
        """The ONNX graph computing ``y`` (a Tensor or list of Tensors) from ``inputs``.

        As in SINGA, ``inputs`` may also hold the Python numbers, tuples and arrays an
        operator was given (``to_onnx([x, min, max], [clip(x, min, max)])``): the operator
        holds their values, which the export writes as constants, so they are skipped. A
        Tensor input that the graph holds as an initializer and does not read as a value (a
        batch-norm's running statistics: its operator holds them as state) is not a graph
        input either (``to_onnx([x, s, b, mean, var], [y])`` runs as ``run([x, s, b])``).
        """
        ctx = _Export(opset_version or cls._target_opset_version)
        ys = list(y) if isinstance(y, (list, tuple)) else [y]
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                if isinstance(t, _CONSTANT_ARGS):
                    continue
                raise TypeError(f"export: input {i} must be a Tensor (or a number, tuple, "
                                f"list or array an operator took as a constant), got "
                                f"{type(t).__name__}")
            if ("in", id(t)) in ctx.value_of:
                continue  # the same Tensor twice: one graph input
            name = ctx.unique(t.name if t.name and not t.name.startswith("Dummy#")
                              else f"input_{i}")
            ctx.value_of[("in", id(t))] = name
            ctx.inputs.append(_value_info(name, t.dtype, t.shape))
        for op in _ops_post_order(ys):
            ctx.used.update(op.output_name(i) for i in range(len(op.y_id2idx)))
        for op in _ops_post_order(ys):
            cls._common_singa_tensor_to_onnx_node(op, None, ctx)
        outputs = []
        for k, t in enumerate(ys):
            if isinstance(t.creator, Dummy):
                name = ctx.value_of.get(("in", id(t))) or ctx.leaf(t, t.name)
                (name,) = ctx.node("Identity", [name], [ctx.unique(f"output_{k}")])
            else:
                name = t.creator.output_name(t.creator.y_id2idx[id(t)])
            if ctx.autocast_seen and t.dtype in (np.float16, np.dtype(jax.numpy.bfloat16)):
                outputs.append(_value_info(name, np.float32, t.shape))  # the float32 model's
            else:
                outputs.append(_value_info(name, t.dtype, t.shape))
        # an input the graph holds as an initializer (an operator's state: batch-norm
        # statistics) and never reads as a graph value is not a graph input
        read = {n for node in ctx.nodes for n in node.input} | {o.name for o in outputs}
        held = {ctx.value_of[("in", id(t))] for t in ctx.keep
                if ("in", id(t)) in ctx.value_of}
        graph_inputs = [vi for vi in ctx.inputs if vi.name in read or vi.name not in held]
        inits = [numpy_helper.from_array(a, n) for n, a in ctx.inits.items()]
        return helper.make_graph(ctx.nodes, model_name, graph_inputs, outputs,
                                 initializer=inits)

    @classmethod
    def singa_to_onnx_model(cls, inputs: Sequence[Tensor], y: Any,
                            model_name: str = "sonnx", opset_version: Optional[int] = None,
                            dynamic_batch: bool = True) -> onnx.ModelProto:
        """The ONNX model computing ``y`` from ``inputs`` at ``opset_version`` (default
        :data:`DEFAULT_OPSET`, 21: what onnxruntime >= 1.18 loads; SINGA used 11), with the IR
        version that opset needs (10 for 21). With ``dynamic_batch`` the leading dimension of
        inputs and outputs is the symbolic ``batch`` when the graph allows another batch size.
        """
        opset = opset_version or cls._target_opset_version
        if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
            raise ValueError(f"export: opset_version must be in [{MIN_OPSET}, "
                             f"{onnx.defs.onnx_opset_version()}], got {opset}")
        graph = cls.singa_to_onnx_graph(list(inputs), y, model_name, opset)
        model = make_model_at_opset(graph, opset, producer_name="singa_jax.sonnx")
        if dynamic_batch and _batch_can_vary(model):
            _make_batch_symbolic(model)
        onnx.checker.check_model(model, full_check=True)
        return model


def _batch_dims(model: onnx.ModelProto) -> Optional[int]:
    """The common leading dimension of all inputs and outputs, or None."""
    dims = set()
    for vi in list(model.graph.input) + list(model.graph.output):
        shape = vi.type.tensor_type.shape.dim
        if not shape or not shape[0].HasField("dim_value"):
            return None
        dims.add(shape[0].dim_value)
    return dims.pop() if len(dims) == 1 else None


def _batch_can_vary(model: onnx.ModelProto) -> bool:
    """True when the graph computes outputs of batch b + 1 from inputs of batch b + 1 (its
    shapes evaluated by the importer, without computing anything)."""
    b = _batch_dims(model)
    if b is None:
        return False
    try:
        program = GraphProgram(model.graph, default_opset(model))
        if program.host_inputs:
            return False
        specs = [jax.ShapeDtypeStruct((b + 1,) + tuple(v.shape[1:]), _jax_type(v.dtype))
                 for v in program.dynamic_inputs()]
        params = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in program.params.values()]
        states = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in program.states.values()]
        wanted = tuple(o.name for o in program.outputs)
        outs, _ = jax.eval_shape(lambda i, p, s: program.evaluate(
            wanted, False, HostValues({}), None, i, p, s), specs, params, states)
    except Exception:  # noqa: BLE001 (any failure means: keep the batch fixed)
        return False
    return all(o.shape[:1] == (b + 1,) for o in outs)


def _jax_type(onnx_type: int) -> np.dtype:
    return jax_dtype(onnx_type)


def _make_batch_symbolic(model: onnx.ModelProto) -> None:
    for vi in list(model.graph.input) + list(model.graph.output):
        dim = vi.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "batch"
