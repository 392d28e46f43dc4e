"""Device-side transforms of a batch: composable pieces that :class:`~.loader.DeviceLoader`
compiles into ONE jitted function and runs on the device, ahead of the training step.

Every piece is a pure function ``piece(key, batch) -> batch`` of a ``jax.random`` key and a
batch whose first axis is the batch (images in SINGA's NCHW layout: the last two axes are
height and width). Random pieces draw one value per example (a crop offset, a flip) from the
key, so a batch's augmentation depends only on the key -- the loader derives it from
``(seed, epoch, step)`` (:func:`batch_key`) -- never on the batch's placement, the prefetch
depth or thread timing. Shapes are checked when the transform is traced (the loader traces
and compiles it when it is built): a bad piece raises ``ValueError`` naming itself and the
shapes it got.

    transform = compose(random_shift(4), random_flip(), resize(224), cast('float16'))
    x = jax.jit(transform)(batch_key(0, epoch, step), x)   # what the loader does

``crop_at`` and ``flip_where`` are the deterministic forms the random pieces apply to their
draws (``RandomCrop.draw``, ``RandomFlip.draw``), for tests and custom pieces.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Transform", "Compose", "RandomCrop", "RandomFlip", "Resize", "Cast", "Normalize",
           "Flatten", "compose", "random_crop", "random_shift", "random_flip", "resize", "cast",
           "normalize", "flatten", "crop_at", "flip_where", "batch_key"]

PAD_MODES = ("constant", "symmetric", "reflect", "edge")
Size = Union[int, Tuple[int, int]]


def batch_key(seed: Any, epoch: Any, step: Any) -> jax.Array:
    """The ``jax.random`` key of batch ``step`` of ``epoch`` for ``seed``: the same wherever and
    whenever the batch is made (traced or concrete arguments)."""
    key = jax.random.PRNGKey(seed)
    return jax.random.fold_in(jax.random.fold_in(key, epoch), step)


def _pair(size: Size, what: str) -> Tuple[int, int]:
    pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(pair) != 2 or any(not isinstance(s, (int, np.integer)) or s < 1 for s in pair):
        raise ValueError(f"{what}: size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


class Transform:
    """A device-side piece: ``piece(key, x) -> x``. ``random`` says whether it reads ``key``
    (:class:`Compose` gives every random piece its own key)."""

    random: bool = False

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        raise NotImplementedError

    def _need_images(self, x: Any) -> None:
        if x.ndim < 3:
            raise ValueError(f"{self!r}: needs a batch of images (N, ..., H, W), got shape "
                             f"{tuple(x.shape)} ({x.dtype})")


class Compose(Transform):
    """The pieces applied in order; random piece ``i`` gets ``fold_in(key, i)``."""

    def __init__(self, pieces: Sequence[Callable[[jax.Array, jax.Array], jax.Array]]):
        self.pieces = tuple(pieces)
        for p in self.pieces:
            if not callable(p):
                raise TypeError(f"compose: every piece must be callable (key, x) -> x, got "
                                f"{type(p).__name__}")
        self.random = any(getattr(p, "random", True) for p in self.pieces)

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        for i, piece in enumerate(self.pieces):
            x = piece(jax.random.fold_in(key, i) if getattr(piece, "random", True) else key, x)
        return x

    def __repr__(self) -> str:
        return f"compose({', '.join(map(repr, self.pieces))})"


def compose(*pieces: Callable[[jax.Array, jax.Array], jax.Array]) -> Compose:
    """One transform applying ``pieces`` in order (a callable ``(key, x) -> x`` counts as a
    random piece unless it has ``random = False``)."""
    return Compose(pieces)


# --------------------------------------------------------------------------------------------
# crops and shifts
# --------------------------------------------------------------------------------------------
def _pad_spatial(x: jax.Array, pad: int, mode: str) -> jax.Array:
    widths = [(0, 0)] * (x.ndim - 2) + [(pad, pad), (pad, pad)]
    return jnp.pad(x, widths, mode=mode) if pad else x


def crop_at(x: jax.Array, offsets: jax.Array, size: Optional[Size] = None, pad: int = 0,
            mode: str = "constant") -> jax.Array:
    """Each image of ``x`` (N, ..., H, W) padded by ``pad`` pixels on every side (``mode`` as in
    ``numpy.pad``) and cropped to ``size`` (default: H x W) at its ``offsets`` row
    ``(top, left)`` in the padded image (``offsets``: (N, 2) integers)."""
    height, width = x.shape[-2:]
    out_h, out_w = (height, width) if size is None else _pair(size, "crop_at")
    padded = _pad_spatial(x, pad, mode)

    def one(image: jax.Array, at: jax.Array) -> jax.Array:
        start = (0,) * (image.ndim - 2) + (at[0], at[1])
        return jax.lax.dynamic_slice(image, start, image.shape[:-2] + (out_h, out_w))

    return jax.vmap(one)(padded, offsets.astype(jnp.int32))


class RandomCrop(Transform):
    """Pad every image by ``pad`` pixels (``mode``: constant zeros, symmetric, reflect, edge)
    and crop a random ``size`` window (default: the input's H x W, i.e. a random shift of up
    to ``pad`` pixels each way), one offset per image."""

    random = True

    def __init__(self, size: Optional[Size] = None, pad: int = 0, mode: str = "constant"):
        if mode not in PAD_MODES:
            raise ValueError(f"random_crop: mode must be one of {PAD_MODES}, got {mode!r}")
        if int(pad) != pad or pad < 0:
            raise ValueError(f"random_crop: pad must be an int >= 0, got {pad!r}")
        self.size = None if size is None else _pair(size, "random_crop")
        self.pad, self.mode = int(pad), mode

    def _window(self, x: Any) -> Tuple[int, int, int, int]:
        """(window height, width, padded height, width), checked against ``x``'s shape."""
        self._need_images(x)
        padded_h, padded_w = x.shape[-2] + 2 * self.pad, x.shape[-1] + 2 * self.pad
        out_h, out_w = x.shape[-2:] if self.size is None else self.size
        if out_h > padded_h or out_w > padded_w:
            raise ValueError(f"{self!r}: crop {out_h}x{out_w} is larger than the padded images "
                             f"{padded_h}x{padded_w} (input shape {tuple(x.shape)})")
        if self.mode == "reflect" and self.pad >= min(x.shape[-2:]):
            raise ValueError(f"{self!r}: reflect padding of {self.pad} needs images larger "
                             f"than that, got shape {tuple(x.shape)}")
        return out_h, out_w, padded_h, padded_w

    def draw(self, key: jax.Array, x: Any) -> jax.Array:
        """The (N, 2) offsets ``(top, left)`` this piece crops ``x`` at for ``key``."""
        out_h, out_w, padded_h, padded_w = self._window(x)
        limits = jnp.array([padded_h - out_h + 1, padded_w - out_w + 1], jnp.int32)
        return jax.random.randint(key, (x.shape[0], 2), 0, limits, dtype=jnp.int32)

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        return crop_at(x, self.draw(key, x), self.size, self.pad, self.mode)

    def __repr__(self) -> str:
        return f"random_crop(size={self.size}, pad={self.pad}, mode={self.mode!r})"


def random_crop(size: Optional[Size] = None, pad: int = 0, mode: str = "constant"
                ) -> RandomCrop:
    """See :class:`RandomCrop`."""
    return RandomCrop(size, pad, mode)


def random_shift(max_shift: int, mode: str = "symmetric") -> RandomCrop:
    """Shift every image by up to ``max_shift`` pixels each way (pad by ``max_shift`` with
    ``mode``, crop back to the input size at a random offset): SINGA's CIFAR augmentation with
    ``max_shift=4`` and symmetric padding."""
    return RandomCrop(None, max_shift, mode)


# --------------------------------------------------------------------------------------------
# flips
# --------------------------------------------------------------------------------------------
def flip_where(x: jax.Array, mask: jax.Array, axis: int = -1) -> jax.Array:
    """``x`` with the images whose ``mask`` entry is true reversed along ``axis``."""
    mask = mask.reshape((x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(mask, jnp.flip(x, axis), x)


class RandomFlip(Transform):
    """Reverse each image along ``axis`` (default -1: a horizontal flip of NCHW images) with
    probability ``p``."""

    random = True

    def __init__(self, p: float = 0.5, axis: int = -1):
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"random_flip: p must be in [0, 1], got {p!r}")
        if int(axis) == 0:
            raise ValueError("random_flip: axis 0 is the batch; pick an image axis (-1: width)")
        self.p, self.axis = float(p), int(axis)

    def draw(self, key: jax.Array, x: Any) -> jax.Array:
        """The (N,) booleans: which images of ``x`` this piece flips for ``key``."""
        if not -x.ndim < self.axis < x.ndim:
            raise ValueError(f"{self!r}: axis {self.axis} is out of range for shape "
                             f"{tuple(x.shape)}")
        return jax.random.bernoulli(key, self.p, (x.shape[0],))

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        return flip_where(x, self.draw(key, x), self.axis)

    def __repr__(self) -> str:
        return f"random_flip(p={self.p}, axis={self.axis})"


def random_flip(p: float = 0.5, axis: int = -1) -> RandomFlip:
    """See :class:`RandomFlip`."""
    return RandomFlip(p, axis)


# --------------------------------------------------------------------------------------------
# deterministic pieces
# --------------------------------------------------------------------------------------------
class Resize(Transform):
    """Resample every image to ``size`` (H x W) with ``jax.image.resize`` (``method``:
    'bilinear', 'nearest', 'bicubic', 'lanczos3', ...; ``antialias`` matters when shrinking).
    Bilinear with pixel centres aligned, as SINGA's PIL resize and NumPy's separable form."""

    def __init__(self, size: Size, method: str = "bilinear", antialias: bool = True):
        self.size = _pair(size, "resize")
        self.method, self.antialias = method, bool(antialias)

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        self._need_images(x)
        if tuple(x.shape[-2:]) == self.size:
            return x
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{self!r}: needs floating-point images, got {x.dtype}; cast "
                             f"them first (cast('float32'))")
        shape = tuple(x.shape[:-2]) + self.size
        return jax.image.resize(x, shape, self.method, antialias=self.antialias)

    def __repr__(self) -> str:
        return f"resize({self.size}, {self.method!r})"


def resize(size: Size, method: str = "bilinear", antialias: bool = True) -> Resize:
    """See :class:`Resize`."""
    return Resize(size, method, antialias)


class Cast(Transform):
    """Convert the batch to ``dtype``."""

    def __init__(self, dtype: Any):
        try:
            self.dtype = jnp.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"cast: {dtype!r} is not a dtype") from e

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        return x.astype(self.dtype)

    def __repr__(self) -> str:
        return f"cast({self.dtype.name!r})"


def cast(dtype: Any) -> Cast:
    """See :class:`Cast`."""
    return Cast(dtype)


class Normalize(Transform):
    """``(x - mean) / std`` per channel (axis 1), in float32 unless ``x`` is floating."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = np.asarray(mean, np.float32).reshape(-1)
        self.std = np.asarray(std, np.float32).reshape(-1)
        if self.mean.shape != self.std.shape or np.any(self.std == 0):
            raise ValueError(f"normalize: mean and std need one non-zero std per mean, got "
                             f"{self.mean.tolist()} and {self.std.tolist()}")

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        if x.ndim < 2 or x.shape[1] != self.mean.size:
            raise ValueError(f"{self!r}: needs {self.mean.size} channels on axis 1, got shape "
                             f"{tuple(x.shape)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.float32)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = jnp.asarray(self.mean, x.dtype).reshape(shape)
        std = jnp.asarray(self.std, x.dtype).reshape(shape)
        return (x - mean) / std

    def __repr__(self) -> str:
        return f"normalize({self.mean.tolist()}, {self.std.tolist()})"


def normalize(mean: Sequence[float], std: Sequence[float]) -> Normalize:
    """See :class:`Normalize`."""
    return Normalize(mean, std)


class Flatten(Transform):
    """Every example as one row: (N, ...) -> (N, prod(...)) (the input of an MLP)."""

    def __call__(self, key: jax.Array, x: jax.Array) -> jax.Array:
        return x.reshape(x.shape[0], -1)

    def __repr__(self) -> str:
        return "flatten()"


def flatten() -> Flatten:
    """See :class:`Flatten`."""
    return Flatten()
