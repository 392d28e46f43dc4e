"""Every example's --quick mode runs and its training loss falls.

The examples are run in-process through their ``main(argv)`` functions (saving the cost of a
fresh interpreter and JAX start-up per example). Each example puts its own folders on sys.path
and imports sibling modules by short names (``model``, ``data``, ``common``...), so every run is
isolated: sys.path and the modules it imported from examples/ are restored afterwards.
"""
import gzip
import importlib
import importlib.util
import io
import json
import os
import pickle
import struct
import sys
import zipfile

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'examples')


def run_example(script, argv):
    path = os.path.join(EXAMPLES, script)
    saved_path = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location('example_' + script.replace('/', '_')[:-3],
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main(argv)
    finally:
        sys.path[:] = saved_path
        forget_example_modules()


def forget_example_modules():
    """Drop the modules imported from examples/ (their short names clash between examples)."""
    for name, module in list(sys.modules.items()):
        locations = [getattr(module, '__file__', None)]
        try:
            locations += list(getattr(module, '__path__', []))
        except TypeError:  # some packages (torch's) have a __path__ that is no list of paths
            pass
        if any(isinstance(loc, str) and os.path.abspath(loc).startswith(EXAMPLES)
               for loc in locations):
            del sys.modules[name]


def assert_falls(losses, what, window=3):
    """The mean of the last ``window`` losses is below the mean of the first ``window``."""
    losses = np.asarray(losses, dtype=np.float64)
    assert losses.size >= 2 * window, f"{what}: only {losses.size} losses recorded"
    assert np.all(np.isfinite(losses)), f"{what}: non-finite loss in {losses}"
    first, last = losses[:window].mean(), losses[-window:].mean()
    assert last < first, f"{what}: loss did not fall ({first:.4f} -> {last:.4f}): {losses}"


@pytest.mark.parametrize('script', ['mlp/native.py', 'mlp/model.py'])
def test_mlp(script):
    losses = run_example(script, ['--quick'])
    assert_falls(losses, script)
    assert losses[-1] < 0.9 * losses[0]


def test_train_cnn_quick(tmp_path):
    """The main job's path: SINGA's cnn model in graph mode, with a SINGA-format checkpoint."""
    ckpt = str(tmp_path / 'cnn.zip')
    history = run_example('cnn/train_cnn.py', ['cnn', 'mnist', '--quick', '--graph', '-c', ckpt])
    assert_falls(history['losses'], 'train_cnn cnn')
    assert len(history['test_acc']) == 3 and all(0 <= a <= 1 for a in history['test_acc'])
    with zipfile.ZipFile(ckpt) as archive:
        assert sorted(archive.namelist()) == ['states_attr.json', 'tensor_dict.npz']
        attrs = json.loads(archive.read('states_attr.json'))
        arrays = np.load(io.BytesIO(archive.read('tensor_dict.npz')))
        assert arrays['epoch'].tolist() == [2]
    assert {'conv1.W', 'conv2.W', 'linear1.W', 'linear2.W'} <= set(attrs)
    assert arrays['conv1.W'].shape == (20, 1, 5, 5)


def test_train_cnn_autocast_keeps_float32_checkpoints(tmp_path):
    """--autocast bfloat16: the loss falls and the checkpoint holds float32 weights and a
    float32 optimizer state (master weights)."""
    ckpt = str(tmp_path / 'cnn.zip')
    history = run_example('cnn/train_cnn.py', ['cnn', 'mnist', '--quick', '--graph',
                                               '--autocast', 'bfloat16', '-c', ckpt])
    assert_falls(history['losses'], 'train_cnn cnn --autocast bfloat16')
    with zipfile.ZipFile(ckpt) as archive:
        arrays = np.load(io.BytesIO(archive.read('tensor_dict.npz')))
        floats = {k: a.dtype for k, a in arrays.items() if a.dtype.kind in 'fV'}
    assert floats and set(floats.values()) == {np.dtype(np.float32)}, floats


def test_train_cnn_resume(tmp_path):
    """--resume restores the weights, the optimizer and the epoch (eager mode, mlp model,
    CIFAR-shaped default data)."""
    ckpt = str(tmp_path / 'mlp.zip')
    argv = ['mlp', 'cifar10', '--quick', '--no-graph', '-c', ckpt]
    history = run_example('cnn/train_cnn.py', argv + ['-m', '2'])
    assert_falls(history['losses'], 'train_cnn mlp', window=2)
    resumed = run_example('cnn/train_cnn.py', argv + ['-m', '3', '--resume'])
    assert len(resumed['train_loss']) == 1  # only epoch 2 is left to train
    # training went on from the trained weights, not from scratch
    assert resumed['train_loss'][0] < history['train_loss'][0]


def _import_cnn_data(module):
    sys.path.insert(0, os.path.join(EXAMPLES, 'cnn'))
    try:
        return importlib.import_module('data.' + module)
    finally:
        sys.path.remove(os.path.join(EXAMPLES, 'cnn'))


@pytest.fixture
def cnn_data():
    yield _import_cnn_data
    forget_example_modules()


def test_mnist_loader_reads_idx_files(tmp_path, cnn_data):
    rng = np.random.RandomState(0)
    images = {'train': rng.randint(0, 256, (5, 28, 28)), 't10k': rng.randint(0, 256, (3, 28, 28))}
    labels = {'train': rng.randint(0, 10, 5), 't10k': rng.randint(0, 10, 3)}
    for split in images:  # IDX: big-endian magic number and sizes, then uint8 values
        n = len(labels[split])
        with gzip.open(tmp_path / f'{split}-images-idx3-ubyte.gz', 'wb') as f:
            f.write(struct.pack('>4i', 2051, n, 28, 28) + images[split].astype(np.uint8).tobytes())
        with open(tmp_path / f'{split}-labels-idx1-ubyte', 'wb') as f:  # uncompressed works too
            f.write(struct.pack('>2i', 2049, n) + labels[split].astype(np.uint8).tobytes())
    train_x, train_y, val_x, val_y = cnn_data('mnist').load(str(tmp_path))
    assert train_x.shape == (5, 1, 28, 28) and train_x.dtype == np.float32
    np.testing.assert_allclose(train_x[:, 0], images['train'] / 255, rtol=1e-6)
    np.testing.assert_allclose(val_x[:, 0], images['t10k'] / 255, rtol=1e-6)
    assert train_y.tolist() == labels['train'].tolist() and val_y.dtype == np.int32
    with pytest.raises(FileNotFoundError, match='MNIST'):
        cnn_data('mnist').load(str(tmp_path / 'missing'))


def test_cifar10_loader_reads_pickle_batches(tmp_path, cnn_data):
    folder = tmp_path / 'cifar-10-batches-py'
    folder.mkdir()
    rng = np.random.RandomState(0)
    batches = {}
    for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
        batches[name] = {'data': rng.randint(0, 256, (2, 3072)).astype(np.uint8),
                         'labels': rng.randint(0, 10, 2).tolist()}
        with open(folder / name, 'wb') as f:
            pickle.dump(batches[name], f)
    train_x, train_y, val_x, val_y = cnn_data('cifar10').load(str(tmp_path))  # parent works
    assert train_x.shape == (10, 3, 32, 32) and val_x.shape == (2, 3, 32, 32)
    mean = np.array([0.4914, 0.4822, 0.4465]).reshape(1, 3, 1, 1)
    std = np.array([0.2023, 0.1994, 0.2010]).reshape(1, 3, 1, 1)
    expected = (batches['test_batch']['data'].reshape(2, 3, 32, 32) / 255 - mean) / std
    np.testing.assert_allclose(val_x, expected, rtol=1e-5, atol=1e-5)
    assert train_y.tolist() == sum((batches[f'data_batch_{i}']['labels'] for i in range(1, 6)),
                                   [])


def test_default_data_is_bundled_digits(cnn_data):
    train_x, train_y, val_x, val_y = cnn_data('cifar10').load(None)
    assert train_x.shape[1:] == (3, 32, 32) and len(train_y) + len(val_y) == 1797
    assert 0 <= train_x.min() and train_x.max() <= 1 and set(val_y.tolist()) == set(range(10))
    train_x, _, _, _ = cnn_data('mnist').load(None)
    assert train_x.shape[1:] == (1, 28, 28)


def test_char_rnn(tmp_path):
    history = run_example('rnn/char_rnn.py', ['--quick', '-c', str(tmp_path / 'rnn.zip')])
    assert_falls(history['losses'], 'char_rnn')


@pytest.mark.parametrize('script', ['gan/vanilla.py', 'gan/lsgan.py'])
def test_gan(tmp_path, script):
    history = run_example(script, ['--quick', '--output-dir', str(tmp_path)])
    # the discriminator learns to tell digits from the untrained generator's noise
    assert_falls(history['d_loss'], script + ' discriminator')
    assert any(name.endswith('.pgm') for name in os.listdir(tmp_path))


def test_gan_steps_update_only_their_own_half():
    """The generator step must leave the discriminator's parameters alone and vice versa."""
    sys.path.insert(0, os.path.join(EXAMPLES, 'gan'))
    try:
        from model import gan_mlp
        from singa_jax import device, opt, tensor

        device.get_default_device().SetRandSeed(0)
        # the shapes of gan/vanilla.py --quick, whose compiled kernels this reuses
        net = gan_mlp.create_model(noise_size=16, feature_size=784, hidden_size=32)
        net.set_optimizer(opt.Adam(lr=0.01))
        noise = tensor.Tensor((16, 16))
        noise.uniform(-1, 1)
        images = tensor.Tensor((16, 784))
        images.uniform(0, 1)
        target = tensor.Tensor((16, 1))
        target.set_value(1.0)
        net.compile([noise], is_train=True, use_graph=False, sequential=True)
        net.forward_dis(images)
        net.train()

        def changed_by(step, *args):
            before = {k: tensor.to_numpy(v).copy() for k, v in net.get_params().items()}
            step(*args)
            return sorted(k for k, v in net.get_params().items()
                          if not np.allclose(before[k], tensor.to_numpy(v)))

        generator = sorted(k for k in net.get_params() if k.startswith('gen_net'))
        discriminator = sorted(k for k in net.get_params() if k.startswith('dis_net'))
        assert generator and discriminator
        assert changed_by(net.train_one_batch, noise, target) == generator
        assert changed_by(net.train_one_batch_dis, images, target) == discriminator
    finally:
        sys.path.remove(os.path.join(EXAMPLES, 'gan'))
        forget_example_modules()
