"""Many worker processes writing one Postgres run: each runs episodes on a Postgres SQLState
(one shared state database) against one Postgres store, at the same time.

Every chain verifies afterwards, every episode's transactions are recorded once with the
status they should have, and the rows are what the commits and compensations left: nothing
was lost or done twice, and no worker's change window saw another worker's writes (that would
have been a scope violation and an escalation).

These run when ``HX_TEST_POSTGRES_URL`` names a server the tests may create databases on.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

import harness as hx  # noqa: E402

SERVER = os.environ.get("HX_TEST_POSTGRES_URL", "")

pytestmark = pytest.mark.skipif(
    not SERVER,
    reason="set HX_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db to run on Postgres",
)

WORKERS = 4
EPISODES = 6


def _libpq(url: str) -> str:
    return "postgresql://" + url.partition("://")[2]


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """Two fresh databases, (state, store), dropped after the test. The state database holds
    one row per order each worker's episodes cancel."""
    names = [f"hx_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    base = _libpq(SERVER)
    with psycopg.connect(base, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    state_url, store_url = (SERVER.rsplit("/", 1)[0] + "/" + name for name in names)
    with psycopg.connect(_libpq(state_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, status text, items jsonb)")
        conn.execute(
            "INSERT INTO orders SELECT id, 'pending', '[\"a\"]' FROM unnest(%s::text[]) id",
            ([order(w, e, s) for w in range(WORKERS) for e in range(EPISODES) for s in "ab"],),
        )
    try:
        yield state_url, store_url
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            for name in names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def order(worker: int, episode: int, which: str) -> str:
    return f"w{worker}-{episode}{which}"


def cancel_action(state: hx.SQLState) -> Any:
    """A cancel with a precondition, a postcondition and a compensation, on ``state``."""

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id)
    def cancel(order_id: str) -> None:
        """Cancel an order."""
        state.connection.execute("UPDATE orders SET status='cancelled' WHERE id=%s", (order_id,))

    @cancel.precondition
    def pending(ctx: hx.Context) -> bool:
        return bool(ctx.state.get(f"orders/{ctx.args.order_id}")["status"] == "pending")

    @cancel.postcondition
    def done(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"orders/{ctx.args.order_id}"]["status"] == "cancelled")

    @cancel.compensation
    def undo(ctx: hx.Context) -> None:
        row = ctx.before[f"orders/{ctx.args.order_id}"]
        state.connection.execute(
            "UPDATE orders SET status=%s WHERE id=%s", (row["status"], row["id"])
        )

    return cancel


def worker(state_url: str, store_url: str, n: int, start: Any, out: Any) -> None:
    """One process: its own adapter and store, EPISODES episodes; odd ones roll back."""
    try:
        state = hx.SQLState(state_url)
        store = hx.Store(store_url)
        cancel = cancel_action(state)
        start.wait()
        for e in range(EPISODES):
            with hx.Episode(state=state, store=store, episode_id=f"w{n}-e{e}") as ep:
                cancel(order(n, e, "a"))
                cancel(order(n, e, "b"))
                if e % 2:
                    ep.rollback()
        store.close()
        state.close()
        out.put((n, None))
    except BaseException as exc:  # reported to the test
        start.abort()
        out.put((n, repr(exc)))


def test_worker_processes_write_one_postgres_run_and_every_chain_verifies(
    databases: tuple[str, str],
):
    """Four processes run episodes at once on one Postgres state and one Postgres store:
    each episode's two cancels are recorded committed (or compensated when it rolled back),
    the rows agree, no escalation was raised, and the store's audit verifies every chain."""
    state_url, store_url = databases
    # The store's tables are created once before the workers start: stores opening a fresh
    # Postgres database at the same moment race to create them (see the test below).
    hx.Store(store_url).close()
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(state_url, store_url, n, start, out))
        for n in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    assert results == dict.fromkeys(range(WORKERS)), results

    store = hx.Store(store_url)
    try:
        episodes = {e.id for e in store.episodes()}
        assert episodes == {f"w{n}-e{e}" for n in range(WORKERS) for e in range(EPISODES)}
        for n in range(WORKERS):
            for e in range(EPISODES):
                txns = store.transactions(f"w{n}-e{e}")
                want = "compensated" if e % 2 else "committed"
                assert [t.status for t in txns] == [want, want], (n, e, txns)
        assert store.escalations() == []
        report = store.verify()
        assert report.ok and not report.findings, report.findings
    finally:
        store.close()

    with psycopg.connect(_libpq(state_url), autocommit=True) as conn:
        rows = dict(conn.execute("SELECT id, status FROM orders").fetchall())
        leftovers = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_hx\\_%'"
        ).fetchone()
    assert rows == {
        order(n, e, s): ("pending" if e % 2 else "cancelled")
        for n in range(WORKERS)
        for e in range(EPISODES)
        for s in "ab"
    }
    assert leftovers == (0,)  # the last adapter to close removed the capture tables


def _open_store(url: str, start: Any, out: Any) -> None:
    try:
        start.wait()
        hx.Store(url).close()
        out.put(None)
    except BaseException as exc:  # reported to the test
        out.put(repr(exc))


def test_workers_opening_a_fresh_postgres_store_at_once(databases: tuple[str, str]):
    """Four processes opening one fresh Postgres store at the same moment all open it."""
    _, store_url = databases
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_open_store, args=(store_url, start, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    errors = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert errors == [None] * WORKERS, errors
