"""Data loaders of the CNN example: MNIST, CIFAR-10 and CIFAR-100 files, or offline digits."""
