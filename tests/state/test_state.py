"""State adapters: reads, change tracking with before values, and clear errors."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

import harness as hx

from ..forking import die_with_a_window_open


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


def test_dict_state_names_a_copy_changed_in_place_and_not_written_back():
    """A copy read in a window, changed in place and not written back, is named by
    unwritten(), once."""
    state = hx.DictState({"k": {"x": 0}, "other": {"x": 0}, "n": 1})
    outer = state.mark()
    inner = state.mark()
    order = state["k"]
    order["x"] = 1
    state.get("other")  # read and left alone
    state["n"] = 2
    assert state.changes(inner) == {"n": 1}
    assert state.unwritten(inner) == ["k"]
    assert state.unwritten(inner) == []
    state.release(inner)
    assert state.changes(outer) == {"n": 1}
    state.release(outer)


def test_dict_state_copies_written_back_or_changed_outside_windows_are_fine():
    """A copy written back (then overwritten), moved to another key, popped, or changed
    outside any window is no error."""
    state = hx.DictState({"a": {"x": 0}, "b": {"x": 0}, "c": [1], "d": {"x": 0}})
    state.get("c").append(2)  # outside a window: nothing is remembered
    mark = state.mark()
    a = state["a"]
    a["x"] = 1
    state["a"] = a
    state["a"] = {"x": 0, "undone": True}  # as a compensation would
    d = state["d"]
    d["x"] = 1
    state["archive/d"] = d
    del state["d"]
    b = state.pop("b")
    b["x"] = 1
    assert "a" in state and "b" not in state
    c = state["c"]
    c.append(2)
    state["c"] = [*c, 3]  # a new value derived from the changed copy: written back
    state["c"] = [1]
    assert set(state.changes(mark)) == {"a", "b", "c", "d", "archive/d"}
    assert state.unwritten(mark) == []
    state.release(mark)
    assert state.to_dict() == {"a": {"x": 0, "undone": True}, "c": [1], "archive/d": {"x": 1}}


def test_sql_state_reads_rows_and_decodes_json(tmp_path: Path):
    """SQLState returns rows as dicts keyed table/primary-key, JSON columns decoded."""
    state = make_db(tmp_path / "s.db")
    assert state.get("orders/o1") == {"id": "o1", "status": "pending", "items": ["a"]}
    assert state.get("orders/zzz") is None
    with pytest.raises(KeyError, match="no table 'nope'"):
        state.get("nope/1")


def test_sql_state_addresses_composite_and_keyless_rows(tmp_path: Path):
    """A composite key is its values joined with ','; a key with another number of values is
    a KeyError naming the table's key; a table without one is addressed by its rowid."""
    state = make_db(tmp_path / "s.db")
    state.connection.execute(
        "CREATE TABLE lines (order_id TEXT, n INT, qty INT, PRIMARY KEY (order_id, n))"
    )
    state.connection.execute("INSERT INTO lines VALUES ('o1', 2, 5)")
    state.connection.execute("INSERT INTO notes VALUES ('hello')")
    state.refresh()
    assert state.get("lines/o1,2") == {"order_id": "o1", "n": 2, "qty": 5}
    with pytest.raises(KeyError, match="table 'lines' has key order_id,n"):
        state.get("lines/o1")
    assert state.get("notes/1") == {"body": "hello"}
    state.close()


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
        hx.SQLState("mysql://localhost/x")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 200)
    with pytest.raises(hx.ConfigurationError, match="could not open"):
        hx.SQLState(bad)


def test_sql_state_refuses_a_missing_file_unless_asked_to_create(tmp_path: Path):
    """A missing database file is refused, naming the file and create=True, and nothing is
    created; create=True creates it; an in-memory database needs no file."""
    missing = tmp_path / "typo.db"
    for url in (missing, str(missing), f"sqlite:///{missing}"):
        with pytest.raises(hx.ConfigurationError, match=r"typo\.db.*pass create=True"):
            hx.SQLState(url)
    assert not missing.exists()
    hx.SQLState(missing, create=True).close()
    assert missing.is_file()
    for memory in (":memory:", "sqlite://", "sqlite:///:memory:"):
        with hx.SQLState(memory) as state:
            state.connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
            state.refresh()
            assert captures(state, "INSERT INTO t VALUES (1)") == ["t/1"]


def test_adapters_refuse_wrong_argument_types(tmp_path: Path):
    """SQLState and FileState name a wrongly typed argument and what to give instead."""
    make_db(tmp_path / "s.db").close()
    for bad in (42, None, b"s.db", ["s.db"]):
        with pytest.raises(hx.ConfigurationError, match="give a sqlite:/// URL or a file path"):
            hx.SQLState(bad)  # type: ignore[arg-type]
        with pytest.raises(hx.ConfigurationError, match="give a folder path"):
            hx.FileState(bad)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match=r"create='yes'\): give True or False"):
        hx.SQLState(tmp_path / "s.db", create="yes")  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match=r"journal_mode='fast'\): give one of"):
        hx.SQLState(tmp_path / "s.db", journal_mode="fast")
    with pytest.raises(hx.ConfigurationError, match=r"synchronous='fast'\): give one of"):
        hx.SQLState(tmp_path / "s.db", synchronous="fast")
    for ignore in (".git", None, 5, [1], [["x"]]):
        with pytest.raises(hx.ConfigurationError, match="give a list of file or folder names"):
            hx.FileState(tmp_path, ignore=ignore)  # type: ignore[arg-type]
    assert hx.FileState(tmp_path, ignore=(n for n in (".git", "x"))).ignore == {".git", "x"}


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


def test_file_state_links_are_resources_of_their_own(tmp_path: Path):
    """Creating, retargeting and removing a link (dangling or pointing outside the folder) is
    a change of its key, read back as the link's text, never its target's content."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("do not read")
    state = hx.FileState(root)
    secret = f"symlink:{outside / 'secret'}"
    steps = [  # (what the tool does, the key, its value before, its value after)
        (lambda: os.symlink(outside / "secret", root / "out"), "out", None, secret),
        (lambda: os.symlink("missing", root / "dangling"), "dangling", None, "symlink:missing"),
        (
            lambda: (os.unlink(root / "out"), os.symlink("b", root / "out")),
            "out",
            secret,
            "symlink:b",
        ),
        (lambda: os.unlink(root / "dangling"), "dangling", "symlink:missing", None),
    ]
    for step, key, before, after in steps:
        mark = state.mark()
        step()
        changes = state.changes(mark)
        state.release(mark)
        assert changes == {key: before}
        assert state.get(key) == after


def test_file_state_action_creating_a_link_commits(tmp_path: Path):
    """A tool that links out of the folder commits, with the link in its recorded diff."""
    root = tmp_path / "root"
    root.mkdir()

    @hx.action(writes=["link"], idempotency_key=lambda a: "link")
    def make_link() -> None:
        """Link to the folder above."""
        os.symlink(tmp_path, root / "link")

    with hx.Episode(state=hx.FileState(root), store=tmp_path / "h.db") as ep:
        make_link()
    assert ep.outcome == "committed"
    (txn,) = hx.Store(tmp_path / "h.db").transactions(ep.id)
    assert txn.status == "committed" and f"symlink:{tmp_path}" in txn.diff["link"][1]


def test_file_state_never_reads_outside_the_folder(tmp_path: Path):
    """Links out of the folder, to a file or a folder, are neither followed by the scan nor by
    get(): their values are the links' text, and the outside files are never read."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("do not read")
    (root / "a.txt").write_text("a")
    os.symlink(outside / "secret", root / "file-link")
    os.symlink(outside, root / "dir-link")
    state = hx.FileState(root)
    assert state.to_dict() == {
        "a.txt": "a",
        "dir-link": f"symlink:{outside}",
        "file-link": f"symlink:{outside / 'secret'}",
    }
    assert state.get("file-link") == f"symlink:{outside / 'secret'}"
    assert state.get("dir-link/secret") is None
    before = state.fingerprint()
    (outside / "secret").write_text("changed behind the link")
    assert state.fingerprint() == before


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


def hx_objects(path: Path) -> list[str]:
    """The names of the tables, indexes and triggers the adapter adds (``_hx_...``)."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '%hx%'").fetchall()
    return sorted(r[0] for r in rows)


def change_rows(path: Path) -> int:
    """How many rows the change table holds (0 when it does not exist)."""
    with sqlite3.connect(path) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = '_hx_changes'").fetchone():
            return 0
        return int(conn.execute("SELECT COUNT(*) FROM _hx_changes").fetchone()[0])


def captures(state: hx.SQLState, sql: str) -> list[str]:
    """The keys a change window sees when ``sql`` runs on the adapter's connection."""
    mark = state.mark()
    state.connection.execute(sql)
    keys = list(state.changes(mark))
    state.release(mark)
    return keys


def update_many(path: Path, times: int, *, rows: int = 1) -> None:
    """The application's own writes, through a connection of its own."""
    with sqlite3.connect(path) as conn:
        for n in range(times):
            conn.execute("UPDATE orders SET status = ? WHERE id = ?", (f"s{n}", f"o{n % rows}"))
            conn.commit()


def test_sql_state_close_removes_what_it_installed(tmp_path: Path):
    """After close(), twice even, nothing of the adapter is left and later writes leave nothing."""
    path = tmp_path / "s.db"
    state = make_db(path)
    assert captures(state, "UPDATE orders SET status = 'x' WHERE id = 'o1'") == ["orders/o1"]
    state.close()
    state.close()
    assert hx_objects(path) == []
    update_many(path, 500)
    assert hx_objects(path) == [] and change_rows(path) == 0


def test_sql_state_discard_closes_and_leaves_what_it_installed(tmp_path: Path):
    """discard() closes the connection without removing the triggers and tables (a file
    deleted next); a later close() does nothing, and another adapter opens the file as usual."""
    path = tmp_path / "s.db"
    state = make_db(path)
    installed = hx_objects(path)
    state.discard()
    state.close()
    with pytest.raises(sqlite3.ProgrammingError):
        state.connection.execute("SELECT 1")
    assert installed and hx_objects(path) == installed
    again = hx.SQLState(path)
    assert captures(again, "UPDATE orders SET status = 'y' WHERE id = 'o1'") == ["orders/o1"]
    again.close()
    assert hx_objects(path) == []


def test_sql_state_keeps_the_journal_mode_unless_asked(tmp_path: Path):
    """The database keeps its journal mode; journal_mode= changes it when asked."""
    path = tmp_path / "s.db"
    make_db(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    hx.SQLState(path, journal_mode="wal").close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sql_state_synchronous(tmp_path: Path):
    """NORMAL in WAL mode unless synchronous= says otherwise (SQLite's default, FULL, in the
    rollback-journal modes)."""
    path = tmp_path / "s.db"
    make_db(path).close()
    for journal, synchronous, expected in (
        (None, None, 2),
        ("wal", None, 1),
        ("wal", "off", 0),
        ("delete", "NORMAL", 1),
    ):
        with hx.SQLState(path, journal_mode=journal, synchronous=synchronous) as state:
            assert state.connection.execute("PRAGMA synchronous").fetchone()[0] == expected


def test_an_image_starts_an_in_memory_database_of_its_own(tmp_path: Path):
    """SQLState(":memory:", image=...) starts from a database file's bytes (a WAL file's too):
    rows read, writes captured and undone in memory, the file and the bytes untouched, and two
    adapters from one image apart."""
    path = tmp_path / "s.db"
    make_db(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=wal")
    image = path.read_bytes()
    assert image[18:20] == b"\x02\x02"  # a WAL-mode file
    with (
        hx.SQLState(":memory:", image=image) as one,
        hx.SQLState(":memory:", image=bytearray(image)) as two,
    ):
        assert one.get("orders/o1") == {"id": "o1", "status": "pending", "items": ["a"]}
        # (its pages are in memory already: a small page cache, not SQLite's 2 MiB)
        assert one.connection.execute("PRAGMA cache_size").fetchone()[0] == -128
        mark = one.mark()
        one.connection.execute("UPDATE orders SET status = 'paid' WHERE id = 'o1'")
        one.connection.execute("INSERT INTO orders VALUES ('o9', 'new', '[]')")
        before = one.changes(mark)  # the rows as they were
        assert before == {
            "orders/o1": {"id": "o1", "status": "pending", "items": ["a"]},
            "orders/o9": None,
        }
        assert two.get("orders/o1")["status"] == "pending"
        one.apply_changes(before)
        one.release(mark)
        assert one.get("orders/o1")["status"] == "pending" and one.get("orders/o9") is None
        one.connection.execute("DELETE FROM orders")
        assert two.get("orders/o2") is not None
    assert path.read_bytes() == image
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 3
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not {t for t in tables if t.startswith("_hx_")}


def test_a_bad_image_is_refused_naming_the_fix(tmp_path: Path):
    """An image with a file path, of the wrong type, not a SQLite file or corrupt past its
    header is a ConfigurationError saying what to give."""
    path = tmp_path / "s.db"
    make_db(path).close()
    image = path.read_bytes()
    with pytest.raises(hx.ConfigurationError, match="give url=':memory:' with it"):
        hx.SQLState(path, image=image)
    with pytest.raises(hx.ConfigurationError, match="give the bytes of a SQLite database file"):
        hx.SQLState(":memory:", image="s.db")  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="not a SQLite database file"):
        hx.SQLState(":memory:", image=b"PK\x03\x04 a zip, say" * 20)
    corrupt = image[:100] + b"\xff" * (len(image) - 100)
    with pytest.raises(hx.ConfigurationError, match="could not open the database"):
        hx.SQLState(":memory:", image=corrupt)
    assert path.read_bytes() == image


def test_a_table_altered_between_opens_is_read_again(tmp_path: Path):
    """Adapters remember each table's columns by its name and CREATE statement: a column
    added since the last open is in the rows read and in the changes a window records."""
    path = tmp_path / "s.db"
    make_db(path).close()
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    with hx.SQLState(copy) as state:  # (the copy's tables as they were, remembered)
        assert state.get("orders/o1") == {"id": "o1", "status": "pending", "items": ["a"]}
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE orders ADD COLUMN note TEXT")
    conn.execute("UPDATE orders SET note = 'gift' WHERE id = 'o1'")
    conn.commit()
    conn.close()
    with hx.SQLState(path) as state:
        assert state.get("orders/o1") == {
            "id": "o1",
            "status": "pending",
            "items": ["a"],
            "note": "gift",
        }
        mark = state.mark()
        state.connection.execute("UPDATE orders SET note = 'rush' WHERE id = 'o2'")
        state.connection.commit()
        before = {"id": "o2", "status": "pending", "items": ["a"], "note": None}
        assert state.changes(mark) == {"orders/o2": before}


def test_sql_state_records_nothing_outside_windows(tmp_path: Path):
    """While open, writes outside a change window leave no row in the change table."""
    path = tmp_path / "s.db"
    state = make_db(path)
    update_many(path, 500, rows=3)
    assert change_rows(path) == 0
    mark = state.mark()
    state.release(mark)
    update_many(path, 100, rows=3)
    assert change_rows(path) == 0
    state.close()


def test_sql_state_window_sees_other_connections_as_other_writers_and_is_emptied(tmp_path: Path):
    """A window sees every write another connection makes in it as another writer's (in
    ``others``, never in ``changes``), records each row once however often it is written, and
    the rows are deleted when the window is released."""
    path = tmp_path / "s.db"
    state = make_db(path)
    mark = state.mark()
    update_many(path, 300, rows=2)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO orders VALUES ('o9', 'new', '[]')")
    assert change_rows(path) == 3
    assert state.changes(mark) == {}
    assert state.others(mark) == {
        "orders/o0": {"id": "o0", "status": "pending", "items": ["a"]},
        "orders/o1": {"id": "o1", "status": "pending", "items": ["a"]},
        "orders/o9": None,
    }
    state.release(mark)
    assert change_rows(path) == 0
    state.close()


def test_sql_state_nested_windows_opened_later_see_rewrites(tmp_path: Path):
    """A window opened after a row was already recorded for an outer window still sees that
    row's next write, with the value it had when the inner window opened."""
    state = make_db(tmp_path / "s.db")
    c = state.connection
    outer = state.mark()
    c.execute("UPDATE orders SET status = 'first' WHERE id = 'o1'")
    inner = state.mark()
    c.execute("UPDATE orders SET status = 'second' WHERE id = 'o1'")
    c.execute("UPDATE orders SET status = 'third' WHERE id = 'o1'")
    assert state.changes(inner)["orders/o1"]["status"] == "first"
    state.release(inner)
    c.execute("DELETE FROM orders WHERE id = 'o2'")
    outer_changes = state.changes(outer)
    assert outer_changes["orders/o1"]["status"] == "pending"
    assert outer_changes["orders/o2"]["status"] == "pending"
    state.release(outer)
    state.close()


def test_sql_state_leftovers_of_a_crash_stay_bounded_and_are_cleaned(tmp_path: Path):
    """Triggers left by a process killed inside a window record a row once, not per write, and
    the next adapter cleans them up and removes them on close."""
    path = tmp_path / "s.db"
    make_db(path).close()
    die_with_a_window_open(path)
    assert "_hx_changes" in hx_objects(path)
    update_many(path, 500)
    assert change_rows(path) == 1
    state = hx.SQLState(path)  # the dead process's window is closed
    assert change_rows(path) == 0
    assert captures(state, "UPDATE orders SET status = 'x' WHERE id = 'o2'") == ["orders/o2"]
    state.close()
    assert hx_objects(path) == []


def test_sql_state_replaces_unguarded_triggers_left_behind(tmp_path: Path):
    """A capture trigger that fires on every write, left by an earlier version, is replaced
    on open and removed on close."""
    path = tmp_path / "s.db"
    make_db(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE _hx_changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, "
            "pk TEXT NOT NULL, before TEXT)"
        )
        conn.execute(
            'CREATE TRIGGER "_hx_u_orders" AFTER UPDATE ON orders BEGIN INSERT INTO '
            "_hx_changes(tbl, pk, before) VALUES ('orders', OLD.id, NULL); END"
        )
    update_many(path, 10)
    assert change_rows(path) == 10
    state = hx.SQLState(path)
    assert change_rows(path) == 0
    update_many(path, 10)
    assert change_rows(path) == 0
    state.close()
    assert "_hx_u_orders" not in hx_objects(path) and "_hx_changes" not in hx_objects(path)


def test_sql_state_two_adapters_share_the_capture(tmp_path: Path):
    """Closing one of two adapters on a file keeps the other's capture; the last removes it."""
    path = tmp_path / "s.db"
    first = make_db(path)
    second = hx.SQLState(path)
    first.close()
    assert captures(second, "UPDATE orders SET status = 'x' WHERE id = 'o1'") == ["orders/o1"]
    second.close()
    assert hx_objects(path) == []


def test_sql_state_quotes_names_everywhere(tmp_path: Path):
    """Tables and columns with quotes in their names are tracked like any other."""
    path = tmp_path / "q.db"
    with sqlite3.connect(path) as conn:
        conn.execute('CREATE TABLE "o\'brien" ("it\'s" TEXT PRIMARY KEY, "say ""hi""" TEXT)')
        conn.execute("INSERT INTO \"o'brien\" VALUES ('k', 'v')")
    state = hx.SQLState(path)
    mark = state.mark()
    state.connection.execute('UPDATE "o\'brien" SET "say ""hi""" = \'w\'')
    assert state.changes(mark) == {"o'brien/k": {"it's": "k", 'say "hi"': "v"}}
    state.release(mark)
    state.close()
    assert hx_objects(path) == []


def test_sql_state_table_name_cannot_inject_sql(tmp_path: Path):
    """A table whose name closes the string literal and adds a statement is only a name: its
    writes are captured and the statement in its name never runs, during a window or after."""
    path = tmp_path / "evil.db"
    evil = "x', 0, NULL); DELETE FROM victim; SELECT max('"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE victim (id INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO victim VALUES (?)", [(1,), (2,), (3,)])
        conn.execute(f'CREATE TABLE "{evil}" (v TEXT)')
    state = hx.SQLState(path)
    mark = state.mark()
    state.connection.execute(f"INSERT INTO \"{evil}\" VALUES ('a')")
    with sqlite3.connect(path) as conn:
        conn.execute(f"INSERT INTO \"{evil}\" VALUES ('c')")
    assert state.changes(mark) == {f"{evil}/1": None}
    assert state.others(mark) == {f"{evil}/2": None}
    state.release(mark)
    state.close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"INSERT INTO \"{evil}\" VALUES ('b')")
        assert conn.execute("SELECT COUNT(*) FROM victim").fetchone()[0] == 3


def test_sql_state_dropped_without_close_cleans_up(tmp_path: Path):
    """An adapter garbage-collected without close() removes its triggers and tables too."""
    path = tmp_path / "s.db"
    state = make_db(path)
    state.release(state.mark())
    del state
    assert hx_objects(path) == []


def test_sql_state_rows_holding_blobs_are_captured_and_written_as_usual(tmp_path: Path):
    """A row with a BLOB column can be written while a window is open (the application's write
    does not fail), and its before value comes back as bytes, equal to what get() read."""
    path = tmp_path / "b.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE files (id TEXT PRIMARY KEY, data BLOB, note TEXT)")
    conn.execute("INSERT INTO files VALUES ('f1', ?, '[\"blob\", \"00\"]')", (b"\x00\xff",))
    conn.commit()
    conn.close()
    state = hx.SQLState(f"sqlite:///{path}")
    before = state.get("files/f1")
    mark = state.mark()
    state.connection.execute("UPDATE files SET data = ? WHERE id = 'f1'", (b"\x01",))
    changes = state.changes(mark)
    assert changes["files/f1"] == before
    assert before == {"id": "f1", "data": b"\x00\xff", "note": '["blob", "00"]'}
    state.release(mark)
    assert state.get("files/f1")["data"] == b"\x01"  # type: ignore[index]
    state.close()


def test_sql_state_own_writes_are_flagged_row_by_row_whatever_the_statement(tmp_path: Path):
    """Writes through the adapter's connection are its own row by row (SQLite runs a table's
    TEMP triggers before its own, which the flag relies on), an INSERT OR IGNORE that writes
    nothing leaves no flag behind, and the next write by another connection is another's."""
    path = tmp_path / "s.db"
    state = make_db(path)
    c = state.connection
    mark = state.mark()
    c.execute("UPDATE orders SET status = 'x'")  # every row, in one statement
    c.execute("INSERT OR IGNORE INTO orders VALUES ('o1', 'dup', '[]')")  # ignored
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO orders VALUES ('o7', 'theirs', '[]')")
    c.execute(
        "INSERT INTO orders VALUES ('o8', 'mine', '[]') "
        "ON CONFLICT(id) DO UPDATE SET status = 'upserted'"
    )
    c.execute(
        "INSERT INTO orders VALUES ('o1', 'again', '[]') "
        "ON CONFLICT(id) DO UPDATE SET status = 'upserted'"
    )
    assert sorted(state.changes(mark)) == ["orders/o0", "orders/o1", "orders/o2", "orders/o8"]
    assert list(state.others(mark)) == ["orders/o7"]
    state.release(mark)
    state.close()


def test_sql_state_own_writes_stay_its_own_after_the_schema_changes(tmp_path: Path):
    """A table created after the adapter opened (and given triggers by another adapter that
    opened since), or an application trigger added later that writes a row of its own: the
    adapter's writes are still its own, each row recorded with its value before the write."""
    path = tmp_path / "s.db"
    state = make_db(path)
    app = sqlite3.connect(path, isolation_level=None)
    app.execute("CREATE TABLE ledger (id INTEGER PRIMARY KEY, memo TEXT)")
    hx.SQLState(path).close()  # another adapter opens the file and leaves
    app.execute(
        "CREATE TRIGGER app_audit AFTER UPDATE ON orders BEGIN "
        "INSERT INTO ledger(memo) VALUES ('touched ' || NEW.id); "
        "UPDATE orders SET items = '[\"b\"]' WHERE id = NEW.id AND items = '[\"a\"]'; END"
    )
    mark = state.mark()
    state.connection.execute("INSERT INTO ledger(memo) VALUES ('mine')")
    state.connection.execute("UPDATE orders SET status = 'x' WHERE id = 'o1'")
    changes = state.changes(mark)
    assert sorted(changes) == ["ledger/1", "ledger/2", "orders/o1"]
    assert changes["orders/o1"] == {"id": "o1", "status": "pending", "items": ["a"]}
    assert state.others(mark) == {}
    state.release(mark)
    app.close()
    state.close()


def test_sql_state_a_window_past_its_lease_keeps_its_own_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A call running longer than the window's lease: another adapter's short call ending
    meanwhile does not empty the change table under it, so its writes are still seen."""
    import harness.state.sql as sql

    monkeypatch.setattr(sql, "_LEASE_DAYS", -1.0)  # every lease has already run out
    path = tmp_path / "s.db"
    first, second = make_db(path), hx.SQLState(path)
    mark = first.mark()
    first.connection.execute("UPDATE orders SET status = 'x' WHERE id = 'o1'")
    second.release(second.mark())
    first.connection.execute("UPDATE orders SET status = 'y' WHERE id = 'o2'")
    assert sorted(first.changes(mark)) == ["orders/o1", "orders/o2"]
    first.release(mark)
    first.close()
    second.close()
