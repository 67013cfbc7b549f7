"""Every failed trial has a class, and the classes add up to the failures: in `harness run`'s
summary, `harness report` (terminal, JSON, HTML) and `summary.json`, as a user of their own
suite and agent meets them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.runs.judge import TRIAL_CLASSES, classify_trial

from ..toy_env import write_suite

AGENT = str(Path(__file__).with_name("failing_agents.py")) + ":EveryWayAgent"


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the toy suite (tasks t0..t5 needing 0, 1, 2, 1, 1, 2 writes) by an agent that
    fails t0..t4 each its own way and does t5 right, 2 trials each."""
    tmp = tmp_path_factory.mktemp("failed")
    suite = write_suite(tmp / "suite", [0, 1, 2, 1, 1, 2])
    code, out = run_cli(
        "run", str(suite), "--agent", AGENT, "--trials", "2", "--logs", str(tmp / "logs")
    )
    assert code == 0, out
    assert "failed trials by class: 10 of 12 counted trials failed" in out
    (run,) = (tmp / "logs").iterdir()
    return run


EXPECTED = {
    "t0": "unexpected action",
    "t1": "no action taken",
    "t2": "wrong final state",
    "t3": "agent error",
    "t4": "no action taken",
}


def test_each_failed_trial_has_its_class_and_they_add_up(folder: Path):
    """`harness report --json` gives every failed trial with its class and why; the counts
    by class add up to the trials that failed, although no call failed in t0, t1 or t2."""
    code, out = run_cli("report", str(folder), "--json")
    assert code == 0, out
    report = json.loads(out)
    failed = report["failed_trials"]
    assert {(f["task_id"], f["class"]) for f in failed} == set(EXPECTED.items())
    assert len(failed) == 10
    by_class = report["failed_trials_by_class"]
    assert by_class == {
        "no action taken": 4,
        "agent error": 2,
        "unexpected action": 2,
        "wrong final state": 2,
    }
    assert sum(by_class.values()) == report["trials"] - sum(t["successes"] for t in report["tasks"])
    assert set(report["trial_classes"]) == set(by_class)
    why = {f["task_id"]: f["detail"] for f in failed}
    assert why["t2"] == "differs at c/a, c/b, c/h"
    assert why["t0"] == "changed 1 resource(s): c/a"
    assert why["t1"] == "the reference changes 1 resource(s)"
    assert why["t3"].startswith("RuntimeError: the agent's own bug")
    assert why["t4"] == "the reference changes 1 resource(s); failed calls: precondition"
    # The failed calls keep their own count, beside the trials'.
    assert report["failures_by_class"] == {"agent error": 2, "precondition": 2}
    tasks = {t["task_id"]: t for t in report["tasks"]}
    assert tasks["t5"]["pass_hat_k"] == [1.0, 1.0]
    assert tasks["t2"]["pass_hat_k"] == [0.0, 0.0]


def test_summary_json_counts_failed_trials_by_class(folder: Path):
    summary = json.loads((folder / "summary.json").read_text())
    assert sum(summary["failed_trials_by_class"].values()) == 10
    assert summary["failed_trials_by_class"]["no action taken"] == 4


def test_the_terminal_report_has_a_task_table_and_names_the_failed_trials(folder: Path):
    """As Inspect's summary does: passes out of trials and pass^k per task, then each failed
    trial with its class, why, and how to open it."""
    code, out = run_cli("report", str(folder))
    assert code == 0, out
    lines = out.splitlines()
    (t5,) = [ln for ln in lines if ln.strip().startswith("t5 ") and "/2" in ln]
    assert "2/2" in t5 and "1.000" in t5 and "PP" in t5
    (t2,) = [ln for ln in lines if ln.strip().startswith("t2 ") and "/2" in ln]
    assert "0/2" in t2 and "FF" in t2
    assert "failed trials (10)" in out
    for task, cls in EXPECTED.items():
        assert any(ln.strip().startswith(f"{task} #0") and cls in ln for ln in lines), task
    assert "failed trials by class: 10 of 12 counted trials failed" in out
    assert f"harness audit {folder} --episode" in out.replace("\n", "")
    code, out = run_cli("report", str(folder), "--no-tasks")
    assert code == 0 and "per task:" not in out


def test_the_html_filter_offers_each_trial_class(folder: Path, tmp_path: Path):
    page = tmp_path / "report.html"
    code, out = run_cli("report", str(folder), "--html", str(page))
    assert code == 0, out
    html = page.read_text()
    offered = dict(re.findall(r'value="([^"]+)"> [^(]+ \((\d+)\)', html))
    assert offered == {
        "no action taken": "4",
        "agent error": "2",
        "unexpected action": "2",
        "wrong final state": "2",
        "passed": "2",
    }
    assert "<caption>failed trials by class: 10 of 12 counted trials failed" in html


def _classify(**kw: Any) -> tuple[str, str] | None:
    base: dict[str, Any] = {
        "passed": False,
        "infra_error": False,
        "outcome": "committed",
        "failures": {},
        "verdict": {},
        "meta": {},
    }
    return classify_trial(**{**base, **kw})


STATE = {"name": "state_equality", "passed": False}


@pytest.mark.parametrize(
    ("given", "cls"),
    [
        ({"passed": True}, None),
        ({"infra_error": True, "meta": {"error": "ModelServerError: down"}}, "infrastructure"),
        ({"infra_error": True, "meta": {"interruption": "planned"}}, "planned interruption"),
        ({"failures": {"agent error": 1}, "outcome": "rolled_back"}, "agent error"),
        ({"failures": {"ended: max_steps": 1}}, "cut short"),
        ({"meta": {"termination_reason": "too_many_errors"}}, "cut short"),
        ({"outcome": "rolled_back", "failures": {"silent": 1}}, "rolled back"),
        ({"outcome": "escalated"}, "escalated"),
        ({"outcome": "failed"}, "episode failed"),
        ({"outcome": "running"}, "episode not ended"),
        (
            {
                "verdict": {
                    "checks": [{**STATE, "compared": {"actual_changed": 0, "expected_changed": 2}}]
                }
            },
            "no action taken",
        ),
        (
            {
                "verdict": {
                    "checks": [{**STATE, "compared": {"actual_changed": 1, "expected_changed": 0}}]
                }
            },
            "unexpected action",
        ),
        ({"verdict": {"checks": [STATE]}}, "wrong final state"),
        (
            {"verdict": {"checks": [{"name": "field:users/u1/status", "passed": False}]}},
            "wrong final state",
        ),
        (
            {"verdict": {"checks": [{"name": "required_outputs", "passed": False}]}},
            "missing output",
        ),
        ({"verdict": {"checks": [{"name": "policy", "passed": False}]}}, "failed check"),
        ({"verdict": {"passed": False}}, "rejected by verifier"),
        ({"verdict": "not a verdict", "meta": ["not", "meta"]}, "rejected by verifier"),
    ],
)
def test_every_failed_trial_gets_one_known_class(given: dict[str, Any], cls: str | None):
    """The first that holds of: infrastructure, the agent raised, cut short, not committed,
    then what the verifier found; a record of another shape still gets a class."""
    found = _classify(**given)
    if cls is None:
        assert found is None
    else:
        assert found is not None and found[0] == cls and found[0] in TRIAL_CLASSES
        assert found[1]


def test_the_html_report_shows_each_trials_last_attempt(tmp_path: Path):
    """A trial whose first attempt was an infrastructure error and whose second passed is one
    passed trial in the filter, and its grid cell opens the second attempt."""
    from harness.runs import resume_run, run_trials

    suite = write_suite(tmp_path / "suite", [1, 2])
    agent = str(Path(__file__).with_name("failing_agents.py")) + ":FirstAttemptDown"
    first = run_trials(suite, agent=agent, logs=tmp_path / "logs")
    assert first.folder is not None and all(r.infra_error for r in first.results)
    resume_run(first.folder, suite=suite, agent=agent)
    page = tmp_path / "r.html"
    code, out = run_cli("report", str(first.folder), "--html", str(page))
    assert code == 0, out
    html = page.read_text()
    offered = dict(re.findall(r'value="([^"]+)"> [^(]+ \((\d+)\)', html))
    assert offered == {"passed": "2"}
    assert f'href="#episode-{first.folder.name}-t0-0~1"' in html
    assert f'href="#episode-{first.folder.name}-t0-0"' not in html


def test_a_run_with_no_failed_trial_says_so_in_a_line(tmp_path: Path):
    suite = write_suite(tmp_path / "suite", [1, 2])
    code, out = run_cli(
        "run", str(suite), "--agent", "scripted", "--trials", "2", "--logs", str(tmp_path / "l")
    )
    assert code == 0, out
    assert "failed trials: none of 4 counted trials failed" in out
    assert "failed trials by class" not in out
