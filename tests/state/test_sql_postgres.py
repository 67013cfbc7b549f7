"""SQLState on Postgres: the same resources and change windows as on SQLite, windows scoped per
adapter, and nothing left behind after close.

These run when ``HX_TEST_POSTGRES_URL`` names a server the tests may create databases on (for
example ``postgresql+psycopg://postgres@127.0.0.1:5433/postgres``). Each test gets its own
database.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

import harness as hx  # noqa: E402
from harness.state import PostgresState  # noqa: E402

from ..forking import die_with_a_window_open  # noqa: E402

SERVER = os.environ.get("HX_TEST_POSTGRES_URL", "")

pytestmark = pytest.mark.skipif(
    not SERVER,
    reason="set HX_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db to run on Postgres",
)


def _libpq(url: str) -> str:
    _, _, rest = url.partition("://")
    return "postgresql://" + rest


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database with an orders table (JSONB column), a composite-key table (JSON
    column) and a keyless table, dropped after the test."""
    name = f"hx_{uuid.uuid4().hex[:12]}"
    base = _libpq(SERVER)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = SERVER.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, status text, items jsonb)")
        conn.execute(
            "CREATE TABLE lines (order_id text, n integer, meta json, PRIMARY KEY (order_id, n))"
        )
        conn.execute("CREATE TABLE notes (body text)")
        conn.execute(
            "INSERT INTO orders SELECT 'o' || i, 'pending', '[\"a\"]' FROM generate_series(0, 2) i"
        )
        conn.execute("INSERT INTO lines VALUES ('o1', 1, '{\"qty\": 2}'), ('o1', 2, '\"x\"')")
    try:
        yield url
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def other(url: str) -> Any:
    """A connection of the application's own (no adapter token)."""
    return psycopg.connect(_libpq(url), autocommit=True)


def hx_objects(url: str) -> list[str]:
    """The adapter's tables, functions and triggers left in the database."""
    with other(url) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE '\\_hx\\_%' "
            "UNION ALL SELECT proname FROM pg_proc WHERE proname LIKE '\\_hx\\_%' "
            "UNION ALL SELECT tgname FROM pg_trigger WHERE tgname LIKE '\\_hx\\_%'"
        ).fetchall()
    return sorted(r[0] for r in rows)


def captures(state: hx.SQLState, sql: str) -> list[str]:
    mark = state.mark()
    state.connection.execute(sql)
    keys = list(state.changes(mark))
    state.release(mark)
    return keys


def test_postgres_url_opens_a_postgres_adapter_reading_rows(pg_url: str):
    """postgresql+psycopg:// and postgresql:// give rows as dicts keyed table/primary-key,
    composite keys joined with ',', JSON and JSONB columns decoded; keyless tables untracked."""
    for url in (pg_url, _libpq(pg_url)):
        with hx.SQLState(url) as state:
            assert isinstance(state, PostgresState) and isinstance(state, hx.SQLState)
            assert state.tables == ["lines", "orders"]
            assert state.get("orders/o1") == {"id": "o1", "status": "pending", "items": ["a"]}
            assert state.get("lines/o1,1") == {"order_id": "o1", "n": 1, "meta": {"qty": 2}}
            assert state.get("lines/o1,2")["meta"] == "x"  # type: ignore[index]
            assert state.get("orders/zzz") is None
            assert state.snapshot(["orders/o0", "lines/o9,1"]) == {
                "orders/o0": {"id": "o0", "status": "pending", "items": ["a"]},
                "lines/o9,1": None,
            }
            with pytest.raises(KeyError, match="no table 'notes'"):
                state.get("notes/1")


def test_window_captures_insert_update_delete_with_before_values(pg_url: str):
    """A window lists every row written in it once, with its value when the window opened;
    applying those values puts the rows back; release empties the capture table."""
    state = hx.SQLState(pg_url)
    original = state.fingerprint()
    mark = state.mark()
    c = state.connection
    c.execute("UPDATE orders SET status = 'cancelled' WHERE id = 'o1'")
    c.execute("UPDATE orders SET status = 'gone' WHERE id = 'o1'")
    c.execute("INSERT INTO orders VALUES ('o9', 'new', '[]')")
    c.execute("DELETE FROM orders WHERE id = 'o2'")
    c.execute("UPDATE lines SET meta = '{\"qty\": 5}' WHERE order_id = 'o1' AND n = 1")
    c.execute("UPDATE orders SET id = 'o7' WHERE id = 'o0'")
    c.execute("INSERT INTO notes VALUES ('untracked')")
    changes = state.changes(mark)
    assert changes == {
        "orders/o1": {"id": "o1", "status": "pending", "items": ["a"]},
        "orders/o9": None,
        "orders/o2": {"id": "o2", "status": "pending", "items": ["a"]},
        "lines/o1,1": {"order_id": "o1", "n": 1, "meta": {"qty": 2}},
        "orders/o0": {"id": "o0", "status": "pending", "items": ["a"]},
        "orders/o7": None,
    }
    assert state.fingerprint() != original
    state.apply_changes(changes)
    assert state.fingerprint() == original
    state.release(mark)
    with other(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (0,)
    assert captures(state, "UPDATE orders SET status = 'x' WHERE id = 'o1'") == ["orders/o1"]
    state.close()


def test_nested_windows_keep_their_own_before_values(pg_url: str):
    """An inner window opened after a row was recorded sees its next write with the value at
    the inner mark; releasing it keeps the outer window's changes."""
    state = hx.SQLState(pg_url)
    c = state.connection
    outer = state.mark()
    c.execute("UPDATE orders SET status = 'first' WHERE id = 'o1'")
    inner = state.mark()
    c.execute("UPDATE orders SET status = 'second' WHERE id = 'o1'")
    assert state.changes(inner)["orders/o1"]["status"] == "first"
    state.release(inner)
    c.execute("DELETE FROM orders WHERE id = 'o2'")
    outer_changes = state.changes(outer)
    assert outer_changes["orders/o1"]["status"] == "pending"
    assert outer_changes["orders/o2"]["status"] == "pending"
    state.release(outer)
    state.close()


def test_writes_on_other_connections_are_other_writers_and_outside_windows_leave_nothing(
    pg_url: str,
):
    """A write through a connection of the application's own is seen by the open window as
    another writer's (in ``others``, never in ``changes``); writes outside any window record
    nothing."""
    state = hx.SQLState(pg_url)
    with other(pg_url) as conn:
        for n in range(50):
            conn.execute("UPDATE orders SET status = %s WHERE id = 'o1'", (f"s{n}",))
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (0,)
        mark = state.mark()
        for n in range(50):
            conn.execute("UPDATE orders SET status = %s WHERE id = 'o2'", (f"s{n}",))
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (1,)
        assert state.changes(mark) == {}
        assert state.others(mark) == {
            "orders/o2": {"id": "o2", "status": "pending", "items": ["a"]}
        }
        state.release(mark)
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (0,)
    state.close()


def test_two_adapters_see_only_their_own_sessions_writes(pg_url: str):
    """Two adapters on one database each see the writes of their own connection (and of a
    connection given their token with attribute()), not the other's."""
    first, second = hx.SQLState(pg_url), hx.SQLState(pg_url)
    assert isinstance(first, PostgresState)
    a, b = first.mark(), second.mark()
    first.connection.execute("UPDATE orders SET status = 'a' WHERE id = 'o1'")
    second.connection.execute("UPDATE orders SET status = 'b' WHERE id = 'o2'")
    with other(pg_url) as conn:
        first.attribute(conn)
        conn.execute("UPDATE orders SET status = 'a' WHERE id = 'o0'")
    assert sorted(first.changes(a)) == ["orders/o0", "orders/o1"]
    assert list(second.changes(b)) == ["orders/o2"]
    assert sorted(second.others(b)) == ["orders/o0", "orders/o1"]
    assert list(first.others(a)) == ["orders/o2"]
    first.release(a)
    assert list(second.changes(b)) == ["orders/o2"]
    second.release(b)
    first.close()
    assert captures(second, "UPDATE orders SET status = 'c' WHERE id = 'o1'") == ["orders/o1"]
    second.close()
    assert hx_objects(pg_url) == []


def _child_window(url: str, row: str, ready: Any, go: Any, out: Any) -> None:
    """In its own process: open a window, write ``row``, wait for the other, report keys."""
    state = hx.SQLState(url)
    mark = state.mark()
    ready.wait()
    state.connection.execute("UPDATE orders SET status = 'child' WHERE id = %s", (row,))
    go.wait()
    out.put((row, sorted(state.changes(mark))))
    state.release(mark)
    state.close()


def test_adapters_in_two_processes_keep_their_windows_apart(pg_url: str):
    """Two processes with windows open at once on one database each see only their own write."""
    ctx = multiprocessing.get_context("fork")
    ready, go, out = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_child_window, args=(pg_url, r, ready, go, out)) for r in ("o1", "o2")
    ]
    for p in procs:
        p.start()
    seen = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert seen == {"o1": ["orders/o1"], "o2": ["orders/o2"]}
    assert hx_objects(pg_url) == []


def test_close_removes_triggers_and_an_ended_session_is_cleaned_up(pg_url: str):
    """close() (twice even) leaves nothing; an adapter whose session ended with a window open
    is unregistered by the next one, and its rows go with it."""
    state = hx.SQLState(pg_url)
    assert "_hx_capture" in hx_objects(pg_url)
    state.close()
    state.close()
    assert hx_objects(pg_url) == []
    with other(pg_url) as conn:
        conn.execute("UPDATE orders SET status = 'x' WHERE id = 'o1'")
    crashed = hx.SQLState(pg_url)
    crashed.mark()
    crashed.connection.execute("UPDATE orders SET status = 'y' WHERE id = 'o1'")
    crashed._pg_closer.detach()  # as if its process died: no goodbye, only the session ends
    crashed.connection.close()
    state = hx.SQLState(pg_url)
    with other(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM _hx_open").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (0,)
    state.close()
    assert hx_objects(pg_url) == []


def test_refresh_tracks_tables_created_later(pg_url: str):
    """A table created after open is tracked after refresh()."""
    state = hx.SQLState(pg_url)
    state.connection.execute("CREATE TABLE later (id integer PRIMARY KEY, v text)")
    state.refresh()
    assert "later" in state.tables
    assert captures(state, "INSERT INTO later VALUES (1, 'x')") == ["later/1"]
    assert state.get("later/1") == {"id": 1, "v": "x"}
    state.close()


def test_bad_urls_and_unreachable_servers_are_configuration_errors():
    """A URL that cannot be parsed, a server that does not answer, or a SQLite-only option
    is a ConfigurationError naming the problem."""
    with pytest.raises(hx.ConfigurationError, match="could not connect to Postgres"):
        hx.SQLState("postgresql+psycopg://nobody@127.0.0.1:1/nothing")
    with pytest.raises(hx.ConfigurationError, match="not a database URL"):
        hx.SQLState("postgresql://host:notaport/db")
    with pytest.raises(hx.ConfigurationError, match="journal mode is a SQLite setting"):
        hx.SQLState(SERVER, journal_mode="wal")
    with pytest.raises(hx.ConfigurationError, match=r"synchronous='off'\): a SQLite setting"):
        hx.SQLState(SERVER, synchronous="off")
    with pytest.raises(hx.ConfigurationError, match=r"image=...\): an image starts an in-memory"):
        hx.SQLState(SERVER, image=b"SQLite format 3\x00")


def test_episode_on_postgres_state_commits_and_rolls_back(pg_url: str, tmp_path: Path):
    """Actions on a Postgres SQLState commit (their captured changes inside their declared
    scope); rolling back runs the compensations and the rows are as before."""
    from ..store.test_postgres_many_writers import cancel_action

    state = hx.SQLState(pg_url)
    cancel = cancel_action(state)
    original = state.fingerprint()
    store_url = f"sqlite:///{tmp_path}/h.db"
    with hx.Episode(state=state, store=store_url, episode_id="e1") as ep:
        cancel("o1")
        cancel("o2")
        assert state.get("orders/o2")["status"] == "cancelled"  # type: ignore[index]
        assert [t.status for t in hx.Store(store_url).transactions("e1")] == ["committed"] * 2
        ep.rollback()
    assert state.fingerprint() == original
    store = hx.Store(store_url)
    statuses = [t.status for t in store.transactions("e1")]
    assert statuses.count("compensated") == 2 and "committed" not in statuses, statuses
    assert store.verify().ok
    store.close()
    state.close()


def test_a_killed_process_window_stops_recording_other_writers_when_its_lease_ends(pg_url: str):
    """A process killed with a window open leaves its registration: other sessions' writes are
    recorded once per row while its window's lease lasts, and not at all once it has run out."""
    die_with_a_window_open(pg_url)
    with other(pg_url) as conn:
        for n in range(30):
            conn.execute("UPDATE orders SET status = %s WHERE id = %s", (f"s{n}", f"o{n % 3}"))
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (3,)
        conn.execute("UPDATE _hx_open SET until = now() - interval '1 second'")
        conn.execute("DELETE FROM _hx_changes")
        for n in range(30):
            conn.execute("UPDATE orders SET status = %s WHERE id = 'o1'", (f"t{n}",))
        assert conn.execute("SELECT count(*) FROM _hx_changes").fetchone() == (0,)
