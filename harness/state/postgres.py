"""``SQLState`` on Postgres: the same resources and change windows as on SQLite.

``hx.SQLState("postgresql://...")`` (or ``postgresql+psycopg://``) returns a
:class:`PostgresState`. Rows of the tables in the connection's current schema are resources
``table/primary-key`` (a composite key joined with ``,``), read as psycopg reads them (JSON and
JSONB columns decoded). Tables without a primary key are not tracked.

Change capture uses one PL/pgSQL trigger function and a row trigger on every tracked table,
writing into ``_hx_changes``; ``_hx_open`` has one row per open adapter. They are installed
while an adapter is open and dropped by the last adapter to close (or the first to open after
every other one's server session has ended).

Windows are scoped per adapter by an owner token in a session variable: the adapter's own
connection runs ``set_config('hx.owner', <token>)``, so the trigger records a row written on
that session for that adapter alone while it has a window open: its :meth:`changes`. A write
on any other session (another program, another adapter, a connection a tool opened without
:meth:`PostgresState.attribute`) is another writer's: recorded as nobody's (or its adapter's)
and seen through :meth:`others`, never as a change of this adapter's window, as on SQLite.
Adapters whose server session has ended (their process died) are cleaned up by the next adapter
to open.
"""

from __future__ import annotations

import os
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from .._json import digest
from ..errors import ConfigurationError
from .base import WINDOW_LEASE, split_resource

__all__ = ["PostgresCapture", "is_postgres", "uninstall"]


def _quote(name: str) -> str:
    """``name`` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


CHANGES = "_hx_changes"
OPEN = "_hx_open"
FUNCTION = "_hx_capture"
TRIGGER = "_hx_capture"
SETTING = "hx.owner"
# Serializes installing and removing the capture objects among adapters of one database.
_LOCK = 0x68785F7374617465  # "hx_state"


@dataclass(frozen=True)
class _PgTable:
    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    pk: tuple[str, ...]
    json_columns: frozenset[str]

    def where(self, schema: str) -> str:
        """``pk1 = CAST(%s AS type) AND ...``: the key's text parts compared through the index."""
        types = dict(zip(self.columns, self.types, strict=True))
        return " AND ".join(f"{_quote(c)} = CAST(%s AS {types[c]})" for c in self.pk)

    def decode(self, row: Iterable[Any]) -> dict[str, Any]:
        return dict(zip(self.columns, row, strict=True))


def _function_sql(schema: str) -> str:
    """The trigger function: records a written row's key and value before the write, once per
    window, for the session's adapter, or as nobody's (another writer's, seen by every open
    window) when the session has no adapter with a window open."""
    s = _quote(schema)
    return f"""
CREATE OR REPLACE FUNCTION {s}.{FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $hx$
DECLARE
    me text := COALESCE(current_setting({_literal(SETTING)}, true), '');
    since bigint;
    old_key text;
    new_key text;
BEGIN
    IF me <> '' THEN
        SELECT mark INTO since FROM {s}.{OPEN} WHERE owner = me AND windows > 0;
        -- An adapter's session writing with no window of its own open is another writer.
        IF NOT FOUND THEN me := ''; END IF;
    END IF;
    IF me = '' THEN
        -- Other writers are recorded while a window's lease holds (a dead process's ends).
        IF NOT EXISTS (SELECT 1 FROM {s}.{OPEN} WHERE windows > 0 AND until > now()) THEN
            RETURN NULL;
        END IF;
        SELECT max(mark) INTO since FROM {s}.{OPEN} WHERE windows > 0;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        SELECT string_agg(j.row ->> u.col, ',' ORDER BY u.n) INTO old_key
            FROM (SELECT to_jsonb(OLD) AS row) j, unnest(TG_ARGV) WITH ORDINALITY AS u(col, n);
        INSERT INTO {s}.{CHANGES}(owner, tbl, pk, before)
            SELECT me, TG_TABLE_NAME, old_key, to_jsonb(OLD)
            WHERE NOT EXISTS (SELECT 1 FROM {s}.{CHANGES} c WHERE c.tbl = TG_TABLE_NAME
                AND c.pk = old_key AND c.seq > since AND c.owner = me);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        SELECT string_agg(j.row ->> u.col, ',' ORDER BY u.n) INTO new_key
            FROM (SELECT to_jsonb(NEW) AS row) j, unnest(TG_ARGV) WITH ORDINALITY AS u(col, n);
        IF new_key IS DISTINCT FROM old_key THEN
            INSERT INTO {s}.{CHANGES}(owner, tbl, pk, before)
                SELECT me, TG_TABLE_NAME, new_key, NULL
                WHERE NOT EXISTS (SELECT 1 FROM {s}.{CHANGES} c WHERE c.tbl = TG_TABLE_NAME
                    AND c.pk = new_key AND c.seq > since AND c.owner = me);
        END IF;
    END IF;
    RETURN NULL;
END
$hx$
"""


def _capture_triggers(c: Any, schema: str) -> list[str]:
    """Names of the tables in ``schema`` that carry our capture trigger."""
    rows = c.execute(
        "SELECT cl.relname FROM pg_trigger t JOIN pg_class cl ON cl.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = cl.relnamespace WHERE n.nspname = %s AND t.tgname = %s",
        (schema, TRIGGER),
    ).fetchall()
    return [r[0] for r in rows]


def _drop_everything(c: Any, schema: str) -> None:
    s = _quote(schema)
    for table in _capture_triggers(c, schema):
        c.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {s}.{_quote(table)}")
    c.execute(f"DROP FUNCTION IF EXISTS {s}.{FUNCTION}()")
    c.execute(f"DROP TABLE IF EXISTS {s}.{CHANGES}")
    c.execute(f"DROP TABLE IF EXISTS {s}.{OPEN}")


def _forget_dead(c: Any, schema: str) -> None:
    """Unregister adapters whose server session has ended, and their recorded rows."""
    s = _quote(schema)
    c.execute(
        f"DELETE FROM {s}.{OPEN} o WHERE NOT EXISTS "
        "(SELECT 1 FROM pg_stat_activity a WHERE a.pid = o.backend)"
    )
    c.execute(
        f"DELETE FROM {s}.{CHANGES} c WHERE c.owner <> '' AND NOT EXISTS "
        f"(SELECT 1 FROM {s}.{OPEN} o WHERE o.owner = c.owner)"
    )


def _clear_shared_if_idle(c: Any, schema: str) -> None:
    """Delete the rows recorded for every window (writes of sessions without a token) when no
    window is open. One statement: a window opened meanwhile keeps the rows written in it."""
    s = _quote(schema)
    c.execute(
        f"DELETE FROM {s}.{CHANGES} WHERE owner = '' AND NOT EXISTS "
        f"(SELECT 1 FROM {s}.{OPEN} WHERE windows > 0)"
    )


def _pg_leave(connection: Any, owner: str, schema: str) -> None:
    """Unregister ``owner``; the last adapter out drops what the adapters installed. Then close
    the connection (also when that fails)."""
    try:
        if connection.closed:
            return
        s = _quote(schema)
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            connection.execute(f"DELETE FROM {s}.{OPEN} WHERE owner = %s", (owner,))
            connection.execute(f"DELETE FROM {s}.{CHANGES} WHERE owner = %s", (owner,))
            _forget_dead(connection, schema)
            if connection.execute(f"SELECT EXISTS (SELECT 1 FROM {s}.{OPEN})").fetchone()[0]:
                _clear_shared_if_idle(connection, schema)
            else:
                _drop_everything(connection, schema)
    except Exception:
        pass
    finally:
        connection.close()


class PostgresCapture:
    """What :class:`~harness.state.sql.PostgresState` adds to :class:`SQLState` on Postgres
    (``hx.SQLState("postgresql://...")`` returns one).

    Tools write through :attr:`connection`, a psycopg 3 connection in autocommit mode (a tool
    may open ``with state.connection.transaction():`` for several statements; placeholders are
    ``%s``), or through connections passed to :meth:`attribute`: those writes belong to this
    adapter alone. Writes on other sessions are other writers': every open window sees them
    through :meth:`others`, and they are never a window's :meth:`changes`.
    ``TRUNCATE`` is not captured, and tables without a primary key are not tracked.

    Args:
        url: ``postgresql://`` or ``postgresql+<driver>://`` URL (psycopg 3 is used whatever
            the driver named). The tables of the connection's current schema are tracked.
        create: not used on Postgres (the database must exist).
        journal_mode: must be None on Postgres.

    Raises:
        ConfigurationError: psycopg missing, a server that cannot be reached, or a database
            the user may not create tables and functions in.
    """

    if TYPE_CHECKING:  # provided by SQLState

        def _close_window(self, mark: int) -> bool: ...

    def __init__(
        self, url: str | os.PathLike[str], *, create: bool = False, journal_mode: str | None = None
    ) -> None:
        if journal_mode is not None:
            raise ConfigurationError(
                f"SQLState(journal_mode={journal_mode!r}): a journal mode is a SQLite setting; "
                "leave it out for a Postgres URL"
            )
        self.url = os.fspath(url)
        self.path = ""
        parsed = _parse(self.url)
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigurationError(
                f"SQLState({self._shown(parsed)}): Postgres needs psycopg 3; "
                "install it with `pip install 'psycopg[binary]'`"
            ) from exc
        conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        self._owner = uuid.uuid4().hex
        self._windows: Counter[int] = Counter()
        self._pg_tables: dict[str, _PgTable] = {}
        self._leased = 0.0  # when this adapter's window lease was last renewed (monotonic)
        try:
            connection = psycopg.connect(
                conninfo,
                autocommit=True,
                connect_timeout=int(os.environ.get("PGCONNECT_TIMEOUT", "10")),
            )
        except psycopg.Error as exc:
            raise ConfigurationError(
                f"SQLState({self._shown(parsed)}) could not connect to Postgres: "
                f"{str(exc).strip()}; check that the server is running and the URL's host, "
                "port, user, password and database"
            ) from exc
        self.connection = connection
        self._pg = connection
        self.schema = ""
        try:
            schema = connection.execute("SELECT current_schema()").fetchone()
            if schema is None or schema[0] is None:
                raise ConfigurationError(
                    f"SQLState({self._shown(parsed)}): the connection has no current schema; "
                    "set search_path to an existing schema (options=-csearch_path=<schema>)"
                )
            self.schema = str(schema[0])
            self.attribute(connection)
            self._pg_closer = weakref.finalize(
                self, _pg_leave, connection, self._owner, self.schema
            )
            self._install()
        except psycopg.Error as exc:
            self._pg_closer.detach()
            connection.close()
            raise ConfigurationError(
                f"SQLState({self._shown(parsed)}) could not set up change capture: "
                f"{str(exc).strip()}; the user needs to create tables, functions and "
                "triggers in the schema"
            ) from exc
        except BaseException:
            connection.close()
            raise

    @staticmethod
    def _shown(parsed: URL) -> str:
        return repr(parsed.render_as_string(hide_password=True))

    @property
    def owner(self) -> str:
        """The token (``hx.owner`` session setting) whose writes belong to this adapter."""
        return self._owner

    def attribute(self, connection: Any) -> None:
        """Make writes on another psycopg ``connection`` this adapter's alone (as writes on
        :attr:`connection` are), by setting the session's ``hx.owner`` to :attr:`owner`."""
        connection.execute("SELECT set_config(%s, %s, false)", (SETTING, self._owner))

    def _load_pg_tables(self) -> dict[str, _PgTable]:
        rows = self._pg.execute(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), "
            "COALESCE((SELECT k.n FROM unnest(i.indkey) WITH ORDINALITY AS k(att, n) "
            "WHERE k.att = a.attnum), 0) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.relname NOT LIKE '\\_hx\\_%%' "
            "ORDER BY c.relname, a.attnum",
            (self.schema,),
        ).fetchall()
        grouped: dict[str, list[tuple[str, str, int]]] = {}
        for table, column, typ, pk_position in rows:
            grouped.setdefault(table, []).append((column, typ, pk_position))
        tables: dict[str, _PgTable] = {}
        for name, cols in grouped.items():
            pk = tuple(c for c, _, p in sorted((c for c in cols if c[2]), key=lambda c: c[2]))
            if not pk:
                continue
            tables[name] = _PgTable(
                name,
                tuple(c for c, _, _ in cols),
                tuple(t for _, t, _ in cols),
                pk,
                frozenset(c for c, t, _ in cols if t in ("json", "jsonb")),
            )
        return tables

    def _install(self, *, replace: bool = False) -> None:
        """Register this adapter and create the capture tables, function and missing triggers,
        in one transaction under a lock the other adapters of the database take too."""
        s, c = _quote(self.schema), self._pg
        with c.transaction():
            c.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.{CHANGES} (seq bigserial PRIMARY KEY, "
                "owner text NOT NULL, tbl text NOT NULL, pk text NOT NULL, before jsonb)"
            )
            c.execute(f"CREATE INDEX IF NOT EXISTS _hx_changes_key ON {s}.{CHANGES}(tbl, pk, seq)")
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.{OPEN} (owner text PRIMARY KEY, "
                "backend integer NOT NULL, windows integer NOT NULL DEFAULT 0, "
                "mark bigint NOT NULL DEFAULT 0, until timestamptz NOT NULL DEFAULT 'infinity')"
            )
            c.execute(  # (a table an earlier version made)
                f"ALTER TABLE {s}.{OPEN} ADD COLUMN IF NOT EXISTS until timestamptz NOT NULL "
                "DEFAULT 'infinity'"
            )
            _forget_dead(c, self.schema)
            c.execute(
                f"INSERT INTO {s}.{OPEN}(owner, backend) VALUES (%s, pg_backend_pid()) "
                "ON CONFLICT (owner) DO NOTHING",
                (self._owner,),
            )
            _clear_shared_if_idle(c, self.schema)
            c.execute(_function_sql(self.schema))
            self._pg_tables = self._load_pg_tables()
            present = set(_capture_triggers(c, self.schema))
            for table in self._pg_tables.values():
                if table.name in present:
                    if not replace:
                        continue
                    c.execute(f"DROP TRIGGER {TRIGGER} ON {s}.{_quote(table.name)}")
                args = ", ".join(_literal(col) for col in table.pk)
                c.execute(
                    f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE "
                    f"ON {s}.{_quote(table.name)} FOR EACH ROW "
                    f"EXECUTE FUNCTION {s}.{FUNCTION}({args})"
                )

    def refresh(self) -> None:
        """Pick up tables created (or altered) after the adapter was opened."""
        self._install(replace=True)

    @property
    def tables(self) -> list[str]:
        """Names of the tracked tables (those with a primary key)."""
        return sorted(self._pg_tables)

    def _select(self, table: _PgTable) -> str:
        cols = ", ".join(map(_quote, table.columns))
        return (
            f"SELECT {cols} FROM {_quote(self.schema)}.{_quote(table.name)} "
            f"WHERE {table.where(self.schema)}"
        )

    # --- adapter interface ---
    def get(self, key: str) -> dict[str, Any] | None:
        table, pk = split_resource(key, self._pg_tables)
        row = self._pg.execute(self._select(table), pk).fetchone()
        return None if row is None else table.decode(row)

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: self.get(k) for k in keys}

    def mark(self) -> int:
        s = _quote(self.schema)
        rows = self._pg.execute(
            f"UPDATE {s}.{OPEN} SET windows = windows + 1, mark = (SELECT CASE WHEN is_called "
            f"THEN last_value ELSE last_value - 1 END FROM {s}._hx_changes_seq_seq), "
            "until = now() + make_interval(secs => %s) WHERE owner = %s RETURNING mark",
            (WINDOW_LEASE, self._owner),
        ).fetchall()
        if not rows:  # our registration is gone (cleaned by hand, or the database restored)
            self._install()
            return self.mark()
        mark = int(rows[0][0])
        self._windows[mark] += 1
        self._leased = time.monotonic()
        return mark

    def changes(self, mark: int) -> dict[str, Any]:
        return self._recorded(mark, mine=True)

    def others(self, mark: int) -> dict[str, Any]:
        """Rows other sessions (other writers: connections without this adapter's token, and
        other adapters) wrote since ``mark``, each with its value before their first write. A
        long window's lease is renewed here."""
        if time.monotonic() - self._leased > WINDOW_LEASE / 4:
            self._pg.execute(
                f"UPDATE {_quote(self.schema)}.{OPEN} SET until = now() + "
                "make_interval(secs => %s) WHERE owner = %s AND windows > 0",
                (WINDOW_LEASE, self._owner),
            )
            self._leased = time.monotonic()
        return self._recorded(mark, mine=False)

    def _recorded(self, mark: int, *, mine: bool) -> dict[str, Any]:
        s = _quote(self.schema)
        op = "=" if mine else "<>"
        recorded = self._pg.execute(
            f"SELECT seq, tbl, pk, before IS NULL FROM {s}.{CHANGES} "
            f"WHERE seq > %s AND owner {op} %s ORDER BY seq",
            (mark, self._owner),
        ).fetchall()
        out: dict[str, Any] = {}
        images: dict[str, list[int]] = {}
        for seq, tbl, pk, created in recorded:
            key = f"{tbl}/{pk}"
            if key in out:
                continue
            out[key] = None
            if not created:
                images.setdefault(tbl, []).append(seq)
        for tbl, seqs in images.items():
            if tbl not in self._pg_tables:  # created, and captured, by another adapter
                self._pg_tables = self._load_pg_tables()
            table = self._pg_tables.get(tbl)
            if table is None:  # dropped since: its rows are gone
                continue
            cols = ", ".join(f"r.{_quote(c)}" for c in table.columns)
            for row in self._pg.execute(
                f"SELECT c.pk, {cols} FROM {s}.{CHANGES} c, "
                f"jsonb_populate_record(NULL::{s}.{_quote(tbl)}, c.before) r "
                "WHERE c.seq = ANY(%s)",
                (seqs,),
            ):
                out[f"{tbl}/{row[0]}"] = table.decode(row[1:])
        return out

    def release(self, mark: int) -> None:
        if not self._close_window(mark):
            return
        s = _quote(self.schema)
        with self._pg.transaction():
            left = self._pg.execute(
                f"UPDATE {s}.{OPEN} SET windows = GREATEST(windows - 1, 0) WHERE owner = %s "
                "RETURNING windows",
                (self._owner,),
            ).fetchone()
            if left is None or left[0] == 0:
                self._pg.execute(f"DELETE FROM {s}.{CHANGES} WHERE owner = %s", (self._owner,))
            _clear_shared_if_idle(self._pg, self.schema)

    def fingerprint(self) -> str:
        everything: dict[str, Any] = {}
        s = _quote(self.schema)
        for name in self.tables:
            t = self._pg_tables[name]
            order = ", ".join(map(_quote, t.pk))
            cols = ", ".join(map(_quote, t.columns))
            sql = f"SELECT {cols} FROM {s}.{_quote(name)} ORDER BY {order}"
            everything[name] = [t.decode(r) for r in self._pg.execute(sql)]
        return digest(everything)

    def close(self) -> None:
        """Unregister; the last adapter on the database drops the triggers, the function and
        the ``_hx_`` tables. Then close the connection. Closing again does nothing."""
        self._pg_closer()

    def apply_changes(self, changes: Mapping[str, Any]) -> None:
        """Write each row to its recorded image (None: delete it), in one transaction."""
        from psycopg.types.json import Jsonb

        s = _quote(self.schema)
        with self._pg.transaction():
            for key, value in changes.items():
                table, pk = split_resource(key, self._pg_tables)
                target = f"{s}.{_quote(table.name)}"
                if value is None:
                    self._pg.execute(f"DELETE FROM {target} WHERE {table.where(self.schema)}", pk)
                    continue
                cols = [c for c in table.columns if c in value]
                values = [
                    Jsonb(value[c])
                    if c in table.json_columns and value[c] is not None
                    else value[c]
                    for c in cols
                ]
                updates = [c for c in cols if c not in table.pk]
                conflict = (
                    "DO UPDATE SET "
                    + ", ".join(f"{_quote(c)} = EXCLUDED.{_quote(c)}" for c in updates)
                    if updates
                    else "DO NOTHING"
                )
                self._pg.execute(
                    f"INSERT INTO {target} ({', '.join(map(_quote, cols))}) "
                    f"VALUES ({', '.join('%s' for _ in cols)}) "
                    f"ON CONFLICT ({', '.join(map(_quote, table.pk))}) {conflict}",
                    values,
                )


def uninstall(url: str) -> list[str]:
    """Remove the capture triggers, function and ``_hx_`` tables from the current schema of
    the Postgres database at ``url`` (what ``SQLState.uninstall`` does on Postgres). Adapters
    whose server session has ended are forgotten first; returns what was removed.

    Raises:
        ConfigurationError: psycopg missing, a server that cannot be reached, or an adapter
            on a live server session has the database open.
    """
    shown = f"SQLState.uninstall({_parse(url).render_as_string(hide_password=True)!r})"
    try:
        import psycopg
    except ImportError as exc:
        raise ConfigurationError(
            f"{shown}: Postgres needs psycopg 3; install it with `pip install 'psycopg[binary]'`"
        ) from exc
    conninfo = _parse(url).set(drivername="postgresql").render_as_string(hide_password=False)
    timeout = int(os.environ.get("PGCONNECT_TIMEOUT", "10"))
    try:
        with (
            psycopg.connect(conninfo, autocommit=True, connect_timeout=timeout) as connection,
            connection.transaction(),
        ):
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            row = connection.execute("SELECT current_schema()").fetchone()
            if row is None or row[0] is None:
                raise ConfigurationError(
                    f"{shown}: the connection has no current schema; set search_path to the "
                    "schema the adapters used (options=-csearch_path=<schema>)"
                )
            schema = str(row[0])
            s = _quote(schema)

            def exists(kind: str, name: str) -> bool:
                found = connection.execute(f"SELECT to_{kind}(%s) IS NOT NULL", (name,)).fetchone()
                return bool(found is not None and found[0])

            if exists("regclass", f"{s}.{OPEN}"):
                _forget_dead(connection, schema)
                live = [r[0] for r in connection.execute(f"SELECT backend FROM {s}.{OPEN}")]
                if live:
                    raise ConfigurationError(
                        f"{shown}: {len(live)} adapter(s) on live server sessions (backend pid "
                        f"{', '.join(map(str, sorted(live)))}) have the database open; close "
                        "them first (their tools' writes would fail without the tables)"
                    )
            triggers = sorted(_capture_triggers(connection, schema))
            names = [f"trigger {TRIGGER} on {t}" for t in triggers]
            if exists("regprocedure", f"{s}.{FUNCTION}()"):
                names.append(f"function {FUNCTION}")
            names += [f"table {t}" for t in (CHANGES, OPEN) if exists("regclass", f"{s}.{t}")]
            _drop_everything(connection, schema)
            return names
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"{shown}: {str(exc).strip()}; check that the server is running, the URL, and that "
            "the user may drop the tables, function and triggers"
        ) from exc


def is_postgres(url: object) -> bool:
    """Whether ``url`` is a Postgres URL (``postgresql://``, ``postgresql+driver://``)."""
    if not isinstance(url, str):
        return False
    scheme = url.partition("://")[0].lower()
    return "://" in url and scheme.partition("+")[0] in ("postgresql", "postgres")


def _parse(url: str) -> URL:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        if url.lower().startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://") :]
        return make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigurationError(
            f"SQLState({url!r}): not a database URL ({exc}); "
            "give postgresql://user:password@host:port/database"
        ) from exc
