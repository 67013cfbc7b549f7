"""Every failure class and every decision of one transaction, on a fake clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock

from .conftest import Shop


def cancel_action(shop: Shop, **options: Any) -> hx.Action[..., dict[str, Any]]:
    """A cancel action on the shop with its checks and undo, configurable per test."""
    tool = options.pop("tool", None)
    compensable = options.pop("compensable", True)
    options.setdefault("writes", ["orders/{order_id}"])
    options.setdefault("idempotency_key", lambda a: a.order_id)

    def cancel_order(order_id: str, reason: str = "asked") -> dict[str, Any]:
        """Cancel a pending order.

        Args:
            order_id: the order to cancel.
            reason: why the customer cancels.
        """
        if tool is not None:
            return tool(order_id)  # type: ignore[no-any-return]
        return shop.set_status(order_id, "cancelled")

    act = hx.action(**options)(cancel_order)

    @act.precondition
    def is_pending(ctx: hx.Context) -> bool:
        order = ctx.state.get(f"orders/{ctx.args.order_id}")
        return order is not None and order["status"] == "pending"

    @act.postcondition
    def is_cancelled(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"orders/{ctx.args.order_id}"]["status"] == "cancelled")

    if compensable:
        act.compensation(shop.restore)
    return act


def episode(shop: Shop, store: hx.Store, clock: FakeClock, **kw: Any) -> hx.Episode:
    """An episode on the shop's state with a fast retry policy unless one is given."""
    kw.setdefault("policy", hx.Policy(retry=hx.Retry(attempts=3, backoff=0.5, jitter=False)))
    return hx.Episode(state=shop.state, store=store, clock=clock, **kw)


def statuses(store: hx.Store, ep: hx.Episode) -> list[str]:
    """The status of each transaction of the episode, in order."""
    return [t.status for t in store.transactions(ep.id)]


def test_commit_records_result_diff_and_checkpoint(shop: Shop, store: hx.Store, clock: FakeClock):
    """A successful call returns the tool's result and records its diff and a checkpoint."""
    cancel = cancel_action(shop)
    with episode(shop, store, clock) as ep:
        assert cancel("o1") == {"order_id": "o1", "status": "cancelled"}
    assert ep.outcome == "committed"
    (txn,) = store.transactions(ep.id)
    assert txn.status == "committed" and txn.step == 1 and txn.attempts == 1
    diff = txn.diff or {}
    assert diff["orders/o1"][0]["status"] == "pending"
    assert diff["orders/o1"][1]["status"] == "cancelled"
    (cp,) = store.checkpoints(ep.id)
    assert cp.step == 1 and cp.digest == store.episode(ep.id).digest  # type: ignore[union-attr]
    assert store.verify_chain().ok


def test_same_key_twice_applies_once(shop: Shop, store: hx.Store, clock: FakeClock):
    """A second call with a committed idempotency key returns the recorded result, no effect."""
    cancel = cancel_action(shop)
    with episode(shop, store, clock):
        first = cancel("o1")
        second = cancel("o1")
    assert first == second
    assert shop.applied == [("o1", "cancelled")]


def test_same_key_with_other_arguments_is_refused_and_recorded(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """A committed key reused with other arguments raises IdempotencyConflict; nothing runs."""
    cancel = cancel_action(shop)
    with episode(shop, store, clock) as ep:
        cancel("o1")
        with pytest.raises(hx.IdempotencyConflict, match="other arguments") as info:
            cancel("o1", reason="again")
    assert info.value.key == "cancel_order:o1" and ep.outcome == "committed"
    assert shop.applied == [("o1", "cancelled")]
    assert statuses(store, ep) == ["committed", "invalid"]
    assert store.verify_chain().ok


def test_invalid_arguments_are_rejected_and_recorded(shop: Shop, store: hx.Store, clock: FakeClock):
    """Arguments that do not match the schema raise InvalidArguments; nothing runs."""
    cancel = cancel_action(shop)
    with episode(shop, store, clock) as ep:
        with pytest.raises(hx.InvalidArguments, match="cancel_order.*order_id"):
            cancel(order_id=["not", "a", "string"])  # type: ignore[arg-type]
        with pytest.raises(hx.InvalidArguments, match="colour: Extra inputs"):
            cancel("o1", colour="red")  # type: ignore[call-arg]
    assert shop.applied == []
    assert statuses(store, ep) == ["invalid", "invalid"]


def test_false_precondition_continues_without_executing(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """A false precondition raises PreconditionFailed with decision continue; nothing runs."""
    cancel = cancel_action(shop)
    with episode(shop, store, clock) as ep:
        with pytest.raises(hx.PreconditionFailed) as info:
            cancel("o3")
        assert info.value.check == "is_pending" and info.value.decision == "continue"
        cancel("o1")  # the episode goes on
    assert shop.applied == [("o1", "cancelled")]
    assert statuses(store, ep) == ["precondition", "committed"]
    assert ep.outcome == "committed"


def test_precondition_that_raises_is_a_check_error(shop: Shop, store: hx.Store, clock: FakeClock):
    """A precondition raising is a CheckError naming the check; the tool never runs."""
    cancel = cancel_action(shop)

    @cancel.precondition
    def broken(ctx: hx.Context) -> bool:
        raise KeyError("missing")

    with episode(shop, store, clock):
        with pytest.raises(hx.CheckError, match="precondition 'broken' raised KeyError"):
            cancel("o1")
    assert shop.applied == []


def test_transient_error_is_retried_on_schedule(shop: Shop, store: hx.Store, clock: FakeClock):
    """A transient error is retried with exponential backoff and commits once."""
    calls = {"n": 0}

    def flaky(order_id: str) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] < 3:
            raise hx.TransientError("busy")
        return shop.set_status(order_id, "cancelled")

    cancel = cancel_action(shop, tool=flaky)
    with episode(shop, store, clock) as ep:
        cancel("o1")
    assert clock.sleeps == [0.5, 1.0]
    assert shop.applied == [("o1", "cancelled")]
    (txn,) = store.transactions(ep.id)
    assert txn.attempts == 3 and txn.status == "committed"
    kinds = [r.kind for r in store.log(ep.id)]
    assert kinds.count("decision") == 2  # two retry decisions, logged


def test_transient_errors_exhausted_continue_with_every_error(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """When retries run out the decision is continue and every attempt's error is kept."""

    def down(order_id: str) -> dict[str, Any]:
        raise hx.TransientError("down")

    cancel = cancel_action(shop, tool=down)
    with episode(shop, store, clock) as ep, pytest.raises(hx.ActionFailed) as info:
        cancel("o1")
    err = info.value
    assert err.failure_class == "fail_stop" and err.decision == "continue"
    assert len(err.errors) == 3
    assert shop.state["orders/o1"]["status"] == "pending"
    (txn,) = store.transactions(ep.id)
    assert txn.status == "failed" and txn.attempts == 3


def test_permanent_error_is_not_retried(shop: Shop, store: hx.Store, clock: FakeClock):
    """A non-transient error fails at once with fail_stop and decision continue."""

    def refuse(order_id: str) -> dict[str, Any]:
        raise ValueError("order locked")

    cancel = cancel_action(shop, tool=refuse)
    with episode(shop, store, clock):
        with pytest.raises(hx.ActionFailed, match="order locked") as info:
            cancel("o1")
    assert info.value.failure_class == "fail_stop"
    assert clock.sleeps == []


def test_slow_attempt_is_fail_slow_undone_and_retried(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """An attempt over its timeout is fail_slow: its effect is compensated and it is retried."""
    calls = {"n": 0}

    def slow_then_fast(order_id: str) -> dict[str, Any]:
        calls["n"] += 1
        result = shop.set_status(order_id, "cancelled")
        if calls["n"] == 1:
            clock.advance(5.0)
        return result

    cancel = cancel_action(shop, tool=slow_then_fast)
    policy = hx.Policy(timeout=1.0, retry=hx.Retry(attempts=3, backoff=0.5, jitter=False))
    with episode(shop, store, clock, policy=policy) as ep:
        cancel("o1")
    assert calls["n"] == 2
    (txn,) = store.transactions(ep.id)
    assert txn.status == "committed" and txn.attempts == 2
    assert txn.errors[0].startswith("ActionTimeout")
    assert shop.state["orders/o1"]["status"] == "cancelled"


def test_timeout_on_a_sync_action_is_refused_with_the_reason():
    """timeout= on a sync tool is refused: a sync call cannot be interrupted."""
    with pytest.raises(hx.ConfigurationError, match="needs an async def tool"):
        hx.action(writes=["c/x"], timeout=0.3)(lambda: None)


def test_silent_failure_is_caught_by_postcondition(shop: Shop, store: hx.Store, clock: FakeClock):
    """A tool that reports success without the effect fails silent after its retries."""

    def liar(order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "status": "cancelled"}

    cancel = cancel_action(shop, tool=liar)
    with episode(shop, store, clock):
        with pytest.raises(hx.ActionFailed, match="postcondition 'is_cancelled'") as info:
            cancel("o1")
    assert info.value.failure_class == "silent" and info.value.decision == "continue"
    assert len(clock.sleeps) == 2  # silent maps to retry by default


def test_wrong_effect_is_compensated(shop: Shop, store: hx.Store, clock: FakeClock):
    """A tool that writes the wrong value is undone before the failure is reported."""

    def wrong(order_id: str) -> dict[str, Any]:
        return shop.set_status(order_id, "shipped")

    cancel = cancel_action(shop, tool=wrong)
    with episode(shop, store, clock), pytest.raises(hx.ActionFailed):
        cancel("o1")
    assert shop.state["orders/o1"] == {"status": "pending", "total": 10}


def test_scope_violation_rolls_back_the_episode(shop: Shop, store: hx.Store, clock: FakeClock):
    """Writing outside the declared scope is a ScopeViolation and rolls the episode back."""

    def sloppy(order_id: str) -> dict[str, Any]:
        shop.state["audit/count"] = {"n": 1}
        return shop.set_status(order_id, "cancelled")

    good = cancel_action(shop)
    bad = cancel_action(shop, tool=sloppy, name="cancel_sloppy")
    original = shop.state.to_dict()
    with episode(shop, store, clock) as ep:
        good("o1")
        with pytest.raises(hx.ScopeViolation) as info:
            bad("o2")
    assert info.value.keys == ["audit/count"] and info.value.decision == "rollback"
    assert ep.outcome == "rolled_back"
    assert shop.state.to_dict() == original
    assert statuses(store, ep) == ["compensated", "failed"]


def test_calls_after_rollback_are_refused(shop: Shop, store: hx.Store, clock: FakeClock):
    """A rolled-back episode takes no more actions."""
    cancel = cancel_action(shop)
    with episode(shop, store, clock) as ep:
        cancel("o1")
        ep.rollback()
        with pytest.raises(hx.EpisodeClosed, match="rolled_back"):
            cancel("o2")


def test_failed_compensation_escalates(shop: Shop, store: hx.Store, clock: FakeClock):
    """A compensation that raises escalates with the evidence; it is never swallowed."""

    def wrong(order_id: str) -> dict[str, Any]:
        return shop.set_status(order_id, "shipped")

    cancel = cancel_action(shop, tool=wrong, compensable=False, idempotency_key=None)

    @cancel.compensation
    def undo(ctx: hx.Context) -> None:
        raise RuntimeError("warehouse offline")

    with episode(shop, store, clock) as ep, pytest.raises(hx.Escalated) as info:
        cancel("o1")
    assert ep.outcome == "escalated"
    (esc,) = store.escalations(status="pending")
    assert esc.id == info.value.escalation_id and esc.failure_class == "compensation"
    assert "warehouse offline" in esc.reason
    evidence = esc.evidence
    assert evidence["after"]["orders/o1"]["status"] == "shipped"


def test_compensation_that_does_not_restore_escalates(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """A compensation that returns but leaves the state changed is a compensation failure."""

    def wrong(order_id: str) -> dict[str, Any]:
        return shop.set_status(order_id, "shipped")

    cancel = cancel_action(shop, tool=wrong, compensable=False)

    @cancel.compensation
    def forgetful(ctx: hx.Context) -> None:
        pass

    with episode(shop, store, clock), pytest.raises(hx.Escalated, match="compensation"):
        cancel("o1")


def test_lost_acknowledgement_is_recovered_not_repeated(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """An effect applied before the call raised is verified and committed, not run again."""

    def lost_ack(order_id: str) -> dict[str, Any]:
        shop.set_status(order_id, "cancelled")
        raise hx.TransientError("connection reset")

    cancel = cancel_action(shop, tool=lost_ack)
    with episode(shop, store, clock) as ep:
        assert cancel("o1") is None
    assert shop.applied == [("o1", "cancelled")]
    (txn,) = store.transactions(ep.id)
    assert txn.status == "recovered"


def test_unsafe_action_failure_escalates_and_says_why(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """A mutating action with neither key nor compensation escalates instead of retrying."""

    def down(order_id: str) -> dict[str, Any]:
        raise hx.TransientError("down")

    cancel = cancel_action(shop, tool=down, compensable=False, idempotency_key=None)
    with episode(shop, store, clock) as ep:
        with pytest.raises(hx.Escalated, match="neither an idempotency key nor a compensation"):
            cancel("o1")
    assert clock.sleeps == []
    decisions = [json.loads(r.payload) for r in store.log(ep.id) if r.kind == "decision"]
    assert decisions[-1]["decision"] == "escalate"


def test_pivot_turns_rollback_into_escalation(shop: Shop, store: hx.Store, clock: FakeClock):
    """After a pivot action commits, a failure that would roll back escalates instead."""

    def sloppy(order_id: str) -> dict[str, Any]:
        shop.state["audit/count"] = {"n": 1}
        return shop.set_status(order_id, "cancelled")

    ship = cancel_action(shop, pivot=True, name="ship")
    bad = cancel_action(shop, tool=sloppy, name="cancel_sloppy")
    with episode(shop, store, clock) as ep:
        ship("o1")
        with pytest.raises(hx.Escalated, match="pivot action 'ship'"):
            bad("o2")
    assert ep.outcome == "escalated"
    assert shop.state["orders/o1"]["status"] == "cancelled"  # not rolled back


@pytest.mark.parametrize("kind", ["object", "cycle"])
def test_unserializable_result_is_undone(shop: Shop, store: hx.Store, clock: FakeClock, kind: str):
    """A result that cannot be stored (an object JSON cannot hold, a list that contains
    itself) is NotSerializable and its effect is compensated; the next call stores fine."""

    def odd(order_id: str) -> Any:
        shop.set_status(order_id, "cancelled")
        if kind == "object":
            return object()
        loop: list[Any] = []
        loop.append(loop)
        return loop

    cancel = cancel_action(shop, tool=odd)
    with episode(shop, store, clock):
        with pytest.raises(hx.NotSerializable, match="not JSON-serializable|Circular"):
            cancel("o1")
        assert shop.state["orders/o1"]["status"] == "pending"
        assert cancel_action(shop, name="plain")("o2") == {"order_id": "o2", "status": "cancelled"}


def test_postcondition_that_raises_is_undone(shop: Shop, store: hx.Store, clock: FakeClock):
    """A postcondition raising is a CheckError; the effect is compensated, the log says why."""
    cancel = cancel_action(shop)

    @cancel.postcondition
    def broken(ctx: hx.Context) -> bool:
        return bool(ctx.result["missing"])

    with episode(shop, store, clock) as ep:
        with pytest.raises(hx.CheckError, match="postcondition 'broken' raised KeyError"):
            cancel("o1")
    assert shop.state["orders/o1"]["status"] == "pending"
    (txn,) = store.transactions(ep.id)
    assert txn.failure_class == "silent" and "fix the check" in (txn.reason or "")


def test_action_outside_episode_names_the_fix(shop: Shop):
    """Calling an action with no episode raises NotInEpisode naming the action and the fix."""
    cancel = cancel_action(shop)
    with pytest.raises(hx.NotInEpisode, match="cancel_order.*with hx.Episode"):
        cancel("o1")
    assert shop.applied == []


def test_read_only_action_that_writes_is_a_scope_failure(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """An action declared without writes may not change state."""

    @hx.action
    def peek(order_id: str) -> dict[str, Any]:
        """Look at an order (but secretly write)."""
        shop.set_status(order_id, "peeked")
        return {}

    peek.compensation(shop.restore)
    with episode(shop, store, clock), pytest.raises(hx.ScopeViolation):
        peek("o1")
    assert shop.state["orders/o1"]["status"] == "pending"


def test_policy_decision_overrides(shop: Shop, store: hx.Store, clock: FakeClock):
    """A policy can map a failure class to another decision (silent -> rollback)."""

    def liar(order_id: str) -> dict[str, Any]:
        return {}

    good = cancel_action(shop)
    bad = cancel_action(shop, tool=liar, name="cancel_liar")
    policy = hx.Policy(decisions={"silent": "rollback"}, retry=hx.Retry(attempts=1))
    with episode(shop, store, clock, policy=policy) as ep:
        good("o1")
        with pytest.raises(hx.ActionFailed) as info:
            bad("o2")
    assert info.value.decision == "rollback" and ep.outcome == "rolled_back"
    assert shop.state["orders/o1"]["status"] == "pending"


def test_bad_policy_and_retry_settings_are_clear():
    """Misconfigured policies and retries fail at construction with the fix named."""
    with pytest.raises(hx.ConfigurationError, match="failure classes are"):
        hx.Policy(decisions={"slow": "retry"})
    with pytest.raises(hx.ConfigurationError, match="attempts must be >= 1"):
        hx.Retry(attempts=0)
    with pytest.raises(hx.ConfigurationError, match="exception types or a predicate"):
        hx.Retry(on=("nope",))  # type: ignore[arg-type]


# --- async ---


def async_cancel(shop: Shop, clock: FakeClock, fail_first: int = 0, slow_first: bool = False):
    """An async cancel action that fails or is slow on its first attempts."""
    calls = {"n": 0}

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id, timeout=1.0)
    async def cancel_order(order_id: str) -> dict[str, Any]:
        """Cancel a pending order (async)."""
        calls["n"] += 1
        if calls["n"] <= fail_first:
            raise hx.TransientError("busy")
        result = shop.set_status(order_id, "cancelled")
        if slow_first and calls["n"] == 1:
            clock.advance(3.0)
        return result

    @cancel_order.postcondition
    def is_cancelled(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"orders/{ctx.args.order_id}"]["status"] == "cancelled")

    @cancel_order.compensation
    async def undo(ctx: hx.Context) -> None:
        shop.restore(ctx)

    return cancel_order, calls


async def test_async_action_commits(shop: Shop, store: hx.Store, clock: FakeClock):
    """An async action runs as a transaction under `async with`."""
    cancel, _ = async_cancel(shop, clock)
    async with episode(shop, store, clock) as ep:
        assert await cancel("o1") == {"order_id": "o1", "status": "cancelled"}
    assert ep.outcome == "committed" and statuses(store, ep) == ["committed"]


async def test_async_checks_are_awaited(shop: Shop, store: hx.Store, clock: FakeClock):
    """An async action's checks may be ``async def``: they are awaited, and a false one
    refuses the call as a sync one would."""
    cancel, calls = async_cancel(shop, clock)
    seen: list[str] = []

    @cancel.precondition
    async def not_frozen(ctx: hx.Context) -> bool:
        """Frozen orders wait for a person."""
        seen.append(f"pre {ctx.args.order_id}")
        return ctx.args.order_id != "o2"

    @cancel.postcondition
    async def logged(ctx: hx.Context) -> bool:
        seen.append(f"post {ctx.args.order_id}")
        return True

    async with episode(shop, store, clock) as ep:
        assert await cancel("o1") == {"order_id": "o1", "status": "cancelled"}
        with pytest.raises(hx.PreconditionFailed, match="Frozen orders wait for a person"):
            await cancel("o2")
    assert seen == ["pre o1", "post o1", "pre o2"] and calls["n"] == 1
    assert statuses(store, ep) == ["committed", "precondition"]


async def test_async_transient_retry(shop: Shop, store: hx.Store, clock: FakeClock):
    """Async transient errors are retried with the same schedule, without real sleeps."""
    cancel, calls = async_cancel(shop, clock, fail_first=2)
    async with episode(shop, store, clock):
        await cancel("o1")
    assert calls["n"] == 3 and clock.sleeps == [0.5, 1.0]
    assert shop.applied == [("o1", "cancelled")]


async def test_async_slow_attempt_compensated_with_async_undo(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """An async attempt over its timeout is undone by an async compensation, then retried."""
    cancel, calls = async_cancel(shop, clock, slow_first=True)
    async with episode(shop, store, clock) as ep:
        await cancel("o1")
    assert calls["n"] == 2
    assert store.transactions(ep.id)[0].attempts == 2
    assert shop.state["orders/o1"]["status"] == "cancelled"


async def test_async_rollback(shop: Shop, store: hx.Store, clock: FakeClock):
    """arollback runs async compensations newest first and restores the state."""
    cancel, _ = async_cancel(shop, clock)
    original = shop.state.to_dict()
    async with episode(shop, store, clock) as ep:
        await cancel("o1")
        await cancel("o2")
        await ep.arollback()
    assert shop.state.to_dict() == original and ep.outcome == "rolled_back"


def test_sync_action_with_async_check_is_a_configuration_error(
    shop: Shop, store: hx.Store, clock: FakeClock
):
    """A sync action cannot await an async check; the error says what to change."""
    cancel = cancel_action(shop)

    async def remote(ctx: hx.Context) -> bool:
        return True

    with pytest.raises(hx.ConfigurationError, match="'remote' is async but the action"):
        cancel.precondition(remote)
    assert [name for name, _ in cancel.preconditions] == ["is_pending"]


def test_refusal_carries_the_checks_docstring(shop: Shop, store: hx.Store, clock: FakeClock):
    """A false precondition's first docstring line is the reason the agent reads."""
    cancel = cancel_action(shop)

    @cancel.precondition
    def not_vip(ctx: hx.Context) -> bool:
        """VIP orders are cancelled by a person, not an agent.

        More detail that the agent does not need.
        """
        return False

    with episode(shop, store, clock) as ep:
        with pytest.raises(hx.PreconditionFailed) as info:
            cancel("o1")
    assert info.value.reason == "VIP orders are cancelled by a person, not an agent."
    assert "not_vip' is false: VIP orders" in str(info.value)
    (txn,) = store.transactions(ep.id)
    assert txn.reason == "not_vip: VIP orders are cancelled by a person, not an agent."


def test_recover_hook_rebuilds_a_lost_result(shop: Shop, store: hx.Store, clock: FakeClock):
    """When the answer was lost but the effect is there, the recover hook gives the result."""

    def lost_ack(order_id: str) -> dict[str, Any]:
        shop.set_status(order_id, "cancelled")
        raise hx.TransientError("connection reset")

    cancel = cancel_action(shop, tool=lost_ack)

    @cancel.recover
    def from_state(ctx: hx.Context) -> dict[str, Any]:
        return {"order_id": ctx.args.order_id, **ctx.after[f"orders/{ctx.args.order_id}"]}

    with episode(shop, store, clock) as ep:
        assert cancel("o1") == {"order_id": "o1", "status": "cancelled", "total": 10}
    (txn,) = store.transactions(ep.id)
    assert txn.status == "recovered" and txn.result["status"] == "cancelled"
    assert shop.applied == [("o1", "cancelled")]


def test_tool_can_declare_its_failure_class(shop: Shop, store: hx.Store, clock: FakeClock):
    """An exception with failure_class="planned" is recorded and decided as planned."""

    class Maintenance(Exception):
        failure_class = "planned"

    def down(order_id: str) -> dict[str, Any]:
        raise Maintenance("payments offline for maintenance until 02:00")

    cancel = cancel_action(shop, tool=down)
    with episode(shop, store, clock) as ep:
        with pytest.raises(hx.ActionFailed) as info:
            cancel("o1")
    assert info.value.failure_class == "planned" and info.value.decision == "continue"
    (txn,) = store.transactions(ep.id)
    assert txn.failure_class == "planned"


def test_silent_retry_keeps_its_reason(shop: Shop, store: hx.Store, clock: FakeClock):
    """A silent attempt that is retried leaves its reason in the record and the retry decision."""
    calls = {"n": 0}

    def lazy_then_right(order_id: str) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            return {"order_id": order_id, "status": "cancelled"}
        return shop.set_status(order_id, "cancelled")

    cancel = cancel_action(shop, tool=lazy_then_right)
    with episode(shop, store, clock) as ep:
        cancel("o1")
    (txn,) = store.transactions(ep.id)
    assert txn.attempts == 2 and "is_cancelled" in txn.errors[0]
    retry = next(json.loads(r.payload) for r in store.log(ep.id) if r.kind == "decision")
    assert "is_cancelled" in retry["reason"]
