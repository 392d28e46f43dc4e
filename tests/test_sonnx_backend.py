"""ONNX's backend test suite (``onnx.backend.test``) against singa_jax.sonnx.SingaBackend.

Selected: the node tests whose every op is in our op table, minus EXCLUDED (each with its
reason; docs/onnx.md lists them), and onnx's eight sequence model tests. By default a sample of
the node tests runs -- the first single-node test of every mapped op type -- to keep the suite
fast; ``SONNX_BACKEND_FULL=1`` runs all of them.
"""
import os
import re

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx.backend.test  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

from singa_jax.sonnx import OPS, SingaBackend  # noqa: E402

#: SINGA's test_onnx_backend.py selects the node tests whose names contain ``test_<op>`` for
#: each op of ``SingaBackend._rename_operators`` (these seven by another name; it skips Conv's).
#: The names also catch tests of other ops; those not in our table, with why they do not run:
SINGA_NAME_PATTERNS = {"ReduceSum": "test_reduce_sum", "ReduceMean": "test_reduce_mean",
                       "BatchNormalization": "test_batchnorm",
                       "ScatterElements": "test_scatter_elements", "MaxPool": "test_maxpool_2d",
                       "AveragePool": "test_averagepool_2d", "Conv": None}
NOT_IN_TABLE = {
    r"test_gathernd": "GatherND is not in the op table (SINGA's file excludes it too)",
    r"test_maxunpool": "MaxUnpool is not in the op table (SINGA's file excludes it too)",
    r"test_matmulinteger": "MatMulInteger is not in the op table (SINGA's file excludes it too)",
}

#: regex on the test name -> why the test is not run
EXCLUDED = {
    r"_string": "string tensors",
    r"test_training_dropout(?!_zero_ratio)": "random masks cannot equal the reference's",
    r"test_reduce_(max|min)_empty_set": "max/min over an empty set",
    r"test_lstm_with_peepholes": "LSTM peepholes are not supported (prepare says so)",
    r"test_maxpool_with_argmax": "MaxPool's Indices output is not supported (prepare says so)",
    r"test_resize_tf_crop_and_resize": "Resize's tf_crop_and_resize is not supported",
    r"test_resize_.*antialias": "Resize's antialias is not supported",
}

def _mapped_tests():
    """{test name: op types} of onnx's node tests that use only ops of our table."""
    out = {}
    for case in load_model_tests(kind="node"):
        ops = {n.op_type for n in case.model.graph.node} if case.model is not None else set()
        if ops and ops <= set(OPS):
            out[case.name] = ops
    return out


def _selected(mapped, full):
    names = [n for n in mapped if not any(re.search(p, n) for p in EXCLUDED)]
    if full:
        return names
    per_op = {}
    for name in names:
        if len(mapped[name]) == 1 and not name.endswith("_expanded"):
            per_op.setdefault(next(iter(mapped[name])), []).append(name)
    return [group[0] for group in per_op.values()]


def _sequence_models():
    """{test name: op types} of onnx's "simple" model tests of the sequence ops (most of those
    ops have no node test: these chain SequenceConstruct, SequenceAt, SequenceErase,
    SequenceLength, SequenceEmpty, ConcatFromSequence, with positions as graph inputs)."""
    out = {}
    for case in load_model_tests(kind="simple"):
        if re.fullmatch(r"test_sequence_model\d+", case.name):
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
            out[case.name] = {n.op_type for n in model.graph.node}
    return out


MAPPED = _mapped_tests()
SELECTED = _selected(MAPPED, bool(os.environ.get("SONNX_BACKEND_FULL")))
SEQUENCE_MODELS = _sequence_models()
#: ops of the table that no onnx test runs alone, and the test of this file that does
TESTED_HERE = {"Optional": "test_sequence_and_optional_inputs_and_outputs"}

backend_test = onnx.backend.test.BackendTest(SingaBackend, __name__)
backend_test.include(r"^(" + "|".join(map(re.escape, SELECTED + list(SEQUENCE_MODELS))) +
                     r")_cpu$")
# Only these tests are wanted: the runner would otherwise add ~4000 skipped methods, whose
# collection alone takes longer than running the selected ones.
backend_test._test_items = {
    kind: {name: item for name, item in backend_test._test_items[kind].items()
           if name.endswith("_cpu") and name[:-4] in wanted}
    for kind, wanted in [("NodeModel", set(SELECTED)), ("SimpleModel", set(SEQUENCE_MODELS))]}
globals().update(backend_test.enable_report().test_cases)


def test_every_mapped_op_has_node_tests():
    """The selection exercises every op of the table (in the sample too): node tests, the
    sequence model tests, and TESTED_HERE."""
    assert len(SEQUENCE_MODELS) == 8 and all(ops <= set(OPS) for ops in SEQUENCE_MODELS.values())
    covered = set().union(*(MAPPED[n] for n in SELECTED), *SEQUENCE_MODELS.values(), TESTED_HERE)
    assert covered == set(OPS), sorted(set(OPS) - covered)
    assert all(name in globals() for name in TESTED_HERE.values())


def _singa_selection(names):
    pats = [SINGA_NAME_PATTERNS.get(op, "test_" + op.lower())
            for op in SingaBackend._rename_operators]
    return [n for n in names if any(p and p in n for p in pats)]


def test_singas_selection_runs_here_or_is_excluded():
    """Every node test SINGA's test_onnx_backend.py would pick (before its own exclusions) is
    run by this file with SONNX_BACKEND_FULL=1, or excluded with a reason."""
    names = [c.name for c in load_model_tests(kind="node")]
    chosen = _singa_selection(names)
    assert len(chosen) > 700
    left = [n for n in chosen if n not in MAPPED
            and not any(re.search(p, n) for p in NOT_IN_TABLE)]
    assert not left, left
    runs = [n for n in chosen if n in MAPPED and not any(re.search(p, n) for p in EXCLUDED)]
    covered = set().union(*(MAPPED[n] for n in runs))
    # SINGA's names miss Conv's tests (it skips them) and Pad's (test_constant_pad, ...); this
    # file runs those too (test_every_mapped_op_has_node_tests)
    assert set(SingaBackend._rename_operators) - covered == {"Conv", "Pad"}


# ------------------------------------------------------------------------------------------
# ONNX's low-bit Cast rules against NumPy / ml_dtypes numbers (the node tests above run only
# with SONNX_BACKEND_FULL=1 beyond one per op; these run by default)
# ------------------------------------------------------------------------------------------
ml_dtypes = pytest.importorskip("ml_dtypes")
np = pytest.importorskip("numpy")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

_F8 = {TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
       TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
       TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
       TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz}
#: beyond every float8 range, +/-Inf, NaN, values that round (RNE) and -0
_WIDE = np.array([1e6, -1e6, np.inf, -np.inf, 500.0, -449.0, 464.0, 300.0, 0.3, 1e-7, -0.0,
                  np.nan], np.float32)


def _cast_node(x, opset=25, **attrs):
    node = helper.make_node("Cast", ["x"], ["y"], **attrs)
    return SingaBackend.run_node(node, [x], opset_version=opset)["y"]


def _bits(a):
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("to", sorted(_F8))
@pytest.mark.parametrize("src", [np.float32, np.float16])
def test_saturating_float8_cast_matches_ml_dtypes(to, src):
    """saturate=1 (the default): out-of-range values and +/-Inf become +/-max (448 for E4M3FN,
    240 E4M3FNUZ, 57344 E5M2 and E5M2FNUZ), NaN stays NaN; bit for bit ml_dtypes'
    ``clip(x, -max, max).astype(float8)``. A plain conversion gives NaN or Inf instead."""
    dt = _F8[to]
    with np.errstate(over="ignore"):
        x = _WIDE.astype(src)
    big = float(ml_dtypes.finfo(dt).max)
    want = np.clip(x, -big, big).astype(dt)
    got = _cast_node(x, to=to)
    assert got.dtype == np.dtype(dt)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert got[0] == big and got[3] == -big and np.isnan(got[-1].astype(np.float32))


@pytest.mark.parametrize("to", sorted(_F8))
def test_non_saturating_float8_cast_overflows(to):
    """saturate=0: the plain conversion -- E5M2 overflows to +/-Inf, the others to NaN."""
    dt = _F8[to]
    got = _cast_node(_WIDE, to=to, saturate=0)
    np.testing.assert_array_equal(_bits(got), _bits(_WIDE.astype(dt)))
    want_big = np.inf if to == TensorProto.FLOAT8E5M2 else np.nan
    np.testing.assert_equal(got[:3].astype(np.float32), [want_big, -want_big, want_big]
                            if want_big == np.inf else [np.nan] * 3)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_e8m0_cast_rounds_as_onnx(mode, saturate):
    """float8e8m0 by ``round_mode`` and ``saturate``, bit for bit onnx.numpy_helper's
    to_float8e8m0 (the node tests use only ``up``)."""
    x = np.array([0.0, 0.124, 0.25, 0.5, 0.75, 1.1, 1.5, 3.0, 2.0 ** 127 * 1.5, 3e38, 1e-40,
                  np.nan, np.inf], np.float32)
    got = _cast_node(x, to=TensorProto.FLOAT8E8M0, round_mode=mode, saturate=saturate)
    want = numpy_helper.to_float8e8m0(x, bool(saturate), mode)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_sub_byte_int_casts_wrap_and_unpack():
    """float -> int4/uint4/int2/uint2 truncates and keeps the low bits (ml_dtypes' rule: -9 ->
    int4 7, 15 -> int4 -1, 2.7 -> 2); the 4- and 2-bit results come back as ml_dtypes arrays and
    cast back to int8."""
    x = np.array([-9, -8, -2.7, -1, 0, 2.7, 7, 8, 15], np.float32)
    for to, dt in [(TensorProto.INT4, ml_dtypes.int4), (TensorProto.UINT4, ml_dtypes.uint4),
                   (TensorProto.INT2, ml_dtypes.int2), (TensorProto.UINT2, ml_dtypes.uint2)]:
        got = _cast_node(x, to=to)
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(got.astype(np.int8), x.astype(dt).astype(np.int8))
        back = _cast_node(got, to=TensorProto.INT8)
        np.testing.assert_array_equal(back, x.astype(dt).astype(np.int8))


def test_castlike_uses_casts_rules():
    """CastLike to a float8 like-tensor saturates as Cast does (saturate defaults to 1)."""
    like = np.zeros(1, ml_dtypes.float8_e4m3fn)
    for saturate, want in [(1, [448.0, -448.0]), (0, [np.nan, np.nan])]:
        node = helper.make_node("CastLike", ["x", "like"], ["y"], saturate=saturate)
        got = SingaBackend.run_node(node, [np.array([1e6, -np.inf], np.float32), like],
                                    opset_version=25)["y"]
        np.testing.assert_equal(got.astype(np.float32), want)


# ------------------------------------------------------------------------------------------
# sequences and optionals through prepare / run / run_node, against NumPy (the node tests run
# only one per op by default)
# ------------------------------------------------------------------------------------------
import jax  # noqa: E402

from singa_jax import autograd, sonnx, tensor  # noqa: E402


def _graph(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "seq", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _seq_vi(name, elem=TensorProto.FLOAT):
    return helper.make_value_info(name, helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(elem, None)))


def _split_at_add_model(w):
    """y = x @ SequenceAt(SplitToSequence(w, [2, 3], axis=1), -1) + x, and the sequence's
    length: a trained parameter split into a sequence."""
    nodes = [helper.make_node("SplitToSequence", ["w", "split"], ["seq"], axis=1),
             helper.make_node("SequenceAt", ["seq", "last"], ["piece"]),
             helper.make_node("MatMul", ["x", "piece"], ["h"]),
             helper.make_node("Add", ["h", "x"], ["y"]),
             helper.make_node("SequenceLength", ["seq"], ["n"])]
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "split"),
             numpy_helper.from_array(np.array(-1, np.int64), "last")]
    return _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3]),
                   helper.make_tensor_value_info("n", TensorProto.INT64, [])], inits)


def test_split_to_sequence_of_a_parameter_runs_and_differentiates(rng):
    """SplitToSequence -> SequenceAt -> MatMul/Add against NumPy; the split parameter is a
    parameter (trainable), and its gradient through the sequence equals jax.grad's of the same
    function on arrays (zero on the piece SequenceAt does not take)."""
    w = rng.standard_normal((3, 5)).astype(np.float32)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    rep = sonnx.prepare(_split_at_add_model(w))
    assert set(rep.get_params()) == {"w"}
    y, n = rep.run([x])
    np.testing.assert_allclose(y, x @ w[:, 2:] + x, rtol=1e-5, atol=1e-6)
    assert n.dtype == np.int64 and n == 2

    autograd.training = True
    out = rep.run([tensor.Tensor(data=x, requires_grad=False)])[0]
    loss = autograd.reduce_sum(autograd.reduce_sum(autograd.mul(out, out), None, 0), None, 0)
    grads = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss)}
    autograd.training = False

    def reference(w_):
        return jax.numpy.sum((x @ jax.numpy.split(w_, [2], axis=1)[1] + x) ** 2)
    want = np.asarray(jax.grad(reference)(w))
    np.testing.assert_allclose(grads["w"], want, rtol=1e-4, atol=1e-5)
    assert np.all(grads["w"][:, :2] == 0) and np.all(np.abs(grads["w"][:, 2:]) > 0)


def test_sequence_ops_against_numpy(rng):
    """Every sequence op in one graph: construct, insert (back, at -1), erase, at, empty,
    length, concat and stack, split by a scalar (a shorter last piece) and by 1 without the
    axis; a sequence output comes back as a list of arrays."""
    a, b, c = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    i64 = TensorProto.INT64
    consts = {"m1": -1, "zero": 0, "two": 2}
    nodes = [helper.make_node("Constant", [], [k], value=helper.make_tensor(k, i64, [], [v]))
             for k, v in consts.items()]
    nodes += [helper.make_node("SequenceConstruct", ["a", "b"], ["s1"]),     # [a, b]
              helper.make_node("SequenceInsert", ["s1", "c"], ["s2"]),       # [a, b, c]
              helper.make_node("SequenceInsert", ["s2", "a", "m1"], ["s3"]),  # [a, b, a, c]
              helper.make_node("SequenceErase", ["s3", "zero"], ["s4"]),     # [b, a, c]
              helper.make_node("SequenceErase", ["s4"], ["s5"]),             # [b, a]
              helper.make_node("SequenceAt", ["s4", "m1"], ["last"]),        # c
              helper.make_node("ConcatFromSequence", ["s4"], ["cat"], axis=1),
              helper.make_node("ConcatFromSequence", ["s5"], ["stack"], axis=-1, new_axis=1),
              helper.make_node("SequenceEmpty", [], ["e"]),
              helper.make_node("SequenceInsert", ["e", "c"], ["s6"]),        # [c]
              helper.make_node("SequenceLength", ["s3"], ["len"]),
              helper.make_node("SplitToSequence", ["a", "two"], ["pieces"], axis=1),
              helper.make_node("SplitToSequence", ["b"], ["rows"], keepdims=0)]
    f = TensorProto.FLOAT
    outs = [helper.make_tensor_value_info("last", f, [2, 3]),
            helper.make_tensor_value_info("cat", f, [2, 9]),
            helper.make_tensor_value_info("stack", f, [2, 3, 2]),
            helper.make_tensor_value_info("len", i64, []),
            _seq_vi("s5"), _seq_vi("s6"), _seq_vi("pieces"), _seq_vi("rows")]
    ins = [helper.make_tensor_value_info(n, f, [2, 3]) for n in "abc"]
    rep = sonnx.prepare(_graph(nodes, ins, outs))
    last, cat, stack, length, s5, s6, pieces, rows = rep.run([a, b, c])
    np.testing.assert_array_equal(last, c)
    np.testing.assert_array_equal(cat, np.concatenate([b, a, c], axis=1))
    np.testing.assert_array_equal(stack, np.stack([b, a], axis=-1))
    assert length == 4 and length.dtype == np.int64
    for got, want in [(s5, [b, a]), (s6, [c]), (pieces, [a[:, :2], a[:, 2:]]), (rows, list(b))]:
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_sequence_and_optional_inputs_and_outputs(rng):
    """A sequence graph input (a list), an optional one (None: empty), Optional, Identity,
    OptionalHasElement, OptionalGetElement; a position fed as an input is read on the host (a
    program per value). With Tensors in, Tensors out (a list of them for a sequence)."""
    f = TensorProto.FLOAT
    opt_vi = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(f, [3])))
    empty_type = helper.make_tensor_type_proto(f, [3])
    nodes = [helper.make_node("Identity", ["s"], ["s_out"]),
             helper.make_node("SequenceAt", ["s", "pos"], ["picked"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Identity", ["o"], ["o_out"]),
             helper.make_node("Optional", [], ["nothing"], type=empty_type),
             helper.make_node("OptionalHasElement", ["nothing"], ["has_nothing"]),
             helper.make_node("Optional", ["picked"], ["wrapped"]),
             helper.make_node("OptionalGetElement", ["wrapped"], ["unwrapped"])]
    o_out = helper.make_value_info("o_out", opt_vi.type)
    outs = [_seq_vi("s_out"), helper.make_tensor_value_info("picked", f, [3]),
            helper.make_tensor_value_info("has", TensorProto.BOOL, []), o_out,
            helper.make_tensor_value_info("has_nothing", TensorProto.BOOL, []),
            helper.make_tensor_value_info("unwrapped", f, [3])]
    ins = [_seq_vi("s"), helper.make_tensor_value_info("pos", TensorProto.INT64, []), opt_vi]
    rep = sonnx.prepare(_graph(nodes, ins, outs))
    assert rep.program.host_inputs == ("pos",)
    s = [rng.standard_normal((3,)).astype(np.float32) for _ in range(3)]
    for pos, o in [(1, None), (-3, np.arange(3, dtype=np.float32))]:
        s_out, picked, has, o_out, has_nothing, unwrapped = rep.run([s, np.array(pos), o])
        assert isinstance(s_out, list) and len(s_out) == 3
        for got, want in zip(s_out, s):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(picked, s[pos])
        np.testing.assert_array_equal(unwrapped, s[pos])
        assert has.dtype == np.bool_ and bool(has) == (o is not None) and not has_nothing
        if o is None:
            assert o_out is None
        else:
            np.testing.assert_array_equal(o_out, o)
    ts = [tensor.Tensor(data=v) for v in s]
    s_out, picked, *_ = rep.run([ts, tensor.Tensor(data=np.array(2)), None])
    assert all(isinstance(t, tensor.Tensor) for t in s_out + [picked])
    np.testing.assert_array_equal(tensor.to_numpy(picked), s[2])


def test_sequence_errors_name_the_node_or_input():
    """Unsupported attribute values fail at prepare naming the node; a position out of range,
    an empty optional's element and inputs of the wrong kind fail at run, naming them."""
    f = TensorProto.FLOAT
    x_vi = helper.make_tensor_value_info("x", f, [2, 3])
    y_vi = _seq_vi("y")
    bad = [(helper.make_node("SplitToSequence", ["x"], ["y"], name="sp", keepdims=2),
            r"node 'sp' \(SplitToSequence, opset 18\): keepdims=2 is not supported"),
           (helper.make_node("SequenceEmpty", [], ["y"], name="se", dtype=TensorProto.STRING),
            r"node 'se' \(SequenceEmpty, opset 18\): dtype string"),
           (helper.make_node("Optional", [], ["y"], name="op",
                             type=helper.make_tensor_type_proto(TensorProto.STRING, [])),
            r"node 'op' \(Optional, opset 18\): attribute type tensor\(string\) is not "
            r"supported")]
    for node, match in bad:
        with pytest.raises(sonnx.UnsupportedOnnx, match=match):
            sonnx.prepare(_graph([node], [x_vi] if node.input else [], [y_vi]))
    seq_x = helper.make_node("SequenceConstruct", ["x", "x"], ["sx"])
    with pytest.raises(sonnx.UnsupportedOnnx, match=r"node 'cat' .*new_axis=2 is not supported"):
        sonnx.prepare(_graph([seq_x, helper.make_node("ConcatFromSequence", ["sx"], ["c"],
                                                      name="cat", axis=0, new_axis=2)],
                             [x_vi], [helper.make_tensor_value_info("c", f, [2, 6])]))
    map_vi = helper.make_value_info("m", helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(f, [2])))
    with pytest.raises(sonnx.UnsupportedOnnx, match="graph input 'm': values of type map"):
        sonnx.prepare(_graph([helper.make_node("Identity", ["m"], ["y"])], [map_vi],
                             [helper.make_value_info("y", map_vi.type)]))

    at = sonnx.prepare(_graph([seq_x, helper.make_node("SequenceAt", ["sx", "p"], ["z"],
                                                       name="at")],
                              [x_vi, helper.make_tensor_value_info("p", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("z", f, [2, 3])]))
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"node 'at' \(SequenceAt, opset 18\): position 2 is "
                                         r"out of range \[-2, 1\]"):
        at.run([x, np.array(2)])
    get = sonnx.prepare(_graph(
        [helper.make_node("OptionalGetElement", ["o"], ["z"], name="get")],
        [helper.make_value_info("o", helper.make_optional_type_proto(
            helper.make_tensor_type_proto(f, [2, 3])))],
        [helper.make_tensor_value_info("z", f, [2, 3])]))
    np.testing.assert_array_equal(get.run([x])[0], x)
    with pytest.raises(ValueError, match=r"node 'get' \(OptionalGetElement, opset 18\): the "
                                         r"optional input is empty"):
        get.run([None])
    ident = sonnx.prepare(_graph([helper.make_node("Identity", ["s"], ["y"])], [_seq_vi("s")],
                                 [y_vi]))
    with pytest.raises(TypeError, match="input 's' is a sequence of tensors: pass a list"):
        ident.run([x])
    with pytest.raises(TypeError, match=r"input 's' element 1 expects dtype float32, got bool"):
        ident.run([[x, np.zeros((2, 3), bool)]])
    with pytest.raises(TypeError, match="input 'x' is a tensor, got None"):
        at.run([None, np.array(0)])


def test_run_node_takes_lists_as_sequences_and_none_as_empty():
    """run_node: a list where the op takes a sequence (a list of arrays comes back), None for
    an empty optional; a list for a tensor input is still one array."""
    a, b = np.ones((2,), np.float32), np.arange(2, dtype=np.float32)
    out = sonnx.run_node(helper.make_node("SequenceInsert", ["s", "t", "p"], ["y"]),
                         [[a, b], a * 5, np.array(0)], opset_version=11)["y"]
    assert isinstance(out, list)
    np.testing.assert_array_equal(np.stack(out), np.stack([a * 5, a, b]))
    has = sonnx.run_node(helper.make_node("OptionalHasElement", ["o"], ["y"]), [None],
                         opset_version=18)["y"]
    assert has.dtype == np.bool_ and not has
    # OptionalHasElement-15 takes only optionals: a tensor is wrapped in one
    has = sonnx.run_node(helper.make_node("OptionalHasElement", ["o"], ["y"]), [a],
                         opset_version=15)["y"]
    assert bool(has)
    y = sonnx.run_node(helper.make_node("Relu", ["x"], ["y"]), [[-1.0, 2.0]])["y"]
    np.testing.assert_array_equal(y, [0.0, 2.0])


def test_split_to_sequence_fine_tunes_in_graph_mode(rng):
    """A SONNXModel whose parameter goes through SplitToSequence trains in graph mode: the
    loss falls, the piece SequenceAt takes moves and the other stays."""
    from singa_jax import opt

    w = rng.standard_normal((3, 5)).astype(np.float32)

    class Net(sonnx.SONNXModel):
        def forward(self, x):
            return super().forward(x)[0]

        def train_one_batch(self, x, t):
            d = autograd.sub(self.forward(x), t)
            loss = autograd.reduce_mean(autograd.mul(d, d), None, 0)
            self.optimizer(loss)
            return loss

    model = _split_at_add_model(w)
    model.graph.output.pop()  # y only
    net = Net(model)
    net.set_optimizer(opt.SGD(lr=0.2))
    tx = tensor.Tensor(data=rng.standard_normal((8, 3)).astype(np.float32))
    tt = tensor.Tensor(data=rng.standard_normal((8, 3)).astype(np.float32))
    net.compile([tx], is_train=True, use_graph=True)
    net.train()
    losses = [float(tensor.to_numpy(net(tx, tt))) for _ in range(8)]
    net.eval()
    assert losses[-1] < 0.75 * losses[0], losses
    trained = tensor.to_numpy(net.get_params()["w"])
    np.testing.assert_array_equal(trained[:, :2], w[:, :2])
    assert np.abs(trained[:, 2:] - w[:, 2:]).min() > 0
