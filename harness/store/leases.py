"""Leases: one process executes an episode at a time (mixed into :class:`~.store.Store`)."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, select

from .._json import canonical, dumps, loads_or
from ..errors import StoreError
from .failures import writing
from .tables import LeaseRow, RunRow


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_sqlite(conn: Any) -> bool:
    """Whether a store's driver connection is SQLite's (a read-only store's comes through
    SQLAlchemy's pool, which wraps it)."""
    return isinstance(getattr(conn, "driver_connection", conn), sqlite3.Connection)


@contextmanager
def committed(conn: Any) -> Iterator[Any]:
    """A cursor of the driver connection ``conn``, its transaction committed when the block
    ends (nothing, when the block rolled it back) and rolled back when the block raises."""
    cur = conn.cursor()
    try:
        yield cur
        conn.commit()
    except BaseException:
        with contextlib.suppress(Exception):  # (the error raised says what failed)
            conn.rollback()
        raise
    finally:
        cur.close()


def _merged(stored: str, row: RunRow) -> str:
    """``row``'s evidence with the resumes the stored evidence holds and it does not."""
    mine = loads_or(row.evidence, {})
    theirs = loads_or(stored, {})
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return row.evidence
    ours = list(mine.get("resumes") or [])
    seen = {canonical(r) for r in ours}
    others = [r for r in theirs.get("resumes") or [] if canonical(r) not in seen]
    if not others:
        return row.evidence
    both = others + ours
    with contextlib.suppress(TypeError, KeyError):
        both.sort(key=lambda r: float(r["at"]))
    return dumps({**mine, "resumes": both})


def _live(held: Any, now: float, host: str) -> bool:
    """Whether a lease row ``(owner, pid, host, expires_at)`` is held by a live holder: not
    expired, and on another host or by a process of this one that still runs."""
    return bool(held[3] > now and (held[2] != host or _pid_alive(int(held[1]))))


_HOLDER = "SELECT owner, pid, host, expires_at FROM hx_lease WHERE episode_id = {mark}"
"""A lease's holder, ``(owner, pid, host, expires_at)``, with the driver's parameter mark."""

_IDLE_KEPT = 16
"""How many idle connections a SQLite store keeps for short operations."""
_IDLE_KEPT_ON_A_SERVER = 2
"""The same for a database server's store (each counts against its ``max_connections``)."""

CLAIM_SECONDS = 60.0
"""How long an open episode's claim lasts without renewal (renewed every third of it)."""


class Held:
    """A lease taken, renewed in the background every third of ``seconds`` until released."""

    def __init__(self, leases: _Leases, episode_id: str, owner: str, seconds: float) -> None:
        self._leases, self.episode_id, self.owner = leases, episode_id, owner
        self._stop = threading.Event()
        self._keeper = threading.Thread(
            target=self._renew, args=(seconds,), name=f"lease-{episode_id}", daemon=True
        )
        self._keeper.start()

    def _renew(self, seconds: float) -> None:
        while not self._stop.wait(seconds / 3):
            try:
                kept = self._leases.renew_lease(self.episode_id, owner=self.owner, seconds=seconds)
            except Exception:  # (the next renewal tries again)
                continue
            if not kept:
                # Lost (it expired and another process took it, and may have finished and
                # given it back): a renewal must never take it again for a holder that stalled.
                return

    def release(self) -> None:
        """Stop renewing and give the lease back (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._keeper.join()
        self._leases.release_lease(self.episode_id, owner=self.owner)


_WRITE_GATES: dict[str, threading.RLock] = {}
_WRITE_GATES_LOCK = threading.Lock()
# A child forked while a thread held one would wait for it forever: a child starts with none.
os.register_at_fork(after_in_child=_WRITE_GATES.clear)


def _write_gate(key: str) -> threading.RLock:
    """The lock this process's writers to the SQLite file ``key`` (its real path) take around
    each write transaction, whichever store object opened it.

    SQLite lets one writer in at a time; another that finds the file locked sleeps and looks
    again (1, 2, 5, 10 ms and up), so threads of one process queueing for it lose milliseconds
    each and wake to find it taken again. Queued on a lock of the process instead, each goes
    in as the one before comes out. (Writers of other processes still meet SQLite's wait.)"""
    gate = _WRITE_GATES.get(key)
    if gate is None:
        with _WRITE_GATES_LOCK:
            gate = _WRITE_GATES.setdefault(key, threading.RLock())
    return gate


GATE_WAIT = 30.0
"""Seconds a writer waits for its process's turn (SQLite's own wait for the database, the
store's busy timeout, comes after it): another program holding the database's write lock
fails each writer of the process within about a minute, not one after another."""


class _Turn:
    """Hold ``gate`` for the block, or go on without it after :data:`GATE_WAIT` seconds (to
    SQLite's own wait, which then ends the write if the database stays locked). A class, not
    a generator: it is taken around every write of the hot path."""

    __slots__ = ("gate", "got")

    def __init__(self, gate: threading.RLock) -> None:
        self.gate = gate
        self.got = False

    def __enter__(self) -> None:
        self.got = self.gate.acquire(timeout=GATE_WAIT)

    def __exit__(self, *exc: object) -> None:
        if self.got:
            self.got = False
            self.gate.release()


class _Leases:
    """Lease methods of the store: taken under the write lock, renewed, released after."""

    _pool_lock: threading.Lock
    _pool_idle: list[Any]
    _pool_closed: bool
    _gate_key: str | None
    database: str
    readonly: bool

    if TYPE_CHECKING:  # provided by Store

        def raw_connection(self) -> Any: ...
        def session(self) -> AbstractContextManager[Session]: ...

    # --- leases: one process executes an episode at a time ---
    def acquire_lease(self, episode_id: str, *, owner: str, seconds: float = 600.0) -> bool:
        """Take (or renew) the lease on ``episode_id`` for ``seconds``; False if it is held.

        Checked and written in one transaction under the write lock, so two processes cannot
        both take it. A lease is free when it expired, or when its holder ran on this host and
        its process is gone (a crashed run's leases do not block its resume).
        """
        return self._take(episode_id, owner, seconds)[0] == "taken"

    def _take(
        self, episode_id: str, owner: str, seconds: float, *, this_process: bool = False
    ) -> tuple[str, Any]:
        """Take the lease: ``("taken", None)``, ``("held", (owner, pid, host, expires_at))``
        when another holds it, or, with ``this_process``, ``("ours", None)`` when another
        owner in this process holds it (nothing is written then)."""
        now = time.time()
        host, pid = socket.gethostname(), os.getpid()
        seen = False  # (a lease row seen already: the look under the lock decides)
        if this_process:
            # A run's worker holds its trials' leases: seen in a read, without waiting for
            # the write lock (no other process can take a live lease from under it).
            held = self._holder(episode_id)
            seen = held is not None
            ours = held is not None and (held[2], int(held[1])) == (host, pid)
            if ours and held[0] != owner and held[3] > now:
                return "ours", None
        if not seen and self._take_free(episode_id, owner, pid, host, now, now + seconds):
            return "taken", None
        with self._locked("hx_lease") as (cur, mark):
            cur.execute(_HOLDER.format(mark=mark), (episode_id,))
            held = cur.fetchone()
            if held is not None and held[0] != owner and _live(held, now, host):
                cur.connection.rollback()
                if this_process and held[2] == host and int(held[1]) == pid:
                    return "ours", None
                return "held", held
            cur.execute(f"DELETE FROM hx_lease WHERE episode_id = {mark}", (episode_id,))
            cur.execute(
                "INSERT INTO hx_lease (episode_id, owner, pid, host, acquired_at, expires_at) "
                f"VALUES ({', '.join([mark] * 6)})",
                (episode_id, owner, pid, host, now, now + seconds),
            )
            return "taken", None

    def _take_free(
        self, episode_id: str, owner: str, pid: int, host: str, now: float, until: float
    ) -> bool:
        """Take a lease nobody holds, in one statement (its row inserted unless one is
        there): the write lock is held for that statement alone, not across the look and
        the write. False (nothing written) when a row is there: whose, and whether it is
        still live, is for the full look under the lock."""
        with writing(self.database, readonly=self.readonly), self._pooled() as conn:
            mark = "?" if _is_sqlite(conn) else "%s"
            with self._gated(), committed(conn) as cur:
                cur.execute(
                    "INSERT INTO hx_lease (episode_id, owner, pid, host, acquired_at, "
                    f"expires_at) VALUES ({', '.join([mark] * 6)}) "
                    "ON CONFLICT (episode_id) DO NOTHING",
                    (episode_id, owner, pid, host, now, until),
                )
                return bool(cur.rowcount == 1)

    def _holder(self, episode_id: str) -> Any:
        """The lease row ``(owner, pid, host, expires_at)`` of ``episode_id`` as the database
        holds it now, or None: a read, taking no lock."""
        with writing(self.database, readonly=self.readonly), self._pooled() as conn:
            mark = "?" if _is_sqlite(conn) else "%s"
            with committed(conn) as cur:
                cur.execute(_HOLDER.format(mark=mark), (episode_id,))
                return cur.fetchone()

    def renew_lease(self, episode_id: str, *, owner: str, seconds: float = 600.0) -> bool:
        """Extend ``owner``'s lease on ``episode_id`` to ``seconds`` from now; False (nothing
        written) when ``owner`` no longer holds it: a lease lost is never taken back by a
        renewal, or a holder that stalled past its expiry would take the episode again after
        another process took it over, and after that one gave it back, leave a lease behind."""
        now = time.time()
        with self._locked("hx_lease") as (cur, mark):
            cur.execute(
                f"UPDATE hx_lease SET expires_at = {mark} "
                f"WHERE episode_id = {mark} AND owner = {mark}",
                (now + seconds, episode_id, owner),
            )
            return bool(cur.rowcount)

    def release_lease(self, episode_id: str, *, owner: str) -> None:
        """Give the lease on ``episode_id`` back (only its owner can)."""
        with writing(self.database, readonly=self.readonly), self._pooled() as conn:
            mark = "?" if _is_sqlite(conn) else "%s"
            with self._gated(), committed(conn) as cur:
                cur.execute(
                    f"DELETE FROM hx_lease WHERE episode_id = {mark} AND owner = {mark}",
                    (episode_id, owner),
                )

    @contextmanager
    def lease(self, episode_id: str, *, owner: str, seconds: float = 600.0) -> Iterator[bool]:
        """Hold the lease on ``episode_id`` while the block runs, renewing it every third of
        ``seconds``; yields False (and holds nothing) when another process has it."""
        if not self.acquire_lease(episode_id, owner=owner, seconds=seconds):
            yield False
            return
        held = Held(self, episode_id, owner, seconds)
        try:
            yield True
        finally:
            held.release()

    def claim_episode(self, episode_id: str, *, seconds: float = CLAIM_SECONDS) -> Held | None:
        """Claim ``episode_id`` for this process while an :class:`~harness.Episode` has it open.

        Returns:
            The claim (renewed until released), or None when this process holds the episode's
            lease already (a run's worker executing it): nothing is taken then.

        Raises:
            StoreError: another live process has the episode open; nothing was written.
        """
        owner = f"episode:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        taken, holder = self._take(episode_id, owner, seconds, this_process=True)
        if taken == "ours":
            return None
        if taken == "held":
            until = time.strftime("%H:%M:%S", time.localtime(holder[3]))
            raise StoreError(
                f"episode {episode_id} is open in another process (pid {holder[1]} on "
                f"{holder[2]}); nothing was written. Wait for it to end, then resume; if that "
                f"process is gone, its claim lapses at {until} (at once when it ran on this "
                "host)"
            )
        return Held(self, episode_id, owner, seconds)

    def leases(self) -> list[LeaseRow]:
        """The leases held now (expired ones included)."""
        with self.session() as s:
            return list(s.exec(select(LeaseRow)))

    def lease_held(self, episode_id: str) -> bool:
        """Whether a live holder has the lease on ``episode_id`` now (a read: taking it may
        still find it held; an expired lease, or one of a process of this host that is gone,
        is free)."""
        with self.session() as s:
            row = s.get(LeaseRow, episode_id)
        if row is None:
            return False
        return _live(
            (row.owner, row.pid, row.host, row.expires_at), time.time(), socket.gethostname()
        )

    def record_run(self, row: RunRow) -> RunRow:
        """Insert or replace a run's row under the write lock, keeping the resumes another
        process recorded in its evidence since this one read it (two resumes of one run at
        once are both in the evidence). Returns the row as written."""
        with self._locked("hx_run") as (cur, mark):
            cur.execute(f"SELECT evidence FROM hx_run WHERE id = {mark}", (row.id,))
            found = cur.fetchone()
            if found is not None:
                row = RunRow(**{**row.model_dump(), "evidence": _merged(found[0], row)})
                cur.execute(f"DELETE FROM hx_run WHERE id = {mark}", (row.id,))
            cur.execute(
                "INSERT INTO hx_run (id, created_at, suite, status, config, evidence) "
                f"VALUES ({', '.join([mark] * 6)})",
                (row.id, row.created_at, row.suite, str(row.status), row.config, row.evidence),
            )
        return row

    @contextmanager
    def _locked(self, table: str) -> Iterator[tuple[Any, str]]:
        """A cursor in a transaction that holds the write lock of ``table`` (SQLite: the
        database's), committed when the block ends, and the driver's parameter mark."""
        with writing(self.database, readonly=self.readonly), self._pooled() as conn:
            sqlite = _is_sqlite(conn)
            with self._gated(), committed(conn) as cur:
                if sqlite:
                    cur.execute("BEGIN IMMEDIATE")
                else:
                    cur.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
                yield cur, "?" if sqlite else "%s"

    def _gated(self) -> Any:
        """The process's turn for a write to this store's SQLite file (a context manager that
        does nothing on a server, which queues its writers itself)."""
        key = self._gate_key
        return contextlib.nullcontext() if key is None else _Turn(_write_gate(key))

    @contextmanager
    def _pooled(self) -> Iterator[Any]:
        """A driver connection for one short operation (a lease, a run's row, a read): an idle
        one of this store's, or a new one, given back after (closed instead when the operation
        failed, the store was closed, or enough are idle). Several threads' operations run at
        once, each on its own connection, so none waits behind another's wait for the
        database's write lock."""
        conn = self._checkout()
        done = False
        try:
            yield conn
            done = True
        finally:
            self._checkin(conn, reusable=done)

    def _checkout(self) -> Any:
        """An idle pooled connection, or a new one (give it back with :meth:`_checkin`)."""
        with self._pool_lock:
            conn = self._pool_idle.pop() if self._pool_idle else None
        return self.raw_connection() if conn is None else conn

    def _checkin(self, conn: Any, *, reusable: bool = True) -> None:
        """Give ``conn`` back to the pool, or close it: when it is not ``reusable`` (its
        operation failed), holds a transaction still open, the store was closed, or enough
        are idle."""
        if reusable and _is_sqlite(conn) and conn.in_transaction:
            reusable = False
        with self._pool_lock:
            kept = _IDLE_KEPT if _is_sqlite(conn) else _IDLE_KEPT_ON_A_SERVER
            if reusable and not self._pool_closed and len(self._pool_idle) < kept:
                self._pool_idle.append(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()

    def _close_pool(self) -> None:
        with self._pool_lock:
            self._pool_closed = True
        self._drop_idle()

    def _drop_idle(self) -> None:
        """Close the pool's idle connections (the pool goes on)."""
        with self._pool_lock:
            idle, self._pool_idle = self._pool_idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
