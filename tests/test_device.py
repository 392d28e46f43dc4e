"""singa_jax.device: SINGA's device functions and Device methods on jax.devices()."""
import textwrap

import jax
import numpy as np
import pytest

from singa_jax import device, tensor


def test_default_device_is_first_jax_device():
    dev = device.get_default_device()
    assert isinstance(dev, device.Device) and dev.jax_device == jax.local_devices()[0]
    assert device.default_device is dev  # SINGA's module attribute
    assert device.get_default_device() is dev  # one Device (and one key) per jax.Device


def test_set_default_device():
    old = device.get_default_device()
    cpu = device.create_cpu_device()
    try:
        device.set_default_device(cpu)
        assert device.default_device is cpu and tensor.Tensor((2,)).device is cpu
    finally:
        device.set_default_device(old)
    with pytest.raises(TypeError, match="set_default_device"):
        device.set_default_device("cpu")


def test_cpu_device_and_any_backend():
    cpu = device.create_cpu_device()
    assert cpu.platform == "cpu" and cpu.lang() == "cpu" and cpu.id() == -1  # SINGA's host id
    assert cpu.host() is cpu and repr(cpu) == "Device(cpu:0)"
    assert device.create_device("cpu") is cpu and device.create_cpu_devices(1) == [cpu]
    assert device.create_device().jax_device == jax.devices()[0]
    assert cpu in device.all_devices()


def test_two_threads_never_draw_the_same_key():
    import threading
    dev = device.get_default_device()
    dev.SetRandSeed(3)
    drawn = [[], []]

    def draw(out):
        for _ in range(200):
            out.append(np.asarray(jax.random.key_data(dev.next_key())).tobytes())

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    keys = drawn[0] + drawn[1]
    assert len(keys) == 400 and len(set(keys)) == 400


def test_a_traced_key_is_never_seen_by_another_thread():
    import threading
    dev = device.get_default_device()
    seen = []
    inside, release = threading.Event(), threading.Event()

    def other():
        inside.wait(10)
        seen.append(dev.key)
        seen.append(dev.next_key())
        release.set()

    def traced(k):
        dev.key = k  # what graph mode does while tracing a step
        inside.set()
        release.wait(10)
        sub = dev.next_key()
        assert isinstance(dev.key, jax.core.Tracer)
        return sub

    before = dev.key
    thread = threading.Thread(target=other)
    thread.start()
    jax.jit(traced).trace(before)
    thread.join()
    dev.key = before  # the trace's end restores its starting key ...
    assert not any(isinstance(k, jax.core.Tracer) for k in seen)
    # ... but does not rewind what the other thread drew meanwhile
    assert dev.key is not before


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="counts accelerators on a CPU host")
def test_counts_without_accelerators():
    assert device.get_num_gpus() == 0 and device.get_gpu_ids() == []
    assert device.get_num_opencl_platforms() == 0 and device.get_num_opencl_devices() == 0
    assert device.enable_lazy_alloc(True) is None


def test_gpu_queries_when_gpus_exist():
    n = device.get_num_gpus()
    assert device.get_gpu_ids() == list(range(n))
    if n == 0:
        pytest.skip("no GPU")
    free, total = device.get_gpu_mem_size(0)
    assert 0 <= free <= total and isinstance(device.device_query(0), str)
    assert device.create_cuda_gpu().platform == "gpu"


def test_device_methods_singa_programs_call(capsys):
    dev = device.get_default_device()
    assert dev.graph_enabled() is False
    dev.EnableGraph(True)
    assert dev.graph_enabled() is True
    dev.EnableGraph(False)
    assert dev.graph_enabled() is False
    t = tensor.Tensor((3,), dev).gaussian(0.0, 1.0) * 2
    dev.Sync()  # waits; the result is ready afterwards
    assert t.array.is_ready()
    dev.SetVerbosity(2)
    dev.SetSkipIteration(3)
    dev.PrintTimeProfiling()
    assert "profil" in capsys.readouterr().out
    dev.ResetGraph()
    dev.RunGraph(serial=True)
    dev.Reset()
    assert np.std(tensor.to_numpy(t)) > 0


def test_keys_split_and_seed():
    dev = device.get_default_device()
    dev.SetRandSeed(7)
    k1 = dev.next_key()
    k2 = dev.next_key()
    assert not np.array_equal(jax.random.key_data(k1), jax.random.key_data(k2))
    dev.SetRandSeed(7)
    np.testing.assert_array_equal(jax.random.key_data(dev.next_key()), jax.random.key_data(k1))
    assert list(dev.key.devices()) == [dev.jax_device]  # the key lives on its device


def test_put_moves_arrays_and_passes_tracers():
    dev = device.create_cpu_device()
    arr = dev.put(np.ones(3, np.float32))
    assert arr.devices() == {dev.jax_device}
    assert jax.jit(lambda x: dev.put(x) * 2)(arr).shape == (3,)


TWO_DEVICES = textwrap.dedent("""
    import numpy as np
    from singa_jax import device, tensor

    d0, d1 = device.create_cpu_devices(2)
    assert (d0.id(), d1.id()) == (-1, -1) and d0.jax_device.id != d1.jax_device.id
    a = np.arange(6, dtype=np.float32).reshape(2, 3)

    # to_device moves the data between devices
    t = tensor.from_numpy(a, d0)
    assert t.device is d0 and t.array.devices() == {d0.jax_device}
    t.to_device(d1)
    assert t.device is d1 and t.array.devices() == {d1.jax_device}
    np.testing.assert_array_equal(tensor.to_numpy(t), a)
    y = t * 2 + 1  # results stay on the operands' device
    assert y.device is d1 and y.array.devices() == {d1.jax_device}
    assert tensor.Tensor((2,), d1).gaussian(0, 1).array.devices() == {d1.jax_device}

    # a binary op across devices is a clear error and changes nothing
    u = tensor.from_numpy(a, d0)
    for op in (lambda: t + u, lambda: tensor.mult(t, u.T()), lambda: t.__iadd__(u),
               lambda: tensor.concatenate([t, u], 0), lambda: tensor.einsum("ij,ij->i", t, u)):
        try:
            op()
        except ValueError as e:
            msg = str(e)
            assert "different devices" in msg and "cpu:0" in msg and "cpu:1" in msg, msg
        else:
            raise AssertionError("cross-device op did not raise")
    np.testing.assert_array_equal(tensor.to_numpy(t), a)

    # copies may cross devices and land on the destination's device
    dst = tensor.Tensor((2, 3), d0)
    dst.copy_data(t)
    assert dst.array.devices() == {d0.jax_device}
    np.testing.assert_array_equal(tensor.to_numpy(dst), a)
    tensor.copy_data_to_from(dst, tensor.from_numpy(np.full(2, 9, np.float32), d1), 2, 1, 0)
    assert dst.array.devices() == {d0.jax_device}
    assert tensor.to_numpy(dst).reshape(-1)[1:3].tolist() == [9, 9]
    assert tensor.to_host(t).device is d0

    # every device has its own key: distinct streams by default, equal after equal seeds
    draw = lambda d: tensor.to_numpy(tensor.Tensor((4,), d).uniform(0, 1))
    assert not np.array_equal(draw(d0), draw(d1))
    d0.SetRandSeed(5); d1.SetRandSeed(5)
    np.testing.assert_array_equal(draw(d0), draw(d1))
    d0.Sync(); d1.Sync()
    print("OK")
""")


def test_two_host_devices_in_a_subprocess(run_on_two_host_devices):
    run_on_two_host_devices(TWO_DEVICES)
