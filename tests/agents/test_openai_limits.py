"""What a broken model server can cost the openai agent: a response's size, an attempt's time,
a tool call's arguments; each bounded, each failure naming its option.

The bodies no chat server sends (hundreds of megabytes, a byte at a time, a compressed bomb)
come from :class:`RawServer`, a loopback HTTP server that writes whatever its test says.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import pytest

from harness.agents.base import Toolbox
from harness.agents.endpoint import forget_endpoints
from harness.agents.openai import OpenAIAgent, parse_arguments
from harness.errors import ModelServerError
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer, text_reply, tool_reply

from ..conftest import Shop
from .conftest import agent_for
from .test_openai import TASK

MiB = 1024 * 1024
Respond = Callable[["RawServer", BaseHTTPRequestHandler], None]


@pytest.fixture(autouse=True)
def _fresh_endpoints() -> Iterator[None]:
    forget_endpoints()
    yield
    forget_endpoints()


class RawServer:
    """An HTTP server on 127.0.0.1 whose every POST is answered by ``respond(server,
    handler)``, which writes the status, headers and body as it likes (:meth:`write` counts
    the body bytes sent); counts requests. ``closing`` is set when the server stops (a
    response stalling until then outlasts whatever the test does with it)."""

    def __init__(self, respond: Respond) -> None:
        self.requests = 0
        self.sent = 0
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests += 1
                with contextlib.suppress(OSError):  # the client hung up, as past a limit
                    respond(outer, self)
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        """Write part of a body, counted."""
        handler.wfile.write(data)
        handler.wfile.flush()
        self.sent += len(data)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def headers(
    handler: BaseHTTPRequestHandler,
    *,
    status: int = 200,
    length: int | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    """Send the status line and headers (no length: the body ends when the server closes)."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    if length is not None:
        handler.send_header("Content-Length", str(length))
    else:
        handler.send_header("Connection", "close")
    for name, value in (extra or {}).items():
        handler.send_header(name, value)
    handler.end_headers()


def completion(content: str) -> bytes:
    """A whole chat completion answering ``content``."""
    message = {"role": "assistant", "content": content}
    body = {"id": "c", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    return json.dumps(body).encode()


def huge_body(total: int, *, status: int = 200) -> Respond:
    """A response whose body is ``total`` bytes of one JSON string (one buffer sent again and
    again, so the server itself allocates nothing), without a length."""
    chunk = b"x" * MiB

    def respond(server: RawServer, handler: BaseHTTPRequestHandler) -> None:
        headers(handler, status=status)
        server.write(handler, b'{"error": {"message": "')
        for _ in range(total // MiB):
            server.write(handler, chunk)

    return respond


def peak_bytes(action: Callable[[], Any]) -> tuple[int, Any]:
    """The peak of memory Python allocated while ``action`` ran, and what it raised (or
    returned)."""
    tracemalloc.start()
    try:
        try:
            outcome = action()
        except Exception as exc:
            outcome = exc
        return tracemalloc.get_traced_memory()[1], outcome
    finally:
        tracemalloc.stop()


def agent_on(server: RawServer | FakeChatServer, clock: FakeClock, **options: Any) -> OpenAIAgent:
    options.setdefault("attempts", 1)
    return OpenAIAgent(base_url=server.base_url, model="m", sleep=clock.sleep, **options)


# --- the size of a response ---
def test_a_300_mb_response_is_not_read_past_max_response_bytes(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A server sending 300 MB (no length announced): reading stops past the default 32 MiB;
    the memory Python allocated peaks well under the body; a ModelServerError names the limit
    and its option, and is not retried (the same request would get the same answer)."""
    with RawServer(huge_body(300 * MiB)) as server:
        agent = agent_on(server, clock, attempts=4)
        started = time.monotonic()
        peak, raised = peak_bytes(lambda: agent.run(TASK, toolbox, seed=0))
        seconds = time.monotonic() - started
    assert isinstance(raised, ModelServerError), raised
    assert raised.limit == "max_response_bytes" and not raised.transient
    message = str(raised)
    assert "max_response_bytes=33,554,432" in message and "raise max_response_bytes" in message
    assert server.requests == 1 and clock.sleeps == []
    assert peak < 80 * MiB, f"peak {peak / MiB:.0f} MiB for a 300 MB body"
    assert server.sent < 150 * MiB  # it stopped reading (the rest met a closed connection)
    assert seconds < 10
    assert agent.endpoint.stats().errors == {"max_response_bytes": 1}


def test_a_response_announcing_a_length_over_the_limit_is_not_read_at_all(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """Content-Length over max_response_bytes: the call fails before reading the body."""

    def respond(server: RawServer, handler: BaseHTTPRequestHandler) -> None:
        headers(handler, length=10 * MiB)
        server.write(handler, b"{" + b" " * (MiB - 1))  # a start, then the server stalls
        server.closing.wait(30)

    with RawServer(respond) as server:
        agent = agent_on(server, clock, max_response_bytes=MiB // 2)
        started = time.monotonic()
        with pytest.raises(ModelServerError, match="max_response_bytes=524,288") as info:
            agent.run(TASK, toolbox, seed=0)
    assert time.monotonic() - started < 10  # it did not wait for the body (30 s)
    assert "10,485,760 bytes read or announced" in str(info.value)


def test_a_compressed_body_counts_as_it_decompresses(toolbox: Toolbox, clock: FakeClock) -> None:
    """A gzip body of 100 MB of spaces (under 1 MB on the wire) fails at the limit: what is
    counted is the body decompressed, which is what memory holds."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing
    spaces = b" " * MiB
    packed = b"".join([packer.compress(b"{"), *(packer.compress(spaces) for _ in range(100))])
    packed += packer.flush()

    def respond(server: RawServer, handler: BaseHTTPRequestHandler) -> None:
        headers(handler, length=len(packed), extra={"Content-Encoding": "gzip"})
        server.write(handler, packed)

    with RawServer(respond) as server:
        agent = agent_on(server, clock, max_response_bytes=4 * MiB)
        peak, raised = peak_bytes(lambda: agent.run(TASK, toolbox, seed=0))
    assert isinstance(raised, ModelServerError) and raised.limit == "max_response_bytes"
    assert len(packed) < 4 * MiB and peak < 24 * MiB


def test_an_error_body_is_read_only_as_far_as_its_message(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """A 503 with a 300 MB body: its first 64 KiB give the message, the rest is not read; the
    503 is retried as any (the memory stays small)."""
    with RawServer(huge_body(300 * MiB, status=503)) as server:
        agent = agent_on(server, clock, attempts=2)
        peak, raised = peak_bytes(lambda: agent.run(TASK, toolbox, seed=0))
    assert isinstance(raised, ModelServerError) and raised.status == 503, raised
    assert raised.attempts == 2 and server.requests == 2 and raised.limit is None
    assert "HTTP 503: " in str(raised)
    assert peak < 8 * MiB and server.sent < 150 * MiB


def test_a_response_within_the_limit_is_read_whole(toolbox: Toolbox, clock: FakeClock) -> None:
    """A 3 MiB answer streamed without a length, under a 4 MiB limit, is the model's answer."""
    text = "y" * (3 * MiB)

    def respond(server: RawServer, handler: BaseHTTPRequestHandler) -> None:
        headers(handler)
        body = completion(text)
        for i in range(0, len(body), 64 * 1024):
            server.write(handler, body[i : i + 64 * 1024])

    with RawServer(respond) as server:
        output = agent_on(server, clock, max_response_bytes=4 * MiB).run(TASK, toolbox, seed=0)
    assert output.message == text


# --- the time of an attempt ---
def test_a_server_dripping_its_answer_fails_the_attempt_at_request_timeout(
    toolbox: Toolbox, clock: FakeClock
) -> None:
    """One byte every 100 ms, each read well within timeout=5 s (the whole body would take
    over 11 s): the attempt ends at request_timeout=0.3 s with a ModelServerError naming it;
    it is retried as a timeout is, and counts against the circuit (no answer)."""
    body = completion("slow")

    def respond(server: RawServer, handler: BaseHTTPRequestHandler) -> None:
        headers(handler, length=len(body))
        for i in range(len(body)):
            server.write(handler, body[i : i + 1])
            time.sleep(0.1)

    with RawServer(respond) as server:
        agent = agent_on(server, clock, attempts=2, timeout=5, request_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(ModelServerError) as info:
            agent.run(TASK, toolbox, seed=0)
        seconds = time.monotonic() - started
    error = info.value
    assert error.limit == "request_timeout" and error.attempts == 2 and server.requests == 2
    assert "request_timeout=0.3 s" in str(error) and "raise request_timeout" in str(error)
    assert len(body) > 110 and 0.6 <= seconds < 5
    assert agent.endpoint.stats().errors == {"request_timeout": 2}


def test_a_server_that_stops_sending_fails_at_timeout(toolbox: Toolbox, clock: FakeClock) -> None:
    """Half a body, then silence: the wait for the next bytes ends at timeout (per read)."""
    body = completion("never whole")

    def respond(server: RawServer, handler: BaseHTTPRequestHandler) -> None:
        headers(handler, length=len(body))
        server.write(handler, body[: len(body) // 2])
        server.closing.wait(30)

    with RawServer(respond) as server:
        agent = agent_on(server, clock, timeout=0.2)
        started = time.monotonic()
        with pytest.raises(ModelServerError, match=r"no answer within 0\.2 s") as info:
            agent.run(TASK, toolbox, seed=0)
    assert time.monotonic() - started < 10 and info.value.status is None  # (not 30 s)


# --- the arguments of a tool call ---
def test_tool_arguments_over_the_limit_are_refused_unparsed_and_told_to_the_model(
    shop: Shop, toolbox: Toolbox, clock: FakeClock
) -> None:
    """A tool call with 2 MB of arguments (the default limit is 1 MiB): the tool does not run,
    the model reads why in the call's result (as for malformed arguments) and answers; the
    trial goes on."""
    big = json.dumps({"order_id": "o1", "note": "z" * (2 * MiB)})
    script = [tool_reply(("get_order", big)), text_reply("Sorry.")]
    with FakeChatServer(script) as server:
        output = agent_for(server, clock).run(TASK, toolbox, seed=0)
    (result,) = server.tool_results()
    assert result["content"].startswith("Error: tool 'get_order' not called: its arguments are")
    assert "over the limit of 1,048,576 (max_tool_argument_bytes)" in result["content"]
    assert toolbox.calls == [] and output.meta["malformed_tool_calls"] == 1
    assert output.message == "Sorry." and server.errors == []


def test_arguments_over_the_limit_are_not_parsed() -> None:
    """Past max_bytes, even invalid JSON is refused for its size (it was never parsed); a
    character counts by its UTF-8 bytes; an object sent as such (Ollama) by its JSON."""
    too_long, problem = parse_arguments("{" * 2000, max_bytes=1000)
    assert too_long is None and problem is not None and "2,000 bytes" in problem
    assert "not valid JSON" in str(parse_arguments("{" * 999, max_bytes=1000)[1])
    accented = json.dumps({"a": "é" * 400}, ensure_ascii=False)  # 400 characters, 800 bytes
    assert parse_arguments(accented, max_bytes=700)[0] is None
    assert parse_arguments(accented, max_bytes=900)[0] == {"a": "é" * 400}
    assert parse_arguments({"a": "b" * 100}, max_bytes=50)[0] is None
    assert parse_arguments({"a": "b"}, max_bytes=50)[0] == {"a": "b"}
