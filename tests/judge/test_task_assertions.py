"""Tasks carry natural-language assertions for a judge: in the harness's task format, and from
a tau2 task whose reward basis holds NL_ASSERTION."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness as hx

from ..toy_env import write_suite


def test_a_task_lists_its_assertions_and_keeps_its_digest_without_them(tmp_path: Path):
    suite = write_suite(tmp_path / "s", [1, 1])
    tasks = json.loads((suite / "tasks.json").read_text())
    tasks["tasks"][1]["nl_assertions"] = ["The agent greets the user by name."]
    (suite / "tasks.json").write_text(json.dumps(tasks))
    loaded = hx.load_suite(suite)
    plain, judged = loaded.tasks
    assert plain.nl_assertions == [] and judged.nl_assertions == [
        "The agent greets the user by name."
    ]
    assert judged.digest != judged.model_copy(update={"nl_assertions": []}).digest


def test_the_retail_suite_keeps_the_digests_runs_recorded():
    """A field added to tasks changes no digest of a task that does not use it, so runs
    recorded before still match their suite (compare, resume)."""
    task = hx.load_suite("retail").task("retail-001")
    assert task.digest == "5e78dd1e83854efb0df6958abfa1c886147befa5ec83bcf7032f296c6009f65e"


def tau2_task(basis: list[str], assertions: object) -> dict[str, object]:
    return {
        "id": "7",
        "user_scenario": {
            "persona": None,
            "instructions": {
                "domain": "retail",
                "reason_for_call": "cancel an order",
                "known_info": "",
                "unknown_info": "",
                "task_instructions": "",
            },
        },
        "evaluation_criteria": {
            "actions": [],
            "reward_basis": basis,
            "nl_assertions": assertions,
        },
    }


@pytest.mark.parametrize(
    ("basis", "expected"),
    [(["DB", "NL_ASSERTION"], ["Agent refuses."]), (["DB"], [])],
)
def test_tau2_assertions_are_judged_when_the_basis_names_them(
    tmp_path: Path, basis: list[str], expected: list[str]
):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([tau2_task(basis, ["Agent refuses."])]))
    (task,) = hx.load_suite(path).tasks
    assert task.nl_assertions == expected


def test_tau2_assertions_of_the_wrong_shape_are_refused(tmp_path: Path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([tau2_task(["NL_ASSERTION"], [3])]))
    with pytest.raises(hx.SuiteError, match=r"nl_assertions\[0\]: must be a string"):
        hx.load_suite(path)
