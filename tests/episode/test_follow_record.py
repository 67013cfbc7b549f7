"""Resume without holding the agent to its recorded order (``follow_record=False``)."""

from __future__ import annotations

import pytest

import harness as hx

from ..conftest import Shop, restore_before


def actions(shop: Shop, runs: list[str]) -> tuple[hx.Action, hx.Action]:
    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id)
    def cancel(order_id: str) -> dict:
        """Cancel an order."""
        runs.append(order_id)
        return shop.set_status(order_id, "cancelled")

    @hx.action(writes=["orders/{order_id}"], approval=True)
    def refund(order_id: str) -> dict:
        """Refund an order (a person approves)."""
        runs.append(f"refund {order_id}")
        return shop.set_status(order_id, "refunded")

    cancel.compensation(shop.restore)
    refund.compensation(lambda ctx: restore_before(shop.state, ctx))
    return cancel, refund


def escalated(shop: Shop, store_url: str, runs: list[str]) -> tuple[hx.Action, hx.Action]:
    """An episode that cancelled o1 and o2, then was held on a refund of o3, approved."""
    cancel, refund = actions(shop, runs)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
            cancel("o1")
            cancel("o2")
            refund("o3")
    store = hx.Store(store_url)
    store.resolve(info.value.escalation_id, "approve", by="ops")
    store.close()
    return cancel, refund


def test_default_resume_refuses_calls_out_of_the_recorded_order(shop: Shop, store_url: str):
    runs: list[str] = []
    cancel, _ = escalated(shop, store_url, runs)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1", resume=True):
        with pytest.raises(hx.Diverged):
            cancel("o2")
    assert runs == ["o1", "o2"]  # nothing ran again


def test_resume_by_key_answers_committed_calls_in_any_order_and_runs_nothing_twice(
    shop: Shop, store_url: str
):
    """Code that re-runs only part of the agent, out of order: the committed calls come from
    the record by key, the approved call runs once, and the episode commits."""
    runs: list[str] = []
    cancel, refund = escalated(shop, store_url, runs)
    with hx.Episode(
        state=shop.state, store=store_url, episode_id="e1", resume=True, follow_record=False
    ) as ep:
        assert refund("o3")["status"] == "refunded"
        assert cancel("o2") == {"order_id": "o2", "status": "cancelled"}
    assert ep.outcome == "committed"
    assert runs == ["o1", "o2", "refund o3"]
    store = hx.Store(store_url)
    assert store.verify().ok
    assert [t.action for t in store.transactions("e1") if t.status == "committed"] == [
        "cancel",
        "cancel",
        "refund",
    ]
    store.close()
