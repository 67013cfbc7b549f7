"""Hostile lines sent on stdin to ``harness mcp serve``: each is answered with an error that
names the problem, nothing of it runs or is recorded, and the next request is served.

The server is a real subprocess (``python -m harness mcp serve bank_actions:actions``) spoken
to line by line, as a client that writes raw JSON-RPC would: the MCP client cannot send
malformed lines. Each request waits for its answer, so a line left unanswered fails the test
after a timeout instead of hanging it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import harness as hx
from harness.integrations.mcp import MAX_ARGUMENT_BYTES, READ_DEPTH_LIMIT

FIXTURES = Path(__file__).parent / "mcp_fixtures"
sys.path.insert(0, str(FIXTURES))

import bank_db  # noqa: E402

SERVE = [sys.executable, "-m", "harness", "mcp", "serve", "bank_actions:actions"]
PARSE_ERROR, INVALID_REQUEST = -32700, -32600
ANSWER_TIMEOUT = 30.0


class RawClient:
    """A ``harness mcp serve`` subprocess spoken to in raw JSON-RPC lines over stdio."""

    def __init__(self, db: Path, store: str) -> None:
        self.proc = subprocess.Popen(
            [*SERVE, "--store", store],
            cwd=FIXTURES,
            env={**os.environ, "HX_MCP_BANK_DB": str(db)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, line: str | dict[str, Any]) -> None:
        """Write one line (a message is written as JSON)."""
        text = line if isinstance(line, str) else json.dumps(line)
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        """The next message the server writes."""
        try:
            line = self.lines.get(timeout=ANSWER_TIMEOUT)
        except queue.Empty:
            pytest.fail(f"the server sent no answer within {ANSWER_TIMEOUT} s")
        message: dict[str, Any] = json.loads(line)
        return message

    def ask(self, line: str | dict[str, Any]) -> dict[str, Any]:
        """Send a line and return the answer to it."""
        self.send(line)
        return self.answer()

    def close(self) -> int:
        """End the session (stdin closed) and return the server's exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def _call(request_id: int, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "deposit", "arguments": arguments},
    }


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture(scope="module")
def exchange(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One stdio session: after the handshake, each hostile line is followed by a normal
    deposit to account a (of 1 after the first, 2 after the second, ...); the answers, the
    store and the bank afterwards."""
    tmp = tmp_path_factory.mktemp("mcp-hostile")
    db, store = tmp / "bank.db", f"sqlite:///{tmp}/h.db"
    bank_db.setup(str(db), {"a": 100, "b": 0})
    client = RawClient(db, store)
    try:
        hello = client.ask(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            }
        )
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        hostile = {
            # The attack as found: the request's arguments are 50,000 nested lists.
            "nested 50,000 deep": '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
            '{"name":"deposit","arguments":' + _deep(50_000) + "}}",
            "nested 5,000 deep inside arguments": json.dumps(
                _call(1, {"account": "a", "amount": 1, "note": "@"})
            ).replace('"@"', _deep(5_000)),
            "a line of 5 MB": json.dumps(_call(1, {"account": "a" * 5_000_000, "amount": 1})),
            "not JSON": "this is not JSON",
            "JSON with a bad object inside a request": '{"jsonrpc":"2.0","id":1,'
            '"method":"tools/call","params":{"name": deposit}}',
            "JSON that is no message": "[1, 2]",
            "a request whose method is a number": '{"jsonrpc":"2.0","id":"x","method":3}',
        }
        answers: dict[str, dict[str, Any]] = {}
        after: dict[str, dict[str, Any]] = {}
        for n, (case, line) in enumerate(hostile.items()):
            answers[case] = client.ask(line)
            # Each of its own amount: the same call made twice in an episode runs once.
            after[case] = client.ask(_call(100 + n, {"account": "a", "amount": n + 1}))
    finally:
        status = client.close()
    yield {
        "hello": hello,
        "answers": answers,
        "after": after,
        "status": status,
        "store": hx.Store(store),
        "balances": bank_db.balances(str(db)),
        "served": len(hostile),
    }


def _error(answer: dict[str, Any]) -> tuple[Any, int, str]:
    assert "error" in answer, answer
    return answer["id"], answer["error"]["code"], answer["error"]["message"]


def test_a_request_nested_50000_deep_is_answered_with_a_parse_error_naming_the_depth(
    exchange: dict[str, Any],
) -> None:
    """The 50,000-deep request gets a parse error for its id that says how deep it nests and
    how deep the server reads, instead of no answer at all."""
    request_id, code, message = _error(exchange["answers"]["nested 50,000 deep"])
    assert (request_id, code) == (1, PARSE_ERROR)
    assert "nests 50002 levels deep" in message
    assert f"at most {READ_DEPTH_LIMIT} levels" in message
    assert "less deeply nested" in message


def test_deep_json_inside_the_arguments_of_a_request_is_answered_the_same(
    exchange: dict[str, Any],
) -> None:
    """A well-formed request with 5,000 nested lists in one argument gets the same parse error
    for its id."""
    request_id, code, message = _error(exchange["answers"]["nested 5,000 deep inside arguments"])
    assert (request_id, code) == (1, PARSE_ERROR)
    assert "nests 5003 levels deep" in message


def test_a_huge_line_is_refused_as_a_tool_error_naming_its_size(exchange: dict[str, Any]) -> None:
    """A call whose arguments are larger than the server takes (as over HTTP) is a tool error
    naming their size and the limit, not run."""
    answer = exchange["answers"]["a line of 5 MB"]
    assert answer["id"] == 1 and answer["result"]["isError"] is True
    text = answer["result"]["content"][0]["text"]
    assert "are 5,000,028 bytes of JSON" in text
    assert f"over the {MAX_ARGUMENT_BYTES:,}" in text and "send smaller arguments" in text


@pytest.mark.parametrize(
    ("case", "request_id", "code", "says"),
    [
        ("not JSON", None, PARSE_ERROR, "Parse error: the line is not JSON (expected"),
        (
            "JSON with a bad object inside a request",
            1,
            PARSE_ERROR,
            "Parse error: the line is not JSON (expected value at line 1 column",
        ),
        (
            "JSON that is no message",
            None,
            INVALID_REQUEST,
            "not a JSON-RPC 2.0 message (field (top level): Input should be an object)",
        ),
        (
            "a request whose method is a number",
            "x",
            INVALID_REQUEST,
            "not a JSON-RPC 2.0 message (field method: Input should be a valid string)",
        ),
    ],
)
def test_a_line_that_is_no_message_is_answered_naming_why(
    exchange: dict[str, Any], case: str, request_id: Any, code: int, says: str
) -> None:
    """A line that is not JSON, or JSON that is no JSON-RPC message, gets a JSON-RPC error
    saying so: for the request's id when the line shows one, else for id null."""
    got_id, got_code, message = _error(exchange["answers"][case])
    assert (got_id, got_code) == (request_id, code)
    assert says in message


def test_the_server_keeps_serving_after_each_hostile_line(exchange: dict[str, Any]) -> None:
    """The normal request after every hostile line is answered and commits, and the session
    ends cleanly."""
    assert exchange["hello"]["result"]["serverInfo"]["name"] == "harness"
    for case, answer in exchange["after"].items():
        assert answer["result"]["isError"] is False, (case, answer)
    assert exchange["status"] == 0


def test_nothing_of_a_hostile_line_is_recorded_or_applied(exchange: dict[str, Any]) -> None:
    """Only the normal deposits ran: the store holds one committed transaction for each, and
    the bank moved by exactly them."""
    store: hx.Store = exchange["store"]
    recorded = [
        (t.action, t.status, t.args)
        for episode in store.episodes()
        for t in store.transactions(episode.id)
    ]
    amounts = range(1, exchange["served"] + 1)
    assert recorded == [("deposit", "committed", {"account": "a", "amount": n}) for n in amounts]
    assert exchange["balances"] == {"a": 100 + sum(amounts), "b": 0}
