"""A bank served by ``harness mcp serve bank_actions:actions``: accounts in a SQLite file.

The database path comes from ``HX_MCP_BANK_DB`` (the test sets it, and makes the file with
:mod:`bank_db`); the module defines
``state`` and ``policy``, which ``harness mcp serve`` picks up. A failed postcondition rolls
the whole episode back.
"""

from __future__ import annotations

import os
import time
from typing import Any

import harness as hx

DB = os.environ.get("HX_MCP_BANK_DB", "bank.db")


state = hx.SQLState(f"sqlite:///{DB}")
policy = hx.Policy(decisions={"silent": "rollback"})


def _add(account: str, amount: int) -> dict[str, Any]:
    db = state.connection
    db.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (amount, account))
    (balance,) = db.execute("SELECT balance FROM accounts WHERE id = ?", (account,)).fetchone()
    return {"account": account, "balance": balance}


@hx.action(writes=["accounts/{account}"])
def deposit(account: str, amount: int) -> dict[str, Any]:
    """Put money into an account."""
    time.sleep(0.05)  # long enough for calls made at once to overlap if nothing serialized them
    return _add(account, amount)


@deposit.compensation
def take_back(ctx: hx.Context) -> None:
    _add(ctx.args.account, -ctx.args.amount)


@hx.action(writes=["accounts/{account}"])
def withdraw(account: str, amount: int) -> dict[str, Any]:
    """Take money out of an account."""
    return _add(account, -amount)


@withdraw.precondition
def covered(ctx: hx.Context) -> bool:
    """the balance does not cover the amount"""
    return bool(ctx.state.get(f"accounts/{ctx.args.account}")["balance"] >= ctx.args.amount)


@withdraw.compensation
def put_back(ctx: hx.Context) -> None:
    _add(ctx.args.account, ctx.args.amount)


@hx.action(writes=["accounts/{account}"])
def charge_fee(account: str, amount: int) -> dict[str, Any]:
    """Charge a fee (its tool has a bug: it charges twice)."""
    return _add(account, -2 * amount)


@charge_fee.postcondition
def charged_once(ctx: hx.Context) -> bool:
    key = f"accounts/{ctx.args.account}"
    return bool(ctx.after[key]["balance"] == ctx.before[key]["balance"] - ctx.args.amount)


@charge_fee.compensation
def refund_fee(ctx: hx.Context) -> None:
    key = f"accounts/{ctx.args.account}"
    _add(ctx.args.account, ctx.before[key]["balance"] - state.get(key)["balance"])


@hx.action(writes=["accounts/{account}"], approval=True)
def close_account(account: str) -> dict[str, Any]:
    """Empty an account (a person approves each call)."""
    (balance,) = state.connection.execute(
        "SELECT balance FROM accounts WHERE id = ?", (account,)
    ).fetchone()
    return _add(account, -balance)


@hx.action
def balance(account: str) -> int:
    """An account's balance."""
    return int(state.get(f"accounts/{account}")["balance"])


actions = [deposit, withdraw, charge_fee, close_account, balance]
