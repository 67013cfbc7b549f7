"""The lean transport for plain-HTTP model servers: kept-alive connections reused, a connection
the server closed while idle never used, errors as the HTTP library's own types, and only for
``http://`` with no proxy."""

from __future__ import annotations

import http.client
import re
import socket
import threading
from typing import Any

import pytest

from harness.agents.openai import OpenAIAgent, _http
from harness.agents.plainhttp import plain_transport_type
from harness.errors import ModelServerError
from harness.testing.model_server import FakeChatServer, text_reply

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def counting() -> Any:
    """A script answering call ``i`` (whatever the conversation) with the text ``i``."""
    calls = iter(range(1000))
    return lambda request: text_reply(str(next(calls)))


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``http.client`` connection opened meanwhile."""
    made: list[Any] = []
    connect = http.client.HTTPConnection.connect

    def counted(self: http.client.HTTPConnection) -> None:
        made.append(self)
        connect(self)

    monkeypatch.setattr(http.client.HTTPConnection, "connect", counted)
    return made


def test_requests_share_one_kept_alive_connection(connections: list[Any]) -> None:
    """Five calls one after another go over one connection, given back after each answer."""
    with FakeChatServer(counting()) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="m")
        client = agent._client()
        assert isinstance(client._transport, plain_transport_type(_http()))
        answers = [agent._post(client, BODY)["choices"][0]["message"]["content"] for _ in range(5)]
    assert answers == ["0", "1", "2", "3", "4"] and len(connections) == 1


def test_a_connection_the_server_closed_while_idle_is_not_used(connections: list[Any]) -> None:
    """The server closes the kept-alive connection between two calls: the next call goes on
    a new connection and is answered (the request is never sent on the dead one)."""
    with FakeChatServer(counting()) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="m")
        client = agent._client()
        agent._post(client, BODY)
        (conn,) = connections
        conn.sock.shutdown(socket.SHUT_RD)  # (reads as closed, as a server's FIN does)
        answer = agent._post(client, BODY)
        assert answer["choices"][0]["message"]["content"] == "1"
    assert len(connections) == 2 and len(server.requests) == 2


def test_errors_are_the_http_librarys_own() -> None:
    """Nothing listening: a ConnectError, told by the agent as a server it cannot reach."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    agent = OpenAIAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", attempts=1)
    transport = plain_transport_type(_http())()
    request = _http().Request("POST", f"http://127.0.0.1:{port}/v1/chat/completions")
    with pytest.raises(_http().ConnectError):
        transport.handle_request(request)
    with pytest.raises(ModelServerError, match="cannot reach the server"):
        agent._complete(agent._client(), BODY)


@pytest.mark.parametrize(
    ("base_url", "proxy"),
    [("https://127.0.0.1:9/v1", None), ("http://127.0.0.1:9/v1", "http://127.0.0.1:8")],
)
def test_tls_and_proxies_keep_the_clients_own_transport(base_url: str, proxy: str | None) -> None:
    """An https server, or one reached through a proxy, is left to the client's own pool."""
    agent = OpenAIAgent(base_url=base_url, model="m", proxy=proxy)
    assert not isinstance(agent._client()._transport, plain_transport_type(_http()))


def _one_answer(raw: bytes) -> int:
    """A server that answers one request with ``raw`` and closes: its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        received = b""
        while b"\r\n\r\n" not in received:
            received += conn.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        while len(body) < length:
            body += conn.recv(65536)
        conn.sendall(raw)
        # (closed only after the client has: a close with the request unread, or before the
        # client has read the answer, can reach it as a reset instead of the answer's end)
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(65536):
            pass
        conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def test_a_body_cut_short_of_its_length_is_a_lost_connection() -> None:
    """The server promises 100 bytes and closes after 6: the client's protocol error (as its
    own pool raises), told by the agent as a connection lost, not as a malformed answer."""
    port = _one_answer(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a":1')
    agent = OpenAIAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", attempts=1)
    with pytest.raises(ModelServerError, match="connection failed: RemoteProtocolError") as info:
        agent._complete(agent._client(), BODY)
    assert "short of the body's Content-Length" in str(info.value)


def test_a_connection_idle_past_its_time_is_not_used(
    connections: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept-alive connection idle longer than servers keep theirs is closed, not sent on."""
    monkeypatch.setattr("harness.agents.plainhttp.KEEP_ALIVE_FOR", 0.0)
    with FakeChatServer(counting()) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="m")
        client = agent._client()
        agent._post(client, BODY)
        agent._post(client, BODY)
    assert len(connections) == 2 and connections[0].sock is None
