"""The backend switches and speed paths white-box: compile options, the cache, convolution forms,
GC. (This tier imports singa_jax._src.)"""
import os
import platform
import subprocess
import sys
from functools import partial
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from singa_jax import autograd, device, layer, opt, tensor
from singa_jax._src.backend import compilation_cache
from singa_jax._src.backend import xla_options
from singa_jax._src.ops import nn as autograd_nn
from test_performance_paths import (  # noqa: F401 (shared helpers and fixtures)
    Net, SHAPE, _Classifier, _training, build, data, reduce_window_max)


# What XLA:CPU is given (its compile options, host-made fills, glibc's malloc thresholds, the
# CPU's convolution forms) is checked where the CPU is the default backend; elsewhere GPU and
# TPU take the general path, which tests/internal/test_lowering.py lowers for them.
on_cpu_backend = pytest.mark.skipif(jax.default_backend() != "cpu",
                                    reason="checks what singa_jax does for XLA:CPU")


@pytest.mark.parametrize("shape,kernel", [((2, 3, 8, 8), (2, 2)), ((2, 3, 9, 7), (2, 2)),
                                          ((1, 2, 6, 6), (3, 3)), ((2, 2, 6, 8), (2, 4))])
def test_tiled_max_pool_equals_reduce_window_with_ties(shape, kernel):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 3, shape).astype(np.float32))  # most windows have ties
    out_shape = (shape[0], shape[1], shape[2] // kernel[0], shape[3] // kernel[1])
    dy = jnp.asarray(rng.standard_normal(out_shape).astype(np.float32))
    y_ref, pull_ref = jax.vjp(lambda a: reduce_window_max(a, kernel), x)
    y, pull = jax.vjp(lambda a: autograd_nn._max_pool_tiles(a, kernel), x)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(pull(dy)[0], pull_ref(dy)[0])  # the first maximum wins
    assert float(jnp.sum(pull(dy)[0] != 0)) <= dy.size  # one element per window


def test_overlapping_pooling_keeps_the_general_lowering():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((1, 2, 7, 7)).astype(np.float32))
    y = autograd_nn._pooling2d_kernel(x, kernel=(3, 3), stride=(2, 2), padding=(1, 1),
                                      is_max=True, odd_padding=(0, 0, 0, 0))
    ref = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                            ((0, 0), (0, 0), (1, 1), (1, 1)))
    np.testing.assert_array_equal(y, ref)


# --- compile options -------------------------------------------------------------------------
@pytest.fixture
def optimizing_compiles():
    """The options chosen when compile time does not come first (the suite's conftest turns
    jax_disable_most_optimizations on)."""
    saved = xla_options.compile_time_first()
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", saved)


def test_compile_time_first_compiles_every_cpu_program_as_a_one_off(optimizing_compiles):
    """Under jax_disable_most_optimizations every CPU program, eager kernel or step, gets the
    one-off options and no library fusions; the flag is read at each choice."""
    name = "xla_cpu_experimental_ynn_fusion_type"
    if not xla_options.supported("cpu", name, ""):
        pytest.skip("this jaxlib does not know the YNNPACK fusion type option")
    assert not xla_options.compile_time_first()
    assert not set(xla_options.ONE_OFF_OPTIONS) & set(xla_options.compile_options("cpu"))
    jax.config.update("jax_disable_most_optimizations", True)
    assert xla_options.compile_time_first()
    for kind in ({}, {"eager": True}, {"one_off": True}):
        options = xla_options.compile_options("cpu", **kind)
        assert options[name] == "" and set(xla_options.ONE_OFF_OPTIONS) <= set(options)
    assert name not in xla_options.compile_options("gpu")
    f = jax.jit(lambda v: v @ v.T + 1)
    x = jnp.arange(6.0).reshape(2, 3)
    compiled = f.lower(x).compile(xla_options.compile_options("cpu", eager=True))
    np.testing.assert_allclose(np.asarray(compiled(x)), np.asarray(x) @ np.asarray(x).T + 1)


def test_compile_options_are_cpu_only(optimizing_compiles):
    assert xla_options.compile_options("cpu") == {"xla_cpu_experimental_ynn_fusion_type": ""}
    if any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover (GPU machines)
        assert "xla_cpu_experimental_ynn_fusion_type" not in xla_options.compile_options("gpu")
    one_off = xla_options.compile_options("cpu", one_off=True)
    assert set(xla_options.ONE_OFF_OPTIONS) <= set(one_off)


def test_eager_kernels_take_ynnpack_for_single_dots_only(optimizing_compiles):
    """An eager kernel is one op: YNNPACK's dot (faster on the MLP's products), never its
    convolution fusions; a jaxlib without that fusion type gets none at all."""
    name = "xla_cpu_experimental_ynn_fusion_type"
    dot = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
    expected = dot if xla_options.supported("cpu", name, dot) else ""
    assert xla_options.compile_options("cpu", eager=True) == {name: expected}
    if any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover (GPU machines)
        assert name not in xla_options.compile_options("gpu", eager=True)


def test_an_option_the_compiler_does_not_know_is_left_out(monkeypatch, optimizing_compiles):
    monkeypatch.setitem(xla_options.CPU_OPTIONS, "xla_cpu_no_such_option_for_tests", ("",))
    assert xla_options.supported("cpu", "xla_cpu_experimental_ynn_fusion_type", "")
    assert not xla_options.supported("cpu", "xla_cpu_no_such_option_for_tests", "")
    assert "xla_cpu_no_such_option_for_tests" not in xla_options.compile_options("cpu")


def test_an_option_takes_its_first_accepted_value(monkeypatch, optimizing_compiles):
    """A value this jaxlib refuses (a fusion type it does not know) falls back to the next."""
    name = "xla_cpu_experimental_ynn_fusion_type"
    monkeypatch.setitem(xla_options.CPU_OPTIONS, name, ("LIBRARY_FUSION_TYPE_NO_SUCH", ""))
    assert not xla_options.supported("cpu", name, "LIBRARY_FUSION_TYPE_NO_SUCH")
    assert xla_options.compile_options("cpu")[name] == ""


@on_cpu_backend
@pytest.mark.parametrize("group", [1, 8])
def test_a_step_without_depthwise_convolutions_takes_the_step_options(group):
    """The step options (YNNPACK for dots and reductions) for a program whose lowered module
    holds no depthwise convolution; with one (forward and gradient) YNNPACK stays off. Graph
    mode's losses equal eager's either way."""
    name = "xla_cpu_experimental_ynn_fusion_type"
    (values, _), = [v for k, v in xla_options.CPU_STEP_OPTIONS.items() if k == name]
    if not xla_options.supported("cpu", name, values[0]):
        pytest.skip("this jaxlib does not know the step options' YNNPACK fusion types")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=(4,)).astype(np.int32)
    losses = []
    for use_graph in (True, False):
        device.get_default_device().SetRandSeed(0)
        net = _ConvNet(group)
        net.set_optimizer(opt.SGD(lr=0.05))
        net.compile([tensor.from_numpy(x)], is_train=True, use_graph=use_graph)
        losses.append([float(np.asarray(net(tensor.from_numpy(x), tensor.from_numpy(y))[1]
                                        .array).reshape(())) for _ in range(3)])
        if use_graph:
            used = net._graph_runner.last_compile_options[name]
            # (under compile-time-first, as in this suite, every program has YNNPACK off: the
            # choice is made without running a program, so no flag is flipped to test it)
            chosen = xla_options.compile_options("cpu", program=jax.jit(
                lambda v: v).lower(jnp.ones(2)))[name]
            assert chosen == ("" if xla_options.compile_time_first() else values[0])
            assert used == ("" if group == 8 else chosen)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert losses[0][-1] < losses[0][0]


@on_cpu_backend
def test_called_functions_name_the_depthwise_convolution_and_its_gradient():
    from singa_jax._src.backend import conv as conv_cpu

    def loss(x, w):
        return conv_cpu.conv(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1), 4).sum()

    x, w = jnp.ones((2, 4, 6, 6)), jnp.ones((4, 1, 3, 3))
    names = xla_options.called_functions(jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w))
    assert sum(xla_options.DEPTHWISE_CONVOLUTION in n for n in names) >= 2  # forward, gradient
    plain = xla_options.called_functions(jax.jit(lambda x: x * 2).lower(x))
    assert plain is not None and not any(xla_options.DEPTHWISE_CONVOLUTION in n for n in plain)
    assert xla_options.called_functions(object()) is None  # unreadable: the base options


@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16, np.bool_])
def test_fills_equal_jnp_full_on_their_device_and_are_device_ops_inside_traces(dtype):
    """``Tensor(shape)``, ``zeros``/``ones`` and ``set_value`` fill on the host on CPU (no program
    per shape): the same values, dtype and device as ``jnp.full``; inside a trace the fill stays
    a device op (a broadcast, not a constant the size of the array)."""
    from singa_jax._src.tensor.tensor import filled
    devices = device.create_cpu_devices(2) if len(jax.devices()) >= 2 else \
        [device.get_default_device()]
    for d in devices:
        for value in (0, 1):
            a = filled((3, 4), value, dtype, d)
            assert a.dtype == jnp.dtype(dtype) and a.devices() == {d.jax_device}
            np.testing.assert_array_equal(np.asarray(a), np.asarray(jnp.full((3, 4), value,
                                                                             dtype)))
    text = jax.jit(lambda: filled((64, 64), 1, dtype, devices[-1])).lower().as_text()
    assert "broadcast_in_dim" in text


def test_fills_inside_compile_time_eval_are_concrete_and_the_mode_is_scoped():
    """Inside ``modes.compile_time_eval`` (compile()'s initialisation) a fill under a trace is a
    concrete array made on the host, like one outside any trace; the mode belongs to the block
    (restored when it raises) and to its thread."""
    import threading
    from singa_jax._src.base import modes
    from singa_jax._src.tensor.tensor import filled
    seen = {}

    def traced(x):
        with modes.compile_time_eval():
            seen["inside"] = filled((2, 3), 1.5, np.float32, device.get_default_device())
            worker = threading.Thread(
                target=lambda: seen.update(other=modes.in_compile_time_eval()))
            worker.start()
            worker.join()
        seen["after"] = modes.in_compile_time_eval()
        return x

    jax.eval_shape(traced, 1.0)
    assert not isinstance(seen["inside"], jax.core.Tracer)
    np.testing.assert_array_equal(np.asarray(seen["inside"]), np.full((2, 3), 1.5, np.float32))
    assert seen["other"] is False and seen["after"] is False
    with pytest.raises(ZeroDivisionError):
        with modes.compile_time_eval():
            1 / 0
    assert not modes.in_compile_time_eval()


def test_eager_kernels_take_the_backend_options_outside_traces_only(monkeypatch):
    """xla_options.kernel: jax.jit with the default backend's kernel options at the first
    top-level call; inside a trace (where jax.jit refuses options) the plain jit, same numbers."""
    options = xla_options.compile_options(jax.default_backend(), eager=True) or None  # probed
    made = []
    real_jit = jax.jit

    def recording_jit(fun, **kwargs):
        made.append(kwargs.get("compiler_options"))
        return real_jit(fun, **kwargs)

    monkeypatch.setattr(xla_options.jax, "jit", recording_jit)

    @xla_options.kernel(static_argnums=1)
    def scaled_matmul(x, scale):
        return scale * (x @ x.T)

    assert made == [None]  # the plain jit only: no backend options resolved at decoration
    x = jnp.arange(6.0).reshape(2, 3)
    expected = 2.0 * (np.arange(6.0).reshape(2, 3) @ np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_allclose(scaled_matmul(x, 2.0), expected)
    assert made == [None, options]
    np.testing.assert_allclose(real_jit(lambda x: scaled_matmul(x, 2.0))(x), expected)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(scaled_matmul(x, 2.0)))(x),
                               2.0 * 2.0 * np.tile(np.arange(6.0).reshape(2, 3).sum(0), (2, 1)))
    assert len(made) == 2  # both made once


class _ConvNet(_Classifier):
    """conv -> (grouped) conv -> linear; ``group=8`` makes the second one depthwise."""

    def __init__(self, group: int):
        super().__init__()
        self.conv1 = layer.Conv2d(8, 3, padding=1)
        self.conv2 = layer.Conv2d(8, 3, padding=1, group=group)
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(10)

    def forward(self, x):
        return self.fc(self.flatten(self.conv2(self.conv1(x))))


@on_cpu_backend
def test_compile_lowers_no_program_for_new_parameter_shapes():
    """A program per parameter shape (jnp.full, the cut of a random draw) cost ResNet-50's
    compile() 1.3 of its 3.1 s: on CPU the initialisation fills and cuts on the host, so a model
    of new shapes initialises with programs already made -- and the same values as the device
    path (the chunks concatenated and cut by jnp)."""
    from singa_jax._src.runtime import sampling
    lowered = []
    watching = [False]

    def listen(event, _duration, **_kwargs):
        if watching[0] and event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    device.get_default_device().SetRandSeed(3)
    # the programs every initialisation shares (key splits, the chunk draw, its fold_in); on an
    # 18x18 input (9x9 after pooling) with 11 or 13 channels fc's weight takes two random chunks
    Net(11, 80).compile([tensor.Tensor((2, 3, 18, 18))], is_train=True, use_graph=True)
    net = Net(13, 80)
    watching[0] = True
    try:
        net.compile([tensor.Tensor((2, 3, 18, 18))], is_train=True, use_graph=True)
        assert lowered == []
        jax.jit(lambda v: v * 3.0 + 1.0)(jnp.ones(5))  # a new program: the listener sees it
        assert lowered, "the monitoring listener saw no lowering: it cannot tell none happened"
    finally:
        watching[0] = False
    shape = (13 * 81, 80)
    assert net.fc.W.shape == shape and np.prod(shape) > sampling._DRAW_CHUNK
    key = device.get_default_device().key
    host = sampling.draw("gaussian", key, (0.5, 2.0), shape, np.float32)
    chunks = [sampling._draw_flat(jax.random.fold_in(key, i), (0.5, 2.0), kind="gaussian",
                                  count=sampling._DRAW_CHUNK, dtype=np.float32) for i in (0, 1)]
    on_device = jnp.concatenate(chunks)[:np.prod(shape)].reshape(shape)
    np.testing.assert_array_equal(np.asarray(host), np.asarray(on_device))
    assert host.devices() == on_device.devices()


def test_eager_computes_no_gradient_for_the_input_batch():
    net = build(False)
    x, y = data(0)
    with _training(True):
        out = net.forward(x)
    op = out.creator
    while op.src and not isinstance(op.src[0][0], autograd.Dummy):
        op = op.src[0][0]  # walk back to the first convolution
    assert type(op).__name__ == "_Conv2d"
    assert op._diff == (False, True, True)  # x: no gradient; W and b: yes


# --- persistent compilation cache ----------------------------------------------------------
def test_cache_folder_setting(monkeypatch, tmp_path):
    monkeypatch.delenv(compilation_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert compilation_cache.folder() == str(tmp_path / "singa_jax" / "xla")
        monkeypatch.setenv(compilation_cache.ENV, "0")
        assert compilation_cache.folder() is None
        monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "mine"))
        assert compilation_cache.folder() == str(tmp_path / "mine")
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "chosen"))
        assert compilation_cache.folder() is None  # JAX's own choice is kept
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


def test_import_sets_the_cache_without_starting_a_backend(tmp_path):
    code = ("import jax, singa_jax; from jax._src import xla_bridge as xb; "
            "print(jax.config.jax_compilation_cache_dir, bool(xb._backends))")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env[compilation_cache.ENV] = str(tmp_path / "xla")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(tmp_path / "xla"), "False"]
    env[compilation_cache.ENV] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["None", "False"]


def test_the_cache_singa_jax_chooses_keeps_every_program(tmp_path):
    """compile()'s per-shape parameter draws compile in ~20 ms: below JAX's default threshold
    (1 s) they would be compiled again on every run."""
    code = "import jax, singa_jax; print(jax.config.jax_persistent_cache_min_compile_time_secs)"
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    env[compilation_cache.ENV] = str(tmp_path / "xla")
    run = partial(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True,
                  check=True)
    assert float(run(env=env).stdout.split()[-1]) == 0.0
    assert float(run(env={**env, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}
                     ).stdout.split()[-1]) == 2.0  # the user's setting rules
    assert float(run(env={**env, compilation_cache.ENV: "0"}).stdout.split()[-1]) \
        == 1.0  # cache off: JAX's default untouched


# --- host memory (glibc malloc thresholds) ----------------------------------------------------
_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


# An eager training loop on a 784x1024 layer: prints the page faults per step
# after a warm-up and whether singa_jax pinned the thresholds. The first op's kernel is compiled
# for the CPU, which is when singa_jax pins them. Forward and walk go op by op: a fresh buffer
# for each kernel's result (a fused walk makes fewer: 147 faults per step without the pinned
# thresholds, 76 with them, measured; eager replay's one forward program changes the count too).
_FAULTS_PER_STEP = """
import resource
import numpy as np
from singa_jax import autograd, opt, tensor
from singa_jax._src.backend import host_memory
autograd.training = True
rng = np.random.default_rng(0)
x = tensor.from_numpy(rng.standard_normal((64, 784)).astype(np.float32))
w = tensor.from_numpy(rng.standard_normal((784, 1024)).astype(np.float32) * 0.01)
w.requires_grad = w.stores_grad = True
sgd = opt.SGD(lr=0.01, momentum=0.9)
def step():
    with autograd.fused_backward(False), autograd.eager_replay(False):
        sgd(autograd.reduce_mean(autograd.relu(autograd.matmul(x, w))))
    w.array.block_until_ready()
for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40, host_memory.tune())
"""


def _faults_per_step(**env_changes: str):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SINGA_JAX_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_",
                        "MALLOC_TRIM_THRESHOLD_")}
    env.update(env_changes)
    out = subprocess.run([sys.executable, "-c", _FAULTS_PER_STEP], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return float(out[-2]), out[-1] == "True"


@on_cpu_backend
@pytest.mark.skipif(not _GLIBC, reason="the malloc thresholds are glibc's")
def test_pinned_malloc_thresholds_stop_the_page_faults_of_fresh_buffers():
    """Without the pinned thresholds the fresh buffers of an eager step (the layer's gradient,
    new weights and momentum, 3 MB = 768 pages each) are mmap-ed or trimmed and faulted in page
    by page: measured 118-860 faults per step, depending on where glibc's dynamic thresholds
    settle in the run. With them pinned: 0-119, and at most 76 in the fewer of two runs."""
    # the fewer of two runs: other faults (XLA's threads, the interpreter) only add to a count
    (tuned, pinned), (again, _) = _faults_per_step(), _faults_per_step()
    tuned = min(tuned, again)
    untuned, not_pinned = _faults_per_step(SINGA_JAX_MALLOC_TUNING="0")
    assert pinned and not not_pinned
    assert tuned < 768 / 4, (tuned, untuned)  # not even a quarter of one buffer faulted in
    if untuned >= 400:  # glibc's own thresholds faulted buffers in this run: pinned is fewer
        assert tuned < untuned / 4, (tuned, untuned)


@on_cpu_backend
@pytest.mark.skipif(not _GLIBC, reason="the malloc thresholds are glibc's")
def test_malloc_settings_of_the_user_stand():
    _, pinned = _faults_per_step(MALLOC_TRIM_THRESHOLD_="1000000")
    assert not pinned
