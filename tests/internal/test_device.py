"""Device internals: the strict-devices switch and the one fallback warning. (This tier imports
singa_jax._src.)"""
import jax
import pytest
from singa_jax import device
from singa_jax._src.runtime import device as device_impl



@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the absence of accelerators")
@pytest.mark.parametrize("make, what", [
    (device.create_cuda_gpu, "create_cuda_gpu"), (lambda: device.create_cuda_gpus(2),
                                                     "create_cuda_gpus"),
    (lambda: device.create_cuda_gpu_on(1), "create_cuda_gpu_on"),
    (lambda: device.create_cuda_gpus_on([0, 1]), "create_cuda_gpus_on"),
    (device.create_tpu_device, "create_tpu_device"),
    (lambda: device.create_tpu_devices(2), "create_tpu_devices"),
    (lambda: device.create_cpu_devices(64), "create_cpu_devices"),
    (lambda: device.create_device("tpu", 3), "create_device"),
    (lambda: device.get_gpu_mem_size(0), "get_gpu_mem_size"),
    (lambda: device.device_query(0), "device_query"),
    (device.create_opencl_device, "create_opencl_device")])
def test_missing_devices_raise_listing_what_is_available(make, what, monkeypatch):
    monkeypatch.setattr(device_impl, "_strict", [True])  # set_strict_devices(True), undone after
    with pytest.raises(ValueError, match=rf"{what}.*available devices: cpu:0"):
        make()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the absence of accelerators")
def test_gpu_requests_fall_back_to_the_host_with_one_warning(monkeypatch):
    monkeypatch.setattr(device_impl, "_strict", [None])
    monkeypatch.setattr(device_impl, "_fallback_warned", [False])
    monkeypatch.delenv(device_impl.STRICT_ENV, raising=False)
    monkeypatch.delenv(device_impl.FALLBACK_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="no GPU or TPU.*set_strict_devices"):
        gpu = device.create_cuda_gpu()
    assert gpu is device.create_cpu_device() is device.get_default_device()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning is given once
        assert device.create_cuda_gpu_on(0) is gpu
        assert device.create_cuda_gpu_on(7) is device.get_default_device()  # no such host device
        assert device.create_cuda_gpus(1) == [gpu]
    monkeypatch.setenv(device_impl.STRICT_ENV, "1")
    with pytest.raises(ValueError, match="create_cuda_gpu_on: asked for accelerator"):
        device.create_cuda_gpu_on(0)
    monkeypatch.setenv(device_impl.FALLBACK_ENV, "1")  # singa_jax.run's switch wins: fall back
    assert device.create_cuda_gpu_on(0) is gpu
    device.set_strict_devices(True)  # the explicit switch wins over both variables
    with pytest.raises(ValueError, match="create_cuda_gpus"):
        device.create_cuda_gpus(1)
