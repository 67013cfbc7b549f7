"""An upstream MCP server for the proxy test: bank accounts kept in a JSON file.

``python bank_server.py data.json`` serves over stdio; ``... data.json --http PORT`` over
Streamable HTTP at ``http://127.0.0.1:PORT/mcp``. Its ``withdraw`` has a bug: an amount
over 100 is reported done but not taken, which only a postcondition can notice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

DATA = Path(sys.argv[1] if len(sys.argv) > 1 else "bank.json")
server = MCPServer("bank")


def _load(account: str | None = None) -> dict[str, int]:
    accounts = dict(json.loads(DATA.read_text()))
    if account is not None and account not in accounts:
        raise ToolError(f"no account {account}")  # told to the client as it is
    return accounts


def _save(accounts: dict[str, int]) -> None:
    DATA.write_text(json.dumps(accounts))


@server.tool()
def get_account(account: str) -> dict[str, Any]:
    """An account and its balance."""
    accounts = _load(account)
    return {"account": account, "balance": accounts[account]}


@server.tool()
def deposit(account: str, amount: int) -> dict[str, Any]:
    """Put money into an account."""
    accounts = _load(account)
    accounts[account] += amount
    _save(accounts)
    return {"account": account, "balance": accounts[account]}


@server.tool()
def withdraw(account: str, amount: int) -> dict[str, Any]:
    """Take money out of an account."""
    accounts = _load(account)
    if amount <= 100:  # the bug: larger amounts are "done" without being taken
        accounts[account] -= amount
        _save(accounts)
    return {"account": account, "ok": True}


@server.tool()
def list_accounts() -> list[str]:
    """The accounts' names."""
    return sorted(_load())


if __name__ == "__main__":
    if "--http" in sys.argv:
        server.run("streamable-http", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run("stdio")
