"""The benchmarks' lean model server answers as the fake server does: the benchmarks' figures
are only as good as the server they run against."""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.suite import load_suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from scale import LeanServer


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


@pytest.fixture(scope="module")
def suite() -> Any:
    return load_suite("retail", check_references=False)


def test_it_answers_a_conversation_as_the_fake_server_does(suite: Any) -> None:
    """Each request of a conversation, sent to both over one kept-alive connection each, gets
    the same status and response (ids, message, tool calls, token counts)."""
    task = suite.tasks[0]
    lean = LeanServer(FakeChatServer(ReplayPolicy(suite.tasks)), 0.0)
    with FakeChatServer(ReplayPolicy(suite.tasks)) as reference:
        ours = http.client.HTTPConnection("127.0.0.1", lean.port)
        theirs = http.client.HTTPConnection("127.0.0.1", reference.port)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": task.instruction},
        ]
        try:
            for _turn in range(len(task.reference_actions) + 1):
                body = json.dumps({"model": "m", "messages": messages, "seed": 0}).encode()
                got, want = (
                    _post(ours, "/v1/chat/completions", body),
                    _post(theirs, "/v1/chat/completions", body),
                )
                assert got == want and got[0] == 200
                message = got[1]["choices"][0]["message"]
                messages.append(message)
                for call in message.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "{}"})
            assert "tool_calls" not in messages[-1]  # (the script ended with its answer)
            assert lean.requests == len(task.reference_actions) + 1
        finally:
            ours.close()
            theirs.close()
            lean.stop()


def test_it_refuses_what_the_fake_server_refuses(suite: Any) -> None:
    """Another path is a 404, a body that is not a chat request a 400 (recorded as an error),
    and the connection goes on serving after either; after stop nothing is served."""
    fake = FakeChatServer(ReplayPolicy(suite.tasks))
    lean = LeanServer(fake, 0.0)
    conn = http.client.HTTPConnection("127.0.0.1", lean.port, timeout=10)
    try:
        status, body = _post(conn, "/v1/embeddings", b"{}")
        assert status == 404 and body["error"]["type"] == "not_found"
        status, body = _post(conn, "/v1/chat/completions", b"not json")
        assert status == 400 and "not a JSON object" in body["error"]["message"]
        assert len(fake.errors) == 1
    finally:
        conn.close()
        lean.stop()
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", lean.port, timeout=2).request("GET", "/")


def test_the_cores_target_names_the_most_the_machine_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One process keeping 1.06 cores busy, two with 1.81 cores free to them: the cores target
    says at most 1.71x is reachable at the same CPU a trial, and how much of the free cores the
    two kept busy, beside the ratio it judges."""
    from scale import Row, performance_targets

    monkeypatch.setattr("os.cpu_count", lambda: 2)

    def row(setting: str, workers: int, seconds: float, cpu: float) -> Row:
        return Row(setting, 256, workers, 2000, seconds, 10620, cpu, others=0.0)

    one = row("concurrency 256", 1, 30.0, 31.8)
    two = row("processes 2x128", 2, 20.0, 29.0)
    two.server_cpu = 3.8  # (0.19 cores of the two the machine has)
    (line,) = [t for t in performance_targets([one, two], 2) if t.startswith("target cores")]
    assert "= 1.500x trials/s" in line and "not met" in line
    assert "at most 1.71x here (1.81 free / 1.06 busy with one process)" in line
    assert "processes 2x128 kept 80% of its free cores busy" in line
