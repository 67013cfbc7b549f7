"""Limits that hold for a whole run, kept in its store, so every process of the run shares them.

A :class:`Limiter` is one process's view of them for one run; each model server (its URL) has
its own:

- requests in flight (``hx_limit_slot``): a request takes a slot and gives it back when it
  ends. Slots belong to their process's holder and expire unless renewed
  (:meth:`Limiter.renew`), so a process that dies cannot keep them: they lapse at their
  expiry, and at once when the process ran on this host and is gone (as leases do);
- requests started and tokens used per period (``hx_limit_use``): one row per request started
  and one per response's tokens, in a sliding window; rows older than the window are deleted
  as the window moves, so a run keeps at most about one window's worth;
- the circuit of each server (``hx_circuit``): a process that found the server down records
  until when, and why, so every process refuses its requests until then.

Every check and take is one transaction under the database's write lock (SQLite's ``BEGIN
IMMEDIATE``; on Postgres a transaction advisory lock of the run and server), on a driver
connection of the limiter's own. On Postgres the database's clock times every row, so
machines whose clocks disagree share one window.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .failures import writing
from .leases import _is_sqlite, _pid_alive, committed

if TYPE_CHECKING:
    from .store import Store

__all__ = ["Circuit", "Limiter", "Taken"]


@dataclass(frozen=True)
class Taken:
    """What :meth:`Limiter.take` found.

    Attributes:
        slot: the slot taken (give it back with :meth:`Limiter.give_back`); None when the
            request may not start yet, or when no limit on requests in flight is kept.
        ok: whether the request may start.
        wait: when it may not, the least time until a window lets it, in seconds (None: until
            a slot is given back or lapses).
        why: which limit held it back (``max_in_flight``, ``rate`` or ``tokens``).
    """

    ok: bool
    slot: str | None = None
    wait: float | None = None
    why: str = ""


@dataclass(frozen=True)
class Circuit:
    """A server's circuit a process of the run opened: the server counts as down until then.

    Attributes:
        url: the server.
        until: when it closes (seconds since the epoch, the database's clock).
        why: the message of the error that opened it.
        failures, down_for: that error's failed requests in a row and seconds without answer.
        pid, host: the process that opened it.
    """

    url: str
    until: float
    why: str
    failures: int
    down_for: float
    pid: int
    host: str


@contextlib.contextmanager
def _timed(conn: Any, *, lock: tuple[str, str] | None) -> Iterator[tuple[Any, str, float]]:
    """A cursor of ``conn`` in a transaction (holding the run's and server's lock when
    ``lock`` names them), its parameter mark and the database's time now."""
    sqlite = _is_sqlite(conn)
    with committed(conn) as cur:
        if sqlite:
            cur.execute("BEGIN" if lock is None else "BEGIN IMMEDIATE")
            now = time.time()
        else:
            if lock is not None:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(*lock),))
            cur.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
            now = float(cur.fetchone()[0])
        yield cur, "?" if sqlite else "%s", now


class Limiter:
    """One process's share of a run's limits in its store (see the module docstring).

    Args:
        store: the run's store (opened for writing).
        run_id: the run.
        seconds: how long this process's slots last without renewal.
    """

    def __init__(self, store: Store, run_id: str, *, seconds: float = 30.0) -> None:
        self.store = store
        self.run_id = run_id
        self.seconds = seconds
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.holder = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._conn: Any = None

    # --- one transaction ---
    @contextlib.contextmanager
    def _transaction(self, url: str) -> Iterator[tuple[Any, str, float]]:
        """A cursor in a transaction holding the run's and server's lock, the parameter mark
        and the database's time now; commits when the block ends, rolls back if it raises."""
        with self._lock, writing(self.store.database, readonly=self.store.readonly):
            if self._conn is None:
                self._conn = self.store.raw_connection()
            with self.store._gated(), _timed(self._conn, lock=(self.run_id, url)) as found:
                yield found

    @contextlib.contextmanager
    def _read(self) -> Iterator[tuple[Any, str, float]]:
        """:meth:`_transaction` for a read that changes nothing: on a pooled connection of the
        store's, taking no lock (so it waits neither for another process's write nor for this
        process's threads that wait for one)."""
        with self.store._pooled() as conn, _timed(conn, lock=None) as found:
            yield found

    # --- requests ---
    def take(
        self,
        url: str,
        *,
        max_in_flight: int | None = None,
        rate: tuple[int, float] | None = None,
        tokens: tuple[int, float] | None = None,
    ) -> Taken:
        """Let one request to ``url`` start if every limit given allows it, taking a slot (with
        ``max_in_flight``) and counting its start (with ``rate``); nothing is written when one
        does not.

        Args:
            max_in_flight: the most requests in flight at once over the run.
            rate: at most ``count`` requests started in any ``seconds``.
            tokens: no request starts while the tokens of the responses in the last
                ``seconds`` add up to ``count`` or more.
        """
        with self._transaction(url) as (cur, m, now):
            key = (self.run_id, url)
            if max_in_flight is not None:
                held = self._held(cur, m, key, now)
                if held >= max_in_flight:
                    return Taken(False, why="max_in_flight")
            if rate is not None:
                count, seconds = rate
                used, oldest = self._window(cur, m, key, "request", now - seconds, "COUNT(*)")
                if used >= count:
                    return Taken(False, wait=max(oldest + seconds - now, 0.0), why="rate")
            if tokens is not None:
                count, seconds = tokens
                used, oldest = self._window(cur, m, key, "tokens", now - seconds, "SUM(amount)")
                if used >= count:
                    return Taken(False, wait=max(oldest + seconds - now, 0.0), why="tokens")
            slot = None
            if max_in_flight is not None:
                slot = uuid.uuid4().hex
                cur.execute(
                    "INSERT INTO hx_limit_slot (id, run_id, url, holder, pid, host, expires_at) "
                    f"VALUES ({', '.join([m] * 7)})",
                    (slot, *key, self.holder, self.pid, self.host, now + self.seconds),
                )
            if rate is not None:
                self._use(cur, m, key, "request", now, 1)
            return Taken(True, slot=slot)

    def _held(self, cur: Any, m: str, key: tuple[str, str], now: float) -> int:
        """The slots held now, after freeing those that lapsed and those of processes of this
        host that are gone."""
        cur.execute(
            f"DELETE FROM hx_limit_slot WHERE run_id = {m} AND url = {m} AND expires_at <= {m}",
            (*key, now),
        )
        cur.execute(
            "SELECT holder, pid, host, COUNT(*) FROM hx_limit_slot "
            f"WHERE run_id = {m} AND url = {m} GROUP BY holder, pid, host",
            key,
        )
        held = 0
        for holder, pid, host, count in cur.fetchall():
            if host == self.host and int(pid) != self.pid and not _pid_alive(int(pid)):
                cur.execute(f"DELETE FROM hx_limit_slot WHERE holder = {m}", (holder,))
            else:
                held += int(count)
        return held

    def _window(
        self, cur: Any, m: str, key: tuple[str, str], kind: str, since: float, total: str
    ) -> tuple[float, float]:
        """The window's total of ``kind`` rows since ``since`` and its oldest row's time, after
        deleting the rows it has left behind."""
        where = f"run_id = {m} AND url = {m} AND kind = {m}"
        cur.execute(f"DELETE FROM hx_limit_use WHERE {where} AND at <= {m}", (*key, kind, since))
        cur.execute(f"SELECT {total}, MIN(at) FROM hx_limit_use WHERE {where}", (*key, kind))
        used, oldest = cur.fetchone()
        return float(used or 0), float(oldest if oldest is not None else since)

    def _use(self, cur: Any, m: str, key: tuple[str, str], kind: str, at: float, n: int) -> None:
        cur.execute(
            f"INSERT INTO hx_limit_use (run_id, url, kind, at, amount) VALUES ({m}, {m}, {m}, "
            f"{m}, {m})",
            (*key, kind, at, n),
        )

    def give_back(self, url: str, slots: Iterable[str]) -> None:
        """Give slots taken for ``url`` back."""
        wanted = list(slots)
        if not wanted:
            return
        with self._transaction(url) as (cur, m, _now):
            for slot in wanted:
                cur.execute(f"DELETE FROM hx_limit_slot WHERE id = {m}", (slot,))

    def used(self, url: str, tokens: int) -> None:
        """Count the tokens a response of ``url`` used, in the token window."""
        with self._transaction(url) as (cur, m, now):
            self._use(cur, m, (self.run_id, url), "tokens", now, tokens)

    def renew(self) -> None:
        """Keep every slot this process holds for another ``seconds`` (its heartbeat)."""
        with self._transaction("") as (cur, m, now):
            cur.execute(
                f"UPDATE hx_limit_slot SET expires_at = {m} WHERE holder = {m}",
                (now + self.seconds, self.holder),
            )

    # --- the circuit ---
    def open_circuit(
        self, url: str, seconds: float, why: str, *, failures: int = 0, down_for: float = 0.0
    ) -> None:
        """Record that ``url`` is down for the next ``seconds``, and why."""
        with self._transaction(url) as (cur, m, now):
            cur.execute(
                "INSERT INTO hx_circuit (run_id, url, until, why, failures, down_for, pid, host) "
                f"VALUES ({', '.join([m] * 8)}) ON CONFLICT (run_id, url) DO UPDATE SET "
                "until = excluded.until, why = excluded.why, failures = excluded.failures, "
                "down_for = excluded.down_for, pid = excluded.pid, host = excluded.host",
                (self.run_id, url, now + seconds, why, failures, down_for, self.pid, self.host),
            )

    def circuit(self, url: str) -> Circuit | None:
        """The circuit of ``url`` a process of the run opened, while it is open (a read:
        it waits for no other process's write)."""
        with self._read() as (cur, m, now):
            cur.execute(
                "SELECT until, why, failures, down_for, pid, host FROM hx_circuit "
                f"WHERE run_id = {m} AND url = {m} AND until > {m}",
                (self.run_id, url, now),
            )
            row = cur.fetchone()
        if row is None:
            return None
        return Circuit(url, float(row[0]), row[1], int(row[2]), float(row[3]), int(row[4]), row[5])

    def forget_circuits(self) -> None:
        """Close every circuit a process of the run recorded open (a run started or resumed
        anew tries its servers again at once, as a new process's own circuit would)."""
        with self._transaction("") as (cur, m, _now):
            cur.execute(f"DELETE FROM hx_circuit WHERE run_id = {m}", (self.run_id,))

    def close(self) -> None:
        """Give back every slot this process holds and close the connection."""
        # (A slot left behind lapses at its expiry.)
        with contextlib.suppress(Exception), self._transaction("") as (cur, m, _now):
            cur.execute(f"DELETE FROM hx_limit_slot WHERE holder = {m}", (self.holder,))
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def _lock_key(run_id: str, url: str) -> int:
    """The Postgres advisory lock of one run's limits of one server (a signed 64-bit int)."""
    digest = hashlib.sha256(f"hx-limit\x1f{run_id}\x1f{url}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
