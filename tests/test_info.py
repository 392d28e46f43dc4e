"""``python -m singa_jax.info``: the bug-report block shows this process's real versions, devices,
precision, cache folder and settings, and survives a backend that cannot start."""
import os
import re
import subprocess
import sys
from importlib import metadata

import jax

import singa_jax
from singa_jax import info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_info(tmp_path, **env) -> str:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("JAX_", "XLA_", "SINGA_JAX_"))}  # the test's settings only
    environ.update(env)
    proc = subprocess.run([sys.executable, "-m", "singa_jax.info"], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _value(text: str, name: str) -> str:
    """The value of the first ``name: value`` line of the report."""
    found = re.search(rf"^\s+{re.escape(name)}:\s+(.*)$", text, re.M)
    assert found, f"no {name!r} line in:\n{text}"
    return found.group(1).strip()


def test_info_reports_the_real_values(tmp_path):
    cache = str(tmp_path / "xla-cache")
    text = _run_info(tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=2",
                     JAX_PLATFORMS="cpu", SINGA_JAX_COMPILATION_CACHE=cache)
    assert _value(text, "jax") == jax.__version__
    assert _value(text, "jaxlib") == metadata.version("jaxlib")
    assert _value(text, "numpy") == metadata.version("numpy")
    assert _value(text, "singa_jax").startswith(singa_jax.__version__)
    assert _value(text, "python").startswith(
        ".".join(str(v) for v in sys.version_info[:3]))
    assert _value(text, "default backend") == "cpu"
    assert _value(text, "process") == "0 of 1"
    assert _value(text, "cpu backend").startswith("2 local device(s)")
    assert _value(text, "cpu:0").startswith("kind cpu")
    assert _value(text, "cpu:1").startswith("kind cpu")
    assert "in use of" not in text  # the CPU backend keeps no memory statistics
    assert _value(text, "setting") == "default"
    assert _value(text, "cpu arithmetic") == "float32"
    assert _value(text, "folder") == cache
    assert os.path.isdir(cache)  # singa_jax's import made it: the cache in force
    # the environment section: the variables set, and none that were not asked for
    assert _value(text, "XLA_FLAGS") == "--xla_force_host_platform_device_count=2"
    assert _value(text, "SINGA_JAX_COMPILATION_CACHE") == cache
    assert _value(text, "JAX_PLATFORMS") == "cpu"
    assert "PATH:" not in text and "HOME:" not in text
    for shown in info.OPTIONAL_PACKAGES:  # each optional package has its line
        _value(text, shown)


# a platform no JAX build has: JAX cannot start it on any machine (``cuda`` starts where a GPU
# and JAX's CUDA plugin are present), through the same path as a backend failing to initialise
NO_SUCH_PLATFORM = "no_such_platform"


def test_info_survives_a_backend_that_cannot_start(tmp_path):
    # JAX cannot start the platform asked for; the report says so in its backend lines and
    # still prints every other section
    text = _run_info(tmp_path, JAX_PLATFORMS=NO_SUCH_PLATFORM, SINGA_JAX_COMPILATION_CACHE="0")
    assert _value(text, "platforms asked") == NO_SUCH_PLATFORM
    assert _value(text, "default backend").startswith("error: ")
    assert NO_SUCH_PLATFORM in _value(text, "default backend")  # JAX's own reason
    assert _value(text, "jax") == jax.__version__
    assert _value(text, "folder") == "off"
    assert _value(text, "JAX_PLATFORMS") == NO_SUCH_PLATFORM


