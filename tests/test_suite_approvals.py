"""A task records the decisions its reference path's held calls get; the reference replay
applies them, and a suite whose held call has none, or whose recorded decision is never used,
is refused at load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import harness as hx

from .approval_env import approval_suite, call

SUPERVISOR = {"by": "supervisor", "decision": "approve"}

TASKS: list[dict[str, Any]] = [
    {
        "id": "approved",
        "reference_actions": [
            call("balance", account="a"),
            call("refund", SUPERVISOR, account="a", amount=20),
        ],
    },
    {
        "id": "rejected",
        "reference_actions": [
            call(
                "refund",
                {"by": "supervisor", "decision": "reject", "reason": "over the limit"},
                account="b",
                amount=500,
            ),
            call("credit", account="c", amount=5),
        ],
    },
    {
        "id": "edited",
        "reference_actions": [
            call(
                "refund",
                {"by": "lead", "decision": "edit", "edit": {"account": "a", "amount": 30}},
                account="a",
                amount=80,
            )
        ],
    },
    {
        "id": "over-50",
        "reference_actions": [
            call("credit", SUPERVISOR, account="c", amount=60),
            call("credit", account="b", amount=10),
        ],
    },
]


def test_held_reference_calls_get_their_recorded_decisions(tmp_path: Path):
    """Approved: the effect is expected; rejected: it is not, and the calls after it still
    run; edited: the edited arguments' effect is expected; a rule holding only some calls
    (amount over 50) is answered for the call it holds. Each decision is bound to the call's
    arguments as its escalation bound them, and is recorded as its person's."""
    suite = hx.load_suite(approval_suite(tmp_path / "s", TASKS))
    approved, rejected, edited, over = (suite.reference(t) for t in suite.tasks)
    assert approved.changes == {"acct/a": 120}
    assert approved.writes == [("refund", '{"account":"a","amount":20}')]
    assert rejected.changes == {"acct/c": 105} and rejected.refused == []
    assert rejected.writes == [("credit", '{"account":"c","amount":5}')]
    assert edited.changes == {"acct/a": 130}
    assert edited.writes == [("refund", '{"account":"a","amount":30}')]
    assert over.changes == {"acct/c": 160, "acct/b": 110}
    assert [(name, bound, a.decision) for name, bound, a in edited.approvals] == [
        ("refund", '{"account":"a","amount":80}', "edit")
    ]
    assert edited.approval("refund", '{"account":"a","amount":80}') is not None
    assert edited.approval("refund", '{"account":"a","amount":30}') is None
    decided = {(e.action, e.status, e.resolved_by) for e in suite._replay_store().escalations()}
    assert decided == {
        ("refund", "approved", "supervisor"),
        ("refund", "rejected", "supervisor"),
        ("refund", "edited", "lead"),
        ("credit", "approved", "supervisor"),
    }


def test_a_held_reference_call_without_a_decision_is_refused_naming_the_fix(tmp_path: Path):
    """The message names the file, the task, the call and how to record its decision."""
    folder = approval_suite(
        tmp_path / "s",
        [{"id": "asks", "reference_actions": [call("refund", account="a", amount=20)]}],
    )
    with pytest.raises(hx.SuiteError) as info:
        hx.load_suite(folder)
    said = str(info.value)
    assert said.startswith(f"{folder / 'tasks.json'}: task 'asks': reference_actions[0] (refund)")
    assert "held for a person's approval" in said
    assert '"approval": {"by": "supervisor", "decision": "approve"}' in said
    assert "docs/suites.md, section Approvals" in said


@pytest.mark.parametrize(
    ("actions", "problem"),
    [
        (
            [call("credit", SUPERVISOR, account="a", amount=20)],
            "reference_actions[0] (credit): its approval is recorded, but the call is not held",
        ),
        (
            [call("balance", SUPERVISOR, account="a")],
            "reference_actions[0] (balance): approval: 'balance' is a read",
        ),
    ],
)
def test_a_recorded_decision_no_held_call_uses_is_refused(
    tmp_path: Path, actions: list[dict[str, Any]], problem: str
):
    """A decision recorded on a call that is never held (its rule does not hold it, or it is
    a read) would mislead whoever reads the task: refused, naming the call."""
    folder = approval_suite(tmp_path / "s", [{"id": "unused", "reference_actions": actions}])
    with pytest.raises(hx.SuiteError, match="task 'unused': ") as info:
        hx.load_suite(folder)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("approval", "problem"),
    [
        ({"by": "s", "decision": "edit"}, "field reference_actions.0.approval: decision 'edit' "),
        (
            {"by": "s", "decision": "approve", "edit": {"account": "a", "amount": 1}},
            "field reference_actions.0.approval: edit is given only with decision 'edit'",
        ),
        ({"by": "", "decision": "approve"}, "field reference_actions.0.approval.by: "),
        ({"by": "s", "decision": "ok"}, "field reference_actions.0.approval.decision: 'ok' is"),
        ({"decision": "approve"}, "field reference_actions.0.approval.by: 'by' is a required"),
        (
            {"by": "s", "decision": "edit", "edit": {"account": "a"}},
            "reference_actions[0] (refund): approval.edit: arguments ['account'] do not fit",
        ),
    ],
)
def test_a_wrong_approval_is_named_with_its_task_and_field(
    tmp_path: Path, approval: dict[str, Any], problem: str
):
    action = {"name": "refund", "arguments": {"account": "a", "amount": 2}, "approval": approval}
    folder = approval_suite(tmp_path / "s", [{"id": "bad", "reference_actions": [action]}])
    with pytest.raises(hx.SuiteError, match="tasks.json: task 'bad': ") as info:
        hx.load_suite(folder)
    assert problem in str(info.value)


def test_a_recorded_decision_is_part_of_the_task_digest(tmp_path: Path):
    """A task's digest changes with its recorded decisions; a call without one reads, and
    digests, as before approvals existed."""
    suite = hx.load_suite(approval_suite(tmp_path / "s", TASKS))
    task = suite.task("approved")
    assert task.model_dump(mode="json")["reference_actions"][0] == {
        "name": "balance",
        "arguments": {"account": "a"},
    }
    other = json.loads(json.dumps(TASKS[0]))
    other["reference_actions"][1]["approval"]["by"] = "someone else"
    assert hx.Task.model_validate(other).digest != task.digest
    bare = hx.Task.model_validate(
        {**TASKS[0], "reference_actions": [call("refund", account="a", amount=20)]}
    )
    assert bare.digest != task.digest
    assert suite.manifest()["tasks"]["approved"]["digest"] == task.digest
