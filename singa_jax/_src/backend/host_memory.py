"""glibc's malloc thresholds for XLA:CPU's buffers.

On CPU every array an XLA program outputs is a fresh host allocation. glibc's malloc serves a
large one (128 KiB at first) by ``mmap`` and returns it to the kernel when it is freed, and it
trims the heaps' free tops back to the kernel too. Its dynamic thresholds did not settle under
XLA:CPU's pattern (buffers allocated and freed step after step, on several threads): every new
buffer cost a page fault per 4 KiB page when first written. SINGA's eager MLP step (784-256-10, batch 64) took 300-400
faults and 2.1-2.4 ms; with the thresholds pinned, ~1 fault and 1.2-1.3 ms (LeNet's graph
step: ~1000 faults, 14.4 -> 13.1 ms). See docs/performance.md.

:func:`tune` pins them to the values glibc's own dynamic rule tops out at on 64-bit systems:
allocations below 32 MiB come from the heaps, and a heap keeps up to 64 MiB of free memory
on top. The process then keeps freed memory for reuse instead of faulting it back in (its
resident size stays within those bounds of its peak). It is called when singa_jax first
compiles for the CPU backend, once per process, and does nothing when:

* the C library is not glibc (macOS, Windows, musl), or
* ``SINGA_JAX_MALLOC_TUNING=0`` is set, or
* the user set glibc's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` (theirs
  stand).
"""
from __future__ import annotations

import ctypes
import os
import platform
from functools import lru_cache

from singa_jax._src.base.env import switched_off

__all__ = ["tune", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # glibc's dynamic rule: twice the mmap threshold
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@lru_cache(maxsize=None)
def tune() -> bool:
    """Pin glibc's mmap and trim thresholds (see the module docstring), once per process.
    Returns whether they are pinned by singa_jax. (Two threads racing here may both set
    them: the same values, so no harm.)"""
    if switched_off(os.environ.get("SINGA_JAX_MALLOC_TUNING", "")):
        return False
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success. Setting either threshold ends glibc's dynamic rule, and
    # one pinned alone measured worse than none: the mmap threshold (the one glibc may refuse)
    # goes first, and the trim threshold only after it was taken.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
