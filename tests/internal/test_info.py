"""``python -m singa_jax.info`` internals: its rows and version lookups. (This tier imports
singa_jax._src.)"""
from importlib import metadata
import jax
from singa_jax import info
from test_info import _value  # noqa: F401 (fixtures too)


def test_missing_optional_package_shows_not_installed(monkeypatch):
    real = metadata.version

    def version(name):
        if name == "torch":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(info.metadata, "version", version)
    text = info.report()
    assert _value(text, "torch") == "not installed"
    assert _value(text, "jax") == jax.__version__  # the others still looked up
    # a GPU build of onnxruntime is a distribution of its own name: either is found
    monkeypatch.setattr(info.metadata, "version", lambda name: (
        "1.2.3" if name == "onnxruntime-gpu" else (_ for _ in ()).throw(
            metadata.PackageNotFoundError(name))))
    assert info._version(*info.OPTIONAL_PACKAGES["onnxruntime"]) == "1.2.3"
    assert info._version("torch") == "not installed"


def test_memory_line_where_the_backend_reports_it():
    class Device:  # a GPU's allocator statistics, as jax.Device.memory_stats() gives them
        platform, id, device_kind, process_index = "gpu", 0, "NVIDIA H100 80GB HBM3", 0
        compute_capability = "9.0"

        def memory_stats(self):
            return {"bytes_limit": 80 * 1024 ** 3, "bytes_in_use": 1024 ** 3 // 2}

    name, value = info._device_row(Device())
    assert name == "gpu:0"
    assert value == ("kind NVIDIA H100 80GB HBM3, compute capability 9.0, "
                     "0.50 GiB in use of 80.00 GiB")

    class Failing(Device):
        def memory_stats(self):
            raise NotImplementedError("no statistics")

    assert info._device_row(Failing())[1].endswith("error: NotImplementedError: no statistics")
