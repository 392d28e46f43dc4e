"""singa_jax: Apache SINGA's Python API on JAX (CPU, GPU and TPU through XLA).

``from singa_jax import tensor, device, autograd, layer, model, opt`` as SINGA's
``from singa import ...``; ``python -m singa_jax.run script.py`` runs an unmodified SINGA
program, and :func:`install_as_singa` makes ``import singa`` resolve here in this process.

Importing singa_jax turns on JAX's persistent compilation cache in a user cache folder
(``$XDG_CACHE_HOME/singa_jax/xla``, by default ``~/.cache/singa_jax/xla``), so a second run of
the same program loads its compiled steps instead of compiling them again;
``SINGA_JAX_COMPILATION_CACHE=0`` turns this off, any other value names the folder, and a cache
folder already chosen for JAX (``JAX_COMPILATION_CACHE_DIR``) is left alone. It also registers
an exit hook that waits for work still computing on any started backend before JAX shuts down
(a run ending while its last step computes would otherwise sometimes die with SIGSEGV at
exit). Only JAX's configuration is touched: no backend is started at import.
"""
import typing as _typing

from singa_jax._src.backend import compilation_cache as _compilation_cache
from singa_jax._src.backend import shutdown as _shutdown

# after ``import jax``, which registers JAX's own exit hooks: atexit runs this one before them
_shutdown.install()
_compilation_cache.use()

from singa_jax import device, tensor, autograd  # noqa: F401,E402
from singa_jax._src import debug as _debug  # noqa: F401,E402  (time profiling and the tools)

if _typing.TYPE_CHECKING:
    from singa_jax import run


def install_as_singa(cuda_fallback: bool = True) -> "run.SingaAliasFinder":
    """Make ``import singa`` resolve to singa_jax in this process (see ``singa_jax.run``)."""
    # imported on call: importing singa_jax.run here would make ``python -m singa_jax.run``
    # warn that the module was already imported before runpy executes it
    from singa_jax.run import install_as_singa as install
    return install(cuda_fallback)


__version__ = "0.1.0"
