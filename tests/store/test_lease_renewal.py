"""A lease is renewed only by the holder that still holds it: a holder that stalled past its
lease's expiry, while another process took the episode over, finished it and gave the lease
back, does not take the lease again when its renewal wakes up (it would be left behind, and
block the episode for the lease's length)."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import harness as hx


def test_a_renewal_extends_a_lease_its_owner_holds(tmp_path: Path) -> None:
    store = hx.Store(tmp_path / "h.db", create=True)
    try:
        assert store.acquire_lease("e1", owner="a", seconds=1.0)
        (before,) = store.leases()
        assert store.renew_lease("e1", owner="a", seconds=60.0)
        (after,) = store.leases()
        assert after.owner == "a" and after.expires_at > before.expires_at + 50
    finally:
        store.close()


def test_a_stalled_holder_does_not_take_back_a_lease_it_lost(tmp_path: Path) -> None:
    store = hx.Store(tmp_path / "h.db", create=True)
    try:
        assert store.acquire_lease("e1", owner="a", seconds=0.2)
        time.sleep(0.3)  # (a's lease expires while it stalls)
        assert store.acquire_lease("e1", owner="b", seconds=60.0)
        assert not store.renew_lease("e1", owner="a", seconds=60.0)  # (b holds it)
        assert [x.owner for x in store.leases()] == ["b"]
        store.release_lease("e1", owner="b")  # (b finished the episode)
        assert not store.renew_lease("e1", owner="a", seconds=60.0)
        assert store.leases() == []
    finally:
        store.close()


def test_a_held_lease_stops_renewing_once_lost(tmp_path: Path) -> None:
    """The background renewal of a lease taken with ``Store.lease`` ends when it finds the
    lease gone, and leaves none behind."""
    store = hx.Store(tmp_path / "h.db", create=True)
    try:
        with store.lease("e1", owner="a", seconds=0.3) as held:
            assert held
            store.release_lease("e1", owner="a")  # (as if taken over and given back)
            time.sleep(0.5)  # (renewals at every 0.1 s find it gone)
            assert store.leases() == []
        assert store.leases() == []
    finally:
        store.close()


def test_a_claim_in_the_process_holding_the_lease_waits_for_no_writer(tmp_path: Path) -> None:
    """A run's worker holds its trial's lease; the episode's own claim then finds it held by
    this process in a read, while another connection holds the store's write lock (another
    process committing), and takes nothing."""
    store = hx.Store(tmp_path / "h.db", create=True)
    blocker = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    try:
        assert store.acquire_lease("e1", owner="worker", seconds=60.0)
        blocker.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert store.claim_episode("e1") is None
        assert time.monotonic() - started < 5  # (the write lock is held for 30 s of timeout)
        blocker.execute("ROLLBACK")
        assert [x.owner for x in store.leases()] == ["worker"]
    finally:
        blocker.close()
        store.close()


def test_lease_operations_of_threads_run_at_once(tmp_path: Path) -> None:
    """One thread's lease operation waiting for the store's write lock does not hold up
    another thread's read of a lease it holds: each has a connection of its own, and every
    lease taken is given back once."""
    store = hx.Store(tmp_path / "h.db", create=True)
    blocker = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    try:
        assert store.acquire_lease("mine", owner="worker", seconds=60.0)
        blocker.execute("BEGIN IMMEDIATE")
        waiting = threading.Thread(
            target=store.acquire_lease, args=("other",), kwargs={"owner": "x"}
        )
        waiting.start()  # (waits for the write lock)
        time.sleep(0.2)
        started = time.monotonic()
        assert store.claim_episode("mine") is None
        assert time.monotonic() - started < 5
        blocker.execute("ROLLBACK")
        waiting.join(timeout=30)
        assert sorted(x.episode_id for x in store.leases()) == ["mine", "other"]
        for episode_id, owner in (("mine", "worker"), ("other", "x")):
            store.release_lease(episode_id, owner=owner)
        assert store.leases() == []
        # (a closed store keeps no connection, and still answers)
        store.close()
        assert store.acquire_lease("again", owner="y", seconds=1.0)
    finally:
        blocker.close()
        store.close()


def _race_for(path: str, owner: str, start: Any, won: Any) -> None:
    store = hx.Store(path)
    start.wait(30)
    if store.acquire_lease("free", owner=owner, seconds=60.0):
        won.put(owner)
    store.close()


def test_a_free_lease_raced_for_by_processes_is_taken_once(tmp_path: Path) -> None:
    """Processes that try at once to take a lease nobody holds (each a single insert unless a
    row is there): one takes it, the others are refused, and the row is the winner's."""
    path = str(tmp_path / "h.db")
    hx.Store(path, create=True).close()
    ctx = multiprocessing.get_context("fork")
    start, won = ctx.Barrier(4), ctx.Queue()
    racers = [ctx.Process(target=_race_for, args=(path, f"p{i}", start, won)) for i in range(4)]
    for p in racers:
        p.start()
    for p in racers:
        p.join(60)
        assert p.exitcode == 0
    winners = []
    with contextlib.suppress(queue.Empty):
        while True:
            winners.append(won.get(timeout=1))
    store = hx.Store(path)
    try:
        assert len(winners) == 1
        (lease,) = store.leases()
        assert lease.owner == winners[0]
    finally:
        store.close()
