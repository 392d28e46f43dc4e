"""SINGA's ``ImageBatchIter`` and singa_jax's ``DeviceLoader``: batches made on a background
thread, put on the device or split over a mesh, transformed there."""
