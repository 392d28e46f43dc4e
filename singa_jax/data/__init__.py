"""SINGA's ``data`` module, and a device-side input pipeline.

* :class:`ImageBatchIter` -- SINGA's loader of an image list file, prefetching mini-batches of
  host arrays on a background worker.
* :class:`DeviceLoader` -- batches of a dataset (NumPy arrays, or an iterable of host batches
  such as an ``ImageBatchIter``) made on a background thread, put on the device (or split over
  several devices) and transformed there -- augmentation, resizing, casting as ONE jitted
  function -- ``prefetch`` batches ahead of the training loop.
* The device-side transform pieces: :func:`random_shift`,
  :func:`random_crop`, :func:`random_flip`, :func:`resize` (``jax.image.resize``),
  :func:`cast`, :func:`normalize`, :func:`flatten`, chained by :func:`compose`; every random
  piece draws from the key :func:`batch_key` ``(seed, epoch, step)``.

Example::

    from singa_jax import data
    loader = data.DeviceLoader(train_x, train_y, 128, shuffle=True, seed=0,
                               transform=data.compose(data.random_shift(4), data.random_flip(),
                                                      data.resize(224)))
    for epoch in range(epochs):
        batches = loader.epoch(epoch)
        for x, y in batches:                 # device arrays, already transformed
            tx.array, ty.array = x, y        # rebind the model's input Tensors: no host copy
            out, loss = model(tx, ty)
        print(f"waited {batches.wait_seconds:.2f} s for input")
"""
from singa_jax._src.data.image_batch_iter import ImageBatchIter as ImageBatchIter
from singa_jax._src.data.loader import DeviceLoader as DeviceLoader, EpochBatches as EpochBatches
from singa_jax._src.data.transforms import (
    Transform as Transform, Compose as Compose, RandomCrop as RandomCrop, RandomFlip as RandomFlip,
    Resize as Resize, Cast as Cast, Normalize as Normalize, Flatten as Flatten, compose as compose,
    random_crop as random_crop, random_shift as random_shift, random_flip as random_flip,
    resize as resize, cast as cast, normalize as normalize, flatten as flatten, crop_at as crop_at,
    flip_where as flip_where, batch_key as batch_key)
from singa_jax._src.base.public import publish as _publish

__all__ = [
    "ImageBatchIter", "DeviceLoader", "EpochBatches", "Transform", "Compose", "RandomCrop",
    "RandomFlip", "Resize", "Cast", "Normalize", "Flatten", "compose", "random_crop",
    "random_shift", "random_flip", "resize", "cast", "normalize", "flatten", "crop_at",
    "flip_where", "batch_key"]

_publish(__name__, __all__)
