"""The pages in docs/ say what is true: their examples run and print what they show."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# A fenced block at the start of a line, optionally named as a file by a bold `path` line
# just before it (the block is that file's content).
BLOCK = re.compile(
    r"^(?:\*\*`(?P<file>[^`]+)`\*\*\n\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\n(?P<after>\n*)",
    re.M | re.S,
)
# Pages whose examples run in full, in order, in a fresh folder (the others' Python blocks are
# compiled: a page of fragments cannot run).
RUN = ("suites.md",)


def _blocks(page: Path) -> list[re.Match[str]]:
    return list(BLOCK.finditer(page.read_text()))


def test_every_python_block_in_docs_compiles():
    """Each Python block of every page in docs/ is valid Python."""
    pages = sorted(DOCS.glob("*.md"))
    assert DOCS / "suites.md" in pages
    for page in pages:
        for block in _blocks(page):
            if block["lang"] == "python":
                compile(block["body"], f"{page.name} block at {block.start()}", "exec")


@pytest.mark.parametrize("name", RUN)
def test_page_examples_run_as_shown(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A page's named files are written, its `harness` commands exit 0, and each Python block
    runs and prints exactly the output block that follows it."""
    monkeypatch.chdir(tmp_path)
    blocks = _blocks(DOCS / name)
    ran = compared = 0
    for i, block in enumerate(blocks):
        body = block["body"]
        if block["file"]:
            target = tmp_path / block["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
        elif block["lang"] == "python":
            out = subprocess.run(
                [sys.executable, "-c", body],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                timeout=300,
            )
            assert out.returncode == 0, f"{name}: block {i} failed:\n{body}\n{out.stderr}"
            shown = blocks[i + 1] if i + 1 < len(blocks) else None
            if shown is not None and shown["lang"] == "" and shown.start() == block.end():
                assert out.stdout == shown["body"], f"{name}: block {i} printed {out.stdout!r}"
                compared += 1
            ran += 1
        elif block["lang"] == "" and body.startswith("harness "):
            for line in body.splitlines():
                result = CliRunner().invoke(main, shlex.split(line)[1:])
                assert result.exit_code == 0, f"{name}: `{line}`:\n{result.output}"
            ran += 1
    assert ran >= 3 and compared >= 2
