"""Trials replay the decisions a task records for its held calls, as the task's approver;
a held call the task records no decision for waits for a person (through the CLI, as a user
meets it)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.runs import run_trials

from ..approval_env import approval_suite, call
from ..test_suite_approvals import SUPERVISOR, TASKS

AGENT = "tests.approval_env:OtherAmount"


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def ran(ledger: Path) -> Counter[tuple[str, str, str, str]]:
    """How often each write's function ran in each trial: (trial, tool, account, amount)."""
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return Counter(tuple(line.split("\t")) for line in lines)  # type: ignore[misc]


def test_the_scripted_agent_passes_every_trial_with_the_recorded_decisions(tmp_path: Path):
    """Each held call is decided as the task records it, by its person, in the run's record
    (signed): every trial passes, every approved or edited effect ran exactly once in each
    trial and a rejected one never; the run verifies with the public key, a resume has nothing
    to do, and each trial replays against its record to its end."""
    ledger = tmp_path / "ledger.txt"
    suite = approval_suite(tmp_path / "suite", TASKS, ledger=str(ledger))
    code, _ = run_cli("keygen", str(tmp_path / "key"))
    assert code == 0
    code, out = run_cli(
        *("run", str(suite), "--agent", "scripted", "--trials", "2"),
        *("--logs", str(tmp_path / "logs"), "--signing-key", str(tmp_path / "key")),
    )
    assert code == 0, out
    (folder,) = (tmp_path / "logs").iterdir()
    store = hx.Store(folder / "harness.db")
    rows = store.trial_rows()
    assert len(rows) == 8 and all(r.passed and r.outcome == "committed" for r in rows), out
    run_id = folder.name
    expected = Counter()
    for trial in (0, 1):
        expected.update(
            {
                (f"{run_id}-approved-{trial}", "refund", "a", "20"): 1,
                (f"{run_id}-rejected-{trial}", "credit", "c", "5"): 1,
                (f"{run_id}-edited-{trial}", "refund", "a", "30"): 1,
                (f"{run_id}-over-50-{trial}", "credit", "c", "60"): 1,
                (f"{run_id}-over-50-{trial}", "credit", "b", "10"): 1,
            }
        )
    assert ran(ledger) == expected
    decided = Counter(
        (e.action, e.status, e.resolved_by, e.resolution_reason) for e in store.escalations()
    )
    assert decided == {
        ("refund", "approved", "supervisor", "recorded in task 'approved'"): 2,
        ("refund", "rejected", "supervisor", "recorded in task 'rejected': over the limit"): 2,
        ("refund", "edited", "lead", "recorded in task 'edited'"): 2,
        ("credit", "approved", "supervisor", "recorded in task 'over-50'"): 2,
    }
    store.close()
    code, out = run_cli("verify", str(folder), "--public-key", str(tmp_path / "key.pub"))
    assert code == 0, out
    code, out = run_cli("resume", str(folder), "--suite", str(suite), "--json")
    assert code == 0, out
    assert json.loads(out)["started"] == [] and len(json.loads(out)["kept"]) == 8
    for row in rows:
        code, out = run_cli(
            "replay", str(folder), "--episode", row.episode_id, "--suite", str(suite)
        )
        # (a rejected call too: the agent was told so and went on, as recorded)
        assert code == 0 and "no divergence" in out and "it ended answered" in out, out
    assert ran(ledger) == expected


def test_a_held_call_with_other_arguments_waits_for_a_person(tmp_path: Path):
    """The agent refunds 400 where the task records the decision on refunding 500: its trials
    wait for a person, `harness escalations` lists the call, and a person's decision finishes
    the run."""
    ledger = tmp_path / "ledger.txt"
    suite = approval_suite(tmp_path / "suite", [TASKS[1]], ledger=str(ledger))
    agent = AGENT
    code, out = run_cli(
        *("run", str(suite), "--agent", agent, "--trials", "1", "--logs", str(tmp_path / "logs"))
    )
    assert code == 4, out
    assert "1 escalation(s) waiting for a person" in " ".join(out.split())
    (folder,) = (tmp_path / "logs").iterdir()
    code, out = run_cli("escalations", str(folder), "--json")
    assert code == 0, out
    (pending,) = json.loads(out)
    assert pending["status"] == "pending" and pending["action"] == "refund"
    assert pending["args"] == {"account": "b", "amount": 400}
    assert ran(ledger) == Counter()
    code, out = run_cli(
        *("escalations", str(folder), "resolve", pending["id"], "--approve", "--by", "ana")
    )
    assert code == 0, out
    code, out = run_cli(
        *("resume", str(folder), "--suite", str(suite), "--agent", agent, "--trust-agent")
    )
    assert code == 0 and "resumed 1" in out, out
    assert ran(ledger) == Counter(
        {
            (f"{folder.name}-rejected-0", "refund", "b", "400"): 1,
            (f"{folder.name}-rejected-0", "credit", "c", "5"): 1,
        }
    )


def test_a_call_held_again_after_its_decision_waits_for_a_person(tmp_path: Path):
    """An action whose every call has a new idempotency key is held again each time the agent
    starts its turn over: the recorded decision answers the first hold only, and the trial
    waits for a person instead of looping."""
    folder = approval_suite(
        tmp_path / "suite",
        [
            {
                "id": "again",
                "reference_actions": [call("refund", SUPERVISOR, account="a", amount=20)],
            }
        ],
        fresh_keys=True,
    )
    suite = hx.load_suite(folder, check_references=False)  # (its replay is held twice too)
    result = run_trials(suite, agent="scripted", trials=1, logs=tmp_path / "logs", run_id="r1")
    store = hx.Store(result.folder / "harness.db")
    assert [t.outcome for t in store.trials("r1")] == ["escalated"]
    assert [(e.status, e.resolved_by) for e in store.escalations()] == [
        ("approved", "supervisor"),
        ("pending", None),
    ]
    store.close()
