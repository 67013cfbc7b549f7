"""The hot path: prebuilt SQL on one driver connection per episode (:class:`EpisodeWriter`)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._json import dumps
from .tables import (
    GENESIS,
    CheckpointRow,
    EpisodeRow,
    EscalationRow,
    LogRow,
    TransactionRow,
    record_hash,
)

if TYPE_CHECKING:
    from .store import Store


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
