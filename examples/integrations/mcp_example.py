"""Actions served as MCP tools, called by the MCP SDK's own client (offline, in-process).

Run it with ``python examples/integrations/mcp_example.py``. The client lists the tools,
deposits into an account that does not exist (an error result with the refusal), then into
one that does (committed); the session's episode ends with the client, and the store records
both calls. ``harness mcp serve examples/integrations/mcp_example.py:actions`` serves the
same actions over stdio to any MCP client.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from mcp.client import Client

import harness as hx
from harness.integrations.mcp import META_EPISODE, build_server, describe

state = hx.DictState({"accounts/a": {"balance": 0}})


@hx.action(writes=["accounts/{account}"])
def deposit(account: str, amount: int) -> dict[str, Any]:
    """Put money into an account."""
    balance = state[f"accounts/{account}"]["balance"] + amount
    state[f"accounts/{account}"] = {"balance": balance}
    return {"account": account, "balance": balance}


@deposit.precondition
def account_exists(ctx: hx.Context) -> bool:
    """the account does not exist"""
    return ctx.state.get(f"accounts/{ctx.args.account}") is not None


actions = [deposit]


async def main(store: str) -> None:
    """Call the tools through an MCP client and print what the store recorded."""
    server = build_server(actions, state=state, store=store)
    async with Client(server, mode="legacy") as client:  # one MCP session: one episode
        print([tool.name for tool in (await client.list_tools()).tools])  # ['deposit']
        refused = await client.call_tool("deposit", {"account": "z", "amount": 10})
        print(refused.is_error, describe(refused))  # True action 'deposit' not executed: ...
        done = await client.call_tool("deposit", {"account": "a", "amount": 10})
        print(done.structured_content)  # {'account': 'a', 'balance': 10}
    records = hx.Store(store)
    episode = str(done.meta[META_EPISODE]) if done.meta else ""
    print(records.episode(episode).status)  # committed
    for txn in records.transactions(episode):
        print(txn.action, txn.status)  # deposit precondition / deposit committed


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"sqlite:///{Path(folder) / 'harness.db'}"))
