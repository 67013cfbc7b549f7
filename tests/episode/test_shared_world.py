"""The world is shared: another program writes the same database while calls run.

Each test meets it as a user's program would: an ``hx.Episode`` over ``hx.SQLState`` (SQLite,
and Postgres when ``HX_TEST_POSTGRES_URL`` names a server), whose tool writes through the
adapter's connection, while a *separate process* with a connection of its own writes the same
database during the call or between calls. The harness must never blame the call for the other
process's write, never restore a value over it, and say in its outcome what is true.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import harness as hx

from ..forking import die_with_a_window_open

SERVER = os.environ.get("HX_TEST_POSTGRES_URL", "")
ACCOUNTS = ("a", "b", "carol")


def _libpq(url: str) -> str:
    return "postgresql://" + url.partition("://")[2]


@dataclass
class World:
    """A bank database, the adapter the episode uses, and another process writing it."""

    url: str
    kind: str
    state: hx.SQLState

    def other_process(self, *statements: str) -> None:
        """Run ``statements`` in a new process on a connection of its own, each committed."""
        if self.kind == "sqlite":
            script = (
                "import sqlite3, sys\n"
                "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
                "for s in sys.argv[2:]:\n"
                "    c.execute(s)\n"
            )
            target = self.state.path
        else:
            script = (
                "import psycopg, sys\n"
                "c = psycopg.connect(sys.argv[1], autocommit=True)\n"
                "for s in sys.argv[2:]:\n"
                "    c.execute(s)\n"
            )
            target = _libpq(self.url)
        subprocess.run([sys.executable, "-c", script, target, *statements], check=True)

    def balance(self, name: str) -> int:
        row = self.state.get(f"acct/{name}")
        assert row is not None
        return int(row["bal"])

    def add(self, name: str, amount: int) -> None:
        """The tool's own write, through the adapter's connection."""
        self.state.connection.execute(
            f"UPDATE acct SET bal = bal + {int(amount)} WHERE id = '{name}'"
        )

    def set(self, name: str, value: int) -> None:
        self.state.connection.execute(f"UPDATE acct SET bal = {int(value)} WHERE id = '{name}'")


def _sqlite_world(tmp_path: Path) -> World:
    path = tmp_path / "bank.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE acct (id TEXT PRIMARY KEY, bal INTEGER)")
        conn.executemany("INSERT INTO acct VALUES (?, 0)", [(n,) for n in ACCOUNTS])
    conn.close()
    url = f"sqlite:///{path}"
    return World(url, "sqlite", hx.SQLState(url))


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """The bank on SQLite, and on Postgres when a server is given."""
    yield from _world(request.param, tmp_path)


def _world(kind: str, tmp_path: Path) -> Iterator[World]:
    if kind == "sqlite":
        w = _sqlite_world(tmp_path)
        yield w
        w.state.close()
        return
    if not SERVER:
        pytest.skip("set HX_TEST_POSTGRES_URL to run on Postgres")
    psycopg = pytest.importorskip("psycopg")
    name = f"hx_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(SERVER), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = SERVER.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id text PRIMARY KEY, bal integer)")
        for n in ACCOUNTS:
            conn.execute("INSERT INTO acct VALUES (%s, 0)", (n,))
    w = World(url, "postgres", hx.SQLState(url))
    try:
        yield w
    finally:
        w.state.close()
        with psycopg.connect(_libpq(SERVER), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def deposit_action(world: World, *, during: tuple[str, ...] = (), safe_undo: bool = False) -> Any:
    """``deposit(account, amount)``: adds ``amount`` through the adapter's connection; on its
    first attempt another process runs ``during`` right after the tool's own write. Its undo
    restores ``ctx.before`` (the documented one), or with ``safe_undo`` subtracts the amount
    again, judged by a compensation check (an undo safe under other writers)."""
    attempts: list[int] = []

    @hx.action(writes=["acct/{account}"])
    def deposit(account: str, amount: int) -> int:
        """Put money into an account."""
        attempts.append(amount)
        world.add(account, amount)
        if during and len(attempts) == 1:
            world.other_process(*during)
        return amount

    @deposit.postcondition
    def credited(ctx: hx.Context) -> bool:
        key = f"acct/{ctx.args.account}"
        return bool(ctx.after[key]["bal"] == ctx.before[key]["bal"] + ctx.args.amount)

    if safe_undo:

        @deposit.compensation
        def take_back(ctx: hx.Context) -> None:
            world.add(ctx.args.account, -ctx.args.amount)

        @deposit.compensation_check
        def taken_back(ctx: hx.Context) -> bool:
            key = f"acct/{ctx.args.account}"
            return bool(world.balance(ctx.args.account) == ctx.after[key]["bal"] - ctx.args.amount)

    else:

        @deposit.compensation
        def restore(ctx: hx.Context) -> None:
            key = f"acct/{ctx.args.account}"
            world.set(ctx.args.account, ctx.before[key]["bal"])

    deposit.attempts = attempts  # type: ignore[attr-defined]
    return deposit


def test_another_writer_on_another_row_is_never_the_calls_change(world: World, tmp_path: Path):
    """While a deposit to ``a`` runs, another process updates ``carol`` of the same database:
    the call commits with its own change only, carol keeps the other's write."""
    deposit = deposit_action(world, during=("UPDATE acct SET bal = bal + 7 WHERE id = 'carol'",))
    with hx.Episode(state=world.state, store=f"sqlite:///{tmp_path}/h.db") as ep:
        assert deposit("a", 1) == 1
    assert ep.outcome == "committed"
    assert (world.balance("a"), world.balance("carol")) == (1, 7)
    (txn,) = hx.Store(f"sqlite:///{tmp_path}/h.db").transactions(ep.id)
    assert txn.status == "committed" and set(txn.diff) == {"acct/a"}


def test_another_writer_on_the_same_row_is_a_conflict_and_nothing_is_erased(
    world: World, tmp_path: Path
):
    """Another process adds 100 to ``a`` twenty times while a deposit of 1 to ``a`` runs, and
    the postcondition ``a == before + 1`` is false: the harness does not restore ``before`` over
    the other's deposits. The call escalates as a ``conflict`` with both changes as evidence,
    and ``a`` holds every deposit (2,001)."""
    during = ("UPDATE acct SET bal = bal + 100 WHERE id = 'a'",) * 20
    deposit = deposit_action(world, during=during)
    store = f"sqlite:///{tmp_path}/h.db"
    with hx.Episode(state=world.state, store=store) as ep:
        with pytest.raises(hx.Escalated) as raised:
            deposit("a", 1)
    assert ep.outcome == "escalated"
    assert raised.value.failure_class == "conflict"
    assert "another writer changed acct/a during the call" in raised.value.reason
    assert world.balance("a") == 2001
    assert deposit.attempts == [1]  # not retried over the other's change
    (esc,) = hx.Store(store).escalations()
    assert esc.failure_class == "conflict"
    assert esc.evidence["diff"]["acct/a"][0]["bal"] == 0
    assert esc.evidence["others"]["acct/a"] == [{"id": "a", "bal": 1}, {"id": "a", "bal": 2001}]
    assert hx.Store(store).verify().ok


def test_a_conflict_with_an_undo_safe_under_other_writers_is_undone_and_retried(
    world: World, tmp_path: Path
):
    """The same race, with an undo that subtracts the amount (judged by its compensation check):
    the attempt is undone without touching the other's deposits, retried, and commits; ``a``
    holds every deposit and the call's one, applied once."""
    during = ("UPDATE acct SET bal = bal + 100 WHERE id = 'a'",) * 20
    deposit = deposit_action(world, during=during, safe_undo=True)
    policy = hx.Policy(retry=hx.Retry(attempts=3, backoff=0))
    with hx.Episode(state=world.state, store=f"sqlite:///{tmp_path}/h.db", policy=policy) as ep:
        assert deposit("a", 1) == 1
    assert ep.outcome == "committed"
    assert deposit.attempts == [1, 1]
    assert world.balance("a") == 2001


def test_rollback_never_restores_over_a_change_made_since(world: World, tmp_path: Path):
    """A committed deposit whose row another process changed since is not restored by a
    rollback: the rollback escalates as a ``conflict`` naming the row, and the other's write
    stays."""
    deposit = deposit_action(world)
    store = f"sqlite:///{tmp_path}/h.db"
    with hx.Episode(state=world.state, store=store) as ep:
        deposit("a", 5)
        world.other_process("UPDATE acct SET bal = bal + 40 WHERE id = 'a'")
        with pytest.raises(hx.Escalated) as raised:
            ep.rollback()
    assert raised.value.failure_class == "conflict"
    assert "since the call changed them" in raised.value.reason
    assert ep.outcome == "escalated"
    assert world.balance("a") == 45
    (esc,) = hx.Store(store).escalations()
    assert esc.evidence["others"]["acct/a"] == [{"id": "a", "bal": 5}, {"id": "a", "bal": 45}]


def test_rollback_of_a_row_nobody_else_changed_still_restores_it(world: World, tmp_path: Path):
    """With another process writing only other rows, a rollback restores the call's row and
    leaves theirs."""
    deposit = deposit_action(world)
    with hx.Episode(state=world.state, store=f"sqlite:///{tmp_path}/h.db") as ep:
        deposit("a", 5)
        world.other_process("UPDATE acct SET bal = bal + 40 WHERE id = 'carol'")
        ep.rollback()
    assert ep.outcome == "rolled_back"
    assert (world.balance("a"), world.balance("carol")) == (0, 40)


def test_a_compensation_raced_by_another_writer_escalates(world: World, tmp_path: Path):
    """Another process writing the row while the compensation restores it is a ``conflict``
    of the rollback: escalated, not reported rolled back."""
    deposit = deposit_action(world)
    restore = deposit.compensate

    def racing_restore(ctx: hx.Context) -> None:
        restore(ctx)
        world.other_process("UPDATE acct SET bal = bal + 3 WHERE id = 'a'")

    deposit.compensate = racing_restore
    with hx.Episode(state=world.state, store=f"sqlite:///{tmp_path}/h.db") as ep:
        deposit("a", 5)
        with pytest.raises(hx.Escalated, match="while the compensation ran") as raised:
            ep.rollback()
    assert "may have written over their change" in raised.value.reason
    assert ep.outcome == "escalated"
    assert world.balance("a") == 3


def test_each_retry_sees_only_its_own_attempt(tmp_path: Path):
    """A glob-scoped ledger action undone by reversing entries, whose postcondition is false
    on every attempt: each attempt's undo reverses that attempt's posting only, so 3 attempts
    leave 6 entries netting zero (not earlier postings and reversals reversed again)."""
    world = _sqlite_world(tmp_path)
    conn = world.state.connection
    conn.execute("CREATE TABLE ledger (id INTEGER PRIMARY KEY, account TEXT, amount INTEGER)")
    world.state.refresh()
    seen: list[list[str]] = []

    @hx.action(writes=["ledger/*"])
    def post(account: str, amount: int) -> None:
        """Post an entry."""
        conn.execute("INSERT INTO ledger(account, amount) VALUES (?, ?)", (account, amount))

    @post.postcondition
    def never(ctx: hx.Context) -> bool:
        seen.append(sorted(ctx.after))
        return False

    @post.compensation
    def reverse(ctx: hx.Context) -> None:
        for key in sorted(ctx.after):
            row = ctx.after[key]
            conn.execute(
                "INSERT INTO ledger(account, amount) VALUES (?, ?)",
                (row["account"], -row["amount"]),
            )

    @post.compensation_check
    def nets_zero(ctx: hx.Context) -> bool:
        return bool(conn.execute("SELECT COALESCE(SUM(amount), 0) FROM ledger").fetchone()[0] == 0)

    policy = hx.Policy(retry=hx.Retry(attempts=3, backoff=0))
    with hx.Episode(state=world.state, store=f"sqlite:///{tmp_path}/h.db", policy=policy):
        with pytest.raises(hx.ActionFailed):
            post("a", 10)
    rows = conn.execute("SELECT amount FROM ledger ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [10, -10, 10, -10, 10, -10]
    assert seen == [["ledger/1"], ["ledger/3"], ["ledger/5"]]
    world.state.close()


def test_a_killed_process_leaves_capture_that_stops_recording_and_can_be_removed(tmp_path: Path):
    """A process killed with a change window open leaves triggers behind: the application's own
    writes are recorded at most once per row while the dead window's lease lasts, nothing once
    it has run out, and ``SQLState.uninstall`` removes everything by hand."""
    world = _sqlite_world(tmp_path)
    path = world.state.path
    world.state.close()
    die_with_a_window_open(path)

    def app_writes(n: int) -> int:
        with sqlite3.connect(path) as conn:
            for i in range(n):
                conn.execute("UPDATE acct SET bal = ? WHERE id = ?", (i, ACCOUNTS[i % 3]))
            return int(conn.execute("SELECT COUNT(*) FROM _hx_changes").fetchone()[0])

    assert app_writes(300) == 3  # once per row, not per write
    with sqlite3.connect(path) as conn:  # the lease runs out
        conn.execute("UPDATE _hx_open SET until = julianday('now') - 1")
        conn.execute("DELETE FROM _hx_changes")
    assert app_writes(300) == 0
    removed = hx.SQLState.uninstall(path)
    assert "_hx_changes" in removed and "_hx_u_acct" in removed
    with sqlite3.connect(path) as conn:
        left = conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '%hx%'").fetchall()
    assert left == []
    with pytest.raises(hx.ConfigurationError, match="no file"):
        hx.SQLState.uninstall(tmp_path / "missing.db")


def test_a_tool_writing_through_its_own_connection_is_attributed_when_given(tmp_path: Path):
    """A tool that writes through a connection of its own has its writes taken for the call's
    once the connection is given to ``state.attribute``; without it they are another writer's."""
    world = _sqlite_world(tmp_path)
    own = sqlite3.connect(world.state.path, isolation_level=None)
    world.state.attribute(own)
    mark = world.state.mark()
    own.execute("UPDATE acct SET bal = 1 WHERE id = 'a'")
    with sqlite3.connect(world.state.path) as stranger:
        stranger.execute("UPDATE acct SET bal = 2 WHERE id = 'b'")
    assert list(world.state.changes(mark)) == ["acct/a"]
    assert list(world.state.others(mark)) == ["acct/b"]
    world.state.release(mark)
    with pytest.raises(hx.ConfigurationError, match="sqlite3.Connection"):
        world.state.attribute("not a connection")  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="has an adapter open"):
        hx.SQLState.uninstall(world.state.path)  # its tools' writes would fail
    world.state.close()
    own.execute("UPDATE acct SET bal = 3 WHERE id = 'a'")  # still writable once it is closed
    own.close()
    assert hx.SQLState.uninstall(world.state.path) == []


def test_a_transaction_in_flight_when_the_call_starts_is_a_conflict(tmp_path: Path):
    """On Postgres, another worker's transaction, open before the call and committing while
    the tool waits for the row: the row the call's write found is not the one its window opened
    on, so the call is a ``conflict`` and the other's deposit is not restored away. (SQLite
    lets one writer in at a time, so its transaction cannot span the call's window.)"""
    if not SERVER:
        pytest.skip("set HX_TEST_POSTGRES_URL to run on Postgres")
    world_iter = _world("postgres", tmp_path)
    w = next(world_iter)
    import psycopg

    theirs = psycopg.connect(_libpq(w.url))
    theirs.execute("UPDATE acct SET bal = bal + 100 WHERE id = 'a'")
    deposit = deposit_action(w)
    tool = deposit.fn

    def late(account: str, amount: int) -> int:
        threading.Timer(0.3, theirs.commit).start()  # they commit while the tool waits
        return int(tool(account, amount))

    deposit.fn = late
    try:
        with hx.Episode(state=w.state, store=f"sqlite:///{tmp_path}/h.db") as ep:
            with pytest.raises(hx.Escalated) as raised:
                deposit("a", 1)
        assert raised.value.failure_class == "conflict"
        assert ep.outcome == "escalated"
        assert w.balance("a") == 101
    finally:
        theirs.close()
        with contextlib.suppress(StopIteration):
            next(world_iter)
