"""The transactional proxy (``harness mcp proxy``) in front of an upstream MCP server.

The upstream server is ``mcp_fixtures/bank_server.py`` (accounts in a JSON file the test
reads); the config (``mcp_fixtures/bank_proxy.toml``, the example docs/mcp.md describes) puts
a precondition, a postcondition and a compensation on its ``withdraw``, declares
``get_account`` a read and leaves ``deposit`` and ``list_accounts`` unlisted. The proxy runs
as ``python -m harness.cli mcp proxy`` and the test is its MCP client over stdio.
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
from harness.integrations.mcp_proxy import (
    ProxyConfig,
    ToolRule,
    UpstreamError,
    build_proxy,
    load_config,
)

FIXTURES = Path(__file__).parent / "mcp_fixtures"
BOB = "accounts/bob"


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
    """One proxy session: a withdrawal that commits, one refused by its precondition, a
    declared read, a call of the unlisted deposit, then a withdrawal the upstream bug fakes
    (its postcondition fails)."""
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
            seen["unlisted"] = await client.call_tool("deposit", {"account": "bob", "amount": 1000})
            seen["after_unlisted"] = json.loads(data.read_text())
            seen["faked"] = await client.call_tool("withdraw", {"account": "alice", "amount": 200})
            seen["after_faked"] = json.loads(data.read_text())

    asyncio.run(go())
    return seen


def test_the_proxy_serves_the_tools_its_config_describes(run: dict[str, Any]):
    """The described tools are served with their upstream name and input schema, the declared
    read as read-only; the unlisted deposit and list_accounts are not advertised at all."""
    tools = run["tools"]
    assert set(tools) == {"get_account", "withdraw"}
    assert tools["withdraw"].input_schema["required"] == ["account", "amount"]
    # the upstream's own schema (as its SDK made it), not one rebuilt from it
    assert tools["withdraw"].input_schema["title"] == "withdrawArguments"
    assert tools["get_account"].annotations.read_only_hint
    assert not tools["withdraw"].annotations.read_only_hint


def test_an_unlisted_tool_is_refused_by_default_and_never_reaches_upstream(run: dict[str, Any]):
    """With the example config, deposit(bob, 1000) is an error naming the tool and how to
    allow it, and the upstream balance is untouched."""
    refused = run["unlisted"]
    assert refused.is_error
    text = describe(refused)
    assert "tool 'deposit' is refused" in text and "Nothing was sent upstream" in text
    assert "declare it in the proxy config: [tools.deposit]" in text
    assert 'unlisted = "escalate"' in text
    assert run["after_unlisted"] == {"alice": 470, "bob": 20}


def test_unlisted_defaults_to_refuse_and_read_only_is_no_longer_accepted(tmp_path: Path):
    """The example config says refuse, a config without the key refuses too, and the old
    read-only value is a config error naming both accepted values instead of a quiet hole."""
    assert load_config(FIXTURES / "bank_proxy.toml").unlisted == "refuse"
    bare = tmp_path / "bare.toml"
    bare.write_text("[upstream]\nurl = 'http://x/mcp'\n")
    assert load_config(bare).unlisted == "refuse"
    bare.write_text("[upstream]\nurl = 'http://x/mcp'\n[proxy]\nunlisted = 'read-only'\n")
    with pytest.raises(hx.ConfigurationError, match='"read-only" is no longer accepted') as err:
        load_config(bare)
    assert '"refuse"' in str(err.value) and '"escalate"' in str(err.value)
    example = load_config(FIXTURES / "bank_proxy.toml")
    with pytest.raises(hx.ConfigurationError, match="unlisted"):
        dataclasses.replace(example, unlisted="read-only")  # type: ignore[arg-type]


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
    withdrawal is compensated upstream (a deposit), and the data is back as before: the
    refused deposit left nothing behind for "rolled_back" to hide."""
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


async def test_unlisted_tools_are_refused_and_upstream_errors_are_refusals(tmp_path: Path):
    """Only the configured tools are served (get_account, left out here, is refused by name);
    an upstream error result fails the call (the client reads the upstream text) and changes
    nothing; the config's idempotency key function keeps a repeated deposit from reaching
    upstream twice."""
    data = tmp_path / "bank.json"
    data.write_text(json.dumps({"alice": 5}))
    config = load_config(_config(tmp_path)).with_store(f"sqlite:///{tmp_path}/h.db")
    deposit = ToolRule(
        writes=("accounts/{account}",), idempotency_key="bank_hooks:one_deposit_per_account"
    )
    tools = {"withdraw": config.tools["withdraw"], "deposit": deposit}
    config = dataclasses.replace(config, hooks=FIXTURES, tools=tools)
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
    assert unknown.is_error and "tool 'get_account' is refused" in describe(unknown)
    # The config's key function names the effect: the same deposit again is answered from the
    # record, another amount under the same key is refused; upstream saw one deposit.
    assert not once.is_error and describe(again) == describe(once)
    assert other.is_error and "IdempotencyConflict" in describe(other)
    assert json.loads(data.read_text()) == {"alice": 6}


def _proxy_config(tmp: Path, balances: dict[str, int], **changes: Any) -> ProxyConfig:
    """The example config against a bank with ``balances``, recording to ``tmp``, changed."""
    (tmp / "bank.json").write_text(json.dumps(balances))
    config = load_config(_config(tmp)).with_store(f"sqlite:///{tmp}/h.db")
    return dataclasses.replace(config, hooks=FIXTURES, **changes)


def _bank(tmp: Path) -> dict[str, int]:
    return dict(json.loads((tmp / "bank.json").read_text()))


async def test_tools_list_never_claims_read_only_for_a_tool_the_config_does_not_know(
    tmp_path: Path,
):
    """With unlisted = "escalate" the unlisted tools are listed, but without readOnlyHint:
    only the declared read carries it."""
    proxy = build_proxy(_proxy_config(tmp_path, {"bob": 20}, unlisted="escalate"))
    try:
        async with Client(proxy.server, mode="legacy") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
    finally:
        proxy.close()
    assert set(tools) == {"get_account", "deposit", "withdraw", "list_accounts"}
    hints = {name: tool.annotations.read_only_hint for name, tool in tools.items()}
    assert hints == {
        "get_account": True,
        "deposit": False,
        "withdraw": False,
        "list_accounts": False,
    }


async def test_an_unlisted_tool_let_through_is_held_recorded_as_a_write_and_not_undone(
    tmp_path: Path,
):
    """With unlisted = "escalate" a deposit is held for a person before it reaches upstream;
    approved, it runs once and is recorded as a write with its diff; a later failure that
    would roll back escalates instead, so the episode never says rolled_back while the
    upstream keeps the 1,000."""
    proxy = build_proxy(_proxy_config(tmp_path, {"alice": 500, "bob": 20}, unlisted="escalate"))
    store = hx.Store(f"sqlite:///{tmp_path}/h.db")
    try:
        async with Client(proxy.server, mode="legacy") as client:
            held = await client.call_tool("deposit", {"account": "bob", "amount": 1000})
            while_held = _bank(tmp_path)
            (pending,) = store.escalations("pending")
            store.resolve(pending.id, decision="approve", by="test", reason="checked")
            ran = await client.call_tool("deposit", {"account": "bob", "amount": 1000})
            faked = await client.call_tool("withdraw", {"account": "alice", "amount": 200})
    finally:
        proxy.close()
    assert held.is_error and "held for a person's approval" in describe(held)
    assert while_held == {"alice": 500, "bob": 20}
    assert not ran.is_error, describe(ran)
    assert faked.is_error and "not rolled back: the pivot action 'deposit'" in describe(faked)
    assert _bank(tmp_path) == {"alice": 500, "bob": 1020}
    episode = str(ran.meta[META_EPISODE]) if ran.meta else ""
    assert store.episode(episode).status == "escalated"
    deposit = next(
        t for t in store.transactions(episode) if t.action == "deposit" and t.status == "committed"
    )
    assert deposit.mutating
    assert deposit.diff == {
        BOB: [{"account": "bob", "balance": 20}, {"account": "bob", "balance": 1020}]
    }


async def test_a_read_only_tool_that_changes_state_is_a_scope_failure(tmp_path: Path):
    """A tool declared a read is watched through [[state]]: get_account commits as a read
    with no diff, while a deposit declared read-only fails as a scope failure naming
    accounts/bob and its change, and the episode escalates instead of committing."""
    tools = {**load_config(FIXTURES / "bank_proxy.toml").tools, "deposit": ToolRule()}
    proxy = build_proxy(_proxy_config(tmp_path, {"bob": 20}, tools=tools))
    store = hx.Store(f"sqlite:///{tmp_path}/h.db")
    try:
        async with Client(proxy.server, mode="legacy") as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            read = await client.call_tool("get_account", {"account": "bob"})
            wrote = await client.call_tool("deposit", {"account": "bob", "amount": 1000})
    finally:
        proxy.close()
    assert listed["deposit"].annotations.read_only_hint  # what the config declared
    assert not read.is_error
    assert wrote.is_error and f"changed {BOB} outside its declared writes" in describe(wrote)
    episode = str(read.meta[META_EPISODE]) if read.meta else ""
    first, second = store.transactions(episode)
    assert (first.action, first.status, first.diff) == ("get_account", "committed", {})
    assert (second.action, second.status, second.failure_class) == ("deposit", "failed", "scope")
    assert second.diff == {
        BOB: [{"account": "bob", "balance": 20}, {"account": "bob", "balance": 1020}]
    }
    assert store.episode(episode).status == "escalated"


async def test_a_write_without_compensation_then_a_failure_does_not_say_rolled_back(
    tmp_path: Path,
):
    """A deposit declared as a write with no compensation commits; the rollback a later
    failed withdrawal asks for cannot undo it, so the episode ends escalated (a failed
    compensation), not rolled_back."""
    rule = ToolRule(writes=("accounts/{account}",))
    tools = {**load_config(FIXTURES / "bank_proxy.toml").tools, "deposit": rule}
    proxy = build_proxy(_proxy_config(tmp_path, {"alice": 500, "bob": 20}, tools=tools))
    store = hx.Store(f"sqlite:///{tmp_path}/h.db")
    try:
        async with Client(proxy.server, mode="legacy") as client:
            ran = await client.call_tool("deposit", {"account": "bob", "amount": 1000})
            faked = await client.call_tool("withdraw", {"account": "alice", "amount": 200})
    finally:
        proxy.close()
    assert not ran.is_error and faked.is_error
    assert "it has no compensation" in describe(faked)
    assert _bank(tmp_path) == {"alice": 500, "bob": 1020}
    episode = str(ran.meta[META_EPISODE]) if ran.meta else ""
    assert store.episode(episode).status == "escalated"
    deposit = store.transactions(episode)[0]
    assert (deposit.action, deposit.failure_class) == ("deposit", "compensation")


async def test_observes_watches_keys_outside_a_write_tools_scope(tmp_path: Path):
    """A write tool whose observes names a key outside its writes fails as a scope failure
    when the call changes that key."""
    rule = ToolRule(writes=("accounts/alice",), observes=("accounts/{account}",))
    tools = {**load_config(FIXTURES / "bank_proxy.toml").tools, "deposit": rule}
    proxy = build_proxy(_proxy_config(tmp_path, {"alice": 500, "bob": 20}, tools=tools))
    try:
        async with Client(proxy.server, mode="legacy") as client:
            stray = await client.call_tool("deposit", {"account": "bob", "amount": 1})
    finally:
        proxy.close()
    assert stray.is_error and f"changed {BOB} outside its declared writes" in describe(stray)


async def test_an_argument_that_cannot_name_a_watched_key_fails_before_upstream(tmp_path: Path):
    """A read whose argument holds a "/" cannot be watched through accounts/{account}: the
    call fails naming why, and the upstream is never asked."""
    proxy = build_proxy(_proxy_config(tmp_path, {"bob": 20}))
    try:
        async with Client(proxy.server, mode="legacy") as client:
            odd = await client.call_tool("get_account", {"account": "bob/x"})
    finally:
        proxy.close()
    assert odd.is_error
    assert "argument account = 'bob/x' cannot name the key 'accounts/{account}'" in describe(odd)
    assert "nothing was sent upstream" in describe(odd)


def test_a_config_that_cannot_be_watched_or_serves_nothing_is_a_clear_error(tmp_path: Path):
    """observes naming a field that is no argument, or a key no [[state]] rule reads, and a
    config that describes no upstream tool, are refused before anything is served."""
    base = _proxy_config(tmp_path, {"bob": 20})
    cases = [
        (ToolRule(observes=("accounts/{who}",)), r"names who, which is not an argument"),
        (ToolRule(observes=("users/{account}",)), r"'users/\{account\}', which no \[\[state\]\]"),
    ]
    for rule, message in cases:
        config = dataclasses.replace(base, tools={**base.tools, "deposit": rule})
        with pytest.raises(hx.ConfigurationError, match=message):
            build_proxy(config)
    with pytest.raises(hx.ConfigurationError, match="describes none of the upstream"):
        build_proxy(dataclasses.replace(base, tools={}))


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
