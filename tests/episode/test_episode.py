"""Episodes: escalations a person resolves, resume without re-running, in-doubt actions."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock

from ..conftest import Shop
from ..crashes import die
from ..test_transaction import cancel_action


class Crash(BaseException):
    """Stands for the process dying in the middle of a tool call."""


def escalating_run(shop: Shop, store_url: str, clock: FakeClock, *, counts: dict[str, int]):
    """An agent that cancels o1, then o2 with a tool that escalates until a person decides."""

    def counted(order_id: str) -> dict[str, Any]:
        counts[order_id] = counts.get(order_id, 0) + 1
        if order_id == "o2" and counts[order_id] == 1:
            raise RuntimeError("fraud check timed out")
        return shop.set_status(order_id, "cancelled")

    cancel = cancel_action(shop, tool=counted, compensable=False, idempotency_key=None)

    def agent(ep: hx.Episode, second: str = "o2") -> None:
        cancel("o1")
        cancel(second)

    return cancel, agent


def test_escalation_then_approval_resumes_without_rerunning(
    shop: Shop, store_url: str, clock: FakeClock
):
    """After a person approves, the resumed episode skips done work and runs the gated action."""
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1") as ep:
            agent(ep)
    assert ep.outcome == "escalated"
    store = hx.Store(store_url)
    (pending,) = store.escalations(status="pending")
    assert pending.id == info.value.escalation_id and pending.action == "cancel_order"
    assert "fraud check timed out" in pending.reason
    resolved = store.resolve(pending.id, "approve", by="ops@example.com", reason="checked")
    assert resolved.status == "approved" and resolved.resolved_by == "ops@example.com"

    with hx.Episode(
        state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True
    ) as again:
        agent(again)
    assert again.outcome == "committed"
    assert counts == {"o1": 1, "o2": 2}  # o1 never re-ran; o2 ran once more, as approved
    assert shop.applied == [("o1", "cancelled"), ("o2", "cancelled")]
    assert store.verify_chain().ok
    kinds = [r.kind for r in store.log("e1")]
    assert "resolution" in kinds and "resolution_applied" in kinds and "dedup" in kinds
    store.close()


def test_rejected_escalation_is_reported_to_the_agent(shop: Shop, store_url: str, clock: FakeClock):
    """A rejected action is not executed on resume; the agent gets Rejected with who and why."""
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            agent(None)  # type: ignore[arg-type]
    store = hx.Store(store_url)
    store.resolve(info.value.escalation_id, "reject", by="lead", reason="customer called back")
    with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True):
        with pytest.raises(hx.Rejected, match="rejected by lead: customer called back"):
            agent(None)  # type: ignore[arg-type]
    assert counts == {"o1": 1, "o2": 1}
    store.close()


def test_edited_escalation_runs_with_new_arguments(shop: Shop, store_url: str, clock: FakeClock):
    """An edit resolution runs the action with the person's arguments instead."""
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            agent(None)  # type: ignore[arg-type]
    store = hx.Store(store_url)
    store.resolve(
        info.value.escalation_id, "edit", by="lead", edit={"order_id": "o2", "reason": "edited"}
    )
    with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True):
        agent(None)  # type: ignore[arg-type]
    assert shop.state["orders/o2"]["status"] == "cancelled"
    args = [t.args for t in store.transactions("e1") if t.status == "committed"]
    assert args[-1] == {"order_id": "o2", "reason": "edited"}
    store.close()


def test_pending_escalation_stays_pending_on_resume(shop: Shop, store_url: str, clock: FakeClock):
    """Resuming before anyone decides raises the same escalation again and runs nothing."""
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as first:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            agent(None)  # type: ignore[arg-type]
    with (
        pytest.raises(hx.Escalated) as second,
        hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True),
    ):
        agent(None)  # type: ignore[arg-type]
    assert first.value.escalation_id == second.value.escalation_id
    assert counts == {"o1": 1, "o2": 1}
    assert len(hx.Store(store_url).escalations()) == 1


def test_resolving_twice_or_badly_changes_nothing(shop: Shop, store_url: str, clock: FakeClock):
    """Resolving an already-resolved escalation, or with a bad decision, is a clear StoreError."""
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            agent(None)  # type: ignore[arg-type]
    store = hx.Store(store_url)
    esc_id = info.value.escalation_id
    with pytest.raises(hx.StoreError, match="decision must be"):
        store.resolve(esc_id, "maybe", by="x")
    with pytest.raises(hx.StoreError, match="give edit="):
        store.resolve(esc_id, "edit", by="x")
    with pytest.raises(hx.StoreError, match="say who decided"):
        store.resolve(esc_id, "approve", by="")
    store.resolve(esc_id, "approve", by="first")
    with pytest.raises(hx.StoreError, match="already approved by first"):
        store.resolve(esc_id, "reject", by="second")
    (row,) = store.escalations()
    assert row.status == "approved" and row.resolved_by == "first"
    with pytest.raises(hx.StoreError, match="no escalation"):
        store.resolve("nope", "approve", by="x")
    store.close()


def crash_during(shop: Shop, store_url: str, clock: FakeClock, *, after_effect: bool, **kw: Any):
    """Run one cancel whose tool 'dies' before or after applying its effect."""

    def dying(order_id: str) -> dict[str, Any]:
        if after_effect:
            shop.set_status(order_id, "cancelled")
        raise Crash()

    cancel = cancel_action(shop, tool=dying, **kw)
    with pytest.raises(Crash):
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            cancel("o1")
    return cancel_action(shop, **kw)


def test_in_doubt_action_with_effect_present_is_recovered(
    shop: Shop, store_url: str, clock: FakeClock
):
    """On resume, an intent whose effect is visible is committed as recovered, not re-run."""
    cancel = crash_during(shop, store_url, clock, after_effect=True)
    store = hx.Store(store_url)
    assert store.transactions("e1") == []  # no outcome: only its intent, in the log
    assert [r.kind for r in store.log("e1")][-2:] == ["intent", "end"]
    with hx.Episode(
        state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True
    ) as ep:
        assert ep.in_doubt == ["cancel_order:o1"]
        cancel("o1")
    assert shop.applied == [("o1", "cancelled")]
    assert [t.status for t in store.transactions("e1")] == ["recovered"]
    assert store.verify_chain().ok


def test_in_doubt_keyed_action_with_effect_absent_runs_again(
    shop: Shop, store_url: str, clock: FakeClock
):
    """On resume, a keyed intent whose effect is absent runs again, once."""
    cancel = crash_during(shop, store_url, clock, after_effect=False)
    with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True):
        cancel("o1")
    assert shop.applied == [("o1", "cancelled")]
    store = hx.Store(store_url)
    assert [t.status for t in store.transactions("e1")] == ["abandoned", "committed"]


def test_in_doubt_unkeyed_action_escalates(shop: Shop, store_url: str, clock: FakeClock):
    """On resume, an unkeyed, non-idempotent intent with no visible effect escalates."""
    cancel = crash_during(shop, store_url, clock, after_effect=False, idempotency_key=None)
    with (
        pytest.raises(hx.Escalated, match="could apply it twice"),
        hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True),
    ):
        cancel("o1")
    assert shop.applied == []


def test_call_held_for_a_person_on_resume_leaves_the_episode_running(
    shop: Shop, store_url: str, clock: FakeClock
):
    """An in-doubt call settled at resume by escalating is held for a person; the episode
    itself runs on, and its row says so, so what it writes next is not taken for records
    appended after its end."""
    cancel = crash_during(shop, store_url, clock, after_effect=False, idempotency_key=None)
    with hx.Episode(
        state=shop.state,
        store=store_url,
        clock=clock,
        episode_id="e1",
        resume=True,
        actions=[cancel],
    ) as ep:
        assert ep.outcome == "running"
        assert hx.Store(store_url).episode("e1").status == "running"  # type: ignore[union-attr]
        ep._writer.hot("intent", "e1:9", '{"action":"x","key":"k","args":{},"before":{}}')
        die(ep)  # and the process dies
    store = hx.Store(store_url)
    assert [e.status for e in store.escalations(episode_id="e1")] == ["pending"]
    assert store.verify_chain().ok


def test_resume_needs_an_existing_episode(shop: Shop, store_url: str):
    """Resuming an unknown episode, or reusing an id without resume, is a clear StoreError."""
    with pytest.raises(hx.StoreError, match="no episode 'ghost' to resume"):
        with hx.Episode(state=shop.state, store=store_url, episode_id="ghost", resume=True):
            pass
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
        pass
    with pytest.raises(hx.StoreError, match="already exists.*resume=True"):
        with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
            pass
    with pytest.raises(hx.ConfigurationError, match="needs the episode_id"):
        hx.Episode(state=shop.state, store=store_url, resume=True)


def test_rollback_after_resume_compensates_earlier_work(
    shop: Shop, store_url: str, clock: FakeClock
):
    """A resumed episode can roll back actions committed before the crash."""
    cancel = cancel_action(shop)
    original = shop.state.to_dict()
    with pytest.raises(Crash):
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            cancel("o1")
            cancel("o2")
            raise Crash()
    with hx.Episode(
        state=shop.state,
        store=store_url,
        clock=clock,
        episode_id="e1",
        resume=True,
        actions=[cancel],
    ) as ep:
        ep.rollback()
    assert shop.state.to_dict() == original
    store = hx.Store(store_url)
    assert [t.status for t in store.transactions("e1")] == ["compensated", "compensated"]


def test_agent_error_marks_episode_failed(shop: Shop, store_url: str, clock: FakeClock):
    """An exception from agent code ends the episode as failed, keeping what committed."""
    cancel = cancel_action(shop)
    with pytest.raises(ZeroDivisionError):
        with hx.Episode(state=shop.state, store=store_url, clock=clock) as ep:
            cancel("o1")
            _ = 1 / 0
    assert ep.outcome == "failed"
    assert hx.Store(store_url).episode(ep.id).status == "failed"  # type: ignore[union-attr]
    assert shop.state["orders/o1"]["status"] == "cancelled"


def test_jsonl_lines_are_bound_to_episode_and_transaction(
    shop: Shop, store_url: str, clock: FakeClock, tmp_path: Any
):
    """The JSON-lines log beside the database carries the episode and transaction ids."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e9"):
        cancel("o1")
    lines = [json.loads(x) for x in (tmp_path / "logs" / "harness.jsonl").read_text().splitlines()]
    commit = next(x for x in lines if x["event"] == "committed")
    assert commit["episode_id"] == "e9" and commit["txn_id"] == "e9:1"
    assert commit["action"] == "cancel_order"


def test_jsonl_lines_keep_their_order_and_times_when_sent_in_runs(
    shop: Shop, store_url: str, clock: FakeClock, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
):
    """Commit lines are queued and sent in runs; every line still appears, in the order things
    happened, each stamped with when it happened, and other lines never overtake them."""
    from harness.store.jsonlines import EpisodeLog

    monkeypatch.setattr(EpisodeLog, "RUN", 3)
    for n in range(4, 9):
        shop.state[f"orders/o{n}"] = {"status": "pending", "total": n}
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e9") as ep:
        for n in (1, 2, 4, 5, 6):
            before = time.time()
            cancel(f"o{n}")
            queued = ep.log._queue
            assert not queued or before <= queued[-1][1]["ts"] <= time.time()
        with pytest.raises(hx.PreconditionFailed):
            cancel("o3")  # a refusal's line comes after every commit's
        cancel("o7")
    lines = [json.loads(x) for x in (tmp_path / "logs" / "harness.jsonl").read_text().splitlines()]
    mine = [x for x in lines if x.get("episode_id") == "e9"]
    assert [(x["event"], x.get("txn_id")) for x in mine] == [
        ("episode_start", None),
        *[("committed", f"e9:{i}") for i in range(1, 6)],
        ("precondition_failed", "e9:6"),
        ("committed", "e9:7"),
        ("episode_end", None),
    ]
    times = [x["ts"] for x in mine]
    assert times == sorted(times)


def test_a_queued_line_is_the_line_structlog_writes(store_url: str, tmp_path: Any):
    """A line sent from the queue is, field for field and in order, what the bound logger
    writes for the same call."""
    store = hx.Store(store_url, create=True)
    log = store.jsonl(episode_id="e1", run_id=None)
    log.later("committed", txn_id="e1:1", action="a", step=1, attempts=1, duration=0.5)
    queued_ts = log._queue[0][1]["ts"]
    log.drain()
    log.info("committed", txn_id="e1:1", action="a", step=1, attempts=1, duration=0.5, ts=queued_ts)
    store.close()
    first, second = (tmp_path / "logs" / "harness.jsonl").read_text().splitlines()
    assert first == second and json.loads(first)["level"] == "info"


def test_a_queued_line_naming_a_bound_key_is_still_structlog_s_line(store_url: str, tmp_path: Any):
    """A queued line whose field has a bound key's name (or event's, level's) is written as
    the bound logger writes it: one key, the field's value, in the bound key's place."""
    store = hx.Store(store_url, create=True)
    log = store.jsonl(episode_id="e1", run_id=None)
    log.later("committed", txn_id="e1:1", step=1)  # (the quick path, then the general one)
    log.later("committed", txn_id="e1:2", episode_id="e2", level="debug")
    sent = [f for _, f in log._queue]
    log.drain()
    log.info("committed", txn_id="e1:1", step=1, ts=sent[0]["ts"])
    log.info("committed", txn_id="e1:2", episode_id="e2", level="debug", ts=sent[1]["ts"])
    store.close()
    lines = (tmp_path / "logs" / "harness.jsonl").read_text().splitlines()
    assert lines[:2] == lines[2:] and len(lines) == 4
    assert json.loads(lines[1])["episode_id"] == "e2" and lines[1].count('"episode_id"') == 1


def test_resume_runs_what_the_resolution_record_says_not_an_edited_row(
    shop: Shop, store_url: str, clock: FakeClock
):
    """An escalation's arguments edited in its row after the decision was recorded are not what
    resume runs: it runs the person's arguments from the hashed resolution record, and the
    audit names the altered row."""

    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            agent(None)  # type: ignore[arg-type]
    store = hx.Store(store_url)
    esc_id = info.value.escalation_id
    store.resolve(esc_id, "edit", by="lead", edit={"order_id": "o2", "reason": "edited"})
    db = store_url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:  # someone with the database rewrites the decision
        conn.execute(
            "UPDATE hx_escalation SET edit = ?, resolved_by = 'lead' WHERE id = ?",
            ('{"order_id":"o2","reason":"forged"}', esc_id),
        )
    report = store.verify()
    assert any("with which arguments" in str(f) for f in report.findings), report.findings
    with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True):
        agent(None)  # type: ignore[arg-type]
    args = [t.args for t in store.transactions("e1") if t.status == "committed"]
    assert args[-1] == {"order_id": "o2", "reason": "edited"}
    store.close()


def test_a_resolution_with_no_record_is_not_acted_on(shop: Shop, store_url: str, clock: FakeClock):
    """An escalation marked approved in its row with no resolution record stays held on resume."""
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, clock, counts=counts)
    with pytest.raises(hx.Escalated) as info:
        with hx.Episode(state=shop.state, store=store_url, clock=clock, episode_id="e1"):
            agent(None)  # type: ignore[arg-type]
    db = store_url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE hx_escalation SET status = 'approved', resolved_by = 'nobody' WHERE id = ?",
            (info.value.escalation_id,),
        )
    with pytest.raises(hx.Escalated):
        with hx.Episode(
            state=shop.state, store=store_url, clock=clock, episode_id="e1", resume=True
        ):
            agent(None)  # type: ignore[arg-type]
    assert counts == {"o1": 1, "o2": 1}  # the held call never ran
