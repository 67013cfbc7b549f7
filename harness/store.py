"""The store: episodes, transactions, checkpoints, escalations and the hash-chained log.

SQLModel defines the schema and serves the queries people make (``Store.episodes()`` ...); the
per-action writes go through prebuilt SQL on a raw driver connection (:class:`EpisodeWriter`),
because an ORM round-trip per action would cost more than the action's whole budget.
Every log record carries the hash of the one before it in its episode, and the episode row
keeps the head of its chain, so an edit, a removal or a reordering is detectable.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError
from sqlalchemy.orm import registry
from sqlmodel import Field, Session, SQLModel, select

from ._json import dumps
from .errors import StoreError

__all__ = [
    "ChainReport",
    "CheckpointRow",
    "EpisodeRow",
    "EpisodeWriter",
    "EscalationRow",
    "FaultEventRow",
    "FaultTrialRow",
    "LeaseRow",
    "LogRow",
    "RunRow",
    "Store",
    "TransactionRow",
    "TrialRow",
    "record_hash",
]

SCHEMA_VERSION = 1
GENESIS = "0" * 64
DEFAULT_URL = "sqlite:///logs/harness.db"


class _Base(SQLModel, registry=registry()):
    """Tables of the harness, in their own metadata so users' SQLModel tables stay separate."""


class MetaRow(_Base, table=True):
    __tablename__ = "hx_meta"
    key: str = Field(primary_key=True)
    value: str


class RunRow(_Base, table=True):
    """One run of a suite: many trials (episodes)."""

    __tablename__ = "hx_run"
    id: str = Field(primary_key=True)
    created_at: float
    suite: str = ""
    status: str = "running"
    config: str = "{}"
    evidence: str = "{}"


class EpisodeRow(_Base, table=True):
    """One agent execution: its outcome, its chain head and its last checkpoint."""

    __tablename__ = "hx_episode"
    id: str = Field(primary_key=True)
    run_id: str | None = Field(default=None, index=True)
    task_id: str | None = None
    trial: int | None = None
    status: str = "running"
    created_at: float
    updated_at: float
    policy: str = "{}"
    meta: str = "{}"
    steps: int = 0
    digest: str = GENESIS
    log_count: int = 0
    head_hash: str = GENESIS


class TrialRow(_Base, table=True):
    """One trial of a task in a run: its verdict, outcome and the evidence behind them."""

    __tablename__ = "hx_trial"
    id: str = Field(primary_key=True)
    run_id: str = Field(index=True)
    task_id: str
    task_version: str = "1"
    trial: int
    seed: int
    episode_id: str
    passed: bool = False
    partial: float | None = None
    outcome: str = "running"
    infra_error: bool = False
    failures: str = "{}"
    steps: str = "[]"
    message: str = ""
    verdict: str = "{}"
    agent_meta: str = "{}"
    duration: float = 0.0
    created_at: float


class TransactionRow(_Base, table=True):
    """One call of an action: intent, outcome, evidence."""

    __tablename__ = "hx_transaction"
    # Clustered by (episode, seq) without a rowid: one B-tree per write on the hot path.
    __table_args__ = {"sqlite_with_rowid": False}
    episode_id: str = Field(primary_key=True)
    seq: int = Field(primary_key=True)
    id: str
    action: str
    idem_key: str
    args: str
    status: str
    mutating: bool = True
    failure_class: str | None = None
    decision: str | None = None
    reason: str | None = None
    result: str | None = None
    before: str | None = None
    diff: str | None = None
    attempts: int = 0
    errors: str = "[]"
    started_at: float
    ended_at: float | None = None
    duration: float | None = None
    step: int | None = None


class CheckpointRow(_Base, table=True):
    """A compact checkpoint: the step index and the state digest after it, never a copy."""

    __tablename__ = "hx_checkpoint"
    __table_args__ = {"sqlite_with_rowid": False}
    episode_id: str = Field(primary_key=True)
    step: int = Field(primary_key=True)
    txn_id: str
    digest: str
    created_at: float


class EscalationRow(_Base, table=True):
    """A decision left to a person: what, why, the evidence, and who resolved it how."""

    __tablename__ = "hx_escalation"
    id: str = Field(primary_key=True)
    episode_id: str = Field(index=True)
    txn_id: str
    action: str
    idem_key: str
    args: str
    failure_class: str
    reason: str
    evidence: str = "{}"
    status: str = "pending"
    created_at: float
    deadline: float | None = None
    fallback: str = "reject"
    resolved_by: str | None = None
    resolved_at: float | None = None
    resolution_reason: str | None = None
    edit: str | None = None


class LogRow(_Base, table=True):
    """One record of an episode's hash-chained log."""

    __tablename__ = "hx_log"
    __table_args__ = {"sqlite_with_rowid": False}
    episode_id: str = Field(primary_key=True)
    seq: int = Field(primary_key=True)
    txn_id: str | None = None
    kind: str
    payload: str
    ts: float
    prev_hash: str
    hash: str


class FaultEventRow(_Base, table=True):
    """One injected fault (``harness.faults``) and what the harness made of it."""

    __tablename__ = "hx_fault_event"
    id: str = Field(primary_key=True)
    run_id: str | None = Field(default=None, index=True)
    episode_id: str = Field(index=True)
    task_id: str | None = None
    trial: int | None = None
    fault: str
    kind: str
    tool: str
    instance: str
    txn_id: str | None = None
    attempt: int | None = None
    call: int = 0
    at: float = 0.0
    wall: float = 0.0
    detail: str = "{}"
    detected: bool = False
    detected_as: str | None = None
    decision: str | None = None
    detect_latency: float | None = None
    recovered: bool = False
    recover_time: float | None = None
    re_executed: int = 0


class FaultTrialRow(_Base, table=True):
    """A trial run under a fault plan: its events and its effects against the committed log."""

    __tablename__ = "hx_fault_trial"
    id: str = Field(primary_key=True)
    run_id: str | None = Field(default=None, index=True)
    task_id: str | None = None
    trial: int | None = None
    events: int = 0
    crashes: int = 0
    planned: bool = False
    executions: int = 0
    duplicated: int = 0
    lost: int = 0
    diverged: int = 0
    unaccounted: int = 0
    held: int = 0
    detail: str = "{}"


class LeaseRow(_Base, table=True):
    """Who executes an episode now: taken under the write lock, renewed, released after."""

    __tablename__ = "hx_lease"
    episode_id: str = Field(primary_key=True)
    owner: str
    pid: int
    host: str
    acquired_at: float
    expires_at: float


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_hash(
    prev: str, episode_id: str, seq: int, kind: str, txn_id: str | None, payload: str, ts: float
) -> str:
    """The hash of one log record, chained to the previous record's hash."""
    text = f"{prev}\x1f{episode_id}\x1f{seq}\x1f{kind}\x1f{txn_id or ''}\x1f{payload}\x1f{ts!r}"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    """What ``verify_chain`` found: ``ok``, and the first bad record if not."""

    ok: bool
    episodes: int
    records: int
    episode_id: str | None = None
    seq: int | None = None
    reason: str = ""


class JsonLines:
    """structlog's sink for the JSON-lines log: whole lines, appended in batches.

    Lines are buffered and written with one ``write`` per batch of whole lines (so processes
    appending to the same file never split each other's lines), when the buffer passes 64 KiB,
    when a second has passed, and on :meth:`flush` (episodes flush when they end). The
    database is the durable record; these lines are for people and log shippers.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lines: list[str] = []
        self._size = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        """Queue one line."""
        with self._lock:
            self._lines.append(message + "\n")
            self._size += len(message) + 1
            if self._size > 65536 or time.monotonic() - self._last > 1.0:
                self._flush_locked()

    info = debug = warning = error = critical = exception = log = msg

    def _flush_locked(self) -> None:
        if self._lines:
            os.write(self._fd, "".join(self._lines).encode())
            self._lines.clear()
            self._size = 0
        self._last = time.monotonic()

    def flush(self) -> None:
        """Write every queued line."""
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            self._flush_locked()
            os.close(self._fd)


def _stamp(_logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Level and a Unix timestamp: a float is cheap to write and exact to read back."""
    event["level"] = method
    event["ts"] = time.time()
    return event


def _sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _normalise_url(url: str | Path) -> str:
    text = str(url)
    if "://" not in text:
        return f"sqlite:///{text}"
    return text


class Store:
    """A run's records, in SQLite under ``logs/`` by default or any SQLAlchemy URL.

    Args:
        url: ``sqlite:///path.db``, a file path, or another SQLAlchemy URL.
        synchronous: SQLite's ``synchronous`` setting; ``NORMAL`` survives a process crash,
            ``FULL`` survives power loss too.
    """

    def __init__(self, url: str | Path = DEFAULT_URL, *, synchronous: str = "NORMAL") -> None:
        self.url = _normalise_url(url)
        if synchronous.upper() not in {"NORMAL", "FULL", "EXTRA", "OFF"}:
            raise StoreError(f"Store(synchronous={synchronous!r}): use 'NORMAL' or 'FULL'")
        self.synchronous = synchronous.upper()
        try:
            self.path = _sqlite_path(self.url)
        except (ArgumentError, ValueError) as exc:
            raise StoreError(
                f"store URL {self.url!r} is not a database URL ({exc}); "
                "give sqlite:///logs/harness.db, a file path, or postgresql://..."
            ) from exc
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"store {self.url!r}: cannot create folder {self.path.parent} ({exc})"
                ) from exc
        try:
            self.engine: Engine = create_engine(self.url)
        except Exception as exc:  # a missing driver or a malformed URL, whatever SQLAlchemy says
            raise StoreError(f"store URL {self.url!r} does not open: {exc}") from exc
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", self._sqlite_pragmas)
        self._open_schema()
        self._jsonl_lock = threading.Lock()
        self._jsonl_file: Any = None
        self._lease_lock = threading.Lock()
        self._lease_conn: Any = None

    def _sqlite_pragmas(self, dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={self.synchronous}")
        cur.execute("PRAGMA busy_timeout=30000")
        # Checkpoint the WAL every ~40 MB instead of every ~4 MB: a checkpoint syncs the
        # database file, and the hot path writes several pages per action.
        cur.execute("PRAGMA wal_autocheckpoint=10000")
        cur.close()

    def _open_schema(self) -> None:
        for attempt in range(5):
            try:
                self._create_schema()
                return
            except OperationalError as exc:
                # Two processes opening a new store at once: one creates a table between the
                # other's check and its CREATE. The second look sees it.
                if "already exists" not in str(exc) or attempt == 4:
                    raise StoreError(
                        f"store {self.url!r} does not open as a database ({exc.orig}); "
                        "point it at a new file or a healthy database"
                    ) from exc
                time.sleep(0.05 * (attempt + 1))

    def _create_schema(self) -> None:
        try:
            with self.engine.begin() as conn:
                existing = set(inspect(conn).get_table_names())
                if "hx_meta" in existing:
                    row = conn.exec_driver_sql(
                        "SELECT value FROM hx_meta WHERE key = 'schema_version'"
                    ).fetchone()
                    version = int(row[0]) if row else 0
                    if version > SCHEMA_VERSION:
                        raise StoreError(
                            f"store {self.url!r} has schema version {version}, newer than this "
                            f"harness understands ({SCHEMA_VERSION}); upgrade harness to read it"
                        )
                _Base.metadata.create_all(conn)
                if "hx_meta" not in existing:
                    conn.exec_driver_sql(
                        "INSERT INTO hx_meta(key, value) VALUES ('schema_version', ?)"
                        if self.engine.dialect.paramstyle == "qmark"
                        else "INSERT INTO hx_meta(key, value) VALUES ('schema_version', %s)",
                        (str(SCHEMA_VERSION),),
                    )
        except StoreError:
            raise
        except OperationalError as exc:
            if "already exists" in str(exc):
                raise
            raise StoreError(
                f"store {self.url!r} does not open as a database ({exc.orig}); "
                "point it at a new file or a healthy database"
            ) from exc
        except DatabaseError as exc:
            raise StoreError(
                f"store {self.url!r} does not open as a database ({exc.orig}); "
                "point it at a new file or a healthy database"
            ) from exc

    # --- the hot path ---
    def writer(self, episode_id: str) -> EpisodeWriter:
        """A writer bound to one episode, on its own driver connection."""
        return EpisodeWriter(self, episode_id)

    def raw_connection(self) -> Any:
        """A DBAPI connection with the store's pragmas; the caller commits and closes it."""
        if self.path is not None:
            conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._sqlite_pragmas(conn, None)
            return conn
        return self.engine.raw_connection()

    def jsonl(self, **bound: Any) -> Any:
        """A structlog logger writing JSON lines beside the database, bound to ``bound``."""
        with self._jsonl_lock:
            if self._jsonl_file is None:
                target = (
                    self.path.with_suffix(".jsonl")
                    if self.path is not None
                    else Path("logs/harness.jsonl")
                )
                target.parent.mkdir(parents=True, exist_ok=True)
                self._jsonl_file = JsonLines(target)
        return structlog.wrap_logger(
            self._jsonl_file,
            processors=[_stamp, structlog.processors.JSONRenderer(serializer=dumps)],
        ).bind(**bound)

    # --- queries ---
    @contextmanager
    def session(self) -> Iterator[Session]:
        """A SQLModel session for ad-hoc queries."""
        with Session(self.engine) as s:
            yield s

    def runs(self) -> list[RunRow]:
        """Every run, oldest first."""
        with self.session() as s:
            return list(s.exec(select(RunRow).order_by(RunRow.created_at)))  # type: ignore[arg-type]

    def trials(self, run_id: str | None = None) -> list[TrialRow]:
        """Trials, in the order they finished; only those of ``run_id`` when given."""
        with self.session() as s:
            q = select(TrialRow)
            if run_id is not None:
                q = q.where(TrialRow.run_id == run_id)
            return list(s.exec(q.order_by(TrialRow.created_at)))  # type: ignore[arg-type]

    def add(self, row: _Base) -> None:
        """Insert or replace one row (off the hot path: runs and trials)."""
        with self.session() as s:
            s.merge(row)
            s.commit()

    def episodes(self, run_id: str | None = None) -> list[EpisodeRow]:
        """Episodes, oldest first; only those of ``run_id`` when given."""
        with self.session() as s:
            q = select(EpisodeRow)
            if run_id is not None:
                q = q.where(EpisodeRow.run_id == run_id)
            return list(s.exec(q.order_by(EpisodeRow.created_at)))  # type: ignore[arg-type]

    def episode(self, episode_id: str) -> EpisodeRow | None:
        """One episode's row, or None."""
        with self.session() as s:
            return s.get(EpisodeRow, episode_id)

    def transactions(self, episode_id: str) -> list[TransactionRow]:
        """An episode's finished transactions in the order they started.

        A transaction in flight (or in doubt after a crash) is its ``intent`` record in the
        log until its outcome is written.
        """
        with self.session() as s:
            q = select(TransactionRow).where(TransactionRow.episode_id == episode_id)
            return list(s.exec(q.order_by(TransactionRow.seq)))  # type: ignore[arg-type]

    def checkpoints(self, episode_id: str) -> list[CheckpointRow]:
        """An episode's checkpoints in step order."""
        with self.session() as s:
            q = select(CheckpointRow).where(CheckpointRow.episode_id == episode_id)
            return list(s.exec(q.order_by(CheckpointRow.step)))  # type: ignore[arg-type]

    def log(self, episode_id: str) -> list[LogRow]:
        """An episode's log records in chain order."""
        with self.session() as s:
            q = select(LogRow).where(LogRow.episode_id == episode_id)
            return list(s.exec(q.order_by(LogRow.seq)))  # type: ignore[arg-type]

    def escalations(
        self, status: str | None = None, *, episode_id: str | None = None
    ) -> list[EscalationRow]:
        """Escalations, oldest first, filtered by ``status`` and ``episode_id`` when given."""
        with self.session() as s:
            q = select(EscalationRow)
            if status is not None:
                q = q.where(EscalationRow.status == status)
            if episode_id is not None:
                q = q.where(EscalationRow.episode_id == episode_id)
            return list(s.exec(q.order_by(EscalationRow.created_at)))  # type: ignore[arg-type]

    def resolve(
        self,
        escalation_id: str,
        decision: str,
        *,
        by: str,
        reason: str = "",
        edit: Mapping[str, Any] | None = None,
    ) -> EscalationRow:
        """Record a person's decision on a pending escalation.

        Args:
            escalation_id: the id from ``Escalated.escalation_id`` or ``escalations()``.
            decision: ``approve`` (run the action as proposed), ``reject`` (do not run it; the
                agent is told) or ``edit`` (run it with the arguments in ``edit``).
            by: who decided.
            reason: why.
            edit: the replacement arguments, required with ``edit``.
        """
        if decision not in {"approve", "reject", "edit"}:
            raise StoreError(
                f"resolve({escalation_id!r}, decision={decision!r}): "
                "decision must be 'approve', 'reject' or 'edit'"
            )
        if decision == "edit" and not isinstance(edit, Mapping):
            raise StoreError(f"resolve({escalation_id!r}, 'edit'): give edit={{...}} arguments")
        if not by:
            raise StoreError(f"resolve({escalation_id!r}): say who decided with by='name'")
        edit_json = dumps(dict(edit)) if edit is not None else None
        status = {"approve": "approved", "reject": "rejected", "edit": "edited"}[decision]
        row = self._escalation(escalation_id)
        writer = self.writer(row.episode_id)
        try:
            # One database transaction, under the write lock: the status check, the update and
            # the log record land together or not at all, and two people cannot both resolve.
            with writer.batch():
                current = self._escalation(escalation_id, writer)
                if current.status != "pending":
                    raise StoreError(
                        f"escalation {escalation_id} is already {current.status} by "
                        f"{current.resolved_by}; nothing was changed"
                    )
                writer.load_head()
                writer.update_escalation(
                    escalation_id,
                    {
                        "status": status,
                        "resolved_by": by,
                        "resolved_at": time.time(),
                        "resolution_reason": reason,
                        "edit": edit_json,
                    },
                )
                writer.append(
                    "resolution",
                    row.txn_id,
                    {
                        "escalation_id": row.id,
                        "decision": decision,
                        "by": by,
                        "reason": reason,
                        "edit": edit,
                    },
                )
                writer.update_head()
        finally:
            writer.close()
        return self._escalation(escalation_id)

    def _escalation(self, escalation_id: str, writer: EpisodeWriter | None = None) -> EscalationRow:
        if writer is not None:
            found = writer.select_escalation(escalation_id)
        else:
            with self.session() as s:
                found = s.get(EscalationRow, escalation_id)
        if found is None:
            raise StoreError(f"no escalation {escalation_id!r} in {self.url}")
        return found

    def verify_chain(self, episode_id: str | None = None) -> ChainReport:
        """Recompute each hash chain; report the first altered, missing or moved record."""
        episodes = [self.episode(episode_id)] if episode_id else self.episodes()
        total = 0
        for ep in episodes:
            if ep is None:
                return ChainReport(False, 0, 0, episode_id, None, "episode not found")
            prev = GENESIS
            rows = self.log(ep.id)
            for expected_seq, row in enumerate(rows, start=1):
                total += 1
                if row.seq != expected_seq:
                    return ChainReport(
                        False,
                        len(episodes),
                        total,
                        ep.id,
                        expected_seq,
                        f"record {expected_seq} is missing or out of order (found {row.seq})",
                    )
                if row.prev_hash != prev:
                    return ChainReport(
                        False,
                        len(episodes),
                        total,
                        ep.id,
                        row.seq,
                        "prev_hash does not match the previous record: removed or reordered",
                    )
                h = record_hash(
                    row.prev_hash,
                    row.episode_id,
                    row.seq,
                    row.kind,
                    row.txn_id,
                    row.payload,
                    row.ts,
                )
                if h != row.hash:
                    return ChainReport(
                        False,
                        len(episodes),
                        total,
                        ep.id,
                        row.seq,
                        "content does not match its hash: the record was altered",
                    )
                prev = row.hash
            problem = self._witness_problem(ep, rows)
            if problem:
                return ChainReport(False, len(episodes), total, ep.id, problem[0], problem[1])
        return ChainReport(True, len(episodes), total)

    @staticmethod
    def _witness_problem(ep: EpisodeRow, rows: list[LogRow]) -> tuple[int, str] | None:
        """Check the chain against the episode row's witness (record count and head hash).

        The witness moves with every outcome, not with intents, so a crashed episode may end
        with intents past it; anything else past it, or a chain shorter than it, was tampered.
        """
        if len(rows) < ep.log_count:
            return (
                len(rows) + 1,
                f"chain ends at record {len(rows)} but the episode recorded {ep.log_count}: "
                "records were removed from the end",
            )
        if ep.log_count and rows[ep.log_count - 1].hash != ep.head_hash:
            return ep.log_count, "the episode's recorded head does not match this record"
        extra = rows[ep.log_count :]
        if extra and (ep.status != "running" or any(r.kind != "intent" for r in extra)):
            return (
                ep.log_count + 1,
                f"{len(extra)} record(s) after the episode's recorded head "
                f"({ep.status}): appended outside the harness",
            )
        return None

    # --- leases: one process executes an episode at a time ---
    def acquire_lease(self, episode_id: str, *, owner: str, seconds: float = 600.0) -> bool:
        """Take (or renew) the lease on ``episode_id`` for ``seconds``; False if it is held.

        Checked and written in one transaction under the write lock, so two processes cannot
        both take it. A lease is free when it expired, or when its holder ran on this host and
        its process is gone (a crashed run's leases do not block its resume).
        """
        now = time.time()
        host, pid = socket.gethostname(), os.getpid()
        with self._lease_lock:
            conn = self._lease_connection()
            sqlite = isinstance(conn, sqlite3.Connection)
            mark = "?" if sqlite else "%s"
            cur = conn.cursor()
            try:
                if sqlite:
                    cur.execute("BEGIN IMMEDIATE")
                else:
                    cur.execute("LOCK TABLE hx_lease IN SHARE ROW EXCLUSIVE MODE")
                cur.execute(
                    f"SELECT owner, pid, host, expires_at FROM hx_lease WHERE episode_id = {mark}",
                    (episode_id,),
                )
                held = cur.fetchone()
                if (
                    held is not None
                    and held[0] != owner
                    and held[3] > now
                    and (held[2] != host or _pid_alive(int(held[1])))
                ):
                    conn.rollback()
                    return False
                cur.execute(f"DELETE FROM hx_lease WHERE episode_id = {mark}", (episode_id,))
                cur.execute(
                    "INSERT INTO hx_lease (episode_id, owner, pid, host, acquired_at, expires_at) "
                    f"VALUES ({', '.join([mark] * 6)})",
                    (episode_id, owner, pid, host, now, now + seconds),
                )
                conn.commit()
                return True
            except BaseException:
                conn.rollback()
                raise
            finally:
                cur.close()

    def release_lease(self, episode_id: str, *, owner: str) -> None:
        """Give the lease on ``episode_id`` back (only its owner can)."""
        with self._lease_lock:
            conn = self._lease_connection()
            mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
            cur = conn.cursor()
            try:
                cur.execute(
                    f"DELETE FROM hx_lease WHERE episode_id = {mark} AND owner = {mark}",
                    (episode_id, owner),
                )
                conn.commit()
            finally:
                cur.close()

    @contextmanager
    def lease(self, episode_id: str, *, owner: str, seconds: float = 600.0) -> Iterator[bool]:
        """Hold the lease on ``episode_id`` while the block runs, renewing it every third of
        ``seconds``; yields False (and holds nothing) when another process has it."""
        if not self.acquire_lease(episode_id, owner=owner, seconds=seconds):
            yield False
            return
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(seconds / 3):
                self.acquire_lease(episode_id, owner=owner, seconds=seconds)

        keeper = threading.Thread(target=renew, name=f"lease-{episode_id}", daemon=True)
        keeper.start()
        try:
            yield True
        finally:
            stop.set()
            keeper.join()
            self.release_lease(episode_id, owner=owner)

    def leases(self) -> list[LeaseRow]:
        """The leases held now (expired ones included)."""
        with self.session() as s:
            return list(s.exec(select(LeaseRow)))

    def _lease_connection(self) -> Any:
        if self._lease_conn is None:
            self._lease_conn = self.raw_connection()
        return self._lease_conn

    def flush_log(self) -> None:
        """Write the JSON lines queued so far."""
        with self._jsonl_lock:
            if self._jsonl_file is not None:
                self._jsonl_file.flush()

    def close(self) -> None:
        """Release connections and the JSON-lines file."""
        with self._lease_lock:
            if self._lease_conn is not None:
                self._lease_conn.close()
                self._lease_conn = None
        self.engine.dispose()
        with self._jsonl_lock:
            if self._jsonl_file is not None:
                self._jsonl_file.close()
                self._jsonl_file = None


def _placeholders(paramstyle: str, names: list[str]) -> list[str]:
    if paramstyle in ("named", "qmark", "numeric"):
        return [f":{n}" for n in names]
    return [f"%({n})s" for n in names]


def _insert_sql(
    table: Any, paramstyle: str, skip: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """A prebuilt INSERT and the column defaults (missing columns take the model's default)."""
    cols = [c.name for c in table.__table__.columns if c.name not in skip]
    marks = _placeholders(paramstyle, cols)
    sql = f"INSERT INTO {table.__tablename__} ({', '.join(cols)}) VALUES ({', '.join(marks)})"
    defaults = {}
    for name in cols:
        info = table.model_fields[name]
        defaults[name] = None if info.is_required() else info.get_default(call_default_factory=True)
    return sql, defaults


class EpisodeWriter:
    """Prebuilt statements on one driver connection, for one episode's hot path.

    ``batch()`` groups writes into one database transaction; ``append`` extends the episode's
    hash chain. Not thread-safe by design: an episode runs in one thread.
    """

    def __init__(self, store: Store, episode_id: str) -> None:
        self.store = store
        self.episode_id = episode_id
        self.conn = store.raw_connection()
        self._sqlite = isinstance(self.conn, sqlite3.Connection)
        style = "named" if self._sqlite else store.engine.dialect.paramstyle
        mark = _placeholders(style, ["x"])[0]

        def p(name: str) -> str:
            return mark.replace("x", name)

        self._ins_txn, self._txn_cols = _insert_sql(TransactionRow, style)
        self._ins_ep, self._ep_cols = _insert_sql(EpisodeRow, style)
        self._ins_log, _ = _insert_sql(LogRow, style)
        self._ins_cp, _ = _insert_sql(CheckpointRow, style)
        self._ins_esc, self._esc_cols = _insert_sql(EscalationRow, style)
        self._upd_ep = (
            f"UPDATE hx_episode SET status={p('status')}, updated_at={p('updated_at')}, "
            f"steps={p('steps')}, digest={p('digest')}, log_count={p('log_count')}, "
            f"head_hash={p('head_hash')} WHERE id={p('id')}"
        )
        self._p = p
        self._updates: dict[tuple[str, ...], str] = {}
        self.seq = 0
        self.head = GENESIS
        self._cursor = self.conn.cursor()
        self._depth = 0

    def _exec(self, sql: str, params: Mapping[str, Any]) -> None:
        self._cursor.execute(sql, params)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One database transaction; nested batches join the outer one."""
        self._depth += 1
        chain = (self.seq, self.head)
        if self._depth == 1 and self._sqlite:
            self._exec("BEGIN IMMEDIATE", {})
        try:
            yield
        except BaseException:
            if self._depth == 1:
                self.conn.rollback()
                # The records of this batch are gone: so is their place in the chain.
                self.seq, self.head = chain
            raise
        else:
            if self._depth == 1:
                self.conn.commit()
        finally:
            self._depth -= 1

    def select_escalation(self, escalation_id: str) -> EscalationRow | None:
        """Read one escalation on this connection (inside a batch: under its lock)."""
        cols = list(self._esc_cols)
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT {', '.join(cols)} FROM hx_escalation WHERE id = {self._p('id')}",
            {"id": escalation_id},
        )
        found = cur.fetchone()
        return None if found is None else EscalationRow(**dict(zip(cols, found, strict=True)))

    def update_escalation(self, escalation_id: str, fields: Mapping[str, Any]) -> None:
        """Update some columns of an escalation."""
        sets = ", ".join(f"{k}={self._p(k)}" for k in fields)
        self._exec(
            f"UPDATE hx_escalation SET {sets} WHERE id={self._p('id_')}",
            {**fields, "id_": escalation_id},
        )

    def load_head(self) -> None:
        """Continue an existing episode's chain from its last record."""
        cur = self.conn.cursor()
        cur.execute(
            "SELECT seq, hash FROM hx_log WHERE episode_id = "
            + self._p("e")
            + " ORDER BY seq DESC LIMIT 1",
            {"e": self.episode_id},
        )
        row = cur.fetchone()
        if row is not None:
            self.seq, self.head = int(row[0]), str(row[1])

    def append(self, kind: str, txn_id: str | None, payload: Mapping[str, Any]) -> str:
        """Add one record to the chain; returns its hash."""
        return self.append_text(kind, txn_id, dumps(payload))

    def append_text(self, kind: str, txn_id: str | None, text: str) -> str:
        """Add one record whose payload is already JSON text; returns its hash."""
        ts = time.time()
        self.seq += 1
        h = record_hash(self.head, self.episode_id, self.seq, kind, txn_id, text, ts)
        self._exec(
            self._ins_log,
            {
                "episode_id": self.episode_id,
                "seq": self.seq,
                "txn_id": txn_id,
                "kind": kind,
                "payload": text,
                "ts": ts,
                "prev_hash": self.head,
                "hash": h,
            },
        )
        self.head = h
        return h

    def insert_episode(self, row: Mapping[str, Any]) -> None:
        """Insert the episode's row."""
        self._exec(self._ins_ep, {**self._ep_cols, **row})

    def update_episode(self, *, status: str, steps: int, digest: str) -> None:
        """Record the episode's status, checkpoint and chain head."""
        self._exec(
            self._upd_ep,
            {
                "status": status,
                "updated_at": time.time(),
                "steps": steps,
                "digest": digest,
                "log_count": self.seq,
                "head_hash": self.head,
                "id": self.episode_id,
            },
        )

    def update_head(self) -> None:
        """Record the chain head on the episode row, leaving its status alone."""
        self._exec(
            f"UPDATE hx_episode SET log_count={self._p('n')}, head_hash={self._p('h')} "
            f"WHERE id={self._p('id')}",
            {"n": self.seq, "h": self.head, "id": self.episode_id},
        )

    def insert_txn(self, row: Mapping[str, Any]) -> None:
        """Insert a transaction row (its intent, or a whole record for a read)."""
        self._exec(self._ins_txn, {**self._txn_cols, **row})

    def update_txn(self, txn_id: str, fields: Mapping[str, Any]) -> None:
        """Update some columns of a transaction row (statements cached by column set)."""
        cols = tuple(fields)
        sql = self._updates.get(cols)
        if sql is None:
            sets = ", ".join(f"{k}={self._p(k)}" for k in cols)
            sql = self._updates[cols] = (
                f"UPDATE hx_transaction SET {sets} "
                f"WHERE episode_id={self._p('ep_')} AND seq={self._p('seq_')}"
            )
        self._exec(sql, {**fields, "ep_": self.episode_id, "seq_": int(txn_id.rsplit(":", 1)[1])})

    def checkpoint(self, step: int, txn_id: str, digest: str) -> None:
        """Insert a compact checkpoint."""
        self._exec(
            self._ins_cp,
            {
                "episode_id": self.episode_id,
                "step": step,
                "txn_id": txn_id,
                "digest": digest,
                "created_at": time.time(),
            },
        )

    def insert_escalation(self, row: Mapping[str, Any]) -> str:
        """Insert an escalation; returns its id."""
        esc_id = row.get("id") or uuid.uuid4().hex[:12]
        self._exec(self._ins_esc, {**self._esc_cols, **row, "id": esc_id})
        return str(esc_id)

    def close(self) -> None:
        """Close the connection."""
        try:
            self._cursor.close()
            self.conn.close()
        except Exception:  # closing twice or after the database went away is harmless
            pass
