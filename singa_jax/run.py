"""Run an unmodified SINGA program on singa_jax: ``python -m singa_jax.run script.py [args]``.

For the run, an import hook makes ``import singa``, ``from singa import tensor, ...``,
``singa.singa_wrap`` and ``from singa import singa_wrap as singa`` resolve to singa_jax's
modules; nothing is installed under the name ``singa``. The script runs as ``__main__`` with
``sys.argv = [script, *args]`` and its directory first on ``sys.path``, as ``python script.py``
would run it. SINGA's ``device.create_cuda_gpu*()`` calls fall back to the default device with a
warning (the runner sets ``SINGA_JAX_CUDA_FALLBACK=1``, which singa_jax.device reads).

In a notebook, ``singa_jax.install_as_singa()`` installs the same hook.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from types import ModuleType
from typing import List, Optional, Sequence

__all__ = ["install_as_singa", "uninstall_singa_alias", "main", "CUDA_FALLBACK_ENV"]

ALIAS = "singa"
TARGET = "singa_jax"
CUDA_FALLBACK_ENV = "SINGA_JAX_CUDA_FALLBACK"


class _AliasLoader(importlib.abc.Loader):
    """Loads ``singa.X`` as the already importable ``singa_jax.X`` (the same module object)."""

    def __init__(self, target: str):
        self.target = target
        self._own_spec = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # importlib has just set module.__spec__ to the alias's spec; the module stays singa_jax's
        module.__spec__ = self._own_spec


class SingaAliasFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder mapping ``singa`` and ``singa.*`` onto ``singa_jax``."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(
                f"SINGA's module {fullname!r} is not provided by singa_jax (looked for "
                f"{real!r}); see docs/porting.md for what is covered", name=fullname)
        is_package = importlib.util.find_spec(real).submodule_search_locations is not None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real),
                                               is_package=is_package)


def install_as_singa(cuda_fallback: bool = True) -> SingaAliasFinder:
    """Make ``import singa`` (and ``singa.*``) resolve to singa_jax in this process.

    Idempotent. With ``cuda_fallback`` (the default), SINGA's ``create_cuda_gpu*()`` give the
    default device with a warning when JAX has no accelerator, as SINGA's examples tell CPU users
    to edit by hand. Raises RuntimeError when another module named ``singa`` (the real SINGA) is
    already imported.
    """
    loaded = sys.modules.get(ALIAS)
    if loaded is not None and getattr(loaded, "__name__", None) != TARGET:
        raise RuntimeError(f"install_as_singa: a module named 'singa' ({loaded!r}) is already "
                           f"imported; call install_as_singa() before importing SINGA")
    if cuda_fallback:
        os.environ[CUDA_FALLBACK_ENV] = "1"
    for finder in sys.meta_path:
        if isinstance(finder, SingaAliasFinder):
            return finder
    finder = SingaAliasFinder()
    sys.meta_path.insert(0, finder)
    return finder


def uninstall_singa_alias() -> None:
    """Remove the hook and forget the ``singa`` names it created (singa_jax stays imported)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, SingaAliasFinder)]
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        if getattr(sys.modules[name], "__name__", "").startswith(TARGET):
            del sys.modules[name]


USAGE = "usage: python -m singa_jax.run script.py [args ...]"


def main(argv: Optional[List[str]] = None) -> None:
    """Run ``argv[0]`` (a SINGA script) as ``__main__`` with ``argv[1:]`` as its arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or "").strip())
        raise SystemExit(0 if argv else 2)
    script = argv[0]
    if not os.path.isfile(script):
        print(f"singa_jax.run: no such script: {script}\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    install_as_singa(cuda_fallback=True)
    sys.argv = [script] + argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
