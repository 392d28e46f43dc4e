"""The GAN example's models: vanilla GAN and least-squares GAN multilayer perceptrons."""
