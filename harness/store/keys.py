"""Store-wide idempotency keys (``@hx.action(idempotency_scope="store")``).

One call of one episode holds a key (a row of ``hx_key``). While that call's transaction row
says it applied (committed or recovered, and not compensated since), the key is done in every
episode of the store: another episode's call with the key is answered with that row's result.
A key whose call has not committed is in flight: nobody else runs it. The holder's claim is
taken and read under the database's write lock (SQLite's ``BEGIN IMMEDIATE``, a row lock on
Postgres), so two processes racing one key cannot both take it.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from .statuses import APPLIED, TxnStatus
from .tables import txn_seq
from .writer import EpisodeWriter

__all__ = ["Holder", "claim_key", "key_holder", "release_keys"]

_APPLIED = ", ".join(f"'{s}'" for s in sorted(APPLIED))


@dataclass(frozen=True)
class Holder:
    """The call of another episode that holds a store-wide key.

    Attributes:
        episode_id, txn_id: the holding call.
        args: its arguments, as recorded (JSON).
        pid, host: the process that took the key.
        status: its transaction's status (None: no outcome row yet: it runs, or its process
            died with it in doubt).
        result: its recorded result (JSON), when it has one.
    """

    episode_id: str
    txn_id: str
    args: str
    pid: int
    host: str
    status: str | None
    result: str | None

    @property
    def applied(self) -> bool:
        """Whether the holding call's effect stands (the key is done)."""
        return self.status in APPLIED


def _holder(writer: EpisodeWriter, cur: Any, key: str, *, lock: bool) -> Holder | None:
    p = writer._p
    lock_rows = " FOR UPDATE" if lock and not writer._sqlite else ""
    cur.execute(
        f"SELECT episode_id, txn_id, args, pid, host FROM hx_key WHERE key = {p('k')}{lock_rows}",
        {"k": key},
    )
    found = cur.fetchone()
    if found is None:
        return None
    episode_id, txn_id = str(found[0]), str(found[1])
    cur.execute(
        f"SELECT status, result FROM hx_transaction WHERE episode_id = {p('e')} AND seq = {p('s')}",
        {"e": episode_id, "s": txn_seq(txn_id)},
    )
    row = cur.fetchone()
    status, result = (None, None) if row is None else (row[0], row[1])
    return Holder(episode_id, txn_id, str(found[2]), int(found[3]), str(found[4]), status, result)


def claim_key(writer: EpisodeWriter, key: str, txn_id: str, args: str) -> Holder | None:
    """Take ``key`` for the call ``txn_id`` of the writer's episode (arguments ``args``).

    Returns:
        None when the key is now this call's (it was free, this episode's, or its holder's
        effect was compensated); otherwise the other episode's call that holds it: applied
        (the key is done, its result answers) or not (in flight, or left in doubt).
    """
    p = writer._p
    values = {
        "k": key,
        "e": writer.episode_id,
        "t": txn_id,
        "a": args,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "at": time.time(),
    }
    take = (
        f"UPDATE hx_key SET episode_id = {p('e')}, txn_id = {p('t')}, args = {p('a')}, "
        f"pid = {p('pid')}, host = {p('host')}, claimed_at = {p('at')} WHERE key = {p('k')}"
    )
    with writer.batch():
        cur = writer.conn.cursor()
        try:
            cur.execute(
                "INSERT INTO hx_key (key, episode_id, txn_id, args, pid, host, claimed_at) "
                f"VALUES ({p('k')}, {p('e')}, {p('t')}, {p('a')}, {p('pid')}, {p('host')}, "
                f"{p('at')}) ON CONFLICT DO NOTHING",
                values,
            )
            holder = _holder(writer, cur, key, lock=True)
            if holder is None or holder.episode_id == writer.episode_id:
                if holder is not None and holder.txn_id != txn_id:
                    cur.execute(take, values)
                return None
            if holder.status == TxnStatus.COMPENSATED:
                cur.execute(take, values)
                return None
            return holder
        finally:
            cur.close()


def key_holder(writer: EpisodeWriter, key: str) -> Holder | None:
    """Who holds ``key`` now (None: nobody), read without taking it."""
    cur = writer.conn.cursor()
    try:
        return _holder(writer, cur, key, lock=False)
    finally:
        cur.close()
        if not writer._sqlite:
            writer.conn.rollback()  # (a read opened a transaction on this connection)


def release_keys(writer: EpisodeWriter, txn_id: str | None = None) -> None:
    """Give back the writer's episode's keys whose calls did not apply (only ``txn_id``'s, when
    given), so that another episode may run them."""
    p = writer._p
    sql = (
        f"DELETE FROM hx_key WHERE episode_id = {p('e')} AND txn_id NOT IN "
        f"(SELECT id FROM hx_transaction WHERE episode_id = {p('e')} AND status IN ({_APPLIED}))"
    )
    params: dict[str, Any] = {"e": writer.episode_id}
    if txn_id is not None:
        sql += f" AND txn_id = {p('t')}"
        params["t"] = txn_id
    with writer.batch():
        writer._exec(sql, params)
