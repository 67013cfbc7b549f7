"""Upstream's JSON collections on SQLite: one table per collection, one column per field.

tau2-bench keeps a domain's data in one ``db.json``: collections (``orders``, ``users``, ...)
mapping an id to a record. :class:`Tables` holds such data in SQLite: one table per collection,
one column per top-level field of upstream's pydantic model, in upstream's field order. Nested
values (dicts, lists) live in columns whose declared type is ``JSON`` and hold JSON text;
scalars are ``TEXT``, ``INTEGER`` or ``REAL``. Only dicts and lists ever go into a ``JSON``
column, so SQLite's numeric affinity for that type name never turns the stored text into a
number, and a float stays a float (``98.0``) as JSON text keeps it.

A database is made once per process as a *template* (parsed from ``db.json``), and every trial
gets a byte copy of it (:meth:`Tables.fresh_copy`), which never parses JSON again.

:meth:`Tables.export` reads a database back into the shape of ``db.json``; :func:`changes` and
:func:`changes_fingerprint` compare two exports the way the reference data (``gold.json``) does.
:func:`writing` runs a tool's writes in one transaction, or reads only in a dry run
(:func:`dry_run`), and :meth:`Tables.restore_before` is the compensation every write shares.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Final

import harness as hx
from harness.state.sql import rollback_image

__all__ = [
    "Column",
    "Record",
    "Tables",
    "changes",
    "changes_fingerprint",
    "connect",
    "dry_run",
    "in_dry_run",
    "json_column",
    "text_column",
    "writing",
]

Record = dict[str, Any]
"""One record in upstream's shape (a row decoded: JSON columns parsed)."""


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table.

    Attributes:
        name: The upstream field name.
        type: The declared SQLite type: ``TEXT``, ``INTEGER``, ``REAL`` or ``JSON`` (JSON text).
        required: Whether upstream's model requires the field (``NOT NULL``); optional fields
            are ``None`` by default upstream and absent from ``db.json`` when ``None``.
    """

    name: str
    type: str
    required: bool = True


def json_column(name: str, *, required: bool = True) -> Column:
    """A column holding a dict or a list as JSON text."""
    return Column(name, "JSON", required)


def text_column(name: str, *, required: bool = True) -> Column:
    """A column holding a string."""
    return Column(name, "TEXT", required)


_DRY_RUN: Final[contextvars.ContextVar[bool]] = contextvars.ContextVar(
    "records_dry_run", default=False
)
"""True while a tool runs as a dry run: its validations read, nothing is written (a context
variable, so a dry run never affects a call running in another thread)."""


def in_dry_run() -> bool:
    """Whether the running tool is a dry run (it must not write)."""
    return _DRY_RUN.get()


@contextmanager
def dry_run() -> Iterator[None]:
    """Run the block as a dry run: :func:`writing` opens no transaction and
    :meth:`Tables.put` writes nothing."""
    token = _DRY_RUN.set(True)
    try:
        yield
    finally:
        _DRY_RUN.reset(token)


@contextmanager
def writing(conn: sqlite3.Connection) -> Iterator[None]:
    """Run the block in one transaction: all of its writes commit, or none do.

    A caller's open transaction is joined through a savepoint; in a dry run nothing is opened
    (the block only reads).
    """
    if _DRY_RUN.get():
        yield
        return
    if conn.in_transaction:
        conn.execute("SAVEPOINT records_write")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK TO records_write")
            conn.execute("RELEASE records_write")
            raise
        conn.execute("RELEASE records_write")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def connect(path: str | os.PathLike[str], *, timeout: float = 30.0) -> sqlite3.Connection:
    """Open a database the way the domains' tools need it.

    Args:
        path: The database file (a fresh copy).
        timeout: Seconds to wait for a lock held by another connection.

    Returns:
        A connection in autocommit mode (``isolation_level=None``): the caller, not the
        ``sqlite3`` module, opens and ends transactions.
    """
    return sqlite3.connect(os.fspath(path), isolation_level=None, timeout=timeout)


_templates: dict[tuple[str, str, int, int], Path] = {}
_templates_lock = threading.Lock()
_images: dict[Path, bytes] = {}


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Tables:
    """A domain's collections as SQLite tables: schema, template, fresh copies, export.

    Args:
        name: The domain (names its template files).
        tables: Every table in ``db.json``'s collection order, with its columns in upstream's
            field order.
        primary_keys: The primary-key column of each table (the key of the record in
            ``db.json``).
        default_db_json: Upstream's ``db.json`` as shipped in the package.
        shape: Turns a record of ``db.json`` into the record stored (upstream's field order
            for nested values, as its models dump them); the record itself by default.
        format_version: Bump when the bytes a template holds would change for the same
            ``db.json`` (encoding, shaping).
    """

    def __init__(
        self,
        *,
        name: str,
        tables: Mapping[str, tuple[Column, ...]],
        primary_keys: Mapping[str, str],
        default_db_json: Traversable,
        shape: Callable[[str, Record], Record] | None = None,
        format_version: int = 1,
    ) -> None:
        self.name = name
        self.tables = tables
        self.primary_keys = primary_keys
        self.default_db_json = default_db_json
        self._shape = shape
        self.format_version = format_version
        self._names = {t: tuple(c.name for c in columns) for t, columns in tables.items()}
        self._shipped: Path | None = None  # default_db_json resolved, when it is on disk

    def schema_sql(self) -> str:
        """Return the ``CREATE TABLE`` statements, one per table, in collection order."""
        statements = []
        for table, columns in self.tables.items():
            parts = []
            for column in columns:
                part = f"{column.name} {column.type}"
                if column.name == self.primary_keys[table]:
                    part += " NOT NULL PRIMARY KEY"
                elif column.required:
                    part += " NOT NULL"
                parts.append(part)
            statements.append(f"CREATE TABLE {table} (\n    " + ",\n    ".join(parts) + "\n);")
        return "\n".join(statements) + "\n"

    def column_names(self, table: str) -> tuple[str, ...]:
        """Return the column names of ``table`` in upstream field order, primary key included."""
        return self._names[table]

    def encode(self, table: str, record: Mapping[str, Any]) -> tuple[Any, ...]:
        """Turn a record into the row values of ``table`` (JSON columns as JSON text; absent
        optional fields as NULL), one value per column, in column order."""
        values: list[Any] = []
        for column in self.tables[table]:
            value = record.get(column.name)
            if column.type == "JSON" and value is not None:
                value = json.dumps(value, ensure_ascii=False)
            values.append(value)
        return tuple(values)

    def decode(self, table: str, row: Iterable[Any]) -> Record:
        """Turn a row of ``table`` into a record in the shape of upstream's ``model_dump()``:
        every field, optional ones included as ``None`` when unset."""
        record: Record = {}
        for column, value in zip(self.tables[table], row, strict=True):
            if column.type == "JSON" and value is not None:
                value = json.loads(value)
            record[column.name] = value
        return record

    # -- rows ------------------------------------------------------------------------------------

    def fetch(self, conn: sqlite3.Connection, table: str, key: str) -> Record | None:
        """The record ``key`` of ``table``, or None."""
        names = self._names[table]
        row = conn.execute(
            f"SELECT {', '.join(names)} FROM {table} WHERE {self.primary_keys[table]} = ?", (key,)
        ).fetchone()
        return None if row is None else self.decode(table, row)

    def put(self, conn: sqlite3.Connection, table: str, record: Record) -> None:
        """Write ``record`` over its row (nothing in a dry run)."""
        if _DRY_RUN.get():
            return
        self._update(conn, table, record[self.primary_keys[table]], self.encode(table, record))

    def insert(self, conn: sqlite3.Connection, table: str, record: Record) -> None:
        """Add ``record`` as a new row (nothing in a dry run)."""
        if _DRY_RUN.get():
            return
        self._insert(conn, table, self.encode(table, record))

    def _update(
        self, conn: sqlite3.Connection, table: str, key: Any, values: tuple[Any, ...]
    ) -> None:
        # UPDATE keeps the rowid, so exports keep their record order.
        names, pk = self._names[table], self.primary_keys[table]
        others = [(n, v) for n, v in zip(names, values, strict=True) if n != pk]
        conn.execute(
            f"UPDATE {table} SET {', '.join(f'{n} = ?' for n, _ in others)} WHERE {pk} = ?",
            (*(v for _, v in others), key),
        )

    def _insert(self, conn: sqlite3.Connection, table: str, values: tuple[Any, ...]) -> None:
        names = self._names[table]
        conn.execute(
            f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
            values,
        )

    def restore_before(self, conn: sqlite3.Connection, ctx: Any) -> None:
        """Write back, in one transaction, the before-row of every row the action changed.

        A row the action changed is a key of ``ctx.after`` whose value differs from
        ``ctx.before`` (inside a transaction ``ctx.after`` also holds the unchanged rows of the
        scope; during a rollback it holds just the changed ones). A row absent before is
        deleted, a row deleted by the action is inserted again; a row already back to its
        before value is left alone.
        """
        changed = [k for k, v in ctx.after.items() if v != ctx.before.get(k)]
        with writing(conn):
            for key in changed:
                before = ctx.before.get(key)
                if ctx.state.get(key) == before:
                    continue
                table, _, pk = key.partition("/")
                if table not in self.tables:
                    raise KeyError(f"{key}: not a {self.name} table")
                pk_col = self.primary_keys[table]
                if before is None:
                    conn.execute(f"DELETE FROM {table} WHERE {pk_col} = ?", (pk,))
                    continue
                values = self.encode(table, before)
                if conn.execute(f"SELECT 1 FROM {table} WHERE {pk_col} = ?", (pk,)).fetchone():
                    self._update(conn, table, pk, values)
                else:
                    self._insert(conn, table, values)

    # -- template and copies -----------------------------------------------------------------------

    def build_template(
        self, db_json_path: str | os.PathLike[str], out_path: str | os.PathLike[str]
    ) -> Path:
        """Build a SQLite database file from upstream's ``db.json``.

        The file appears atomically: it is written beside ``out_path`` under a temporary name
        and renamed, so a concurrent reader never sees half a database.

        Returns:
            ``out_path`` as a :class:`~pathlib.Path`.
        """
        with open(db_json_path, encoding="utf-8") as handle:
            data = json.load(handle)
        out = Path(out_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f"{out.name}.{os.getpid()}.{uuid.uuid4().hex}.partial")
        shape = self._shape or (lambda _table, record: record)
        try:
            conn = sqlite3.connect(partial, isolation_level=None)
            try:
                conn.executescript(self.schema_sql())
                conn.execute("BEGIN")
                for table in self.tables:
                    names = self._names[table]
                    insert = (
                        f"INSERT INTO {table} ({', '.join(names)}) "
                        f"VALUES ({', '.join('?' for _ in names)})"
                    )
                    rows = (self.encode(table, shape(table, r)) for r in data[table].values())
                    conn.executemany(insert, rows)
                conn.execute("COMMIT")
            finally:
                conn.close()
            # The change capture every trial's adapter installs, made once here, in WAL mode:
            # an adapter on a copy finds its tables and triggers as it would make them.
            hx.SQLState(partial, journal_mode="wal").discard()
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
        return out

    def template_path(self, db_json_path: str | os.PathLike[str] | None = None) -> Path:
        """Return the template database for ``db_json_path``, building it at most once per
        process.

        The template lives in the system's temporary folder, named after the sha256 of
        ``db.json`` and the schema, so processes with the same data share it; it is rebuilt
        when missing.

        Args:
            db_json_path: Upstream's ``db.json``; the package's copy by default.

        Returns:
            The path of the template file. Copy it (:meth:`fresh_copy`); never open it for
            writing.
        """
        if db_json_path is not None:
            return self._template_for(Path(db_json_path).resolve())
        if isinstance(self.default_db_json, Path):  # on disk (the usual install): found once
            if self._shipped is None:
                self._shipped = self.default_db_json.resolve()
            return self._template_for(self._shipped)
        # From a zip, as_file gives a copy, removed after the block.
        with resources.as_file(self.default_db_json) as shipped:
            return self._template_for(shipped.resolve())

    def _template_for(self, source: Path) -> Path:
        stat = source.stat()
        key = (self.name, str(source), stat.st_mtime_ns, stat.st_size)
        with _templates_lock:
            cached = _templates.get(key)
            if cached is not None and cached.exists():
                return cached
            text = f"{self.format_version}\n{self.schema_sql()}"
            schema_digest = hashlib.sha256(text.encode()).hexdigest()
            name = f"{self.name}-{_sha256_file(source)}-{schema_digest[:12]}.sqlite"
            path = Path(tempfile.gettempdir()) / "harness-templates" / name
            if not path.exists():
                self.build_template(source, path)
            _templates[key] = path
            return path

    def image(self, db_json_path: str | os.PathLike[str] | None = None) -> bytes:
        """The template database's bytes, read once per process: what a trial's in-memory
        database starts from (``hx.SQLState(":memory:", image=...)``).

        Args:
            db_json_path: Upstream's ``db.json``; the package's copy by default.
        """
        path = self.template_path(db_json_path)
        with _templates_lock:
            data = _images.get(path)
        if data is None:
            # The template's name is its content's (the data's and the schema's digests), so
            # the bytes read once stay right for it; it is written whole, by a rename.
            try:
                data = rollback_image(path.read_bytes())
            except FileNotFoundError:
                # The shared template was removed after it was found (as in fresh_copy):
                # build it again, once.
                path = self.template_path(db_json_path)
                data = rollback_image(path.read_bytes())
            with _templates_lock:
                data = _images.setdefault(path, data)
        return data

    def fresh_copy(
        self,
        dest_path: str | os.PathLike[str],
        *,
        db_json_path: str | os.PathLike[str] | None = None,
    ) -> Path:
        """Copy the template database to ``dest_path``: a fresh, independent database.

        Args:
            dest_path: Where the copy goes (replaced if it exists).
            db_json_path: Upstream's ``db.json``; the package's copy by default.

        Returns:
            ``dest_path`` as a :class:`~pathlib.Path`.
        """
        dest = Path(dest_path)
        try:
            shutil.copyfile(self.template_path(db_json_path), dest)
        except FileNotFoundError:
            # The shared template was removed after it was found (another process cleaning
            # the temporary folder): build it again, once.
            shutil.copyfile(self.template_path(db_json_path), dest)
        return dest

    def export(self, conn: sqlite3.Connection) -> dict[str, dict[str, Record]]:
        """Read the whole database back into the shape of upstream's ``db.json``.

        Fields whose value is ``None`` are left out, as in ``db.json`` (upstream's optional
        fields are absent until a tool sets them). Records keep their insertion order and
        fields keep upstream's order.

        Returns:
            ``{table: {id: record}}`` in collection order.
        """
        own_transaction = not conn.in_transaction
        if own_transaction:
            conn.execute("BEGIN")  # deferred: one consistent snapshot, no write lock
        try:
            result: dict[str, dict[str, Record]] = {}
            for table in self.tables:
                names = self._names[table]
                key = names.index(self.primary_keys[table])
                rows = conn.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid")
                result[table] = {
                    row[key]: {k: v for k, v in self.decode(table, row).items() if v is not None}
                    for row in rows
                }
        finally:
            if own_transaction:
                conn.execute("COMMIT")
        return result


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def changes(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> Record:
    """List every record that differs between two exports, with its final value.

    Records are compared after dropping keys whose value is null, so an optional field set to
    ``None`` is the same as an absent one. A record removed by ``after`` maps to ``None``.

    Args:
        before: An export (or ``db.json``) taken first.
        after: An export taken afterwards.

    Returns:
        ``{"table/id": final record without null-valued keys}``, tables in ``after``'s order.
    """
    result: Record = {}
    tables = list(after) + [t for t in before if t not in after]
    for table in tables:
        old = before.get(table, {})
        new = after.get(table, {})
        for record_id, record in new.items():
            final = _drop_nulls(record)
            if record_id not in old or _drop_nulls(old[record_id]) != final:
                result[f"{table}/{record_id}"] = final
        for record_id in old:
            if record_id not in new:
                result[f"{table}/{record_id}"] = None
    return result


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def changes_fingerprint(changes: Mapping[str, Any]) -> str:
    """Return the sha256 of the canonical JSON of a :func:`changes` mapping.

    Canonical: keys sorted, separators ``(",", ":")``, null-valued keys dropped, floats rounded
    to 2 decimals (so float noise such as ``71.96000000000001`` does not matter, while ``98``
    and ``98.0`` stay apart, as upstream's JSON tells them).

    Args:
        changes: What :func:`changes` returned (or ``gold.json``'s ``changes``).

    Returns:
        The hex digest.
    """
    text = json.dumps(_canonical(dict(changes)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
