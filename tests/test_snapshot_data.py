"""singa_jax.snapshot (SINGA's binary snapshot format, checked byte by byte) and
singa_jax.data.ImageBatchIter (background loading of an image folder made here).

The images are written as .npy files (Pillow is not a dependency); image_transform loads them
with NumPy, and one transform returns objects with PIL's ``convert('RGB')`` to exercise that
path."""
import random
import struct
import threading
import time

import numpy as np
import pytest

from singa_jax import data, snapshot, tensor


# ---------------------------------------------------------------------------------------------
# snapshot
# ---------------------------------------------------------------------------------------------
def _expected_record(key: str, proto: bytes) -> bytes:
    return (b"sg\x01\x00" + struct.pack("<Q", len(key)) + key.encode() +
            struct.pack("<Q", len(proto)) + proto)


def test_snapshot_bytes_follow_singa_layout(tmp_path):
    prefix = str(tmp_path / "param")
    w = tensor.Tensor(data=np.array([[1.0, -2.5, 3.0], [0.0, 0.5, 4.0]], np.float32))
    n = tensor.Tensor(data=np.array([1, -2], np.int32))
    sn = snapshot.Snapshot(prefix, True)
    sn.write("w", w)
    sn.write("n", n)
    sn.close()
    # TensorProto by hand: shape (field 1, varints), data_type (2), stride (3), packed data
    w_proto = (b"\x08\x02\x08\x03" + b"\x10\x00" + b"\x18\x03\x18\x01" + b"\x22\x18" +
               np.array([1.0, -2.5, 3.0, 0.0, 0.5, 4.0], "<f4").tobytes())
    minus_two = b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # int32 -2 as a 10-byte varint
    n_proto = b"\x08\x02" + b"\x10\x02" + b"\x18\x01" + b"\x32\x0b" + b"\x01" + minus_two
    with open(prefix + ".bin", "rb") as f:
        assert f.read() == _expected_record("w", w_proto) + _expected_record("n", n_proto)
    with open(prefix + ".desc") as f:
        assert f.read().splitlines() == [
            "SINGA VERSION: 5100",
            "parameter name: w\tdata type: 0\tdim: 2\tshape: 2 3",
            "parameter name: n\tdata type: 2\tdim: 1\tshape: 2"]


def test_snapshot_reads_singa_variants(tmp_path):
    """What SINGA's C++ may write besides our own layout: unpacked repeated fields, a keyless
    record, a transposed tensor stored with its strides, float64 data, the 1.0.0 '.model'
    name."""
    transposed = np.arange(6, dtype=np.float32).reshape(3, 2)  # memory of a 3x2, read as 2x3
    proto_t = (b"\x08\x02\x08\x03\x10\x00\x18\x01\x18\x02" + b"".join(
        b"\x25" + struct.pack("<f", v) for v in transposed.ravel()))  # unpacked floats (wire 5)
    proto_d = b"\x08\x02\x10\x04\x18\x01\x2a\x10" + np.array([0.25, -1.0], "<f8").tobytes()
    keyless = b"sg\x00\x00" + struct.pack("<Q", 3) + b"abc"
    blob = keyless + _expected_record("t", proto_t) + _expected_record("d", proto_d)
    (tmp_path / "old.model").write_bytes(blob)
    params = snapshot.Snapshot(str(tmp_path / "old"), False).read()
    np.testing.assert_array_equal(tensor.to_numpy(params["t"]), transposed.T)
    np.testing.assert_array_equal(tensor.to_numpy(params["d"]), [0.25, -1.0])


# ---------------------------------------------------------------------------------------------
# data.ImageBatchIter
# ---------------------------------------------------------------------------------------------
def _image_folder(tmp_path, n=5, labels=True):
    folder = tmp_path / "images"
    folder.mkdir()
    lines = []
    for i in range(n):
        np.save(folder / f"img{i}.npy", np.full((4, 5, 3), i, np.uint8))
        lines.append(f"img{i}.npy,{i % 3}" if labels else f"img{i}.npy,cat{i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return str(folder), str(tmp_path / "list.txt")


def test_image_batch_iter_batches_in_order_with_labels(tmp_path):
    folder, listing = _image_folder(tmp_path)
    it = data.ImageBatchIter(listing, 2, lambda p: [np.load(p)], shuffle=False, delimiter=",",
                             image_folder=folder, capacity=2)
    assert it.num_samples == 5 and it.is_label_index
    it.start()
    try:
        seen = []
        for _ in range(3):  # 6 images from a list of 5: the worker wraps around
            x, y = next(it)
            assert x.shape == (2, 3, 4, 5) and x.dtype == np.float32 and y.dtype == np.int32
            seen += [int(img[0, 0, 0]) for img in x]
            assert [int(v) for v in y] == [int(img[0, 0, 0]) % 3 for img in x]
        assert seen == [0, 1, 2, 3, 4, 0]
        # the worker fills the queue up to its capacity in the background
        deadline = time.time() + 5
        while not it.queue.full() and time.time() < deadline:
            time.sleep(0.01)
        assert it.queue.qsize() == 2
    finally:
        it.end()
    assert not it.p.is_alive()
    assert not any(t.name == "ImageBatchIter" and t.is_alive() for t in threading.enumerate())


def test_image_batch_iter_meta_strings_shuffle_and_pil_like_images(tmp_path):
    folder, listing = _image_folder(tmp_path, n=4, labels=False)

    class FakePIL:  # what SINGA's loop calls on a PIL image: convert('RGB')
        def __init__(self, ary):
            self.ary = ary

        def convert(self, mode):
            assert mode == "RGB"
            return self.ary

    def two_views(path):  # augmentation: an image and its grey version count twice
        img = np.load(path)
        return [FakePIL(img), img[:, :, 0]]
    random.seed(1)
    it = data.ImageBatchIter(listing, 4, two_views, shuffle=True, delimiter=",",
                             image_folder=folder)
    it.start()
    try:
        x, y = it.next()
    finally:
        it.end()
    assert not it.is_label_index and isinstance(y, list) and y[0] == y[1]
    assert x.shape == (4, 3, 4, 5)
    assert [int(v[len("cat"):]) for v in y] == [int(img[0, 0, 0]) for img in x]
    expected = list(range(4))
    random.seed(1)
    random.shuffle(expected)  # the worker shuffled the list with the same generator state
    assert [int(img[0, 0, 0]) for img in x[::2]] == expected[:2] != [0, 1]


def test_image_batch_iter_errors(tmp_path):
    folder, listing = _image_folder(tmp_path, n=2)
    with pytest.raises(RuntimeError, match="call start"):
        next(data.ImageBatchIter(listing, 1, lambda p: [np.load(p)], image_folder=folder))
    with pytest.raises(ValueError, match="batch_size"):
        data.ImageBatchIter(listing, 0, lambda p: [])
    with pytest.raises(TypeError, match="callable"):
        data.ImageBatchIter(listing, 1, None)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="lists no images"):
        data.ImageBatchIter(str(tmp_path / "empty.txt"), 1, lambda p: [])
    # a failing transform is reported by next() instead of blocking it
    it = data.ImageBatchIter(listing, 2, lambda p: [np.load(p)] * 3, delimiter=",",
                             image_folder=folder)
    it.start()
    with pytest.raises(RuntimeError, match="too many images"):
        next(it)
    it.end()
    it = data.ImageBatchIter(listing, 1, lambda p: [np.zeros((2, 2, 2))], delimiter=",",
                             image_folder=folder)
    it.start()
    with pytest.raises(RuntimeError, match="H x W"):
        next(it)
    it.end()
    it = data.ImageBatchIter(listing, 1, lambda p: [np.load(p)], delimiter=",",
                             image_folder=folder, capacity=1)
    it.start()
    it.end()
    with pytest.raises(RuntimeError, match="end\\(\\) was called"):
        for _ in range(2):  # at most one batch was queued before end()
            next(it)
