"""Shared pytest fixtures: every test starts from a cold engine, and every monkeypatch of a
singa_jax module reaches every module that reads the patched object."""
import ast
import functools
import os
import subprocess
import sys
import types

import numpy as np
import pytest

# The tests check what programs compute, never how fast they run, and most programs here run a
# few times: compile each for compile time (JAX's jax_disable_most_optimizations, which singa_jax
# extends with no XLA:CPU library fusions; see backend.xla_options). Set before JAX is imported,
# so processes the tests start inherit it; JAX_DISABLE_MOST_OPTIMIZATIONS=0 tests the optimised
# programs instead.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import backend_precision  # noqa: E402

if backend_precision.emulating_tf32():  # the CPU proxy of a GPU run (see backend_precision)
    backend_precision.install_tf32_emulation()


@pytest.fixture(autouse=True)
def _cold_engine():
    """Each test starts from a cold engine: eager replay's recorded sequences and programs,
    fused walks' plans and the per-kind recipes forgotten, every Device's key at its initial
    seed -- so that no test depends on what the tests before it ran."""
    from singa_jax._src.base import process_state
    process_state.reset()
    yield


_PLAIN = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)
_NOTSET = pytest.MonkeyPatch.setattr.__defaults__[0]


@functools.lru_cache(maxsize=None)
def _names_read_in(path: str) -> frozenset:
    """The names a module's code reads (loads) anywhere: its bindings that matter."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    return frozenset(n.id for n in ast.walk(tree)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _read_names(module: types.ModuleType) -> frozenset:
    path = getattr(module, "__file__", None)
    return _names_read_in(path) if path else frozenset()


class CheckedMonkeyPatch(pytest.MonkeyPatch):
    """``monkeypatch`` whose ``setattr`` of an object on a singa_jax module is checked when the
    test ends: no other singa_jax module may still bind the old object under a name it reads
    (``from x import name``), since code reading that binding never saw the patch and the test
    checked less than it says. Patch every binding, or use ``setattr_one`` to patch one on
    purpose."""

    def __init__(self) -> None:
        super().__init__()
        self._checked: list = []

    def setattr(self, target, name, value=_NOTSET, raising=True):
        if value is _NOTSET:  # setattr("module.attr", value)
            value, (module_name, _, name) = name, target.rpartition(".")
            target = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
        if isinstance(target, types.ModuleType) and target.__name__.startswith("singa_jax"):
            old = getattr(target, name, None)
            if old is not None and not isinstance(old, _PLAIN):
                self._checked.append((f"{target.__name__}.{name}", old))
        return super().setattr(target, name, value, raising=raising)

    def setattr_one(self, target, name, value, raising=True):
        """``setattr`` without the check: the test patches this one binding on purpose."""
        return super().setattr(target, name, value, raising=raising)

    def unreached(self) -> list:
        """``(patched name, [bindings still holding the old object that their module
        reads])`` for every checked patch that did not reach every reader."""
        found = []
        for where, old in self._checked:
            stale = [f"{m.__name__}.{k}" for m in list(sys.modules.values())
                     if isinstance(m, types.ModuleType)
                     and getattr(m, "__name__", "").startswith("singa_jax")
                     for k, v in list(vars(m).items()) if v is old and k in _read_names(m)]
            if stale:
                found.append((where, stale))
        return found


@pytest.fixture
def monkeypatch():
    """pytest's ``monkeypatch``, checked when the test ends (see :class:`CheckedMonkeyPatch`)."""
    patch = CheckedMonkeyPatch()
    yield patch
    unreached = patch.unreached()
    patch.undo()
    assert not unreached, (f"monkeypatch did not reach every module that reads the patched "
                           f"object: {unreached}; patch those bindings too (or use "
                           f"setattr_one to patch one on purpose)")


@pytest.fixture
def record_every_sequence(monkeypatch):
    """Eager replay records sequences of any length (by default only those of at least
    ``MIN_RECORDS`` kernels): small test programs replay as a large model's would."""
    from singa_jax._src.eager import replay
    monkeypatch.setattr(replay, "MIN_RECORDS", 1)


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with a fixed seed, for reproducible random test inputs."""
    return np.random.default_rng(0)


def _with_training_flag(value: bool):
    from singa_jax import autograd
    saved = autograd.training
    autograd.training = value
    yield
    autograd.training = saved


@pytest.fixture
def training_mode():
    """Run a test with ``autograd.training = True`` and restore the flag afterwards."""
    yield from _with_training_flag(True)


@pytest.fixture
def eval_mode():
    """Run a test with ``autograd.training = False`` and restore the flag afterwards."""
    yield from _with_training_flag(False)


@pytest.fixture(autouse=True)
def _modes_reset_after_each_test():
    """SINGA's ``autograd.training`` default is process-wide (``Model.train()`` sets it, as in
    SINGA); reset it after every test so that no test depends on the ones before it."""
    yield
    from singa_jax._src.base import modes
    modes.set_training(False)


@pytest.fixture
def run_on_two_host_devices():
    """``run(script)``: run the Python ``script`` in a fresh process with two host CPU devices
    and assert that it ends by printing OK (its stderr is shown when it does not)."""
    def run(script: str) -> None:
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
                   JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
    return run
