"""Calls of one episode made at once, from threads and tasks, against a reference model.

Whatever the interleaving and the kind of action (keyed and compensable, neither, read-only),
the episode must end as if the calls had run one after another in some order: each write's
tool ran once, each committed transaction's diff is exactly its own account going from one
balance to that balance plus its amount, the diffs of one account chain (each starts where the
previous ended), a read sees exactly what committed before it, and the final balances are the
sums.
"""

from __future__ import annotations

import asyncio
import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness as hx

from ..conftest import restore_before

ACCOUNTS = ("a", "b", "c")
# How each call is made: an async keyed, compensable deposit as a task; the same sync in a
# thread; a deposit with neither key nor compensation in a thread; a read-only look.
HOW = ("task", "thread", "plain", "read")
calls_strategy = st.lists(
    st.tuples(st.sampled_from(ACCOUNTS), st.integers(1, 9), st.sampled_from(HOW)),
    min_size=1,
    max_size=12,
)


def build() -> tuple[hx.DictState, Any, Any, list[tuple[str, int]], Any, Any]:
    state = hx.DictState({f"acct/{n}": 0 for n in ACCOUNTS})
    runs: list[tuple[str, int]] = []

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.ref)
    def deposit(name: str, amount: int, ref: str) -> int:
        """Deposit.

        Args:
            name: The account.
            amount: How much.
            ref: The call's reference.
        """
        balance = state[f"acct/{name}"]
        runs.append((name, amount))
        state[f"acct/{name}"] = balance + amount
        return int(balance + amount)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.ref)
    async def adeposit(name: str, amount: int, ref: str) -> int:
        """Deposit, asynchronously.

        Args:
            name: The account.
            amount: How much.
            ref: The call's reference.
        """
        balance = state[f"acct/{name}"]
        await asyncio.sleep(0)  # another task runs here: it must not see this window
        runs.append((name, amount))
        state[f"acct/{name}"] = balance + amount
        return int(balance + amount)

    @hx.action(writes=["acct/{name}"])
    def plain_deposit(name: str, amount: int, ref: str) -> int:
        """Deposit, with no idempotency key and no compensation.

        Args:
            name: The account.
            amount: How much.
            ref: The call's reference.
        """
        return int(deposit.__wrapped__(name, amount, ref))

    @hx.action
    def look(name: str, amount: int, ref: str) -> int:
        """Read a balance (read-only).

        Args:
            name: The account.
            amount: Unused.
            ref: The call's reference.
        """
        return int(state[f"acct/{name}"])

    for act in (deposit, adeposit):
        act.compensation(functools.partial(restore_before, state))
    return state, deposit, adeposit, runs, plain_deposit, look


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls=calls_strategy)
def test_threads_and_tasks_at_once_match_a_serial_order(tmp_path_factory: Any, calls: Any) -> None:
    tmp: Path = tmp_path_factory.mktemp("conc")
    state, deposit, adeposit, runs, plain_deposit, look = build()
    sync = {"thread": deposit, "plain": plain_deposit, "read": look}

    async def go() -> hx.Episode:
        async with hx.Episode(state=state, store=f"sqlite:///{tmp}/h.db") as ep:
            jobs = [
                adeposit(name, amount, f"r{i}")
                if how == "task"
                else asyncio.to_thread(sync[how], name, amount, f"r{i}")
                for i, (name, amount, how) in enumerate(calls)
            ]
            await asyncio.gather(*jobs)
        return ep

    ep = asyncio.run(go())
    assert ep.outcome == "committed"
    writes = [(n, a, how) for n, a, how in calls if how != "read"]
    assert sorted(runs) == sorted((n, a) for n, a, _ in writes)  # each write's tool ran once
    expected = defaultdict(int)
    for name, amount, _ in writes:
        expected[f"acct/{name}"] += amount
    assert state.to_dict() == {f"acct/{n}": expected[f"acct/{n}"] for n in ACCOUNTS}
    store = hx.Store(f"sqlite:///{tmp}/h.db")
    try:
        txns = [t for t in store.transactions(ep.id) if t.status == "committed"]
    finally:
        store.close()
    assert len(txns) == len(calls)
    amounts = {f"r{i}": (f"acct/{n}", a, how) for i, (n, a, how) in enumerate(calls)}
    last: dict[str, int] = defaultdict(int)
    for txn in txns:  # in commit order
        key, amount, how = amounts[txn.args["ref"]]
        if how == "read":
            assert txn.action == "look" and not txn.diff
            assert txn.result == last[key]  # what was committed before it, no more
            continue
        assert txn.diff == {key: [last[key], last[key] + amount]}
        last[key] += amount
