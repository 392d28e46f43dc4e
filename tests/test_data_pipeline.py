"""singa_jax.data's device-side input pipeline: the transform pieces against NumPy references,
DeviceLoader's batches (reproducible, every example once per epoch, last batch, placement over
two host devices), errors from its thread, its shutdown, and a graph-mode model fed from it
without host copies or new compilations.

The suite runs with two host devices (XLA_FLAGS=--xla_force_host_platform_device_count=2); with
one, the placement test skips.
"""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from singa_jax import data, layer, model, opt, tensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
two_devices = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two JAX devices (run "
                                 "with XLA_FLAGS=--xla_force_host_platform_device_count=2)")


def images(n=6, c=2, h=7, w=9, seed=0):
    return np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)


# --- NumPy references --------------------------------------------------------------------
def numpy_shift(x, offsets, shift, flips=None):
    """The examples' former host augmentation (symmetric padding, crop at (top, left), flip)
    with given offsets instead of drawn ones."""
    side_h, side_w = x.shape[2:]
    padded = np.pad(x, [[0, 0], [0, 0], [shift, shift], [shift, shift]], 'symmetric')
    out = np.empty_like(x)
    for i, (top, left) in enumerate(offsets):
        crop = padded[i, :, top:top + side_h, left:left + side_w]
        out[i] = crop[:, :, ::-1] if flips is not None and flips[i] else crop
    return out


def numpy_bilinear(x, out_h, out_w):
    """Separable bilinear resampling with pixel centres aligned and edges clamped."""
    def matrix(n_in, n_out):
        coords = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(coords).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        m = np.zeros((n_out, n_in))
        m[np.arange(n_out), lo] += 1 - (coords - lo)
        m[np.arange(n_out), hi] += coords - lo
        return m
    rows, cols = matrix(x.shape[-2], out_h), matrix(x.shape[-1], out_w)
    return np.einsum('ph,nchw,qw->ncpq', rows, x.astype(np.float64), cols)


# --- the transform pieces ----------------------------------------------------------------
def test_random_shift_is_the_numpy_augmentation_at_its_offsets():
    x = images()
    piece = data.random_shift(3)  # symmetric padding by default, as SINGA's example
    key = jax.random.PRNGKey(7)
    offsets = np.asarray(piece.draw(key, x))
    assert offsets.shape == (6, 2) and offsets.min() >= 0 and offsets.max() <= 6
    assert len({tuple(o) for o in offsets}) > 1  # one draw per image
    got = np.asarray(jax.jit(piece)(key, x))
    np.testing.assert_array_equal(got, numpy_shift(x, offsets, 3))
    # the deterministic form at hand-picked offsets, corners included
    fixed = np.array([[0, 0], [6, 6], [0, 6], [6, 0], [3, 3], [1, 5]])
    np.testing.assert_array_equal(np.asarray(data.crop_at(x, jnp.asarray(fixed), pad=3,
                                                          mode='symmetric')),
                                  numpy_shift(x, fixed, 3))


def test_random_crop_to_a_smaller_window_with_zero_padding():
    x = images(h=8, w=8)
    piece = data.random_crop(size=(5, 6), pad=1)
    key = jax.random.PRNGKey(1)
    offsets = np.asarray(piece.draw(key, x))
    assert offsets[:, 0].max() <= 10 - 5 and offsets[:, 1].max() <= 10 - 6
    padded = np.pad(x, [[0, 0], [0, 0], [1, 1], [1, 1]])
    expected = np.stack([padded[i, :, t:t + 5, l:l + 6] for i, (t, l) in enumerate(offsets)])
    np.testing.assert_array_equal(np.asarray(piece(key, x)), expected)


def test_random_flip_flips_the_drawn_images_only():
    x = images(n=16)
    piece = data.random_flip()
    key = jax.random.PRNGKey(3)
    flips = np.asarray(piece.draw(key, x))
    assert 0 < flips.sum() < 16
    expected = np.where(flips[:, None, None, None], x[..., ::-1], x)
    np.testing.assert_array_equal(np.asarray(piece(key, x)), expected)
    np.testing.assert_array_equal(np.asarray(data.random_flip(p=0.0)(key, x)), x)
    np.testing.assert_array_equal(np.asarray(data.random_flip(p=1.0, axis=-2)(key, x)),
                                  x[:, :, ::-1, :])


def test_shift_and_flip_composed_match_the_numpy_augmentation():
    x = images(n=12)
    shift, flip = data.random_shift(2), data.random_flip()
    key = jax.random.PRNGKey(11)
    got = np.asarray(jax.jit(data.compose(shift, flip))(key, x))
    # compose hands random piece i the key fold_in(key, i)
    offsets = np.asarray(shift.draw(jax.random.fold_in(key, 0), x))
    flips = np.asarray(flip.draw(jax.random.fold_in(key, 1), x))
    np.testing.assert_array_equal(got, numpy_shift(x, offsets, 2, flips))


@pytest.mark.parametrize('size', [(28, 28), (5, 4)])
def test_resize_is_bilinear(size):
    x = images(h=8, w=9)
    key = jax.random.PRNGKey(0)
    got = np.asarray(data.resize(size, antialias=False)(key, x))
    np.testing.assert_allclose(got, numpy_bilinear(x, *size), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(data.resize(size)(key, x)),
                               np.asarray(jax.image.resize(x, (6, 2) + size, 'bilinear')),
                               rtol=1e-6, atol=1e-6)


def test_cast_normalize_flatten():
    x = images(c=3)
    key = jax.random.PRNGKey(0)
    mean, std = [0.1, 0.2, 0.3], [2.0, 4.0, 8.0]
    got = data.compose(data.normalize(mean, std), data.flatten(), data.cast('float16'))(key, x)
    expected = ((x - np.reshape(mean, (1, 3, 1, 1))) / np.reshape(std, (1, 3, 1, 1)))
    assert got.dtype == jnp.float16 and got.shape == (6, 3 * 7 * 9)
    np.testing.assert_allclose(np.asarray(got, np.float32), expected.reshape(6, -1),
                               rtol=1e-3, atol=1e-3)


def test_bad_pieces_and_shapes_are_named_before_anything_runs():
    with pytest.raises(ValueError, match="random_crop: mode"):
        data.random_crop(pad=1, mode='wrap')
    with pytest.raises(ValueError, match="resize: size"):
        data.resize(0)
    with pytest.raises(ValueError, match=r"random_crop\(size=\(9, 9\).*larger than the padded "
                                         r"images 7x7 \(input shape \(8, 1, 5, 5\)\)"):
        data.DeviceLoader(np.zeros((8, 1, 5, 5), np.float32), None, 8,
                          transform=data.random_crop(size=9, pad=1))
    with pytest.raises(ValueError, match=r"resize.*needs a batch of images .*\(8, 25\)"):
        data.DeviceLoader(np.zeros((8, 25), np.float32), None, 8, transform=data.resize(4))
    with pytest.raises(ValueError, match="y must have one entry per example"):
        data.DeviceLoader(np.zeros((8, 2)), np.zeros(7), 4)
    with pytest.raises(ValueError, match="prefetch must be an int >= 1"):
        data.DeviceLoader(np.zeros((8, 2)), None, 4, prefetch=0)
    with pytest.raises(ValueError, match="no full batch of 16"):
        data.DeviceLoader(np.zeros((8, 2)), None, 16)


# --- DeviceLoader ------------------------------------------------------------------------
AUGMENT = data.compose(data.random_shift(2), data.random_flip(), data.resize(12),
                       data.cast('float16'))


def collect(batches):
    return [tuple(np.asarray(a) for a in b) for b in batches]


def test_batches_are_the_documented_function_of_seed_epoch_and_step():
    x, y = images(n=40, h=8, w=8), np.arange(40, dtype=np.int32)
    loader = data.DeviceLoader(x, y, 8, shuffle=True, seed=5, transform=AUGMENT)
    assert loader.output.shape == (8, 2, 12, 12) and loader.output.dtype == jnp.float16
    got = collect(loader.epoch(3))
    order = np.random.default_rng((5, 3)).permutation(40)
    assert len(got) == 5
    for step, (bx, by) in enumerate(got):
        rows = order[step * 8:(step + 1) * 8]
        np.testing.assert_array_equal(by, rows)
        expected = jax.jit(AUGMENT)(data.batch_key(5, 3, step), x[rows])
        np.testing.assert_array_equal(bx, np.asarray(expected))


def test_same_seed_same_batches_whatever_the_prefetch_depth():
    x, y = images(n=48, h=8, w=8), np.arange(48, dtype=np.int32)
    runs = [collect(data.DeviceLoader(x, y, 8, shuffle=True, seed=1, transform=AUGMENT,
                                      prefetch=depth).epoch(2)) for depth in (1, 2, 5)]
    for other in runs[1:]:
        for (ax, ay), (bx, by) in zip(runs[0], other):
            np.testing.assert_array_equal(ax, bx)
            np.testing.assert_array_equal(ay, by)
    another_seed = collect(data.DeviceLoader(x, y, 8, shuffle=True, seed=2,
                                             transform=AUGMENT).epoch(2))
    assert not np.array_equal(runs[0][0][1], another_seed[0][1])


def test_every_example_exactly_once_per_epoch_with_shuffle():
    x = np.arange(53, dtype=np.float32).reshape(53, 1)
    loader = data.DeviceLoader(x, x[:, 0].astype(np.int32), 10, shuffle=True, seed=0,
                               drop_last=False)
    orders = []
    for epoch in range(3):
        seen = np.concatenate([b[1] for b in collect(loader)])  # iter(): the next epoch
        assert sorted(seen.tolist()) == list(range(53))
        orders.append(seen)
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[1], orders[2])


def test_last_batch_dropped_short_or_padded():
    x = np.arange(23, dtype=np.float32).reshape(23, 1)
    y = np.arange(23, dtype=np.int32) + 100
    dropped = collect(data.DeviceLoader(x, y, 5))
    assert len(dropped) == 4 and dropped[-1][1].tolist() == [115, 116, 117, 118, 119]
    short = collect(data.DeviceLoader(x, y, 5, drop_last=False))
    assert [len(b[1]) for b in short] == [5, 5, 5, 5, 3]
    loader = data.DeviceLoader(x, y, 5, drop_last=False, pad_last=True)
    batches = loader.epoch(0)
    counts, padded = [], []
    for bx, by in batches:
        counts.append(batches.count)
        padded.append((np.asarray(bx), np.asarray(by)))
    assert counts == [5, 5, 5, 5, 3] and len(loader) == 5
    np.testing.assert_array_equal(padded[-1][0][:, 0], [20, 21, 22, 0, 0])
    np.testing.assert_array_equal(padded[-1][1], [120, 121, 122, 0, 0])
    limited = data.DeviceLoader(x, y, 5, batches_per_epoch=2)
    assert len(collect(limited)) == 2 == len(limited)


def test_batches_from_an_iterable_each_epoch():
    host = [(np.full((4, 3), i, np.float32), np.full(4, i, np.int32)) for i in range(3)]
    loader = data.DeviceLoader.from_batches(host, transform=data.cast('float16'))
    for epoch in range(2):  # a list is read again every epoch
        got = collect(loader.epoch(epoch))
        assert [b[1][0] for b in got] == [0, 1, 2] and got[0][0].dtype == np.float16
    endless = data.DeviceLoader.from_batches(iter(host), batches_per_epoch=2)
    assert [b[1][0] for b in collect(endless.epoch(0))] == [0, 1]
    assert [b[1][0] for b in collect(endless.epoch(1))] == [2]  # an iterator goes on


def test_an_iterable_refilling_one_buffer_gets_each_batch_as_it_was():
    """A generator that refills one NumPy buffer per batch (a common host loader): the loader
    works ahead of the consumer, so each batch must be copied before the next refill."""
    buffer = np.zeros((64, 1000), np.float32)

    def refilled():
        for i in range(12):
            buffer[:] = i
            yield buffer, np.full(64, i, np.int32)

    loader = data.DeviceLoader.from_batches(refilled(), batches_per_epoch=12, prefetch=4)
    got = collect(loader.epoch(0))
    for i, (x, y) in enumerate(got):
        np.testing.assert_array_equal(np.asarray(x), np.full((64, 1000), i, np.float32))


def test_an_error_in_the_thread_is_raised_by_next_with_its_cause():
    def failing():
        yield np.zeros((2, 3), np.float32), np.zeros(2, np.int32)
        raise OSError("disk gone")

    batches = data.DeviceLoader.from_batches(failing()).epoch(0)
    next(batches)  # the batch made before the failure arrives
    with pytest.raises(RuntimeError, match=r"failed at epoch 0, batch 1: OSError: disk gone") \
            as raised:
        next(batches)
    assert isinstance(raised.value.__cause__, OSError)
    with pytest.raises(StopIteration):  # the epoch is over; nothing hangs
        next(batches)
    mismatched = data.DeviceLoader.from_batches([(np.zeros((2, 3)), np.zeros(3))])
    with pytest.raises(RuntimeError, match="2 inputs but 3 labels"):
        next(iter(mismatched))

    class Interrupted(BaseException):  # not an Exception: caught by the thread itself
        pass

    def interrupted():
        yield np.zeros((2, 3), np.float32), np.zeros(2, np.int32)
        raise Interrupted("stop")

    batches = data.DeviceLoader.from_batches(interrupted()).epoch(3)
    next(batches)
    with pytest.raises(RuntimeError, match=r"failed at epoch 3: Interrupted: stop"):
        next(batches)


@two_devices
def test_sharded_batches_are_split_over_both_devices():
    x, y = images(n=32, h=8, w=8), np.arange(32, dtype=np.int32)
    devices = jax.devices()[:2]
    sharded = data.DeviceLoader(x, y, 8, shuffle=True, seed=4, transform=AUGMENT,
                                sharding=devices)
    single = data.DeviceLoader(x, y, 8, shuffle=True, seed=4, transform=AUGMENT,
                               device=devices[1])
    for (sx, sy), (bx, by) in zip(sharded.epoch(0), single.epoch(0)):
        for global_array, expected in ((sx, bx), (sy, by)):
            assert global_array.shape == expected.shape
            shards = sorted(global_array.addressable_shards, key=lambda s: s.device.id)
            assert [s.device for s in shards] == devices
            for s in shards:  # each device holds its half of the batch
                assert s.data.shape[0] == 4
                np.testing.assert_array_equal(np.asarray(s.data), np.asarray(expected)[s.index])
        assert bx.devices() == {devices[1]}
    with pytest.raises(ValueError, match="splits every batch over 2 devices"):
        data.DeviceLoader(x, y, 7, sharding=devices)


def test_a_program_ending_mid_epoch_exits_cleanly(tmp_path):
    """A script ending while the loader's thread is blocked on its full queue exits at once
    with status 0, and the loader's exit hook has stopped the thread before JAX's and
    singa_jax's hooks run (a hook registered earlier runs later and sees no such thread)."""
    script = tmp_path / "mid_epoch.py"
    script.write_text(
        "import atexit, threading\n"
        "import numpy as np\n"
        "def report():\n"
        "    alive = [t.name for t in threading.enumerate() if t.name.startswith('DeviceLoader')]\n"
        "    print('loader threads at exit:', alive)\n"
        "atexit.register(report)\n"
        "from singa_jax import data\n"
        "x = np.zeros((4096, 1, 8, 8), np.float32)\n"
        "loader = data.DeviceLoader(x, None, 8, transform=data.compose(data.random_shift(2), "
        "data.resize(16)))\n"
        "batches = loader.epoch(0)\n"
        "next(batches)\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("loader threads at exit: []"), proc.stdout


# --- a model fed from the loader ----------------------------------------------------------
class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layer.Linear(16)
        self.relu = layer.ReLU()
        self.fc = layer.Linear(3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.fc(self.relu(self.hidden(x)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_graph_mode_fed_device_batches_compiles_once_and_learns():
    """Rebinding the input Tensors to the loader's device arrays: one compilation for every
    step of every epoch, and the loss falls."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 1, 4, 4)).astype(np.float32)
    y = (x.reshape(96, -1).sum(axis=1) > 0).astype(np.int32) + (x[:, 0, 0, 0] > 1)
    loader = data.DeviceLoader(x, y, 16, shuffle=True, seed=0,
                               transform=data.compose(data.random_flip(), data.flatten()))
    tx, ty = tensor.Tensor((16, 16)), tensor.Tensor((16,), dtype=tensor.int32)
    net = MLP()
    net.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    net.compile([tx], is_train=True, use_graph=True, sequential=False)
    losses = []
    for epoch in range(4):
        for bx, by in loader.epoch(epoch):
            tx.array, ty.array = bx, by
            _, loss = net(tx, ty)
            losses.append(loss.array)
        if epoch == 0:
            compiled = net.graph_stats()["compiles"]
    losses = np.asarray(jax.device_get(losses))
    assert net.graph_stats()["compiles"] == compiled == 1
    assert losses[-6:].mean() < 0.8 * losses[:6].mean(), losses
