"""The run-wide limiter kept in the store: slots in flight, rate and token windows, slots of a
dead process freed, and the shared circuit, on SQLite and (with HX_TEST_POSTGRES_URL) on
Postgres; a store written before the limiter's tables existed still opens and verifies."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness as hx
from harness.store.limiter import Limiter

from ..postgres import fresh_database
from ..threads import held_by_another_thread


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new store's URL: a SQLite file, or a fresh Postgres database dropped after."""
    if request.param == "sqlite":
        yield str(tmp_path / "harness.db")
        return
    with fresh_database() as url:
        yield url


@pytest.fixture
def store(url: str) -> Iterator[hx.Store]:
    s = hx.Store(url, create=True)
    yield s
    s.close()


def test_slots_in_flight_are_bounded_and_given_back(store: hx.Store) -> None:
    """Two processes' limiters share one limit: the third request waits until a slot is back."""
    a, b = Limiter(store, "r"), Limiter(store, "r")
    first = a.take("u", max_in_flight=2)
    second = b.take("u", max_in_flight=2)
    assert first.ok and second.ok and first.slot != second.slot
    refused = a.take("u", max_in_flight=2)
    assert not refused.ok and refused.why == "max_in_flight" and refused.slot is None
    assert Limiter(store, "other run").take("u", max_in_flight=2).ok  # (runs apart)
    assert a.take("another server", max_in_flight=2).ok  # (servers apart)
    assert second.slot is not None
    b.give_back("u", [second.slot])
    assert a.take("u", max_in_flight=2).ok
    a.close()
    b.close()


def test_the_rate_window_slides_and_keeps_at_most_one_window_of_rows(store: hx.Store) -> None:
    """Three starts per 30 s: the fourth waits about as long as the oldest start has left.
    Three per 0.3 s: a start is allowed again once one has left the window, and rows older
    than it are deleted. (The long window holds the fourth back however slowly a loaded
    machine takes the four; the short one is only waited out.)"""
    lim = Limiter(store, "r")
    for _ in range(3):
        assert lim.take("u", rate=(3, 30)).ok
    refused = lim.take("u", rate=(3, 30))
    assert not refused.ok and refused.why == "rate"
    assert refused.wait is not None and 20 < refused.wait <= 30
    time.sleep(0.35)
    for _ in range(12):
        while not lim.take("u", rate=(3, 0.3)).ok:
            time.sleep(0.01)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT COUNT(*) FROM hx_limit_use").scalar_one()
    assert rows <= 3
    lim.close()


def test_the_token_window_holds_requests_while_its_total_is_at_the_limit(
    store: hx.Store,
) -> None:
    """Responses that used 100 tokens of a 100-per-30 s limit hold the next request back for
    about as long as the oldest has left; they no longer count once they have left the window
    (read with a window of 0.3 s, so as not to wait 30 s)."""
    lim = Limiter(store, "r")
    assert lim.take("u", tokens=(100, 30)).ok
    lim.used("u", 60)
    assert lim.take("u", tokens=(100, 30)).ok  # (60 < 100)
    lim.used("u", 40)
    refused = lim.take("u", tokens=(100, 30))
    assert not refused.ok and refused.why == "tokens"
    assert refused.wait is not None and 20 < refused.wait <= 30
    time.sleep(0.35)
    assert lim.take("u", tokens=(100, 0.3)).ok
    lim.close()


def test_a_killed_process_s_slot_is_free_at_once_on_this_host(url: str, store: hx.Store) -> None:
    """A process holding the only slot blocks others while it lives; killed, its slot is free
    at the next take, without waiting for it to expire."""
    ready, tell = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: take the slot, say so, then hang on to it
        code = 1
        try:
            child = Limiter(hx.Store(url), "r", seconds=3600)
            code = 0 if child.take("u", max_in_flight=1).ok else 2
            os.write(tell, bytes([code]))
            time.sleep(60)
        finally:
            os._exit(code)
    try:
        assert os.read(ready, 1) == b"\x00"
        lim = Limiter(store, "r")
        assert not lim.take("u", max_in_flight=1).ok  # (it lives)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert lim.take("u", max_in_flight=1).ok
    lim.close()


def test_a_slot_of_another_host_lapses_at_its_expiry_unless_renewed(store: hx.Store) -> None:
    """A holder elsewhere is waited for until its slot expires; renewing keeps its slots.

    (Its slot is taken for 0.3 s and renewed for 30 s, then for 0.3 s: every check comes after
    an expiry, or long before one, however slowly a loaded machine runs the test.)"""
    there, here = Limiter(store, "r", seconds=0.3), Limiter(store, "r")
    there.host = "another-host"  # (its pid cannot be looked up from here)
    assert there.take("u", max_in_flight=1).ok
    there.seconds = 30
    there.renew()
    time.sleep(0.35)
    assert not here.take("u", max_in_flight=1).ok  # (past 0.3 s, but renewed for 30)
    there.seconds = 0.3
    there.renew()
    time.sleep(0.35)
    assert here.take("u", max_in_flight=1).ok
    there.close()
    here.close()


def test_closing_gives_back_every_slot_of_the_process(store: hx.Store) -> None:
    """A limiter closed gives back what it holds."""
    a, b = Limiter(store, "r"), Limiter(store, "r")
    assert a.take("u", max_in_flight=1).ok
    a.close()
    assert b.take("u", max_in_flight=1).ok
    b.close()


def test_the_circuit_one_process_opens_is_seen_by_another_until_it_closes(
    store: hx.Store,
) -> None:
    """A circuit recorded open is read by every limiter of the run, with why and by whom,
    until it closes; another run or server sees nothing."""
    a, b = Limiter(store, "r"), Limiter(store, "r")
    assert b.circuit("u") is None
    a.open_circuit("u", 30, "model server at u is down", failures=4, down_for=1.5)
    seen = b.circuit("u")
    assert seen is not None and seen.why == "model server at u is down"
    assert (seen.failures, seen.down_for, seen.pid) == (4, 1.5, os.getpid())
    assert Limiter(store, "other").circuit("u") is None and b.circuit("v") is None
    a.open_circuit("u", 30, "again")  # (recorded again: the latest holds)
    assert (b.circuit("u") or seen).why == "again"
    a.open_circuit("u", 0.3, "again, for 0.3 s")  # (the 30 s recorded before no longer hold)
    time.sleep(0.35)
    assert b.circuit("u") is None
    a.close()
    b.close()


def test_reading_a_circuit_waits_for_no_writer(tmp_path: Path) -> None:
    """A circuit is read while another connection holds the SQLite store's write lock (as
    another process's episode commit does): every model request of a run reads it, and none
    waits for that lock."""
    store = hx.Store(tmp_path / "harness.db", create=True)
    a, b = Limiter(store, "r"), Limiter(store, "r")
    a.open_circuit("u", 30, "model server at u is down")
    blocker = sqlite3.connect(tmp_path / "harness.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        seen = b.circuit("u")
        assert time.monotonic() - started < 5  # (the write lock is held for 30 s of timeout)
        assert seen is not None and seen.why == "model server at u is down"
        # (another thread of the process holds the limiter's lock, waiting to take a slot)
        with held_by_another_thread(b._lock):
            started = time.monotonic()
            assert b.circuit("u") is not None
            assert time.monotonic() - started < 5
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    a.close()
    b.close()
    store.close()


def test_a_store_written_before_the_limiter_tables_opens_and_verifies(tmp_path: Path) -> None:
    """A store without the limiter's tables opens read-only and verifies; opened for
    writing, it gets them."""
    path = tmp_path / "old.db"
    hx.Store(path, create=True).close()
    with sqlite3.connect(path) as conn:
        for table in ("hx_limit_slot", "hx_limit_use", "hx_circuit"):
            conn.execute(f"DROP TABLE {table}")
    old = hx.Store(path, readonly=True)
    assert old.verify().ok
    old.close()
    store = hx.Store(path)
    assert Limiter(store, "r").take("u", max_in_flight=1, rate=(1, 1.0)).ok
    store.close()
