"""SINGA's ``data`` module, and a device-side input pipeline.

* :class:`ImageBatchIter` -- SINGA's loader of an image list file, prefetching mini-batches of
  host arrays on a background worker (:mod:`.image_batch_iter`).
* :class:`DeviceLoader` -- batches of a dataset (NumPy arrays, or an iterable of host batches
  such as an ``ImageBatchIter``) made on a background thread, put on the device (or split over
  several devices) and transformed there -- augmentation, resizing, casting as ONE jitted
  function -- ``prefetch`` batches ahead of the training loop (:mod:`.loader`).
* The device-side transform pieces (:mod:`.transforms`): :func:`random_shift`,
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
from .image_batch_iter import ImageBatchIter
from .loader import DeviceLoader, EpochBatches
from .transforms import (Cast, Compose, Flatten, Normalize, RandomCrop, RandomFlip, Resize,
                         Transform, batch_key, cast, compose, crop_at, flatten, flip_where,
                         normalize, random_crop, random_flip, random_shift, resize)

__all__ = ["ImageBatchIter", "DeviceLoader", "EpochBatches", "Transform", "Compose",
           "RandomCrop", "RandomFlip", "Resize", "Cast", "Normalize", "Flatten", "compose",
           "random_crop", "random_shift", "random_flip", "resize", "cast", "normalize",
           "flatten", "crop_at", "flip_where", "batch_key"]
