"""Regenerate the op table of docs/onnx.md from the op table in the code.

Usage: ``python -m singa_jax._src.onnx.doc_table [path/to/onnx.md]`` rewrites the part between the
``<!-- op-table:start -->`` and ``<!-- op-table:end -->`` markers (tests/test_sonnx.py checks
that the page is current).
"""
import pathlib
import re
import sys

from singa_jax._src.onnx.catalog import op_table_markdown

START, END = "<!-- op-table:start -->\n", "<!-- op-table:end -->"


def update(path: pathlib.Path) -> None:
    text = path.read_text()
    new = re.sub(re.escape(START) + r".*?" + re.escape(END),
                 lambda _: START + op_table_markdown() + END, text, flags=re.S)
    path.write_text(new)


if __name__ == "__main__":
    default = pathlib.Path(__file__).resolve().parents[2] / "docs" / "onnx.md"
    update(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default)
