"""Users with tools: tau2-bench's dual-control conversation, where the user acts on a device.

What tau2-bench does is read from its source at commit
a2c024725189473d2d7cea3a5cfdbcc67478e41f (github.com/sierra-research/tau2-bench, MIT):
src/tau2/orchestrator/orchestrator.py (``Orchestrator.step``: a user message that calls tools
goes to the environment and the results back to the user; ``_execute_tool_calls`` counts every
failed result as an error), src/tau2/user/user_simulator.py (the user's tools offered to its
model, the guidelines for users with tools, each call given ``requestor="user"``) and
src/tau2/user/user_simulator_base.py (``UserState.flip_roles``: the user sees its own calls and
their results, never the agent's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")

import harness as hx
from harness.agents import OpenAIAgent, OpenAIUser, ScriptedUser
from harness.agents.base import Toolbox
from harness.agents.user import SIMULATION_GUIDELINES_TOOLS, STOP, user_system_prompt, user_view
from harness.runs.toolbox import RecordingToolbox
from harness.suite import Task
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer, text_reply, tool_reply

from ..toy_env import write_files
from .phone_env import PhoneEnvironment

TASK = Task(id="p", instruction="My phone has no service.")
TOGGLE = {"tool_calls": [{"name": "toggle_airplane_mode", "arguments": {}}]}
LOOK = {"tool_calls": [{"name": "check_status_bar", "arguments": {}}]}


def after_greeting(*replies: dict[str, Any]) -> Any:
    """Reply ``i`` answers the agent's ``i``-th model call (the last one every later call)."""

    def policy(request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant") - 1
        return replies[min(turn, len(replies) - 1)]

    return policy


AGENT = after_greeting(
    tool_reply(("get_line", {"line_id": "l1"})),
    text_reply("Your line is active. Please turn airplane mode off."),
    text_reply("Glad it works."),
)


def test_a_scripted_users_calls_run_on_its_tools_and_answer_it(
    store: hx.Store, clock: FakeClock
) -> None:
    """The user's calls go to its own tools (a write as a transaction), their results come back
    to the user as tool messages with requestor "user", and the agent never sees either; the
    status the user reads after toggling is the phone's new state."""
    env = PhoneEnvironment()
    user = ScriptedUser(["I have no service.", TOGGLE, LOOK, f"It works now. {STOP}"])
    with FakeChatServer(AGENT) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="m", sleep=clock.sleep, user=user)
        with hx.Episode(state=env.state, store=store, clock=clock) as ep:
            toolbox = Toolbox(env.tools, ep, env)
            output = agent.run(TASK, toolbox, seed=0)
    messages = output.meta["messages"]
    assert [(m["role"], bool(m.get("tool_calls")), m.get("requestor")) for m in messages] == [
        ("assistant", False, None),
        ("user", False, None),
        ("assistant", True, None),
        ("tool", False, "assistant"),
        ("assistant", False, None),
        ("user", True, None),
        ("tool", False, "user"),
        ("user", True, None),
        ("tool", False, "user"),
        ("user", False, None),
    ]
    assert messages[5]["tool_calls"] == [
        {
            "id": "user_call_1_0",
            "name": "toggle_airplane_mode",
            "arguments": {},
            "requestor": "user",
        }
    ]
    assert [m["content"] for m in messages if m.get("requestor") == "user"] == [
        "Airplane mode is now OFF.",
        "Signal: excellent",
    ]
    assert output.meta["termination_reason"] == "user_stop"
    assert output.meta["user_tool_calls"] == 2 and output.meta["num_errors"] == 0
    assert env.state["phone/p1"] == {"airplane": False}
    txns = [(t.action, t.status) for t in store.transactions(ep.id)]
    assert txns == [("toggle_airplane_mode", "committed")]
    assert [(c.name, c.requestor, c.write) for c in toolbox.calls] == [
        ("get_line", "assistant", False),
        ("toggle_airplane_mode", "user", True),
        ("check_status_bar", "user", False),
    ]
    # The agent's model saw the user's text only: no user tool call, no user tool result.
    seen = json.dumps([r["messages"] for r in server.requests])
    assert "user_call" not in seen and "Airplane mode" not in seen
    assert [m["role"] for m in server.requests[-1]["messages"]] == [
        *("system", "assistant", "user", "assistant", "tool")
    ]


def test_a_users_failed_call_counts_as_an_error_and_the_user_reads_it(
    store: hx.Store, clock: FakeClock
) -> None:
    """A call to a tool the user does not have (an agent's tool included) is answered to the
    user as an error, and counted towards max_errors as tau2 counts every failed result."""
    env = PhoneEnvironment()
    wrong = {"tool_calls": [{"name": "get_line", "arguments": {"line_id": "l1"}}]}
    user = ScriptedUser(["Hi.", wrong, STOP])
    with FakeChatServer(AGENT) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="m", sleep=clock.sleep, user=user)
        with hx.Episode(state=env.state, store=store, clock=clock) as ep:
            output = agent.run(TASK, Toolbox(env.tools, ep, env), seed=0)
    (result,) = [m for m in output.meta["messages"] if m.get("requestor") == "user"]
    assert result["error"] is True
    assert "unknown tool 'get_line'; the user's tools: check_status_bar" in result["content"]
    assert output.meta["num_errors"] == 1


def test_the_model_user_is_offered_its_tools_and_sees_its_own_calls(
    store: hx.Store, clock: FakeClock
) -> None:
    """The user's model gets the user's tool definitions and tau2's guidelines for users with
    tools; its tool call runs on the phone and the next request shows the call and its result
    (and not the agent's call)."""
    env = PhoneEnvironment()
    user_script = [
        text_reply("I have no service."),
        tool_reply(("toggle_airplane_mode", {})),
        text_reply(f"Fixed. {STOP}"),
    ]
    with FakeChatServer(AGENT) as agent_s, FakeChatServer(user_script) as user_s:
        user = OpenAIUser(base_url=user_s.base_url, model="u", sleep=clock.sleep)
        agent = OpenAIAgent(base_url=agent_s.base_url, model="m", sleep=clock.sleep, user=user)
        with hx.Episode(state=env.state, store=store, clock=clock) as ep:
            toolbox = Toolbox(env.tools, ep, env)
            output = agent.run(TASK, toolbox, seed=4)
    first = user_s.requests[0]
    assert first["tools"] == toolbox.user_specs and first["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in first["tools"]] == [
        "toggle_airplane_mode",
        "check_status_bar",
    ]
    assert first["messages"][0] == {
        "role": "system",
        "content": user_system_prompt(TASK, SIMULATION_GUIDELINES_TOOLS),
    }
    third = user_s.requests[2]["messages"]
    call = third[-2]
    assert call["role"] == "assistant" and call["tool_calls"][0]["function"] == {
        "name": "toggle_airplane_mode",
        "arguments": "{}",
    }
    assert third[-1] == {
        "role": "tool",
        "tool_call_id": call["tool_calls"][0]["id"],
        "content": "Airplane mode is now OFF.",
    }
    assert third[1:-2] == [
        {"role": "user", "content": "Hi! How can I help you today?"},
        {"role": "assistant", "content": "I have no service."},
        {"role": "user", "content": "Your line is active. Please turn airplane mode off."},
    ]
    assert output.meta["termination_reason"] == "user_stop"
    assert env.state["phone/p1"] == {"airplane": False}
    assert user_s.errors == [] and agent_s.errors == []


def test_user_view_keeps_the_users_calls_and_results_only() -> None:
    """tau2's flip_roles with tools: the user's calls as the assistant's, their results as tool
    messages; the agent's calls and results left out."""
    messages = [
        {"role": "assistant", "content": "Hi!", "tool_calls": None},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "name": "get_line"}]},
        {"role": "tool", "id": "a", "content": "{}", "requestor": "assistant"},
        {
            "role": "user",
            "content": None,
            "tool_calls": [{"id": "u", "name": "reboot", "arguments": {"x": 1}}],
        },
        {"role": "tool", "id": "u", "content": "ok", "requestor": "user"},
    ]
    assert user_view(messages) == [
        {"role": "user", "content": "Hi!"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "u",
                    "type": "function",
                    "function": {"name": "reboot", "arguments": json.dumps({"x": 1})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "u", "content": "ok"},
    ]


def test_scripted_tool_turns_are_checked() -> None:
    with pytest.raises(hx.ConfigurationError, match="a turn calling tools"):
        ScriptedUser([{"calls": []}])
    with pytest.raises(hx.ConfigurationError, match="call 0"):
        ScriptedUser([{"tool_calls": [{"arguments": {}}]}])


def test_a_users_calls_are_recorded_resumed_and_replayed(tmp_path: Path) -> None:
    """A run with a user who acts: the user's write is a transaction and its read is recorded
    (with requestor "user"); harness replay re-runs the conversation from the record and gets
    the recorded results back, with no divergence."""
    from harness.runs import replay_episode
    from harness.runs.start import run_trials

    folder = write_files(
        tmp_path / "suite",
        "phone",
        "tests.agents.phone_env:PhoneEnvironment",
        [{"id": "p", "version": "1", "instruction": "No service.", "reference_actions": []}],
    )
    with FakeChatServer(AGENT) as server:
        options = {
            "base_url": server.base_url,
            "model": "fake",
            "user": "scripted",
            "user_replies": ["I have no service.", TOGGLE, LOOK, STOP],
        }
        run = run_trials(
            hx.load_suite(folder), agent="openai", agent_options=options, logs=tmp_path / "logs"
        )
    (result,) = run.results
    assert not result.infra_error
    store = hx.Store(f"sqlite:///{run.folder / 'harness.db'}")
    try:
        txns = [(t.action, t.status) for t in store.transactions(result.episode_id)]
        recorded = [json.loads(r.payload) for r in store.log(result.episode_id)]
    finally:
        store.close()
    assert txns == [("toggle_airplane_mode", "committed")]
    reads = [r["request"] for r in recorded if r.get("what") == "read"]
    assert reads == [
        {"tool": "get_line", "arguments": {"line_id": "l1"}},
        {"tool": "check_status_bar", "arguments": {}, "requestor": "user"},
    ]
    report = replay_episode(run.folder, result.episode_id, trust=True)
    assert report.ok and report.divergence is None and report.replayed == report.steps


def test_a_recording_toolbox_answers_a_users_read_from_the_record(
    store_url: str, clock: FakeClock
) -> None:
    """Resumed, a user's read gets its recorded answer even when the phone has changed since."""
    env = PhoneEnvironment()
    with hx.Episode(state=env.state, store=store_url, clock=clock, episode_id="e") as ep:
        first = RecordingToolbox(env.tools, ep, env).call("check_status_bar", requestor="user")
    env.state["phone/p1"] = {"airplane": False}
    with hx.Episode(
        state=env.state, store=store_url, clock=clock, episode_id="e", resume=True
    ) as again:
        second = RecordingToolbox(env.tools, again, env).call("check_status_bar", requestor="user")
    assert first.content == second.content == "Airplane Mode"
