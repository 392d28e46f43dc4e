"""The first step white-box: tiered compilation, host-side key splits, the compile options per tier.
(This tier imports singa_jax._src.)"""
import contextlib
import os
import threading
import jax
import numpy as np
import pytest
from backend_precision import two_programs_tolerance
from singa_jax import model, tensor
from singa_jax._src.backend import tiers as graph_tiers
from singa_jax._src.base import host_prng
from singa_jax._src.backend import xla_options
from test_first_step import (  # noqa: F401 (shared helpers and fixtures)
    IN, Net, OPTIMIZERS, assert_close, build, counts, data, restore_training_flag, states)


def test_host_key_operations_equal_jax_random():
    keys = [jax.random.PRNGKey(s) for s in (0, 1, 11, 2 ** 31 - 1)]
    keys.append(jax.device_put(np.array([0xFFFFFFFF, 0x12345678], np.uint32)))
    for key in keys:
        assert host_prng.supported(key)
        for got, want in zip(host_prng.split(key), jax.random.split(key)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        for i in (0, 1, 7, 2 ** 32 - 1):
            np.testing.assert_array_equal(np.asarray(host_prng.fold_in(key, i)),
                                          np.asarray(jax.random.fold_in(key, i)))
    assert not host_prng.supported(jax.random.key(0))  # a typed key: jax.random's own path


# --- tiered compilation: the first call runs a quickly compiled program ---------------------------
def _tiers_possible():
    """The quick options of the default backend (None: it has none, nothing to test)."""
    platform = jax.default_backend()
    return xla_options.quick_options(platform, xla_options.compile_options(
        platform, for_compile_time=False))


def _program(net):
    (prog,) = net._graph_runner.programs.values()
    return prog


def test_a_tiered_step_runs_quick_then_optimised_and_equals_a_step_compiled_once(
        tier_records):
    """With tiers forced (this suite compiles every program quickly: the optimised tier then
    takes the options it has without that flag), the first call runs the quick program while
    the optimised one compiles in the background; the call after it is ready runs it. The
    state the quick program wrote (donated buffers) carries over, a bad call in between
    changes nothing, a new batch size is a new (tiered) program and the old one still serves
    its own size: every loss and final state equals the same calls compiled once."""
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")
    bad_y = tensor.from_numpy(np.full((IN[0],), 7, np.int32))  # a class out of range (3)
    runs = []
    for mode in ("always", False):
        net = build(OPTIMIZERS["sgd_momentum"], True)
        losses = []
        with model.tiered_compilation(mode):
            losses.append(float(net(*data(0))[1].array[0]))
            prog = _program(net)
            quick = prog.compiled
            if mode:
                assert counts(net, "tiered", "compiles") == (1, 2)
                assert prog.pending is not None
                assert net._graph_runner.last_compile_options == _tiers_possible()
            net.finish_compiling()
            assert prog.pending is None
            assert (prog.compiled is not quick) == bool(mode)
            before = states(net)
            with pytest.raises(ValueError):
                net(data(1)[0], bad_y)
            assert_close(before, states(net), tol=0)
            losses += [float(net(*data(s))[1].array[0]) for s in (1, 2)]
            losses += [float(net(*data(s, batch=2))[1].array[0]) for s in (3, 4)]
            losses.append(float(net(*data(5))[1].array[0]))
        assert counts(net, "traces", "tiered") == (2, (2 if mode else 0))
        runs.append((losses, states(net)))
    np.testing.assert_allclose(runs[0][0], runs[1][0], **two_programs_tolerance(1e-5))
    assert_close(runs[0][1], runs[1][1], tol=1e-5)


@pytest.fixture
def tier_records(monkeypatch, tmp_path):
    """The records of programs compiled into the persistent cache go to a folder of this test
    (never the user's cache: a record there would decide another test's tiers)."""
    monkeypatch.setattr(graph_tiers, "_records_folder", lambda: str(tmp_path))
    return tmp_path


@contextlib.contextmanager
def _optimising():
    """Programs compiled for run time (this suite compiles them for compile time, when a
    step's own options are the quick ones and there are no tiers to choose)."""
    saved = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", saved)


def test_tiers_only_where_they_pay(monkeypatch, tier_records):
    """``True``: a step is compiled in tiers unless the quick tier would save it too little
    (this small Net: under MIN_SECONDS_SAVED), its own options are quick already (this suite's compile-time-first
    flag) or it is compiled ahead (``compile_step`` promises a first call at steady speed,
    even with tiers forced). ``"auto"`` (the default) also leaves out steps whose quick
    program would compete with the optimised compilation for a CPU's few cores; with cores
    to spare the quick program serves each call until the optimised one is ready, which the
    first call after that runs."""
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")

    def tiered(ahead=False, mode=True):
        for name in os.listdir(tier_records):  # no program recorded as cached yet
            os.remove(tier_records / name)
        net = build(OPTIMIZERS["sgd_momentum"], True)
        with model.tiered_compilation(mode):
            if ahead:
                assert net.compile_step(*data(0)) is True
            net(*data(0))
        net.finish_compiling()
        return net.graph_stats()["tiered"]

    with _optimising():
        assert tiered() == 0
        assert tiered(ahead=True, mode="always") == 0
    monkeypatch.setattr(graph_tiers, "MIN_SECONDS_SAVED", -1.0)  # this Net counts as large now
    assert tiered() == 0  # compile-time-first: its options are the quick ones
    with _optimising():
        assert tiered() == 1
        assert tiered(ahead=True) == 0
        platform = jax.default_backend()
        for cores in (10 ** 6, 1):
            monkeypatch.setattr(xla_options, "QUICK_STEPS_MIN_CPU_CORES", cores)
            competing = not xla_options.quick_steps_while_compiling(platform)
            assert tiered(mode="auto") == (0 if competing else 1)
        # cores to spare: the quick program serves the calls made while the optimised one
        # compiles (held back here until the second call has run); a call after it is ready
        # runs it
        for name in os.listdir(tier_records):
            os.remove(tier_records / name)
        gate = threading.Event()
        compile_optimised = graph_tiers.Pending._compile

        def held_back(self, lowered, after):
            assert gate.wait(120), "the test never released the optimised compilation"
            return compile_optimised(self, lowered, after)

        monkeypatch.setattr(graph_tiers.Pending, "_compile", held_back)
        net = build(OPTIMIZERS["sgd_momentum"], True)
        with model.tiered_compilation("auto"):
            net(*data(0))
            prog = _program(net)
            quick, pending = prog.compiled, prog.pending
            assert pending is not None and not pending.wait and pending.started
            net(*data(1))
            assert not pending.ready() and prog.compiled is quick and prog.pending is pending
            gate.set()
            pending.future.result()
            net(*data(2))
        assert prog.compiled is not quick and prog.pending is None


def test_the_saving_of_a_quick_tier_is_estimated_from_the_program():
    """What decides whether tiers pay: the program's operations (nested ones counted) and the
    bytes they output; more operations save more compile time, more bytes cost the slower
    quick program more."""
    inner = jax.jit(lambda v: jax.numpy.tanh(v) * 2)
    jaxpr = jax.make_jaxpr(lambda v: inner(v @ v) + 1)(np.ones((8, 8), np.float32)).jaxpr
    assert graph_tiers.program_size(jaxpr) == (4, 4 * 8 * 8 * 4)  # dot, tanh, mul, add
    platform = jax.default_backend()
    saving = xla_options.quick_tier_saving
    assert saving(platform, 2000, 10 ** 6) >= saving(platform, 1000, 10 ** 6)
    assert saving(platform, 1000, 10 ** 10) <= saving(platform, 1000, 10 ** 6)


def test_the_tiers_switch(monkeypatch):
    monkeypatch.delenv(graph_tiers.ENV, raising=False)
    assert graph_tiers.tiers_mode() == "auto"
    for setting, mode in (("0", False), ("off", False), ("1", True), ("always", "always"),
                          ("auto", "auto")):
        monkeypatch.setenv(graph_tiers.ENV, setting)
        assert graph_tiers.tiers_mode() == mode
    monkeypatch.setenv(graph_tiers.ENV, "0")
    with model.tiered_compilation(True):
        assert graph_tiers.tiers_mode() is True
        with model.tiered_compilation("always"):
            assert graph_tiers.tiers_mode() == "always"
    assert graph_tiers.tiers_mode() is False
    with pytest.raises(ValueError, match="tiered_compilation"):
        model.tiered_compilation("sometimes")


def test_a_program_recorded_in_the_persistent_cache_is_not_compiled_in_tiers(
        monkeypatch, tier_records):
    """A step whose optimised program a run compiled (in the background, or in the
    foreground) is recorded next to the persistent cache: the same step in a later run loads
    it instead of compiling a quick one first. Without a persistent cache nothing is
    recorded and the step is compiled in tiers."""
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")
    monkeypatch.setattr(graph_tiers, "MIN_SECONDS_SAVED", -1.0)  # this small Net counts as large

    def tiered():
        net = build(OPTIMIZERS["sgd_momentum"], True)
        net(*data(0))
        net.finish_compiling()
        return net.graph_stats()["tiered"]

    with _optimising(), model.tiered_compilation(True):
        assert [tiered(), tiered()] == [1, 0]
        assert len(os.listdir(tier_records)) == 1
        monkeypatch.setattr(graph_tiers, "_records_folder", lambda: None)
        assert [tiered(), tiered()] == [1, 1]


def test_a_failed_optimised_compile_leaves_the_quick_program_serving(monkeypatch,
                                                                   tier_records):
    if _tiers_possible() is None:
        pytest.skip("this backend has no quick compile options")

    def fail(self, lowered, after):
        raise RuntimeError("no memory left for the optimised program")

    monkeypatch.setattr(graph_tiers.Pending, "_compile", fail)
    runs = []
    for mode in ("always", False):
        net = build(OPTIMIZERS["sgd_momentum"], True)
        with model.tiered_compilation(mode):
            losses = [float(net(*data(0))[1].array[0])]
            quick = _program(net).compiled
            if mode:
                with pytest.warns(RuntimeWarning, match="optimised compilation .* failed"):
                    net.finish_compiling()
                assert _program(net).compiled is quick and _program(net).pending is None
            losses += [float(net(*data(s))[1].array[0]) for s in (1, 2)]
        runs.append((losses, states(net)))
    np.testing.assert_allclose(runs[0][0], runs[1][0], **two_programs_tolerance(1e-5))
    assert_close(runs[0][1], runs[1][1], tol=1e-5)
