"""Leases: one process executes an episode at a time (mixed into :class:`~.store.Store`)."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, select

from .tables import LeaseRow


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Leases:
    """Lease methods of the store: taken under the write lock, renewed, released after."""

    _lease_lock: threading.Lock
    _lease_conn: Any

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
