"""``SQLState``: rows of a SQL database as resources ``table/primary-key``.

Changes are captured by triggers into a side table (``_hx_changes``) that records each written
row's key and its value before the write, so the diff of one action reads only the rows that
action touched, whatever the size of the database.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .._json import digest
from ..errors import ConfigurationError

__all__ = ["SQLState"]

CHANGES = "_hx_changes"


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


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SQLState:
    """Rows as resources: ``get("orders/42")`` returns the row of ``orders`` whose key is 42.

    Columns whose declared type contains ``JSON`` are decoded. Tables need a primary key (a
    composite key is joined with ``,``); tables without one are addressed by ``rowid``.
    Tools write through :attr:`connection` (or any other connection to the same database).

    Args:
        url: a SQLAlchemy URL (``sqlite:///path.db``) or a path to a SQLite file.
    """

    def __init__(self, url: str | Path) -> None:
        self.url = str(url)
        self.path = self._sqlite_path(self.url)
        try:
            self.connection = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=NORMAL")
            self._tables = self._load_tables()
            self._install_capture()
        except sqlite3.Error as exc:
            raise ConfigurationError(
                f"SQLState({self.url!r}) could not open the database: {exc}; "
                "check that the file exists and is a SQLite database"
            ) from exc
        self._windows: Counter[int] = Counter()

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
                f"SQLState({url!r}): change capture is implemented for SQLite; "
                "give a sqlite:/// URL or a file path"
            )
        return parsed.database or ":memory:"

    def _load_tables(self) -> dict[str, _Table]:
        tables: dict[str, _Table] = {}
        names = [
            r[0]
            for r in self.connection.execute(
                "SELECT name FROM sqlite_master WHERE type='table' "
                "AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '\\_hx\\_%' ESCAPE '\\'"
            )
        ]
        for name in names:
            info = self.connection.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
            columns = tuple(r[1] for r in info)
            pk = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
            json_cols = frozenset(r[1] for r in info if "JSON" in (r[2] or "").upper())
            where = " AND ".join(f"{_quote(c)} = ?" for c in pk) if pk else "rowid = ?"
            select = f"SELECT {', '.join(map(_quote, columns))} FROM {_quote(name)} WHERE {where}"
            tables[name] = _Table(name, columns, pk, json_cols, select)
        return tables

    def _install_capture(self) -> None:
        c = self.connection
        c.execute(
            f"CREATE TABLE IF NOT EXISTS {CHANGES} "
            "(seq INTEGER PRIMARY KEY AUTOINCREMENT, tbl TEXT NOT NULL, pk TEXT NOT NULL, "
            "before TEXT)"
        )
        for t in self._tables.values():

            def key(alias: str, t: _Table = t) -> str:
                if not t.pk:
                    return f"{alias}.rowid"
                return " || ',' || ".join(f"{alias}.{_quote(col)}" for col in t.pk)

            def row(alias: str, t: _Table = t) -> str:
                pairs = ", ".join(f"'{col}', {alias}.{_quote(col)}" for col in t.columns)
                return f"json_object({pairs})"

            q = _quote(t.name)
            ins = f"INSERT INTO {CHANGES}(tbl, pk, before) VALUES ('{t.name}', "
            c.execute(
                f"CREATE TRIGGER IF NOT EXISTS {_quote('_hx_i_' + t.name)} AFTER INSERT ON {q} "
                f"BEGIN {ins}{key('NEW')}, NULL); END"
            )
            c.execute(
                f"CREATE TRIGGER IF NOT EXISTS {_quote('_hx_u_' + t.name)} AFTER UPDATE ON {q} "
                f"BEGIN {ins}{key('OLD')}, {row('OLD')}); "
                f"INSERT INTO {CHANGES}(tbl, pk, before) SELECT '{t.name}', {key('NEW')}, NULL "
                f"WHERE {key('NEW')} IS NOT {key('OLD')}; END"
            )
            c.execute(
                f"CREATE TRIGGER IF NOT EXISTS {_quote('_hx_d_' + t.name)} AFTER DELETE ON {q} "
                f"BEGIN {ins}{key('OLD')}, {row('OLD')}); END"
            )

    def refresh(self) -> None:
        """Pick up tables created after the adapter was opened."""
        self._tables = self._load_tables()
        self._install_capture()

    @property
    def tables(self) -> list[str]:
        """Names of the tracked tables."""
        return sorted(self._tables)

    def _split(self, key: str) -> tuple[_Table, list[str]]:
        name, _, pk = key.partition("/")
        table = self._tables.get(name)
        if table is None:
            raise KeyError(f"no table {name!r} for resource {key!r}; tables: {self.tables}")
        parts = pk.split(",") if len(table.pk) > 1 else [pk]
        return table, parts

    # --- adapter interface ---
    def get(self, key: str) -> dict[str, Any] | None:
        table, pk = self._split(key)
        row = self.connection.execute(table.select_sql, pk).fetchone()
        return None if row is None else table.decode(row)

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: self.get(k) for k in keys}

    def mark(self) -> int:
        seq = self.connection.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {CHANGES}").fetchone()
        mark = int(seq[0])
        self._windows[mark] += 1
        return mark

    def changes(self, mark: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for tbl, pk, before in self.connection.execute(
            f"SELECT tbl, pk, before FROM {CHANGES} WHERE seq > ? ORDER BY seq", (mark,)
        ):
            key = f"{tbl}/{pk}"
            if key in out:
                continue
            if before is None:
                out[key] = None
            else:
                table = self._tables[tbl]
                values = json.loads(before)
                out[key] = table.decode(values[c] for c in table.columns)
        return out

    def release(self, mark: int) -> None:
        self._windows[mark] -= 1
        if self._windows[mark] <= 0:
            del self._windows[mark]
        if not self._windows:
            self.connection.execute(f"DELETE FROM {CHANGES}")

    def fingerprint(self) -> str:
        everything: dict[str, Any] = {}
        for name in self.tables:
            t = self._tables[name]
            order = ", ".join(map(_quote, t.pk)) if t.pk else "rowid"
            sql = f"SELECT {', '.join(map(_quote, t.columns))} FROM {_quote(name)} ORDER BY {order}"
            everything[name] = [t.decode(r) for r in self.connection.execute(sql)]
        return digest(everything)

    def close(self) -> None:
        """Close the adapter's connection."""
        self.connection.close()
