"""The transactional proxy (``harness mcp proxy``) in front of an upstream MCP server.

The upstream server is ``mcp_fixtures/bank_server.py`` (accounts in a JSON file the test
reads); the config puts a precondition, a postcondition and a compensation on its
``withdraw``. The proxy runs as ``python -m harness.cli mcp proxy`` and the test is its MCP
client over stdio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

import harness as hx
from harness.integrations.mcp import META_EPISODE, describe
from harness.integrations.mcp_proxy import ToolRule, UpstreamError, build_proxy, load_config

FIXTURES = Path(__file__).parent / "mcp_fixtures"


def _config(tmp: Path, **extra: str) -> Path:
    text = (FIXTURES / "bank_proxy.toml").read_text()
    command = json.dumps([sys.executable, str(FIXTURES / "bank_server.py"), str(tmp / "bank.json")])
    text = text.replace(
        'command = ["python", "bank_server.py", "bank.json"]', f"command = {command}"
    )
    path = tmp / "proxy.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One proxy session: a withdrawal that commits, one refused by its precondition, an
    unlisted read tool, then a withdrawal the upstream bug fakes (its postcondition fails)."""
    tmp = tmp_path_factory.mktemp("proxy")
    data = tmp / "bank.json"
    data.write_text(json.dumps({"alice": 500, "bob": 20}))
    store = f"sqlite:///{tmp}/h.db"
    config = _config(tmp)
    seen: dict[str, Any] = {"data": data, "store": store, "config": config}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "harness.cli", "mcp", "proxy", str(config), "--store", store],
        cwd=str(FIXTURES),
    )

    async def go() -> None:
        async with Client(params) as client:
            seen["tools"] = {t.name: t for t in (await client.list_tools()).tools}
            seen["first"] = await client.call_tool("withdraw", {"account": "alice", "amount": 30})
            seen["after_first"] = json.loads(data.read_text())
            seen["refused"] = await client.call_tool("withdraw", {"account": "bob", "amount": 50})
            seen["read"] = await client.call_tool("get_account", {"account": "bob"})
            seen["faked"] = await client.call_tool("withdraw", {"account": "alice", "amount": 200})
            seen["after_faked"] = json.loads(data.read_text())

    asyncio.run(go())
    return seen


def test_the_proxy_serves_the_upstream_tools(run: dict[str, Any]):
    """Every upstream tool is served with its upstream name and input schema; unlisted ones
    as read-only."""
    tools = run["tools"]
    assert set(tools) == {"get_account", "deposit", "withdraw", "list_accounts"}
    assert tools["withdraw"].input_schema["required"] == ["account", "amount"]
    # the upstream's own schema (as its SDK made it), not one rebuilt from it
    assert tools["withdraw"].input_schema["title"] == "withdrawArguments"
    assert tools["get_account"].annotations.read_only_hint
    assert not tools["withdraw"].annotations.read_only_hint


def test_a_committed_call_reaches_upstream_once(run: dict[str, Any]):
    """A withdrawal through the proxy commits, and the upstream data shows it once."""
    assert not run["first"].is_error, describe(run["first"])
    assert run["after_first"] == {"alice": 470, "bob": 20}


def test_a_precondition_from_the_config_refuses_before_upstream(run: dict[str, Any]):
    """The config's precondition, reading upstream state, refuses the call; nothing ran."""
    assert run["refused"].is_error and "precondition 'covered' is false" in describe(run["refused"])
    assert not run["read"].is_error and run["read"].structured_content == {
        "account": "bob",
        "balance": 20,
    }


def test_a_failed_postcondition_compensates_the_earlier_call_upstream(run: dict[str, Any]):
    """The faked withdrawal fails its postcondition; the episode rolls back, the earlier
    withdrawal is compensated upstream (a deposit), and the data is back as before."""
    assert run["faked"].is_error
    assert "postcondition 'dropped_by_amount' is false" in describe(run["faked"])
    assert run["after_faked"] == {"alice": 500, "bob": 20}
    assert json.loads(run["data"].read_text()) == {"alice": 500, "bob": 20}
    store = hx.Store(run["store"])
    episode = str(run["first"].meta[META_EPISODE])
    assert store.episode(episode).status == "rolled_back"
    assert [(t.action, t.status) for t in store.transactions(episode)] == [
        ("withdraw", "compensated"),
        ("withdraw", "precondition"),
        ("get_account", "committed"),
        ("withdraw", "failed"),
    ]


def test_a_config_with_a_wrong_field_is_a_clear_error(tmp_path: Path):
    """A config without an upstream, or with an unknown tool key, names the fix."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[proxy]\nunlisted = 'read-only'\n")
    with pytest.raises(hx.ConfigurationError, match="exactly one of command"):
        load_config(bad)
    bad.write_text("[upstream]\nurl = 'http://x/mcp'\n[tools.w]\nwrite = ['a/{b}']\n")
    with pytest.raises(hx.ConfigurationError, match=r"\[tools.w\] has unknown keys write"):
        load_config(bad)
    bad.write_text("[upstream]\nurl = 'http://x/mcp'\n[tools.w]\napproval = 'no'\n")
    with pytest.raises(hx.ConfigurationError, match="approval = 'no'; use true or false"):
        load_config(bad)


async def test_unlisted_tools_can_be_refused_and_upstream_errors_are_refusals(tmp_path: Path):
    """With unlisted = "refuse" only the configured tools are served; an upstream error result
    fails the call (the client reads the upstream text) and changes nothing; the config's
    idempotency key function keeps a repeated deposit from reaching upstream twice."""
    data = tmp_path / "bank.json"
    data.write_text(json.dumps({"alice": 5}))
    config = load_config(_config(tmp_path)).with_store(f"sqlite:///{tmp_path}/h.db")
    deposit = ToolRule(
        writes=("accounts/{account}",), idempotency_key="bank_hooks:one_deposit_per_account"
    )
    tools = {**config.tools, "deposit": deposit}
    config = dataclasses.replace(config, unlisted="refuse", hooks=FIXTURES, tools=tools)
    proxy = build_proxy(config)
    try:
        async with Client(proxy.server, mode="legacy") as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            missing = await client.call_tool("withdraw", {"account": "zed", "amount": 1})
            failed = await client.call_tool("deposit", {"account": "zed", "amount": 1})
            unknown = await client.call_tool("get_account", {"account": "alice"})
            once = await client.call_tool("deposit", {"account": "alice", "amount": 1})
            again = await client.call_tool("deposit", {"account": "alice", "amount": 1})
            other = await client.call_tool("deposit", {"account": "alice", "amount": 7})
    finally:
        proxy.close()
    assert sorted(tools) == ["deposit", "withdraw"]
    assert missing.is_error and "precondition 'covered' is false" in describe(missing)
    assert failed.is_error and "no account zed" in describe(failed)
    assert unknown.is_error and "unknown tool 'get_account'" in describe(unknown)
    # The config's key function names the effect: the same deposit again is answered from the
    # record, another amount under the same key is refused; upstream saw one deposit.
    assert not once.is_error and describe(again) == describe(once)
    assert other.is_error and "IdempotencyConflict" in describe(other)
    assert json.loads(data.read_text()) == {"alice": 6}


async def test_an_upstream_over_http_is_proxied_the_same_way(tmp_path: Path):
    """With url = "http://.../mcp" the proxy reaches the upstream over Streamable HTTP: a
    committed withdrawal, then one that fails its postcondition, undone upstream."""
    data = tmp_path / "bank.json"
    data.write_text(json.dumps({"alice": 500}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    upstream = subprocess.Popen(
        [sys.executable, str(FIXTURES / "bank_server.py"), str(data), "--http", str(port)],
        stderr=subprocess.DEVNULL,
    )
    path = tmp_path / "proxy.toml"
    text = (FIXTURES / "bank_proxy.toml").read_text()
    path.write_text(
        text.replace(
            'command = ["python", "bank_server.py", "bank.json"]',
            f'url = "http://127.0.0.1:{port}/mcp"',
        )
    )
    config = dataclasses.replace(
        load_config(path).with_store(f"sqlite:///{tmp_path}/h.db"), hooks=FIXTURES
    )
    try:
        for _ in range(100):  # until the upstream server listens
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                await asyncio.sleep(0.1)
        proxy = build_proxy(config)
        try:
            async with Client(proxy.server, mode="legacy") as client:
                first = await client.call_tool("withdraw", {"account": "alice", "amount": 30})
                middle = json.loads(data.read_text())
                faked = await client.call_tool("withdraw", {"account": "alice", "amount": 200})
        finally:
            proxy.close()
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    assert not first.is_error and middle == {"alice": 470}
    assert faked.is_error and "dropped_by_amount" in describe(faked)
    assert json.loads(data.read_text()) == {"alice": 500}
    episode = str(first.meta[META_EPISODE]) if first.meta else ""
    store = hx.Store(f"sqlite:///{tmp_path}/h.db")
    assert [t.status for t in store.transactions(episode)] == ["compensated", "failed"]


def test_an_upstream_that_does_not_start_is_a_clear_error(tmp_path: Path):
    """An upstream command that exits at once is an UpstreamError naming the command."""
    config = tmp_path / "dead.toml"
    dead = json.dumps([sys.executable, "-c", "raise SystemExit(3)"])
    config.write_text(f"[upstream]\ncommand = {dead}\n")
    with pytest.raises(UpstreamError, match="cannot connect to the upstream MCP server"):
        build_proxy(load_config(config))
