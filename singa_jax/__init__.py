"""singa_jax: Apache SINGA's Python API on JAX (CPU, GPU and TPU through XLA).

Importing singa_jax turns on JAX's persistent compilation cache in a user cache folder
(``$XDG_CACHE_HOME/singa_jax/xla``, by default ``~/.cache/singa_jax/xla``), so a second run of
the same program loads its compiled steps instead of compiling them again (see
docs/performance.md). ``SINGA_JAX_COMPILATION_CACHE=0`` turns this off, any other value names the
folder; a cache folder already chosen for JAX (``JAX_COMPILATION_CACHE_DIR``) is left alone. In
the folder singa_jax chooses, every program is cached, however quickly it compiled (JAX's
default keeps only those that took 1 s; ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` still
rules when set). Only JAX's configuration is touched: no backend is started at import.

Importing singa_jax also registers an exit hook that waits for work still computing on any
started backend before JAX shuts down (see ``singa_jax._shutdown``): a run that ends while its
last step computes would otherwise sometimes die with SIGSEGV at exit.
"""
import os as _os
import typing as _typing

import jax as _jax

from . import _shutdown
from .host_memory import switched_off as _switched_off

# after ``import jax``, which registers JAX's own exit hooks: atexit runs this one before them
_shutdown.install()

COMPILATION_CACHE_ENV = "SINGA_JAX_COMPILATION_CACHE"


def _compilation_cache_folder() -> "str | None":
    """The folder for JAX's persistent compilation cache, or None to leave JAX's setting."""
    setting = _os.environ.get(COMPILATION_CACHE_ENV, "").strip()
    if _switched_off(setting):
        return None
    if _jax.config.jax_compilation_cache_dir:  # the user (or JAX_COMPILATION_CACHE_DIR) chose
        return None
    if setting and setting.lower() not in ("1", "true", "on", "yes"):
        return setting
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "singa_jax", "xla")


def _use_compilation_cache() -> None:
    folder = _compilation_cache_folder()
    if folder is None:
        return
    try:
        _os.makedirs(folder, exist_ok=True)
    except OSError:  # a read-only home: run without the cache rather than fail at import
        return
    _jax.config.update("jax_compilation_cache_dir", folder)
    # Cache every program, not only those that took JAX's default 1 s to compile: compile()
    # draws each parameter with a small kernel per shape (~20 ms to compile, ~70 of them for a
    # ResNet-50), and a re-run should load those too (compile() 3.0 s -> 1.3 s warm).
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in _os.environ:
        _jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


_use_compilation_cache()

from . import device, tensor, autograd  # noqa: F401

if _typing.TYPE_CHECKING:
    from . import run


def install_as_singa(cuda_fallback: bool = True) -> "run.SingaAliasFinder":
    """Make ``import singa`` resolve to singa_jax in this process (see ``singa_jax.run``)."""
    # imported on call: importing singa_jax.run here would make ``python -m singa_jax.run``
    # warn that the module was already imported before runpy executes it
    from .run import install_as_singa as install
    return install(cuda_fallback)


__version__ = "0.1.0"
