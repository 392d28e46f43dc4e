"""Least-squares GAN of SINGA's examples/gan/model/lsgan_mlp.py (https://arxiv.org/abs/1611.04076).

Same networks as the vanilla GAN, but the discriminator outputs a raw score and both halves
minimise a mean squared error to target scores instead of a cross-entropy.
"""
from singa_jax import layer

from .gan_mlp import GAN_MLP


class LSGAN_MLP(GAN_MLP):

    def build_head(self):
        self.mse_loss = layer.MeanSquareError()

    def head(self, score):
        return score

    def loss(self, out, y):
        return self.mse_loss(out, y)


def create_model(pretrained=False, **kwargs):
    """Build an LSGAN_MLP (``pretrained`` is accepted for SINGA compatibility)."""
    return LSGAN_MLP(**kwargs)


__all__ = ['LSGAN_MLP', 'create_model']
