"""JAX's persistent compilation cache, turned on at import in a user cache folder
(``$XDG_CACHE_HOME/singa_jax/xla``, by default ``~/.cache/singa_jax/xla``): a second run of the
same program loads its compiled steps instead of compiling them again.
``SINGA_JAX_COMPILATION_CACHE=0`` turns this off, any other value names the folder; a folder
already chosen for JAX (``JAX_COMPILATION_CACHE_DIR``) is left alone. Only JAX's configuration
is touched: no backend is started."""
from __future__ import annotations

import os
from typing import Optional

import jax

from singa_jax._src.base.env import switched_off

ENV = "SINGA_JAX_COMPILATION_CACHE"


def folder() -> Optional[str]:
    """The folder for JAX's persistent compilation cache, or None to leave JAX's setting."""
    setting = os.environ.get(ENV, "").strip()
    if switched_off(setting):
        return None
    if jax.config.jax_compilation_cache_dir:  # the user (or JAX_COMPILATION_CACHE_DIR) chose
        return None
    if setting and setting.lower() not in ("1", "true", "on", "yes"):
        return setting
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "singa_jax", "xla")


def use() -> None:
    """Point JAX's persistent compilation cache at :func:`folder` (at import)."""
    path = folder()
    if path is None:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # a read-only home: run without the cache rather than fail at import
        return
    jax.config.update("jax_compilation_cache_dir", path)
    # Cache every program, not only those that took JAX's default 1 s to compile: compile()
    # draws each parameter with a small kernel per shape (~20 ms to compile, ~70 of them for a
    # ResNet-50), and a re-run should load those too (compile() 3.0 s -> 1.3 s warm).
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

