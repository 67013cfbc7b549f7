"""Users the openai agent converses with: tau2's user prompt, the scripted user, the model user.

What tau2-bench does is read from its source at commit
a2c024725189473d2d7cea3a5cfdbcc67478e41f (github.com/sierra-research/tau2-bench, MIT):
src/tau2/user/user_simulator.py (SYSTEM_PROMPT, the guidelines file, is_stop),
src/tau2/user/user_simulator_base.py (the stop tokens, UserState.flip_roles) and
src/tau2/data_model/tasks.py (UserScenario.__str__, StructuredUserInstructions.__str__).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("openai")

import harness as hx
from harness.agents import OpenAIAgent, OpenAIUser, ScriptedUser, User, UserTurn, user_registry
from harness.agents.base import Toolbox
from harness.agents.user import (
    OUT_OF_SCOPE,
    SIMULATION_GUIDELINES,
    STOP,
    TRANSFER,
    is_stop,
    scenario_text,
    user_system_prompt,
    user_view,
)
from harness.suite import Task
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer, text_reply, tool_reply

from ..conftest import Shop
from ..test_transaction import cancel_action

INSTRUCTIONS = {
    "task_instructions": "You are detail-oriented.",
    "domain": "retail",
    "reason_for_call": "You want to cancel order o1.\nIt was a mistake.",
    "known_info": "You are Yusuf Rossi in zip code 19122.",
    "unknown_info": "You do not remember your email address.",
}
TASK = Task(id="0", instruction="You want to cancel order o1.", user=INSTRUCTIONS, source="tau2")

# str(UserScenario(instructions=StructuredUserInstructions(**INSTRUCTIONS))) in tau2-bench:
# every line of the instructions indented by one tab under "Instructions:", each field's
# text by one more.
SCENARIO = (
    "Instructions:\n"
    "\tDomain: retail\n"
    "\tReason for call:\n"
    "\t\tYou want to cancel order o1.\n"
    "\t\tIt was a mistake.\n"
    "\tKnown info:\n"
    "\t\tYou are Yusuf Rossi in zip code 19122.\n"
    "\tUnknown info:\n"
    "\t\tYou do not remember your email address.\n"
    "\tTask instructions:\n"
    "\t\tYou are detail-oriented."
)


def after_greeting(*replies: dict[str, Any]) -> Any:
    """An agent script whose reply ``i`` answers the ``i``-th model call of a conversation (the
    greeting, already in the history, is no model call)."""

    def policy(request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant") - 1
        return replies[turn]

    return policy


def test_the_user_prompt_is_tau2s_guidelines_and_the_scenario() -> None:
    """The system prompt is tau2's guidelines (no persona), a blank line, the scenario in a
    <scenario> element, as tau2's SYSTEM_PROMPT formats it."""
    assert scenario_text(TASK) == SCENARIO
    prompt = user_system_prompt(TASK)
    assert prompt == f"{SIMULATION_GUIDELINES}\n\n<scenario>\n{SCENARIO}\n</scenario>"
    assert prompt.startswith("# User Simulation Guidelines\nYou are playing the role of a customer")
    for token in (STOP, TRANSFER, OUT_OF_SCOPE):
        assert f"'{token}'" in prompt


def test_scenario_with_persona_and_plain_instructions() -> None:
    """A whole scenario puts the persona first; a task without one states its instruction;
    structured instructions without tau2's required fields are refused, naming them."""
    whole = Task(id="p", user={"persona": "Polite.", "instructions": "Cancel o1."})
    assert scenario_text(whole) == "Persona:\n\tPolite.\nInstructions:\n\tCancel o1."
    assert scenario_text(Task(id="x", instruction="Cancel o2.")) == "Instructions:\n\tCancel o2."
    with pytest.raises(hx.ConfigurationError, match="reason_for_call"):
        scenario_text(Task(id="bad", user={"domain": "retail", "task_instructions": "t"}))


def test_stop_tokens_end_anywhere_in_a_message() -> None:
    """Any of tau2's three tokens anywhere in the text stops; nothing else does."""
    assert is_stop("Thanks! ###STOP###") and is_stop(TRANSFER) and is_stop(f"x {OUT_OF_SCOPE}")
    assert not is_stop("stop") and not is_stop("") and not is_stop(None)


def test_user_view_flips_roles_and_hides_tools() -> None:
    """The user's model reads the agent's text as `user`, its own messages as `assistant`, and
    never the agent's tool calls or their results."""
    conversation = [
        {"role": "assistant", "content": "Hi! How can I help you today?", "tool_calls": None},
        {"role": "user", "content": "Cancel o1."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "name": "x"}]},
        {"role": "tool", "id": "c", "content": "{}", "requestor": "assistant"},
        {"role": "assistant", "content": "Done.", "tool_calls": None},
    ]
    assert user_view(conversation) == [
        {"role": "user", "content": "Hi! How can I help you today?"},
        {"role": "assistant", "content": "Cancel o1."},
        {"role": "user", "content": "Done."},
    ]


def test_scripted_user_says_its_replies_then_stops(store: hx.Store) -> None:
    """Reply i is said when the conversation holds i user messages; then ###STOP###. Without
    replies it states the task's instruction once."""
    user = ScriptedUser(["a", "b"])
    said: list[dict[str, Any]] = []
    with hx.Episode(state=hx.DictState({}), store=store) as ep:
        for expected in ("a", "b", STOP, STOP):
            turn = user.respond(TASK, said, session=ep, seed=0)
            assert turn.content == expected
            said.append({"role": "user", "content": turn.content})
        assert ScriptedUser().respond(TASK, [], session=ep, seed=0).content == TASK.instruction
    assert isinstance(user, User)
    with pytest.raises(hx.ConfigurationError, match="list of strings"):
        ScriptedUser("not a list")  # type: ignore[arg-type]


def test_users_are_built_by_name() -> None:
    """The registry builds the scripted and openai users from plain options; an unknown name or
    a bad option is a ConfigurationError naming it."""
    assert user_registry.names() == ["openai", "scripted"]
    assert isinstance(user_registry.create("scripted", replies=["x"]), ScriptedUser)
    made = user_registry.create("openai", base_url="http://127.0.0.1:9/v1", model="u")
    assert isinstance(made, OpenAIUser) and made.config()["llm"] == "u"
    with pytest.raises(hx.ConfigurationError, match="unknown user 'robot'"):
        user_registry.create("robot")
    with pytest.raises(hx.ConfigurationError, match="bad options"):
        user_registry.create("scripted", voice="loud")
    with pytest.raises(hx.ConfigurationError, match="http"):
        OpenAIUser(base_url="nowhere", model="u")


def test_agent_user_options_are_checked() -> None:
    """user_* options need a user; a user that is neither a name nor a User is refused; without
    a user the agent's recorded configuration is what it always was."""
    url = "http://127.0.0.1:9/v1"
    with pytest.raises(hx.ConfigurationError, match="user_model given without user"):
        OpenAIAgent(base_url=url, model="m", user_model="u")
    with pytest.raises(hx.ConfigurationError, match="respond"):
        OpenAIAgent(base_url=url, model="m", user=42)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="max_steps"):
        OpenAIAgent(base_url=url, model="m", user="scripted", max_steps=0)
    plain = OpenAIAgent(base_url=url, model="m").config()
    assert not {"user", "max_steps", "max_errors"} & set(plain)
    both = OpenAIAgent(base_url=url, model="m", user="openai", api_key="k").config()
    assert both["user"]["implementation"] == "openai" and both["user"]["llm"] == "m"
    assert both["user"]["api_key"] == "set"  # the agent's key, for the agent's own server
    other = OpenAIAgent(
        base_url=url, model="m", api_key="k", user="openai", user_base_url="http://h:1/v1"
    )
    assert other.user is not None and other.user.config()["api_key"] is None
    assert (both["max_steps"], both["max_errors"]) == (200, 10)  # tau2's defaults


def test_the_model_user_gets_tau2s_prompt_and_its_answers_are_recorded(
    shop: Shop, store: hx.Store, clock: FakeClock
) -> None:
    """The user's model gets tau2's system prompt with the scenario, the agent's text as user
    messages, temperature 0 and the trial's seed, no tools; each answer is remembered by the
    episode (`user_model_call`) next to the agent's model calls, in the order they were made."""
    agent_script = after_greeting(text_reply("Which order?"), text_reply("Cancelled."))
    user_script = ["I want to cancel an order.", "Order o1, please.", "Thanks! ###STOP###"]
    with (
        FakeChatServer(agent_script) as agent_server,
        FakeChatServer(map(text_reply, user_script)) as user_server,
    ):
        user = OpenAIUser(base_url=user_server.base_url, model="user-model", sleep=clock.sleep)
        agent = OpenAIAgent(
            base_url=agent_server.base_url, model="agent-model", sleep=clock.sleep, user=user
        )
        with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
            output = agent.run(TASK, Toolbox({}, ep), seed=5)
    assert output.meta["termination_reason"] == "user_stop" and output.claimed_success
    first = user_server.requests[0]
    assert first["model"] == "user-model" and first["temperature"] == 0.0 and first["seed"] == 5
    assert "tools" not in first and "tool_choice" not in first
    assert first["messages"] == [
        {"role": "system", "content": user_system_prompt(TASK)},
        {"role": "user", "content": "Hi! How can I help you today?"},
    ]
    assert user_server.requests[2]["messages"][1:] == [
        {"role": "user", "content": "Hi! How can I help you today?"},
        {"role": "assistant", "content": "I want to cancel an order."},
        {"role": "user", "content": "Which order?"},
        {"role": "assistant", "content": "Order o1, please."},
        {"role": "user", "content": "Cancelled."},
    ]
    remembered = [json.loads(r.payload) for r in store.log(ep.id) if r.kind == "recorded"]
    assert [r["what"] for r in remembered] == [
        "user_model_call",
        "model_call",
        "user_model_call",
        "model_call",
        "user_model_call",
    ]
    user_values = [r["value"][0] for r in remembered if r["what"] == "user_model_call"]
    assert user_values == user_server.responses
    assert output.meta["user"]["llm"] == "user-model"
    assert output.meta["user_usage"]["prompt_tokens"] > 0
    said = [m["content"] for m in output.meta["messages"] if m["role"] == "user"]
    assert said == user_script
    assert user_server.errors == [] and agent_server.errors == []


def test_a_resumed_trial_does_not_ask_the_user_again(
    shop: Shop, store_url: str, clock: FakeClock
) -> None:
    """A conversation stopped by an escalation resumes after approval with the user's recorded
    answers: the user's server is asked only for what comes after, the cancel runs once more
    (approved) and the first user message is not asked again."""
    counts: dict[str, int] = {}

    def flaky(order_id: str) -> dict[str, Any]:
        counts[order_id] = counts.get(order_id, 0) + 1
        if counts[order_id] == 1:
            raise RuntimeError("fraud check timed out")
        return shop.set_status(order_id, "cancelled")

    cancel = cancel_action(shop, tool=flaky, compensable=False, idempotency_key=None)
    agent_script = after_greeting(
        tool_reply(("cancel_order", {"order_id": "o1"})), text_reply("Order o1 is cancelled.")
    )
    user_script = ["Please cancel order o1.", "###STOP###"]
    with (
        FakeChatServer(agent_script) as agent_server,
        FakeChatServer(map(text_reply, user_script)) as user_server,
    ):
        user = OpenAIUser(base_url=user_server.base_url, model="u", sleep=clock.sleep)
        agent = OpenAIAgent(base_url=agent_server.base_url, model="m", sleep=clock.sleep, user=user)
        with pytest.raises(hx.Escalated) as info:
            with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1") as ep:
                agent.run(TASK, Toolbox({"cancel_order": cancel}, ep), seed=0)
        assert ep.outcome == "escalated"
        assert (len(user_server.requests), len(agent_server.requests)) == (1, 1)
        store = hx.Store(store_url)
        store.resolve(info.value.escalation_id, "approve", by="ops@example.com")
        with hx.Episode(
            state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True
        ) as again:
            output = agent.run(TASK, Toolbox({"cancel_order": cancel}, again), seed=0)
    assert again.outcome == "committed"
    assert output.meta["termination_reason"] == "user_stop"
    # One more user answer (the stop), one more agent call (the answer after the tool result).
    assert (len(user_server.requests), len(agent_server.requests)) == (2, 2)
    assert counts == {"o1": 2} and shop.applied == [("o1", "cancelled")]
    # The escalated attempt failed and changed nothing; the approved one committed.
    txns = [(t.action, t.status) for t in store.transactions("e1")]
    assert txns == [("cancel_order", "failed"), ("cancel_order", "committed")]
    said = [m["content"] for m in output.meta["messages"] if m["role"] == "user"]
    assert said == user_script
    store.close()


def test_a_user_must_answer_with_a_user_turn(shop: Shop, store: hx.Store) -> None:
    """A user object whose respond() returns something else is a ConfigurationError naming it."""

    class Wrong:
        name = "wrong"

        def config(self) -> dict[str, Any]:
            return {"implementation": self.name}

        def respond(self, task: Task, messages: Any, *, session: Any, seed: int) -> Any:
            return "text"

    with FakeChatServer([]) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="m", user=Wrong())
        with hx.Episode(state=shop.state, store=store) as ep:
            with pytest.raises(hx.ConfigurationError, match="UserTurn"):
                agent.run(TASK, Toolbox({}, ep), seed=0)
    assert UserTurn("x").usage is None
