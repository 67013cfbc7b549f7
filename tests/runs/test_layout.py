"""Reading a run never writes: every read-only command leaves the folder's files as they were,
and a file that is not a harness store is refused without being touched."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.cli.run import replay_command
from harness.errors import StoreError
from harness.runs.layout import check_database, open_run

OLD = 1_600_000_000_000_000_000  # an mtime far in the past, so any touch shows


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of ``folder``: its bytes and mtime (ns). A ``-shm`` file that exists already
    is left out: it is SQLite's shared-memory index of the write-ahead log, which every reader
    of a database in WAL mode updates; it holds no data, and none is created."""
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.endswith("-shm")
    } | {p.name: (b"", 0) for p in folder.glob("*-shm")}


def _age(folder: Path) -> None:
    for p in folder.iterdir():
        os.utime(p, ns=(OLD, OLD))


def _commands(run: Path, out: Path, episode: str, suite: Path | None = None) -> list[list[str]]:
    r = str(run)
    replay = ["replay", r, "--episode", episode]
    if suite is not None and any(p.name == "suite" for p in replay_command.params):
        replay += ["--suite", str(suite)]  # a run's own suite, named by the caller
    return [
        ["audit", r],
        ["audit", r, "--json"],
        ["audit", r, "--verify"],
        ["audit", r, "--episode", episode, "--html", str(out / "audit.html")],
        ["escalations", r],
        ["escalations", r, "--all", "--json"],
        ["report", r, "--json"],
        ["report", r, "--html", str(out / "report.html")],
        ["compare", r, r],
        ["export", r, "--format", "jsonl", "--out", str(out / "x.jsonl")],
        ["export", r, "--format", "taubench", "--out", str(out / "tb.json")],
        ["export", r, "--format", "tau2", "--out", str(out / "t2.json")],
        replay,
    ]


def test_a_run_in_this_process_leaves_one_database_file(toy: Any, tmp_path: Path) -> None:
    """Once ``run_trials`` returns, the run's process holds no connection to its store: the
    write-ahead log is folded into the database and removed (a folder to copy or send is
    whole), and the store reads back every trial."""
    result = hx.run_trials(toy, agent="simulated", trials=3, seed=1, logs=tmp_path, concurrency=4)
    names = sorted(p.name for p in result.folder.iterdir())
    assert not [n for n in names if n.endswith(("-wal", "-shm"))], names
    with open_run(result.folder) as opened:
        assert len(opened.trials) == 3 * len(toy.tasks)


def test_read_only_commands_leave_a_good_run_unchanged(good_run: Path, tmp_path: Path) -> None:
    with open_run(good_run) as opened:
        episode = opened.trials[0].episode_id
    _age(good_run)
    before = _snapshot(good_run)
    for args in _commands(good_run, tmp_path, episode, good_run.parent.parent / "suite"):
        result = CliRunner().invoke(main, args)
        assert result.exit_code in (0, 1), (args, result.output, result.exception)
        after = _snapshot(good_run)
        assert after == before, (
            args,
            sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)),
        )
    assert (tmp_path / "x.jsonl").is_file() and (tmp_path / "report.html").is_file()


def _zero_byte(folder: Path) -> None:
    (folder / "harness.db").write_bytes(b"")


def _no_meta(folder: Path) -> None:
    conn = sqlite3.connect(folder / "harness.db")
    conn.execute("CREATE TABLE notes (x TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("make", [_zero_byte, _no_meta], ids=["0-byte", "no-hx_meta"])
def test_read_only_commands_refuse_a_non_harness_database_and_write_nothing(
    make: object, tmp_path: Path
) -> None:
    run = tmp_path / "logs" / "r1"
    run.mkdir(parents=True)
    make(run)  # type: ignore[operator]
    _age(run)
    before = _snapshot(run)
    out = tmp_path / "out"
    for args in _commands(run, out, "r1-t0-0"):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert "Traceback" not in result.output
        assert "harness.db" in result.output and "nothing was written" in result.output, args
        assert _snapshot(run) == before, args
        assert sorted(p.name for p in run.iterdir()) == ["harness.db"], args
    assert not out.exists()


def test_readonly_store_refuses_an_empty_file_and_reads_a_good_one(
    good_run: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StoreError, match="empty.db is empty.*nothing was written"):
        hx.Store(empty, readonly=True)
    assert empty.read_bytes() == b""
    with pytest.raises(StoreError, match="no database file"):
        hx.Store(tmp_path / "missing.db", readonly=True, create=True)
    assert not (tmp_path / "missing.db").exists()
    store = hx.Store(good_run / "harness.db", readonly=True)
    try:
        assert [r.id for r in store.runs()] == ["good"]
        row = store.runs()[0]
        row.status = "changed"
        with pytest.raises(Exception, match="readonly"):
            store.add(row)
        conn = store.raw_connection()
        try:
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                conn.execute("DELETE FROM hx_run")
        finally:
            conn.close()
    finally:
        store.close()


def test_resolving_an_escalation_still_writes(good_run: Path) -> None:
    """`escalations RUN resolve` looks read-only, then writes the decision: an unknown id is
    refused and nothing changes."""
    _age(good_run)
    before = _snapshot(good_run)
    result = CliRunner().invoke(
        main, ["escalations", str(good_run), "resolve", "nope", "--approve", "--by", "me"]
    )
    assert result.exit_code == 2 and "no escalation 'nope'" in result.output
    assert _snapshot(good_run) == before


# --- a write cut short (a full disk, a crash) is recovered, not called damaged ---


def _short_by(db: Path) -> int:
    """How many bytes the file lacks of the size its SQLite header records (0: none)."""
    header = db.read_bytes()[:100]
    size = int.from_bytes(header[16:18], "big") * int.from_bytes(header[28:32], "big")
    return max(size - db.stat().st_size, 0)


def _in_child(work: Callable[[], None]) -> None:
    """Run ``work`` in a forked process that then dies at once (closing nothing, as a killed
    process would); check it got to the end."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


def _checkpoint_cut_short(db: Path, written: Path) -> None:
    """Write a new episode into ``db`` (through the harness, into its write-ahead log), then
    checkpoint it on a disk with no room for the database file to grow (a file size limit):
    SQLite writes the first page, with the new page count, and fails on the next, leaving the
    file shorter than its header says, the log whole beside it. The episode's log goes to
    ``written``."""

    def work() -> None:
        keeper = sqlite3.connect(db)  # (open throughout: the harness's closes do not checkpoint)
        state = hx.DictState({"notes/a": "", "notes/b": ""})

        @hx.action(writes=["notes/{name}"], idempotency_key=lambda a: a.name)
        def note(name: str, text: str) -> None:
            """Write a note."""
            state[f"notes/{name}"] = text

        store = hx.Store(db)
        with hx.Episode(state=state, store=store, episode_id="extra"):
            note("a", "a" * 30_000)
            note("b", "b" * 30_000)
        written.write_text(json.dumps([[r.seq, r.hash] for r in store.log("extra")]))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (db.stat().st_size, resource.RLIM_INFINITY))
        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            keeper.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    _in_child(work)


@pytest.fixture
def cut_short(good_run: Path, tmp_path: Path) -> tuple[Path, list[list[Any]]]:
    """A copy of the good run whose last checkpoint a full disk cut short (the run folder
    and the log records of the episode written just before)."""
    folder = tmp_path / "logs" / "good"
    shutil.copytree(good_run, folder)
    _checkpoint_cut_short(folder / "harness.db", tmp_path / "written.json")
    db = folder / "harness.db"
    assert _short_by(db) > 0 and Path(f"{db}-wal").stat().st_size > 0  # the reported case
    return folder, json.loads((tmp_path / "written.json").read_text())


def test_a_checkpoint_cut_short_by_a_full_disk_opens_from_its_wal_with_nothing_lost(
    cut_short: tuple[Path, list[list[Any]]],
) -> None:
    """The database file is shorter than its header records, its write-ahead log holds the
    rest: reading the run accepts it and writes nothing, `harness verify` passes, resuming
    opens it, and every record is there; the next checkpoint (with space) completes it."""
    folder, written = cut_short
    db = folder / "harness.db"
    _age(folder)
    before = _snapshot(folder)
    with open_run(folder) as opened:
        assert len(opened.trials) == 4
        assert [[r.seq, r.hash] for r in opened.store.log("extra")] == written
        assert opened.store.verify().ok
    result = CliRunner().invoke(main, ["verify", str(folder)])
    assert result.exit_code == 0 and "verified" in result.output, result.output
    assert _snapshot(folder) == before
    with open_run(folder, writable=True) as opened:
        assert [[r.seq, r.hash] for r in opened.store.log("extra")] == written
    assert _short_by(db) == 0 and not Path(f"{db}-wal").exists()
    store = hx.Store(db, readonly=True)
    try:
        assert [[r.seq, r.hash] for r in store.log("extra")] == written
        assert store.verify().ok and len(store.trial_rows()) == 4
    finally:
        store.close()


def test_a_truncated_file_with_no_log_holding_the_rest_is_still_damaged(
    cut_short: tuple[Path, list[list[Any]]], good_run: Path, tmp_path: Path
) -> None:
    """Cut short with its write-ahead log gone, or cut in half beside a log that holds other
    pages: refused as damaged, naming `.recover`, the files left as they are."""
    folder, _ = cut_short
    db = folder / "harness.db"
    for leftover in ("harness.db-wal", "harness.db-shm"):
        (folder / leftover).unlink()
    before = _snapshot(folder)
    with pytest.raises(StoreError, match=r"damaged \(truncated: .*\.recover"):
        check_database(db)
    assert _snapshot(folder) == before

    halved = tmp_path / "halved"
    shutil.copytree(good_run, halved)
    db = halved / "harness.db"
    with sqlite3.connect(db) as conn:  # (the run's records move from its log into the file)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()

    def small_write() -> None:
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("UPDATE hx_run SET suite = suite || ' '")
        conn.commit()  # (in the log; the process dies before any checkpoint)

    _in_child(small_write)
    assert Path(f"{db}-wal").stat().st_size > 0
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    _age(halved)
    before = _snapshot(halved)
    with pytest.raises(StoreError, match=r"damaged.*\.recover"):
        with open_run(halved, writable=True):
            pass
    assert _snapshot(halved) == before


def test_a_commit_cut_short_beside_its_rollback_journal_is_undone_by_resume(
    good_run: Path, tmp_path: Path
) -> None:
    """A database in rollback-journal mode left by a commit cut after its first page (the
    file shorter than its header, the unfinished write's journal beside it): not damaged.
    Reading it is refused with what to do (a read-only open cannot undo the write) and
    writes nothing; opening it to resume undoes the write, and every trial is there."""
    folder = tmp_path / "logs" / "good"
    shutil.copytree(good_run, folder)
    db = folder / "harness.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    conn.close()
    size = db.stat().st_size

    def unfinished_write() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA cache_size=2")  # (spills to the file: the journal is written)
        conn.execute("BEGIN")
        for n in range(50):
            conn.execute(
                "INSERT INTO hx_run (id, created_at, suite, status, config, evidence) "
                "VALUES (?, 0, '', 'running', '{}', ?)",
                (f"x{n}", "x" * 2000),
            )

    _in_child(unfinished_write)
    journal = Path(f"{db}-journal")
    assert journal.stat().st_size > 0
    # The commit got as far as the first page (its new page count), not the pages past the end.
    data = bytearray(db.read_bytes()[:size])
    pages = int.from_bytes(data[28:32], "big")
    data[28:32] = (pages + 40).to_bytes(4, "big")
    db.write_bytes(bytes(data))
    assert _short_by(db) > 0

    _age(folder)
    before = _snapshot(folder)
    check_database(db)
    with pytest.raises(StoreError, match=r"unfinished write.*harness resume.*nothing committed"):
        with open_run(folder):
            pass
    assert _snapshot(folder) == before
    with open_run(folder, writable=True) as opened:
        assert [r.id for r in opened.store.runs()] == ["good"] and len(opened.trials) == 4
        assert opened.store.verify().ok
    assert not journal.exists() and _short_by(db) == 0
