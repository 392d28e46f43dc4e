"""Vanilla GAN on MNIST-like digits (SINGA's examples/gan/vanilla.py, ported to singa_jax).

    python examples/gan/vanilla.py [mnist.pkl.gz] [--iterations N] [--output-dir DIR]

Without a file the real images are scikit-learn's bundled digits upsampled to 28x28. Every
``--interval`` iterations a 5x5 grid of generated digits is written to the output folder.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import gan_mlp  # noqa: E402
from trainer import run  # noqa: E402

# discriminator targets: real 1, generated 0; the generator wants its images scored 1
LABELS = (1.0, 0.0, 1.0)


def main(argv=None):
    return run(gan_mlp.create_model, LABELS, 'Train a vanilla GAN over MNIST', argv,
               default_dir='vanilla_images/')


if __name__ == '__main__':
    main()
