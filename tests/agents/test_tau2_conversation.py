"""tau2-bench's conversation loop on the retail environment, with tau2's own tasks file.

The message sequences checked here are what tau2-bench's half-duplex ``Orchestrator``
(src/tau2/orchestrator/orchestrator.py at commit a2c024725189473d2d7cea3a5cfdbcc67478e41f,
github.com/sierra-research/tau2-bench, MIT) produces: the agent's greeting first
(``DEFAULT_FIRST_AGENT_MESSAGE``), then the user, the agent's tool calls each followed by
their results, the agent's text to the user; a user message with ``###STOP###``,
``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` ends it as ``user_stop``; ``max_steps`` and
``max_errors`` are checked after every step that does not wait on tools (``_check_termination``).
The agent's model is a FakeChatServer; the user is scripted or a second fake server.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")

from click.testing import CliRunner

import harness as hx
from harness.agents import OpenAIAgent, ScriptedUser, User
from harness.agents.base import AgentOutput, Toolbox
from harness.agents.openai import GREETING, TAU2_AGENT_INSTRUCTION, TAU2_SYSTEM_PROMPT
from harness.agents.user import OUT_OF_SCOPE, STOP, TRANSFER
from harness.suite import Task, load_suite
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer, ReplayPolicy, text_reply, tool_reply

TAU2_TASKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2-retail" / "tasks.json"
TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
WRITES = ("exchange", "return", "cancel", "modify")


@pytest.fixture(scope="module")
def suite() -> Any:
    """tau2's retail tasks file, loaded as a suite (skipped when the shared data is absent)."""
    if not TAU2_TASKS.exists():
        pytest.skip(f"reference data absent: {TAU2_TASKS}")
    return load_suite(TAU2_TASKS)


@pytest.fixture(scope="module")
def task(suite: Any) -> Task:
    """tau2 retail task 0: find the user, read the order and products, exchange two items."""
    return next(t for t in suite.tasks if t.id == "0")


def after_greeting(*replies: dict[str, Any]) -> Any:
    """An agent script: reply ``i`` answers the agent's ``i``-th model call (the greeting in
    the history is none); the last reply answers every later call."""

    def policy(request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant") - 1
        return replies[min(turn, len(replies) - 1)]

    return policy


def converse(
    suite: Any,
    task: Task,
    script: Any,
    user: User,
    store: hx.Store,
    **options: Any,
) -> tuple[AgentOutput, FakeChatServer, Any, str]:
    """One conversation on a fresh retail environment: the output, the agent's server, the
    final export and the episode's id."""
    env = suite.new_environment()
    try:
        with FakeChatServer(script) as server:
            agent = OpenAIAgent(
                base_url=server.base_url,
                model="fake",
                sleep=FakeClock().sleep,
                user=user,
                **options,
            )
            with hx.Episode(state=env.state, store=store, task_id=task.id) as ep:
                output = agent.run(task, Toolbox(env.tools, ep, env), seed=3)
        return output, server, env.export(), ep.id
    finally:
        env.close()


def reference_export(task: Task) -> Any:
    """The database after the task's reference actions on the plain tools."""
    from harness.domains.retail.environment import RetailEnvironment
    from harness.domains.retail.tools import RetailError

    with RetailEnvironment() as env:
        for call in task.reference_actions:
            with contextlib.suppress(RetailError):
                getattr(env.backend, call.name)(**call.arguments)
        return env.export()


def roles(output: AgentOutput) -> list[str]:
    """The conversation's roles, a tool call written ``call``."""
    return [
        "call" if m["role"] == "assistant" and m["tool_calls"] else m["role"]
        for m in output.meta["messages"]
    ]


def check_shape(output: AgentOutput) -> None:
    """What tau2's message models and ``validate_message_history`` require of a trajectory:
    turn indexes in order, every tool call answered by a tool message with its id, in order,
    before anyone speaks again, and user and agent text alternating otherwise."""
    messages = output.meta["messages"]
    assert [m["turn_idx"] for m in messages] == list(range(len(messages)))
    assert messages[0] == {
        "role": "assistant",
        "content": GREETING,
        "tool_calls": None,
        "turn_idx": 0,
        "timestamp": messages[0]["timestamp"],
        "cost": 0.0,
        "usage": None,
    }
    waiting: list[str] = []
    last_speaker = None
    for m in messages:
        assert isinstance(m["timestamp"], str)
        if m["role"] == "tool":
            assert waiting and m["id"] == waiting.pop(0)
            assert m["requestor"] == "assistant" and isinstance(m["error"], bool)
            assert isinstance(m["content"], str)
            continue
        assert not waiting, "a message before every tool call was answered"
        if m["role"] == "assistant" and m["tool_calls"]:
            for call in m["tool_calls"]:
                assert set(call) == {"id", "name", "arguments", "requestor"}
                assert call["requestor"] == "assistant" and isinstance(call["arguments"], dict)
            waiting = [c["id"] for c in m["tool_calls"]]
            continue
        assert m["role"] != last_speaker, "two text messages of one side in a row"
        last_speaker = m["role"]


def test_a_conversation_ends_with_the_users_stop(
    suite: Any, task: Task, store: hx.Store, tmp_path: Path
) -> None:
    """Greeting, the user's request, each reference action as a tool call and its result, the
    agent's answer, the user's ###STOP###: user_stop, and the database as the reference leaves
    it, every write a committed transaction."""
    user = ScriptedUser([task.instruction])
    output, server, final, episode_id = converse(suite, task, ReplayPolicy(task), user, store)
    check_shape(output)
    n = len(task.reference_actions)
    assert roles(output) == ["assistant", "user", *["call", "tool"] * n, "assistant", "user"]
    messages = output.meta["messages"]
    assert messages[1]["content"] == task.instruction and messages[-1]["content"] == STOP
    called = [m["tool_calls"][0] for m in messages if m["role"] == "assistant" and m["tool_calls"]]
    assert [(c["name"], c["arguments"]) for c in called] == [
        (a.name, dict(a.arguments)) for a in task.reference_actions
    ]
    assert output.meta["termination_reason"] == "user_stop" and output.claimed_success
    assert output.meta["stop_token"] == STOP and not output.meta["transferred"]
    assert output.meta["steps"] == len(messages) - 1 and output.meta["num_errors"] == 0
    assert (output.meta["max_steps"], output.meta["max_errors"]) == (200, 10)
    assert output.meta["user"] == {
        "implementation": "scripted",
        "replies": [task.instruction],
        "then": STOP,
    }
    # The agent's model read tau2's system prompt, the greeting, then the user.
    env = suite.new_environment()
    try:
        policy = env.policy
    finally:
        env.close()
    first = server.requests[0]["messages"]
    assert first == [
        {
            "role": "system",
            "content": TAU2_SYSTEM_PROMPT.format(
                agent_instruction=TAU2_AGENT_INSTRUCTION, domain_policy=policy
            ),
        },
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": task.instruction},
    ]
    assert output.meta["model_call_count"] == len(server.requests) == n + 1
    assert final == reference_export(task)
    writes = [t for t in store.transactions(episode_id)]
    assert writes and all(t.status == "committed" for t in writes)
    assert [t.action for t in writes] == [
        a.name for a in task.reference_actions if a.name.startswith(WRITES)
    ]
    assert server.errors == []


def test_a_transfer_to_a_human(suite: Any, task: Task, store: hx.Store) -> None:
    """As in tau2: the transfer tool's result goes back to the agent, which tells the user, who
    answers ###TRANSFER###: user_stop, the transfer recorded, nothing written."""
    script = after_greeting(
        tool_reply(("transfer_to_human_agents", {"summary": "The user asks for a person."})),
        text_reply(TRANSFER_MESSAGE),
    )
    user = ScriptedUser(["I want to talk to a person."], then=TRANSFER)
    output, _, final, episode_id = converse(suite, task, script, user, store)
    check_shape(output)
    assert roles(output) == ["assistant", "user", "call", "tool", "assistant", "user"]
    messages = output.meta["messages"]
    assert messages[2]["tool_calls"][0]["name"] == "transfer_to_human_agents"
    assert messages[3]["content"] == "Transfer successful" and not messages[3]["error"]
    assert messages[4]["content"] == TRANSFER_MESSAGE and messages[5]["content"] == TRANSFER
    assert output.meta["termination_reason"] == "user_stop" and output.claimed_success
    assert output.meta["transferred"] and output.meta["stop_token"] == TRANSFER
    assert output.message == TRANSFER_MESSAGE
    assert store.transactions(episode_id) == [] and final == reference_export(
        Task(id="none", reference_actions=[])
    )


def test_an_out_of_scope_request(suite: Any, task: Task, store: hx.Store) -> None:
    """A user whose scenario does not say how to go on answers ###OUT-OF-SCOPE###: user_stop
    with that token, after the agent's question."""
    script = after_greeting(text_reply("Could you give me the email on your account?"))
    user = ScriptedUser(["I'd like to exchange a keyboard."], then=OUT_OF_SCOPE)
    output, server, _, _ = converse(suite, task, script, user, store)
    check_shape(output)
    assert roles(output) == ["assistant", "user", "assistant", "user"]
    assert output.meta["messages"][-1]["content"] == OUT_OF_SCOPE
    assert output.meta["termination_reason"] == "user_stop"
    assert output.meta["stop_token"] == OUT_OF_SCOPE and output.meta["steps"] == 3
    assert len(server.requests) == 1


def test_max_steps_ends_an_agent_that_never_answers(
    suite: Any, task: Task, store: hx.Store
) -> None:
    """An agent calling a tool every turn is stopped by max_steps after the tool results that
    reach it (tau2 does not check while the tools are awaited), so 6 and 7 stop at 7 steps."""
    script = after_greeting(tool_reply(("get_order_details", {"order_id": "#W2378156"})))
    for max_steps in (6, 7):
        user = ScriptedUser(["Where is my order #W2378156?"])
        output, server, _, _ = converse(suite, task, script, user, store, max_steps=max_steps)
        check_shape(output)
        assert roles(output) == ["assistant", "user", *["call", "tool"] * 3]
        assert output.meta["termination_reason"] == "max_steps" and not output.claimed_success
        assert output.meta["steps"] == 7 and output.meta["max_steps"] == max_steps
        assert len(server.requests) == 3


def test_max_steps_replaces_a_stop_of_the_same_step(
    suite: Any, task: Task, store: hx.Store
) -> None:
    """As tau2's _check_termination: a stop said at the last allowed step ends as max_steps."""
    script = after_greeting(text_reply("Anything else?"))
    output, _, _, _ = converse(suite, task, script, ScriptedUser(["Hi."]), store, max_steps=3)
    assert roles(output) == ["assistant", "user", "assistant", "user"]
    assert output.meta["messages"][-1]["content"] == STOP
    assert output.meta["termination_reason"] == "max_steps"


def test_max_errors_ends_an_agent_whose_calls_fail(suite: Any, task: Task, store: hx.Store) -> None:
    """Each failed tool call is an error; at max_errors the conversation ends as
    too_many_errors, every failure a tool message marked error, nothing written."""
    script = after_greeting(
        tool_reply(("get_order_details", {"order_id": "#W0000000"})),
        tool_reply(
            ("cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"}),
            ("get_user_details", {"user_id": "nobody"}),
        ),
    )
    user = ScriptedUser(["Cancel my order #W0000000."])
    output, _, final, episode_id = converse(suite, task, script, user, store, max_errors=3)
    check_shape(output)
    assert roles(output) == ["assistant", "user", "call", "tool", "call", "tool", "tool"]
    tools = [m for m in output.meta["messages"] if m["role"] == "tool"]
    assert all(m["error"] and m["content"].startswith("Error") for m in tools)
    assert output.meta["termination_reason"] == "too_many_errors"
    assert output.meta["num_errors"] == 3 and not output.claimed_success
    assert all(t.status != "committed" for t in store.transactions(episode_id))
    assert final == reference_export(Task(id="none", reference_actions=[]))


def test_an_empty_agent_reply_is_an_agent_error(suite: Any, task: Task, store: hx.Store) -> None:
    """A reply with neither text nor a tool call ends the conversation as agent_error: read
    strictly (simulation_errors='fail'), the conversation ends there, as the agent's failure."""
    script = after_greeting(text_reply(""))
    output, _, _, _ = converse(
        suite, task, script, ScriptedUser(["Hi."]), store, simulation_errors="fail"
    )
    assert output.meta["termination_reason"] == "agent_error" and not output.claimed_success


def test_by_default_an_empty_reply_fails_the_simulation_as_tau2s_runner_does(
    suite: Any, task: Task, store: hx.Store
) -> None:
    """tau2's runner raises on such a message: by default the conversation raises
    SimulationFailed, an infrastructure error carrying the conversation so far."""
    from harness.agents.openai import SimulationFailed

    script = after_greeting(text_reply(""))
    with pytest.raises(SimulationFailed, match="no text and no tool call") as raised:
        converse(suite, task, script, ScriptedUser(["Hi."]), store)
    assert raised.value.agent_meta["termination_reason"] == "agent_error"
    with pytest.raises(hx.ConfigurationError, match="simulation_errors"):
        converse(suite, task, script, ScriptedUser(["Hi."]), store, simulation_errors="lenient")


def test_the_llm_user_converses_on_a_tau2_task(suite: Any, task: Task, store: hx.Store) -> None:
    """A model user on a second server gets the task's scenario and its answers drive the
    conversation to its stop."""
    from harness.agents import OpenAIUser
    from harness.agents.user import user_system_prompt

    with FakeChatServer(
        [text_reply("I need to exchange two items of order #W2378156."), text_reply(STOP)]
    ) as user_server:
        user = OpenAIUser(base_url=user_server.base_url, model="user-model")
        script = after_greeting(text_reply("Sure, I can help with that."))
        output, _, _, _ = converse(suite, task, script, user, store)
    assert output.meta["termination_reason"] == "user_stop"
    system = user_server.requests[0]["messages"][0]["content"]
    assert system == user_system_prompt(task)
    assert task.user["reason_for_call"] in system and "<scenario>" in system
    assert output.meta["user"]["implementation"] == "openai"
    assert output.meta["user"]["llm"] == "user-model"


def test_harness_run_with_a_scripted_user(suite: Any, task: Task, tmp_path: Path) -> None:
    """`harness run tasks.json --agent openai --user scripted` runs the conversation in each
    trial and the trial records its messages, termination reason, caps and user."""
    from harness.cli import main as cli

    with FakeChatServer(ReplayPolicy(suite.tasks)) as server:
        result = CliRunner().invoke(
            cli,
            [
                "run",
                str(TAU2_TASKS),
                "--agent",
                "openai",
                "--base-url",
                server.base_url,
                "--model",
                "fake",
                "--user",
                "scripted",
                "--max-steps",
                "50",
                "--task",
                task.id,
                "--trials",
                "1",
                "--logs",
                str(tmp_path),
            ],
        )
    assert "run folder:" in result.output, result.output
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (trial,) = hx.Store(f"sqlite:///{folder / 'harness.db'}").trials()
    meta = trial.agent_meta
    assert meta["termination_reason"] == "user_stop"
    assert (meta["max_steps"], meta["max_errors"]) == (50, 10)
    assert meta["user"]["implementation"] == "scripted"
    assert [m["role"] for m in meta["messages"]][:2] == ["assistant", "user"]
    assert not trial.infra_error


def test_harness_run_refuses_user_flags_without_a_conversation(tmp_path: Path) -> None:
    """--user needs the openai agent, and the conversation's flags need --user."""
    from harness.cli import main as cli

    runner = CliRunner()
    bad = runner.invoke(cli, ["run", "retail", "--agent", "scripted", "--user", "scripted"])
    assert bad.exit_code == 2 and "--agent openai" in bad.output
    bad = runner.invoke(cli, ["run", "retail", "--agent", "openai", "--max-steps", "5"])
    assert bad.exit_code == 2 and "add --user" in bad.output


def test_a_recorded_conversation_replays_without_either_server(
    suite: Any, task: Task, tmp_path: Path
) -> None:
    """A run's conversation with a model user re-runs from its record alone (the agent's and
    the user's answers remembered): no divergence, every step replayed, both servers gone."""
    from harness.runs import replay_episode
    from harness.runs.start import run_trials

    def user_policy(request: dict[str, Any]) -> dict[str, Any]:
        said = sum(1 for m in request["messages"] if m["role"] == "assistant")
        return text_reply(task.instruction if said == 0 else STOP)

    with FakeChatServer(ReplayPolicy(task)) as agent_s, FakeChatServer(user_policy) as user_s:
        options = {
            "base_url": agent_s.base_url,
            "model": "fake",
            "user": "openai",
            "user_base_url": user_s.base_url,
            "user_model": "user-model",
        }
        run = run_trials(
            suite, agent="openai", agent_options=options, tasks=[task.id], logs=tmp_path
        )
        asked = (len(agent_s.requests), len(user_s.requests))
    (result,) = run.results
    assert result.passed and not result.infra_error and asked[1] == 2
    report = replay_episode(run.folder, result.episode_id, trust=True)
    assert report.ok and report.divergence is None and report.replayed == report.steps


def _run_empty_first(tmp_path: Path, task: Task, empties: int, *extra: str) -> Any:
    """`harness run` of one tau2 task whose agent's server answers its first ``empties``
    conversations with an empty reply, and the later ones as the task's reference does."""
    from harness.cli import main as cli

    replay = ReplayPolicy([task])
    seen: list[int] = []

    def policy(request: dict[str, Any]) -> dict[str, Any]:
        if sum(1 for m in request["messages"] if m["role"] == "assistant") == 1:
            seen.append(1)  # the first model call of a conversation
        if len(seen) <= empties:
            return text_reply("")
        return replay(request)

    with FakeChatServer(policy) as server:
        result = CliRunner().invoke(
            cli,
            [
                *("run", str(TAU2_TASKS), "--agent", "openai", "--base-url", server.base_url),
                *("--model", "fake", "--user", "scripted", "--task", task.id, "--trials", "1"),
                *("--logs", str(tmp_path), *extra),
            ],
        )
    assert "run folder:" in result.output, result.output
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    store = hx.Store(f"sqlite:///{folder / 'harness.db'}")
    rows = sorted(store.trial_rows(), key=lambda r: r.episode_id)
    store.close()
    return rows, len(seen)


def test_a_failed_simulation_runs_again_at_once_as_tau2_runs_it(task: Task, tmp_path: Path):
    """Two empty replies, then a good conversation: attempts 0 and 1 are infrastructure errors
    kept in the record, attempt 2 passes, all in one run; the trial counts as passed."""
    rows, conversations = _run_empty_first(tmp_path, task, 2)
    assert conversations == 3
    assert [(r.episode_id.rpartition("~")[2] if "~" in r.episode_id else "0") for r in rows] == [
        "0",
        "1",
        "2",
    ]
    assert [r.infra_error for r in rows] == [True, True, False]
    assert rows[-1].passed
    assert "tau2 fails this simulation" in json.loads(rows[0].agent_meta)["error"]


def test_four_failed_simulations_end_as_an_infrastructure_error(task: Task, tmp_path: Path):
    rows, conversations = _run_empty_first(tmp_path, task, 100)
    assert conversations == 4 and len(rows) == 4
    assert all(r.infra_error and not r.passed for r in rows)


def test_the_strict_reading_counts_it_as_the_agents_failure(task: Task, tmp_path: Path):
    rows, conversations = _run_empty_first(
        tmp_path, task, 100, "--agent-option", "simulation_errors=fail"
    )
    assert conversations == 1 and len(rows) == 1
    assert not rows[0].infra_error and not rows[0].passed
    assert json.loads(rows[0].agent_meta)["termination_reason"] == "agent_error"


def test_a_resume_gives_the_trial_four_more_attempts(task: Task, tmp_path: Path):
    """As a new tau2 run would: four attempts in the run, then four more on resume."""
    import socket

    from harness.cli import main as cli

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [
        *("--agent", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "fake"),
        *("--user", "scripted"),
    ]
    with FakeChatServer(lambda request: text_reply(""), port=port) as server:
        result = CliRunner().invoke(
            cli,
            [
                *("run", str(TAU2_TASKS), *args, "--task", task.id, "--trials", "1"),
                *("--logs", str(tmp_path)),
            ],
        )
        assert "run folder:" in result.output, result.output
        (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
        first = len(server.requests)
        resumed = CliRunner().invoke(cli, ["resume", str(folder), "--suite", str(TAU2_TASKS)])
        assert resumed.exit_code in (0, 1), resumed.output
        second = len(server.requests) - first
    store = hx.Store(f"sqlite:///{folder / 'harness.db'}")
    rows = store.trial_rows()
    store.close()
    assert first == second == 4  # one empty reply a conversation
    assert len(rows) == 8 and all(r.infra_error for r in rows)
