"""The training loop shared by vanilla.py and lsgan.py (SINGA's VANILLA / LSGAN classes)."""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from common.training import (Progress, load_checkpoint, pick_device,  # noqa: E402
                             save_checkpoint, scalar)
from singa_jax import opt, tensor  # noqa: E402
from utils import load_data, print_log, save_grid  # noqa: E402

QUICK = dict(noise_size=16, hidden_size=32, batch=32, iterations=10, interval=5)


class GANTrainer:
    """Alternates ``d_steps`` discriminator updates (real images -> ``real_label``, generated
    -> ``fake_label``) with ``g_steps`` generator updates (generated -> ``gen_target``)."""

    def __init__(self, create_model, real_label, fake_label, gen_target, dev, rows=28, cols=28,
                 channels=1, noise_size=100, hidden_size=128, batch=128, interval=1000,
                 learning_rate=0.001, iterations=1000000, d_steps=1, g_steps=1,
                 dataset_filepath=None, file_dir='gan_images/', checkpoint=None):
        self.dev = dev
        self.rows, self.cols, self.channels = rows, cols, channels
        self.feature_size = rows * cols * channels
        self.noise_size = noise_size
        self.batch_size = batch // 2  # half a batch of real, half of generated images
        self.interval = interval
        self.learning_rate = learning_rate
        self.iterations = iterations
        self.d_steps, self.g_steps = d_steps, g_steps
        self.labels = (real_label, fake_label, gen_target)
        self.dataset_filepath = dataset_filepath
        self.file_dir = file_dir
        self.checkpoint = checkpoint
        self.model = create_model(noise_size=noise_size, feature_size=self.feature_size,
                                  hidden_size=hidden_size)

    def constant(self, value):
        t = tensor.Tensor((self.batch_size, 1), self.dev, tensor.float32)
        t.set_value(value)
        return t

    def train(self, resume=False):
        """Returns the history: per-iteration discriminator and generator losses."""
        train_data = load_data(self.dataset_filepath)
        self.dev.SetRandSeed(0)
        rng = np.random.RandomState(0)
        optimizer = opt.Adam(lr=self.learning_rate)

        noise = tensor.Tensor((self.batch_size, self.noise_size), self.dev, tensor.float32)
        real_images = tensor.Tensor((self.batch_size, self.feature_size), self.dev,
                                    tensor.float32)
        real_labels, fake_labels, gen_targets = (self.constant(v) for v in self.labels)

        self.model.set_optimizer(optimizer)
        self.model.compile([noise], is_train=True, use_graph=False, sequential=True)
        # compile traced only the generator; run the discriminator once so it has parameters too
        self.model.forward_dis(real_images)
        first = load_checkpoint(self.model, self.checkpoint, optimizer) if resume else 0

        history = {'d_loss': [], 'g_loss': []}
        bar = Progress(self.iterations - first, self.batch_size * 2, 'GAN')
        for iteration in (first + i for i in bar):
            self.model.train()
            for _ in range(self.d_steps):
                real_images.copy_from_numpy(
                    train_data[rng.randint(0, train_data.shape[0], self.batch_size)])
                _, d_loss_real = self.model.train_one_batch_dis(real_images, real_labels)
                noise.uniform(-1, 1)
                fake_images = self.model.forward_gen(noise)
                _, d_loss_fake = self.model.train_one_batch_dis(fake_images, fake_labels)
                d_loss = scalar(d_loss_real) + scalar(d_loss_fake)
            for _ in range(self.g_steps):
                noise.uniform(-1, 1)
                _, g_loss_tensor = self.model.train_one_batch(noise, gen_targets)
                g_loss = scalar(g_loss_tensor)
            history['d_loss'].append(d_loss)
            history['g_loss'].append(g_loss)
            bar.update(d_loss + g_loss)
            bar.bar.set_postfix(d_loss=f'{d_loss:.4f}', g_loss=f'{g_loss:.4f}', refresh=False)

            if iteration % self.interval == 0 or iteration == self.iterations - 1:
                self.model.eval()
                self.save_image(iteration)
                if self.checkpoint is not None:
                    save_checkpoint(self.model, self.checkpoint, iteration, optimizer)
                bar.bar.write(f'[iteration {iteration}] G_LOSS: {g_loss:.4f}, '
                              f'D_LOSS: {d_loss:.4f}')
        bar.close()
        print_log(f' finished {self.iterations} iterations, G_LOSS: {g_loss:.4f}, '
                  f'D_LOSS: {d_loss:.4f}; images in {self.file_dir}')
        return history

    def save_image(self, iteration, rows=5, cols=5):
        if not hasattr(self, 'demo_noise'):
            self.demo_noise = tensor.Tensor((rows * cols, self.noise_size), self.dev,
                                            tensor.float32)
        self.demo_noise.uniform(-1, 1)
        images = tensor.to_numpy(self.model.forward_gen(self.demo_noise))
        os.makedirs(self.file_dir, exist_ok=True)
        save_grid(images, rows, cols, os.path.join(self.file_dir, f'{iteration}.pgm'))


def parse_args(description, argv=None, default_dir='gan_images/', lr=0.0005):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('filepath', type=str, nargs='?', default=None,
                        help='mnist.pkl.gz (default: scikit-learn digits)')
    parser.add_argument('--use_gpu', action='store_true',
                        help='accepted for SINGA compatibility; the default backend is used')
    parser.add_argument('--iterations', type=int, default=3000)
    parser.add_argument('--interval', type=int, default=500)
    parser.add_argument('--lr', type=float, default=lr)
    parser.add_argument('--output-dir', default=default_dir)
    parser.add_argument('-c', '--checkpoint', default=None)
    parser.add_argument('-r', '--resume', action='store_true')
    parser.add_argument('--quick', action='store_true', help='a few tiny steps (for tests)')
    return parser.parse_args(argv)


def run(create_model, labels, description, argv=None, default_dir='gan_images/', **extra):
    """Parse the command line, train, return the loss history."""
    args = parse_args(description, argv, default_dir)
    sizes = dict(noise_size=100, hidden_size=128, batch=128, iterations=args.iterations,
                 interval=args.interval)
    if args.quick:
        sizes = QUICK
    checkpoint = args.checkpoint or os.path.join(args.output_dir, 'checkpoint.zip')
    trainer = GANTrainer(create_model, *labels, pick_device(), learning_rate=args.lr,
                         dataset_filepath=args.filepath, file_dir=args.output_dir,
                         checkpoint=checkpoint, **sizes, **extra)
    return trainer.train(resume=args.resume)
