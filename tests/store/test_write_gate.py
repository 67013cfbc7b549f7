"""Writers of one process to one SQLite store take turns on a lock of the process, not on
SQLite's sleep-and-retry: none of them meets the database locked by a thread of its own
process, whichever store object it writes through, and a forked child does not inherit a
turn some thread of its parent held."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.store.leases import _write_gate

from ..threads import held_by_another_thread

THREADS = 8
EPISODES = 6  # per thread


def _writes(store: hx.Store, name: str, errors: list[BaseException]) -> None:
    """Episodes of a write each, with a lease taken and given back around each (the thread's
    own state)."""
    state = hx.DictState({})

    @hx.action(writes=["counters/{key}"], idempotency_key=lambda a: a.key)
    def bump(key: str) -> int:
        """Add one to a counter."""
        value = int((state.get(f"counters/{key}") or {"n": 0})["n"]) + 1
        state[f"counters/{key}"] = {"n": value}
        return value

    try:
        for i in range(EPISODES):
            eid = f"{name}-{i}"
            with store.lease(eid, owner=name, seconds=60.0) as held:
                assert held
                with hx.Episode(state=state, store=store, episode_id=eid) as ep:
                    bump(eid)
                assert ep.outcome == "committed"
    except BaseException as exc:  # (reported by the test)
        errors.append(exc)


def test_threads_writing_one_store_never_meet_it_locked_by_their_own_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SQLite told not to wait at all for a locked database (busy_timeout 0: a writer
    that finds it locked fails at once), threads of one process writing episodes and leases
    through two store objects of one file all succeed: each write transaction waited for the
    one before it on the process's lock, never on SQLite's."""
    original = hx.Store._sqlite_pragmas

    def impatient(self: hx.Store, conn: Any, record: Any) -> None:
        original(self, conn, record)
        conn.execute("PRAGMA busy_timeout=0")

    monkeypatch.setattr(hx.Store, "_sqlite_pragmas", impatient)
    path = tmp_path / "h.db"
    stores = [hx.Store(path, create=True), hx.Store(tmp_path / "." / "h.db")]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_writes, args=(stores[i % 2], f"t{i}", errors))
        for i in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    try:
        assert len(stores[0].episodes()) == THREADS * EPISODES
        assert stores[0].leases() == []
        assert stores[0].verify_chain().ok
    finally:
        for s in stores:
            s.close()


def test_one_lock_a_file_whichever_way_it_is_named(tmp_path: Path) -> None:
    """Stores of one file share the lock (a path through a link included); another file has
    its own; a store of a server has none."""
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    first = hx.Store(tmp_path / "a" / "h.db", create=True)
    second = hx.Store(tmp_path / "link" / "h.db")
    other = hx.Store(tmp_path / "b.db", create=True)
    try:
        gate = _write_gate(os.path.realpath(tmp_path / "a" / "h.db"))
        assert first._gate_key is not None and second._gate_key is not None
        assert _write_gate(first._gate_key) is _write_gate(second._gate_key) is gate
        assert other._gate_key is not None and _write_gate(other._gate_key) is not gate
    finally:
        for s in (first, second, other):
            s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_holds_the_lock_still_writes(tmp_path: Path) -> None:
    """A thread of the parent holds the store's write lock when the process forks: the child
    (where that thread does not exist) writes an episode all the same, instead of waiting
    forever for a lock nobody there will give back."""
    store = hx.Store(tmp_path / "h.db", create=True)
    with held_by_another_thread(store._gated()):
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                state = hx.DictState({})
                with hx.Episode(state=state, store=store, episode_id="child") as ep:
                    ep.remember("value", "k", lambda: 1)
                code = 0 if ep.outcome == "committed" else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while True:
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the child waited for a lock its parent's thread held")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status) == 0
    assert store.episode("child") is not None and store.episode("child").status == "committed"
    store.close()


def test_a_turn_not_given_in_time_leaves_the_write_to_sqlites_own_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that keeps the process's turn (stuck, say, on a database another program
    locked) holds the others up for GATE_WAIT at most: then they go on to SQLite's own wait,
    and here, the database being free, write."""
    monkeypatch.setattr("harness.store.leases.GATE_WAIT", 0.2)
    store = hx.Store(tmp_path / "h.db", create=True)
    try:
        assert store._gate_key is not None
        with held_by_another_thread(_write_gate(store._gate_key)):
            started = time.monotonic()
            assert store.acquire_lease("e1", owner="a", seconds=60.0)
            with hx.Episode(state=hx.DictState({}), store=store, episode_id="e1") as ep:
                ep.remember("value", "k", lambda: 1)
            assert time.monotonic() - started < 20
        assert ep.outcome == "committed" and [x.owner for x in store.leases()] == ["a"]
    finally:
        store.close()
