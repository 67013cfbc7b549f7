"""An adapter opened on a database that already holds the change capture (a copy of a template
made with it, or a file another adapter left) keeps what is exactly what it would make, and
makes it again when anything differs: a trigger edited, one missing, or a trigger of the
application's created after the capture's (which must run last)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import harness as hx

from .test_state import make_db


def _triggers(path: Path) -> list[tuple[int, str, str]]:
    with sqlite3.connect(path) as c:
        return c.execute(
            "SELECT rowid, name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY rowid"
        ).fetchall()


def _schema_version(path: Path) -> int:
    with sqlite3.connect(path) as c:
        return int(c.execute("PRAGMA schema_version").fetchone()[0])


def _template(tmp_path: Path) -> Path:
    """A database left with the capture in it, as a template is built."""
    make_db(tmp_path / "template.db").discard()
    return tmp_path / "template.db"


def _captures(path: Path) -> None:
    """An adapter on ``path`` records a write made in its window with the value before."""
    state = hx.SQLState(path)
    try:
        mark = state.mark()
        state.connection.execute("UPDATE orders SET status = 'cancelled' WHERE id = 'o1'")
        assert state.changes(mark)["orders/o1"]["status"] == "pending"
        state.release(mark)
    finally:
        state.close()


def test_a_copy_with_the_capture_keeps_it_and_captures(tmp_path: Path) -> None:
    template = _template(tmp_path)
    shutil.copyfile(template, tmp_path / "copy.db")
    before = _triggers(tmp_path / "copy.db")
    assert len(before) == 6  # (insert, update and delete on the two tables)
    version = _schema_version(tmp_path / "copy.db")
    state = hx.SQLState(tmp_path / "copy.db")
    # (kept: the database's schema did not change at all, no trigger was dropped or made)
    assert _schema_version(tmp_path / "copy.db") == version
    assert _triggers(tmp_path / "copy.db") == before
    state.close()
    _captures(tmp_path / "copy.db")


def test_an_edited_capture_trigger_is_made_again(tmp_path: Path) -> None:
    """A capture trigger replaced by one that records nothing (same name) is found and the
    capture made again: the write is recorded."""
    path = _template(tmp_path)
    with sqlite3.connect(path) as c:
        c.execute("DROP TRIGGER _hx_u_orders")
        c.execute("CREATE TRIGGER _hx_u_orders AFTER UPDATE ON orders BEGIN SELECT 1; END")
    _captures(path)


def test_a_missing_capture_trigger_is_made_again(tmp_path: Path) -> None:
    path = _template(tmp_path)
    with sqlite3.connect(path) as c:
        c.execute("DROP TRIGGER _hx_u_orders")
    _captures(path)


def test_an_application_trigger_newer_than_the_capture_puts_the_capture_last(
    tmp_path: Path,
) -> None:
    """An application trigger created after the capture's on the same table: the capture is
    made again after it, so SQLite runs the capture's first (newest first) and sees every
    write the application's trigger makes."""
    path = _template(tmp_path)
    with sqlite3.connect(path) as c:
        c.execute(
            "CREATE TRIGGER app_audit AFTER UPDATE ON orders BEGIN "
            "INSERT INTO notes VALUES ('audit'); END"
        )
    state = hx.SQLState(path)
    try:
        rows = _triggers(path)
        app = next(rowid for rowid, name, _ in rows if name == "app_audit")
        ours = [rowid for rowid, name, _ in rows if name.startswith("_hx_") and "orders" in name]
        assert ours and min(ours) > app
        mark = state.mark()
        state.connection.execute("UPDATE orders SET status = 'x' WHERE id = 'o1'")
        changes = state.changes(mark)
        assert changes["orders/o1"]["status"] == "pending"
        assert any(key.startswith("notes/") for key in changes)
        state.release(mark)
    finally:
        state.close()


def test_the_last_adapter_out_removes_a_kept_capture(tmp_path: Path) -> None:
    """A capture kept from a template is removed when the last adapter closes, as one it
    made."""
    path = _template(tmp_path)
    hx.SQLState(path).close()
    assert _triggers(path) == []
