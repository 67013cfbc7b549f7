"""The store refusing a write (a full disk, a read-only store, a lock held too long): one clear
error naming the database, the cause and the fix; nothing of the write kept; and once the cause
is gone the store opens, verifies, and writing carries on with no record lost or twice."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from sqlmodel import select

import harness as hx
from harness._json import dumps
from harness.cli import main
from harness.errors import StoreError, StoreWriteFailed
from harness.store import LogRow, RunRow, TrialRow
from harness.store.failures import FULL, IO_ERROR, LOCKED, READ_ONLY, write_failure

from ..toy_env import write_suite

BIG = "x" * 200_000  # a payload that needs many new pages


class Disk:
    """The disk under the tests' SQLite stores, as SQLite sees it: a page budget
    (``PRAGMA max_page_count``) on every connection a store opens, so a write that needs the
    database file to grow fails as on a full disk (``SQLITE_FULL``)."""

    UNLIMITED = 1_073_741_823

    def __init__(self) -> None:
        self.pages: int | None = None  # the budget new connections get (None: no limit)
        self.connections: list[sqlite3.Connection] = []

    def pragmas(self, original: Callable[..., None]) -> Callable[..., None]:
        """``Store._sqlite_pragmas``, then the budget."""

        def apply(store: hx.Store, conn: sqlite3.Connection, record: Any) -> None:
            original(store, conn, record)
            self.connections.append(conn)
            if self.pages is not None:
                conn.execute(f"PRAGMA max_page_count={self.pages}")

        return apply

    def _set(self, pages: int) -> None:
        for conn in self.connections:
            with contextlib.suppress(sqlite3.ProgrammingError):  # (closed)
                conn.execute(f"PRAGMA max_page_count={pages}")

    def fill(self) -> None:
        """No page more for any connection, open or opened later (a budget below the
        database's size is its size)."""
        self.pages = 1
        self._set(1)

    def free(self) -> None:
        """Space again."""
        self.pages = None
        self._set(self.UNLIMITED)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    """The stores opened in this test sit on a disk the test can fill."""
    d = Disk()
    monkeypatch.setattr(hx.Store, "_sqlite_pragmas", d.pragmas(hx.Store._sqlite_pragmas))
    return d


def _clear(error: BaseException, db: Path) -> None:
    """The error a person reads: the database, the cause in words, the fix, no driver noise."""
    assert isinstance(error, StoreWriteFailed), repr(error)
    assert error.cause == FULL and error.database == str(db)
    _says_full(str(error), db)


def _says_full(text: str, db: Path) -> None:
    """The message names the database, says the disk is full and how to carry on."""
    assert str(db) in text and "the disk is full" in text
    assert f"harness resume {db.parent}" in text and "nothing committed is lost" in text
    assert "sqlite3" not in text and "OperationalError" not in text and "Traceback" not in text


def _log(store: hx.Store) -> list[tuple[str, int, str]]:
    """Every log record of the store: episode, place, hash."""
    with store.session() as s:
        rows = list(s.exec(select(LogRow)))
    return sorted((r.episode_id, r.seq, r.hash) for r in rows)


# --- a run on a disk that fills up ---


def test_a_run_stopped_by_a_full_disk_verifies_and_resumes_with_nothing_lost_or_twice(
    disk: Disk, tmp_path: Path
) -> None:
    """A run whose disk fills mid-way stops, saying the clear error (no traceback); its
    folder opens and verifies; with space again `resume` finishes it: every record written before is
    still there, every trial has one row and every step committed once."""
    suite = write_suite(tmp_path / "suite", [3, 4, 5])
    probe = hx.Store(tmp_path / "probe.db", create=True)
    with sqlite3.connect(tmp_path / "probe.db") as conn:
        schema = int(conn.execute("PRAGMA page_count").fetchone()[0])
    probe.close()
    disk.pages = schema + 12  # room for some trials, not for 18
    result = hx.run_trials(suite, agent="scripted", trials=6, logs=tmp_path / "logs", run_id="r1")
    folder = tmp_path / "logs" / "r1"
    assert result.interrupted and result.stopped is not None
    _says_full(result.stopped, folder / "harness.db")
    out = CliRunner().invoke(main, ["resume", str(folder), "--suite", str(suite)])
    assert out.exit_code != 0 and "the disk is full" in out.output, out.output
    assert "Traceback" not in out.output and "sqlite3" not in out.output

    disk.free()
    store = hx.Store(folder / "harness.db")
    try:
        assert store.verify().ok, store.verify().findings
        before, done = _log(store), len(store.trial_rows("r1"))
    finally:
        store.close()
    assert 0 < done < 18
    hx.resume_run(folder, suite=suite)
    store = hx.Store(folder / "harness.db")
    try:
        report = store.verify()
        assert report.ok, report.findings
        assert set(before) <= set(_log(store))
        trials = store.trial_rows("r1")
        assert len(trials) == len({t.id for t in trials}) == 18
        assert all(t.passed for t in trials)
        for episode in store.episodes("r1"):
            committed = Counter(
                t.idem_key for t in store.transactions(episode.id) if t.status == "committed"
            )
            assert committed and max(committed.values()) == 1, (episode.id, committed)
    finally:
        store.close()


# --- the episode writer: nothing partial, its head where the database's is ---


@pytest.fixture
def episode_store(store_url: str) -> Iterator[tuple[hx.Store, Path]]:
    """A store holding episode ``e1`` with a few committed calls."""
    state = hx.DictState({f"c/{n}": 0 for n in range(3)})

    @hx.action(writes=["c/{n}"], idempotency_key=lambda a: str(a.n))
    def bump(n: int) -> None:
        state[f"c/{n}"] = state[f"c/{n}"] + 1

    with hx.Episode(state=state, store=store_url, episode_id="e1"):
        for n in range(3):
            bump(n)
    store = hx.Store(store_url)
    yield store, Path(store_url.removeprefix("sqlite:///"))
    store.close()


def _on_disk(store: hx.Store, episode_id: str) -> tuple[int, str]:
    log = store.log(episode_id)
    return log[-1].seq, log[-1].hash


@pytest.mark.parametrize("path", ["batch", "hot"])
def test_a_refused_append_leaves_the_chain_head_where_the_database_has_it(
    disk: Disk, episode_store: tuple[hx.Store, Path], path: str
) -> None:
    """An append the full disk refuses (in a batch, or the hot path's own transaction) raises
    the clear error, writes nothing, and leaves the writer's head at the database's last
    record; with space again the same writer extends the chain, which verifies."""
    store, db = episode_store
    writer = store.writer("e1")
    try:
        with writer.batch():
            writer.load_head()
        head = (writer.seq, writer.head)
        assert head == _on_disk(store, "e1")
        disk.fill()

        def append() -> None:
            if path == "batch":
                with writer.batch():
                    writer.append("note", None, {"pad": "small"})  # (fits: the chain moves)
                    writer.append("note", None, {"pad": BIG})
            else:
                writer.hot("intent", "e1:99", dumps({"action": "bump", "pad": BIG}))

        with pytest.raises(StoreWriteFailed) as info:
            append()
        _clear(info.value, db)
        assert (writer.seq, writer.head) == head == _on_disk(store, "e1")
        assert writer.pending == []
        assert store.verify_chain().ok

        disk.free()
        append()
        assert (writer.seq, writer.head) == _on_disk(store, "e1")
        assert writer.seq == head[0] + (2 if path == "batch" else 1)
        with writer.batch():  # (moves the episode row's witness past a hot record)
            pass
        assert store.verify_chain().ok
    finally:
        writer.close()


def test_a_refused_first_batch_leaves_no_episode_and_the_next_numbers_it_again(
    disk: Disk, store: hx.Store, store_url: str
) -> None:
    """An episode whose first batch (its row and start record) the disk refuses is not in
    the store, and the writer holds no number for it: written again with space, it is whole."""
    db = Path(store_url.removeprefix("sqlite:///"))
    writer = store.writer("e9")
    row = {"id": "e9", "created_at": time.time(), "updated_at": time.time()}
    try:
        disk.fill()
        with pytest.raises(StoreWriteFailed) as info:
            with writer.batch():
                writer.insert_episode(row)
                writer.append("start", None, {"pad": BIG})
        _clear(info.value, db)
        assert writer.num is None and writer.seq == 0 and store.episode("e9") is None
        disk.free()
        with writer.batch():
            writer.insert_episode(row)
            writer.append("start", None, {"pad": "ok"})
        episode = store.episode("e9")
        assert episode is not None and episode.log_count == 1
        assert store.verify_chain("e9").ok
    finally:
        writer.close()


# --- every other way the store writes ---


def test_rows_and_sessions_refused_by_a_full_disk_say_so_and_keep_nothing(
    disk: Disk, episode_store: tuple[hx.Store, Path]
) -> None:
    """``Store.add`` and a session's commit (how the fault injector writes) on a full disk:
    the clear error, no row; with space, the same writes land."""
    store, db = episode_store
    disk.fill()
    run = RunRow(id="big", created_at=time.time(), evidence=BIG)
    with pytest.raises(StoreWriteFailed) as info:
        store.add(run)
    _clear(info.value, db)
    with pytest.raises(StoreWriteFailed) as info:
        with store.session() as s:
            s.add(RunRow(id="big2", created_at=time.time(), evidence=BIG))
            s.commit()
    _clear(info.value, db)
    assert store.runs() == []
    disk.free()
    store.add(run)
    assert [r.id for r in store.runs()] == ["big"]
    assert store.verify().ok


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stores opened in this test wait 50 ms for the write lock, not 30 s."""
    original = hx.Store._sqlite_pragmas

    def apply(store: hx.Store, conn: Any, record: Any) -> None:
        original(store, conn, record)
        conn.execute("PRAGMA busy_timeout=50")

    monkeypatch.setattr(hx.Store, "_sqlite_pragmas", apply)


def test_a_write_lock_held_past_the_busy_timeout_is_a_clear_error(
    short_busy_timeout: None, episode_store: tuple[hx.Store, Path]
) -> None:
    """Another process holding the write lock past the busy timeout: a lease, a row and an
    episode's batch each raise the clear error naming the cause; none is written."""
    store, db = episode_store
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    writer = store.writer("e1")

    def batch() -> None:
        with writer.batch():
            writer.load_head()

    try:
        attempts: list[Callable[[], Any]] = [
            lambda: store.acquire_lease("e1", owner="me"),
            lambda: store.add(RunRow(id="r", created_at=time.time())),
            batch,
        ]
        for attempt in attempts:
            with pytest.raises(StoreWriteFailed) as info:
                attempt()
            assert info.value.cause == LOCKED and str(db) in str(info.value)
            assert "database is locked" in str(info.value)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        writer.close()
    assert store.leases() == [] and store.runs() == []
    assert store.acquire_lease("e1", owner="me")


def test_a_read_only_store_refusing_a_write_says_it_was_opened_read_only(
    episode_store: tuple[hx.Store, Path],
) -> None:
    """A write through a store opened ``readonly=True`` is refused naming that, not the disk."""
    _, db = episode_store
    store = hx.Store(db, readonly=True)
    try:
        for attempt in (
            lambda: store.add(RunRow(id="r", created_at=time.time())),
            lambda: store.acquire_lease("e1", owner="me"),
        ):
            with pytest.raises(StoreWriteFailed, match=r"opened read-only.*readonly=True"):
                attempt()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (sqlite3.OperationalError("database or disk is full"), FULL),
        (sqlite3.OperationalError("attempt to write a readonly database"), READ_ONLY),
        (sqlite3.OperationalError("disk I/O error"), IO_ERROR),
        (sqlite3.OperationalError("database is locked"), LOCKED),
        (psycopg.errors.DiskFull("could not extend file: No space left on device"), FULL),
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT"), READ_ONLY),
        (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"), LOCKED),
        (psycopg.errors.IoError("could not write block"), IO_ERROR),
        (psycopg.OperationalError("could not extend file base/1/2: wrote only 4096"), FULL),
    ],
)
def test_each_driver_s_refusal_is_named_in_plain_words(error: Exception, cause: str) -> None:
    """SQLite's and Postgres's refusals, by code or by message, are each one cause."""
    failed = write_failure(error, "postgresql://u:***@h/db")
    assert failed is not None and failed.cause == cause and failed.error is error
    assert "<run folder>" in str(failed) or "read-only" in cause


@pytest.mark.parametrize(
    "error",
    [sqlite3.IntegrityError("UNIQUE constraint failed"), ValueError("no"), KeyError("x")],
)
def test_other_errors_are_not_called_refused_writes(error: Exception) -> None:
    """A constraint, a bug, anything else: not a refused write, passed through as it was."""
    assert write_failure(error, "db") is None


def test_a_shown_postgres_url_hides_its_password() -> None:
    """The database named in the errors never shows a password."""
    shown = hx.store.failures.shown("postgresql+psycopg://me:secret@host/db", None)
    assert "secret" not in shown and "host/db" in shown


# --- the verdict and its trial row: one transaction ---


def _trial_row(episode_id: str, **fields: Any) -> TrialRow:
    base: dict[str, Any] = {
        "id": episode_id,
        "run_id": "r1",
        "task_id": "t0",
        "trial": 0,
        "seed": 0,
        "episode_id": episode_id,
        "passed": True,
        "outcome": "committed",
        "verdict": '{"passed": true}',
        "created_at": time.time(),
    }
    return TrialRow(**(base | fields))


PAYLOAD = {
    "task_id": "t0",
    "trial": 0,
    "passed": True,
    "partial": None,
    "outcome": "committed",
    "infra_error": False,
    "verdict": {"passed": True},
}


def test_record_verdict_writes_the_record_and_the_row_and_they_verify(
    episode_store: tuple[hx.Store, Path],
) -> None:
    """The verdict record ends the chain, the episode's head moves with it, the trial row is
    stored (replacing an earlier one of the same id), and the store verifies."""
    store, _ = episode_store
    store.record_verdict("e1", {**PAYLOAD, "passed": False}, _trial_row("e1", passed=False))
    store.record_verdict("e1", PAYLOAD, _trial_row("e1", message="again"))
    log = store.log("e1")
    assert [r.kind for r in log[-2:]] == ["verdict", "verdict"]
    episode = store.episode("e1")
    assert episode is not None and (episode.log_count, episode.head_hash) == _on_disk(store, "e1")
    (trial,) = store.trial_rows("r1")
    assert trial.passed and trial.message == "again"
    report = store.verify()
    assert report.ok, report.findings


@pytest.mark.parametrize("failure", ["row refused", "disk full"])
def test_a_verdict_whose_trial_row_fails_leaves_neither(
    disk: Disk, episode_store: tuple[hx.Store, Path], failure: str
) -> None:
    """The trial row's insert failing after the verdict record was appended (a trigger
    refusing it, or a disk too full for it) rolls both back: no verdict record, no row, the
    episode's head unmoved, the store verifies; written again, both land."""
    store, db = episode_store
    head = _on_disk(store, "e1")
    if failure == "row refused":
        with sqlite3.connect(db) as conn:
            conn.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON hx_trial "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        conn.close()
        with pytest.raises(StoreError, match="refused"):
            store.record_verdict("e1", PAYLOAD, _trial_row("e1"))
    else:
        disk.fill()
        with pytest.raises(StoreWriteFailed) as info:
            store.record_verdict("e1", PAYLOAD, _trial_row("e1", message=BIG))
        _clear(info.value, db)
    assert _on_disk(store, "e1") == head
    assert [r.kind for r in store.log("e1")].count("verdict") == 0
    assert store.trial_rows() == []
    episode = store.episode("e1")
    assert episode is not None and (episode.log_count, episode.head_hash) == head
    assert store.verify().ok

    disk.free()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER IF EXISTS refuse")
    conn.close()
    store.record_verdict("e1", PAYLOAD, _trial_row("e1"))
    assert len(store.trial_rows()) == 1 and store.log("e1")[-1].kind == "verdict"
    assert store.verify().ok


def test_record_verdict_for_an_unknown_episode_writes_nothing(store: hx.Store) -> None:
    """No such episode: a clear error, and neither a record nor a row."""
    with pytest.raises(StoreError, match="no episode 'nope'.*nothing was written"):
        store.record_verdict("nope", PAYLOAD, _trial_row("nope"))
    assert store.trial_rows() == [] and store.log("nope") == []


@pytest.mark.parametrize("where", ["open", "end"])
def test_a_store_refusing_an_episode_s_open_or_end_stops_the_run_and_fails_no_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The disk filling just as a trial's episode opens (its first records) or ends (its end
    record) is the run's stop, with the clear error, never that trial's failure: no trial row
    says it failed, and once there is space resume finishes every trial, all passing."""
    from harness.episode import Episode

    suite = write_suite(tmp_path / "suite", [3, 4])
    folder = tmp_path / "logs" / "r1"
    method = "_open" if where == "open" else "_finish"
    original = getattr(Episode, method)

    def refused(self: Episode, *args: Any) -> Any:
        if self.id == "r1-t1-0":  # (the run's second trial; its reference replays open first)
            full = sqlite3.OperationalError("database or disk is full")
            raise write_failure(full, str(folder / "harness.db")) or full
        return original(self, *args)

    monkeypatch.setattr(Episode, method, refused)
    result = hx.run_trials(suite, agent="scripted", trials=3, logs=tmp_path / "logs", run_id="r1")
    assert result.interrupted and result.stopped is not None
    _says_full(result.stopped, folder / "harness.db")
    monkeypatch.setattr(Episode, method, original)
    store = hx.Store(folder / "harness.db")
    try:
        assert store.verify().ok, store.verify().findings
        rows = store.trial_rows("r1")
        assert [t.id for t in rows] == ["r1-t0-0"] and rows[0].passed
    finally:
        store.close()
    hx.resume_run(folder, suite=suite)
    store = hx.Store(folder / "harness.db")
    try:
        assert store.verify().ok, store.verify().findings
        rows = store.trial_rows("r1")
        assert len(rows) == 6 and all(t.passed for t in rows)
    finally:
        store.close()
