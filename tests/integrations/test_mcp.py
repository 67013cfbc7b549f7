"""Actions served as MCP tools by ``harness mcp serve``, driven by the MCP client over stdio.

The server is a subprocess (``python -m harness.cli mcp serve bank_actions:actions``) over a
SQLite bank the test reads directly; the store says what committed and what was compensated.
One session runs the committed, refused, parallel and rolled-back calls; the escalation gets
sessions of its own.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult

import harness as hx
from harness.integrations.mcp import META_EPISODE, build_server, describe

FIXTURES = Path(__file__).parent / "mcp_fixtures"
sys.path.insert(0, str(FIXTURES))

import bank_db  # noqa: E402

SERVE = [sys.executable, "-m", "harness.cli", "mcp", "serve", "bank_actions:actions"]


def _server(db: Path, store: str, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "harness.cli",
            "mcp",
            "serve",
            "bank_actions:actions",
            "--store",
            store,
            *extra,
        ],
        cwd=str(FIXTURES),
        env={"HX_MCP_BANK_DB": str(db)},
    )


@asynccontextmanager
async def _client(db: Path, store: str, *extra: str) -> AsyncIterator[Client]:
    async with Client(_server(db, store, *extra)) as client:
        yield client


def _episode(result: CallToolResult) -> str:
    assert result.meta is not None
    return str(result.meta[META_EPISODE])


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One stdio session: a deposit, a refused withdrawal, two deposits at once, then a fee
    whose postcondition fails (the episode rolls back), then one more call."""
    tmp = tmp_path_factory.mktemp("mcp")
    db, store = tmp / "bank.db", f"sqlite:///{tmp}/h.db"
    bank_db.setup(str(db), {"a": 100, "b": 0})
    seen: dict[str, Any] = {"db": db, "store": store}

    async def run() -> None:
        async with _client(db, store) as client:
            seen["tools"] = (await client.list_tools()).tools
            seen["deposit"] = await client.call_tool("deposit", {"account": "a", "amount": 5})
            seen["after_deposit"] = bank_db.balances(str(db))
            seen["refused"] = await client.call_tool("withdraw", {"account": "a", "amount": 500})
            start = time.perf_counter()
            seen["parallel"] = await asyncio.gather(
                client.call_tool("deposit", {"account": "a", "amount": 1}),
                client.call_tool("deposit", {"account": "b", "amount": 2}),
            )
            seen["parallel_s"] = time.perf_counter() - start
            seen["after_parallel"] = bank_db.balances(str(db))
            seen["fee"] = await client.call_tool("charge_fee", {"account": "a", "amount": 3})
            seen["after_fee"] = bank_db.balances(str(db))
            seen["later"] = await client.call_tool("deposit", {"account": "a", "amount": 7})

    asyncio.run(run())
    seen["episode"] = _episode(seen["deposit"])
    return seen


def test_the_client_lists_the_actions_with_their_schemas(session: dict[str, Any]):
    """tools/list gives each action's name, description and argument schema."""
    tools = {t.name: t for t in session["tools"]}
    assert set(tools) == {"deposit", "withdraw", "charge_fee", "close_account", "balance"}
    assert tools["deposit"].description == "Put money into an account."
    assert tools["deposit"].input_schema["required"] == ["account", "amount"]
    assert tools["balance"].annotations is not None and tools["balance"].annotations.read_only_hint


def test_a_committed_call_answers_with_the_tool_result(session: dict[str, Any]):
    """A call that commits returns the tool's result (text and structured) and its effect."""
    result = session["deposit"]
    assert not result.is_error
    assert result.structured_content == {"account": "a", "balance": 105}
    assert session["after_deposit"] == {"a": 105, "b": 0}


def test_a_refused_call_is_an_error_result_with_the_refusal(session: dict[str, Any]):
    """A failed precondition reaches the client as isError with the harness's reason."""
    result = session["refused"]
    assert result.is_error
    assert "precondition 'covered' is false" in describe(result)
    assert "does not cover" in describe(result)


def test_two_calls_at_once_in_one_session_both_commit(session: dict[str, Any]):
    """Two concurrent tools/call requests of one session each commit once, in one episode."""
    first, second = session["parallel"]
    assert not first.is_error and not second.is_error
    assert {_episode(first), _episode(second)} == {session["episode"]}
    assert session["after_parallel"] == {"a": 106, "b": 2}
    store = hx.Store(session["store"])
    diffs = {
        t.args["account"]: t.diff
        for t in store.transactions(session["episode"])
        if t.action == "deposit" and t.args["amount"] in (1, 2)
    }
    # Each is attributed exactly its own change, though both were in flight at once.
    assert diffs == {
        "a": {"accounts/a": [{"id": "a", "balance": 105}, {"id": "a", "balance": 106}]},
        "b": {"accounts/b": [{"id": "b", "balance": 0}, {"id": "b", "balance": 2}]},
    }


def test_a_failed_postcondition_rolls_the_session_back(session: dict[str, Any]):
    """The fee's failed postcondition rolls back every committed call of the session (the
    bank is as it was), the store says so, and later calls of the session are refused."""
    assert session["fee"].is_error
    assert "postcondition 'charged_once' is false" in describe(session["fee"])
    assert session["after_fee"] == {"a": 100, "b": 0}
    assert bank_db.balances(str(session["db"])) == {"a": 100, "b": 0}
    store = hx.Store(session["store"])
    assert store.episode(session["episode"]).status == "rolled_back"
    txns = [(t.action, t.status) for t in store.transactions(session["episode"])]
    assert txns == [
        ("deposit", "compensated"),
        ("withdraw", "precondition"),
        ("deposit", "compensated"),
        ("deposit", "compensated"),
        ("charge_fee", "failed"),
    ]
    assert session["later"].is_error and "rolled_back" in describe(session["later"])
    assert len(store.episodes()) == 1


async def test_an_escalation_holds_the_session_until_resolved_then_resumes(tmp_path: Path):
    """An approval=True call is an error naming the escalation; later calls are refused while
    it is pending; approved, the held call runs once in the same session; a second held call
    resumed from a new session (--episode-id) runs after its approval too."""
    db, url = tmp_path / "bank.db", f"sqlite:///{tmp_path}/h.db"
    bank_db.setup(str(db), {"a": 100, "b": 40})
    store = hx.Store(url, create=True)
    async with _client(db, url, "--episode-id", "e1") as client:
        held = await client.call_tool("close_account", {"account": "a"})
        assert held.is_error and _episode(held) == "e1"
        (pending,) = store.escalations(status="pending", episode_id="e1")
        assert pending.id in describe(held) and "harness escalations" in describe(held)
        blocked = await client.call_tool("deposit", {"account": "b", "amount": 1})
        assert blocked.is_error and pending.id in describe(blocked)
        assert bank_db.balances(str(db)) == {"a": 100, "b": 40}
        store.resolve(pending.id, "approve", by="lead", reason="customer asked")
        done = await client.call_tool("close_account", {"account": "a"})
        assert not done.is_error, describe(done)
        assert bank_db.balances(str(db)) == {"a": 0, "b": 40}
        second = await client.call_tool("close_account", {"account": "b"})
        assert second.is_error
    assert store.episode("e1").status == "escalated"
    (pending,) = store.escalations(status="pending", episode_id="e1")
    store.resolve(pending.id, "approve", by="lead")
    async with _client(db, url, "--episode-id", "e1") as client:
        again = await client.call_tool("close_account", {"account": "b"})
        assert not again.is_error, describe(again)
        repeat = await client.call_tool("close_account", {"account": "a"})
        assert not repeat.is_error  # already committed: answered from the record
    assert bank_db.balances(str(db)) == {"a": 0, "b": 0}
    assert store.episode("e1").status == "committed"
    txns = [(t.action, t.status) for t in store.transactions("e1")]
    assert txns.count(("close_account", "committed")) == 2
    assert [e.status for e in store.escalations(episode_id="e1")] == ["approved", "approved"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_over_http_each_session_is_its_own_episode(tmp_path: Path):
    """Over Streamable HTTP, two client sessions run two episodes, each ended with its session."""
    db, url = tmp_path / "bank.db", f"sqlite:///{tmp_path}/h.db"
    bank_db.setup(str(db), {"a": 100, "b": 0})
    port = _free_port()
    proc = subprocess.Popen(
        [*SERVE, "--store", url, "--transport", "http", "--port", str(port)],
        cwd=FIXTURES,
        env={**os.environ, "HX_MCP_BANK_DB": str(db)},
        stderr=subprocess.DEVNULL,
    )
    try:
        episodes = []
        for account in ("a", "b"):
            for _ in range(100):
                try:
                    async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
                        result = await client.call_tool(
                            "deposit", {"account": account, "amount": 3}
                        )
                        episodes.append(_episode(result))
                    break
                except Exception:
                    if proc.poll() is not None:
                        raise
                    await asyncio.sleep(0.1)
        assert episodes[0] != episodes[1]
        store = hx.Store(url)
        for _ in range(50):  # the server ends a session's episode once the client has left
            if all(store.episode(e).status == "committed" for e in episodes):
                break
            await asyncio.sleep(0.1)
        assert [store.episode(e).status for e in episodes] == ["committed", "committed"]
        assert bank_db.balances(str(db)) == {"a": 103, "b": 3}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_an_in_process_client_reaches_the_same_server(tmp_path: Path):
    """build_server's MCPServer serves an in-process mcp Client: one episode for the client."""
    state = hx.DictState({"counter/x": {"n": 0}})

    @hx.action(writes=["counter/{name}"])
    def bump(name: str) -> int:
        """Add one to a counter."""
        state[f"counter/{name}"] = {"n": state[f"counter/{name}"]["n"] + 1}
        return int(state[f"counter/{name}"]["n"])

    server = build_server([bump], state=state, store=f"sqlite:///{tmp_path}/h.db")
    async with Client(server, mode="legacy") as client:
        one = await client.call_tool("bump", {"name": "x"})
        bad = await client.call_tool("bump", {"name": 3})
    assert describe(one) == "1" and bad.is_error and "invalid arguments" in describe(bad)
    store = hx.Store(f"sqlite:///{tmp_path}/h.db")
    assert [(t.action, t.status) for t in store.transactions(_episode(one))] == [
        ("bump", "committed"),
        ("bump", "invalid"),
    ]
    assert store.episode(_episode(one)).status == "committed"


def test_a_bad_target_is_a_clear_error(tmp_path: Path):
    """harness mcp serve with a target that is not actions says what to give instead."""
    from click.testing import CliRunner

    from harness.cli import main

    for target, says in [
        (f"{FIXTURES}/bank_db.py:sqlite3", "is a module; give a list of @hx.action functions"),
        (f"{FIXTURES}/bank_db.py:setup", "calling it raised TypeError"),
    ]:
        out = CliRunner().invoke(main, ["mcp", "serve", target])
        assert out.exit_code == 2 and says in out.output, out.output
    missing = CliRunner().invoke(main, ["mcp", "serve", "nowhere_at_all:actions"])
    assert missing.exit_code == 2 and "cannot import 'nowhere_at_all'" in missing.output


def test_the_example_runs_as_its_docstring_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """examples/integrations/mcp_example.py lists the tool, gets the refusal as an error
    result, commits the other deposit, and prints the records of the session's episode."""
    path = Path(__file__).resolve().parents[2] / "examples" / "integrations" / "mcp_example.py"
    example = runpy.run_path(str(path), run_name="example")
    asyncio.run(example["main"](f"sqlite:///{tmp_path}/h.db"))
    assert capsys.readouterr().out.splitlines() == [
        "['deposit']",
        "True action 'deposit' not executed: precondition 'account_exists' is false: the "
        "account does not exist",
        "{'account': 'a', 'balance': 10}",
        "committed",
        "deposit precondition",
        "deposit committed",
    ]


async def test_a_call_naming_its_episode_in_meta_runs_in_it(tmp_path: Path):
    """A call whose _meta names harness/episode runs in that episode (calls naming the same one
    share it), apart from the session's own; each ends when the server stops."""
    state = hx.DictState({"counter/x": {"n": 0}, "counter/y": {"n": 0}})

    @hx.action(writes=["counter/{name}"])
    def bump(name: str) -> int:
        """Add one to a counter."""
        state[f"counter/{name}"] = {"n": state[f"counter/{name}"]["n"] + 1}
        return int(state[f"counter/{name}"]["n"])

    url = f"sqlite:///{tmp_path}/h.db"
    async with Client(build_server([bump], state=state, store=url)) as client:
        mine = {META_EPISODE: "mine"}
        calls = [
            await client.call_tool("bump", {"name": "x"}, meta=mine),
            await client.call_tool("bump", {"name": "y"}, meta=mine),
            await client.call_tool("bump", {"name": "x"}),
            await client.call_tool("bump", {"name": "y"}, meta={META_EPISODE: "other"}),
        ]
        bad = await client.call_tool("bump", {"name": "x"}, meta={META_EPISODE: ""})
    assert [_episode(c) for c in calls[:2]] == ["mine", "mine"]
    assert _episode(calls[2]) not in ("mine", "other") and _episode(calls[3]) == "other"
    assert bad.is_error and "non-empty string" in describe(bad)
    store = hx.Store(url)
    assert {e.id: e.status for e in store.episodes()} == {
        "mine": "committed",
        "other": "committed",
        _episode(calls[2]): "committed",
    }
    assert [t.args["name"] for t in store.transactions("mine")] == ["x", "y"]
    assert state["counter/x"] == {"n": 2} and state["counter/y"] == {"n": 2}


def test_a_target_may_be_actions_a_factory_or_state_and_actions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """load_served takes a list or dict of actions (state: --state, else the module's
    `state`), or a function returning them or (state, actions); no state is a clear error."""
    from harness.integrations.mcp import load_served

    (tmp_path / "served_tools.py").write_text(
        "import harness as hx\n"
        "state = hx.DictState({})\n"
        "other = hx.DictState({})\n"
        "policy = hx.Policy()\n"
        "@hx.action\n"
        "def ping() -> str:\n"
        "    return 'pong'\n"
        "listed = [ping]\n"
        "named = {'renamed': ping}\n"
        "def factory():\n"
        "    return (other, [ping])\n"
    )
    (tmp_path / "stateless_tools.py").write_text(
        "import harness as hx\n@hx.action\ndef ping() -> str:\n    return 'pong'\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    listed = load_served("served_tools:listed")
    assert list(listed.actions) == ["ping"] and listed.policy is not None
    module = sys.modules["served_tools"]
    assert listed.state is module.state
    assert list(load_served("served_tools:named").actions) == ["renamed"]
    assert load_served("served_tools:listed", state="served_tools:other").state is module.other
    assert load_served("served_tools:factory").state is module.other
    assert load_served(f"{tmp_path}/served_tools.py:listed").state is module.state
    with pytest.raises(hx.ConfigurationError, match="no state adapter"):
        load_served("stateless_tools:ping")
    with pytest.raises(hx.ConfigurationError, match="not module:attribute"):
        load_served("served_tools")
    with pytest.raises(hx.ConfigurationError, match="has no attribute 'nothing'"):
        load_served("served_tools:nothing")
