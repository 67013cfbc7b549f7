"""The OpenAI-compatible agent against the shipped fake chat-completions server (loopback only)."""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness as hx
from harness._json import digest
from harness.agents.base import Toolbox
from harness.agents.openai import (
    _REQUEST_JSON,
    DEFAULT_SYSTEM_PROMPT,
    OpenAIAgent,
    _request_texts,
)
from harness.errors import ModelRequestError, ModelServerError
from harness.suite import Task, load_suite
from harness.testing import FakeClock
from harness.testing.model_server import (
    Failure,
    FakeChatServer,
    ReplayPolicy,
    text_reply,
    tool_call,
    tool_reply,
)

from ..conftest import Shop
from .conftest import agent_for, shop_tools

TAU2_TASKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2-retail" / "tasks.json"
NO_TAU2 = f"reference data absent: {TAU2_TASKS.name} (the shared folder beside the repository)"

TASK = Task(id="t1", instruction="Please cancel my order o1.", required_outputs=["cancelled"])


def test_sends_tool_specs_instruction_and_seed(toolbox: Toolbox, clock: FakeClock) -> None:
    """The first request carries the system prompt, the instruction, the tool specs and the seed."""
    with FakeChatServer([text_reply("Nothing to do.")], model="fake-model") as server:
        output = agent_for(server, clock, temperature=0.3).run(TASK, toolbox, seed=7)
    (request,) = server.requests
    assert request["model"] == "fake-model"
    assert request["messages"] == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": TASK.instruction},
    ]
    assert request["tools"] == toolbox.specs
    assert {t["function"]["name"] for t in request["tools"]} == {"cancel_order", "get_order"}
    assert request["tool_choice"] == "auto"
    assert request["seed"] == 7 and request["temperature"] == 0.3
    assert output.message == "Nothing to do." and output.claimed_success
    assert output.meta["stop_reason"] == "answered" and output.meta["model_call_count"] == 1
    assert output.meta["usage"] == server.responses[0]["usage"]
    assert server.errors == []


def test_each_request_digest_is_the_digest_of_the_request_sent(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A model call's recorded request digest is the canonical digest of the request the
    server received, every turn (the tool definitions' JSON is reused between calls)."""
    script = [tool_reply(("get_order", {"order_id": "o1"})), text_reply("Pending.")]
    with FakeChatServer(script) as server:
        output = agent_for(server, clock).run(TASK, toolbox, seed=3)
    recorded = [c["request_digest"] for c in output.meta["model_calls"]]
    assert recorded == [digest(request) for request in server.requests] and len(recorded) == 2


_TEXT = st.text(max_size=30)  # (any characters: non-ASCII, quotes, control characters)
_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_MESSAGE = st.dictionaries(
    st.sampled_from(["role", "content", "name", "tool_call_id"]), _TEXT | st.none()
) | st.dictionaries(_TEXT, _VALUE, max_size=4)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=st.lists(_MESSAGE, max_size=6), seed=st.integers(), edit=_TEXT)
def test_a_request_is_sent_and_digested_as_its_whole_body_would_be(
    toolbox: Toolbox, messages: list[dict[str, Any]], seed: int, edit: str
) -> None:
    """The request's bytes and digest, built from messages encoded once and kept by content,
    are those of the whole body encoded at once, every turn: a message repeated, and a
    message changed in place after it was sent (its old text is not sent again). (The
    toolbox is only read: one for every example.)"""
    body: dict[str, Any] = {"model": "m", "messages": messages, "seed": seed}
    body["tools"], body["tool_choice"] = toolbox.specs, "auto"
    for _turn in range(2):
        assert _request_texts(body, toolbox) == (digest(body), _REQUEST_JSON.encode(body))
        assert _request_texts(body, None) == (digest(body), _REQUEST_JSON.encode(body))
        if messages:
            messages[0]["content"] = edit  # (in place: the same dict, other content)
            messages.append(messages[0])


def test_a_request_json_cannot_write_is_refused_before_anything_is_sent(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A body holding a value JSON cannot write is a TypeError naming the server, and no
    request is made."""
    body = {"model": "m", "messages": [{"role": "user", "content": object()}]}
    with pytest.raises(TypeError):
        _request_texts(body, toolbox)
    agent = OpenAIAgent(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(TypeError, match="cannot be written as JSON"):
        agent._agent_turn(None, toolbox, body["messages"], 0, [], {})


def test_environment_policy_is_appended_to_the_system_prompt(
    shop: Shop, episode: hx.Episode, clock: FakeClock
) -> None:
    """An environment with a ``policy`` text gets it after the system prompt."""

    class WithPolicy:
        policy = "Never cancel a delivered order."

    toolbox = Toolbox(shop_tools(shop), episode, WithPolicy())
    with FakeChatServer([text_reply("ok")]) as server:
        agent_for(server, clock, system_prompt="Be brief.").run(TASK, toolbox, seed=0)
    system = server.last_request["messages"][0]["content"]
    assert system == "Be brief.\n\n# Policy\n\nNever cancel a delivered order."


def test_tool_calls_run_as_transactions_and_results_go_back(
    shop: Shop, toolbox: Toolbox, episode: hx.Episode, store: hx.Store, clock: FakeClock
) -> None:
    """Each tool call runs through the episode and its result returns as a `tool` message."""
    script = [
        tool_reply(("get_order", {"order_id": "o1"})),
        tool_reply(("cancel_order", {"order_id": "o1"})),
        text_reply("Your order o1 is cancelled."),
    ]
    with FakeChatServer(script) as server:
        output = agent_for(server, clock).run(TASK, toolbox, seed=0)
    assert shop.applied == [("o1", "cancelled")]
    assert [(c.name, c.ok, c.write) for c in toolbox.calls] == [
        ("get_order", True, False),
        ("cancel_order", True, True),
    ]
    (txn,) = store.transactions(episode.id)
    assert txn.action == "cancel_order" and txn.status == "committed"
    first, second = server.tool_results(1), server.tool_results(2)
    assert [json.loads(m["content"]) for m in first] == [{"status": "pending", "total": 10}]
    assert (
        first[0]["tool_call_id"]
        == server.responses[0]["choices"][0]["message"]["tool_calls"][0]["id"]
    )
    assert json.loads(second[-1]["content"]) == {"order_id": "o1", "status": "cancelled"}
    assert output.message == "Your order o1 is cancelled."
    assert output.meta["tool_calls"] == 2 and output.meta["model_call_count"] == 3
    digests = [c["request_digest"] for c in output.meta["model_calls"]]
    assert len(set(digests)) == 3 and all(len(d) == 64 for d in digests)
    assert server.errors == []


def test_precondition_failure_is_a_tool_result_and_the_loop_continues(
    shop: Shop, toolbox: Toolbox, clock: FakeClock
) -> None:
    """A refused write comes back to the model as an error result; the model then answers."""
    script = [
        tool_reply(("cancel_order", {"order_id": "o3"})),
        text_reply("Order o3 was delivered, so it cannot be cancelled."),
    ]
    with FakeChatServer(script) as server:
        output = agent_for(server, clock).run(TASK, toolbox, seed=0)
    (result,) = server.tool_results()
    assert result["content"].startswith("Error: ")
    assert "precondition 'is_pending' is false" in result["content"]
    assert shop.applied == [] and shop.state["orders/o3"]["status"] == "delivered"
    assert toolbox.calls[0].kind == "precondition"
    assert output.meta["stop_reason"] == "answered" and "cannot be cancelled" in output.message


def test_malformed_arguments_become_a_tool_result(
    shop: Shop, toolbox: Toolbox, clock: FakeClock
) -> None:
    """Arguments that are not a JSON object are reported to the model; no tool runs."""
    script = [
        tool_reply(("cancel_order", '{"order_id": "o1"'), ("get_order", '["o1"]')),
        text_reply("Sorry."),
    ]
    with FakeChatServer(script) as server:
        output = agent_for(server, clock).run(TASK, toolbox, seed=0)
    broken, listed = server.tool_results()
    assert broken["content"].startswith("Error: tool 'cancel_order' not called")
    assert "not valid JSON" in broken["content"]
    assert "must be a JSON object, got list" in listed["content"]
    assert shop.applied == [] and toolbox.calls == []
    assert output.meta["malformed_tool_calls"] == 2 and output.message == "Sorry."
    assert server.errors == []  # the history sent back was still a valid conversation


def test_arguments_sent_as_an_object_are_accepted(
    shop: Shop, toolbox: Toolbox, clock: FakeClock
) -> None:
    """A server that sends arguments as an object (Ollama) works; the history sends them as text."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "cancel_order", "arguments": {"order_id": "o2"}},
    }
    script = [{"role": "assistant", "content": None, "tool_calls": [call]}, text_reply("Done.")]
    with FakeChatServer(script) as server:
        agent_for(server, clock).run(TASK, toolbox, seed=0)
    assert shop.applied == [("o2", "cancelled")]
    echoed = server.requests[1]["messages"][2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(echoed) == {"order_id": "o2"} and server.errors == []


def test_unknown_tool_is_a_tool_result(toolbox: Toolbox, clock: FakeClock) -> None:
    """A call to a tool that does not exist is answered with the list of tools."""
    with FakeChatServer([tool_reply(("refund_all", {})), text_reply("ok")]) as server:
        agent_for(server, clock).run(TASK, toolbox, seed=0)
    (result,) = server.tool_results()
    assert "unknown tool 'refund_all'" in result["content"] and "cancel_order" in result["content"]


def test_a_result_json_cannot_hold_is_sent_as_text(
    shop: Shop, episode: hx.Episode, clock: FakeClock
) -> None:
    """A read tool returning a non-JSON value gives the model its text instead of crashing."""

    def when(order_id: str) -> Any:
        """When the order was placed."""
        return {"order_id": order_id, "placed": datetime.date(2024, 5, 1)}

    toolbox = Toolbox({"when": when}, episode)
    with FakeChatServer([tool_reply(("when", {"order_id": "o1"})), text_reply("ok")]) as server:
        agent_for(server, clock).run(TASK, toolbox, seed=0)
    (result,) = server.tool_results()
    assert json.loads(result["content"]) == {"order_id": "o1", "placed": "2024-05-01"}


def test_500_and_429_are_retried_with_backoff(toolbox: Toolbox, clock: FakeClock) -> None:
    """A 500 then a 429 are retried after 1 s and the server's Retry-After of 3 s, then succeed."""
    failures = [Failure.http(500), Failure.rate_limited(retry_after=3)]
    with FakeChatServer([text_reply("hello")], failures=failures) as server:
        output = agent_for(server, clock).run(TASK, toolbox, seed=0)
    assert output.message == "hello"
    assert clock.sleeps == [1.0, 3.0]
    assert len(server.requests) == 3 and len(server.responses) == 1
    assert output.meta["model_calls"][0]["attempts"] == 3


def test_dropped_connection_and_timeout_are_retried(toolbox: Toolbox, clock: FakeClock) -> None:
    """A connection closed without an answer and an answer slower than the timeout are retried.

    (The timeout, 2 s against the delayed answer's 30 s, is also what the answer that ends it
    has: long enough for the fake server to answer on a loaded machine.)"""
    failures = [Failure.disconnect(), Failure.delay(30)]
    with FakeChatServer([text_reply("hello")], failures=failures) as server:
        output = agent_for(server, clock, timeout=2.0).run(TASK, toolbox, seed=0)
    assert output.message == "hello" and clock.sleeps == [1.0, 2.0]
    assert len(server.requests) == 3


def test_persistent_500_raises_model_server_error(toolbox: Toolbox, clock: FakeClock) -> None:
    """A server failing every attempt raises ModelServerError carrying each attempt's error."""
    failures = [Failure.http(503, "overloaded")] * 4
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock, attempts=4, backoff=0.5).run(TASK, toolbox, seed=0)
    error = info.value
    assert isinstance(error, hx.HarnessError) and not isinstance(error, ModelRequestError)
    assert error.status == 503 and error.attempts == 4 and len(error.errors) == 4
    assert "failed 4 time(s)" in str(error) and "HTTP 503: overloaded" in str(error)
    assert clock.sleeps == [0.5, 1.0, 2.0] and len(server.requests) == 4


def test_connection_refused_raises_model_server_error(toolbox: Toolbox, clock: FakeClock) -> None:
    """Nothing listening at base_url is an infrastructure error after the retries, not a crash."""
    with FakeChatServer([]) as server:
        url = server.base_url
    agent = OpenAIAgent(base_url=url, model="m", attempts=2, sleep=clock.sleep)
    with pytest.raises(ModelServerError, match="cannot reach the server") as info:
        agent.run(TASK, toolbox, seed=0)
    assert info.value.status is None and info.value.attempts == 2 and clock.sleeps == [1.0]


def test_client_error_is_raised_at_once_with_the_server_message(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A 4xx (here an unknown model) is not retried; the error names the status and message."""
    with FakeChatServer([text_reply("hi")], model="served-model") as server:
        with pytest.raises(ModelRequestError) as info:
            agent_for(server, clock, model="other-model").run(TASK, toolbox, seed=0)
    assert info.value.status == 404
    assert "HTTP 404: The model `other-model` does not exist." in str(info.value)
    assert info.value.server_message == "The model `other-model` does not exist."
    assert clock.sleeps == [] and len(server.requests) == 1


def test_api_key_is_sent_as_a_bearer_token_and_kept_out_of_config(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """The key authenticates the request (a wrong one is a 401) and never enters config()."""
    with FakeChatServer([text_reply("hi")], api_key="sk-test") as server:
        assert (
            agent_for(server, clock, api_key="sk-test").run(TASK, toolbox, seed=0).message == "hi"
        )
        assert server.headers[0]["authorization"] == "Bearer sk-test"
        with pytest.raises(ModelRequestError, match="HTTP 401"):
            agent_for(server, clock, api_key="wrong").run(TASK, toolbox, seed=0)
        config = agent_for(server, clock, api_key="sk-test").config()
    assert "sk-test" not in json.dumps(config) and config["api_key"] == "set"
    assert config["agent"] == "openai" and config["model"] == "fake-model"


def test_proxy_environment_variables_are_not_read(
    toolbox: Toolbox, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configuration is what is passed in: an http_proxy in the environment is ignored."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with FakeChatServer([text_reply("direct")]) as server:
        assert agent_for(server, clock).run(TASK, toolbox, seed=0).message == "direct"


def test_without_a_key_no_authorization_is_sent_and_openai_variables_are_not_read(
    toolbox: Toolbox, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's own environment variables (a key, a base URL, an organization, a project)
    do not change what the agent sends: no key given, no Authorization header."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-env")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-env")
    with FakeChatServer([text_reply("local")]) as server:
        assert agent_for(server, clock).run(TASK, toolbox, seed=0).message == "local"
    (headers,) = server.headers
    assert "authorization" not in headers
    assert "openai-organization" not in headers and "openai-project" not in headers
    assert "sk-from-the-environment" not in json.dumps(headers)
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("harness/")


@pytest.mark.parametrize(
    ("base_url", "posted_to"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/chat/completions"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat/completions"),
        (
            "https://example.org/openai/deployments/m?api-version=2024-10-21",
            "https://example.org/openai/deployments/m/chat/completions?api-version=2024-10-21",
        ),
    ],
)
def test_requests_go_to_the_base_url_s_chat_completions_keeping_its_query(
    base_url: str, posted_to: str
) -> None:
    """The path is the base URL's with /chat/completions after it; a query the base URL
    carries (an api-version) stays after the path, as the openai client keeps it."""
    agent = OpenAIAgent(base_url=base_url, model="m")
    assert str(agent._post_url) == posted_to


@pytest.mark.parametrize(
    ("failure", "status", "said"),
    [
        (Failure.disconnect(), None, "connection failed: RemoteProtocolError"),
        (Failure.delay(30), None, "no answer within 1.0 s"),
        (Failure.rate_limited(retry_after=2), 429, "HTTP 429: rate limit exceeded"),
        (Failure.http(502, "bad gateway"), 502, "HTTP 502: bad gateway"),
    ],
    ids=["dropped", "timeout", "rate-limited", "bad-gateway"],
)
def test_each_server_failure_is_an_infrastructure_error_saying_what_happened(
    toolbox: Toolbox, clock: FakeClock, failure: Failure, status: int | None, said: str
) -> None:
    """Dropped connections, timeouts, 429 and 5xx are ModelServerError (never the 4xx
    ModelRequestError), with the status and a message saying what happened, after every try."""
    # (A timeout of 1 s only where the answer is delayed 30 s: an answer the server sends at
    # once may take longer than that to come on a loaded machine. It bounds the connect and the
    # write too, which take far less, even loaded: 0.05 s did not always.)
    timeout = 1.0 if failure.kind == "delay" else 120.0
    with FakeChatServer([text_reply("never")], failures=[failure] * 2) as server:
        agent = agent_for(server, clock, timeout=timeout, attempts=2)
        url = f"{server.base_url}/chat/completions"
        with pytest.raises(ModelServerError) as info:
            agent.run(TASK, toolbox, seed=0)
        # (The server records a request its thread has read: on a loaded machine, after the
        # client gave up on it.)
        deadline = time.monotonic() + 10
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    error = info.value
    assert not isinstance(error, ModelRequestError) and error.transient
    assert error.status == status and error.attempts == 2 and len(server.requests) == 2
    assert said in str(error) and error.url == url
    assert clock.sleeps == [2.0 if status == 429 else 1.0]  # a Retry-After of 2 s is honoured


def test_the_model_answer_is_recorded_as_the_servers_json(
    shop: Shop, store: hx.Store, clock: FakeClock
) -> None:
    """Each model answer is remembered by the episode as the server sent it (JSON), with the
    number of tries, so a resumed trial gets the same answers."""
    script = [tool_reply(("get_order", {"order_id": "o1"})), text_reply("Pending.")]
    with FakeChatServer(script, failures=[Failure.http(500)]) as server:
        with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
            output = agent_for(server, clock).run(TASK, Toolbox(shop_tools(shop), ep), seed=0)
    remembered = [json.loads(r.payload) for r in store.log(ep.id) if r.kind == "recorded"]
    assert [r["what"] for r in remembered] == ["model_call", "model_call"]
    assert [r["value"] for r in remembered] == [
        [server.responses[0], 2],
        [server.responses[1], 1],
    ]
    digests = [c["request_digest"] for c in output.meta["model_calls"]]
    assert [r["request"] for r in remembered] == digests


def test_importing_harness_does_not_import_the_openai_client() -> None:
    """The client is imported when the agent first talks to a server, not by `import harness`."""
    code = (
        "import sys, harness, harness.agents.openai, harness.testing.model_server; "
        "print(sorted(m for m in ('openai', 'httpx2') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_max_turns_stops_a_model_that_never_stops(toolbox: Toolbox, clock: FakeClock) -> None:
    """A model that calls a tool every turn is stopped after max_turns model calls."""

    def forever(request: dict[str, Any]) -> dict[str, Any]:
        return tool_reply(("get_order", {"order_id": "o1"}))

    with FakeChatServer(forever) as server:
        output = agent_for(server, clock, max_turns=3).run(TASK, toolbox, seed=0)
    assert len(server.requests) == 3 and len(toolbox.calls) == 3
    assert output.meta["stop_reason"] == "max_turns" and not output.claimed_success


def test_registered_as_openai(clock: FakeClock) -> None:
    """The agent registry builds it by name from plain options, as the command line does."""
    from harness.agents.base import registry

    agent = registry.create("openai", base_url="http://127.0.0.1:8000/v1/", model="m")
    assert isinstance(agent, OpenAIAgent) and agent.name == "openai"
    assert agent.url == "http://127.0.0.1:8000/v1/chat/completions"


def test_bad_options_are_configuration_errors() -> None:
    """A base URL that is not http(s), or max_turns below 1, is refused at construction."""
    with pytest.raises(hx.ConfigurationError, match="http"):
        OpenAIAgent(base_url="127.0.0.1:8000/v1", model="m")
    with pytest.raises(hx.ConfigurationError, match="max_turns"):
        OpenAIAgent(base_url="http://127.0.0.1:8000/v1", model="m", max_turns=0)


def test_fake_server_refuses_a_malformed_conversation() -> None:
    """The fake answers 400 to a tool message that answers no tool call, and records why."""
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "x", "content": "1"},
        ],
    }
    with FakeChatServer([text_reply("hi")]) as server:
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5)
    assert info.value.code == 400
    assert "answers no tool call" in json.loads(info.value.read())["error"]["message"]
    assert server.errors and "answers no tool call" in server.errors[0]


def test_canned_replies_are_indexed_by_turn() -> None:
    """Reply i answers turn i of any conversation, so retries and new conversations replay it."""
    call = tool_call("get_order", {"order_id": "o1"}, id="c0")
    policy_server = FakeChatServer([tool_reply(call), text_reply("end")])
    first = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    second = {
        "model": "m",
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "{}"},
        ],
    }
    assert policy_server.policy(first)["tool_calls"][0]["id"] == "c0"
    assert policy_server.policy(first) == policy_server.policy(first)
    assert policy_server.policy(second)["content"] == "end"


# --- the retail domain (tau2 tasks) ---


@pytest.fixture(scope="module")
def retail_suite() -> Any:
    """The tau2 retail suite, or a skip when the shared data is absent."""
    if not TAU2_TASKS.exists():
        pytest.skip(NO_TAU2)
    return load_suite(TAU2_TASKS)


def reference_export(task: Task) -> Any:
    """The final database after replaying the task's reference actions on the plain tools."""
    from harness.domains.retail.environment import RetailEnvironment
    from harness.domains.retail.tools import RetailError

    with RetailEnvironment() as env:
        for call in task.reference_actions:
            with contextlib.suppress(RetailError):  # a reference action that fails upstream too
                getattr(env.backend, call.name)(**call.arguments)
        return env.export()


def replay_with_agent(
    suite: Any, task: Task, server: FakeChatServer, store: hx.Store
) -> tuple[Any, Any, Toolbox]:
    """Run the openai agent on ``task`` in a fresh environment: output, final export, toolbox."""
    env = suite.new_environment()
    try:
        with hx.Episode(state=env.state, store=store, task_id=task.id) as ep:
            toolbox = Toolbox(env.tools, ep, env)
            agent = OpenAIAgent(base_url=server.base_url, model="fake", sleep=FakeClock().sleep)
            output = agent.run(task, toolbox, seed=0)
        return output, env.export(), toolbox
    finally:
        env.close()


def test_replay_policy_reproduces_the_reference_final_state(
    retail_suite: Any, store: hx.Store
) -> None:
    """ReplayPolicy through the agent leaves the retail database as the reference actions do."""
    task = next(
        t
        for t in retail_suite.tasks
        if any(
            c.name.startswith(("exchange", "return", "cancel", "modify"))
            for c in t.reference_actions
        )
    )
    with FakeChatServer(ReplayPolicy(task)) as server:
        output, final, toolbox = replay_with_agent(retail_suite, task, server, store)
    assert final == reference_export(task)
    assert any(c.write and c.ok for c in toolbox.calls)  # the state did change
    assert [c.name for c in toolbox.calls] == [c.name for c in task.reference_actions]
    assert output.meta["model_call_count"] == len(task.reference_actions) + 1
    assert all(r.lower() in output.message.lower() for r in task.required_outputs)
    assert server.errors == []


def test_replay_policy_plays_the_model_user_too(tmp_path: Path) -> None:
    """On one server, ReplayPolicy answers the agent's requests with the reference actions and
    the user simulator's with the task's instruction, then ###STOP###: the trials pass, each
    user asked twice, and the agent's conversation goes greeting, instruction, calls, answer."""
    from harness.runs.start import run_trials

    retail_suite = load_suite("retail")
    tasks = [t for t in retail_suite.tasks if t.reference_actions][:3]
    with FakeChatServer(ReplayPolicy(retail_suite.tasks)) as server:
        options = {
            "base_url": server.base_url,
            "model": "fake",
            "user": "openai",
            "user_base_url": server.base_url,
            "user_model": "fake-user",
        }
        run = run_trials(
            retail_suite,
            agent="openai",
            agent_options=options,
            tasks=[t.id for t in tasks],
            logs=tmp_path,
        )
        users = [r for r in server.requests if r["model"] == "fake-user"]
        errors = list(server.errors)
    assert errors == [] and [r.passed for r in run.results] == [True] * len(tasks)
    assert len(users) == 2 * len(tasks)
    said = sorted(r["messages"][-1]["content"] for r in users)
    assert said.count("Done.") + sum(s.startswith("Done. ") for s in said) == len(tasks)
    first = [r for r in users if not any(m["role"] == "assistant" for m in r["messages"])]
    assert len(first) == len(tasks)


@pytest.mark.slow
def test_replay_policy_runs_the_whole_suite(
    retail_suite: Any, store: hx.Store, request: pytest.FixtureRequest
) -> None:
    """One fake server replays every task of the suite; each final state matches the reference."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow (about 30 s): run with -m slow")
    with FakeChatServer(ReplayPolicy(retail_suite.tasks)) as server:
        for task in retail_suite.tasks:
            _, final, _ = replay_with_agent(retail_suite, task, server, store)
            assert final == reference_export(task), task.id
    assert server.errors == []


def test_a_run_passes_with_replay_and_counts_server_failures_as_infrastructure(
    retail_suite: Any, tmp_path: Path
) -> None:
    """Through run_trials, replayed tasks pass, and a dead server is an infra error, not a fail."""
    from harness.runs.start import run_trials

    ids = [t.id for t in retail_suite.tasks[:2]]
    with FakeChatServer(ReplayPolicy(retail_suite.tasks)) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="fake", sleep=FakeClock().sleep)
        good = run_trials(retail_suite, agent=agent, tasks=ids, logs=tmp_path / "good")
        server.fail_next(*[Failure.http(500)] * agent.attempts)
        bad = run_trials(retail_suite, agent=agent, tasks=ids[:1], logs=tmp_path / "bad")
    assert [(r.task_id, r.passed, r.infra_error) for r in good.results] == [
        (i, True, False) for i in ids
    ]
    assert [(r.passed, r.infra_error) for r in bad.results] == [(False, True)]
