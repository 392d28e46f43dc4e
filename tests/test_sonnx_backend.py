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

_LOW_BIT = ("the importer does not implement ONNX's 8-, 4- and 2-bit element types (float8, "
            "float4, int4, int2, e8m0) or their saturating / rounding casts; JAX has array "
            "types for them (ml_dtypes), so this is work not done, not a limit")
#: regex on the test name -> why the test is not run
EXCLUDED = {
    r"test_cast.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|E8M0)": _LOW_BIT,
    r"test_castlike.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|E8M0)": _LOW_BIT,
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
