"""Checkpoints in SINGA's format: round trips, SINGA-written files, atomic writes, rejection of
missing, corrupt and mismatching files with nothing changed."""
import io
import json
import os
import zipfile

import numpy as np
import pytest

from singa_jax import device, layer, model, opt, tensor


class ConvNet(model.Model):
    """Parameters and batch-norm buffers (state type 0 covers both)."""

    def __init__(self, channels=3):
        super().__init__()
        self.conv = layer.Conv2d(channels, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.flatten = layer.Flatten()
        self.fc = layer.Linear(2)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.flatten(self.bn(self.conv(x))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


IN = (2, 1, 4, 4)


def make(seed=0, channels=3, use_graph=False):
    device.get_default_device().SetRandSeed(seed)
    m = ConvNet(channels)
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    m.compile([tensor.Tensor(IN)], is_train=True, use_graph=use_graph)
    return m


def batch():
    rng = np.random.default_rng(5)
    return (tensor.from_numpy(rng.standard_normal(IN).astype(np.float32)),
            tensor.from_numpy(np.array([0, 1], np.int32)))


def values(m):
    return {k: tensor.to_numpy(v).copy() for k, v in m.get_states().items()}


def assert_values(m, expected):
    got = values(m)
    assert got.keys() == expected.keys()
    for k in got:
        np.testing.assert_array_equal(got[k], expected[k], err_msg=k)


@pytest.fixture
def trained():
    m = make()
    x, y = batch()
    for _ in range(2):
        m(x, y)
    return m


def test_round_trip_with_aux_and_optimizer_states(tmp_path, trained):
    path = str(tmp_path / "ckpt")
    saved = values(trained)
    opt_states = {k: tensor.to_numpy(v).copy() for k, v in trained.optimizer.get_states().items()}
    assert any(k.startswith("moments") for k in opt_states)
    aux = dict(trained.optimizer.get_states())
    aux["epoch"] = tensor.from_numpy(np.array([7], np.int32))
    aux["best_acc"] = 0.875  # numbers and arrays are accepted as well as Tensors
    trained.save_states(path, aux_states=aux)

    fresh = make(seed=1)
    assert any(not np.array_equal(v, values(fresh)[k]) for k, v in saved.items())
    loaded_aux = fresh.load_states(path)
    assert_values(fresh, saved)
    assert tensor.to_numpy(loaded_aux["epoch"]).tolist() == [7]
    assert tensor.to_numpy(loaded_aux["best_acc"]).item() == pytest.approx(0.875)
    fresh.optimizer.set_states({k: v for k, v in loaded_aux.items() if k in opt_states})
    for k, v in fresh.optimizer.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), opt_states[k], err_msg=k)
    # both continue identically after the restore
    x, y = batch()
    _, l1 = trained(x, y)
    _, l2 = fresh(x, y)
    np.testing.assert_allclose(tensor.to_numpy(l1), tensor.to_numpy(l2), rtol=1e-6)


def test_layout_is_singas(tmp_path, trained):
    path = str(tmp_path / "ckpt.zip")
    trained.save_states(path, aux_states={"epoch": tensor.from_numpy(np.array([3], np.int32))})
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == ["states_attr.json", "tensor_dict.npz"]
        attrs = json.loads(zf.read("states_attr.json"))
        npz = np.load(io.BytesIO(zf.read("tensor_dict.npz")))
        assert set(npz.files) == set(attrs)
    states = trained.get_states()
    for name, t in states.items():
        assert attrs[name] == {"state_type": 0, "shape": list(t.shape), "dtype": 0}
        np.testing.assert_array_equal(npz[name], tensor.to_numpy(t))
    assert attrs["epoch"] == {"state_type": 1, "shape": [1], "dtype": 2}  # SINGA's kInt
    assert {"conv.W", "bn.running_mean", "bn.running_var", "fc.W"} <= set(states)


def singa_written_zip(path, arrays, aux):
    """A checkpoint written the way SINGA 5.1's Model.save_states writes it: npz and json files
    in a folder, zipped with their base names, deflated."""
    folder = os.path.join(os.path.dirname(path), "singa_tmp")
    os.mkdir(folder)
    attrs = {}
    for k, v in arrays.items():
        attrs[k] = {"state_type": 0, "shape": list(v.shape), "dtype": 0}
    for k, v in aux.items():
        attrs[k] = {"state_type": 1, "shape": list(v.shape), "dtype": 0}
    np.savez(os.path.join(folder, "tensor_dict.npz"), **arrays, **aux)
    with open(os.path.join(folder, "states_attr.json"), "w") as f:
        json.dump(attrs, f)
    with zipfile.ZipFile(path, mode="w") as zf:
        for member in ("tensor_dict.npz", "states_attr.json"):
            zf.write(os.path.join(folder, member), member, compress_type=zipfile.ZIP_DEFLATED)


def test_loads_a_checkpoint_written_by_singa(tmp_path):
    m = make()
    rng = np.random.default_rng(3)
    arrays = {k: rng.standard_normal(v.shape).astype(np.float32)
              for k, v in m.get_states().items()}
    path = str(tmp_path / "from_singa")
    singa_written_zip(path, arrays, {"lr": np.array([0.01], np.float32)})
    aux = m.load_states(path)
    for k, v in m.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), arrays[k])
    np.testing.assert_allclose(tensor.to_numpy(aux["lr"]), [0.01])


def test_existing_file_needs_overwrite(tmp_path, trained):
    path = str(tmp_path / "ckpt")
    trained.save_states(path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        trained.save_states(path)
    x, y = batch()
    trained(x, y)
    trained.save_states(path, overwrite=True)
    fresh = make(seed=4)
    fresh.load_states(path)
    assert_values(fresh, values(trained))


def test_interrupted_save_keeps_previous_file_and_leaves_no_temp(tmp_path, trained, monkeypatch):
    path = str(tmp_path / "ckpt")
    trained.save_states(path)
    with open(path, "rb") as f:
        original = f.read()
    calls = []
    real_write_array = np.lib.format.write_array

    def failing_write_array(fp, array, *a, **k):
        calls.append(array.shape)
        if len(calls) == 2:  # one array is already in the archive: fail half-way
            raise OSError("disk full (simulated)")
        return real_write_array(fp, array, *a, **k)

    monkeypatch.setattr(np.lib.format, "write_array", failing_write_array)
    with pytest.raises(OSError, match="simulated"):
        trained.save_states(path, overwrite=True)
    monkeypatch.undo()
    assert len(calls) == 2
    with open(path, "rb") as f:
        assert f.read() == original
    assert os.listdir(tmp_path) == ["ckpt"]

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(np.lib.format, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trained.save_states(str(tmp_path / "other"))
    assert os.listdir(tmp_path) == ["ckpt"]


def corrupt_files(tmp_path, good):
    """(name, path, expected message) for damaged variants of the good checkpoint ``good``."""
    with open(good, "rb") as f:
        data = f.read()
    with zipfile.ZipFile(good) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    out = []

    def write(name, content):
        p = str(tmp_path / name)
        with open(p, "wb") as f:
            f.write(content)
        return p

    out.append(("garbage", write("garbage", b"not a zip at all"), "not a valid SINGA"))
    out.append(("truncated", write("truncated", data[: len(data) // 2]), "not a valid SINGA"))
    damaged = bytearray(data)
    mid = data.index(b"tensor_dict.npz") + 200  # inside the deflated npz payload
    damaged[mid:mid + 8] = b"\x00" * 8
    out.append(("bitflip", write("bitflip", bytes(damaged)), "not a valid SINGA"))

    def rezip(name, mutate):
        p = str(tmp_path / name)
        m = dict(members)
        mutate(m)
        with zipfile.ZipFile(p, "w") as zf:
            for k, v in m.items():
                zf.writestr(k, v)
        return p

    out.append(("no_attr", rezip("no_attr", lambda m: m.pop("states_attr.json")), "missing"))
    attrs = json.loads(members["states_attr.json"])

    def extra_attr(m):
        a = dict(attrs)
        a["ghost"] = {"state_type": 0, "shape": [1], "dtype": 0}
        m["states_attr.json"] = json.dumps(a).encode()

    out.append(("names_differ", rezip("names_differ", extra_attr), "differ"))

    def bad_type(m):
        a = {k: dict(v) for k, v in attrs.items()}
        a[next(iter(a))]["state_type"] = 5
        m["states_attr.json"] = json.dumps(a).encode()

    out.append(("bad_type", rezip("bad_type", bad_type), "state_type"))
    return out


def test_missing_and_corrupt_files_change_nothing(tmp_path, trained):
    good = str(tmp_path / "good")
    trained.save_states(good)
    target = make(seed=9)
    before = values(target)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        target.load_states(str(tmp_path / "nope"))
    for name, path, message in corrupt_files(tmp_path, good):
        with pytest.raises(ValueError, match=message):
            target.load_states(path)
        assert_values(target, before)
    target.load_states(good)  # the good one still loads
    assert_values(target, values(trained))


def test_bad_save_arguments(tmp_path, trained):
    with pytest.raises(TypeError, match="aux state 'note'"):
        trained.save_states(str(tmp_path / "a"), aux_states={"note": "text"})
    with pytest.raises(ValueError, match="also model state names"):
        trained.save_states(str(tmp_path / "b"), aux_states={"fc.W": 1.0})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        trained.save_states(str(tmp_path / "no" / "such" / "dir"))
    assert os.listdir(tmp_path) == []


def test_graph_mode_model_saves_and_restores(tmp_path):
    m = make(use_graph=True)
    x, y = batch()
    for _ in range(3):
        m(x, y)
    path = str(tmp_path / "g")
    m.save_states(path)
    saved = values(m)
    m(x, y)
    m.load_states(path)  # values are written into the same Tensors: the program stays valid
    assert_values(m, saved)
    count = m.graph_stats()["traces"]
    m(x, y)
    assert m.graph_stats()["traces"] == count
