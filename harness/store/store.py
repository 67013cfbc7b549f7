"""The :class:`Store`: opening the database, queries, escalations, the chain check and
leases."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError
from sqlmodel import Session, col, func, select

from .._json import dumps
from ..errors import StoreError
from .chain import _Chain
from .failures import shown, write_failure, writing
from .jsonlines import EpisodeLog, JsonLines, _stamp
from .leases import _Leases
from .projection import derive
from .records import Escalation, Transaction, Trial
from .signing import PublicKey, SigningKey, sign_episode
from .statuses import RESOLVED_AS, EscalationStatus
from .tables import (
    DEFAULT_URL,
    SCHEMA_VERSION,
    CheckpointRow,
    EpisodeRow,
    EscalationRow,
    LogRow,
    RunRow,
    SignatureRow,
    TransactionRow,
    TrialRow,
    _Base,
    log_range,
)
from .verify import VerifyReport, verify_store
from .writer import EpisodeWriter


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for another database, or SQLite in memory).

    Raises:
        sqlalchemy.exc.ArgumentError: ``url`` is not a database URL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _normalise_url(url: str | Path) -> str:
    text = str(url)
    if "://" not in text:
        return f"sqlite:///{text}"
    return text


# The Postgres advisory lock the schema's creation holds (a constant: "hx" schema).
_SCHEMA_LOCK = 0x6878_5343


_EPISODE_COLUMNS = tuple(EpisodeRow.model_fields)
_EPISODE_SELECT = f"SELECT {', '.join(_EPISODE_COLUMNS)} FROM hx_episode WHERE id = ?"
_LAST_SEQ = "SELECT max(seq) FROM hx_log WHERE id BETWEEN ? AND ?"
_TRANSACTION_COLUMNS = tuple(TransactionRow.model_fields)
_TRANSACTIONS_SELECT = (
    f"SELECT {', '.join(_TRANSACTION_COLUMNS)} FROM hx_transaction WHERE episode_id = ? "
    "ORDER BY seq"
)


def _transaction_row(values: Sequence[Any]) -> TransactionRow:
    """A transaction's row from its columns as SQLite gives them (``mutating`` as 0 or 1)."""
    row = dict(zip(_TRANSACTION_COLUMNS, values, strict=True))
    row["mutating"] = bool(row["mutating"])
    return TransactionRow(**row)


class _Session(Session):
    """A SQLModel session whose writes (its flushes and commits) raise
    :class:`~harness.errors.StoreWriteFailed` when the database refuses them; the session
    rolls the refused write back when it closes."""

    database = ""
    readonly = False

    def flush(self, objects: Sequence[Any] | None = None) -> None:
        with writing(self.database, readonly=self.readonly):
            super().flush(objects)

    def commit(self) -> None:
        with writing(self.database, readonly=self.readonly):
            super().commit()


class Store(_Chain, _Leases):
    """A run's records, in SQLite under ``logs/`` by default or any SQLAlchemy URL.

    Args:
        url: ``sqlite:///path.db``, a file path, or another SQLAlchemy URL.
        synchronous: SQLite's ``synchronous`` setting; ``NORMAL`` survives a process crash,
            ``FULL`` survives power loss too.
        create: make the SQLite file (and its folder) when it does not exist. Without it a
            missing file is a :class:`StoreError`, so a mistyped path is not silently a new,
            empty store. Other databases must exist already (connecting fails otherwise).
        readonly: open for reading only: SQLite is opened ``mode=ro`` (immutable when no
            write-ahead log is beside it), no table or meta row is created, no pragma that
            writes is set. A file that is not a harness store of this schema version (empty,
            or without ``hx_meta``) is a :class:`StoreError`; nothing is written.
    """

    def __init__(
        self,
        url: str | Path = DEFAULT_URL,
        *,
        synchronous: str = "NORMAL",
        create: bool = False,
        readonly: bool = False,
    ) -> None:
        self.url = _normalise_url(url)
        self.readonly = readonly
        if synchronous.upper() not in {"NORMAL", "FULL", "EXTRA", "OFF"}:
            raise StoreError(f"Store(synchronous={synchronous!r}): use 'NORMAL' or 'FULL'")
        self.synchronous = synchronous.upper()
        try:
            self.path = sqlite_file(self.url)
        except (ArgumentError, ValueError) as exc:
            raise StoreError(
                f"store URL {self.url!r} is not a database URL ({exc}); "
                "give sqlite:///logs/harness.db, a file path, or postgresql://..."
            ) from exc
        self.database = shown(self.url, self.path)
        if self.path is not None and not self.path.exists():
            if not create or readonly:
                raise StoreError(
                    f"store {self.url!r}: no database file {self.path}; check the path, or "
                    "pass create=True to create a new store there"
                )
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"store {self.url!r}: cannot create folder {self.path.parent} ({exc})"
                ) from exc
        try:
            if readonly and self.path is not None:
                self.engine: Engine = create_engine(self.url, creator=self._readonly_connection)
            elif self.path is None and not self.url.startswith("sqlite"):
                # An episode in flight holds a connection while it runs: a worker with N
                # trials in flight needs N, so the pool keeps five and opens the rest as asked
                # (the server's max_connections is the bound, refused in words).
                self.engine = create_engine(self.url, pool_size=5, max_overflow=-1)
            else:
                self.engine = create_engine(self.url)
        except Exception as exc:  # a missing driver or a malformed URL, whatever SQLAlchemy says
            raise StoreError(f"store URL {self.url!r} does not open: {exc}") from exc
        if readonly:
            self._check_readable()
        else:
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "connect", self._sqlite_pragmas)
            self._open_schema()
        self._jsonl_lock = threading.Lock()
        self._jsonl_file: Any = None
        self._pool_lock = threading.Lock()
        self._pool_idle: list[Any] = []
        self._pool_closed = False
        self._gate_key = None if self.path is None else os.path.realpath(self.path)
        self._snapshot = threading.local()

    def _readonly_connection(self) -> sqlite3.Connection:
        """A read-only SQLite connection (``readonly=True``): it cannot write the file. With no
        write-ahead log or rollback journal beside the file it is opened immutable, so not
        even a -shm file is made; with one, read-only, reading what the log holds (a hot
        journal refuses it: the write it undoes would be read half done)."""
        assert self.path is not None
        beside = any(Path(f"{self.path}{end}").exists() for end in ("-wal", "-journal"))
        mode = "mode=ro" if beside else "mode=ro&immutable=1"
        conn = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?{mode}", uri=True, check_same_thread=False
        )
        conn.execute("PRAGMA query_only=1")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _check_readable(self) -> None:
        """``readonly=True``: refuse, writing nothing, a database that is not a harness store
        of this schema version."""
        where = self.path if self.path is not None else self.url
        try:
            with self.engine.connect() as conn:
                tables = set(inspect(conn).get_table_names())
                row = (
                    conn.exec_driver_sql(
                        "SELECT value FROM hx_meta WHERE key = 'schema_version'"
                    ).fetchone()
                    if "hx_meta" in tables
                    else None
                )
        except (DatabaseError, sqlite3.Error) as exc:
            self.engine.dispose()
            orig = getattr(exc, "orig", exc)
            if getattr(orig, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK":
                raise StoreError(
                    f"{where} holds an unfinished write in {Path(f'{where}-journal').name} "
                    "(a write cut short: a full disk, a crash), which SQLite undoes the next "
                    "time the store is opened for writing; read now, it would show that write "
                    "half done, so nothing was read or written. Open it for writing once "
                    f"(`harness resume {Path(str(where)).parent}`, or hx.Store(path)) to undo "
                    "it: nothing committed is lost"
                ) from exc
            raise StoreError(
                f"{where} does not open as a database ({getattr(exc, 'orig', exc)}); "
                "nothing was written"
            ) from exc
        if row is None:
            self.engine.dispose()
            empty = "is empty" if not tables else "has no harness tables (no hx_meta)"
            raise StoreError(
                f"{where} {empty}: it is not a harness store; nothing was written. Give the "
                "harness.db of a run folder"
            )
        version = int(row[0])
        if version != SCHEMA_VERSION:
            self.engine.dispose()
            newer = "newer" if version > SCHEMA_VERSION else "older"
            raise StoreError(
                f"{where} has schema version {version}, {newer} than this harness reads "
                f"({SCHEMA_VERSION}); nothing was written. Read it with a matching harness"
            )

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
                if self.engine.dialect.name == "postgresql":
                    # Processes creating one new store at once take turns: Postgres's CREATE
                    # TABLE races on its catalog (a duplicate type), not only on "exists".
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                existing = set(inspect(conn).get_table_names())
                version: int | None = None
                if "hx_meta" in existing:
                    row = conn.exec_driver_sql(
                        "SELECT value FROM hx_meta WHERE key = 'schema_version'"
                    ).fetchone()
                    # No row yet: another process is creating this store right now (its
                    # tables are committed before its version row), so it is this version.
                    version = int(row[0]) if row else None
                if version is not None and version > SCHEMA_VERSION:
                    raise StoreError(
                        f"store {self.url!r} has schema version {version}, newer than this "
                        f"harness understands ({SCHEMA_VERSION}); upgrade harness to read it"
                    )
                if version is not None and version < SCHEMA_VERSION:
                    raise StoreError(
                        f"store {self.url!r} has schema version {version}, written by an "
                        f"older harness (this one reads version {SCHEMA_VERSION}: its log "
                        "is keyed by episode number); nothing was changed. Read it with "
                        "the harness that wrote it, or give a new store file"
                    )
                _Base.metadata.create_all(conn)
                if version is None:
                    mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
                    conn.exec_driver_sql(
                        "INSERT INTO hx_meta(key, value) VALUES ('schema_version', "
                        f"{mark}) ON CONFLICT DO NOTHING",
                        (str(SCHEMA_VERSION),),
                    )
        except StoreError:
            raise
        except OperationalError as exc:
            if "already exists" in str(exc):
                raise
            refused = write_failure(exc, self.database)
            if refused is not None:
                raise refused from exc
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
        """A writer bound to one episode, on its own driver connection (on SQLite, one of the
        pool's, given back when the writer closes)."""
        if self.path is not None and not self.readonly:
            return EpisodeWriter(
                self._checkout(),
                self.engine.dialect,
                episode_id,
                database=self.database,
                release=self._checkin,
                gate=self._gated,
            )
        return EpisodeWriter(
            self.raw_connection(), self.engine.dialect, episode_id, database=self.database
        )

    def raw_connection(self) -> Any:
        """A DBAPI connection with the store's pragmas; the caller commits and closes it (a
        read-only store's connection is read-only too)."""
        if self.path is not None and not self.readonly:
            conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._sqlite_pragmas(conn, None)
            return conn
        return self.engine.raw_connection()

    def jsonl(self, **bound: Any) -> Any:
        """A structlog logger writing JSON lines beside the database, bound to ``bound``, in an
        :class:`EpisodeLog` (which sends the hot path's lines in runs)."""
        with self._jsonl_lock:
            if self._jsonl_file is None:
                target = (
                    self.path.with_suffix(".jsonl")
                    if self.path is not None
                    else Path("logs/harness.jsonl")
                )
                target.parent.mkdir(parents=True, exist_ok=True)
                self._jsonl_file = JsonLines(target)
        processors: list[Any] = [_stamp, structlog.processors.JSONRenderer(serializer=dumps)]
        log = structlog.wrap_logger(self._jsonl_file, processors=processors).bind(**bound)
        return EpisodeLog(log, processors, self._jsonl_file, stock=True)

    # --- queries ---
    @contextmanager
    def session(self) -> Iterator[Session]:
        """A SQLModel session for ad-hoc queries (a write the database refuses raises
        :class:`~harness.errors.StoreWriteFailed`); inside :meth:`snapshot`, its one session."""
        pinned = getattr(self._snapshot, "session", None)
        if pinned is not None:
            yield pinned
            return
        with _Session(self.engine) as s:
            s.database, s.readonly = self.database, self.readonly
            yield s

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read of the store from this thread inside the block sees one state of it, as
        of the block's first read, whatever other processes commit meanwhile (a check of a
        run that is still running reads no episode half written): one transaction, repeatable
        read on Postgres, a read transaction on SQLite. Reads only."""
        if getattr(self._snapshot, "session", None) is not None:
            yield
            return
        with _Session(self.engine) as s:
            s.database, s.readonly = self.database, self.readonly
            if self.engine.dialect.name == "postgresql":
                s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            elif self.engine.dialect.name == "sqlite":
                # (the driver begins no transaction for a SELECT: begin one, so that every
                # read sees the same write-ahead log snapshot)
                s.connection().exec_driver_sql("BEGIN")
            self._snapshot.session = s
            try:
                yield
            finally:
                self._snapshot.session = None
                s.rollback()

    def runs(self) -> list[RunRow]:
        """Every run, oldest first."""
        with self.session() as s:
            return list(s.exec(select(RunRow).order_by(RunRow.created_at)))  # type: ignore[arg-type]

    def trials(self, run_id: str | None = None) -> list[Trial]:
        """Trials, in the order they finished; only those of ``run_id`` when given; with their
        verdict, failures, steps and agent metadata as values (:class:`~.records.Trial`)."""
        return [Trial.of(r) for r in self.trial_rows(run_id)]

    def trial_rows(self, run_id: str | None = None) -> list[TrialRow]:
        """Trials as stored (their JSON as text), filtered as :meth:`trials` is."""
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

    def record_verdict(self, episode_id: str, payload: Mapping[str, Any], trial: TrialRow) -> None:
        """Append an episode's ``verdict`` record to its hash chain and store its trial row
        (inserted, or replacing the one with its id) in one database transaction: both are
        written or neither is, so no crash between them leaves a verdict without its row.

        Sign the episode's head after it (:func:`~harness.store.signing.sign_episode`): the
        verdict moves the head.

        Args:
            episode_id: the trial's episode.
            payload: the verdict record's payload (what ``trial`` must agree with).
            trial: the trial's row.

        Raises:
            StoreWriteFailed: the database refused the write (nothing of it was kept).
            StoreError: another error of the driver (nothing of it was kept).
        """
        writer = self.writer(episode_id)
        try:
            with writer.batch():
                writer.load_head()
                if writer.num is None:
                    raise StoreError(
                        f"no episode {episode_id!r} in {self.database} to record a verdict for; "
                        "nothing was written"
                    )
                writer.append("verdict", None, payload)
                writer.update_head()
                writer.put_row(trial)
        finally:
            writer.close()

    def episodes(self, run_id: str | None = None) -> list[EpisodeRow]:
        """Episodes, oldest first; only those of ``run_id`` when given."""
        with self.session() as s:
            q = select(EpisodeRow)
            if run_id is not None:
                q = q.where(EpisodeRow.run_id == run_id)
            return list(s.exec(q.order_by(EpisodeRow.created_at)))  # type: ignore[arg-type]

    def episode(self, episode_id: str) -> EpisodeRow | None:
        """One episode's row, or None."""
        if self._plain_reads():  # (every trial asks several times: a statement, no session)
            with self._pooled() as conn:
                found = conn.execute(_EPISODE_SELECT, (episode_id,)).fetchone()
            if found is None:
                return None
            return EpisodeRow(**dict(zip(_EPISODE_COLUMNS, found, strict=True)))
        with self.session() as s:
            return s.get(EpisodeRow, episode_id)

    def _plain_reads(self) -> bool:
        """Whether a read may go to SQLite on a pooled connection: a SQLite store open for
        writing, outside :meth:`snapshot` (whose reads share its one session)."""
        return (
            self.path is not None
            and not self.readonly
            and getattr(self._snapshot, "session", None) is None
        )

    def transactions(self, episode_id: str) -> list[Transaction]:
        """An episode's finished transactions in the order they started, with their arguments,
        result, state diff and errors as values (:class:`~.records.Transaction`).

        A transaction in flight (or in doubt after a crash) is its ``intent`` record in the
        log until its outcome is written.
        """
        return [Transaction.of(r) for r in self.transaction_rows(episode_id)]

    def transaction_rows(self, episode_id: str) -> list[TransactionRow]:
        """An episode's finished transactions as stored (their JSON as text).

        A transaction in flight (or in doubt after a crash) is its ``intent`` record in the
        log until its outcome is written. Commits of a running (or crashed) episode whose rows
        are not written yet are built from their log records (:mod:`.projection`).
        """
        if self._plain_reads():  # (every trial's verdict reads them: a statement, no session)
            with self._pooled() as conn:
                found = conn.execute(_TRANSACTIONS_SELECT, (episode_id,)).fetchall()
            rows = [_transaction_row(values) for values in found]
        else:
            with self.session() as s:
                q = select(TransactionRow).where(TransactionRow.episode_id == episode_id)
                rows = list(s.exec(q.order_by(TransactionRow.seq)))  # type: ignore[arg-type]
        tail = self.unmaterialised(episode_id, {r.id for r in rows})
        if tail is None or not tail[0]:
            return rows
        return sorted(rows + tail[0], key=lambda r: r.seq)

    def checkpoints(self, episode_id: str) -> list[CheckpointRow]:
        """An episode's checkpoints in step order (built from the log where not yet written,
        as :meth:`transactions` does)."""
        with self.session() as s:
            q = select(CheckpointRow).where(CheckpointRow.episode_id == episode_id)
            rows = list(s.exec(q.order_by(CheckpointRow.step)))  # type: ignore[arg-type]
        tail = self.unmaterialised(episode_id, {c.txn_id for c in rows})
        if tail is None or not tail[1]:
            return rows
        return sorted(rows + tail[1], key=lambda c: c.step)

    def unmaterialised(
        self, episode_id: str, materialised: set[str]
    ) -> tuple[list[TransactionRow], list[CheckpointRow]] | None:
        """Rows the log holds past the episode's witness and its tables do not (None: none)."""
        ep = self.episode(episode_id)
        if ep is None:
            return None
        keys = log_range(ep.num)
        if self._plain_reads():
            with self._pooled() as conn:
                last = conn.execute(_LAST_SEQ, (keys["lo"], keys["hi"])).fetchone()[0]
        else:
            with self.session() as s:
                last = s.exec(
                    select(func.max(LogRow.seq)).where(
                        col(LogRow.id).between(keys["lo"], keys["hi"])
                    )
                ).one()
        if last is None or last <= ep.log_count:
            return None
        return derive(self._log_of(ep), materialised)

    def log(self, episode_id: str) -> list[LogRow]:
        """An episode's log records in chain order."""
        ep = self.episode(episode_id)
        return [] if ep is None else self._log_of(ep)

    def _log_of(self, ep: EpisodeRow) -> list[LogRow]:
        keys = log_range(ep.num)
        with self.session() as s:
            q = select(LogRow).where(col(LogRow.id).between(keys["lo"], keys["hi"]))
            return list(s.exec(q.order_by(LogRow.id)))  # type: ignore[arg-type]

    def escalations(
        self, status: str | None = None, *, episode_id: str | None = None
    ) -> list[Escalation]:
        """Escalations, oldest first, filtered by ``status`` and ``episode_id`` when given, with
        their arguments, evidence and edit as values (:class:`~.records.Escalation`)."""
        return [Escalation.of(r) for r in self.escalation_rows(status, episode_id=episode_id)]

    def escalation_rows(
        self, status: str | None = None, *, episode_id: str | None = None
    ) -> list[EscalationRow]:
        """Escalations as stored (their JSON as text), filtered as :meth:`escalations` is."""
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
        signing_key: SigningKey | None = None,
    ) -> Escalation:
        """Record a person's decision on a pending escalation; returns the escalation as it is
        now.

        Args:
            escalation_id: the id from ``Escalated.escalation_id`` or ``escalations()``.
            decision: ``approve`` (run the action as proposed), ``reject`` (do not run it; the
                agent is told) or ``edit`` (run it with the arguments in ``edit``).
            by: who decided.
            reason: why.
            edit: the replacement arguments, required with ``edit``.
            signing_key: the key the episode is signed with: its head, moved by the decision's
                record, is signed again (without it, an audit with the public key names the
                episode until a resume with the key signs it).
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
        status = RESOLVED_AS[decision]
        row = self._escalation(escalation_id)
        writer = self.writer(row.episode_id)
        try:
            # One database transaction, under the write lock: the status check, the update and
            # the log record land together or not at all, and two people cannot both resolve.
            with writer.batch():
                current = self._escalation(escalation_id, writer)
                if current.status != EscalationStatus.PENDING:
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
        if signing_key is not None:
            sign_episode(self, row.episode_id, signing_key)
        return Escalation.of(self._escalation(escalation_id))

    def _escalation(self, escalation_id: str, writer: EpisodeWriter | None = None) -> EscalationRow:
        if writer is not None:
            found = writer.select_escalation(escalation_id)
        else:
            with self.session() as s:
                found = s.get(EscalationRow, escalation_id)
        if found is None:
            raise StoreError(f"no escalation {escalation_id!r} in {self.url}")
        return found

    def flush_log(self) -> None:
        """Write the JSON lines queued so far."""
        with self._jsonl_lock:
            if self._jsonl_file is not None:
                self._jsonl_file.flush()

    def close_idle(self) -> None:
        """Close the connections kept idle for the next operation; the store stays open.

        SQLite ends a database's write-ahead log with its last connection: once a process's
        trials are done, its run's folder is left as one database file."""
        self._drop_idle()
        self.engine.dispose()

    def close(self) -> None:
        """Release connections and the JSON-lines file."""
        self._close_pool()
        self.engine.dispose()
        with self._jsonl_lock:
            if self._jsonl_file is not None:
                self._jsonl_file.close()
                self._jsonl_file = None

    def verify(
        self,
        run_id: str | None = None,
        *,
        episode: str | None = None,
        public_key: PublicKey | str | Path | None = None,
    ) -> VerifyReport:
        """The full check: every hash chain, every row against the log records that wrote it,
        and, given the public key, every signed episode head and run manifest.

        Args:
            run_id: only this run (its manifest is checked, and a signed episode of it that is
                gone is named); None checks the whole store.
            episode: only this episode.
            public_key: a :class:`PublicKey` or the path of its file (``harness keygen``).

        Returns:
            A :class:`~harness.store.verify.VerifyReport`: ``.ok``, and the first problem of
            each episode or run that has one (``.findings``), naming the bad record.
        """
        if public_key is not None and not isinstance(public_key, PublicKey):
            public_key = PublicKey.load(public_key)
        return verify_store(self, run_id=run_id, episode_id=episode, public_key=public_key)

    def signatures(self) -> list[SignatureRow]:
        """The store's signed facts (episode heads, run manifests), oldest first."""
        with self.session() as s:
            return list(s.exec(select(SignatureRow).order_by(col(SignatureRow.created_at))))
