"""The float32 matmul precision policy (singa_jax.precision) and the suite's per-precision
tolerances, checked on the CPU through TF32 emulation (tests/backend_precision.py)."""
import os
import subprocess
import sys
import textwrap

import jax
import pytest

import backend_precision
from singa_jax import precision

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def restore_precision():
    saved = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", saved)


def test_arithmetic_per_backend_and_setting():
    arith = precision.float32_matmul_arithmetic
    assert arith("cpu", "default") == "float32"
    assert arith("gpu", "default") == "tensorfloat32"
    assert arith("gpu", "tensorfloat32") == "tensorfloat32"
    assert arith("gpu", "float32") == arith("gpu", "highest") == "float32"
    assert arith("tpu", "default") == "bfloat16"
    assert arith("tpu", "high") == "bfloat16_3x"
    assert arith("tpu", "float32") == "float32"
    with pytest.raises(ValueError, match="unknown float32 matmul precision 'double'"):
        arith("gpu", "double")


def test_switch_is_jax_setting(restore_precision):
    precision.set_float32_matmul_precision("float32")
    assert jax.config.jax_default_matmul_precision == "float32"
    assert precision.float32_matmul_precision() == "float32"
    assert precision.float32_matmul_arithmetic("gpu") == "float32"
    precision.set_float32_matmul_precision(None)
    assert precision.float32_matmul_precision() == "default"
    assert precision.float32_matmul_arithmetic("gpu") == "tensorfloat32"
    with precision.float32_matmul_precision_scope("highest"):
        assert precision.float32_matmul_precision() == "highest"
        with jax.default_matmul_precision("tensorfloat32"):  # JAX's own block is honoured
            assert precision.float32_matmul_arithmetic("gpu") == "tensorfloat32"
    assert precision.float32_matmul_precision() == "default"
    with pytest.raises(ValueError, match="set_float32_matmul_precision"):
        precision.set_float32_matmul_precision("fp64")
    assert precision.float32_matmul_precision() == "default"


def test_tolerance_follows_arithmetic(monkeypatch):
    monkeypatch.setattr(backend_precision, "arithmetic", lambda: "float32")
    assert backend_precision.matmul_tolerance(1e-6, 1e-7) == {"rtol": 1e-6, "atol": 1e-7}
    monkeypatch.setattr(backend_precision, "arithmetic", lambda: "tensorfloat32")
    assert backend_precision.matmul_tolerance(1e-6) == {"rtol": 1e-2, "atol": 1e-2}
    monkeypatch.setattr(backend_precision, "arithmetic", lambda: "bfloat16")
    assert backend_precision.matmul_tolerance(1e-6) == {"rtol": 5e-2, "atol": 5e-2}


def _run_emulated(script: str) -> str:
    env = dict(os.environ, SINGA_JAX_EMULATE_TF32="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), \
        proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_tf32_emulation_rounds_like_tf32():
    """The proxy itself: a TF32 dot's error is ~2^-11 relative; float32's ~1e-7."""
    _run_emulated("""
        import jax, jax.numpy as jnp, numpy as np
        import backend_precision as bp
        bp.install_tf32_emulation()
        rng = np.random.default_rng(0)
        a = rng.standard_normal((64, 256)).astype(np.float32)
        b = rng.standard_normal((256, 32)).astype(np.float32)
        exact = a.astype(np.float64) @ b
        rel = lambda y: np.abs(np.asarray(y) - exact).max() / np.abs(exact).max()
        dot = jax.jit(lambda a, b: a @ b)
        assert 5e-5 < rel(dot(a, b)) < 3e-3, rel(dot(a, b))
        # the operands rounded by hand, multiplied in float64: the same numbers
        by_hand = np.asarray(bp.to_tf32(a), np.float64) @ np.asarray(bp.to_tf32(b), np.float64)
        assert np.allclose(np.asarray(dot(a, b)), by_hand, rtol=1e-5, atol=1e-5)
        with jax.default_matmul_precision("float32"):
            assert rel(dot(a, b)) < 1e-6, rel(dot(a, b))
        print("OK")
    """)


def test_precision_switch_reaches_eager_and_graph_mode():
    """Under TF32 (emulated), switching to float32 changes the result of an eager operator and
    of a graph-mode step already compiled under TF32: the step is compiled again."""
    _run_emulated("""
        import jax, numpy as np
        import backend_precision as bp
        bp.install_tf32_emulation()
        from singa_jax import autograd, layer, model, opt, precision, tensor
        rng = np.random.default_rng(1)
        x = rng.standard_normal((16, 128)).astype(np.float32)
        w = rng.standard_normal((128, 8)).astype(np.float32)
        exact = x.astype(np.float64) @ w
        rel = lambda y: np.abs(tensor.to_numpy(y) - exact).max() / np.abs(exact).max()
        tx, tw = tensor.from_numpy(x), tensor.from_numpy(w)
        assert rel(autograd.matmul(tx, tw)) > 5e-5
        with precision.float32_matmul_precision_scope("float32"):
            assert rel(autograd.matmul(tx, tw)) < 1e-6

        class Net(model.Model):
            def __init__(self):
                super().__init__()
                self.fc = layer.Linear(8, bias=False)
            def forward(self, x):
                return self.fc(x)
        m = Net()
        m.compile([tx], is_train=False, use_graph=True)
        m.fc.W.copy_from_numpy(w)
        assert rel(m(tx)) > 5e-5
        with precision.float32_matmul_precision_scope("float32"):
            assert rel(m(tx)) < 1e-6
        assert rel(m(tx)) > 5e-5
        print("OK")
    """)


# Tests whose float32 tolerances assumed float32 products; under TF32 they take theirs from
# backend_precision.matmul_tolerance (run here as a GPU would compute them).
# A sample of them, one per kind (convolutions, recurrences, legacy layers, fused walks); the
# whole suite passes under SINGA_JAX_EMULATE_TF32=1 too (docs/accelerators.md).
_PRECISION_SENSITIVE = [
    "tests/test_layer.py::test_separable_conv2d",
    "tests/test_layer.py::test_lstm_against_recurrence",
    "tests/internal/test_autograd_nn.py::test_rnn_final_states_match_numpy",
    "tests/test_legacy_layer.py::test_legacy_layers_inside_a_modern_network",
    "tests/internal/test_fused_walk.py::test_wanted_intermediates_match_the_op_by_op_walk",
]


@pytest.mark.skipif(backend_precision.emulating_tf32(), reason="already emulating")
def test_suite_tolerances_hold_under_tf32():
    root = os.path.dirname(TESTS)
    env = dict(os.environ, SINGA_JAX_EMULATE_TF32="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *_PRECISION_SENSITIVE], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
