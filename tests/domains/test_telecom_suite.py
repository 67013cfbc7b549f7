"""The built-in telecom suite: tau2's telecom tasks loaded with their initialization, the
user's reference calls and their env assertions, scored by the environment's reward, and a run
of the scripted agent through the CLI that passes every task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import harness as hx
from harness._json import digest
from harness.cli import main
from harness.suite import ToolCall, builtin_suite

TAU2_FILE = Path(__file__).resolve().parents[2] / "tasks" / "telecom" / "tau2_tasks_small.json"


def test_tau2_telecom_tasks_keep_setup_requestors_and_assertions() -> None:
    """A tau2 telecom task keeps its initialization actions, each reference call's requestor
    and its env assertions; the built-in suite's tasks are the tau2 file's."""
    raw = json.loads(TAU2_FILE.read_text(encoding="utf-8"))
    loaded = hx.load_suite(TAU2_FILE)
    assert loaded.name == "tau2-telecom" and len(loaded.tasks) == len(raw) == 20
    for task, upstream in zip(loaded.tasks, raw, strict=True):
        crit = upstream["evaluation_criteria"]
        assert task.initialization == upstream["initial_state"]["initialization_actions"]
        assert task.env_assertions == crit["env_assertions"]
        assert [(c.name, c.requestor) for c in task.reference_actions] == [
            (a["name"], a["requestor"]) for a in crit["actions"]
        ]
    builtin = hx.load_suite("telecom")
    assert builtin.path == builtin_suite("telecom")
    assert {t.id: t.digest for t in builtin.tasks} == {t.id: t.digest for t in loaded.tasks}


def test_tasks_without_the_new_fields_keep_their_digest() -> None:
    """An agent's call dumps without a requestor, and a task without initialization or env
    assertions has the digest it had before they existed."""
    task = hx.Task(id="t", instruction="do", reference_actions=[ToolCall(name="a")])
    assert "requestor" not in task.reference_actions[0].model_dump()
    before = {
        "id": "t",
        "version": "1",
        "instruction": "do",
        "reference_actions": [{"name": "a", "arguments": {}}],
        "expect": "complete",
        "required_outputs": [],
        "checks": [],
        "partial_credit": "steps",
        "user": {},
        "tags": [],
        "source": "",
    }
    assert task.digest == digest(before)
    user_call = ToolCall(name="a", requestor="user")
    assert user_call.model_dump()["requestor"] == "user"


def test_a_trial_is_scored_by_tau2s_environment_reward(tmp_path: Path) -> None:
    """The scripted agent (its user's calls made with the user's tools) passes every task,
    each verdict tau2's environment reward; an agent that does nothing fails those whose
    assertions need a fix."""
    logs = tmp_path / "logs"
    args = ["run", "telecom", "--agent", "scripted", "--trials", "1", "--logs", str(logs)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "passed 20, failed 0" in out.output, out.output
    (folder,) = logs.iterdir()
    report = CliRunner().invoke(main, ["report", str(folder), "--json"])
    assert json.loads(report.output)["pass_hat_k"][0]["value"] == 1.0
    suite = hx.load_suite("telecom")
    task = next(t for t in suite.tasks if len(t.reference_actions) == 4)
    env = suite.environment_for(task)
    assert env.reward(task)["reward"] == 0.0  # the line is suspended, the bill unpaid
    for call in task.reference_actions:
        tool = (env.user_tools if call.requestor == "user" else env.tools)[call.name]
        (tool.fn if isinstance(tool, hx.Action) else tool)(**call.arguments)
    info: dict[str, Any] = env.reward(task)
    assert info["reward"] == 1.0 and info["reward_basis"] == ["ENV_ASSERTION"]
    assert all(check["met"] for check in info["env_assertions"])
