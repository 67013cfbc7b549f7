"""Transaction rows and checkpoints as projections of the log.

A commit on the hot path writes its log record only; its row and checkpoint are written by the
episode's next other write. These tests hold the two ways to a row (written later, or built
from the log by a reader) to the same result, through a crash and a resume.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import harness as hx
import harness.store.writer as hx_writer
from harness.store import record_hash

from ..conftest import Shop
from ..crashes import die
from ..test_transaction import cancel_action


def _lookup_action(shop: Shop) -> hx.Action[..., Any]:
    @hx.action
    def lookup(order_id: str) -> dict[str, Any]:
        """Read an order."""
        return dict(shop.state[f"orders/{order_id}"])

    return lookup


def _table(store_url: str, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        return conn.execute(sql).fetchall()


def _rows(store: hx.Store, episode_id: str) -> list[dict[str, Any]]:
    return [r.model_dump() for r in store.transactions(episode_id)]


def _verified(store: hx.Store) -> bool:
    """The chain and every row, checkpoint and episode row against the log (harness audit)."""
    report = store.verify()
    assert not report.findings, report.findings
    return report.ok


def _crash(ep: hx.Episode) -> None:
    """Leave the episode as a killed process would: its connection gone, nothing finished."""
    die(ep)


def test_running_episode_reads_rows_built_from_its_log(shop: Shop, store_url: str):
    """While an episode runs, its commits have records and no rows yet; readers see the rows
    built from the records, and they equal the rows written when the episode ends."""
    cancel, lookup = cancel_action(shop), _lookup_action(shop)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
        cancel("o1")
        lookup("o1")
        cancel("o2")
        assert _table(store_url, "SELECT COUNT(*) FROM hx_transaction") == [(0,)]
        reader = hx.Store(store_url)
        derived = _rows(reader, "e1")
        derived_cps = [c.model_dump() for c in reader.checkpoints("e1")]
        assert [(r["action"], r["status"], r["step"]) for r in derived] == [
            ("cancel_order", "committed", 1),
            ("lookup", "committed", None),
            ("cancel_order", "committed", 2),
        ]
        assert [c["step"] for c in derived_cps] == [1, 2]
    assert _table(store_url, "SELECT COUNT(*) FROM hx_transaction") == [(3,)]
    written = hx.Store(store_url)
    assert _rows(written, "e1") == derived
    assert [c.model_dump() for c in written.checkpoints("e1")] == derived_cps
    assert _verified(written)


def test_crash_leaves_verifiable_records_and_resume_writes_the_rows(shop: Shop, store_url: str):
    """A crash after hot-path commits loses nothing: the chain verifies, readers see every
    commit, and a resume writes their rows and goes on from the right step."""
    cancel = cancel_action(shop)
    ep = hx.Episode(state=shop.state, store=store_url, episode_id="e1")
    with ep:
        cancel("o1")
        cancel("o2")
        before = _rows(hx.Store(store_url), "e1")
        _crash(ep)
    store = hx.Store(store_url)
    assert store.episode("e1").status == "running"  # type: ignore[union-attr]
    assert store.verify_chain().ok and _verified(store)
    assert [r["step"] for r in _rows(store, "e1")] == [1, 2]
    shop.state["orders/o3"] = {"status": "pending", "total": 30}
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1", resume=True) as again:
        assert again.steps == 2
        # The agent runs again from the start: its recorded calls return their records.
        assert cancel("o1") == {"order_id": "o1", "status": "cancelled"}
        assert cancel("o2") == {"order_id": "o2", "status": "cancelled"}
        cancel("o3")
    assert shop.applied == [("o1", "cancelled"), ("o2", "cancelled"), ("o3", "cancelled")]
    assert _table(store_url, "SELECT COUNT(*) FROM hx_transaction") == [(3,)]
    rows = _rows(hx.Store(store_url), "e1")
    assert rows[:2] == before and rows[2]["step"] == 3
    assert _verified(hx.Store(store_url))


def test_many_commits_are_written_in_bounded_batches(
    shop: Shop, store_url: str, monkeypatch: pytest.MonkeyPatch
):
    """Past FLUSH_EVERY pending commits, the next call writes the rows first: memory stays
    bounded in a long episode, and the rows still equal their records."""
    monkeypatch.setattr(hx_writer, "FLUSH_EVERY", 2)
    for n in range(4, 8):
        shop.state[f"orders/o{n}"] = {"status": "pending", "total": n}
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1") as ep:
        for n in (1, 2, 4, 5, 6):
            cancel(f"o{n}")
            assert len(ep._writer.pending) <= 2
        # Calls 3 and 5 found two commits pending: each wrote their rows with its intent.
        assert _table(store_url, "SELECT COUNT(*) FROM hx_transaction") == [(4,)]
    assert [r.step for r in hx.Store(store_url).transactions("e1")] == [1, 2, 3, 4, 5]
    assert _verified(hx.Store(store_url))


def test_failed_batch_keeps_its_commits_pending(shop: Shop, store_url: str):
    """A batch that fails after writing earlier commits' rows rolls them back with itself
    and keeps them pending: the next batch writes them."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1") as ep:
        cancel("o1")
        writer = ep._writer
        with pytest.raises(RuntimeError), writer.batch():
            writer.append("note", None, {"n": 1})
            raise RuntimeError("the batch fails")
        assert len(writer.pending) == 1
        assert _table(store_url, "SELECT COUNT(*) FROM hx_transaction") == [(0,)]
        cancel("o2")
    assert [r.step for r in hx.Store(store_url).transactions("e1")] == [1, 2]
    assert hx.Store(store_url).verify_chain().ok


def test_record_appended_past_a_running_episodes_witness_is_named(shop: Shop, store_url: str):
    """Past the witness of a crashed episode only intents and commits may follow (the hot
    path); any other record there was appended outside the harness."""
    cancel = cancel_action(shop)
    ep = hx.Episode(state=shop.state, store=store_url, episode_id="e1")
    with ep:
        cancel("o1")
        _crash(ep)
    store = hx.Store(store_url)
    last = store.log("e1")[-1]
    h = record_hash(last.hash, "e1", last.seq + 1, "rollback", None, "{}", 1.0)
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        conn.execute(
            "INSERT INTO hx_log(id, episode_id, seq, txn_id, kind, payload, ts, hash) "
            "VALUES (?, 'e1', ?, NULL, 'rollback', '{}', 1.0, ?)",
            (last.id + 1, last.seq + 1, h),
        )
    report = store.verify_chain()
    assert not report.ok and "appended outside the harness" in report.reason


def test_old_schema_is_refused_with_the_fix(tmp_path: Path):
    """A store written by an older harness (log keyed by episode and seq) is refused with a
    message naming the version and what to do, and it is left as it was."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE hx_meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO hx_meta VALUES ('schema_version', '1')")
        conn.execute(
            "CREATE TABLE hx_log (episode_id TEXT, seq INT, txn_id TEXT, kind TEXT, "
            "payload TEXT, ts REAL, prev_hash TEXT, hash TEXT, PRIMARY KEY (episode_id, seq))"
        )
    with pytest.raises(hx.StoreError, match="schema version 1"):
        hx.Store(db)
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "hx_episode" not in tables


def test_reliability_counts_commits_of_an_episode_that_never_finished(shop: Shop, store_url: str):
    """The reliability report reads transactions in bulk: a crashed episode's commits whose
    rows were never written are in it too."""
    from harness.runs.reliability import _transactions

    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, episode_id="done"):
        cancel("o1")
    ep = hx.Episode(state=shop.state, store=store_url, episode_id="crashed")
    with ep:
        cancel("o2")
        _crash(ep)
    rows = _transactions(hx.Store(store_url), ["done", "crashed"])
    assert sorted((r.episode_id, r.action, r.status) for r in rows) == [
        ("crashed", "cancel_order", "committed"),
        ("done", "cancel_order", "committed"),
    ]


def test_altered_commit_record_of_a_crashed_episode_is_a_clear_error(shop: Shop, store_url: str):
    """Rows of a crashed episode are built from its log; a commit record edited so that it no
    longer reads as one is a StoreError naming the record, not a traceback, and the chain
    check names it too."""
    cancel = cancel_action(shop)
    ep = hx.Episode(state=shop.state, store=store_url, episode_id="e1")
    with ep:
        cancel("o1")
        _crash(ep)
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE hx_log SET payload = '{\"action\": 1}' WHERE kind = 'committed'")
    store = hx.Store(store_url)
    with pytest.raises(hx.StoreError, match=r"log record 3 \(committed e1:1\).*audit --verify"):
        store.transactions("e1")
    report = store.verify_chain()
    assert not report.ok and report.seq == 3 and "altered" in report.reason


@pytest.mark.parametrize("kind", ["intent", "committed"])
def test_interrupt_just_after_a_record_is_written_keeps_the_chain_whole(
    shop: Shop, store_url: str, kind: str
):
    """Ctrl-C is raised when the database call returns, after the record was written (and,
    on the hot path, committed). The episode still ends cleanly: the chain goes on after
    that record, the commit is remembered as the log has it, and everything verifies."""
    cancel = cancel_action(shop)
    ep = hx.Episode(state=shop.state, store=store_url, episode_id="e1")
    with pytest.raises(KeyboardInterrupt), ep:
        cancel("o1")
        writer = ep._writer
        execute = writer._exec

        def interrupted(sql: str, params: Any) -> None:
            execute(sql, params)
            if isinstance(params, tuple) and params[4] == kind:
                raise KeyboardInterrupt

        writer._exec = interrupted
        cancel("o2")
    store = hx.Store(store_url)
    kinds = [r.kind for r in store.log("e1")]
    assert kinds[-2:] == [kind, "end"] and kinds.count("committed") == (
        2 if kind == "committed" else 1
    )
    rows = store.transactions("e1")
    assert [r.step for r in rows] == ([1, 2] if kind == "committed" else [1])
    assert store.episode("e1").steps == len(rows)  # type: ignore[union-attr]
    _verified(store)


@pytest.mark.parametrize("calls", [("o1", "o2", "read"), ("o1", "o2", "o4")])
def test_crash_after_bounded_batches_reads_and_verifies(
    shop: Shop, store_url: str, monkeypatch: pytest.MonkeyPatch, calls: tuple[str, ...]
):
    """A crash after the rows were written in a bounded batch: every commit (writes and
    reads) is still read back, and the episode row's step agrees with its witness."""
    monkeypatch.setattr(hx_writer, "FLUSH_EVERY", 2)
    shop.state["orders/o4"] = {"status": "pending", "total": 4}
    cancel, lookup = cancel_action(shop), _lookup_action(shop)
    ep = hx.Episode(state=shop.state, store=store_url, episode_id="e1")
    with ep:
        for call in calls:
            lookup("o1") if call == "read" else cancel(call)
        _crash(ep)
    store = hx.Store(store_url)
    assert len(store.transactions("e1")) == 3
    _verified(store)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1", resume=True):
        for call in calls:
            lookup("o1") if call == "read" else cancel(call)
    assert len(shop.applied) == sum(c != "read" for c in calls)  # nothing ran twice
    _verified(hx.Store(store_url))
