"""State adapters: reads, change tracking with before values, and clear errors."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

import harness as hx


def make_db(path: Path, rows: int = 3) -> hx.SQLState:
    """A SQLite database with an orders table (JSON column) and a keyless log table."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT, items JSON)")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.executemany(
        "INSERT INTO orders VALUES (?, ?, ?)",
        [(f"o{i}", "pending", '["a"]') for i in range(rows)],
    )
    conn.commit()
    conn.close()
    return hx.SQLState(f"sqlite:///{path}")


def test_dict_state_tracks_writes_with_before_values():
    """DictState reports exactly the keys written in a window, with their earlier values."""
    state = hx.DictState({"a": 1, "b": 2})
    mark = state.mark()
    state["a"] = 10
    state["a"] = 11
    state["c"] = 3
    del state["b"]
    assert state.changes(mark) == {"a": 1, "c": None, "b": 2}
    state.release(mark)
    assert state.snapshot(["a", "b", "c"]) == {"a": 11, "b": None, "c": 3}


def test_dict_state_reads_are_copies():
    """Mutating what get() returned does not change the state behind the adapter."""
    state = hx.DictState({"a": {"x": 1}})
    state.get("a")["x"] = 99
    state["a"]["x"] = 99
    assert state.get("a") == {"x": 1}


def test_sql_state_reads_rows_and_decodes_json(tmp_path: Path):
    """SQLState returns rows as dicts keyed table/primary-key, JSON columns decoded."""
    state = make_db(tmp_path / "s.db")
    assert state.get("orders/o1") == {"id": "o1", "status": "pending", "items": ["a"]}
    assert state.get("orders/zzz") is None
    with pytest.raises(KeyError, match="no table 'nope'"):
        state.get("nope/1")


def test_sql_state_captures_insert_update_delete(tmp_path: Path):
    """Triggers capture every written row with its value before the window."""
    state = make_db(tmp_path / "s.db")
    mark = state.mark()
    c = state.connection
    c.execute("UPDATE orders SET status = 'cancelled' WHERE id = 'o1'")
    c.execute("UPDATE orders SET status = 'gone' WHERE id = 'o1'")
    c.execute("INSERT INTO orders VALUES ('o9', 'new', '[]')")
    c.execute("DELETE FROM orders WHERE id = 'o2'")
    c.execute("INSERT INTO notes VALUES ('hello')")
    changes = state.changes(mark)
    assert changes["orders/o1"]["status"] == "pending"
    assert changes["orders/o9"] is None
    assert changes["orders/o2"] == {"id": "o2", "status": "pending", "items": ["a"]}
    assert set(changes) == {"orders/o1", "orders/o9", "orders/o2", "notes/1"}
    state.release(mark)
    assert state.changes(state.mark()) == {}


def test_sql_state_change_capture_ignores_untouched_rows(tmp_path: Path):
    """A window's changes list only the rows written, however big the table."""
    state = make_db(tmp_path / "s.db", rows=5000)
    mark = state.mark()
    state.connection.execute("UPDATE orders SET status = 'x' WHERE id = 'o4321'")
    assert list(state.changes(mark)) == ["orders/o4321"]


def test_sql_state_primary_key_change_reports_both_keys(tmp_path: Path):
    """Renaming a row's key shows the old key removed and the new key created."""
    state = make_db(tmp_path / "s.db")
    mark = state.mark()
    state.connection.execute("UPDATE orders SET id = 'o7' WHERE id = 'o0'")
    changes = state.changes(mark)
    assert changes["orders/o0"]["id"] == "o0" and changes["orders/o7"] is None


def test_sql_state_refuses_what_it_cannot_track(tmp_path: Path):
    """A non-SQLite URL or a non-database file is a clear ConfigurationError."""
    with pytest.raises(hx.ConfigurationError, match="implemented for SQLite"):
        hx.SQLState("postgresql://localhost/x")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 200)
    with pytest.raises(hx.ConfigurationError, match="could not open"):
        hx.SQLState(bad)


def test_sql_state_fingerprint_follows_content(tmp_path: Path):
    """The fingerprint changes with the content and comes back when the content does."""
    state = make_db(tmp_path / "s.db")
    before = state.fingerprint()
    state.connection.execute("UPDATE orders SET status = 'x' WHERE id = 'o1'")
    assert state.fingerprint() != before
    state.connection.execute("UPDATE orders SET status = 'pending' WHERE id = 'o1'")
    assert state.fingerprint() == before


def test_file_state_tracks_created_changed_deleted(tmp_path: Path):
    """FileState reports created, modified and deleted files with their earlier content."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("one")
    (tmp_path / "b.txt").write_text("two")
    state = hx.FileState(tmp_path)
    mark = state.mark()
    (tmp_path / "src" / "a.txt").write_text("ONE!")
    (tmp_path / "b.txt").unlink()
    (tmp_path / "c.txt").write_text("new")
    assert state.changes(mark) == {"src/a.txt": "one", "b.txt": "two", "c.txt": None}
    assert state.get("src/a.txt") == "ONE!" and state.get("b.txt") is None


def test_file_state_sees_same_size_rewrite_within_a_tick(tmp_path: Path):
    """A rewrite of the same size and timestamp is still detected (racy-clean check)."""
    f = tmp_path / "a.txt"
    f.write_text("aaaa")
    state = hx.FileState(tmp_path)
    st = f.stat()
    mark = state.mark()
    f.write_text("bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert state.changes(mark) == {"a.txt": "aaaa"}


def test_file_state_keys_stay_inside_the_folder(tmp_path: Path):
    """A key escaping the folder is refused; a missing folder is a ConfigurationError."""
    state = hx.FileState(tmp_path)
    with pytest.raises(KeyError, match="outside the folder"):
        state.get("../etc/passwd")
    with pytest.raises(hx.ConfigurationError, match="not a folder"):
        hx.FileState(tmp_path / "missing")


def test_file_state_binary_files_are_digests(tmp_path: Path):
    """A non-UTF-8 file reads as its sha256 digest."""
    (tmp_path / "x.bin").write_bytes(b"\xff\xfe\x00")
    assert hx.FileState(tmp_path).get("x.bin").startswith("sha256:")


def test_sql_state_inside_a_transaction(tmp_path: Path):
    """A SQL action with a scope, a postcondition and a compensation commits and rolls back."""
    state = make_db(tmp_path / "s.db")

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id)
    def cancel(order_id: str) -> None:
        """Cancel an order."""
        state.connection.execute("UPDATE orders SET status='cancelled' WHERE id=?", (order_id,))

    @cancel.postcondition
    def done(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"orders/{ctx.args.order_id}"]["status"] == "cancelled")

    @cancel.compensation
    def undo(ctx: hx.Context) -> None:
        row = ctx.before[f"orders/{ctx.args.order_id}"]
        state.connection.execute(
            "UPDATE orders SET status=? WHERE id=?", (row["status"], row["id"])
        )

    original = state.fingerprint()
    with hx.Episode(state=state, store=tmp_path / "h.db") as ep:
        cancel("o1")
        cancel("o2")
        assert state.get("orders/o2")["status"] == "cancelled"  # type: ignore[index]
        ep.rollback()
    assert state.fingerprint() == original


def test_sql_state_nested_windows_keep_the_outer_changes(tmp_path: Path):
    """Releasing an inner window opened at the same point keeps the outer window's changes."""
    state = make_db(tmp_path / "s.db")
    outer = state.mark()
    inner = state.mark()
    state.connection.execute("UPDATE orders SET status = 'x' WHERE id = 'o1'")
    state.release(inner)
    assert list(state.changes(outer)) == ["orders/o1"]


def test_file_state_nested_windows_keep_their_own_before_values(tmp_path: Path):
    """An inner window does not move the outer window's before values."""
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("1")
    state = hx.FileState(tmp_path)
    outer = state.mark()
    (tmp_path / "a").write_text("2")
    inner = state.mark()
    (tmp_path / "b").write_text("2")
    assert state.changes(inner) == {"b": "1"}
    state.release(inner)
    assert state.changes(outer) == {"a": "1", "b": "1"}
