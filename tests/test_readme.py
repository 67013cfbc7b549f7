"""The README's quick start runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs(tmp_path: Path):
    """The quick-start block runs in a fresh folder and prints what its comments promise."""
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README lost its quick-start block"
    script = tmp_path / "quick.py"
    script.write_text(block.group(1))
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(README.parent)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "precondition 'is_pending' is false" in lines[0]
    assert lines[1] == "committed"
    assert lines[2].startswith("cancel_order committed")
    assert lines[-1] == "True"
    assert (tmp_path / "logs" / "harness.db").exists()
    # The quick start ends by auditing the store it wrote, from the shell.
    shell = re.search(r"audit the store it wrote.*?```bash\n(.*?)```", README.read_text(), re.S)
    assert shell is not None, "README lost the audit of the quick start's store"
    said = {}
    for line in shell.group(1).splitlines():
        argv = line.split("#")[0].split()
        assert argv[0] == "harness", line
        run = subprocess.run(
            [sys.executable, "-m", "harness.cli", *argv[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(README.parent)},
            timeout=120,
        )
        assert run.returncode == 0, (line, run.stdout, run.stderr)
        said[argv[1]] = run.stdout
    assert "cancel_order" in said["audit"]
    assert "verified: 1 episode(s)" in said["verify"]


def test_every_guarantee_names_tests_that_exist():
    """Each row of the README's Guarantees is tied to tests, and every test it names exists."""
    section = re.search(r"## Guarantees\n(.*?)\n## ", README.read_text(), re.S)
    assert section is not None, "README lost its Guarantees section"
    named = set(re.findall(r"`(test_\w+)`", section.group(1)))
    defined: set[str] = set()
    for path in Path(__file__).parent.rglob("test_*.py"):
        defined |= set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    assert len(named) >= 30
    assert sorted(named - defined) == []
    rows = re.findall(r"^- ([^:]+): `test_", section.group(1), re.M)
    assert len(rows) == 12  # a list of tests per row (the two store rows share one)


def test_passk_marker_example_runs_and_prints_what_the_readme_shows(tmp_path: Path):
    """The pytest-marker example passes under pytest and prints the README's pass^k lines."""
    text = README.read_text()
    section = re.search(r"### The pytest marker\n(.*?)\n## ", text, re.S)
    assert section is not None, "README lost its pytest-marker section"
    code = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    shown = re.search(r"```text\n(.*?)```", section.group(1), re.S)
    assert code is not None and shown is not None
    (tmp_path / "test_agent.py").write_text(code.group(1))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_agent.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout
    for line in shown.group(1).splitlines():
        assert line in out.stdout.splitlines(), line


def framework_examples() -> tuple[str, list[str]]:
    """The action every framework example uses, and the examples."""
    section = re.search(r"## In your agent framework\n(.*?)\n## ", README.read_text(), re.S)
    assert section, "README has no 'In your agent framework' section"
    setup, *examples = re.findall(r"```python\n(.*?)```", section.group(1), re.S)
    return setup, examples


@pytest.mark.parametrize(
    "index", range(5), ids=["openai-agents", "langgraph", "pydantic-ai", "mcp", "otel"]
)
def test_each_framework_example_runs_and_prints_what_the_readme_shows(tmp_path: Path, index: int):
    """Each README example, after the action it uses, run as a user would paste it: it
    prints the lines its closing comments show."""
    setup, examples = framework_examples()
    assert len(examples) == 5
    example = examples[index]
    modules = {0: "agents", 1: "langgraph", 2: "pydantic_ai", 3: "mcp", 4: "opentelemetry"}
    pytest.importorskip(modules[index])
    shown = [line[2:] for line in example.strip().splitlines() if line.startswith("# ")]
    done = subprocess.run(
        [sys.executable, "-c", setup + "\n" + example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == shown
