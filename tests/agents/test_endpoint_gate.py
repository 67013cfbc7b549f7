"""An endpoint consults the process's gate when one is installed: every request enters and
leaves it, a refusal sends nothing and gives the request's slot back, a circuit the endpoint
opens is told to it, and the openai agent tells it the tokens each response used."""

from __future__ import annotations

from typing import Any

import pytest

from harness.agents.endpoint import (
    Endpoint,
    forget_endpoints,
    gate,
    install_gate,
    remove_gate,
)
from harness.agents.openai import OpenAIAgent
from harness.errors import ConfigurationError, EndpointDown, ModelServerError
from harness.testing.model_server import FakeChatServer, text_reply


class Recording:
    """A gate that records what it is asked, refusing while ``refuse`` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse: EndpointDown | None = None

    def enter(self, url: str) -> object:
        self.calls.append(("enter", url))
        if self.refuse is not None:
            raise self.refuse
        return f"ticket-{len(self.calls)}"

    def leave(self, url: str, ticket: object) -> None:
        self.calls.append(("leave", ticket))

    def used(self, url: str, tokens: int) -> None:
        self.calls.append(("used", tokens))

    def down(self, url: str, error: EndpointDown, seconds: float) -> None:
        self.calls.append(("down", (str(error), seconds)))


@pytest.fixture
def recording() -> Any:
    forget_endpoints()
    g = Recording()
    install_gate(g)
    yield g
    remove_gate(g)
    forget_endpoints()


def test_a_request_enters_and_leaves_the_gate_with_its_ticket(recording: Recording) -> None:
    """One request: enter, then leave with the ticket enter gave, even when it fails."""
    ep = Endpoint("http://x/v1")
    with ep.request():
        pass
    with pytest.raises(ModelServerError), ep.request():
        raise ModelServerError("no answer", url=ep.url)
    assert recording.calls == [
        ("enter", "http://x/v1"),
        ("leave", "ticket-1"),
        ("enter", "http://x/v1"),
        ("leave", "ticket-3"),
    ]


def test_a_refusal_sends_nothing_and_gives_the_slot_back(recording: Recording) -> None:
    """The gate refusing (another process found the server down): the block never runs, the
    request is not counted, and the endpoint's own slot is free again."""
    ep = Endpoint("http://x/v1", max_in_flight=1)
    recording.refuse = EndpointDown("model server at http://x/v1 is down", url=ep.url)
    ran = []
    with pytest.raises(EndpointDown, match="is down"), ep.request():
        ran.append(1)
    assert ran == [] and recording.calls == [("enter", "http://x/v1")]
    stats = ep.stats()
    assert (stats.in_flight, stats.waiting, stats.requests) == (0, 0, 0)
    recording.refuse = None
    with ep.request():  # (the slot is back: this would wait forever otherwise)
        pass


def test_a_circuit_the_endpoint_opens_is_told_to_the_gate(recording: Recording) -> None:
    """Two failures open the circuit: the gate hears it with the error requests get, and
    again, when a request is refused, until the record says open (the gate decides)."""
    ep = Endpoint("http://x/v1", down_after=0.0, down_failures=2)
    for _ in range(2):
        with pytest.raises(ModelServerError), ep.request():
            raise ModelServerError("HTTP 503", url=ep.url, status=503)
    told = [c for c in recording.calls if c[0] == "down"]
    assert len(told) == 1 and "is down: 2 requests in a row failed" in told[0][1][0]
    assert 0 < told[0][1][1] <= 1.0  # (it refuses for PROBE_AFTER, 1 s)
    with pytest.raises(EndpointDown), ep.request():
        pass
    assert len([c for c in recording.calls if c[0] == "down"]) == 2


def test_tokens_are_told_only_when_a_gate_is_installed() -> None:
    """With no gate, counting tokens does nothing; a second gate is refused while one is in."""
    forget_endpoints()
    assert gate() is None
    Endpoint("http://x/v1").used(10)  # (nothing to tell)
    first, second = Recording(), Recording()
    install_gate(first)
    try:
        install_gate(first)  # (the same one again is fine)
        with pytest.raises(ConfigurationError, match="already"):
            install_gate(second)
        Endpoint("http://x/v1").used(0)
        Endpoint("http://x/v1").used(7)
        assert first.calls == [("used", 7)]
    finally:
        remove_gate(second)  # (not the one installed: nothing happens)
        assert gate() is first
        remove_gate(first)
    assert gate() is None


def test_the_openai_agent_tells_the_gate_each_response_s_tokens(recording: Recording) -> None:
    """Every completion's usage.total_tokens reaches the gate once."""
    with FakeChatServer([text_reply("hello")]) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="fake")
        for _ in range(2):
            agent._complete(
                agent._client(), {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
            )
        totals = [r["usage"]["total_tokens"] for r in server.responses]
    assert [c for c in recording.calls if c[0] == "used"] == [("used", t) for t in totals]
