"""Checks and the compensation the proxy config puts on the upstream bank's ``withdraw``."""

from __future__ import annotations

import harness as hx


def _key(ctx: hx.Context) -> str:
    return f"accounts/{ctx.args.account}"


def covered(ctx: hx.Context) -> bool:
    """the account does not exist, or its balance does not cover the amount"""
    account = ctx.state.get(_key(ctx))  # None: the upstream read tool said there is none
    return account is not None and bool(account["balance"] >= ctx.args.amount)


def dropped_by_amount(ctx: hx.Context) -> bool:
    """The balance fell by exactly the amount, as read upstream after the call."""
    key = _key(ctx)
    return bool(ctx.after[key]["balance"] == ctx.before[key]["balance"] - ctx.args.amount)


def refund(ctx: hx.Context) -> None:
    """Undo a withdrawal by depositing what it took (the upstream deposit tool)."""
    key = _key(ctx)
    taken = ctx.before[key]["balance"] - ctx.state.get(key)["balance"]
    if taken:
        ctx.state.call("deposit", {"account": ctx.args.account, "amount": taken})


def one_deposit_per_account(args: object) -> str:
    """An idempotency key: one deposit per account and episode, whatever the amount."""
    return f"deposit:{getattr(args, 'account', '')}"
