"""Reading a run never writes: every read-only command leaves the folder's files as they were,
and a file that is not a harness store is refused without being touched."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.cli.run import replay_command
from harness.errors import StoreError
from harness.runs.layout import open_run

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
