"""No development history where a user reads: README, CHANGELOG, the docs, the examples, the
benchmarks, the package and the tests state what is true now.

Each area's text files (.md .py .yml .yaml .toml) are searched for the words of a lab notebook
-- numbered sessions, rounds, stops and issues, "measured and not" followed by kept or built,
"commit" followed by a hash -- and for this repository's commit hashes (a run of 7-40 hex
digits with a digit and a letter in it that git resolves to a commit). A hit is reported as
``path:line: text``. The hash check needs git and a checkout; without them it is left out.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
AREAS = ["README.md", "CHANGELOG.md", "mkdocs.yml", "pyproject.toml", "docs", "examples",
         "benchmarks", "singa_jax", "tests"]
SUFFIXES = {".md", ".py", ".yml", ".yaml", ".toml"}
SKIP_DIRS = {"__pycache__", ".venv", "node_modules", "site"}

HISTORY = re.compile(
    r"\bsession [0-9]|\bsessions? [0-9]+-[0-9]|\bissue [0-9]+|\bround [0-9]|\bstop [0-9]"
    r"|measured and not (kept|built)|commit [0-9a-f]{7}", re.IGNORECASE)
HEX_RUN = re.compile(r"(?<![0-9A-Za-z_])[0-9A-Fa-f]{7,40}(?![0-9A-Za-z_])")


def files_of(area: str) -> List[Path]:
    """The text files of one area (a file or a folder of the repository), sorted."""
    top = ROOT / area
    if top.is_file():
        return [top]
    if not top.is_dir():
        return []
    return sorted(p for p in top.rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES
                  and not any(part in SKIP_DIRS or part.startswith(".")
                              for part in p.relative_to(ROOT).parts[:-1]))


def _lines(path: Path) -> Iterator[Tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    yield from enumerate(text.splitlines(), start=1)


def _hex_candidates(line: str) -> Iterator[str]:
    for m in HEX_RUN.finditer(line):
        run = m.group(0)
        if any(c.isdigit() for c in run) and any(c.isalpha() for c in run):
            yield run.lower()


def _git_ok() -> bool:
    if shutil.which("git") is None:
        return False
    try:
        proc = subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _commits_among(candidates: Set[str]) -> Set[str]:
    """The candidates that name a commit of this repository (one ``git cat-file`` for all)."""
    if not candidates:
        return set()
    ordered = sorted(candidates)
    proc = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype)"], cwd=ROOT,
                          input="".join(f"{c}^{{commit}}\n" for c in ordered),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return set()
    answers = proc.stdout.splitlines()
    return {c for c, a in zip(ordered, answers) if a.strip() == "commit"}


def history_hits(area: str, check_hashes: bool) -> List[str]:
    """``path:line: text`` for every development-history word (and commit hash) in an area."""
    hits: List[str] = []
    pending: Dict[str, List[Tuple[str, int, str]]] = {}
    for path in files_of(area):
        rel = path.relative_to(ROOT).as_posix()
        for number, line in _lines(path):
            for m in HISTORY.finditer(line):
                hits.append(f"{rel}:{number}: {m.group(0)!r} in {line.strip()[:160]}")
            if check_hashes:
                for run in _hex_candidates(line):
                    pending.setdefault(run, []).append((rel, number, line.strip()[:160]))
    for run in sorted(_commits_among(set(pending))):
        for rel, number, text in pending[run]:
            hits.append(f"{rel}:{number}: commit hash {run!r} in {text}")
    return sorted(hits)


@pytest.fixture(scope="module")
def git_available() -> bool:
    return _git_ok()


@pytest.mark.parametrize("area", AREAS)
def test_no_development_history(area: str, git_available: bool) -> None:
    hits = history_hits(area, git_available)
    assert not hits, (f"{area}: {len(hits)} place(s) tell development history; state what is "
                      f"true now instead:\n" + "\n".join(hits))


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The patterns catch the notebook's words and leave ordinary text alone."""
    # written in pieces, so that this file does not trip the check itself
    caught = [" ".join(words) for words in (
        ("as measured in", "session", "4"), ("sessions", "41-44"), ("see", "issue", "30"),
        ("round", "2 of this"), ("stop", "42"), ("this was measured and", "not", "kept"),
        ("since", "commit", "1a2b3c4"))]
    fine = ["a GitHub issue", "round-trip", "rounds to even", "a stop-gradient", "sessions",
            "the issue tracker", "measured and kept", "commit the changes"]
    assert all(HISTORY.search(text) for text in caught)
    assert not any(HISTORY.search(text) for text in fine)
    assert list(_hex_candidates("deadbeef 1a2b3c4d 1234567 abcdefa 0x1f2e3d4c A1B2C3D4")) == \
        ["1a2b3c4d", "a1b2c3d4"]
