"""A lease is renewed only by the holder that still holds it: a holder that stalled past its
lease's expiry, while another process took the episode over, finished it and gave the lease
back, does not take the lease again when its renewal wakes up (it would be left behind, and
block the episode for the lease's length)."""

from __future__ import annotations

import time
from pathlib import Path

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
