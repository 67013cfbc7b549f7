"""The bank's SQLite file, read and reset by the tests (without opening the served state)."""

from __future__ import annotations

import sqlite3


def setup(path: str, balances: dict[str, int]) -> None:
    """Create the accounts table in ``path`` with these balances (replacing any)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER)")
        db.execute("DELETE FROM accounts")
        db.executemany("INSERT INTO accounts VALUES (?, ?)", balances.items())
    db.close()


def balances(path: str) -> dict[str, int]:
    """Every account's balance in ``path``."""
    with sqlite3.connect(path) as db:
        found = dict(db.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())
    db.close()
    return found
