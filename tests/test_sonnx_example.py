"""examples/onnx/export_import.py --quick: export, onnxruntime check, import, fine-tune."""
import importlib.util
import os
import sys

import numpy as np
import pytest

from backend_precision import matmul_tolerance

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_onnx_example_quick(tmp_path, capsys):
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location(
            "example_onnx_export_import", os.path.join(EXAMPLES, "onnx", "export_import.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        losses = module.main(["--quick", "--out", str(tmp_path / "m.onnx")])
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            if name == "common" or name.startswith("common."):
                del sys.modules[name]
    assert (tmp_path / "m.onnx").exists()
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    diff = float(capsys.readouterr().out.split("max |diff| = ")[1].split()[0])
    assert diff < matmul_tolerance(0.0, 1e-4)["atol"]  # onnxruntime's products vs ours (TF32 on GPU)
