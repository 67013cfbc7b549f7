"""The store: opening, schema versions, and a hash chain that exposes every edit."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

import harness as hx

from ..conftest import Shop
from ..test_transaction import cancel_action


def run_three(shop: Shop, store_url: str) -> str:
    """Record an episode with three committed actions; return its id."""
    cancel = cancel_action(shop)
    reopen = cancel_action(shop, name="again")
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
        cancel("o1")
        cancel("o2")
        reopen("o2")  # deduplicated? no: another action name, but o2 is no longer pending
    return "e1"


def db_path(store_url: str) -> str:
    """The SQLite file behind a sqlite:/// URL."""
    return store_url.removeprefix("sqlite:///")


def edit(store_url: str, sql: str) -> None:
    """Change the database behind the harness's back, as an attacker or a bug would."""
    with sqlite3.connect(db_path(store_url)) as conn:
        conn.execute(sql)


@pytest.fixture
def recorded(shop: Shop, store_url: str) -> str:
    """A store holding one episode, verified clean."""
    with contextlib.suppress(hx.PreconditionFailed):
        run_three(shop, store_url)
    assert hx.Store(store_url).verify_chain().ok
    return store_url


def test_an_episode_read_plainly_is_the_row_the_session_reads(recorded: str):
    """``Store.episode`` (a statement on a pooled connection) gives the row a session gives,
    field for field, and None for an unknown id; inside ``snapshot`` it reads the snapshot's
    state, not a write committed after it began."""
    store = hx.Store(recorded)
    plain = store.episode("e1")
    assert plain is not None
    with store.snapshot():  # (the session's reads)
        expected = store.episode("e1")
        assert expected is not None and plain.model_dump() == expected.model_dump()
    assert store.episode("nobody") is None
    with store.snapshot():
        before = store.episode("e1")
        assert before is not None
        steps = before.steps
        edit(recorded, "UPDATE hx_episode SET steps = steps + 5 WHERE id = 'e1'")
        assert store.episode("e1").steps == steps
    assert store.episode("e1").steps == steps + 5
    store.close()


def test_transaction_rows_read_plainly_are_the_rows_the_session_reads(recorded: str):
    """``Store.transaction_rows`` (a statement on a pooled connection) gives the rows a
    session gives, field for field and type for type (``mutating`` a bool), in order."""
    store = hx.Store(recorded)
    plain = store.transaction_rows("e1")
    with store.snapshot():  # (the session's reads, compared while it is open)
        expected = [row.model_dump() for row in store.transaction_rows("e1")]
    assert len(plain) == len(expected) >= 2
    for mine, theirs in zip(plain, expected, strict=True):
        assert mine.model_dump() == theirs
        assert {k: type(v) for k, v in mine.model_dump().items()} == {
            k: type(v) for k, v in theirs.items()
        }
    assert store.transaction_rows("nobody") == []
    store.close()


def test_a_writer_gives_its_connection_back_clean_and_once(recorded: str):
    """A writer's connection goes back to the store's pool when it closes: closing it again
    does not close the connection another operation has taken since, and a connection left
    in a transaction (a writer abandoned mid-write) is closed, not handed on holding the
    database's write lock."""
    store = hx.Store(recorded)
    writer = store.writer("e1")
    conn = writer.conn
    writer.close()
    assert store._pool_idle == [conn]
    with store._pooled() as taken:
        assert taken is conn
        writer.close()  # (again: nothing happens to the connection now in use)
        assert taken.execute("SELECT COUNT(*) FROM hx_episode").fetchone()[0] == 1
    # A writer used after its close fails as on a closed connection, and the writer that
    # has its connection now keeps its transaction.
    with pytest.raises(hx.StoreError):
        with writer.batch():
            pass
    second = store.writer("e1")
    assert second.conn is conn
    with second.batch():
        second.load_head()
        second.append("note", None, {"n": 1})
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            writer.append("note", None, {"n": 2})
    assert second.head == hx.Store(recorded).log("e1")[-1].hash
    second.close()
    stuck = store.writer("e1")
    taken = stuck.conn
    taken.execute("BEGIN IMMEDIATE")
    stuck.close()
    assert taken not in store._pool_idle
    other = sqlite3.connect(db_path(recorded), timeout=0.5)
    other.execute("BEGIN IMMEDIATE")  # (the write lock was let go)
    other.rollback()
    other.close()
    store.close()


def test_clean_chain_verifies(recorded: str):
    """An unedited log verifies and reports how many records it checked."""
    report = hx.Store(recorded).verify_chain()
    assert report.ok and report.episodes == 1 and report.records >= 6


def test_altered_payload_is_named(recorded: str):
    """Changing a record's content is detected at that record."""
    edit(recorded, "UPDATE hx_log SET payload = payload || ' ' WHERE seq = 3")
    report = hx.Store(recorded).verify_chain()
    assert not report.ok and report.seq == 3 and "altered" in report.reason


def test_removed_record_is_named(recorded: str):
    """Deleting a record in the middle is detected where the chain breaks."""
    edit(recorded, "DELETE FROM hx_log WHERE seq = 3")
    report = hx.Store(recorded).verify_chain()
    assert not report.ok and report.seq == 3 and "missing" in report.reason


def test_removed_tail_is_named(recorded: str):
    """Deleting the last records is detected against the episode's recorded head."""
    edit(recorded, "DELETE FROM hx_log WHERE seq = (SELECT MAX(seq) FROM hx_log)")
    report = hx.Store(recorded).verify_chain()
    assert not report.ok and "removed from the end" in report.reason


def test_reordered_records_are_named(recorded: str):
    """Swapping two records' positions is detected."""
    edit(recorded, "UPDATE hx_log SET seq = -1 WHERE seq = 2")
    edit(recorded, "UPDATE hx_log SET seq = 2 WHERE seq = 3")
    edit(recorded, "UPDATE hx_log SET seq = 3 WHERE seq = -1")
    report = hx.Store(recorded).verify_chain()
    assert not report.ok and report.seq == 2


def test_rehashed_edit_is_still_caught(recorded: str):
    """Recomputing one record's hash after editing it breaks the link to the next record."""
    store = hx.Store(recorded)
    prev, row = store.log("e1")[1:3]
    from harness.store import record_hash

    payload = row.payload + " "
    h = record_hash(prev.hash, row.episode_id, row.seq, row.kind, row.txn_id, payload, row.ts)
    with sqlite3.connect(db_path(recorded)) as conn:
        conn.execute(
            "UPDATE hx_log SET payload = ?, hash = ? WHERE episode_id = ? AND seq = ?",
            (payload, h, row.episode_id, row.seq),
        )
    report = store.verify_chain()
    assert not report.ok and report.seq == row.seq + 1


def test_store_url_that_does_not_open(tmp_path: Path):
    """A URL that is not a database, or a driver that is missing, is a StoreError naming it."""
    with pytest.raises(hx.StoreError, match="not a database URL"):
        hx.Store("://x")
    with pytest.raises(hx.StoreError, match="not a database URL"):
        hx.Store("postgresql://u@h:port/db")
    with pytest.raises(hx.StoreError, match="does not open"):
        hx.Store("nope://")
    with pytest.raises(hx.StoreError, match="does not open"):
        hx.Store("postgresql+nodriver://localhost/x")


def test_corrupt_database_file_is_refused(tmp_path: Path):
    """A file that is not SQLite is refused with a clear error, and left as it was."""
    bad = tmp_path / "broken.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(hx.StoreError, match="does not open as a database"):
        hx.Store(f"sqlite:///{bad}")
    assert bad.read_bytes() == b"this is not a database" * 100


def test_newer_schema_is_refused(store_url: str):
    """A store written by a newer harness is refused; nothing is written to it."""
    hx.Store(store_url, create=True).close()
    edit(store_url, "UPDATE hx_meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(hx.StoreError, match="schema version 999, newer"):
        hx.Store(store_url)


def test_store_another_process_is_creating_opens(store_url: str):
    """Tables are committed before the version row: a process that opens the store in
    between sees no version yet, takes it as its own, and both agree afterwards."""
    hx.Store(store_url, create=True).close()
    edit(store_url, "DELETE FROM hx_meta")
    hx.Store(store_url).close()
    with sqlite3.connect(db_path(store_url)) as conn:
        rows = conn.execute("SELECT key, value FROM hx_meta").fetchall()
    assert rows == [("schema_version", "2")]
    hx.Store(store_url).close()


def test_plain_path_is_a_sqlite_store(tmp_path: Path):
    """A file path works as a store URL and lands in WAL mode."""
    store = hx.Store(tmp_path / "x.db", create=True)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()


def test_missing_store_file_is_refused_unless_asked_to_create(tmp_path: Path):
    """A store path that does not exist is a StoreError naming it and create=True, and no
    folder or file is made; with create=True both are."""
    for url in ("notaurl", tmp_path / "typo" / "harness.db", f"sqlite:///{tmp_path}/x/h.db"):
        with pytest.raises(hx.StoreError, match=r"no database file .*pass create=True"):
            hx.Store(url)
    assert list(tmp_path.iterdir()) == [] and not Path("notaurl").exists()
    hx.Store(tmp_path / "typo" / "harness.db", create=True).close()
    assert (tmp_path / "typo" / "harness.db").is_file()
    hx.Store(tmp_path / "typo" / "harness.db").close()


def test_synchronous_setting_is_checked(tmp_path: Path):
    """An unknown synchronous mode is refused before anything is created."""
    with pytest.raises(hx.StoreError, match="synchronous"):
        hx.Store(tmp_path / "x.db", synchronous="SOMETIMES", create=True)
    assert not (tmp_path / "x.db").exists()


def test_interrupted_batch_leaves_no_gap_in_the_chain(shop: Shop, store_url: str):
    """A write interrupted inside its batch is rolled back, and the chain continues unbroken."""
    store = hx.Store(store_url, create=True)
    writer = store.writer("e1")
    with writer.batch():
        writer.insert_episode({"id": "e1", "created_at": 0.0, "updated_at": 0.0})
        writer.append("start", None, {})
        writer.update_head()
    with pytest.raises(KeyboardInterrupt), writer.batch():
        writer.append("lost", None, {})
        raise KeyboardInterrupt
    with writer.batch():
        writer.append("after", None, {})
        writer.update_head()
    writer.close()
    assert [r.kind for r in store.log("e1")] == ["start", "after"]
    assert store.verify_chain().ok


def test_appended_record_is_named(recorded: str):
    """A record appended after a finished episode's head is reported."""
    store = hx.Store(recorded)
    last = store.log("e1")[-1]
    from harness.store import record_hash

    h = record_hash(last.hash, "e1", last.seq + 1, "commit", None, "{}", 1.0)
    with sqlite3.connect(db_path(recorded)) as conn:
        conn.execute(
            "INSERT INTO hx_log(id, episode_id, seq, txn_id, kind, payload, ts, hash) "
            "VALUES (?, 'e1', ?, NULL, 'commit', '{}', 1.0, ?)",
            (last.id + 1, last.seq + 1, h),
        )
    report = store.verify_chain()
    assert not report.ok and "appended outside the harness" in report.reason
