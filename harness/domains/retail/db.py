"""The tau2-bench retail database on SQLite: schema, template, fresh copies, export and diffs.

One table per upstream collection (``products``, ``users``, ``orders``), one column per top-level
field of upstream's pydantic models, in upstream's field order. Nested values (dicts, lists) live
in columns whose declared type is ``JSON`` and hold JSON text; scalars are ``TEXT`` or ``REAL``.
Only dicts and lists ever go into a ``JSON`` column, so SQLite's numeric affinity for that type
name never turns the stored text into a number.

A database is made once per process as a *template* (parsed from ``db.json``), and every trial
gets a byte copy of it (:func:`fresh_copy`), which never parses JSON again.

:func:`export` reads a database back into the exact shape of ``db.json``; :func:`changes` and
:func:`changes_fingerprint` compare two exports the way the reference data (``gold.json``) does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Final

Record = dict[str, Any]
"""One record in upstream's shape (a row decoded: JSON columns parsed)."""


@dataclass(frozen=True, slots=True)
class Column:
    """A column of the retail schema.

    Attributes:
        name: The upstream field name.
        type: The declared SQLite type: ``TEXT``, ``REAL`` or ``JSON`` (JSON text).
        required: Whether upstream's model requires the field (``NOT NULL``); optional fields
            are ``None`` by default upstream and absent from ``db.json`` when ``None``.
    """

    name: str
    type: str
    required: bool = True


def _json(name: str, *, required: bool = True) -> Column:
    return Column(name, "JSON", required)


def _text(name: str, *, required: bool = True) -> Column:
    return Column(name, "TEXT", required)


# Field order is upstream's (tau2 ``domains/retail/data_model.py``); ``db.json`` uses it too.
TABLES: Final[Mapping[str, tuple[Column, ...]]] = {
    "products": (_text("name"), _text("product_id"), _json("variants")),
    "users": (
        _text("user_id"),
        _json("name"),
        _json("address"),
        _text("email"),
        _json("payment_methods"),
        _json("orders"),
    ),
    "orders": (
        _text("order_id"),
        _text("user_id"),
        _json("address"),
        _json("items"),
        _text("status"),
        _json("fulfillments"),
        _json("payment_history"),
        _text("cancel_reason", required=False),
        _json("exchange_items", required=False),
        _json("exchange_new_items", required=False),
        _text("exchange_payment_method_id", required=False),
        Column("exchange_price_difference", "REAL", required=False),
        _json("return_items", required=False),
        _text("return_payment_method_id", required=False),
    ),
}
"""Every table in ``db.json``'s collection order, with its columns in upstream field order."""

PRIMARY_KEYS: Final[Mapping[str, str]] = {
    "products": "product_id",
    "users": "user_id",
    "orders": "order_id",
}
"""The primary-key column of each table (the key of the record in ``db.json``)."""

# Bump when the bytes a template holds would change for the same db.json (encoding, schema).
_FORMAT_VERSION: Final = 1

DEFAULT_DB_JSON: Final[Traversable] = resources.files("harness.domains.retail") / "data" / "db.json"
"""Upstream's ``db.json``, shipped in the package (``harness/domains/retail/data/db.json``)."""


def schema_sql() -> str:
    """Return the ``CREATE TABLE`` statements of the retail schema.

    Returns:
        The DDL, one statement per table, in ``db.json``'s collection order.
    """
    statements = []
    for table, columns in TABLES.items():
        parts = []
        for column in columns:
            part = f"{column.name} {column.type}"
            if column.name == PRIMARY_KEYS[table]:
                part += " NOT NULL PRIMARY KEY"
            elif column.required:
                part += " NOT NULL"
            parts.append(part)
        statements.append(f"CREATE TABLE {table} (\n    " + ",\n    ".join(parts) + "\n);")
    return "\n".join(statements) + "\n"


def column_names(table: str) -> tuple[str, ...]:
    """Return the column names of ``table`` in upstream field order.

    Args:
        table: One of ``products``, ``users``, ``orders``.

    Returns:
        The names, primary key included.
    """
    return tuple(column.name for column in TABLES[table])


def encode(table: str, record: Mapping[str, Any]) -> tuple[Any, ...]:
    """Turn a record into the row values of ``table`` (JSON columns as JSON text).

    Args:
        table: The table the record belongs to.
        record: The record in upstream's shape; absent optional fields are stored as NULL.

    Returns:
        One value per column, in column order.
    """
    values: list[Any] = []
    for column in TABLES[table]:
        value = record.get(column.name)
        if column.type == "JSON" and value is not None:
            value = json.dumps(value, ensure_ascii=False)
        values.append(value)
    return tuple(values)


def decode(table: str, row: Iterable[Any]) -> Record:
    """Turn a row of ``table`` into a record in the shape of upstream's ``model_dump()``.

    Args:
        table: The table the row was read from.
        row: One value per column, in column order.

    Returns:
        Every field, optional ones included as ``None`` when unset.
    """
    record: Record = {}
    for column, value in zip(TABLES[table], row, strict=True):
        if column.type == "JSON" and value is not None:
            value = json.loads(value)
        record[column.name] = value
    return record


def connect(path: str | os.PathLike[str], *, timeout: float = 30.0) -> sqlite3.Connection:
    """Open a retail database the way :class:`~harness.domains.retail.tools.RetailTools` needs.

    Args:
        path: The database file (a :func:`fresh_copy`).
        timeout: Seconds to wait for a lock held by another connection.

    Returns:
        A connection in autocommit mode (``isolation_level=None``): the caller, not the
        ``sqlite3`` module, opens and ends transactions.
    """
    return sqlite3.connect(os.fspath(path), isolation_level=None, timeout=timeout)


def build_template(db_json_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Build a SQLite database file from upstream's ``db.json``.

    The file appears atomically: it is written beside ``out_path`` under a temporary name and
    renamed, so a concurrent reader never sees half a database.

    Args:
        db_json_path: Upstream's ``db.json``.
        out_path: Where the database file goes (replaced if it exists).

    Returns:
        ``out_path`` as a :class:`~pathlib.Path`.
    """
    with open(db_json_path, encoding="utf-8") as handle:
        data = json.load(handle)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.{os.getpid()}.{uuid.uuid4().hex}.partial")
    try:
        conn = sqlite3.connect(partial, isolation_level=None)
        try:
            conn.executescript(schema_sql())
            conn.execute("BEGIN")
            for table in TABLES:
                names = column_names(table)
                insert = (
                    f"INSERT INTO {table} ({', '.join(names)}) "
                    f"VALUES ({', '.join('?' for _ in names)})"
                )
                conn.executemany(insert, (encode(table, r) for r in data[table].values()))
            conn.execute("COMMIT")
        finally:
            conn.close()
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


_templates: dict[tuple[str, int, int], Path] = {}
_templates_lock = threading.Lock()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def template_path(db_json_path: str | os.PathLike[str] | None = None) -> Path:
    """Return the template database for ``db_json_path``, building it at most once per process.

    The template lives in the system's temporary folder, named after the sha256 of ``db.json``
    and the schema, so processes with the same data share it; it is rebuilt when missing.

    Args:
        db_json_path: Upstream's ``db.json``; the package's copy (:data:`DEFAULT_DB_JSON`) by
            default.

    Returns:
        The path of the template file. Copy it (:func:`fresh_copy`); never open it for writing.
    """
    if db_json_path is not None:
        return _template_for(Path(db_json_path).resolve())
    # On disk (the usual install) as_file gives the file itself; from a zip, a temporary copy.
    with resources.as_file(DEFAULT_DB_JSON) as shipped:
        return _template_for(shipped.resolve())


def _template_for(source: Path) -> Path:
    stat = source.stat()
    key = (str(source), stat.st_mtime_ns, stat.st_size)
    with _templates_lock:
        cached = _templates.get(key)
        if cached is not None and cached.exists():
            return cached
        schema_digest = hashlib.sha256(f"{_FORMAT_VERSION}\n{schema_sql()}".encode()).hexdigest()
        name = f"retail-{_sha256_file(source)}-{schema_digest[:12]}.sqlite"
        path = Path(tempfile.gettempdir()) / "harness-templates" / name
        if not path.exists():
            build_template(source, path)
        _templates[key] = path
        return path


def fresh_copy(
    dest_path: str | os.PathLike[str], *, db_json_path: str | os.PathLike[str] | None = None
) -> Path:
    """Copy the template database to ``dest_path``: a fresh, independent retail database.

    Args:
        dest_path: Where the copy goes (replaced if it exists).
        db_json_path: Upstream's ``db.json``; the package's copy by default.

    Returns:
        ``dest_path`` as a :class:`~pathlib.Path`.
    """
    dest = Path(dest_path)
    try:
        shutil.copyfile(template_path(db_json_path), dest)
    except FileNotFoundError:
        # The shared template was removed after it was found (another process cleaning the
        # temporary folder): build it again, once.
        shutil.copyfile(template_path(db_json_path), dest)
    return dest


def export(conn: sqlite3.Connection) -> dict[str, dict[str, Record]]:
    """Read the whole database back into the shape of upstream's ``db.json``.

    Fields whose value is ``None`` are left out, as in ``db.json`` (upstream's optional order
    fields are absent until a tool sets them). Records keep their insertion order and fields
    keep upstream's order, so ``export`` of a fresh copy serialises exactly like ``db.json``.

    Args:
        conn: An open connection to a retail database.

    Returns:
        ``{"products": {id: record}, "users": {...}, "orders": {...}}``.
    """
    own_transaction = not conn.in_transaction
    if own_transaction:
        conn.execute("BEGIN")  # deferred: one consistent snapshot, no write lock
    try:
        result: dict[str, dict[str, Record]] = {}
        for table in TABLES:
            names = column_names(table)
            key = names.index(PRIMARY_KEYS[table])
            rows = conn.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid")
            result[table] = {
                row[key]: {k: v for k, v in decode(table, row).items() if v is not None}
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
        before: An :func:`export` (or ``db.json``) taken first.
        after: An :func:`export` taken afterwards.

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
    to 2 decimals (so float noise such as ``71.96000000000001`` does not matter).

    Args:
        changes: What :func:`changes` returned (or ``gold.json``'s ``changes``).

    Returns:
        The hex digest.
    """
    text = json.dumps(_canonical(dict(changes)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
