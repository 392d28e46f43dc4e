"""The binary snapshot format, byte by byte. (This tier imports
singa_jax._src.)"""
import numpy as np
import pytest
from singa_jax import snapshot, tensor
from singa_jax._src.swig import io as snapshot_io
from test_snapshot_data import _expected_record  # noqa: F401 (fixtures too)


def test_snapshot_roundtrip_and_read_forms(tmp_path):
    prefix = str(tmp_path / "model")
    rng = np.random.default_rng(0)
    values = {"conv/W": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
              "scalar": np.array(2.5, np.float32),
              "ids": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
              "empty": np.zeros((0, 4), np.float32)}
    with snapshot_io.Snapshot(prefix, snapshot_io.Snapshot.kWrite) as sn:
        for k, v in values.items():
            sn.Write(k.encode(), tensor.Tensor(data=v).data)  # SINGA passes bytes keys
    params = snapshot.Snapshot(prefix, False).read()
    assert list(params) == list(values)  # file order
    for k, v in values.items():
        assert isinstance(params[k], tensor.Tensor)
        assert params[k].dtype == v.dtype and params[k].shape == v.shape
        np.testing.assert_array_equal(tensor.to_numpy(params[k]), v)
    reader = snapshot_io.Snapshot(prefix, 0)
    assert reader.ReadShape()[0] == ("conv/W", (4, 3, 3, 3))
    with pytest.raises(RuntimeError, match="opened for reading"):
        reader.Write("x", np.zeros(2, np.float32))


def test_snapshot_errors(tmp_path):
    prefix = str(tmp_path / "p")
    with pytest.raises(FileNotFoundError, match="p.bin"):
        snapshot.Snapshot(prefix, False)
    sn = snapshot.Snapshot(prefix, True, buffer_size=1)
    with pytest.raises(TypeError, match="Tensor"):
        sn.write("x", np.zeros(3))
    with pytest.raises(TypeError, match="float32, int32 and float64"):
        sn.write("h", tensor.Tensor(data=np.zeros(3, np.float16)))
    with pytest.raises(ValueError, match="larger buffer_size"):
        sn.write("big", tensor.Tensor(data=np.zeros(300_000, np.float32)))
    sn.write("ok", tensor.Tensor(data=np.ones(2, np.float32)))
    with pytest.raises(ValueError, match="already written"):
        sn.write("ok", tensor.Tensor(data=np.ones(2, np.float32)))
    sn.close()
    assert list(snapshot.Snapshot(prefix, False).read()) == ["ok"]  # failed writes left nothing
    with pytest.raises(ValueError, match="mode"):
        snapshot_io.Snapshot(prefix, 3)
    (tmp_path / "bad.bin").write_bytes(b"xx\x01\x00")
    with pytest.raises(ValueError, match="not a SINGA snapshot"):
        snapshot.Snapshot(str(tmp_path / "bad"), False)
    (tmp_path / "cut.bin").write_bytes(_expected_record("k", b"\x08\x02")[:-1])
    with pytest.raises(ValueError, match="truncated"):
        snapshot.Snapshot(str(tmp_path / "cut"), False)
