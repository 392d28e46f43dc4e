"""DeviceLoader internals: its worker thread and transform application. (This tier imports
singa_jax._src.)"""
import gc
import threading
import jax
import numpy as np
from singa_jax import data
from test_data_pipeline import images  # noqa: F401 (fixtures too)


def test_the_transform_program_lowers_for_gpu_and_tpu():
    """No GPU or TPU here: the loader's jitted transform (key derivation, shift, flip, resize,
    cast) is lowered for them with jax.export, as the examples' steps are (test_lowering)."""
    loader = data.DeviceLoader(images(n=16, h=8, w=8), None, 8, transform=data.compose(
        data.random_shift(2), data.random_flip(), data.resize(32), data.cast('bfloat16')))
    exported = jax.export.export(jax.jit(loader._apply), platforms=("cuda", "tpu"))(
        jax.ShapeDtypeStruct((3,), np.uint32), jax.ShapeDtypeStruct((8, 2, 8, 8), np.float32))
    assert exported.platforms == ("cuda", "tpu")
    assert exported.out_avals[0].shape == (8, 2, 32, 32)


def test_close_and_dropping_an_epoch_stop_its_thread():
    x = np.zeros((64, 3), np.float32)
    loader = data.DeviceLoader(x, None, 4, prefetch=2)
    batches = loader.epoch(0)
    next(batches)
    thread = batches._worker.thread
    batches.close()  # the thread was blocked on the full queue
    assert not thread.is_alive()
    dropped = loader.epoch(1)
    next(dropped)
    thread = dropped._worker.thread
    del dropped
    gc.collect()
    thread.join(2.0)
    assert not thread.is_alive()
    assert not any(t.name.startswith("DeviceLoader") for t in threading.enumerate())
