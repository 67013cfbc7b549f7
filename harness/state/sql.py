"""``SQLState``: rows of a SQL database as resources ``table/primary-key``.

Changes are captured by triggers into a side table (``_hx_changes``) that records each written
row's key, its value before the write, and *who* wrote it, so the diff of one action reads only
the rows that action touched, whatever the size of the database, and a write another program
made meanwhile is never taken for the action's.

Who wrote a row: the adapter puts ``TEMP`` triggers on its own :attr:`SQLState.connection` (and
on connections given to :meth:`SQLState.attribute`). SQLite's ``TEMP`` triggers fire only for
writes through the connection that created them, and before the table's own triggers, so for
each row written on it they flag the adapter as the writer, and the database-wide trigger that
records the write takes the flag (and clears it). A write through any other connection is
recorded as nobody's: another writer's. SQLite lets one connection write at a time, so a flag
is never read by another writer's write.

What the adapter adds to the user's database is kept small, bounded and taken away again:

- ``_hx_open`` has one row per open adapter: who it is, how many change windows it has open,
  and until when its latest window may record other writers (a lease, renewed as the window is
  used). The triggers fire only while some adapter has a window open, so the application's own
  writes between actions cost nothing and leave nothing. An adapter's own writes are recorded
  only through its live connection's ``TEMP`` triggers, which die with the process; the writes of
  other connections stop being recorded when the lease of a window whose process died runs out
  (:data:`WINDOW_LEASE`), even if no adapter ever opens the database again.
- A trigger records a row at most once per writer and window: a write to a row already
  recorded for the same writer since the latest window opened is skipped.
- ``_hx_changes`` is emptied when no window is open, and ``close()`` by the last adapter on the
  database drops the triggers and both tables. Opening cleans up after adapters of this host
  whose process has died, and replaces triggers left by an earlier version.
  ``hx.SQLState.uninstall("app.db")`` removes all of it by hand.

The bookkeeping runs on :attr:`SQLState.connection`, the one tools are given, so it never waits
for a transaction a tool holds open on it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sqlite3
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .._json import digest
from ..errors import ConfigurationError
from .base import WINDOW_LEASE, split_resource
from .postgres import PostgresCapture, is_postgres
from .postgres import uninstall as postgres_uninstall

__all__ = ["PostgresState", "SQLState"]

CHANGES = "_hx_changes"
OPEN = "_hx_open"
_TRIGGER_PREFIXES = ("_hx_i_", "_hx_u_", "_hx_d_")
_OWN_PREFIXES = ("_hx_oi_", "_hx_ou_", "_hx_od_")
_JOURNAL_MODES = frozenset({"delete", "truncate", "persist", "memory", "wal", "off"})
_SYNCHRONOUS = frozenset({"off", "normal", "full", "extra"})
_LEASE_DAYS = WINDOW_LEASE / 86400.0
# A window is live when some adapter counts one and its lease holds; a flagged writer (an
# adapter's own connection, mid-write) is always recorded. The latest mark among open windows
# bounds what a trigger must record (a row recorded after it is already in every open window).
_LIVE = "(windows > 0 AND until > julianday('now'))"
_WINDOW_OPEN = f"EXISTS (SELECT 1 FROM {OPEN} WHERE busy > 0 OR {_LIVE})"
_LATEST_MARK = f"(SELECT MAX(mark) FROM {OPEN} WHERE windows > 0)"
_WRITER = f"COALESCE((SELECT owner FROM {OPEN} WHERE busy > 0 LIMIT 1), '')"
_SCHEMA = {
    CHANGES: ("seq", "owner", "tbl", "pk", "before"),
    OPEN: ("owner", "host", "pid", "windows", "mark", "busy", "until"),
}


@dataclass(frozen=True)
class _Table:
    name: str
    columns: tuple[str, ...]
    pk: tuple[str, ...]
    json_columns: frozenset[str]
    select_sql: str

    def decode(self, row: Iterable[Any]) -> dict[str, Any]:
        out = dict(zip(self.columns, row, strict=True))
        for col in self.json_columns:
            value = out[col]
            if isinstance(value, str):
                out[col] = json.loads(value)
        return out

    def key(self, alias: str) -> str:
        """The SQL expression of a row's resource key (``NEW`` or ``OLD``), as text: compared
        as text, it finds the recorded key through the index."""
        if not self.pk:
            return f"CAST({alias}.rowid AS TEXT)"
        return "CAST(" + " || ',' || ".join(f"{alias}.{_quote(c)}" for c in self.pk) + " AS TEXT)"

    def image(self, alias: str) -> str:
        """The SQL expression of a row's value as a JSON object. JSON cannot hold a BLOB, so a
        BLOB is recorded as ``["blob", hex]``: no plain column value is an array there (text
        goes in as a string), so :meth:`restore` tells them apart."""
        pairs = ", ".join(
            f"{_literal(col)}, CASE WHEN typeof({alias}.{_quote(col)}) = 'blob' "
            f"THEN json_array('blob', hex({alias}.{_quote(col)})) "
            f"ELSE {alias}.{_quote(col)} END"
            for col in self.columns
        )
        return f"json_object({pairs})"

    def restore(self, image: dict[str, Any]) -> dict[str, Any]:
        """A row recorded by :meth:`image`, decoded as :meth:`decode` reads it live."""
        values = []
        for col in self.columns:
            value = image.get(col)
            if isinstance(value, list) and len(value) == 2 and value[0] == "blob":
                value = bytes.fromhex(value[1])
            values.append(value)
        return self.decode(values)

    def record(self, alias: str, before: str, when: str = "") -> str:
        """The trigger statement recording the row ``alias`` names for its writer (the flagged
        adapter, or nobody: ``''``), unless recorded for that writer already."""
        name, key = _literal(self.name), self.key(alias)
        return (
            f"INSERT INTO {CHANGES}(owner, tbl, pk, before) SELECT w.o, {name}, {key}, {before} "
            f"FROM (SELECT {_WRITER} AS o) AS w "
            f"WHERE {when}NOT EXISTS (SELECT 1 FROM {CHANGES} WHERE tbl = {name} "
            f"AND pk = {key} AND owner = w.o AND seq > {_LATEST_MARK});"
        )

    def triggers(self) -> Iterator[str]:
        """The statements creating the insert, update and delete triggers."""
        q = _quote(self.name)
        old, new = self.key("OLD"), self.key("NEW")
        # A count, not a flag: a trigger of the application's own that writes another row
        # nests a flagged write inside this one, and each takes its own.
        done = f"UPDATE {OPEN} SET busy = busy - 1 WHERE busy > 0;"
        bodies = {
            ("_hx_i_", "INSERT"): self.record("NEW", "NULL"),
            ("_hx_u_", "UPDATE"): self.record("OLD", self.image("OLD"))
            + self.record("NEW", "NULL", when=f"{new} IS NOT {old} AND "),
            ("_hx_d_", "DELETE"): self.record("OLD", self.image("OLD")),
        }
        for (prefix, event), body in bodies.items():
            yield (
                f"CREATE TRIGGER {_quote(prefix + self.name)} AFTER {event} ON {q} "
                f"WHEN {_WINDOW_OPEN} BEGIN {body} {done} END"
            )

    def own_triggers(self, owner: str) -> Iterator[str]:
        """The ``TEMP`` triggers that flag ``owner`` as the writer of a row written through the
        connection they are created on, while ``owner`` has a window open.

        They fire after the row is written (so a write ``OR IGNORE`` skipped flags nothing) and
        before the database-wide trigger that takes the flag: SQLite runs a table's ``TEMP``
        triggers first (``tests/state/test_state.py`` checks the order)."""
        q, who = _quote(self.name), _literal(owner)
        for prefix, event in zip(_OWN_PREFIXES, ("INSERT", "UPDATE", "DELETE"), strict=True):
            yield (
                f"CREATE TEMP TRIGGER IF NOT EXISTS {_quote(prefix + self.name)} AFTER {event} "
                f"ON main.{q} WHEN (SELECT windows FROM {OPEN} WHERE owner = {who}) > 0 "
                f"BEGIN UPDATE {OPEN} SET busy = busy + 1 WHERE owner = {who}; END"
            )


_TABLES_READ: dict[tuple[str, str], _Table] = {}
"""Each table as read, by its name and ``CREATE`` statement (see ``SQLState._load_tables``)."""
_TABLES_KEPT = 4096


@functools.lru_cache(maxsize=1024)
def _triggers_of(table: _Table) -> tuple[str, ...]:
    """``table.triggers()``, made once per table shape (every copy of a template asks again)."""
    return tuple(table.triggers())


def _quote(name: str) -> str:
    """``name`` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


@contextmanager
def _atomic(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One transaction, also inside a transaction a tool has open on the connection."""
    connection.execute("SAVEPOINT _hx")
    try:
        yield connection
    except BaseException:
        connection.execute("ROLLBACK TO _hx")
        connection.execute("RELEASE _hx")
        raise
    connection.execute("RELEASE _hx")


def _drop_triggers(c: sqlite3.Connection) -> None:
    """Drop every capture trigger, ours or left by an earlier adapter or version."""
    for (name,) in c.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        if name.startswith(_TRIGGER_PREFIXES):
            c.execute(f"DROP TRIGGER {_quote(name)}")


def _triggers_are(c: sqlite3.Connection, wanted: list[str]) -> bool:
    """Whether the database's capture triggers are exactly ``wanted`` (the statements that
    create them, as SQLite keeps them) and each table's newest: then they need not be made
    again (a database copied from a template that has them, or reopened)."""
    rows = c.execute("SELECT rowid, name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger'")
    ours: list[str] = []
    newest_user: dict[str, int] = {}
    oldest_ours: dict[str, int] = {}
    for rowid, name, table, sql in rows.fetchall():
        if name.startswith(_TRIGGER_PREFIXES):
            ours.append(sql)
            oldest_ours[table] = min(rowid, oldest_ours.get(table, rowid))
        else:
            newest_user[table] = max(rowid, newest_user.get(table, rowid))
    return sorted(ours) == sorted(wanted) and all(
        rowid < oldest_ours.get(table, 0) for table, rowid in newest_user.items()
    )


def _drop_own_triggers(c: sqlite3.Connection) -> None:
    """Drop the ``TEMP`` triggers that flag this connection's writes."""
    rows = c.execute("SELECT name FROM sqlite_temp_master WHERE type = 'trigger'").fetchall()
    for (name,) in rows:
        if name.startswith(_OWN_PREFIXES):
            c.execute(f"DROP TRIGGER temp.{_quote(name)}")


def _outdated(c: sqlite3.Connection) -> bool:
    """Whether the capture tables exist with the columns of an earlier version."""
    for table, columns in _SCHEMA.items():
        found = tuple(r[1] for r in c.execute(f"PRAGMA main.table_info({table})").fetchall())
        if found and found != columns:
            return True
    return False


def _live_here(c: sqlite3.Connection) -> list[int]:
    """The live processes of this machine registered as having an adapter open."""
    exists = c.execute(f"SELECT 1 FROM sqlite_master WHERE name = '{OPEN}'").fetchone()
    if not exists:
        return []
    host = socket.gethostname()
    rows = c.execute(f"SELECT pid FROM {OPEN} WHERE host = ?", (host,)).fetchall()
    return [pid for (pid,) in rows if _alive(pid)]


def _remove_everything(c: sqlite3.Connection) -> None:
    """Drop the capture triggers and tables."""
    _drop_triggers(c)
    c.execute(f"DROP TABLE IF EXISTS main.{CHANGES}")
    c.execute(f"DROP TABLE IF EXISTS main.{OPEN}")


_HEADER = b"SQLite format 3\x00"
_IMAGE_CACHE_KIB = 128  # an in-memory database's page cache (SQLite's default: 2 MiB)
_WAL_VERSIONS = slice(18, 20)  # the file format's write and read versions: 2 in WAL mode


def _memory_image(url: str, path: str, image: object) -> bytes:
    """``image`` checked as the bytes of a SQLite database for ``":memory:"``, with a WAL
    file's format versions set back to rollback's (SQLite cannot write a WAL-mode image in
    memory)."""
    if not isinstance(image, bytes | bytearray | memoryview):
        raise ConfigurationError(
            f"SQLState(image=...): give the bytes of a SQLite database file, not "
            f"{type(image).__name__}"
        )
    if path != ":memory:":
        raise ConfigurationError(
            f"SQLState({url!r}, image=...): an image starts an in-memory database; give "
            "url=':memory:' with it, or leave image out to open the file"
        )
    data = bytes(image)
    if not data.startswith(_HEADER) or len(data) < 100:
        raise ConfigurationError(
            "SQLState(':memory:', image=...): the bytes are not a SQLite database file (it "
            "starts with 'SQLite format 3'); give a database file's bytes"
        )
    return rollback_image(data)


def rollback_image(data: bytes) -> bytes:
    """A database file's bytes with a WAL file's format versions set to rollback's: SQLite
    cannot write a WAL-mode image in memory. (``data`` itself when it is not WAL.)"""
    if data[_WAL_VERSIONS] == b"\x02\x02":
        return data[:18] + b"\x01\x01" + data[20:]
    return data


def _clear_if_idle(c: sqlite3.Connection) -> None:
    """Empty the change table when no adapter has a window open (whatever its lease: a live
    window past its lease still reads its own rows)."""
    if not c.execute(f"SELECT EXISTS (SELECT 1 FROM {OPEN} WHERE windows > 0)").fetchone()[0]:
        c.execute(f"DELETE FROM {CHANGES}")


def _leave(
    connection: sqlite3.Connection, owner: str, attributed: list[sqlite3.Connection]
) -> None:
    """Unregister ``owner``; the last adapter out removes what the adapters installed. Then
    close the connection (also when that fails). Connections given to ``attribute`` stay open,
    without the triggers that flagged their writes."""
    for other in attributed:
        with contextlib.suppress(sqlite3.Error):
            _drop_own_triggers(other)
    try:
        with _atomic(connection) as c:
            c.execute(f"DELETE FROM {OPEN} WHERE owner = ?", (owner,))
            if c.execute(f"SELECT EXISTS (SELECT 1 FROM {OPEN})").fetchone()[0]:
                _clear_if_idle(c)
            else:
                _remove_everything(c)
    except sqlite3.ProgrammingError:  # the connection was closed by hand: nothing to do
        pass
    finally:
        connection.close()


class SQLState:
    """Rows as resources: ``get("orders/42")`` returns the row of ``orders`` whose key is 42.

    Columns whose declared type contains ``JSON`` are decoded. Tables need a primary key (a
    composite key is joined with ``,``); tables without one are addressed by ``rowid``.
    Tools write through :attr:`connection`, or through a connection given to
    :meth:`attribute`: those writes are the adapter's (a call's). Writes through any other
    connection to the file are another writer's: never a call's change, and seen by
    :meth:`others` so that the engine never restores a value over them.

    The adapter installs change-capture triggers and two ``_hx_`` tables while it is open and
    removes them on :meth:`close` (the last adapter open on the file does). Close it, or use
    it as a context manager; one that is garbage-collected or still open at interpreter exit
    is closed then.

    A ``postgresql://`` (or ``postgresql+psycopg://``) URL gives a
    :class:`PostgresState`: the same resources and windows on Postgres,
    with :attr:`connection` a psycopg 3 connection in autocommit mode.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path.db``, ``postgresql://user@host/db``), a path to
            a SQLite file, or ``":memory:"``.
        create: create the database file when it does not exist (otherwise a missing file is a
            :class:`ConfigurationError`, so a mistyped path is not silently a new database).
        journal_mode: set the database's journal mode (``"wal"``, ``"delete"``, ...), which
            persists in the file; by default the database keeps the mode it has.
        synchronous: SQLite's ``synchronous`` setting for the adapter's connection (``"off"``,
            ``"normal"``, ``"full"``, ``"extra"``), set before the adapter writes anything; by
            default ``"normal"`` in WAL mode (safe against a process crash there) and SQLite's
            own default otherwise. ``"off"`` suits a throwaway copy nothing reads after an
            operating-system crash.
        image: a SQLite database file's bytes (``Path(...).read_bytes()``, another
            connection's ``serialize()``) to start an in-memory database from, with ``url``
            ``":memory:"``: a copy nobody else can open, made without touching the disk (a
            trial's throwaway database). The adapter works on its own copy of the bytes. A
            WAL-mode image opens in rollback mode: memory has no write-ahead log.

    Raises:
        ConfigurationError: a missing file without ``create=True``, a wrong journal mode, a URL
            that is not SQLite, or a file that is not a SQLite database.
    """

    attributes_writes = True
    """Changes are told apart by writer: a window's :meth:`changes` are its own connection's."""

    def __new__(cls, url: str | os.PathLike[str], **options: Any) -> SQLState:
        # (the options are __init__'s; only the URL chooses the class)
        if cls is SQLState and is_postgres(url):
            return super().__new__(PostgresState)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        create: bool = False,
        journal_mode: str | None = None,
        synchronous: str | None = None,
        image: bytes | bytearray | memoryview | None = None,
    ) -> None:
        if not isinstance(url, str | os.PathLike) or not isinstance(os.fspath(url), str):
            raise ConfigurationError(
                f"SQLState(url={url!r}): give a sqlite:/// URL or a file path (str or Path), "
                f"not {type(url).__name__}"
            )
        if not isinstance(create, bool):
            raise ConfigurationError(f"SQLState(create={create!r}): give True or False")
        if journal_mode is not None and (
            not isinstance(journal_mode, str) or journal_mode.lower() not in _JOURNAL_MODES
        ):
            raise ConfigurationError(
                f"SQLState(journal_mode={journal_mode!r}): give one of "
                f"{', '.join(sorted(_JOURNAL_MODES))}, or None to keep the database's mode"
            )
        if synchronous is not None and (
            not isinstance(synchronous, str) or synchronous.lower() not in _SYNCHRONOUS
        ):
            raise ConfigurationError(
                f"SQLState(synchronous={synchronous!r}): give one of "
                f"{', '.join(sorted(_SYNCHRONOUS))}, or None for the default"
            )
        self.url = os.fspath(url)
        self.path = self._sqlite_path(self.url)
        if image is not None:
            image = _memory_image(self.url, self.path, image)
        if self.path != ":memory:" and not create and not Path(self.path).is_file():
            raise ConfigurationError(
                f"SQLState({self.url!r}): no database file {self.path}; give the path of an "
                "existing SQLite database, or pass create=True to create a new one"
            )
        self._owner = uuid.uuid4().hex
        self._windows: Counter[int] = Counter()
        self._tables: dict[str, _Table] = {}
        self._attributed: list[sqlite3.Connection] = []
        self._leased = 0.0  # when this adapter's window lease was last renewed (monotonic)
        self._schema_version = -1  # the database's schema version the triggers were made for
        try:
            self.connection = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
        except sqlite3.Error as exc:
            raise self._unopenable(exc) from exc
        # From here on the adapter unregisters and closes its connection however it ends.
        self._closer = weakref.finalize(
            self, _leave, self.connection, self._owner, self._attributed
        )
        try:
            if image is not None:
                self.connection.deserialize(image)
                # Its pages are in memory already: a page cache would hold them twice.
                self.connection.execute(f"PRAGMA cache_size=-{_IMAGE_CACHE_KIB}")
            if journal_mode is not None:
                self.connection.execute(f"PRAGMA journal_mode={journal_mode.lower()}")
            if synchronous is not None:
                self.connection.execute(f"PRAGMA synchronous={synchronous.lower()}")
            elif self.connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                # Safe against a process crash in WAL mode (not in the rollback-journal modes).
                self.connection.execute("PRAGMA synchronous=NORMAL")
            self._install()
        except sqlite3.Error as exc:
            self._closer.detach()  # nothing was installed: the transaction rolled back
            self.connection.close()
            raise self._unopenable(exc) from exc

    def _unopenable(self, exc: sqlite3.Error) -> ConfigurationError:
        return ConfigurationError(
            f"SQLState({self.url!r}) could not open the database: {exc}; "
            "check that the file is a SQLite database you may write to"
        )

    @staticmethod
    def _sqlite_path(url: str) -> str:
        if "://" not in url:
            return url
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise ConfigurationError(f"SQLState({url!r}): not a database URL ({exc})") from exc
        if parsed.get_backend_name() != "sqlite":
            raise ConfigurationError(
                f"SQLState({url!r}): change capture is implemented for SQLite and Postgres; "
                "give a sqlite:/// or postgresql:// URL, or a file path"
            )
        return parsed.database or ":memory:"

    def _load_tables(self) -> dict[str, _Table]:
        """The tracked tables, each read with ``PRAGMA table_info`` once a process for the same
        name and ``CREATE`` statement (which ``ALTER TABLE`` keeps current): every copy of a
        template has the same."""
        tables: dict[str, _Table] = {}
        rows = self.connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='table' "
            "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '\\_hx\\_%' ESCAPE '\\'"
        ).fetchall()
        for name, sql in rows:
            table = _TABLES_READ.get((name, sql))
            if table is None:
                table = self._read_table(name)
                if len(_TABLES_READ) < _TABLES_KEPT:
                    _TABLES_READ[(name, sql)] = table
            tables[name] = table
        return tables

    def _read_table(self, name: str) -> _Table:
        info = self.connection.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
        columns = tuple(r[1] for r in info)
        pk = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
        json_cols = frozenset(r[1] for r in info if "JSON" in (r[2] or "").upper())
        where = " AND ".join(f"{_quote(c)} = ?" for c in pk) if pk else "rowid = ?"
        select = f"SELECT {', '.join(map(_quote, columns))} FROM {_quote(name)} WHERE {where}"
        return _Table(name, columns, pk, json_cols, select)

    def _install(self) -> None:
        """Register this adapter and (re)create the capture tables and triggers, in one
        transaction: other connections see the old triggers or the new ones, never none."""
        host, pid = socket.gethostname(), os.getpid()
        with _atomic(self.connection) as c:
            if _outdated(c):
                _remove_everything(c)
            c.execute(
                f"CREATE TABLE IF NOT EXISTS main.{CHANGES} (seq INTEGER PRIMARY KEY, "
                "owner TEXT NOT NULL, tbl TEXT NOT NULL, pk TEXT NOT NULL, before TEXT)"
            )
            c.execute(
                f"CREATE INDEX IF NOT EXISTS main._hx_changes_key ON {CHANGES}(tbl, pk, owner, seq)"
            )
            c.execute(
                f"CREATE TABLE IF NOT EXISTS main.{OPEN} (owner TEXT PRIMARY KEY, "
                "host TEXT NOT NULL, pid INTEGER NOT NULL, windows INTEGER NOT NULL DEFAULT 0, "
                "mark INTEGER NOT NULL DEFAULT 0, busy INTEGER NOT NULL DEFAULT 0, "
                "until REAL NOT NULL DEFAULT 0)"
            )
            others = c.execute(
                f"SELECT owner, pid FROM {OPEN} WHERE host = ? AND owner != ?", (host, self._owner)
            ).fetchall()
            dead = [(owner,) for owner, other in others if not _alive(other)]
            c.executemany(f"DELETE FROM {OPEN} WHERE owner = ?", dead)
            c.execute(
                f"INSERT OR IGNORE INTO {OPEN}(owner, host, pid) VALUES (?, ?, ?)",
                (self._owner, host, pid),
            )
            _clear_if_idle(c)
            self._tables = self._load_tables()
            wanted = [s for table in self._tables.values() for s in _triggers_of(table)]
            if not _triggers_are(c, wanted):
                _drop_triggers(c)
                for statement in wanted:
                    c.execute(statement)
        for connection in (self.connection, *self._attributed):
            self._flag_writes(connection)
        self._schema_version = self._version()

    def _version(self) -> int:
        return int(self.connection.execute("PRAGMA main.schema_version").fetchone()[0])

    def _sync(self) -> None:
        """After the schema changed (a table created, triggers replaced by another adapter):
        make sure every table carries both triggers, or this connection's writes to it would
        look like another writer's (or go unseen)."""
        tables = self._load_tables()
        triggers = self.connection.execute(
            "SELECT rowid, name, tbl_name FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall()
        own = {
            name
            for (name,) in self.connection.execute(
                "SELECT name FROM sqlite_temp_master WHERE type = 'trigger'"
            )
        }
        shared = {name for _, name, _ in triggers}
        # The capture triggers must be a table's newest: SQLite runs the newest first, and an
        # application trigger writing the same row before them would be recorded first.
        newest_user: dict[str, int] = {}
        oldest_ours: dict[str, int] = {}
        for rowid, name, table in triggers:
            if name.startswith(_TRIGGER_PREFIXES):
                oldest_ours[table] = min(rowid, oldest_ours.get(table, rowid))
            else:
                newest_user[table] = max(rowid, newest_user.get(table, rowid))
        complete = (
            all(p + t in shared for t in tables for p in _TRIGGER_PREFIXES)
            and all(p + t in own for t in tables for p in _OWN_PREFIXES)
            and all(newest_user[t] < oldest_ours.get(t, 0) for t in newest_user if t in tables)
        )
        if tables != self._tables or not complete:
            self._install()
        else:
            self._schema_version = self._version()

    def _flag_writes(self, connection: sqlite3.Connection) -> None:
        """(Re)create on ``connection`` the ``TEMP`` triggers that make its writes ours."""
        with _atomic(connection) as c:
            _drop_own_triggers(c)
            for table in self._tables.values():
                for statement in table.own_triggers(self._owner):
                    c.execute(statement)

    def attribute(self, connection: sqlite3.Connection) -> None:
        """Make writes through another ``sqlite3`` connection to the same file this adapter's
        (a call's), as writes through :attr:`connection` are. Without it, that connection's
        writes are another writer's: a tool that opens its own connection gives it here.

        Raises:
            ConfigurationError: not a ``sqlite3.Connection``, or one the triggers cannot be
                created on (closed, or read-only).
        """
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                f"SQLState.attribute({connection!r}): give a sqlite3.Connection to the same "
                "database file"
            )
        try:
            self._flag_writes(connection)
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"SQLState.attribute: could not watch the connection's writes ({exc}); give "
                "an open connection to the same database that may write to it"
            ) from exc
        if connection is not self.connection and connection not in self._attributed:
            self._attributed.append(connection)

    @staticmethod
    def uninstall(url: str | os.PathLike[str]) -> list[str]:
        """Remove every capture trigger and ``_hx_`` table the adapters put in a database by
        hand: what a process killed with its adapter open leaves until an adapter opens the
        database again (``harness state uninstall URL`` does the same from the command line).
        A SQLite file or ``sqlite:///`` URL, or a Postgres URL (its current schema: the
        triggers, the ``_hx_capture`` function and the ``_hx_`` tables). Returns what was
        removed (empty: nothing was there).

        Raises:
            ConfigurationError: no such file, not a database that may be written, or an
                adapter still open on it (a live process of this machine on SQLite, a live
                server session on Postgres).
        """
        if is_postgres(os.fspath(url)):
            return postgres_uninstall(os.fspath(url))
        path = SQLState._sqlite_path(os.fspath(url))
        if not Path(path).is_file():
            raise ConfigurationError(f"SQLState.uninstall({os.fspath(url)!r}): no file {path}")
        try:
            connection = sqlite3.connect(path, isolation_level=None, timeout=30.0)
            try:
                with _atomic(connection) as c:
                    alive = _live_here(c)
                    if alive:
                        raise ConfigurationError(
                            f"SQLState.uninstall({os.fspath(url)!r}): process {alive[0]} of "
                            "this machine has an adapter open on the database; close it first "
                            "(its tools' writes would fail without the tables)"
                        )
                    names = sorted(
                        name
                        for (name,) in c.execute(
                            "SELECT name FROM sqlite_master WHERE name LIKE '\\_hx\\_%' "
                            "ESCAPE '\\' AND type IN ('table', 'trigger')"
                        )
                    )
                    _remove_everything(c)
            finally:
                connection.close()
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"SQLState.uninstall({os.fspath(url)!r}): {exc}; check that the file is a SQLite "
                "database you may write to"
            ) from exc
        return names

    def refresh(self) -> None:
        """Pick up tables created (or altered) after the adapter was opened."""
        self._install()

    @property
    def tables(self) -> list[str]:
        """Names of the tracked tables."""
        return sorted(self._tables)

    # --- adapter interface ---
    def get(self, key: str) -> dict[str, Any] | None:
        table, pk = split_resource(key, self._tables)
        row = self.connection.execute(table.select_sql, pk).fetchone()
        return None if row is None else table.decode(row)

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: self.get(k) for k in keys}

    def mark(self) -> int:
        if self._version() != self._schema_version:
            self._sync()
        rows = self.connection.execute(
            f"UPDATE {OPEN} SET windows = windows + 1, until = julianday('now') + ?, busy = 0, "
            f"mark = (SELECT COALESCE(MAX(seq), 0) FROM {CHANGES}) WHERE owner = ? RETURNING mark",
            (_LEASE_DAYS, self._owner),
        ).fetchall()
        if not rows:
            # Our registration is gone (the database was restored, or cleaned by hand).
            self._install()
            return self.mark()
        mark = int(rows[0][0])
        self._windows[mark] += 1
        self._leased = time.monotonic()
        return mark

    def _recorded(self, mark: int, mine: bool) -> dict[str, Any]:
        """Rows written since ``mark`` by this adapter (``mine``) or by anyone else, each with
        its value before its first such write."""
        out: dict[str, Any] = {}
        op = "=" if mine else "!="
        for tbl, pk, before in self.connection.execute(
            f"SELECT tbl, pk, before FROM {CHANGES} WHERE seq > ? AND owner {op} ? ORDER BY seq",
            (mark, self._owner),
        ).fetchall():
            key = f"{tbl}/{pk}"
            if key in out:
                continue
            if before is None:
                out[key] = None
                continue
            if tbl not in self._tables:  # created, and captured, by another adapter
                self._tables = self._load_tables()
            table = self._tables.get(tbl)
            out[key] = None if table is None else table.restore(json.loads(before))
        return out

    def changes(self, mark: int) -> dict[str, Any]:
        return self._recorded(mark, mine=True)

    def others(self, mark: int) -> dict[str, Any]:
        """Rows other connections (other writers) wrote since ``mark``, each with its value
        before their first write. A long window's lease is renewed here."""
        if time.monotonic() - self._leased > WINDOW_LEASE / 4:
            self.connection.execute(
                f"UPDATE {OPEN} SET until = julianday('now') + ? WHERE owner = ? AND windows > 0",
                (_LEASE_DAYS, self._owner),
            )
            self._leased = time.monotonic()
        return self._recorded(mark, mine=False)

    def _close_window(self, mark: int) -> bool:
        """Count one window on ``mark`` closed; False when none was open (nothing to do)."""
        if mark not in self._windows:
            return False
        self._windows[mark] -= 1
        if self._windows[mark] == 0:
            del self._windows[mark]
        return True

    def release(self, mark: int) -> None:
        if not self._close_window(mark):
            return
        with _atomic(self.connection) as c:
            c.execute(
                f"UPDATE {OPEN} SET windows = MAX(windows - 1, 0), busy = 0 WHERE owner = ?",
                (self._owner,),
            )
            _clear_if_idle(c)

    def fingerprint(self) -> str:
        everything: dict[str, Any] = {}
        for name in self.tables:
            t = self._tables[name]
            order = ", ".join(map(_quote, t.pk)) if t.pk else "rowid"
            sql = f"SELECT {', '.join(map(_quote, t.columns))} FROM {_quote(name)} ORDER BY {order}"
            everything[name] = [t.decode(r) for r in self.connection.execute(sql)]
        return digest(everything)

    def close(self) -> None:
        """Remove the capture triggers and tables (when no other adapter has the database
        open) and close the connection. Closing again does nothing."""
        self._closer()

    def discard(self) -> None:
        """Unregister and close the connection, leaving the capture triggers and tables in
        the file: for a file deleted next (a trial's throwaway copy), where removing them
        first is wasted work. An adapter opened on the file later finds them and removes them
        when it closes. Connections given to :meth:`attribute` stay open without the triggers
        that flagged their writes, as after :meth:`close`. Closing or discarding again does
        nothing."""
        if self._closer.detach() is None:
            return
        for other in self._attributed:
            with contextlib.suppress(sqlite3.Error):
                _drop_own_triggers(other)
        try:
            if self.path != ":memory:":  # (nobody else can open an in-memory database)
                self.connection.execute(f"DELETE FROM {OPEN} WHERE owner = ?", (self._owner,))
        except sqlite3.ProgrammingError:  # the connection was closed by hand
            pass
        finally:
            self.connection.close()

    def __enter__(self) -> SQLState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply_changes(self, changes: Mapping[str, Any]) -> None:
        """Write each row to its recorded image (None: delete it), in one transaction."""
        conn = self.connection
        conn.execute("BEGIN IMMEDIATE")
        try:
            for key, value in changes.items():
                table, pk = split_resource(key, self._tables)
                if value is None:
                    where = " AND ".join(f"{_quote(c)} = ?" for c in table.pk) or "rowid = ?"
                    conn.execute(f"DELETE FROM {_quote(table.name)} WHERE {where}", pk)
                    continue
                cols = [c for c in table.columns if c in value]
                values = [
                    json.dumps(value[c])
                    if c in table.json_columns and value[c] is not None
                    else value[c]
                    for c in cols
                ]
                conn.execute(
                    f"INSERT OR REPLACE INTO {_quote(table.name)} "
                    f"({', '.join(map(_quote, cols))}) VALUES ({', '.join('?' for _ in cols)})",
                    values,
                )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


class PostgresState(PostgresCapture, SQLState):  # type: ignore[misc]  # connection: psycopg
    """:class:`SQLState` on Postgres: what ``hx.SQLState("postgresql://...")`` returns.

    Rows of the tables (with a primary key) in the connection's current schema are resources
    ``table/primary-key``, captured by PL/pgSQL row triggers; :attr:`connection` is a psycopg 3
    connection in autocommit mode (placeholders ``%s``). See
    :class:`~harness.state.postgres.PostgresCapture` for how windows are kept apart.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        synchronous: str | None = None,
        image: bytes | bytearray | memoryview | None = None,
        **options: Any,
    ) -> None:
        if synchronous is not None:
            raise ConfigurationError(
                f"SQLState(synchronous={synchronous!r}): a SQLite setting; leave it out for a "
                "Postgres URL"
            )
        if image is not None:
            raise ConfigurationError(
                "SQLState(image=...): an image starts an in-memory SQLite database; leave it "
                "out for a Postgres URL"
            )
        super().__init__(url, **options)

    def __enter__(self) -> PostgresState:
        return self

    def discard(self) -> None:
        """As :meth:`close`: a Postgres database is not a file deleted next."""
        self.close()
