"""ONNX internals: the imported graph's pullback. (This tier imports
singa_jax._src.)"""
import pathlib
import re
import jax
import numpy as np
import pytest
from onnx import helper  # noqa: E402
from backend_precision import matmul_tolerance  # noqa: E402
from singa_jax import autograd, tensor  # noqa: E402
from singa_jax import sonnx  # noqa: E402
pytestmark = pytest.mark.usefixtures("eval_mode")  # conftest: autograd.training = False
from test_sonnx import (  # noqa: F401 (shared helpers and fixtures)
    _ir_for, _model, _vi, onnx, t)


ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gradients_match_finite_differences(rng):
    """The vjp of the imported graph is the true gradient (checked against central differences
    of the onnxruntime output)."""
    w = rng.standard_normal((3, 4)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Tanh", ["h"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", [2, 4])],
               [onnx.numpy_helper.from_array(w, "w")])
    rep = sonnx.prepare(m)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    autograd.training = True
    xt = t(x)
    out = rep.run([xt])[0]
    # dw = x^T dh: the graph's pullback keeps the input array itself, not a copy of it
    assert any(leaf is xt.array for leaf in jax.tree_util.tree_leaves(out.creator._vjp))
    loss = autograd.reduce_sum(autograd.reduce_sum(out, None, 0), None, 0)
    grads = {p.name: tensor.to_numpy(g) for p, g in autograd.backward(loss)}
    autograd.training = False
    want = (1 - np.tanh(x @ w) ** 2)
    np.testing.assert_allclose(grads["w"], x.T @ want, **matmul_tolerance(1e-5))  # products


# --------------------------------------------------------------------------------------------
# docs
# --------------------------------------------------------------------------------------------
def test_docs_op_table_is_generated_from_the_code():
    text = (ROOT / "docs" / "onnx.md").read_text()
    found = re.search(r"<!-- op-table:start -->\n(.*?)<!-- op-table:end -->", text, re.S)
    assert found, "docs/onnx.md lost its op-table markers"
    assert found.group(1) == sonnx.op_table_markdown(), \
        "docs/onnx.md's op table is stale: run python -m singa_jax._src.onnx.doc_table"
