"""The store on Postgres: the same records, chain, projections and resume as on SQLite.

These run when ``HX_TEST_POSTGRES_URL`` names a server the tests may create databases on (for
example ``postgresql+psycopg://postgres@127.0.0.1:5433/postgres``); ``.ci/run`` starts a
throwaway server when the Postgres binaries are installed. Each test gets its own database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import harness as hx
from harness.testing import FakeClock

from ..conftest import Shop
from ..crashes import die
from ..episode.test_episode import escalating_run
from ..test_transaction import cancel_action

SERVER = os.environ.get("HX_TEST_POSTGRES_URL", "")

pytestmark = pytest.mark.skipif(
    not SERVER,
    reason="set HX_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db to run on Postgres",
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database on the server, dropped after the test."""
    name = f"hx_{uuid.uuid4().hex[:12]}"
    admin = create_engine(SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(SERVER).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _verified(store: hx.Store) -> None:
    report = store.verify()
    assert report.ok and not report.findings, report.findings


def _sql(url: str, statement: str, **params: Any) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def test_commits_rows_and_chain(shop: Shop, pg_url: str):
    """Committed calls read the same while running (built from the log) and after the end
    (written), a refusal is recorded, and the audit verifies everything."""
    cancel = cancel_action(shop)
    store = hx.Store(pg_url)
    try:
        with hx.Episode(state=shop.state, store=store, episode_id="e1"):
            cancel("o1")
            cancel("o2")
            assert _sql(pg_url, "SELECT COUNT(*) FROM hx_transaction") == [(0,)]
            running = [r.model_dump() for r in store.transactions("e1")]
            with pytest.raises(hx.PreconditionFailed):
                cancel("o3")
        assert _sql(pg_url, "SELECT COUNT(*) FROM hx_transaction") == [(3,)]
        rows = [r.model_dump() for r in store.transactions("e1")]
        assert rows[:2] == running and [r["status"] for r in rows] == [
            "committed",
            "committed",
            "precondition",
        ]
        assert [c.step for c in store.checkpoints("e1")] == [1, 2]
        _verified(store)
    finally:
        store.close()


def test_episodes_opened_at_the_same_moment_get_their_own_numbers(pg_url: str):
    """Threads opening episodes on one store at the same moment each get a number of their
    own (taken under a lock), and every chain verifies."""
    import threading

    store = hx.Store(pg_url)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(n: int) -> None:
        try:
            start.wait()
            for i in range(10):
                with hx.Episode(state=hx.DictState(), store=store, episode_id=f"w{n}-{i}"):
                    pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        nums = [r[0] for r in _sql(pg_url, "SELECT num FROM hx_episode")]
        assert len(nums) == len(set(nums)) == 40
        assert store.verify_chain().ok
    finally:
        store.close()


def test_two_episodes_at_once_get_their_own_ranges(shop: Shop, pg_url: str):
    """Two episodes open together on one store interleave their records; each chain holds
    only its own, in order."""
    cancel = cancel_action(shop)
    store = hx.Store(pg_url)
    try:
        first = hx.Episode(state=shop.state, store=store, episode_id="a")
        second = hx.Episode(state=shop.state, store=store, episode_id="b")
        with first, second:
            first.call(cancel, ("o1",), {})
            second.call(cancel, ("o2",), {})
        assert [r.action for r in store.transactions("a")] == ["cancel_order"]
        assert [r.txn_id for r in store.log("b") if r.txn_id] == ["b:1", "b:1"]
        assert store.verify_chain().ok
        _verified(store)
    finally:
        store.close()


def test_crash_then_resume_writes_the_rows(shop: Shop, pg_url: str):
    """A crash after hot-path commits leaves their records only; resume writes their rows and
    does not run them again."""
    cancel = cancel_action(shop)
    ep = hx.Episode(state=shop.state, store=pg_url, episode_id="e1")
    with ep:
        cancel("o1")
        die(ep)  # the process dies here: nothing else is written
    assert _sql(pg_url, "SELECT COUNT(*) FROM hx_transaction") == [(0,)]
    with hx.Episode(state=shop.state, store=pg_url, episode_id="e1", resume=True) as again:
        assert cancel("o1") == {"order_id": "o1", "status": "cancelled"}
        cancel("o2")
    assert shop.applied == [("o1", "cancelled"), ("o2", "cancelled")]
    assert again.steps == 2
    assert _sql(pg_url, "SELECT COUNT(*) FROM hx_transaction") == [(2,)]
    store = hx.Store(pg_url)
    _verified(store)
    store.close()


def test_escalation_resolved_then_resumed(shop: Shop, pg_url: str):
    """An escalation stored on Postgres is resolved by a person and the episode resumes
    without re-running what came before."""
    clock = FakeClock()
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, pg_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=pg_url, clock=clock, episode_id="e1") as ep:
            agent(ep)
    store = hx.Store(pg_url)
    try:
        store.resolve(info.value.escalation_id, "approve", by="ops", reason="checked")
        with pytest.raises(hx.StoreError, match="already approved"):
            store.resolve(info.value.escalation_id, "reject", by="someone else")
        with hx.Episode(
            state=shop.state, store=store, clock=clock, episode_id="e1", resume=True
        ) as again:
            agent(again)
        assert again.outcome == "committed" and counts == {"o1": 1, "o2": 2}
        _verified(store)
    finally:
        store.close()


def test_edited_record_is_named(shop: Shop, pg_url: str):
    """An edit of a log record on Postgres is found at that record."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=pg_url, episode_id="e1"):
        cancel("o1")
    _sql(pg_url, "UPDATE hx_log SET payload = payload || ' ' WHERE episode_id = 'e1' AND seq = 2")
    store = hx.Store(pg_url)
    report = store.verify_chain()
    store.close()
    assert not report.ok and report.seq == 2 and "altered" in report.reason


def test_the_cli_audits_and_verifies_a_postgres_store_by_url(shop: Shop, pg_url: str):
    """`harness verify URL` and `harness audit URL` read a Postgres store as they read a file,
    and an edited row is named; with a key, a deleted episode is found too."""
    import json

    from click.testing import CliRunner

    from harness.cli import main

    key = hx.SigningKey.generate()
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=pg_url, episode_id="e1", signing_key=key):
        cancel("o1")
    with hx.Episode(state=shop.state, store=pg_url, episode_id="e2", signing_key=key):
        cancel("o2")
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", pg_url])
    assert ok.exit_code == 0 and "verified: 2 episode(s)" in ok.output, ok.output
    audit = runner.invoke(main, ["audit", pg_url, "--json"])
    assert audit.exit_code == 0, audit.output
    assert [e["episode_id"] for e in json.loads(audit.stdout)["episodes"]] == ["e1", "e2"]
    ((original,),) = _sql(pg_url, "SELECT idem_key FROM hx_transaction WHERE id = 'e1:1'")
    _sql(pg_url, "UPDATE hx_transaction SET idem_key = 'forged' WHERE id = 'e1:1'")
    bad = runner.invoke(main, ["verify", pg_url, "--json"])
    assert bad.exit_code == 1
    (finding,) = json.loads(bad.stdout)["findings"]
    assert (finding["table"], finding["record"]) == ("hx_transaction", "e1:1")
    _sql(pg_url, "UPDATE hx_transaction SET idem_key = :k WHERE id = 'e1:1'", k=original)
    for table, column in (
        ("hx_log", "episode_id"),
        ("hx_transaction", "episode_id"),
        ("hx_checkpoint", "episode_id"),
        ("hx_episode", "id"),
    ):
        _sql(pg_url, f"DELETE FROM {table} WHERE {column} = 'e2'")
    store = hx.Store(pg_url, readonly=True)
    try:
        assert store.verify().ok
        (gone,) = store.verify(public_key=key.public).findings
        assert gone.episode_id == "e2" and "deleted" in gone.reason
    finally:
        store.close()
