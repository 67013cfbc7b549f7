"""A run under a fault plan reads back: the recovery tables `harness run --faults` ends with
are in `harness report` (terminal, JSON, HTML) and in `summary.json`, and a class's name is
never cut at 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main

from ..toy_env import write_suite

PLAN = """\
seed = 3
timeout = 5.0

[[faults]]
kind = "fail_stop"
service = "writes"
rate = 0.3
transient = true

[[faults]]
kind = "fail_slow"
service = "writes"
rate = 0.3
delay = 12.0
"""


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The toy suite run twice, 3 trials a task: under the plan, and without one."""
    tmp = tmp_path_factory.mktemp("faulted")
    suite = write_suite(tmp / "suite", [2, 3, 2, 1])
    (tmp / "plan.toml").write_text(PLAN)
    out = {}
    for name, extra in (("faulted", ["--faults", str(tmp / "plan.toml")]), ("clean", [])):
        logs = tmp / name
        code, text = run_cli(
            "run", str(suite), "--agent", "scripted", "--trials", "3", "--logs", str(logs), *extra
        )
        assert code == 0, text
        (out[name],) = logs.iterdir()
        out[name + "-output"] = text  # type: ignore[assignment]
    return out


def test_the_report_shows_the_tables_the_run_ended_with(runs: dict[str, Path]):
    code, text = run_cli("report", str(runs["faulted"]))
    assert code == 0, text
    ended = str(runs["faulted-output"])
    for title in ("detection and decisions by class", "recovery and cost by class"):
        assert title in text and title in ended
    rows = [ln for ln in text.splitlines() if ln.startswith("│ fail_")]
    # Each class names itself whole, in both tables (fail_s… named neither).
    assert sorted({ln.split()[1] for ln in rows}) == ["fail_slow", "fail_stop"]
    assert len(rows) >= 4 and "fail_s…" not in text
    assert "with injected faults" in text


def test_json_and_summary_carry_the_same_figures(runs: dict[str, Path]):
    code, text = run_cli("report", str(runs["faulted"]), "--json")
    assert code == 0, text
    faults = json.loads(text)["faults"]
    assert set(faults["classes"]) == {"fail_stop", "fail_slow"}
    assert faults["injected"] > 0 and faults["injected"] == sum(
        c["injected"] for c in faults["classes"].values()
    )
    assert all(c["detected"] == c["injected"] for c in faults["classes"].values())
    summary = json.loads((runs["faulted"] / "summary.json").read_text())
    assert summary["faults"] == faults


def test_the_html_report_has_the_fault_tables(runs: dict[str, Path], tmp_path: Path):
    page = tmp_path / "r.html"
    code, text = run_cli("report", str(runs["faulted"]), "--html", str(page))
    assert code == 0, text
    html = page.read_text()
    assert "<h2>Injected faults</h2>" in html
    assert "<tr><td>fail_stop</td>" in html and "<tr><td>fail_slow</td>" in html


def test_a_run_without_a_plan_has_no_fault_section(runs: dict[str, Path], tmp_path: Path):
    code, text = run_cli("report", str(runs["clean"]), "--json")
    assert code == 0 and json.loads(text)["faults"] is None
    assert "faults" not in json.loads((runs["clean"] / "summary.json").read_text())
    code, text = run_cli("report", str(runs["clean"]))
    assert code == 0 and "injected faults" not in text
