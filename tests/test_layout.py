"""The house, read from the source (nothing is imported): SINGA's public modules on top, the engine
in ``singa_jax/_src`` in packages that import in one direction, no import circles (imports inside
functions count), no file over 800 lines, public modules thin; and the test suite's behaviour
tier uses public names only."""
from __future__ import annotations

import ast
import pathlib
import sys
from typing import Dict, List, Set

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "singa_jax"

# Each package of singa_jax._src imports only the packages listed for it (and itself): the
# stages the data passes, in order. docs/architecture.md draws this graph.
ALLOWED: Dict[str, Set[str]] = {
    "base": set(),
    "backend": {"base"},
    "runtime": {"base", "backend"},
    "eager": {"base", "backend"},
    "tensor": {"base", "backend", "runtime", "eager"},
    "autodiff": {"base", "backend", "runtime", "eager", "tensor"},
    "ops": {"base", "backend", "runtime", "eager", "tensor", "autodiff"},
    "layers": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "ops"},
    "optim": {"base", "backend", "runtime", "eager", "tensor", "autodiff"},
    "graph": {"base", "backend", "runtime", "eager", "tensor"},
    "dist": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "optim", "graph"},
    "model": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "ops", "layers",
              "optim", "graph", "dist"},
    "data": {"base", "backend", "runtime"},
    "swig": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "ops"},
    "onnx": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "ops", "layers",
             "optim", "graph", "dist", "model"},
    "debug": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "ops", "layers",
              "optim", "graph", "dist", "model"},
    "persist": {"base", "backend", "runtime", "eager", "tensor", "autodiff", "ops", "layers",
                "optim", "graph", "dist", "model", "data"},
}
# SINGA's modules, the older ones SINGA still ships, singa_jax's public extensions and the
# ``python -m`` entry points: the only names at the top of the package
PUBLIC = {"autograd", "data", "device", "initializer", "layer", "model", "opt", "snapshot",
          "sonnx", "tensor", "utils", "singa_wrap", "module", "optimizer", "precision",
          "debug", "checkpoint"}
ENTRY_POINTS = {"run", "info"}
MAX_LINES, MAX_PUBLIC_LINES = 800, 150


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", None) == "TYPE_CHECKING" or \
        getattr(test, "attr", None) == "TYPE_CHECKING"


def imports_of(name: str) -> Set[str]:
    """The singa_jax modules ``name`` imports, at any depth (inside functions too), except under
    ``if TYPE_CHECKING:``; ``from package import sub`` counts as importing ``package.sub``."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node)
            for n in ast.walk(node)}
    is_package = path.name == "__init__.py"
    found: Set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _stage(name: str) -> str:
    return name.split(".")[2]


def test_the_package_is_read():
    # guards the checks below against reading nothing
    assert "singa_jax.tensor" in MODULES and "singa_jax._src.autodiff.operator" in MODULES
    assert "singa_jax._src.tensor.tensor" in GRAPH["singa_jax._src.autodiff.operator"]


def test_no_import_circles():
    assert circles(GRAPH) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_engine_imports_no_public_module():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() if a.startswith("singa_jax._src")
                    for b in targets if not b.startswith("singa_jax._src"))
    assert upward == []


def test_engine_packages_import_in_one_direction():
    stages = {_stage(name) for name in MODULES if name.count(".") >= 2 and
              name.startswith("singa_jax._src.")}
    assert stages == set(ALLOWED), "a new engine package: say where it sits in ALLOWED"
    wrong = sorted(f"{a} -> {b}" for a, targets in GRAPH.items()
                   if a.startswith("singa_jax._src.") and a.count(".") >= 2
                   for b in targets if b.startswith("singa_jax._src.") and b.count(".") >= 2
                   and _stage(b) != _stage(a) and _stage(b) not in ALLOWED[_stage(a)])
    assert wrong == []


def test_the_stage_order_has_no_cycle():
    assert circles({k: set(v) for k, v in ALLOWED.items()}) == []


def test_the_top_level_holds_public_modules_only():
    top = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and
                                                                   (p / "__init__.py").exists())}
    assert top == PUBLIC | ENTRY_POINTS | {"_src"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_file_size(name: str):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    public = not name.startswith("singa_jax._src") and name.split(".")[-1] not in ENTRY_POINTS
    limit = MAX_PUBLIC_LINES if public else MAX_LINES
    assert lines <= limit, f"{MODULES[name]}: {lines} lines (at most {limit})"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith("singa_jax._src")
                                        and n.split(".")[-1] not in ENTRY_POINTS))
def test_public_modules_re_export_only(name: str):
    """A public module binds names by imports from singa_jax._src (or other public modules);
    what it defines itself is SINGA's module-level attributes (PEP 562 ``__getattr__``) and its
    own module type."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef,
                                                                     ast.ClassDef))]
    assert set(defined) <= {"__getattr__", "install_as_singa", "_AutogradModule"}, defined


def test_the_behaviour_tier_uses_public_names_only():
    """tests/*.py check behaviour through public names; what reads the engine's internals
    lives in tests/internal/ (conftest.py, the harness, may reach in)."""
    offending = []
    for path in sorted(ROOT.glob("tests/test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(m.startswith("singa_jax._src") for m in modules):
                offending.append(f"{path.name}:{node.lineno}")
    assert offending == []
