"""No path assumes a platform: the example models' graph-mode training steps lower for GPU and TPU.

On this CPU-only machine each example model (examples/cnn's cnn, resnet and xceptionnet, and
examples/rnn's char-RNN) is built and trained for one step in graph mode as its example does
(SGD with momentum), and ``Model.export_step`` then lowers that very program for
``("cuda", "tpu")`` with ``jax.export``. The exported module must hold no CPU-only custom call,
name no device of this machine, convolve with XLA's convolution wherever the model has a
convolution layer (not with the CPU forms of autograd/conv_cpu.py, chosen by
``lax.platform_dependent`` only when lowering for a CPU), and take and return exactly the step's
state and batch. The convolution kernel itself is lowered for both kinds of platform, to show the
choice between the forms is made at lowering.

Small inputs (batch 2; ResNet-50 at 32x32, Xception at its smallest, 35x35) keep tracing short;
most of each model's time is the CPU compilation of its one step.
"""
import re

import jax
import jax.numpy as jnp
import pytest

from singa_jax import layer

PLATFORMS = ("cuda", "tpu")

# custom-call targets that only XLA:CPU has (JAX's LAPACK and DUCC kernels, CPU callbacks)
_CPU_ONLY_TARGET = re.compile(r"lapack_|ducc|xla_cpu|_cpu_|^cpu_|_cpu$", re.IGNORECASE)


# --- reading an exported module -------------------------------------------------------------
def custom_call_targets(module_text: str) -> set:
    """Every custom-call target of a StableHLO module, in its pretty or generic form."""
    return (set(re.findall(r"custom_call @([\w.$-]+)", module_text))
            | set(re.findall(r'call_target_name = "([^"]+)"', module_text)))


def cpu_only_targets(module_text: str) -> set:
    return {t for t in custom_call_targets(module_text) if _CPU_ONLY_TARGET.search(t)}


def test_the_cpu_only_check_sees_a_cpu_only_target():
    """The module checks below would notice a CPU-only kernel: a QR lowered for the CPU calls
    LAPACK, the same QR lowered for GPU and TPU does not."""
    qr = jax.jit(jnp.linalg.qr)
    x = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    on_cpu = jax.export.export(qr, platforms=("cpu",))(x).mlir_module()
    elsewhere = jax.export.export(qr, platforms=PLATFORMS)(x).mlir_module()
    assert any(t.startswith("lapack_") for t in cpu_only_targets(on_cpu))
    assert custom_call_targets(elsewhere) and not cpu_only_targets(elsewhere)


def test_export_step_needs_a_compiled_call():
    from singa_jax import model

    class Tiny(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(2)

        def forward(self, x):
            return self.fc(x)

    with pytest.raises(LookupError, match="Tiny.train_one_batch has not been compiled"):
        Tiny().export_step()


