"""Several tool calls in one model reply: run at once, each its own transaction, in call order."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("openai")

import harness as hx
from harness.agents.base import Toolbox
from harness.agents.openai import OpenAIAgent
from harness.runs.toolbox import RecordingToolbox
from harness.suite import Task
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer, text_reply, tool_reply

from ..conftest import Shop
from ..test_transaction import cancel_action

TASK = Task(id="t2", instruction="Cancel my orders o1 and o2.", required_outputs=[])

BOTH = tool_reply(("cancel_order", {"order_id": "o1"}), ("cancel_order", {"order_id": "o2"}))


def agent_for(server: FakeChatServer, clock: FakeClock, **options: Any) -> OpenAIAgent:
    """An agent on the fake server whose backoff sleeps go to the fake clock."""
    return OpenAIAgent(base_url=server.base_url, model="fake-model", sleep=clock.sleep, **options)


def test_two_calls_in_one_reply_are_two_transactions_each_committed_once(
    shop: Shop, store: hx.Store, clock: FakeClock
) -> None:
    """Both writes of one reply commit once, each with only its own change, results in order."""
    with FakeChatServer([BOTH, text_reply("Both cancelled.")]) as server:
        with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
            toolbox = Toolbox({"cancel_order": cancel_action(shop)}, ep)
            output = agent_for(server, clock).run(TASK, toolbox, seed=0)
    assert ep.outcome == "committed"
    assert sorted(shop.applied) == [("o1", "cancelled"), ("o2", "cancelled")]  # once each
    txns = store.transactions(ep.id)
    assert [(t.action, t.status) for t in txns] == [("cancel_order", "committed")] * 2
    # The record is in the order of the calls, and each transaction holds only its own change.
    assert [t.args["order_id"] for t in txns] == ["o1", "o2"]
    assert [sorted(t.diff) for t in txns] == [["orders/o1"], ["orders/o2"]]
    assert [t.diff[f"orders/{t.args['order_id']}"][1]["status"] for t in txns] == [
        "cancelled",
        "cancelled",
    ]
    # The model reads the results in the order of its calls, under their ids.
    ids = [c["id"] for c in server.responses[0]["choices"][0]["message"]["tool_calls"]]
    results = server.tool_results(1)
    assert [m["tool_call_id"] for m in results] == ids
    assert ['"o1"' in m["content"] for m in results] == [True, False]
    assert ['"o2"' in m["content"] for m in results] == [False, True]
    assert output.meta["parallel_turns"] == 1 and output.meta["tool_calls"] == 2
    assert output.message == "Both cancelled." and server.errors == []


def test_calls_of_one_reply_run_at_once_and_results_keep_the_call_order(
    episode_and_shop: tuple[hx.Episode, Shop], clock: FakeClock
) -> None:
    """Two reads meet at a barrier (only possible at once); the first to finish (the slow one
    waits for it) is answered second, as it was called second."""
    ep, shop = episode_and_shop
    barrier = threading.Barrier(2, timeout=5)
    fast_done = threading.Event()
    finished: list[str] = []

    def slow_lookup(order_id: str) -> dict[str, Any]:
        """Look up an order, slowly."""
        barrier.wait()
        assert fast_done.wait(5)
        finished.append("slow")
        return {"slow": dict(shop.state[f"orders/{order_id}"])}

    def fast_lookup(order_id: str) -> dict[str, Any]:
        """Look up an order."""
        barrier.wait()
        finished.append("fast")
        fast_done.set()
        return {"fast": dict(shop.state[f"orders/{order_id}"])}

    script = [
        tool_reply(("slow_lookup", {"order_id": "o1"}), ("fast_lookup", {"order_id": "o2"})),
        text_reply("ok"),
    ]
    toolbox = Toolbox({"slow_lookup": slow_lookup, "fast_lookup": fast_lookup}, ep)
    with FakeChatServer(script) as server:
        agent_for(server, clock).run(TASK, toolbox, seed=0)
    assert finished == ["fast", "slow"]
    slow, fast = server.tool_results(1)
    assert slow["content"].startswith('{"slow"') and fast["content"].startswith('{"fast"')
    assert server.errors == []


@pytest.fixture
def episode_and_shop(shop: Shop, store: hx.Store, clock: FakeClock) -> Any:
    """An open episode on the shop, and the shop."""
    with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
        yield ep, shop


def test_parallel_tool_calls_false_runs_them_one_after_another(
    shop: Shop, store: hx.Store, clock: FakeClock
) -> None:
    """With parallel_tool_calls=False every call runs in the agent's own thread, in order."""
    threads: list[str] = []

    def lookup(order_id: str) -> str:
        """Look up an order's status."""
        threads.append(threading.current_thread().name)
        return str(shop.state[f"orders/{order_id}"]["status"])

    script = [
        tool_reply(("lookup", {"order_id": "o1"}), ("lookup", {"order_id": "o3"})),
        text_reply("ok"),
    ]
    with FakeChatServer(script) as server:
        agent = agent_for(server, clock, parallel_tool_calls=False)
        with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
            output = agent.run(TASK, Toolbox({"lookup": lookup}, ep), seed=0)
    assert threads == [threading.current_thread().name] * 2
    assert [m["content"] for m in server.tool_results(1)] == ["pending", "delivered"]
    assert output.meta["parallel_turns"] == 0
    assert agent.config()["parallel_tool_calls"] is False


def escalating_cancel(shop: Shop, counts: dict[str, int]) -> hx.Action[..., dict[str, Any]]:
    """A cancel whose first try on o2 fails and escalates (it cannot be undone)."""

    def counted(order_id: str) -> dict[str, Any]:
        counts[order_id] = counts.get(order_id, 0) + 1
        if order_id == "o2" and counts[order_id] == 1:
            raise RuntimeError("fraud check timed out")
        return shop.set_status(order_id, "cancelled")

    return cancel_action(shop, tool=counted, compensable=False, idempotency_key=None)


def test_an_escalation_in_a_reply_stops_the_calls_after_it(
    shop: Shop, store_url: str, clock: FakeClock
) -> None:
    """o2 escalates: o1 (called before it) commits, o3 (after it) is not run; the agent stops."""
    counts: dict[str, int] = {}
    cancel = escalating_cancel(shop, counts)
    reply = tool_reply(
        ("cancel_order", {"order_id": "o1"}),
        ("cancel_order", {"order_id": "o2"}),
        ("cancel_order", {"order_id": "o3"}),
    )
    with FakeChatServer([reply, text_reply("never")]) as server:
        with pytest.raises(hx.Escalated):
            with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e") as ep:
                agent_for(server, clock).run(TASK, Toolbox({"cancel_order": cancel}, ep), seed=0)
    assert ep.outcome == "escalated" and counts == {"o1": 1, "o2": 1}
    store = hx.Store(store_url)
    rows = store.transactions("e")
    assert [(t.args["order_id"], t.status) for t in rows] == [
        ("o1", "committed"),
        ("o2", "failed"),
    ]
    assert len(server.requests) == 1  # the model was not asked again
    store.close()


@pytest.mark.parametrize("parallel", [True, False])
def test_a_resumed_trial_matches_its_record_after_a_parallel_reply(
    shop: Shop, store_url: str, clock: FakeClock, parallel: bool
) -> None:
    """Reads that finish out of order, then an escalation; resumed after approval, the trial
    gets its recorded reads and model answers back, nothing runs twice, and it finishes."""
    counts: dict[str, int] = {}
    cancel = escalating_cancel(shop, counts)

    def slow_lookup(order_id: str) -> dict[str, Any]:
        """Look up an order, slowly."""
        time.sleep(0.05)
        return dict(shop.state[f"orders/{order_id}"])

    def fast_lookup(order_id: str) -> dict[str, Any]:
        """Look up an order."""
        return dict(shop.state[f"orders/{order_id}"])

    tools = {"cancel_order": cancel, "slow_lookup": slow_lookup, "fast_lookup": fast_lookup}
    script = [
        tool_reply(("slow_lookup", {"order_id": "o1"}), ("fast_lookup", {"order_id": "o2"})),
        BOTH,
        text_reply("Both cancelled."),
    ]
    with FakeChatServer(script) as server:
        agent = agent_for(server, clock, parallel_tool_calls=parallel)
        with pytest.raises(hx.Escalated) as info:
            with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e") as ep:
                agent.run(TASK, RecordingToolbox(tools, ep), seed=0)
        asked = len(server.requests)
        store = hx.Store(store_url)
        store.resolve(info.value.escalation_id, "approve", by="ops@example.com")
        with hx.Episode(
            state=shop.state, store=store_url, clock=clock, episode_id="e", resume=True
        ) as again:
            output = agent.run(TASK, RecordingToolbox(tools, again), seed=0)
    assert asked == 2 and len(server.requests) == 3  # only the last answer was asked for
    assert again.outcome == "committed" and output.message == "Both cancelled."
    assert counts == {"o1": 1, "o2": 2}  # o1 never re-ran; o2 ran once more, as approved
    assert shop.applied == [("o1", "cancelled"), ("o2", "cancelled")]
    committed = [t.args["order_id"] for t in store.transactions("e") if t.status == "committed"]
    assert committed == ["o1", "o2"]
    assert store.verify_chain().ok
    store.close()
