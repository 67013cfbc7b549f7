"""`harness state uninstall DATABASE` takes out what a killed process's adapter left in an
application's database (SQLite, and Postgres when a server is given), and refuses while an
adapter is open on it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main

from ..forking import die_with_a_window_open
from ..postgres import fresh_database, libpq


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE acct (id TEXT PRIMARY KEY, bal INTEGER)")
        conn.execute("INSERT INTO acct VALUES ('a', 1)")
    conn.close()
    return path


def left_in(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE '\\_hx\\_%' ESCAPE '\\'"
        )
        return sorted(r[0] for r in rows)


def test_sqlite_leftovers_of_a_killed_process_are_removed(sqlite_db: Path):
    die_with_a_window_open(sqlite_db)
    assert "_hx_changes" in left_in(sqlite_db) and "_hx_u_acct" in left_in(sqlite_db)
    code, out = run_cli("state", "uninstall", f"sqlite:///{sqlite_db}", "--json")
    assert code == 0, out
    removed = json.loads(out)["removed"]
    assert "_hx_changes" in removed and "_hx_open" in removed and "_hx_u_acct" in removed
    assert left_in(sqlite_db) == []
    with sqlite3.connect(sqlite_db) as conn:  # the application's data is untouched
        assert conn.execute("SELECT bal FROM acct").fetchall() == [(1,)]
    conn.close()
    code, out = run_cli("state", "uninstall", str(sqlite_db))
    assert code == 0 and "nothing to remove" in out


def test_sqlite_refused_while_an_adapter_is_open_and_for_a_missing_file(
    sqlite_db: Path, tmp_path: Path
):
    state = hx.SQLState(str(sqlite_db))
    try:
        code, out = run_cli("state", "uninstall", str(sqlite_db))
        assert code == 2 and "has an adapter open" in out and "close it first" in out
        assert "_hx_open" in left_in(sqlite_db)  # nothing removed
    finally:
        state.close()
    code, out = run_cli("state", "uninstall", str(tmp_path / "missing.db"))
    assert code == 2 and "no file" in out and "Traceback" not in out


@pytest.fixture
def pg_db() -> Iterator[str]:
    with fresh_database() as url:
        psycopg = pytest.importorskip("psycopg")
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute("CREATE TABLE acct (id TEXT PRIMARY KEY, bal INTEGER)")
            conn.execute("INSERT INTO acct VALUES ('a', 1)")
        yield url


def pg_left(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(libpq(url), autocommit=True) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE '\\_hx\\_%'")
        triggers = conn.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE '\\_hx\\_%'")
        return sorted([r[0] for r in tables] + [r[0] for r in triggers])


def test_postgres_leftovers_of_a_killed_process_are_removed(pg_db: str):
    die_with_a_window_open(pg_db)
    assert pg_left(pg_db) == ["_hx_capture", "_hx_changes", "_hx_open"]
    deadline = time.monotonic() + 15
    while True:  # the server ends the dead process's session a moment after it died
        code, out = run_cli("state", "uninstall", pg_db, "--json")
        if code == 0 or time.monotonic() > deadline:
            break
        assert "live server sessions" in out
        time.sleep(0.2)
    assert code == 0, out
    assert json.loads(out)["removed"] == [
        "trigger _hx_capture on acct",
        "function _hx_capture",
        "table _hx_changes",
        "table _hx_open",
    ]
    assert pg_left(pg_db) == []
    code, out = run_cli("state", "uninstall", pg_db)
    assert code == 0 and "nothing to remove" in out


def test_postgres_refused_while_an_adapter_is_open(pg_db: str):
    state = hx.SQLState(pg_db)
    try:
        code, out = run_cli("state", "uninstall", pg_db)
        assert code == 2 and "live server sessions" in out and "close them first" in out
        assert "_hx_open" in pg_left(pg_db)
    finally:
        state.close()
    assert pg_left(pg_db) == []  # the last adapter out took it all
