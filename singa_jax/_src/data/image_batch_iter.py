"""SINGA's :class:`ImageBatchIter` loads and prefetches mini-batches of images
listed in a text file, on a background worker feeding a bounded queue.

SINGA runs the worker as a ``multiprocessing.Process``; here it is a daemon thread (forking a
process that has started JAX's runtime is unsafe, and image decoding releases the GIL), with
the same queue of at most ``capacity`` batches. Errors raised by ``image_transform`` in the
worker are re-raised by the next ``next()`` call instead of leaving it waiting.

Example::

    def image_transform(path):             # returns a list of (augmented) images
        return [PIL.Image.open(path)]      # PIL images, or H x W (x C) NumPy arrays
    it = ImageBatchIter('train.txt', 32, image_transform, image_folder='images/')
    it.start()
    x, y = next(it)                        # x: (32, 3, H, W) float32, y: (32,) int32
    it.end()
"""
from __future__ import annotations

import os
import queue
import random
import threading
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

__all__ = ["ImageBatchIter"]

_POLL_SECONDS = 0.1  # how often a blocked worker or reader re-checks for end()/errors


def _to_chw(img: Any, path: str) -> np.ndarray:
    """An image as a float32 (3, H, W) RGB array: a PIL image is converted to RGB (SINGA calls
    ``img.convert('RGB')``); a NumPy array may be H x W (grey), H x W x 1, 3 or 4 (alpha
    dropped)."""
    if hasattr(img, "convert"):
        img = img.convert("RGB")
    ary = np.asarray(img, dtype=np.float32)
    if ary.ndim == 2:
        ary = ary[:, :, None]
    if ary.ndim != 3 or ary.shape[2] not in (1, 3, 4):
        raise ValueError(f"ImageBatchIter: image_transform({path!r}) gave an image of shape "
                         f"{ary.shape}; expected H x W, or H x W x 1/3/4")
    if ary.shape[2] == 1:
        ary = np.repeat(ary, 3, axis=2)
    return ary[:, :, :3].transpose(2, 0, 1)


class ImageBatchIter:
    """Iterates over an image list file in mini-batches.

    Args:
        img_list_file: a text file, one image per line: ``path_suffix<delimiter>meta``. When
            every meta is an integer, labels come as an int32 array; otherwise as a list of the
            meta strings (None where a line has none).
        batch_size: images per mini-batch.
        image_transform: ``f(full_path) -> list of images`` (augmented copies count towards the
            batch).
        shuffle: shuffle the list at start and after every pass.
        delimiter: separator between path and meta.
        image_folder: prefix joined to every path (None: the paths are used as they are).
        capacity: the most mini-batches kept ready in the queue.
    """

    def __init__(self, img_list_file: str, batch_size: int,
                 image_transform: Callable[[str], List[Any]], shuffle: bool = True,
                 delimiter: str = " ", image_folder: Optional[str] = None, capacity: int = 10):
        if int(batch_size) < 1 or int(capacity) < 1:
            raise ValueError(f"ImageBatchIter: batch_size and capacity must be >= 1, got "
                             f"{batch_size} and {capacity}")
        if not callable(image_transform):
            raise TypeError("ImageBatchIter: image_transform must be callable (path -> list of "
                            "images)")
        self.img_list_file = img_list_file
        self.queue: "queue.Queue[Tuple[np.ndarray, Any]]" = queue.Queue(int(capacity))
        self.batch_size = int(batch_size)
        self.image_transform = image_transform
        self.shuffle = shuffle
        self.delimiter = delimiter
        self.image_folder = image_folder
        self.stop = False
        self.p: Optional[threading.Thread] = None
        self._stop_event = threading.Event()
        self._error: Optional[BaseException] = None
        self.img_list, self.is_label_index = self._read_list()
        self.num_samples = len(self.img_list)
        if self.num_samples == 0:
            raise ValueError(f"ImageBatchIter: {img_list_file} lists no images")

    def _read_list(self) -> Tuple[List[Tuple[str, Optional[str]]], bool]:
        img_list, is_label_index = [], True
        with open(self.img_list_file, "r") as fd:
            for line in fd:
                if not line.strip():
                    continue  # blank lines (a trailing newline) list no image
                item = line.strip("\n").split(self.delimiter)
                if len(item) < 2:
                    is_label_index = False
                    img_list.append((item[0].strip(), None))
                else:
                    meta = item[1].strip()
                    is_label_index = is_label_index and meta.isdigit()
                    img_list.append((item[0].strip(), meta))
        return img_list, is_label_index

    def start(self) -> None:
        """Start the background worker that fills the queue."""
        if self.p is not None and self.p.is_alive():
            raise RuntimeError("ImageBatchIter.start: already started")
        self.stop = False
        self._stop_event.clear()
        self._error = None
        self.p = threading.Thread(target=self._run_guarded, name="ImageBatchIter", daemon=True)
        self.p.start()

    def __iter__(self) -> "ImageBatchIter":
        return self

    def __next__(self) -> Tuple[np.ndarray, Any]:
        """The next mini-batch ``(x, y)``: x is (batch, 3, H, W) float32."""
        if self.p is None:
            raise RuntimeError("ImageBatchIter: call start() before next()")
        while True:
            try:
                return self.queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._error is not None:
                    raise RuntimeError(f"ImageBatchIter: the loader failed: "
                                       f"{self._error}") from self._error
                if not self.p.is_alive():
                    raise RuntimeError("ImageBatchIter: the loader has stopped (end() was "
                                       "called); call start() again")

    next = __next__  # SINGA's docstring calls data.next()

    def end(self) -> None:
        """Stop the worker and wait for it to exit."""
        if self.p is None:
            return
        self.stop = True
        self._stop_event.set()
        self.p.join()

    def _run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as e:  # handed to the reader, which re-raises it
            self._error = e

    def _full_path(self, path: str) -> str:
        return path if self.image_folder is None else os.path.join(self.image_folder, path)

    def _next_batch(self, order: List[Tuple[str, Optional[str]]], index: int
                    ) -> Tuple[Tuple[np.ndarray, Any], int]:
        x, y = [], []
        while len(x) < self.batch_size:
            img_path, img_meta = order[index]
            full = self._full_path(img_path)
            aug_images = self.image_transform(full)
            if len(x) + len(aug_images) > self.batch_size:
                raise ValueError(f"ImageBatchIter: too many images ({len(x) + len(aug_images)}) "
                                 f"in a batch ({self.batch_size}) from {full!r}")
            for img in aug_images:
                x.append(_to_chw(img, full))
                y.append(int(img_meta) if self.is_label_index else img_meta)
            index += 1
            if index == self.num_samples:
                index = 0
                if self.shuffle:
                    random.shuffle(order)
        shapes = {a.shape for a in x}
        if len(shapes) > 1:
            raise ValueError(f"ImageBatchIter: the images of a batch differ in shape "
                             f"{sorted(shapes)}; make image_transform resize/crop them")
        labels = np.asarray(y, dtype=np.int32) if self.is_label_index else y
        return (np.stack(x), labels), index

    def run(self) -> None:
        """The worker loop: build batches in list order (shuffled per pass) until end()."""
        order = list(self.img_list)
        if self.shuffle:
            random.shuffle(order)
        index = 0
        while not self._stop_event.is_set():
            batch, index = self._next_batch(order, index)
            while not self._stop_event.is_set():
                try:
                    self.queue.put(batch, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
