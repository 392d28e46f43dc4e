"""ONNX's backend test suite (``onnx.backend.test``) against singa_jax.sonnx.SingaBackend.

Selected: the node tests whose every op is in our op table, minus EXCLUDED (each with its
reason; docs/onnx.md lists them). By default a sample runs -- the first single-node test of every
mapped op type -- to keep the suite fast; ``SONNX_BACKEND_FULL=1`` runs all of them.
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
    r"test_split_to_sequence": "SplitToSequence returns a sequence; no sequence types here",
    r"test_gathernd": "GatherND is not in the op table (SINGA's file excludes it too)",
    r"test_maxunpool": "MaxUnpool is not in the op table (SINGA's file excludes it too)",
    r"test_matmulinteger": "MatMulInteger is not in the op table (SINGA's file excludes it too)",
}

#: regex on the test name -> why the test is not run
EXCLUDED = {
    r"_string": "string tensors",
    r"test_identity_(sequence|opt)": "sequence and optional types",
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


MAPPED = _mapped_tests()
SELECTED = _selected(MAPPED, bool(os.environ.get("SONNX_BACKEND_FULL")))

backend_test = onnx.backend.test.BackendTest(SingaBackend, __name__)
backend_test.include(r"^(" + "|".join(map(re.escape, SELECTED)) + r")_cpu$")
# Only the node tests are wanted: the runner would otherwise add ~4000 skipped methods, whose
# collection alone takes longer than running the selected ones.
backend_test._test_items = {"NodeModel": {
    name: item for name, item in backend_test._test_items["NodeModel"].items()
    if name.endswith("_cpu") and name[:-4] in set(SELECTED)}}
globals().update(backend_test.enable_report().test_cases)


def test_every_mapped_op_has_node_tests():
    """The selection exercises every op of the table (in the sample too)."""
    covered = set().union(*(MAPPED[n] for n in SELECTED))
    assert covered == set(OPS), sorted(set(OPS) - covered)


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
