"""Run an unmodified SINGA program on singa_jax: ``python -m singa_jax.run script.py [args]``, or
``python -m singa_jax.run -m module [args]`` for a program launched as a module.

For the run, an import hook makes ``import singa``, ``from singa import tensor, ...``,
``singa.singa_wrap`` and ``from singa import singa_wrap as singa`` resolve to singa_jax's public
modules; nothing is installed under the name ``singa``. The script runs as ``python script.py``
would run it: in a fresh ``__main__`` module with ``__file__`` its absolute path, ``sys.argv =
[script, *args]``, its (real) folder in place of the working folder at ``sys.path[0]``, and the
same exit status (``sys.exit(n)``, 1 after an uncaught exception, whose traceback shows the
script's frames only, death by SIGINT after an uncaught KeyboardInterrupt). A module runs as
``python -m module`` would run it: its parent packages imported first, ``sys.argv[0]`` its
file, the working folder first on ``sys.path``, ``__spec__`` its spec, a package's
``__main__`` submodule. SINGA's ``device.create_cuda_gpu*()`` calls fall back to the default
device with a warning (the runner sets ``SINGA_JAX_CUDA_FALLBACK=1``, which the device module
reads).

In a notebook, ``singa_jax.install_as_singa()`` installs the same hook.
"""
from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import sys
from types import CodeType, ModuleType, TracebackType
from typing import Callable, List, Optional, Sequence, Type

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
        # only singa_jax's public modules: never its implementation (singa_jax._src)
        if any(part.startswith("_") for part in fullname.split(".")[1:]) or \
                importlib.util.find_spec(real) is None:
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


USAGE = "usage: python -m singa_jax.run script.py [args ...]  |  -m module [args ...]"


class _ScriptTraceback:
    """``sys.excepthook`` for the run: reports an uncaught exception from the script's first
    frame on, as ``python script.py`` does, without the runner's frames above it."""

    def __init__(self, hook: Callable[..., None]):
        self.hook = hook
        self.code: Optional[CodeType] = None  # the script's; None until it compiled

    def __call__(self, kind: Type[BaseException], value: BaseException,
                 tb: Optional[TracebackType]) -> None:
        if self.code is None:  # the script did not compile: Python prints no frames for that
            tb = None
        else:
            frame = tb
            while frame is not None and frame.tb_frame.f_code is not self.code:
                frame = frame.tb_next
            tb = tb if frame is None else frame  # raised in the runner itself: keep it all
        if isinstance(value, BaseException):  # the default hook prints value.__traceback__
            value = value.with_traceback(tb)
        self.hook(kind, value, tb)


def _run_script(script: str, args: Sequence[str], path0_is_cwd: bool = False) -> None:
    """Run the file ``script`` as ``python script args...`` would, in this process.

    ``path0_is_cwd``: ``sys.path[0]`` is the working folder that ``python -m`` put there, which
    ``python script.py`` would not have: the script's folder replaces it instead of going before
    it. Uncaught exceptions propagate (``SystemExit`` and ``KeyboardInterrupt`` included), so
    the interpreter ends the process with the status it gives ``python script.py``.
    """
    # python gives __main__ the script path joined to the working folder, not normalised,
    # and resolves symbolic links only for sys.path[0]; a SINGA example reaching a sibling
    # folder with os.path.dirname(__file__) + '/..' needs the former to be absolute
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    hook = _ScriptTraceback(sys.excepthook)
    sys.excepthook = hook
    with io.open_code(path) as f:
        source = f.read()
    # dont_inherit: this module's ``from __future__`` imports must not reach the script
    hook.code = compile(source, path, "exec", dont_inherit=True)
    sys.argv = [script, *args]
    if not sys.flags.safe_path:  # python -P adds no folder of the script
        folder = os.path.dirname(os.path.realpath(path))
        if path0_is_cwd and sys.path:
            sys.path[0] = folder
        else:
            sys.path.insert(0, folder)
    main_module = ModuleType("__main__")
    main_module.__dict__.update(
        __file__=path, __cached__=None, __package__=None, __spec__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __builtins__=builtins)
    # kept after the script returns, as under python: atexit handlers, threads and pickling
    # by reference still find the script's module as __main__
    sys.modules["__main__"] = main_module
    exec(hook.code, main_module.__dict__)


def _run_module(name: str, args: Sequence[str]) -> None:
    """Run the module ``name`` as ``python -m name args...`` would, in this process: its parent
    packages imported first, the code run in a fresh ``__main__`` whose ``__spec__`` is the
    module's (a package runs its ``__main__`` submodule), ``sys.argv[0]`` the module's file.
    ``sys.path[0]`` is already the working folder (this runner was started with ``-m``)."""
    def fail(message: str) -> None:
        print(f"{sys.executable}: {message}", file=sys.stderr)
        raise SystemExit(1)

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:  # a parent package missing, or an empty name
        fail(f"Error while finding module specification for {name!r} "
             f"({type(e).__name__}: {e})")
    if spec is None:
        fail(f"No module named {name}")
    if spec.submodule_search_locations is not None:  # a package: its __main__
        main_name = name + ".__main__"
        spec = importlib.util.find_spec(main_name)
        if spec is None:
            fail(f"No module named {main_name}; '{name}' is a package and cannot be directly "
                 f"executed")
    code = spec.loader.get_code(spec.name) if spec.loader is not None else None
    if code is None:
        fail(f"No code object available for {spec.name}")
    hook = _ScriptTraceback(sys.excepthook)
    hook.code = code
    sys.excepthook = hook
    sys.argv = [spec.origin or spec.name, *args]
    main_module = ModuleType("__main__")
    main_module.__dict__.update(
        __file__=spec.origin, __cached__=spec.cached, __package__=spec.parent, __spec__=spec,
        __loader__=spec.loader, __builtins__=builtins)
    sys.modules["__main__"] = main_module
    exec(code, main_module.__dict__)


def main(argv: Optional[List[str]] = None) -> None:
    """Run ``argv[0]`` (a SINGA script) as ``__main__`` with ``argv[1:]`` as its arguments
    (``-m module args``: the module, as ``python -m`` runs it)."""
    # started as ``python -m singa_jax.run``: this module is __main__ and -m put the working
    # folder first on sys.path (unless -P)
    from_command_line = argv is None and __name__ == "__main__"
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or "").strip())
        raise SystemExit(0 if argv else 2)
    if argv[0] == "-m":
        if len(argv) < 2:
            print(f"singa_jax.run: -m needs a module name\n{USAGE}", file=sys.stderr)
            raise SystemExit(2)
        install_as_singa(cuda_fallback=True)
        _run_module(argv[1], argv[2:])
        return
    script = argv[0]
    if not os.path.isfile(script):
        print(f"singa_jax.run: no such script: {script}\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    install_as_singa(cuda_fallback=True)
    _run_script(script, argv[1:], path0_is_cwd=from_command_line)


if __name__ == "__main__":
    main()
