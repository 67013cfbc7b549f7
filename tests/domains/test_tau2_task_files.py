"""tau2-format ``tasks.json`` files of the wrong shape: each is refused with a SuiteError naming
the file, the task (index and id) and the field, and the CLI shows it with exit status 2."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import SuiteError
from harness.suite import load_suite

Task = dict[str, Any]


def _task(task_id: str) -> Task:
    """A well-formed tau2 retail task, as upstream's ``tasks.json`` writes one."""
    return {
        "id": task_id,
        "description": {"purpose": None, "relevant_policies": None, "notes": None},
        "user_scenario": {
            "persona": None,
            "instructions": {
                "task_instructions": "You are patient.",
                "domain": "retail",
                "reason_for_call": "You want to know your user id.",
                "known_info": "Your email is yusuf.rossi@example.com.",
                "unknown_info": None,
            },
        },
        "initial_state": None,
        "evaluation_criteria": {
            "actions": [
                {
                    "action_id": f"{task_id}_0",
                    "name": "find_user_id_by_email",
                    "arguments": {"email": "yusuf.rossi@example.com"},
                    "info": None,
                }
            ],
            "communicate_info": [],
            "nl_assertions": None,
            "reward_basis": ["DB"],
        },
    }


def _tasks() -> list[Task]:
    return [_task("0"), _task("1"), _task("2")]


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "tasks.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _with(change: Callable[[list[Task]], object]) -> list[Task]:
    """The three well-formed tasks with ``change`` applied."""
    tasks = copy.deepcopy(_tasks())
    change(tasks)
    return tasks


def _set(obj: dict[str, Any], key: str, value: Any) -> None:
    obj[key] = value


def _criteria(tasks: list[Task], i: int = 1) -> dict[str, Any]:
    crit: dict[str, Any] = tasks[i]["evaluation_criteria"]
    return crit


def _action(tasks: list[Task]) -> dict[str, Any]:
    action: dict[str, Any] = _criteria(tasks)["actions"][0]
    return action


def _plain_instructions(tasks: list[Task]) -> None:
    """Every task's instructions a plain string (tau2 accepts one; it names no domain)."""
    for task in tasks:
        task["user_scenario"]["instructions"] = "Ask for your user id."


# (case, the file's content, what the error must say after "tasks.json: ")
HOSTILE: list[tuple[str, Any, str]] = [
    ("not JSON", '[{"id": "0",', r"not valid JSON \(line 1: "),
    (
        "an object instead of a list",
        {"tasks": _tasks()},
        r"holds an object without field format, so is no task file: .*a tau2 tasks.json a "
        r"list of tasks",
    ),
    ("a number instead of a list", 3, r"holds a number, so is no task file"),
    ("an empty list", [], r"holds no tasks"),
    (
        "a list of non-objects",
        [_task("0"), "1", 2],
        r"task #1: must be a JSON object \(a tau2 task .*\), not a string",
    ),
    (
        "a task missing id",
        _with(lambda t: t[2].pop("id")),
        r"task #2: field id: missing \(must be a non-empty string\)",
    ),
    (
        "an id that is a number",
        _with(lambda t: _set(t[1], "id", 1)),
        r"task #1: field id: must be a non-empty string, not a number",
    ),
    (
        "a task missing evaluation_criteria",
        _with(lambda t: t[0].pop("evaluation_criteria")),
        r"task #0 \(id '0'\): field evaluation_criteria: missing \(must be an object",
    ),
    (
        "null evaluation_criteria",
        _with(lambda t: _set(t[1], "evaluation_criteria", None)),
        r"task #1 \(id '1'\): field evaluation_criteria: null \(must be an object",
    ),
    (
        "evaluation_criteria that is a list",
        _with(lambda t: _set(t[1], "evaluation_criteria", [])),
        r"task #1 \(id '1'\): field evaluation_criteria: must be an object .*, not a list",
    ),
    (
        "actions that is an object",
        _with(lambda t: _set(_criteria(t), "actions", {"name": "x"})),
        r"task #1 \(id '1'\): field evaluation_criteria.actions: must be a list of actions, "
        r"not an object",
    ),
    (
        "actions that is a string",
        _with(lambda t: _set(_criteria(t), "actions", "find_user_id_by_email")),
        r"field evaluation_criteria.actions: must be a list of actions, not a string",
    ),
    (
        "an action that is not an object",
        _with(lambda t: _criteria(t)["actions"].append(["get_order_details"])),
        r"task #1 \(id '1'\): field evaluation_criteria.actions\[1\]: must be an object such "
        r"as .*, not a list",
    ),
    (
        "an action missing name",
        _with(lambda t: _action(t).pop("name")),
        r"task #1 \(id '1'\): field evaluation_criteria.actions\[0\].name: missing",
    ),
    (
        "an action whose name is a number",
        _with(lambda t: _set(_action(t), "name", 7)),
        r"field evaluation_criteria.actions\[0\].name: must be a string naming the tool, "
        r"not a number",
    ),
    (
        "an action whose arguments is a list",
        _with(lambda t: _set(_action(t), "arguments", ["yusuf.rossi@example.com"])),
        r"task #1 \(id '1'\): field evaluation_criteria.actions\[0\].arguments: must be an "
        r"object of argument names to values, not a list",
    ),
    (
        "an action whose arguments is a string",
        _with(lambda t: _set(_action(t), "arguments", "email=x")),
        r"field evaluation_criteria.actions\[0\].arguments: must be an object .*, not a string",
    ),
    (
        "a user_scenario that is a string",
        _with(lambda t: _set(t[0], "user_scenario", "You want your user id.")),
        r"task #0 \(id '0'\): field user_scenario: must be an object such as .*, not a string",
    ),
    (
        "a user_scenario that is a list",
        _with(lambda t: _set(t[2], "user_scenario", [])),
        r"task #2 \(id '2'\): field user_scenario: must be an object .*, not a list",
    ),
    (
        "a task missing user_scenario",
        _with(lambda t: t[1].pop("user_scenario")),
        r"task #1 \(id '1'\): field user_scenario: missing",
    ),
    (
        "instructions that are a number",
        _with(lambda t: _set(t[1]["user_scenario"], "instructions", 5)),
        r"field user_scenario.instructions: must be a string or an object with domain, "
        r"reason_for_call, task_instructions, not a number",
    ),
    (
        "structured instructions missing reason_for_call",
        _with(lambda t: t[1]["user_scenario"]["instructions"].pop("reason_for_call")),
        r"task #1 \(id '1'\): field user_scenario.instructions.reason_for_call: missing",
    ),
    (
        "a domain that is a list",
        _with(lambda t: _set(t[0]["user_scenario"]["instructions"], "domain", ["retail"])),
        r"task #0 \(id '0'\): field user_scenario.instructions.domain: must be a string, "
        r"not a list",
    ),
    (
        "tasks of two domains",
        _with(lambda t: _set(t[2]["user_scenario"]["instructions"], "domain", "airline")),
        r"task #2 \(id '2'\): field user_scenario.instructions.domain: 'airline', but task #0 "
        r"is of domain 'retail'",
    ),
    (
        "no task naming its domain",
        _with(_plain_instructions),
        r"no task names its domain \(user_scenario.instructions.domain\)",
    ),
    (
        "duplicate task ids",
        _with(lambda t: _set(t[2], "id", "0")),
        r"task #2 \(id '0'\): field id: duplicated: task #0 has it too; give each task its "
        r"own id",
    ),
    (
        "a reward_basis that is a string",
        _with(lambda t: _set(_criteria(t), "reward_basis", "DB")),
        r"task #1 \(id '1'\): field evaluation_criteria.reward_basis: must be a list of reward "
        r"types such as \[\"DB\", \"COMMUNICATE\"\], not a string",
    ),
    (
        "a reward_basis that is an object",
        _with(lambda t: _set(_criteria(t), "reward_basis", {"DB": 1})),
        r"field evaluation_criteria.reward_basis: must be a list .*, not an object",
    ),
    (
        "a reward_basis naming an unknown reward type",
        _with(lambda t: _set(_criteria(t), "reward_basis", ["DB", "DATABASE"])),
        r"task #1 \(id '1'\): field evaluation_criteria.reward_basis\[1\]: 'DATABASE' is not a "
        r"tau2 reward type \(DB, ENV_ASSERTION, NL_ASSERTION, ACTION, COMMUNICATE\)",
    ),
    (
        "a reward_basis listing a number",
        _with(lambda t: _set(_criteria(t), "reward_basis", [1])),
        r"field evaluation_criteria.reward_basis\[0\]: a number is not a tau2 reward type",
    ),
    (
        "communicate_info that is a string",
        _with(lambda t: _set(_criteria(t), "communicate_info", "the user id")),
        r"field evaluation_criteria.communicate_info: must be a list of strings, not a string",
    ),
    (
        "communicate_info listing a number",
        _with(lambda t: _set(_criteria(t), "communicate_info", ["yusuf_rossi_9620", 3])),
        r"field evaluation_criteria.communicate_info\[1\]: must be a string, not a number",
    ),
    (
        "nesting deeper than the JSON reader follows",
        "[" * 100_000 + "]" * 100_000,
        r"nests too deeply to be read",
    ),
    (
        "an integer longer than Python converts",
        '[{"id": ' + "9" * 10_000 + "}]",
        r"not valid JSON \(.*digits",
    ),
]


def test_a_well_formed_tau2_file_loads(tmp_path: Path) -> None:
    """The well-formed tasks the hostile cases start from load, as tau2 tasks on retail."""
    suite = load_suite(_write(tmp_path, _tasks()))
    assert suite.name == "tau2-retail"
    assert [t.id for t in suite.tasks] == ["0", "1", "2"]
    assert suite.tasks[1].tags == ["tau2-index:1", "tau2-reward-basis:DB"]
    assert suite.tasks[0].reference_actions[0].name == "find_user_id_by_email"


def test_null_optional_fields_take_tau2s_defaults(tmp_path: Path) -> None:
    """Null actions, arguments, communicate_info and reward_basis are tau2's defaults, not
    errors: no actions, no arguments, nothing to communicate, DB and COMMUNICATE."""
    tasks = _tasks()
    _set(_criteria(tasks, 0), "actions", None)
    _criteria(tasks)["actions"].append({"name": "list_all_product_types", "arguments": None})
    _set(_criteria(tasks), "communicate_info", None)
    _set(_criteria(tasks, 2), "reward_basis", None)
    suite = load_suite(_write(tmp_path, tasks))
    assert suite.tasks[0].reference_actions == []
    assert suite.tasks[1].reference_actions[1].arguments == {}
    assert suite.tasks[2].tags[1] == "tau2-reward-basis:DB,COMMUNICATE"


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_tau2_file_is_refused_naming_file_task_and_field(
    tmp_path: Path, data: Any, message: str
) -> None:
    """A tau2 tasks.json of the wrong shape is a SuiteError naming the file, the task (index
    and id) and the field, never another exception from inside the loader."""
    path = _write(tmp_path, data)
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: "), text
    assert len(text) < 1000, "the error quotes the file's content"
    assert re.search(message, text), text


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    """A tasks.json of bytes that are not UTF-8 is refused naming the file and the byte."""
    path = tmp_path / "tasks.json"
    path.write_bytes(b'[{"id": "\xff"}]')
    with pytest.raises(SuiteError, match=r"tasks.json: not UTF-8 text \(byte 9\)"):
        load_suite(path)


def test_a_suite_folders_task_file_that_is_a_list_is_named_not_quoted(tmp_path: Path) -> None:
    """A suite folder whose task file is a list (tau2's tasks in a harness suite) is refused
    naming the file and the top level, without the whole list in the message."""
    (tmp_path / "suite.json").write_text(
        json.dumps({"name": "s", "environment": "retail", "tasks": ["tasks.json"]})
    )
    _write(tmp_path, _tasks())
    with pytest.raises(SuiteError) as caught:
        load_suite(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'tasks.json'}: field (top level): a list is not of type 'object'"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _with(lambda t: _set(_action(t), "arguments", ["x"])),
            "task #1 (id '1'): field evaluation_criteria.actions[0].arguments: must be an object",
        ),
        (_with(lambda t: _set(t[2], "id", "0")), "task #2 (id '0'): field id: duplicated"),
        ({"tasks": []}, "holds an object without field format"),
    ],
    ids=["arguments not an object", "duplicate ids", "an object"],
)
def test_harness_run_shows_the_refusal_and_exits_2(tmp_path: Path, data: Any, message: str) -> None:
    """``harness run`` of a malformed tau2 file prints the loader's message on stderr and
    exits 2, writing no run."""
    path = _write(tmp_path, data)
    logs = tmp_path / "logs"
    args = ["run", str(path), "--trials", "1", "--agent", "scripted", "--logs", str(logs)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    assert isinstance(out.exception, SystemExit), out.exception
    flat = " ".join(out.stderr.split())
    assert message in flat and str(path) in flat, out.stderr
    assert not logs.exists()


def test_harness_run_in_a_subprocess_shows_no_traceback(tmp_path: Path) -> None:
    """Run as a user runs it (``python -m harness run``), a tau2 file whose actions are not a
    list ends with the message naming file, task and field, exit status 2 and no traceback."""
    path = _write(tmp_path, _with(lambda t: _set(_criteria(t, 2), "actions", "none")))
    logs = tmp_path / "logs"
    command = [sys.executable, "-m", "harness", "run", str(path), "--agent", "scripted"]
    proc = subprocess.run(
        [*command, "--trials", "1", "--logs", str(logs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (
        "task #2 (id '2'): field evaluation_criteria.actions: must be a list of actions, "
        "not a string" in " ".join(proc.stderr.split())
    ), proc.stderr
    assert not logs.exists()
