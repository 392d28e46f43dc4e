"""Every example's --quick mode runs and its training loss falls.

The examples are run in-process through their ``main(argv)`` functions (saving the cost of a
fresh interpreter and JAX start-up per example). Each example puts its own folders on sys.path
and imports sibling modules by short names (``model``, ``data``, ``common``...), so every run is
isolated: sys.path and the modules it imported from examples/ are restored afterwards.
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'examples')


def run_example(script, argv):
    path = os.path.join(EXAMPLES, script)
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location('example_' + script.replace('/', '_')[:-3],
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main(argv)
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            if _from_examples(sys.modules[name]):
                del sys.modules[name]


def _from_examples(module):
    locations = [getattr(module, '__file__', None)] + list(getattr(module, '__path__', []))
    return any(loc and os.path.abspath(loc).startswith(EXAMPLES) for loc in locations)


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


def test_train_cnn_quick_and_resume(tmp_path):
    # the main job's path: SINGA's cnn model in graph mode (eager mode: the other tests)
    ckpt = str(tmp_path / 'cnn.zip')
    graph = '--graph'
    history = run_example('cnn/train_cnn.py', ['cnn', 'mnist', '--quick', graph, '-c', ckpt])
    assert_falls(history['losses'], 'train_cnn')
    assert len(history['test_acc']) == 3 and all(0 <= a <= 1 for a in history['test_acc'])
    assert os.path.isfile(ckpt)
    # the checkpoint holds epochs 0-2: resuming with --max-epoch 4 trains exactly one more epoch
    resumed = run_example('cnn/train_cnn.py', ['cnn', 'mnist', '--quick', graph, '-c', ckpt,
                                               '--resume', '-m', '4'])
    assert len(resumed['train_loss']) == 1
    # it continues from the trained weights rather than from scratch
    assert resumed['train_loss'][0] < history['train_loss'][0]


def test_train_cnn_mlp_cifar_shaped(tmp_path):
    history = run_example('cnn/train_cnn.py', ['mlp', 'cifar10', '--quick', '--no-graph',
                                                '-c', str(tmp_path / 'mlp.zip')])
    assert_falls(history['losses'], 'train_cnn mlp cifar10')


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
        net = gan_mlp.create_model(noise_size=4, feature_size=16, hidden_size=32)
        net.set_optimizer(opt.Adam(lr=0.01))
        noise = tensor.Tensor((2, 4))
        noise.uniform(-1, 1)
        images = tensor.Tensor((2, 16))
        images.uniform(0, 1)
        target = tensor.Tensor((2, 1))
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
        for name in [n for n, m in sys.modules.items() if _from_examples(m)]:
            del sys.modules[name]
