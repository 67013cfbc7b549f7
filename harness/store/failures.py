"""Writes the database refuses: the disk is full, the file is read-only, an I/O error, the
write lock held past the busy timeout.

Every write of the store goes through :func:`writing` (the episode writer's transactions, the
sessions' flushes and commits, the leases), which turns the driver's error into one
:class:`~harness.errors.StoreWriteFailed` naming the database, the cause in plain words and
the fix. Any other error passes through as it was.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from ..errors import StoreWriteFailed

__all__ = ["shown", "write_failure", "writing"]

FULL = "the disk is full"
READ_ONLY = "the database file (or its folder) is read-only"
IO_ERROR = "the disk reported an I/O error"
LOCKED = "another process held the store's write lock past the busy timeout"
CONNECTIONS = "the database server has no connection left for this process (max_connections)"

# SQLite's primary result codes (the low byte of an extended code).
_SQLITE_CODES = {13: FULL, 8: READ_ONLY, 10: IO_ERROR, 5: LOCKED, 6: LOCKED}

# Postgres SQLSTATEs: disk_full, read_only_sql_transaction, io_error, lock_not_available,
# query_canceled (a lock_timeout or statement_timeout ran out), too_many_connections.
_SQLSTATES = {
    "53300": CONNECTIONS,
    "53100": FULL,
    "25006": READ_ONLY,
    "58030": IO_ERROR,
    "55P03": LOCKED,
    "57014": LOCKED,
}

# What the message says when the driver gives no code (lower case).
_WORDS = (
    ("database or disk is full", FULL),
    ("no space left on device", FULL),
    ("could not extend file", FULL),
    ("disk full", FULL),
    ("readonly database", READ_ONLY),
    ("read-only", READ_ONLY),
    ("disk i/o error", IO_ERROR),
    ("database is locked", LOCKED),
    ("database table is locked", LOCKED),
    ("too many clients", CONNECTIONS),
    ("remaining connection slots are reserved", CONNECTIONS),
)

_WHAT_TO_DO = {
    FULL: "Free space on its disk",
    READ_ONLY: "Make the database file and its folder writable by this user",
    IO_ERROR: "Check the disk (the system log says what failed)",
    LOCKED: "Let the other process finish, or stop it",
    CONNECTIONS: (
        "Each trial in flight holds one connection to the store: lower --concurrency or "
        "--workers, or raise the server's max_connections (or put a pooler such as PgBouncer "
        "in front of it)"
    ),
}


def shown(url: str, path: Path | None) -> str:
    """The database as people are shown it: the file, or the URL without its password."""
    if path is not None:
        return str(path)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: it is refused elsewhere, say it as given
        return url


def _cause(exc: BaseException) -> str | None:
    """Why the database refused the write, or None when ``exc`` is no such refusal."""
    error = getattr(exc, "orig", None) or exc  # (SQLAlchemy wraps the driver's error)
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _SQLITE_CODES:
            return _SQLITE_CODES[code & 0xFF]
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if isinstance(state, str) and state in _SQLSTATES:
        return _SQLSTATES[state]
    text = str(error).lower()
    return next((cause for words, cause in _WORDS if words in text), None)


def _resume(database: str) -> str:
    """How to carry on once the cause is gone."""
    where = Path(database).parent if "://" not in database else "<run folder>"
    return (
        f"then `harness resume {where}` (an episode of your own: hx.Episode(..., "
        "resume=True)): nothing committed is lost"
    )


def write_failure(
    exc: BaseException, database: str, *, readonly: bool = False
) -> StoreWriteFailed | None:
    """``exc`` as the store's :class:`~harness.errors.StoreWriteFailed` when the database
    refused a write (None when it is another error).

    Args:
        exc: the driver's error, or SQLAlchemy's wrapping it.
        database: the database as :func:`shown` shows it.
        readonly: the store was opened read-only (``Store(readonly=True)``).
    """
    if isinstance(exc, StoreWriteFailed):
        return exc
    cause = _cause(exc)
    if cause is None:
        return None
    error = getattr(exc, "orig", None) or exc
    if readonly and cause == READ_ONLY:
        return StoreWriteFailed(
            database,
            "the store was opened read-only (readonly=True)",
            "Open it without readonly=True to write to it.",
            error,
        )
    return StoreWriteFailed(database, cause, f"{_WHAT_TO_DO[cause]}, {_resume(database)}.", error)


@contextmanager
def writing(database: str, *, readonly: bool = False) -> Iterator[None]:
    """Raise :class:`~harness.errors.StoreWriteFailed` for a write the block's database
    refused (see :func:`write_failure`); the caller has rolled it back, or rolls it back
    on the way out."""
    try:
        yield
    except Exception as exc:
        failed = write_failure(exc, database, readonly=readonly)
        if failed is None or failed is exc:
            raise
        raise failed from exc
