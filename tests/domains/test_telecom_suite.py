"""The built-in telecom suite: tau2's telecom tasks loaded with their initialization, the
user's reference calls and their env assertions, scored by the environment's reward, and a run
of the scripted agent through the CLI that passes every task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness._json import digest
from harness.agents.base import AgentOutput, Toolbox
from harness.agents.user import STOP
from harness.cli import main
from harness.report.export import export_run
from harness.runs import replay_episode
from harness.suite import ToolCall, builtin_suite
from harness.testing.model_server import FakeChatServer, text_reply, tool_reply

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


HAND_OFFS = [
    "[service_issue]lock_sim_card_pin[PERSONA:Hard]",
    "[service_issue]contract_end_suspension[PERSONA:Hard]",
]


class ClaimsTheTransfer:
    """Makes no call, but records a conversation in which it transferred the user: the reward
    must read the trial's record, not the agent's account."""

    name = "claims-transfer"

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def run(self, task: hx.Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        call = {"name": "transfer_to_human_agents", "arguments": {"summary": "done"}}
        messages = [
            {"role": "user", "content": task.instruction},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", **call}]},
            {"role": "tool", "id": "c1", "content": "Transfer successful"},
            {"role": "assistant", "content": "I have transferred you to a human agent."},
        ]
        return AgentOutput(message="I have transferred you.", meta={"messages": messages})


def _action(verdict: dict[str, Any]) -> dict[str, Any]:
    (check,) = [c for c in verdict["checks"] if c["name"] == "environment_reward"]
    return dict(check["compared"])


def test_the_hand_off_tasks_score_tau2s_action_reward_from_the_record(tmp_path: Path) -> None:
    """On the two tasks whose basis is ENV_ASSERTION and ACTION, the phone's assertions hold
    without any call (the line is out of service): an agent that only says it transferred the
    user fails on ACTION, checked against the calls the trial's record holds; the scripted agent
    (it transfers) passes; replay and the tau2 export read the same parts."""
    suite = hx.load_suite("telecom")
    tasks = [t for t in suite.tasks if t.id in HAND_OFFS]
    assert [t.reference_actions[0].compare_args for t in tasks] == [[], []]
    claimed = hx.run_trials(suite, agent=ClaimsTheTransfer(), tasks=HAND_OFFS, logs=tmp_path / "a")
    scripted = hx.run_trials(suite, agent="scripted", tasks=HAND_OFFS, logs=tmp_path / "b")
    assert [r.passed for r in claimed.results] == [False, False]
    assert [r.passed for r in scripted.results] == [True, True]
    for result, matched, agent in ((claimed, False, ClaimsTheTransfer()), (scripted, True, None)):
        for trial in result.results:
            replayed = replay_episode(result.folder, trial.episode_id, agent=agent)
            assert replayed.recorded_verdict is not None
            info = _action(replayed.recorded_verdict)
            assert info["reward_breakdown"] == {"ENV_ASSERTION": 1.0, "ACTION": float(matched)}
            assert [c["action_match"] for c in info["action_checks"]] == [matched]
            assert info["action_checks"][0]["tool_type"] == "generic"
            assert _action(replayed.verdict) == info
    out = tmp_path / "t2.json"
    export_run(claimed.folder, "tau2", out)
    for sim in json.loads(out.read_text(encoding="utf-8"))["simulations"]:
        reward = sim["reward_info"]
        assert reward["reward"] == 0.0
        assert reward["reward_breakdown"] == {"ENV_ASSERTION": 1.0, "ACTION": 0.0}
        assert [c["met"] for c in reward["env_assertions"]] == [True]
        assert [c["action_match"] for c in reward["action_checks"]] == [False]


def test_a_failed_device_assertion_reads_as_failed_in_the_tau2_export(tmp_path: Path) -> None:
    """An agent that does nothing on a task whose fix is on the phone: tau2's export writes the
    assertion unmet and ENV_ASSERTION 0, as the environment's reward recorded it (not 1.0)."""
    suite = hx.load_suite("telecom")
    task = next(t for t in suite.tasks if t.env_assertions and t.id not in HAND_OFFS)
    result = hx.run_trials(suite, agent=ClaimsTheTransfer(), tasks=[task.id], logs=tmp_path)
    assert [r.passed for r in result.results] == [False]
    out = tmp_path / "t2.json"
    export_run(result.folder, "tau2", out)
    (sim,) = json.loads(out.read_text(encoding="utf-8"))["simulations"]
    reward = sim["reward_info"]
    assert reward["reward"] == 0.0 and reward["reward_breakdown"]["ENV_ASSERTION"] == 0.0
    assert not all(c["met"] for c in reward["env_assertions"])
    (exported,) = [t for t in json.loads(out.read_text())["tasks"] if t["id"] == task.id]
    assert exported["initial_state"]["initialization_actions"] == task.initialization
    assert exported["evaluation_criteria"]["env_assertions"] == task.env_assertions
    assert [a["requestor"] for a in exported["evaluation_criteria"]["actions"]] == [
        c.requestor for c in task.reference_actions
    ]


def test_compare_args_decide_which_calls_count(tmp_path: Path) -> None:
    """tau2's compare_with_tool_call: an empty list compares the name only, None every argument
    the call gave, a list those arguments; a compare_args that is not a list of names is
    refused with the field named."""
    gold = ToolCall(name="t", arguments={"a": 1, "b": 2}, compare_args=[])
    assert gold.matches("t", {"a": 9}) and not gold.matches("u", {})
    every = ToolCall(name="t", arguments={"a": 1, "b": 2})
    assert every.matches("t", {"a": 1}) and not every.matches("t", {"a": 1, "b": 3})
    some = ToolCall(name="t", arguments={"a": 1, "b": 2}, compare_args=["b"])
    assert some.matches("t", {"a": 5, "b": 2}) and not some.matches("t", {"b": 1})
    assert "compare_args" not in every.model_dump() and gold.model_dump()["compare_args"] == []
    raw = json.loads(TAU2_FILE.read_text(encoding="utf-8"))
    raw[0]["evaluation_criteria"]["actions"][0]["compare_args"] = [1]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(hx.SuiteError, match=r"compare_args.*argument names"):
        hx.load_suite(path)


def _turns(*replies: dict[str, Any], greeted: bool) -> Any:
    """A model script: reply ``i`` answers its ``i``-th call (its own earlier turns are the
    request's assistant messages; the agent's greeting is one of them, made by no call)."""

    def policy(request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant") - greeted
        return replies[min(turn, len(replies) - 1)]

    return policy


OVERDUE = "[service_issue]overdue_bill_suspension[PERSONA:Easy]"


def test_a_model_agent_and_a_model_user_on_the_phone_fix_a_suspended_line(tmp_path: Path):
    """`harness run telecom --agent openai --user openai`: the agent's CRM writes and the user's
    calls on the phone (paying the bill the agent sent, rebooting) run in one trial, the user's
    from the user's model with the user's tools; tau2's reward passes the trial, the export
    gives the user's calls as the user's, and a user who never pays leaves the line suspended
    and the trial failed."""
    agent = _turns(
        tool_reply(("send_payment_request", {"customer_id": "C1001", "bill_id": "B1234321"})),
        text_reply("I sent a payment request for your overdue bill: please pay it."),
        tool_reply(("resume_line", {"customer_id": "C1001", "line_id": "L1002"})),
        text_reply("Your line is resumed: please reboot your phone."),
        text_reply("Glad to help."),
        greeted=True,
    )
    pays = _turns(
        text_reply("My phone has no service. I am John Smith, 555-123-2002."),
        tool_reply(("make_payment", {})),
        text_reply("I paid it."),
        tool_reply(("reboot_device", {})),
        text_reply(f"It works now, thanks. {STOP}"),
        greeted=False,
    )
    never = _turns(
        text_reply("My phone has no service. I am John Smith, 555-123-2002."),
        text_reply(f"I will not pay. {STOP}"),
        greeted=False,
    )
    for name, user, passed in (("pays", pays, True), ("never", never, False)):
        with FakeChatServer(agent) as agent_s, FakeChatServer(user) as user_s:
            args = ["run", "telecom", "--task", OVERDUE, "--trials", "1"]
            args += ["--agent", "openai", "--base-url", agent_s.base_url, "--model", "m"]
            args += ["--user", "openai", "--user-base-url", user_s.base_url, "--user-model", "u"]
            out = CliRunner().invoke(main, [*args, "--logs", str(tmp_path / name)])
            assert agent_s.errors == [] and user_s.errors == []
        assert out.exit_code == 0, out.output
        assert f"passed {int(passed)}, failed {int(not passed)}" in out.output, out.output
        (folder,) = (tmp_path / name).iterdir()
        path = export_run(folder, "tau2", tmp_path / f"{name}.json")
        (sim,) = json.loads(path.read_text(encoding="utf-8"))["simulations"]
        assert sim["reward_info"]["reward"] == float(passed)
        assert sim["reward_info"]["env_assertions"] and all(
            c["met"] is passed for c in sim["reward_info"]["env_assertions"][:1]
        )
        user_calls = [
            c["name"]
            for m in sim["messages"]
            if m["role"] == "user"
            for c in m.get("tool_calls") or []
        ]
        assert user_calls == (["make_payment", "reboot_device"] if passed else [])
