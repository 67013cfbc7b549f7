"""The hot path: prebuilt SQL on one driver connection per episode (:class:`EpisodeWriter`).

A call's intent and its outcome are one log record each, each its own database transaction
(:meth:`EpisodeWriter.hot`). The transaction rows and checkpoints those records stand for are
materialised in bulk (:mod:`.projection`) by the next other write of the episode, which also
moves the episode row's chain witness.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Dialect

from .._json import dumps, loads
from ..errors import StoreError
from .failures import write_failure
from .projection import HOT_OUTCOMES, checkpoint_row, committed_row
from .tables import (
    GENESIS,
    CheckpointRow,
    EpisodeRow,
    EscalationRow,
    TransactionRow,
    log_key,
    log_range,
    record_hash,
    txn_seq,
)

Projected = tuple[dict[str, Any], "str | None"]
"""A commit's transaction row (all but ``ended_at``, the record's time) and its step digest."""

_LOG_COLUMNS = ("id", "episode_id", "seq", "txn_id", "kind", "payload", "ts", "hash")
"""The log row's columns, in the order :meth:`EpisodeWriter.append_text` gives them."""

FLUSH_EVERY = 1024
"""Hot-path commits held before their rows are materialised even without another write."""


def _unwritable(exc: BaseException, database: str) -> StoreError:
    """A driver's error while writing, as the store's own: :class:`StoreWriteFailed` when the
    database refused the write (disk full, read-only, I/O error, locked)."""
    refused = write_failure(exc, database)
    if refused is not None:
        return refused
    return StoreError(f"the store could not be written ({type(exc).__name__}: {exc})")


def _placeholders(paramstyle: str, names: list[str]) -> list[str]:
    if paramstyle in ("named", "qmark", "numeric"):
        return [f":{n}" for n in names]
    return [f"%({n})s" for n in names]


def _values_sql(name: str, cols: list[str], paramstyle: str, tail: str = "") -> str:
    """An INSERT of ``cols`` into ``name``: positional marks for ``qmark`` (values given as a
    tuple in column order), named ones otherwise."""
    marks = ["?"] * len(cols) if paramstyle == "qmark" else _placeholders(paramstyle, cols)
    return f"INSERT INTO {name} ({', '.join(cols)}) VALUES ({', '.join(marks)}){tail}"


@functools.cache
def _put_sql(table: Any, paramstyle: str) -> tuple[str, list[str]]:
    """An INSERT that leaves an existing row alone (materialising is idempotent), and its
    columns in order (built once a process; not to be changed)."""
    cols = [c.name for c in table.__table__.columns]
    return _values_sql(table.__tablename__, cols, paramstyle, " ON CONFLICT DO NOTHING"), cols


@functools.cache
def _insert_sql(
    table: Any, paramstyle: str, skip: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """A prebuilt INSERT and the column defaults (missing columns take the model's default),
    built once a process (every episode's writer builds the same; not to be changed).

    Raises:
        TypeError: a column's default is a factory (its value would be shared by every row).
    """
    cols = [c.name for c in table.__table__.columns if c.name not in skip]
    marks = _placeholders(paramstyle, cols)
    sql = f"INSERT INTO {table.__tablename__} ({', '.join(cols)}) VALUES ({', '.join(marks)})"
    defaults = {}
    for name in cols:
        info = table.model_fields[name]
        if info.default_factory is not None:
            raise TypeError(f"{table.__name__}.{name}: a default factory; give the value")
        defaults[name] = None if info.is_required() else info.get_default()
    return sql, defaults


class EpisodeWriter:
    """Prebuilt statements on one driver connection, for one episode's hot path.

    ``batch()`` groups writes into one database transaction; ``append`` extends the episode's
    hash chain; ``hot`` writes one record as its own transaction. A batch or a hot write holds
    the writer's lock, so an episode's threads never share its connection at once. A write
    that fails leaves nothing: its transaction is rolled back, and the writer's head (the
    chain's last record, the rows still to write) is where the database's is.

    Args:
        database: the database as people are shown it, for the errors.
    """

    def __init__(
        self,
        connection: Any,
        dialect: Dialect,
        episode_id: str,
        *,
        database: str = "",
        release: Callable[[Any], None] | None = None,
        gate: Callable[[], Any] | None = None,
    ) -> None:
        self.episode_id = episode_id
        # The process's lock around each write transaction (see Store._gated).
        self._gate = gate if gate is not None else contextlib.nullcontext
        self._release = release
        self._taken = connection  # (what goes back to ``release``, whatever wraps it since)
        self.database = database
        self.conn = connection
        self._sqlite = isinstance(self.conn, sqlite3.Connection)
        style = "named" if self._sqlite else dialect.paramstyle
        mark = _placeholders(style, ["x"])[0]

        def p(name: str) -> str:
            return mark.replace("x", name)

        self._ins_txn, self._txn_cols = _insert_sql(TransactionRow, style)
        self._ins_ep, self._ep_cols = _insert_sql(EpisodeRow, style)
        # The log's INSERT takes its values in column order (a tuple: SQLite binds it faster
        # than names); other drivers get the same order in their paramstyle.
        cols = list(_LOG_COLUMNS)
        self._ins_log = _values_sql("hx_log", cols, "qmark" if self._sqlite else style)
        self._log_names = None if self._sqlite else cols
        # Materialising is idempotent: a row another writer already wrote is left alone.
        # On SQLite the rows go as tuples in column order (positional binding is cheaper).
        put_style = "qmark" if self._sqlite else style
        self._put_txn, self._put_txn_cols = _put_sql(TransactionRow, put_style)
        self._put_cp, self._put_cp_cols = _put_sql(CheckpointRow, put_style)
        self._txn_values = operator.itemgetter(*self._put_txn_cols)
        self._cp_values = operator.itemgetter(*self._put_cp_cols)
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
        self.num: int | None = None
        self._base = 0
        self._range: dict[str, int] = {}
        self._cursor = self.conn.cursor()
        self._lock = threading.RLock()
        # What the driver raises when a write fails (and text UTF-8 cannot hold).
        dbapi = getattr(dialect, "dbapi", None)
        self._driver_errors: tuple[type[BaseException], ...] = (
            sqlite3.Error,
            UnicodeEncodeError,
            getattr(dbapi, "Error", sqlite3.Error),
        )
        self._depth = 0
        # Hot-path commits whose rows are not written yet: their records (txn_id, kind, payload,
        # ts, intent payload) and, when the caller built them, the row they project to and its
        # step digest (or None, None). Flat: one tuple each, the fewest objects kept alive for
        # the cyclic GC to go through until the rows are written.
        self.pending: list[tuple[str, str, str, float, str | None, dict[str, Any] | None, Any]] = []
        # The witness's step and digest: the last committed step this writer knows of.
        self.steps = 0
        self.digest = GENESIS
        self._witnessed = False

    def _exec(self, sql: str, params: Mapping[str, Any] | tuple[Any, ...]) -> None:
        self._cursor.execute(sql, params)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One database transaction; nested batches join the outer one.

        It materialises the rows of the hot-path commits before it (first, so the batch may
        update them) and of any it wrote itself (last), and ends by moving the episode row's
        witness (record count, head hash, step and digest) unless :meth:`update_episode` did:
        every commit up to the witness has its row.
        """
        with self._lock, self._gate():
            self._depth += 1
            outer = self._depth == 1
            chain = (self.seq, self.head, len(self.pending), self.steps, self.digest)
            pending, num = self.pending, self.num
            try:
                if outer:
                    if self._sqlite:
                        self._exec("BEGIN IMMEDIATE", {})
                    self._witnessed = False
                    self.flush()
                yield
                if outer:
                    self.flush()
                    if not self._witnessed and self.num is not None:
                        self.update_head()
                    self.conn.commit()
            except BaseException as exc:
                if outer:
                    with contextlib.suppress(Exception):
                        self.conn.rollback()
                    # The records of this batch are gone: so is their place in the chain, and
                    # the rows it materialised are pending again.
                    self.seq, self.head = chain[0], chain[1]
                    self.pending = pending[: chain[2]]
                    self.steps, self.digest = chain[3], chain[4]
                    if num is None:  # (the episode row it inserted is gone too)
                        self.num, self._base, self._range = None, 0, {}
                if isinstance(exc, self._driver_errors):
                    raise _unwritable(exc, self.database) from exc
                raise
            finally:
                self._depth -= 1

    def hot(
        self, kind: str, txn_id: str | None, text: str, projected: Projected | None = None
    ) -> None:
        """One record (an intent, a hot-path outcome, a remembered value) as its own database
        transaction.

        Only the record is written: a single-row append. A commit's transaction row and
        checkpoint follow with the next batch (or this one, past :data:`FLUSH_EVERY`):
        ``projected`` is the row and step digest the caller already holds, which must be what
        :func:`~.projection.committed_row` makes of the records (the audit checks that it is);
        without it, the row is built from the records.
        """
        with self._lock:
            self._hot(kind, txn_id, text, projected)

    def _hot(self, kind: str, txn_id: str | None, text: str, projected: Projected | None) -> None:
        if len(self.pending) >= FLUSH_EVERY:
            with self.batch():
                self.append_text(kind, txn_id, text, projected)
            return
        if self._sqlite:
            # Autocommit: the INSERT commits itself, and append_text accounts for it even when
            # an exception arrives just after.
            try:
                with self._gate():
                    self.append_text(kind, txn_id, text, projected)
            except self._driver_errors as exc:
                raise _unwritable(exc, self.database) from exc
            return
        chain = (self.seq, self.head, len(self.pending), self.steps, self.digest)
        try:
            self.append_text(kind, txn_id, text, projected)
            self.conn.commit()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self.conn.rollback()
            if self.seq != chain[0] and not self._landed(self._base | self.seq, self.head):
                self.seq, self.head = chain[0], chain[1]
                del self.pending[chain[2] :]
                self.steps, self.digest = chain[3], chain[4]
            if isinstance(exc, self._driver_errors):
                raise _unwritable(exc, self.database) from exc
            raise

    def _landed(self, key: int, h: str) -> bool:
        """Whether the log record ``key`` with hash ``h`` is in the database (after an
        interrupted write): another writer's record under the same key is not ours."""
        try:
            cur = self.conn.cursor()
            cur.execute(f"SELECT hash FROM hx_log WHERE id = {self._p('k')}", {"k": key})
            found = cur.fetchone()
        except Exception:  # the connection cannot say: the write did not complete
            return False
        return found is not None and str(found[0]) == h

    def flush(self) -> None:
        """Write the rows of the hot-path commits so far (inside the caller's batch)."""
        if not self.pending:
            return
        rows, checkpoints = [], []
        for txn_id, kind, text, ts, intent, row, digest in self.pending:
            if row is not None:
                row["ended_at"] = ts
                rows.append(row)
                cp = checkpoint_row(
                    self.episode_id, txn_id, {"step": row["step"], "digest": digest}, ts
                )
                if cp is not None:
                    checkpoints.append(cp)
                continue
            payload = loads(text)
            if intent is None and payload.get("step") is not None:  # a write has an intent
                intent = self._stored_intent(txn_id)
            rows.append(
                committed_row(
                    self.episode_id,
                    txn_id,
                    kind,
                    payload,
                    ts,
                    None if intent is None else loads(intent),
                )
            )
            cp = checkpoint_row(self.episode_id, txn_id, payload, ts)
            if cp is not None:
                checkpoints.append(cp)
        if self._sqlite:
            txn_values, cp_values = self._txn_values, self._cp_values
            self._cursor.executemany(self._put_txn, [txn_values(r) for r in rows])
            if checkpoints:
                self._cursor.executemany(self._put_cp, [cp_values(c) for c in checkpoints])
        else:
            self._cursor.executemany(self._put_txn, rows)
            if checkpoints:
                self._cursor.executemany(self._put_cp, checkpoints)
        self.pending = []

    def adopt_tail(self) -> int:
        """Take over the commits a crashed writer left without rows (after :meth:`load_head`);
        the next batch writes them. Returns how many."""
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT id FROM hx_transaction WHERE episode_id = {self._p('e')}",
            {"e": self.episode_id},
        )
        have = {str(r[0]) for r in cur.fetchall()}
        cur.execute(
            f"SELECT txn_id, kind, payload, ts FROM hx_log WHERE id BETWEEN {self._p('lo')} "
            f"AND {self._p('hi')} AND txn_id IS NOT NULL ORDER BY id",
            self._range,
        )
        intents: dict[str, str] = {}
        for txn_id, kind, text, ts in cur.fetchall():
            if txn_id in have:
                continue
            if kind == "intent":
                intents[txn_id] = text
            elif kind in HOT_OUTCOMES:
                self.pending.append((txn_id, kind, text, ts, intents.pop(txn_id, None), None, None))
                self._stepped(loads(text))
        return len(self.pending)

    def _stepped(self, payload: Mapping[str, Any]) -> None:
        """Follow a commit record's step and digest (for the witness)."""
        if payload.get("step") is not None:
            self.steps, self.digest = int(payload["step"]), str(payload["digest"])

    def _stored_intent(self, txn_id: str) -> str | None:
        """A write's intent written before this writer (by the process that crashed)."""
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT payload FROM hx_log WHERE id BETWEEN {self._p('lo')} AND {self._p('hi')} "
            f"AND txn_id = {self._p('t')} AND kind = 'intent' ORDER BY id DESC LIMIT 1",
            {**self._range, "t": txn_id},
        )
        found = cur.fetchone()
        return None if found is None else str(found[0])

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

    def _set_num(self, num: int) -> None:
        self.num = num
        self._base = log_key(num, 0)
        self._range = log_range(num)

    def load_head(self) -> None:
        """Continue an existing episode's chain from its last record, taking over the commits
        a crashed writer left without rows (:meth:`adopt_tail`)."""
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT num, steps, digest FROM hx_episode WHERE id = {self._p('e')}",
            {"e": self.episode_id},
        )
        found = cur.fetchone()
        if found is None:
            return
        self._set_num(int(found[0]))
        self.steps, self.digest = int(found[1]), str(found[2])
        cur.execute(
            f"SELECT seq, hash FROM hx_log WHERE id BETWEEN {self._p('lo')} AND {self._p('hi')} "
            "ORDER BY id DESC LIMIT 1",
            self._range,
        )
        row = cur.fetchone()
        if row is not None:
            self.seq, self.head = int(row[0]), str(row[1])
        self.adopt_tail()

    def append(self, kind: str, txn_id: str | None, payload: Mapping[str, Any]) -> str:
        """Add one record to the chain; returns its hash."""
        return self.append_text(kind, txn_id, dumps(payload))

    def append_text(
        self, kind: str, txn_id: str | None, text: str, projected: Projected | None = None
    ) -> str:
        """Add one record whose payload is already JSON text; returns its hash."""
        ts = time.time()
        seq = self.seq + 1
        h = record_hash(self.head, self.episode_id, seq, kind, txn_id, text, ts)
        values = (self._base | seq, self.episode_id, seq, txn_id, kind, text, ts, h)
        try:
            self._exec(
                self._ins_log,
                values
                if self._log_names is None
                else dict(zip(self._log_names, values, strict=True)),
            )
        except BaseException:
            # A KeyboardInterrupt is raised when the call returns, even if the record was
            # written (and, in autocommit, committed): then the chain moves on all the same.
            if not self._landed(values[0], h):
                raise
            self._account(seq, h, kind, txn_id, text, ts, projected)
            raise
        self._account(seq, h, kind, txn_id, text, ts, projected)
        return h

    def _account(
        self,
        seq: int,
        h: str,
        kind: str,
        txn_id: str | None,
        text: str,
        ts: float,
        projected: Projected | None,
    ) -> None:
        """Move the chain past a written record; keep what its row needs."""
        self.seq, self.head = seq, h
        if txn_id is not None and kind in HOT_OUTCOMES:
            if projected is None:
                self.pending.append((txn_id, kind, text, ts, None, None, None))
                self._stepped(loads(text))
                return
            row, digest = projected
            self.pending.append((txn_id, kind, text, ts, None, row, digest))
            if row["step"] is not None:
                self.steps, self.digest = row["step"], str(digest)

    def insert_episode(self, row: Mapping[str, Any]) -> None:
        """Insert the episode's row, numbered next in this store (inside a batch: locked)."""
        cur = self.conn.cursor()
        if not self._sqlite:  # (SQLite: BEGIN IMMEDIATE holds the write lock already)
            cur.execute("LOCK TABLE hx_episode IN SHARE ROW EXCLUSIVE MODE")
        cur.execute("SELECT COALESCE(MAX(num), 0) + 1 FROM hx_episode")
        num = int(cur.fetchone()[0])
        self._exec(self._ins_ep, {**self._ep_cols, **row, "num": num})
        self._set_num(num)

    def update_episode(self, *, status: str, steps: int, digest: str) -> None:
        """Record the episode's status, checkpoint and chain head."""
        self.steps, self.digest = steps, digest
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
        self._witnessed = True

    def update_head(self) -> None:
        """Record the chain head, step and digest on the episode row, leaving its status
        alone."""
        p = self._p
        self._exec(
            f"UPDATE hx_episode SET log_count={p('n')}, head_hash={p('h')}, steps={p('s')}, "
            f"digest={p('d')} WHERE id={p('id')}",
            {
                "n": self.seq,
                "h": self.head,
                "s": self.steps,
                "d": self.digest,
                "id": self.episode_id,
            },
        )
        self._witnessed = True

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
        self._exec(sql, {**fields, "ep_": self.episode_id, "seq_": txn_seq(txn_id)})

    def put_row(self, row: Any) -> None:
        """Insert a table row (a :class:`~.tables.TrialRow`...), or replace the one with its
        primary key, as :meth:`Store.add <harness.store.Store.add>` does, in this writer's
        transaction (inside a batch: with the records it writes)."""
        table: Any = type(row)
        cols = [c.name for c in table.__table__.columns]
        keys = [c.name for c in table.__table__.primary_key.columns]
        sets = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in keys)
        self._exec(
            f"INSERT INTO {table.__tablename__} ({', '.join(cols)}) "
            f"VALUES ({', '.join(self._p(c) for c in cols)}) "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}",
            # (A status enum goes as its text: drivers bind plain values.)
            {c: str(v) if isinstance(v, str) else v for c in cols for v in [getattr(row, c)]},
        )

    def insert_escalation(self, row: Mapping[str, Any]) -> str:
        """Insert an escalation; returns its id."""
        esc_id = row.get("id") or uuid.uuid4().hex[:12]
        self._exec(self._ins_esc, {**self._esc_cols, **row, "id": esc_id})
        return str(esc_id)

    def close(self) -> None:
        """Close the connection, or give it to ``release``; closing again does nothing (a
        connection given back may be another writer's by then). A write after the close
        fails as on a closed connection: it never reaches the connection given back."""
        with self._lock:
            if self._cursor is _CLOSED:
                return
            cursor, conn = self._cursor, self.conn
            self._cursor = self.conn = _CLOSED
            try:
                cursor.close()
                if self._release is not None:
                    self._release(self._taken)
                else:
                    conn.close()
            except Exception:  # closing after the database went away is harmless
                pass


class _Closed:
    """What a closed writer's connection and cursor are: every use raises, as a closed
    ``sqlite3`` connection does; closing again does nothing."""

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")

        return refuse


_CLOSED: Any = _Closed()
