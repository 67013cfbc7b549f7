"""What ``harness mcp serve`` and ``build_server`` say about input they cannot serve: each
refusal names the problem and the fix, before any episode starts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp.client import Client

import harness as hx
from harness.integrations.mcp import META_EPISODE, build_server, load_served

state = hx.DictState({"n/a": 0})


@hx.action(writes=["n/{key}"])
def bump(key: str) -> int:
    """Add one."""
    state[f"n/{key}"] = state.get(f"n/{key}", 0) + 1  # type: ignore[operator]
    return int(state[f"n/{key}"])


@hx.action(writes=["n/{key}"], name="bump")
def bump_again(key: str) -> int:
    """Add one, under the same name."""
    return 0


def plain(key: str) -> int:
    return 0


not_actions = [plain]
twice = [bump, bump_again]
nothing: list[Any] = []
by_name = {"increment": bump}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_colon_here", "is not module:attribute"),
        (":actions", "is not module:attribute"),
        ("nowhere/missing.py:actions", "no file"),
        (f"{__name__}:absent", "has no attribute 'absent'"),
        (f"{__name__}:not_actions", "which is not an @hx.action"),
        (f"{__name__}:twice", "two tools named 'bump'"),
        (f"{__name__}:nothing", "holds no actions"),
    ],
)
def test_a_target_that_cannot_be_served_is_refused_naming_the_fix(spec: str, says: str) -> None:
    with pytest.raises(hx.ConfigurationError, match=says):
        load_served(spec)


def test_a_mapping_names_the_tools_and_a_module_state_is_found() -> None:
    served = load_served(f"{__name__}:by_name")
    assert list(served.actions) == ["increment"] and served.state is state


def test_a_state_named_apart_is_imported() -> None:
    served = load_served(f"{__name__}:by_name", state=f"{__name__}:state")
    assert served.state is state


def test_unknown_tools_and_bad_episode_names_are_errors_the_client_sees(tmp_path: Path) -> None:
    """Neither starts a call: the unknown tool is named with the tools the server has, and a
    `_meta` episode that is not a non-empty string is refused."""

    async def go() -> tuple[Any, Any, Any]:
        server = build_server([bump], state=state, store=f"sqlite:///{tmp_path}/h.db")
        async with Client(server) as client:
            unknown = await client.call_tool("nope", {})
            bad_meta = await client.call_tool("bump", {"key": "a"}, meta={META_EPISODE: " "})
            ok = await client.call_tool("bump", {"key": "a"})
        return unknown, bad_meta, ok

    unknown, bad_meta, ok = asyncio.run(go())
    assert unknown.is_error and "unknown tool 'nope'" in unknown.content[0].text
    assert "bump" in unknown.content[0].text
    assert bad_meta.is_error and "non-empty string" in bad_meta.content[0].text
    assert not ok.is_error and state["n/a"] == 1  # only the good call ran
