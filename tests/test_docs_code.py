"""Every Python code block of README.md and docs/**/*.md runs.

A page's ```python blocks run in order as ONE program, in a fresh Python process whose working
folder is a new temporary one, so a block may use what an earlier block of the same page
defined (as a reader going down the page would). The process inherits the test run's
environment (conftest's JAX flags included). A block that cannot run here -- it needs a GPU,
several processes, the network or minutes -- carries a marker on the line just before its
fence::

    <!-- skip: needs a GPU -->

and is reported as a skipped test with that reason. Other fences (```text, ```pycon, ```bash,
...) are not run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON_LANGS = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")

# Runs a page's blocks as one program; each block is compiled under the page's path with its
# own line numbers, so a traceback points at the Markdown line that failed.
RUNNER = r"""
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for block in blocks:
    code = compile("\n" * (block["line"] - 1) + block["source"], block["page"], "exec")
    exec(code, namespace)
"""


class Block(NamedTuple):
    page: str        # path relative to the repository root
    line: int        # line of the block's first code line in the page (1-based)
    source: str
    skip: Optional[str]  # the marker's reason, or None


def pages() -> List[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def code_blocks(path: Path) -> List[Block]:
    """The ```python blocks of a Markdown file, in order."""
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: List[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        lang = opening.group("info").strip().split(" ")[0].lower()
        end = i + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if closing and closing.group("fence")[0] == fence[0] \
                    and len(closing.group("fence")) >= len(fence) \
                    and not closing.group("info").strip():
                break
            end += 1
        assert end < len(lines), f"{rel}:{i + 1}: a code fence that is never closed"
        if lang in PYTHON_LANGS:
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                    for ln in lines[i + 1:end]]
            marker = SKIP.match(lines[i - 1]) if i > 0 else None
            blocks.append(Block(rel, i + 2, "\n".join(body) + "\n",
                                marker.group("reason") if marker else None))
        i = end + 1
    return blocks


def _pages_with_code():
    found = []
    for path in pages():
        blocks = code_blocks(path)
        if any(b.skip is None for b in blocks):
            found.append(pytest.param(path, id=path.relative_to(ROOT).as_posix()))
    return found


def _skipped_blocks():
    return [pytest.param(b, id=f"{b.page}:{b.line}")
            for path in pages() for b in code_blocks(path) if b.skip is not None]


@pytest.mark.parametrize("path", _pages_with_code())
def test_page_code_runs(path: Path, tmp_path: Path) -> None:
    """The page's Python blocks, skipped ones left out, run in order without an error."""
    blocks = [b._asdict() for b in code_blocks(path) if b.skip is None]
    program = tmp_path / "blocks.json"
    program.write_text(json.dumps(blocks))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("MPLBACKEND", "Agg")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(program)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{path.relative_to(ROOT)}: its code blocks failed (exit {proc.returncode})\n"
        f"--- stdout (tail)\n{proc.stdout[-2000:]}\n--- stderr (tail)\n{proc.stderr[-6000:]}")


@pytest.mark.parametrize("block", _skipped_blocks())
def test_marked_block_is_skipped(block: Block) -> None:
    """A block marked ``<!-- skip: reason -->`` is not run; the reason is reported."""
    assert block.skip, f"{block.page}:{block.line}: a skip marker needs a reason"
    pytest.skip(f"{block.page}:{block.line}: {block.skip}")


def test_blocks_are_found() -> None:
    """The parser sees the pages' code: README's quickstart among them."""
    readme = code_blocks(ROOT / "README.md")
    assert any(b.skip is None for b in readme), "README.md has no Python block that runs"
    assert len(pages()) > 10
