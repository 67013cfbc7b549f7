"""The openai agent's retries, bounded by count and by time, and what a failed call leaves for
the trial's record (against the shipped fake server, the backoff on a fake clock)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness as hx
from harness.agents import OpenAIUser
from harness.agents.base import Toolbox
from harness.agents.endpoint import forget_endpoints
from harness.agents.openai import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_TOOL_ARGUMENT_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRY_FOR,
    OpenAIAgent,
)
from harness.errors import EndpointDown, ModelServerError
from harness.runs.worker import trial_usage
from harness.suite import Task
from harness.testing import FakeClock
from harness.testing.model_server import Failure, FakeChatServer, text_reply, tool_reply

from ..conftest import Shop
from .conftest import agent_for, shop_tools
from .test_openai import TASK


@pytest.fixture(autouse=True)
def _fresh_endpoints() -> Iterator[None]:
    forget_endpoints()
    yield
    forget_endpoints()


# --- rate limits ---
def test_a_rate_limit_burst_is_waited_out_with_attempts_enough(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """Six 429s with Retry-After: 2 (about 12 s of a burst, the waits growing from it): with
    attempts=10 the seventh attempt answers, within the default retry_for."""
    failures = [Failure.rate_limited(retry_after=2)] * 6
    with FakeChatServer([text_reply("hello")], failures=failures) as server:
        output = agent_for(server, clock, attempts=10).run(TASK, toolbox, seed=0)
    assert output.message == "hello" and len(server.requests) == 7
    assert clock.sleeps == [2.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert output.meta["model_calls"][0]["attempts"] == 7


def test_a_rate_limit_that_does_not_end_is_ended_by_retry_for(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """429s without end and attempts=1000: retry_for=60 ends the call once the next wait
    would pass it (2 + 2 + 4 + 8 + 16 = 32 s waited; 30 more would be 62)."""
    failures = [Failure.rate_limited(retry_after=2)] * 50
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock, attempts=1000, retry_for=60).run(TASK, toolbox, seed=0)
    assert clock.sleeps == [2.0, 2.0, 4.0, 8.0, 16.0] and len(server.requests) == 6
    assert info.value.limit == "retry_for" and info.value.attempts == 6
    assert info.value.status == 429


def test_a_retry_after_longer_than_max_backoff_is_waited_in_full(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A Retry-After of 45 s is waited out whole although max_backoff is 30 s."""
    failures = [Failure.rate_limited(retry_after=45)]
    with FakeChatServer([text_reply("hello")], failures=failures) as server:
        output = agent_for(server, clock, max_backoff=30).run(TASK, toolbox, seed=0)
    assert output.message == "hello" and clock.sleeps == [45.0]


def test_a_retry_after_past_retry_for_ends_the_retries_at_once(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A Retry-After of 200 s with retry_for=120: no sleep past the budget, a ModelServerError
    at once saying why and naming retry_for."""
    failures = [Failure.rate_limited(retry_after=200)] * 2
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock, retry_for=120).run(TASK, toolbox, seed=0)
    error = info.value
    assert clock.sleeps == [] and len(server.requests) == 1
    assert error.limit == "retry_for" and error.status == 429 and error.attempts == 1
    message = str(error)
    assert "Retry-After of 200 s" in message and "retry_for=120 s" in message
    assert "raise retry_for" in message and "HTTP 429: rate limit exceeded" in message


def test_retry_for_none_leaves_only_attempts(toolbox: Toolbox, clock: FakeClock) -> None:
    """Without a time bound (retry_for=None), a Retry-After of an hour is waited out, and
    attempts alone ends the call."""
    failures = [Failure.rate_limited(retry_after=3600)] * 5
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock, attempts=3, retry_for=None).run(TASK, toolbox, seed=0)
    assert info.value.attempts == 3 and info.value.limit is None and len(server.requests) == 3
    assert clock.sleeps == [3600.0, 3600.0]


# --- failures: bounded by count and by time ---
def test_retry_for_bounds_the_time_whatever_attempts_allows(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """attempts=100 on a server failing every time: the waits (1, 2, 4 ... capped at 30) stop
    before one would end past retry_for=120 s."""
    failures = [Failure.http(500)] * 20
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock, attempts=100).run(TASK, toolbox, seed=0)
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    error = info.value
    assert error.attempts == 8 == len(error.errors) == len(server.requests)
    assert error.limit == "retry_for" and error.status == 500
    assert "a backoff of 30 s is more than the" in str(error) and "retry_for=120 s" in str(error)


def test_attempts_still_bound_failures_within_retry_for(toolbox: Toolbox, clock: FakeClock) -> None:
    """With the defaults, four failed attempts end the call (retry_for is not reached)."""
    failures = [Failure.http(502)] * 4
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock).run(TASK, toolbox, seed=0)
    assert info.value.attempts == 4 and info.value.limit is None
    assert clock.sleeps == [1.0, 2.0, 4.0]


# --- the options ---
def test_the_new_options_have_defaults_and_are_recorded_for_agent_and_user() -> None:
    """retry_for, request_timeout and the byte limits default as documented; config() records
    them, for the agent and for the user it builds (which shares them)."""
    agent = OpenAIAgent(base_url="http://127.0.0.1:9/v1", model="m", user="openai")
    config = agent.config()
    assert config["attempts"] == 4 and config["retry_for"] == DEFAULT_RETRY_FOR == 120.0
    assert config["request_timeout"] == DEFAULT_REQUEST_TIMEOUT == 600.0
    assert config["max_response_bytes"] == DEFAULT_MAX_RESPONSE_BYTES == 32 * 1024 * 1024
    assert config["max_tool_argument_bytes"] == DEFAULT_MAX_TOOL_ARGUMENT_BYTES == 1024 * 1024
    user = config["user"]
    assert (user["retry_for"], user["request_timeout"], user["max_response_bytes"]) == (
        120.0,
        600.0,
        32 * 1024 * 1024,
    )
    tuned = OpenAIAgent(
        base_url="http://127.0.0.1:9/v1",
        model="m",
        user="openai",
        retry_for=None,
        request_timeout=30,
        max_response_bytes=1000,
        max_tool_argument_bytes=10,
    )
    assert tuned.config()["retry_for"] is None and tuned.config()["max_tool_argument_bytes"] == 10
    assert isinstance(tuned.user, OpenAIUser)
    assert tuned.user.config()["retry_for"] is None
    assert (tuned.user.request_timeout, tuned.user.max_response_bytes) == (30, 1000)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"retry_for": -1}, "retry_for=-1"),
        ({"request_timeout": 0}, "request_timeout must be > 0"),
        ({"max_response_bytes": 0}, "max_response_bytes >= 1"),
        ({"max_tool_argument_bytes": 0}, "max_tool_argument_bytes=0"),
    ],
)
def test_bad_limits_are_configuration_errors(options: dict[str, Any], said: str) -> None:
    """A negative retry_for, a request_timeout of 0, a byte limit below 1: refused by name."""
    with pytest.raises(hx.ConfigurationError, match=said.replace("(", r"\(")):
        OpenAIAgent(base_url="http://127.0.0.1:9/v1", model="m", **options)


# --- what a failed call leaves for the trial ---
def test_a_call_failing_past_its_retries_carries_the_trials_usage_so_far(
    shop: Shop, toolbox: Toolbox, clock: FakeClock
) -> None:
    """The first turn answers (with tokens), the second fails four times: the ModelServerError
    leaving run() carries agent_meta with both calls (the failed one with its four attempts
    and its time, no response), the tokens, model_seconds, and the run counts three retries."""

    def script(request: dict[str, Any]) -> dict[str, Any]:
        if len(request["messages"]) > 2:  # after the first answer: a 500, every time
            raise RuntimeError("down")
        return tool_reply(("get_order", {"order_id": "o1"}))

    with FakeChatServer(script) as server:
        with pytest.raises(ModelServerError) as info:
            agent_for(server, clock).run(TASK, toolbox, seed=0)
    meta = info.value.agent_meta
    first, failed = meta["model_calls"]
    assert first["attempts"] == 1 and first["response"]["usage"] == server.responses[0]["usage"]
    assert failed["response"] is None and failed["attempts"] == 4
    assert failed["error"].startswith("ModelServerError: model server at")
    assert failed["seconds"] >= 0 and failed["request_digest"]
    assert meta["usage"] == server.responses[0]["usage"] and len(server.responses) == 1
    assert meta["model_seconds"] == round(first["seconds"] + failed["seconds"], 6)
    assert meta["model_call_count"] == 2 and meta["stop_reason"] == "model_server_error"
    assert meta["tool_calls"] == 1
    usage = trial_usage(meta)
    assert usage["model_calls"] == 2 and usage["model_retries"] == 3


def test_endpoint_down_leaving_run_carries_the_attempts_sent(
    store: hx.Store, shop: Shop, clock: FakeClock
) -> None:
    """A circuit opened by an earlier run refuses this one's first request: EndpointDown
    carries agent_meta with the refused call (no attempt sent)."""
    with FakeChatServer([]) as gone:
        url = gone.base_url
    agent = OpenAIAgent(
        base_url=url, model="m", attempts=1, down_after=0, down_failures=1, sleep=clock.sleep
    )
    with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
        with pytest.raises(ModelServerError):
            agent.run(TASK, Toolbox(shop_tools(shop), ep), seed=0)
    with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
        with pytest.raises(EndpointDown) as info:
            agent.run(TASK, Toolbox(shop_tools(shop), ep), seed=0)
    (refused,) = info.value.agent_meta["model_calls"]
    assert refused["attempts"] == 0 and refused["response"] is None
    assert refused["error"].startswith("EndpointDown: ")
    assert trial_usage(info.value.agent_meta)["model_retries"] == 0


def test_a_user_call_failing_leaves_the_conversation_so_far_on_the_error(
    store: hx.Store, shop: Shop, clock: FakeClock
) -> None:
    """The agent's model answers, the user's server keeps failing: agent_meta has the agent's
    call, the user's failed call with its attempts, and user_seconds."""
    with FakeChatServer([]) as gone:
        user_url = gone.base_url
    with FakeChatServer([text_reply("How can I help?")]) as server:
        agent = agent_for(server, clock, user="openai", user_base_url=user_url, attempts=2)
        task = Task(id="u", instruction="Cancel o1.", required_outputs=[])
        with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
            with pytest.raises(ModelServerError) as info:
                agent.run(task, Toolbox(shop_tools(shop), ep), seed=0)
    meta = info.value.agent_meta
    assert meta["model_calls"] == [] and meta["stop_reason"] == "model_server_error"
    (failed,) = meta["user_calls"]
    assert failed["attempts"] == 2 and failed["response"] is None
    assert (
        meta["user_seconds"] == failed["seconds"] and "cannot reach the server" in failed["error"]
    )


def test_a_pause_past_retry_for_fails_new_calls_at_once(toolbox: Toolbox, clock: FakeClock) -> None:
    """After a 429 asking for 300 s, a new call with retry_for=120 does not sit in the shared
    pause: it fails at once, unsent, saying the Retry-After is more than retry_for allows."""
    failures = [Failure.rate_limited(retry_after=300)]
    with FakeChatServer([text_reply("never")], failures=failures) as server:
        agent = agent_for(server, clock, retry_for=120)
        with pytest.raises(ModelServerError):
            agent.run(TASK, toolbox, seed=0)
        with pytest.raises(ModelServerError) as info:
            agent.run(TASK, toolbox, seed=1)
    assert len(server.requests) == 1 and clock.sleeps == []
    error = info.value
    assert error.limit == "retry_for" and error.status == 429 and error.attempts == 0
    assert "more than the 120.0 s left of retry_for=120 s" in str(error)
    assert info.value.agent_meta["model_calls"][-1]["attempts"] == 0
