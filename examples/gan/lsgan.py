"""Least-squares GAN on MNIST-like digits (SINGA's examples/gan/lsgan.py, ported to singa_jax).

    python examples/gan/lsgan.py [mnist.pkl.gz] [--iterations N] [--output-dir DIR]

Targets follow SINGA's example: the discriminator scores real images 1 and generated ones -1,
and the generator pulls the score of its images towards 0 (a=-1, b=1, c=0 in the paper).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import lsgan_mlp  # noqa: E402
from trainer import run  # noqa: E402

LABELS = (1.0, -1.0, 0.0)


def main(argv=None):
    return run(lsgan_mlp.create_model, LABELS, 'Train a least-squares GAN over MNIST', argv,
               default_dir='lsgan_images/', d_steps=1, g_steps=1)


if __name__ == '__main__':
    main()
