"""The promise on the paths that broke it: truthful outcomes, no doubled effects, calls at once,
a store that cannot be written, values that must come back the same, policies that take effect."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import enum
import sqlite3
import threading
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock

from ..conftest import restore_before
from ..crashes import die


class Ledger:
    """Accounts on a DictState, and a count of every effect the tools applied."""

    def __init__(self, *names: str) -> None:
        self.state = hx.DictState({f"acct/{n}": {"balance": 0} for n in names or ("a", "b")})
        self.applied = 0

    def add(self, name: str, amount: int) -> None:
        acct = self.state[f"acct/{name}"]
        acct["balance"] += amount
        self.state[f"acct/{name}"] = acct
        self.applied += 1

    def balance(self, name: str) -> int:
        return int(self.state[f"acct/{name}"]["balance"])


@pytest.fixture(autouse=True)
def _audited(store_url: str) -> Any:
    """After each test, the audit's full check finds every episode's record intact."""
    yield
    if not Path(store_url.removeprefix("sqlite:///")).exists():
        return
    store = hx.Store(store_url)
    try:
        report = store.verify()
    finally:
        store.close()
    assert report.ok, report.findings[0]


def episode(ledger: Ledger, store: hx.Store, **kw: Any) -> hx.Episode:
    """An episode on the ledger with a fake clock and a fast retry policy."""
    kw.setdefault("policy", hx.Policy(retry=hx.Retry(attempts=3, backoff=0.1, jitter=False)))
    return hx.Episode(state=ledger.state, store=store, clock=FakeClock(), **kw)


def escalations(store: hx.Store, ep: hx.Episode) -> list[hx.store.EscalationRow]:
    """The episode's escalations."""
    return list(store.escalations(episode_id=ep.id))


# --- 1. a change that stays is never called rolled back ---


@pytest.mark.parametrize(
    "kind",
    [
        {"writes": ["acct/{name}"], "idempotency_key": lambda a: a.name},
        {"writes": ["acct/{name}"], "idempotent": True},
        {},
    ],
    ids=["keyed", "idempotent", "no-writes"],
)
def test_scope_violation_without_compensation_escalates_not_rolled_back(
    store: hx.Store, kind: dict[str, Any]
):
    """An uncompensable call that wrote outside its scope escalates; its change is evidence."""
    ledger = Ledger("a", "b")

    @hx.action(**kind)
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        ledger.add("b", 1)

    with episode(ledger, store) as ep:
        with pytest.raises(hx.Escalated):
            deposit("a")
    assert ep.outcome == "escalated"
    (esc,) = escalations(store, ep)
    assert "acct/b" in esc.reason and "still in the state" in esc.reason
    assert "acct/b" in esc.evidence["diff"]
    assert ledger.balance("b") == 1  # the change stays, and the outcome says so


def test_scope_violation_with_compensation_rolls_back_truly(store: hx.Store):
    """A compensable call that wrote outside its scope is undone: rolled_back is true."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        ledger.add("b", 1)

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    with episode(ledger, store) as ep:
        with pytest.raises(hx.ScopeViolation):
            deposit("a")
    assert ep.outcome == "rolled_back"
    assert ledger.balance("a") == 0 and ledger.balance("b") == 0


# --- 2. a failed attempt's change forbids a retry ---


def test_failed_postcondition_with_change_is_not_retried_but_escalated(store: hx.Store):
    """A keyed uncompensable tool whose postcondition fails runs once and escalates."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)

    @deposit.postcondition
    def never(ctx: hx.Context) -> bool:
        return False

    with episode(ledger, store) as ep:
        with pytest.raises(hx.Escalated):
            deposit("a")
    assert ledger.balance("a") == 10 and ledger.applied == 1
    assert ep.outcome == "escalated"
    (txn,) = store.transactions(ep.id)
    assert txn.attempts == 1 and txn.decision == "escalate"


def test_failed_attempt_compensated_is_retried(store: hx.Store):
    """A failed attempt whose change was compensated and verified gone is tried again."""
    ledger = Ledger("a")
    calls = {"n": 0}

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        calls["n"] += 1
        ledger.add(name, 10 if calls["n"] > 1 else 3)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        key = f"acct/{ctx.args.name}"
        return bool(ctx.after[key]["balance"] - ctx.before[key]["balance"] == 10)

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    with episode(ledger, store) as ep:
        deposit("a")
    assert ep.outcome == "committed" and ledger.balance("a") == 10 and calls["n"] == 2


# --- 3. calls at once ---


async def test_concurrent_async_calls_are_each_attributed_their_own_change(store: hx.Store):
    """asyncio.gather of two calls in one episode commits both, each with its own diff."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str, amount: int) -> int:
        before = ledger.balance(name)
        await asyncio.sleep(0)  # the other call gets the loop here
        ledger.add(name, amount)
        await asyncio.sleep(0)
        return before + amount

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        key = f"acct/{ctx.args.name}"
        return bool(ctx.after[key]["balance"] - ctx.before[key]["balance"] == ctx.args.amount)

    async with episode(ledger, store) as ep:
        assert await asyncio.gather(deposit("a", 5), deposit("b", 7)) == [5, 7]
    assert ep.outcome == "committed"
    diffs = {t.args["name"]: t.diff for t in store.transactions(ep.id)}
    assert all(t.status == "committed" for t in store.transactions(ep.id))
    assert ledger.balance("a") == 5 and ledger.balance("b") == 7
    assert diffs == {
        "a": {"acct/a": [{"balance": 0}, {"balance": 5}]},
        "b": {"acct/b": [{"balance": 0}, {"balance": 7}]},
    }
    assert store.verify_chain().ok


def test_calls_from_threads_at_once_commit_each_once(store: hx.Store):
    """Sync calls of one episode from several threads at once all commit, the store intact."""
    ledger = Ledger(*[f"t{i}" for i in range(8)])
    started = threading.Barrier(8)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 1)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 1)

    errors: list[BaseException] = []
    with episode(ledger, store) as ep:

        def work(i: int) -> None:
            started.wait()
            try:
                for _ in range(3):
                    deposit(f"t{i}")  # the second and third are answered from the record
            except BaseException as exc:  # pragma: no cover - the failure this test looks for
                errors.append(exc)

        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(work, i))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert ep.outcome == "committed" and ledger.applied == 8
    assert [t.status for t in store.transactions(ep.id)] == ["committed"] * 8
    assert store.verify_chain().ok


async def test_a_tool_calling_another_action_passes_through_the_gate(store: hx.Store):
    """An action called from inside a running tool does not wait for its own caller."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/b"], idempotency_key=lambda a: "fee")
    async def fee() -> None:
        ledger.add("b", 1)

    @hx.action(writes=["acct/{name}", "acct/b"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)
        await fee()

    async with episode(ledger, store) as ep:
        await asyncio.wait_for(deposit("a"), 5)
    assert ep.outcome == "committed" and ledger.balance("b") == 1


# --- 4. the store cannot take the outcome ---


def _fail_kind(ep: hx.Episode, kind: str, times: int = 1) -> None:
    """Make the episode's next ``times`` writes of a ``kind`` record fail as a locked database."""
    writer = ep._writer
    original = writer.append_text
    left = {"n": times}

    def append_text(k: str, *args: Any, **kw: Any) -> str:
        if k == kind and left["n"] > 0:
            left["n"] -= 1
            raise sqlite3.OperationalError("database is locked")
        return original(k, *args, **kw)

    writer.append_text = append_text


def keyed_deposit(ledger: Ledger, **kw: Any) -> hx.Action[..., None]:
    """A keyed deposit of 10 with a postcondition (and a compensation unless told not to)."""
    compensable = kw.pop("compensable", True)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name, **kw)
    def deposit(name: str) -> None:
        ledger.add(name, 10)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        key = f"acct/{ctx.args.name}"
        return bool(ctx.after[key]["balance"] - ctx.before[key]["balance"] == 10)

    if compensable:
        deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    return deposit


def test_outcome_write_failure_leaves_the_call_in_doubt_then_settles_it(store: hx.Store):
    """A commit the store refused is in doubt, then settled by the next call: once, recorded."""
    ledger = Ledger("a", "b")
    deposit = keyed_deposit(ledger)
    with episode(ledger, store) as ep:
        _fail_kind(ep, "committed")
        with pytest.raises(hx.StoreError, match="in doubt"):
            deposit("a")
        assert ep.in_doubt == ["deposit:a"]
        deposit("b")  # settles deposit("a") first: its effect is found, committed as recovered
        deposit("a")  # answered from the record, not run again
    assert ep.outcome == "committed" and ledger.applied == 2
    assert ledger.balance("a") == 10 and ledger.balance("b") == 10
    assert [t.status for t in store.transactions(ep.id)] == ["recovered", "committed"]
    assert store.verify_chain().ok


def test_outcome_write_failure_is_settled_at_the_end_of_the_episode(store: hx.Store):
    """A call left in doubt by the store is settled when the episode ends."""
    ledger = Ledger("a")
    deposit = keyed_deposit(ledger)
    with episode(ledger, store) as ep:
        _fail_kind(ep, "committed")
        with pytest.raises(hx.StoreError):
            deposit("a")
    assert ep.outcome == "committed"
    assert [t.status for t in store.transactions(ep.id)] == ["recovered"]


def test_outcome_write_failure_is_settled_on_resume(store: hx.Store, store_url: str):
    """A call left in doubt when the store stays down is settled by resume, not run twice."""
    ledger = Ledger("a")
    deposit = keyed_deposit(ledger)
    ep = episode(ledger, store)

    def first_process() -> None:
        ep.__enter__()
        _fail_kind(ep, "committed", times=10)
        with pytest.raises(hx.StoreError):
            deposit("a")
        die(ep)  # the process dies here: the episode never ends

    contextvars.copy_context().run(first_process)
    with episode(ledger, hx.Store(store_url), episode_id=ep.id, resume=True, actions=[deposit]):
        deposit("a")
    assert ledger.applied == 1
    assert [t.status for t in store.transactions(ep.id)] == ["recovered"]


def test_a_real_lock_on_the_store_is_a_clear_error_and_nothing_is_lost(
    store: hx.Store, store_url: str
):
    """Another connection takes the store's write lock while the tool runs: the outcome cannot
    be written, the call is in doubt, and the next call settles it; nothing runs twice."""
    ledger = Ledger("a", "b")
    path = store_url.removeprefix("sqlite:///")
    blocker = sqlite3.connect(path, isolation_level=None)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        if name == "a":
            blocker.execute("BEGIN IMMEDIATE")  # held past the writer's busy timeout

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    with episode(ledger, store) as ep:
        ep._writer.conn.execute("PRAGMA busy_timeout=50")
        with pytest.raises(hx.StoreError, match="could not be recorded.*in doubt"):
            deposit("a")
        blocker.execute("ROLLBACK")
        blocker.close()
        deposit("b")
        deposit("a")
    assert ledger.applied == 2 and ep.outcome == "committed"
    assert [t.status for t in store.transactions(ep.id)] == ["recovered", "committed"]
    assert store.verify_chain().ok


def test_an_unencodable_result_is_undone_before_anything_is_recorded_wrong(store: hx.Store):
    """A result holding a lone surrogate is NotSerializable: the effect is compensated."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> str:
        ledger.add(name, 10)
        return "bad \udc80 text"

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    with episode(ledger, store) as ep:
        with pytest.raises(hx.NotSerializable, match="surrogate"):
            deposit("a")
    assert ledger.balance("a") == 0 and ep.outcome == "committed"
    assert store.verify_chain().ok


def test_unencodable_arguments_are_refused_before_the_tool_runs(store: hx.Store):
    """Arguments holding a lone surrogate are InvalidArguments, recorded; nothing runs."""
    ledger = Ledger("a")
    deposit = keyed_deposit(ledger)
    with episode(ledger, store) as ep:
        with pytest.raises(hx.InvalidArguments, match="surrogate"):
            deposit("a\udc80")
    assert ledger.applied == 0
    assert [t.status for t in store.transactions(ep.id)] == ["invalid"]


# --- 5. argument values are literals in a scope ---


def test_a_glob_in_an_argument_does_not_widen_the_scope(store: hx.Store):
    """writes=["acct/{name}"] called with name="*" may write only the resource named "*"."""
    ledger = Ledger("a")
    ledger.state["acct/*"] = {"balance": 0}

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add("a", 10)  # writes another account than the one named

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    with episode(ledger, store):
        with pytest.raises(hx.ScopeViolation, match="acct/a"):
            deposit("*")
    assert ledger.balance("a") == 0


def test_a_glob_the_developer_wrote_still_globs(store: hx.Store):
    """A pattern the developer wrote with a glob covers what it matches."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/*"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 1)

    with episode(ledger, store) as ep:
        deposit("b")
    assert ep.outcome == "committed"


# --- 6. idempotency keys ---


@pytest.mark.parametrize("returned", [None, "", 42])
def test_a_key_function_must_return_a_non_empty_string(store: hx.Store, returned: Any):
    """A key function returning None, "" or a number is refused before anything runs."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: returned)
    def deposit(name: str) -> None:
        ledger.add(name, 1)

    with episode(ledger, store) as ep:
        with pytest.raises(hx.ConfigurationError, match="non-empty string"):
            deposit("a")
    assert ledger.applied == 0
    assert [t.status for t in store.transactions(ep.id)] == ["invalid"]


def test_a_raising_key_function_is_a_clear_recorded_error(store: hx.Store):
    """A key function that raises is a ConfigurationError naming it, recorded; nothing runs."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.nope)
    def deposit(name: str) -> None:
        ledger.add(name, 1)

    with episode(ledger, store) as ep:
        with pytest.raises(hx.ConfigurationError, match="idempotency_key of action 'deposit'"):
            deposit("a")
    assert ledger.applied == 0
    (txn,) = store.transactions(ep.id)
    assert txn.status == "invalid" and "AttributeError" in (txn.reason or "")


def test_two_different_actions_with_one_name_are_refused(store: hx.Store):
    """A second, different action under a name the episode knows is refused; it never shares
    the first one's keys."""
    ledger = Ledger("a")

    def make(amount: int) -> hx.Action[..., None]:
        def deposit(name: str) -> None:
            ledger.add(name, amount)

        return hx.action(deposit, writes=["acct/{name}"], idempotency_key=lambda a: a.name)

    first = make(1)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name, name="deposit")
    def other(name: str) -> None:
        ledger.add(name, 100)

    with episode(ledger, store):
        first("a")
        with pytest.raises(hx.ConfigurationError, match="two different actions"):
            other("a")
    assert ledger.balance("a") == 1


# --- 7. values come back the same ---


class Colour(enum.Enum):
    RED = "red"


def test_typed_arguments_are_stored_and_restored_the_same(store: hx.Store, store_url: str):
    """datetime, date, Decimal, UUID and Enum arguments work and resume restores them."""
    ledger = Ledger("a")
    seen: list[tuple[Any, ...]] = []
    ident = uuid.uuid4()

    @hx.action(writes=["acct/{name}"])
    def stamp(
        name: str, when: dt.datetime, day: dt.date, amount: Decimal, ref: uuid.UUID, c: Colour
    ) -> dt.datetime:
        seen.append((when, day, amount, ref, c))
        ledger.add(name, 1)
        return when

    stamp.compensation(lambda ctx: restore_before(ledger.state, ctx))

    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    args = ("a", when, dt.date(2026, 1, 2), Decimal("1.10"), ident, Colour.RED)
    with episode(ledger, store) as ep:
        assert stamp(*args) == when
    with episode(
        ledger, hx.Store(store_url), episode_id=ep.id, resume=True, actions=[stamp]
    ) as again:
        assert stamp(*args) == when  # from the record, typed as the tool returned it
        again.rollback()  # the compensation gets the arguments back, typed
    assert seen == [args[1:]] and ledger.balance("a") == 0


def test_values_that_would_change_on_resume_are_refused(store: hx.Store):
    """Arguments and results that would not come back the same are refused, clearly."""
    ledger = Ledger("a")

    @hx.action
    def lookup(table: dict[Any, str]) -> int:
        return len(table)

    @hx.action
    def blob() -> Any:
        return b"\xff\x00"

    @hx.action
    def typed_blob() -> bytes:
        return b"\xff\x00"

    with episode(ledger, store) as ep:
        with pytest.raises(hx.InvalidArguments, match="would not come back the same"):
            lookup({1: "a", "1": "b"})
        with pytest.raises(hx.NotSerializable, match="annotate"):
            blob()
        assert typed_blob() == b"\xff\x00"
    assert ep.outcome == "committed"


# --- 8. every policy mapping takes effect or is refused ---


def test_precondition_mapped_to_escalate_escalates(store: hx.Store):
    """Policy(decisions={"precondition": "escalate"}) holds the refused call for a person."""
    ledger = Ledger("a")
    deposit = keyed_deposit(ledger)

    @deposit.precondition
    def never(ctx: hx.Context) -> bool:
        return False

    with episode(ledger, store, policy=hx.Policy(decisions={"precondition": "escalate"})) as ep:
        with pytest.raises(hx.Escalated):
            deposit("a")
    assert ep.outcome == "escalated" and ledger.applied == 0
    (esc,) = escalations(store, ep)
    assert esc.failure_class == "precondition"


def test_precondition_mapped_to_rollback_rolls_the_episode_back(store: hx.Store):
    """Policy(decisions={"precondition": "rollback"}) undoes what the episode committed."""
    ledger = Ledger("a", "b")
    deposit = keyed_deposit(ledger)

    @deposit.precondition
    def not_b(ctx: hx.Context) -> bool:
        return bool(ctx.args.name != "b")

    with episode(ledger, store, policy=hx.Policy(decisions={"precondition": "rollback"})) as ep:
        deposit("a")
        with pytest.raises(hx.PreconditionFailed) as info:
            deposit("b")
    assert info.value.decision == "rollback"
    assert ep.outcome == "rolled_back" and ledger.balance("a") == 0


@pytest.mark.parametrize(
    "decisions",
    [
        {"precondition": "retry"},
        {"compensation": "continue"},
        {"compensation": "rollback"},
        {"compensation": "retry"},
    ],
)
def test_mappings_that_cannot_take_effect_are_refused(decisions: dict[str, str]):
    """A mapping the engine could not carry out is refused by the constructor, with why."""
    with pytest.raises(hx.ConfigurationError, match="cannot be carried out"):
        hx.Policy(decisions=decisions)


def test_scope_mapped_to_retry_retries_after_compensation(store: hx.Store):
    """Policy(decisions={"scope": "retry"}) compensates the stray write and tries again."""
    ledger = Ledger("a", "b")
    calls = {"n": 0}

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        calls["n"] += 1
        ledger.add(name, 10)
        if calls["n"] == 1:
            ledger.add("b", 1)

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    policy = hx.Policy(decisions={"scope": "retry"}, retry=hx.Retry(backoff=0, jitter=False))
    with episode(ledger, store, policy=policy) as ep:
        deposit("a")
    assert ep.outcome == "committed" and calls["n"] == 2
    assert ledger.balance("a") == 10 and ledger.balance("b") == 0


# --- approval before a call ---


def _big_deposit(ledger: Ledger, **kw: Any) -> hx.Action[..., int]:
    """A keyed deposit of any amount, compensable."""

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: f"{a.name}:{a.amount}", **kw)
    def deposit(name: str, amount: int) -> int:
        ledger.add(name, amount)
        return ledger.balance(name)

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    return deposit


def over_1000(ctx: hx.Context) -> bool:
    """Amounts over 1,000 need a person."""
    return bool(ctx.args.amount > 1000)


@pytest.mark.parametrize("where", ["action", "policy"])
def test_a_call_held_for_approval_runs_once_after_approve(
    store: hx.Store, store_url: str, where: str
):
    """A call a rule holds runs nothing until a person approves; resumed, it runs exactly once."""
    ledger = Ledger("a")
    deposit = _big_deposit(ledger, **({"approval": over_1000} if where == "action" else {}))
    policy = hx.Policy(approval=over_1000) if where == "policy" else hx.Policy()

    def agent() -> None:
        deposit("a", 5)
        deposit("a", 5000)

    with pytest.raises(hx.Escalated) as info:
        with episode(ledger, store, policy=policy) as ep:
            agent()
    assert ep.outcome == "escalated" and ledger.balance("a") == 5 and ledger.applied == 1
    (esc,) = escalations(store, ep)
    assert esc.failure_class == "approval" and esc.status == "pending"
    assert "args_digest" in esc.evidence and esc.args["amount"] == 5000
    assert [t.status for t in store.transactions(ep.id)] == ["committed", "held"]

    store.resolve(info.value.escalation_id, "approve", by="ops", reason="checked")
    with episode(
        ledger, hx.Store(store_url), episode_id=ep.id, resume=True, policy=policy
    ) as again:
        agent()
    assert again.outcome == "committed"
    assert ledger.balance("a") == 5005 and ledger.applied == 2
    # Resumed again, the approved call is answered from the record: still once.
    with episode(ledger, hx.Store(store_url), episode_id=ep.id, resume=True, policy=policy):
        agent()
    assert ledger.applied == 2
    assert store.verify_chain().ok


def test_a_rejected_call_never_runs_and_another_amount_needs_its_own_approval(
    store: hx.Store, store_url: str
):
    """Reject: the agent is told, nothing runs; a call with other arguments is held anew."""
    ledger = Ledger("a")
    deposit = _big_deposit(ledger, approval=over_1000)
    with pytest.raises(hx.Escalated) as info:
        with episode(ledger, store) as ep:
            deposit("a", 5000)
    store.resolve(info.value.escalation_id, "reject", by="ops", reason="too much")
    with pytest.raises(hx.Escalated):
        with episode(ledger, hx.Store(store_url), episode_id=ep.id, resume=True):
            with pytest.raises(hx.Rejected):
                deposit("a", 5000)
            deposit("a", 6000)  # other arguments: held for its own approval
    assert ledger.applied == 0
    assert [e.status for e in escalations(store, ep)] == ["rejected", "pending"]


def test_approval_true_holds_every_call(store: hx.Store):
    """approval=True asks a person before each call; nothing runs before."""
    ledger = Ledger("a")
    deposit = _big_deposit(ledger, approval=True)
    with pytest.raises(hx.Escalated, match="approval"):
        with episode(ledger, store):
            deposit("a", 1)
    assert ledger.applied == 0


def test_an_approval_rule_that_raises_holds_the_call(store: hx.Store):
    """A rule that raises holds the call (when in doubt, ask), and the reason says why."""
    ledger = Ledger("a")

    def broken(ctx: hx.Context) -> bool:
        raise KeyError("limit")

    deposit = _big_deposit(ledger, approval=broken)
    with pytest.raises(hx.Escalated, match="raised KeyError"):
        with episode(ledger, store):
            deposit("a", 1)
    assert ledger.applied == 0


def test_approval_must_be_true_or_a_function():
    """approval= takes True or a function of ctx; anything else is refused with the fix."""
    with pytest.raises(hx.ConfigurationError, match="approval takes True"):
        hx.action(writes=["acct/a"], approval="yes")(lambda: None)  # type: ignore[call-overload]
    with pytest.raises(hx.ConfigurationError, match="approval"):
        hx.Policy(approval=3)  # type: ignore[arg-type]


# --- undo by a reversing entry ---


class Journal:
    """An append-only ledger: entries are never changed, a refund is a new entry."""

    def __init__(self) -> None:
        self.state = hx.DictState({"journal/count": {"n": 0}})

    def post(self, amount: int) -> str:
        n = self.state["journal/count"]["n"] + 1
        self.state[f"journal/{n}"] = {"amount": amount}
        self.state["journal/count"] = {"n": n}
        return str(n)

    def net(self) -> int:
        return sum(v["amount"] for k, v in self.state.items() if k != "journal/count")


def journal_charge(journal: Journal, *, refund_works: bool = True) -> hx.Action[..., str]:
    """A charge undone by posting a refund entry, judged by the net change being zero."""

    @hx.action(writes=["journal/*"], idempotency_key=lambda a: a.ref)
    def charge(ref: str, amount: int) -> str:
        return journal.post(amount)

    @charge.compensation
    def refund(ctx: hx.Context) -> None:
        journal.post(-ctx.args.amount if refund_works else 0)

    @charge.compensation_check
    def net_zero(ctx: hx.Context) -> bool:
        return journal.net() == sum(
            v["amount"] for k, v in ctx.before.items() if v and k != "journal/count"
        )

    return charge


def test_a_reversing_entry_rolls_back_when_its_check_holds(store: hx.Store):
    """An undo that adds a refund instead of restoring rows is verified by its check, and the
    record says the undo was semantic."""
    journal = Journal()
    charge = journal_charge(journal)
    with hx.Episode(state=journal.state, store=store, clock=FakeClock()) as ep:
        charge("r1", 30)
        ep.rollback()
    assert ep.outcome == "rolled_back" and journal.net() == 0
    assert len(journal.state) == 3  # the charge and its refund both stay in the journal
    (rec,) = [r for r in store.log(ep.id) if r.kind == "compensated"]
    assert '"semantic":true' in rec.payload
    assert store.verify_chain().ok


def test_a_reversing_entry_whose_check_fails_escalates(store: hx.Store):
    """A refund that does not make the net change zero is a failed compensation: escalated."""
    journal = Journal()
    charge = journal_charge(journal, refund_works=False)
    with hx.Episode(state=journal.state, store=store, clock=FakeClock()) as ep:
        charge("r1", 30)
        with pytest.raises(hx.Escalated, match="net_zero"):
            ep.rollback()
    assert ep.outcome == "escalated"
    (esc,) = escalations(store, ep)
    assert esc.failure_class == "compensation"


# --- misuse is refused at once ---


def test_a_plain_dict_as_state_is_refused_with_the_fix(store: hx.Store):
    """Episode(state={...}) is refused at construction, saying to wrap it in hx.DictState."""
    with pytest.raises(hx.ConfigurationError, match=r"hx.DictState\(\.\.\.\)"):
        hx.Episode(state={"acct/a": {"balance": 0}}, store=store)


def test_a_locked_store_at_a_refusal_is_a_store_error_and_the_writer_recovers(
    store: hx.Store, store_url: str
):
    """A refusal the locked store cannot take is a StoreError; once the lock is gone, the
    episode's next writes commit as usual (the failed batch left nothing half open)."""
    ledger = Ledger("a")
    deposit = keyed_deposit(ledger)

    @deposit.precondition
    def not_b(ctx: hx.Context) -> bool:
        return bool(ctx.args.name != "b")

    path = store_url.removeprefix("sqlite:///")
    with episode(ledger, store) as ep:
        ep._writer.conn.execute("PRAGMA busy_timeout=50")
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(hx.StoreError, match="could not be written"):
            deposit("b")
        blocker.execute("ROLLBACK")
        blocker.close()
        deposit("a")
    assert ep.outcome == "committed" and ledger.applied == 1
    rows = hx.Store(store_url).transactions(ep.id)
    assert [t.status for t in rows] == ["failed", "committed"]  # the refused one is in the log
    assert "did not run" in (rows[0].reason or "")
    assert hx.Store(store_url).verify_chain().ok


def test_a_keyed_call_that_raises_after_its_effect_without_postconditions_escalates(
    store: hx.Store,
):
    """With no postcondition to prove the effect complete and no compensation, the change of
    a call that raised is left for a person: escalated, never retried."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        raise hx.TransientError("connection reset after the write")

    with episode(ledger, store) as ep:
        with pytest.raises(hx.Escalated, match="still in the state"):
            deposit("a")
    assert ledger.applied == 1 and ep.outcome == "escalated"


async def test_an_async_call_past_its_timeout_with_a_change_and_no_compensation_escalates(
    store: hx.Store,
):
    """A timed-out async call whose change stays (no compensation) escalates, never retried."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name, timeout=0.05)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)
        await asyncio.sleep(5)

    async with episode(ledger, store) as ep:
        with pytest.raises(hx.Escalated):
            await deposit("a")
    assert ledger.applied == 1 and ep.outcome == "escalated"


def test_a_tool_changing_a_dict_state_copy_in_place_is_caught(store: hx.Store):
    """A tool that changes a DictState value in its scope in place and never writes it back does
    not pass as a call with no effect: it fails, naming the key and the fix; a read-only tool
    editing its copy to build a reply is no error."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.state[f"acct/{name}"]["balance"] += 10  # a copy: the state does not change

    @hx.action
    def statement(name: str) -> dict[str, Any]:
        acct = ledger.state[f"acct/{name}"]
        acct.pop("balance")  # redacts its own copy: fine
        return acct

    with episode(ledger, store) as ep:
        with pytest.raises(hx.ActionFailed, match=r"acct/a in place.*write it back") as info:
            deposit("a")
        assert statement("a") == {}
    assert info.value.failure_class == "fail_stop"
    assert ledger.balance("a") == 0 and ep.outcome == "committed"


def test_a_sync_action_called_from_a_coroutine_during_an_async_call_is_refused(
    store: hx.Store,
):
    """A sync action called on the event loop while another call of the episode runs on that
    loop is refused with the fix, instead of blocking the loop for good."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def slow_deposit(name: str) -> None:
        await asyncio.sleep(0.05)
        ledger.add(name, 1)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 1)

    outcome: dict[str, Any] = {}

    async def agent() -> None:
        async def sync_call() -> None:
            await asyncio.sleep(0.01)  # the async call holds the gate by now
            deposit("b")

        async with episode(ledger, store):
            results = await asyncio.gather(slow_deposit("a"), sync_call(), return_exceptions=True)
        outcome["results"] = results

    # On its own thread and loop, so a regression shows as a timeout, not a hung suite.
    worker = threading.Thread(target=asyncio.run, args=(agent(),), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the event loop blocked"
    first, second = outcome["results"]
    assert first is None and isinstance(second, hx.ConfigurationError)
    assert "asyncio.to_thread" in str(second) and ledger.balance("b") == 0


def test_a_rollback_settles_a_call_in_doubt_before_it_says_rolled_back(store: hx.Store):
    """A call the store left in doubt is settled by a rollback (found, committed, compensated),
    so rolled_back covers its effect too."""
    ledger = Ledger("a", "b")
    deposit = keyed_deposit(ledger)
    with episode(ledger, store) as ep:
        deposit("b")
        _fail_kind(ep, "committed")
        with pytest.raises(hx.StoreError, match="in doubt"):
            deposit("a")
        ep.rollback()
    assert ep.outcome == "rolled_back"
    assert ledger.balance("a") == 0 and ledger.balance("b") == 0
    assert [t.status for t in store.transactions(ep.id)] == ["compensated", "compensated"]


def test_a_read_whose_outcome_the_store_refuses_is_still_in_the_log(store: hx.Store):
    """A read-only call whose outcome record is refused raises StoreError and is recorded as
    failed with the episode's next write: every call is in the log."""
    ledger = Ledger("a")

    @hx.action
    def balance(name: str) -> int:
        return ledger.balance(name)

    with episode(ledger, store) as ep:
        _fail_kind(ep, "committed")
        with pytest.raises(hx.StoreError, match="recorded as failed"):
            balance("a")
    assert ep.outcome == "committed"
    (txn,) = store.transactions(ep.id)
    assert txn.action == "balance" and txn.status == "failed"
    assert "did not reach the agent" in (txn.reason or "")
    assert store.verify_chain().ok


async def test_an_async_call_left_in_doubt_is_settled_at_the_end(store: hx.Store):
    """An async call whose outcome the store refused, as the episode's last call, is settled
    when the episode ends (async with): found present, committed as recovered."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)

    @deposit.postcondition
    async def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    async with episode(ledger, store) as ep:
        _fail_kind(ep, "committed")
        with pytest.raises(hx.StoreError, match="in doubt"):
            await deposit("a")
    assert ep.outcome == "committed" and ledger.applied == 1
    assert [t.status for t in store.transactions(ep.id)] == ["recovered"]


def test_a_refused_intent_then_a_crash_resumes_without_diverging(store: hx.Store, store_url: str):
    """A call whose intent the store refused is in the record (failed, nothing ran), so the
    agent resumed after a crash is held to a record that has it, and finishes."""
    ledger = Ledger("a", "b")
    dies = {"b"}

    class Crash(BaseException):
        pass

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        if name in dies:
            dies.discard(name)
            raise Crash

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    def agent(ep: hx.Episode, *, fail: bool) -> None:
        if fail:
            _fail_kind(ep, "intent")
        with pytest.raises((hx.StoreError, hx.ActionFailed)):
            deposit("a")  # refused by the store: did not run
        deposit("b")

    ep = episode(ledger, store, episode_id="e1")
    with pytest.raises(Crash):
        with ep:
            agent(ep, fail=True)
    with episode(
        ledger, hx.Store(store_url), episode_id="e1", resume=True, actions=[deposit]
    ) as again:
        agent(again, fail=False)
    assert again.outcome == "committed"
    assert ledger.balance("a") == 0 and ledger.balance("b") == 10 and ledger.applied == 1
    assert [t.status for t in store.transactions("e1")] == ["failed", "recovered"]


# --- cancelled, nested, in flight at the end ---


async def test_a_cancelled_async_call_is_in_doubt_and_never_lands_twice(store: hx.Store):
    """A call cancelled by its caller after its effect is in doubt: the same keyed call made
    again is settled against the state first, never applied a second time."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)
        await asyncio.sleep(0.2)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    async with episode(ledger, store) as ep:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(deposit("a"), 0.05)
        assert ep.in_doubt == ["deposit:a"]
        await deposit("a")  # found applied: committed as recovered, not run again
    assert ep.outcome == "committed" and ledger.applied == 1
    assert [t.status for t in store.transactions(ep.id)] == ["recovered"]


async def test_a_cancelled_call_then_rollback_is_truly_rolled_back(store: hx.Store):
    """A rollback after a cancelled compensable call undoes its effect too: the call is found
    applied (recovered), then compensated."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def slow_deposit(name: str) -> None:
        ledger.add(name, 10)
        await asyncio.sleep(0.2)

    @slow_deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    slow_deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    async with episode(ledger, store) as ep:
        task = asyncio.ensure_future(slow_deposit("a"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await ep.arollback()
    assert ep.outcome == "rolled_back" and ledger.balance("a") == 0
    assert [t.status for t in store.transactions(ep.id)] == ["compensated"]


def test_an_action_called_inside_a_tool_is_part_of_that_call(store: hx.Store, store_url: str):
    """An action called from a running tool is a plain function within that call: undone by
    its compensation, not a step of its own, so resume replays the agent without diverging."""
    ledger = Ledger("a", "b")
    calls = {"n": 0}

    @hx.action(writes=["acct/b"], idempotency_key=lambda a: f"fee:{a.ref}")
    def fee(ref: str) -> None:
        ledger.add("b", 1)

    @hx.action(writes=["acct/{name}", "acct/b"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        calls["n"] += 1
        ledger.add(name, 10 if calls["n"] > 1 else 7)  # a wrong amount first
        fee(name)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        key = f"acct/{ctx.args.name}"
        return bool(ctx.after[key]["balance"] - ctx.before[key]["balance"] == 10)

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    with episode(ledger, store, episode_id="e1") as ep:
        deposit("a")
    assert ep.outcome == "committed"
    assert ledger.balance("a") == 10 and ledger.balance("b") == 1  # the first fee was undone
    assert [t.action for t in store.transactions("e1")] == ["deposit"]
    with episode(ledger, hx.Store(store_url), episode_id="e1", resume=True) as again:
        deposit("a")
        fee("z")  # a call of the agent's own: a transaction
    assert again.outcome == "committed" and ledger.balance("b") == 2


async def test_a_background_task_calling_an_action_later_waits_its_turn(store: hx.Store):
    """A task a tool started, calling an action after the tool returned, is a call of its own:
    it waits for the gate and is attributed its own change."""
    ledger = Ledger("a", "b", "audit")
    later: list[asyncio.Task[None]] = []

    @hx.action(writes=["acct/audit"], idempotency_key=lambda a: a.ref)
    async def audit(ref: str) -> None:
        ledger.add("audit", 1)

    async def audit_later(ref: str) -> None:
        await asyncio.sleep(0.02)
        await audit(ref)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)
        if name == "a":
            later.append(asyncio.ensure_future(audit_later(name)))
        else:
            await asyncio.sleep(0.05)  # the audit task wants the gate meanwhile

    async with episode(ledger, store) as ep:
        await deposit("a")
        await deposit("b")
        await later[0]
    assert ep.outcome == "committed"
    rows = {t.action: t for t in store.transactions(ep.id) if t.action != "deposit"}
    assert rows["audit"].status == "committed" and ledger.balance("audit") == 1


def test_the_end_of_an_episode_waits_for_a_call_in_flight_in_a_thread(store: hx.Store):
    """Leaving `with` while a thread's call runs waits for it: its outcome is recorded before
    the episode's end."""
    ledger = Ledger("a")
    started = threading.Event()

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        started.set()
        threading.Event().wait(0.2)
        ledger.add(name, 10)

    errors: list[BaseException] = []

    def work() -> None:
        try:
            deposit("a")
        except BaseException as exc:  # pragma: no cover - the failure this test looks for
            errors.append(exc)

    with episode(ledger, store) as ep:
        thread = threading.Thread(target=contextvars.copy_context().run, args=(work,))
        thread.start()
        started.wait(5)
    thread.join(5)
    assert errors == [] and ep.outcome == "committed"
    assert [t.status for t in store.transactions(ep.id)] == ["committed"]
    kinds = [r.kind for r in store.log(ep.id)]
    assert kinds.index("committed") < kinds.index("end")


def test_an_in_doubt_call_held_on_resume_keeps_the_episode_escalated(
    store: hx.Store, store_url: str
):
    """Resumed, a call in doubt that needs a person leaves the episode escalated even when the
    agent never calls it again."""
    ledger = Ledger("a")

    class Crash(BaseException):
        pass

    @hx.action(writes=["acct/{name}"])
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        raise Crash

    with pytest.raises(Crash):
        with episode(ledger, store, episode_id="e1"):
            deposit("a")
    with episode(
        ledger, hx.Store(store_url), episode_id="e1", resume=True, actions=[deposit]
    ) as again:
        pass  # the agent ends without calling deposit again
    assert again.outcome == "escalated"
    assert [e.status for e in escalations(store, again)] == ["pending"]


def test_an_async_call_in_doubt_under_a_sync_with_is_settled_at_the_end(store: hx.Store):
    """An async call the store left in doubt, in an episode entered with a sync `with`, is
    settled when the episode ends (on a loop of its own)."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    async def agent() -> None:
        with pytest.raises(hx.StoreError):
            await deposit("a")

    with episode(ledger, store) as ep:
        _fail_kind(ep, "committed")
        asyncio.run(agent())
    assert ep.outcome == "committed" and ledger.applied == 1
    assert [t.status for t in store.transactions(ep.id)] == ["recovered"]


def test_a_refund_cut_short_by_a_crash_is_not_posted_twice_on_resume(
    store: hx.Store, store_url: str
):
    """A reversing entry that landed just before the process died is found by the compensation
    check on resume: the refund is not posted a second time."""
    state = hx.DictState({"ledger/x": []})

    class Crash(BaseException):
        pass

    dies = [True]

    @hx.action(writes=["ledger/{acct}"], idempotency_key=lambda a: a.acct)
    def charge(acct: str, amount: int) -> None:
        state[f"ledger/{acct}"] = [*state[f"ledger/{acct}"], amount]
        raise ConnectionError("receipt service down")  # fails after posting

    @charge.compensation
    def refund(ctx: hx.Context) -> None:
        key = f"ledger/{ctx.args.acct}"
        state[key] = [*state[key], -ctx.args.amount]
        if dies[0]:
            dies[0] = False
            raise Crash  # the refund landed, then the process died

    @charge.compensation_check
    def net_zero(ctx: hx.Context) -> bool:
        key = f"ledger/{ctx.args.acct}"
        return sum(ctx.state.get(key)) == sum(ctx.before[key])

    with pytest.raises(Crash):
        with hx.Episode(state=state, store=store, clock=FakeClock(), episode_id="e1"):
            charge("x", 30)
    assert state["ledger/x"] == [30, -30]
    with hx.Episode(
        state=state,
        store=hx.Store(store_url),
        clock=FakeClock(),
        episode_id="e1",
        resume=True,
        actions=[charge],
    ):
        pass
    assert state["ledger/x"] == [30, -30]  # no second refund


def test_a_tool_that_changes_its_own_argument_still_dedups_an_identical_call(store: hx.Store):
    """Keys are compared with the arguments as recorded before the tool ran: a tool sorting its
    list argument in place does not turn an identical repeat into a conflict."""
    state = hx.DictState({"cart/c1": []})

    @hx.action(writes=["cart/{cart}"], idempotency_key=lambda a: a.cart)
    def set_items(cart: str, items: list[str]) -> int:
        items.sort()
        state[f"cart/{cart}"] = items
        return len(items)

    with hx.Episode(state=state, store=store, clock=FakeClock()) as ep:
        assert set_items("c1", ["b", "a"]) == 2
        assert set_items("c1", ["b", "a"]) == 2  # the same call: answered from the record
        with pytest.raises(hx.IdempotencyConflict):
            set_items("c1", ["c"])
    assert ep.outcome == "committed" and state["cart/c1"] == ["a", "b"]


def test_a_writes_function_that_raises_or_returns_a_string_is_refused_and_recorded(
    store: hx.Store,
):
    """A writes function that raises, or returns a string instead of a list, is a recorded
    ConfigurationError before anything runs; hx.escape_glob keeps its values literal."""
    ledger = Ledger("a")

    @hx.action(writes=lambda a: a.nope)
    def broken(name: str) -> None:
        ledger.add(name, 1)

    @hx.action(writes=lambda a: f"acct/{a.name}")
    def stringy(name: str) -> None:
        ledger.add(name, 1)

    @hx.action(writes=lambda a: [f"acct/{hx.escape_glob(a.name)}"])
    def literal(name: str) -> None:
        ledger.add("a", 1)

    with episode(ledger, store) as ep:
        with pytest.raises(hx.ConfigurationError, match="writes function of action 'broken'"):
            broken("a")
        with pytest.raises(hx.ConfigurationError, match="must return a list"):
            stringy("a")
        with pytest.raises(hx.Escalated, match="acct/a"):
            literal("*")  # "*" is the resource named "*": acct/a is outside
    assert [t.status for t in store.transactions(ep.id)][:2] == ["invalid", "invalid"]


def test_approving_a_precondition_escalation_does_not_skip_the_approval_rule(
    store: hx.Store, store_url: str
):
    """A call approved after its precondition escalated is still held by its approval rule:
    only an answer to an approval request lets it run."""
    ledger = Ledger("a")
    deposit = _big_deposit(ledger, approval=over_1000)
    gate = {"open": False}

    @deposit.precondition
    def opened(ctx: hx.Context) -> bool:
        return gate["open"]

    policy = hx.Policy(decisions={"precondition": "escalate"})
    with pytest.raises(hx.Escalated) as first:
        with episode(ledger, store, policy=policy, episode_id="e1"):
            deposit("a", 5000)
    assert first.value.failure_class == "precondition"
    store.resolve(first.value.escalation_id, "approve", by="ops")
    gate["open"] = True
    with pytest.raises(hx.Escalated) as second:
        with episode(ledger, hx.Store(store_url), policy=policy, episode_id="e1", resume=True):
            deposit("a", 5000)
    assert second.value.failure_class == "approval" and ledger.applied == 0
    store.resolve(second.value.escalation_id, "approve", by="ops")
    with episode(ledger, hx.Store(store_url), policy=policy, episode_id="e1", resume=True) as ep:
        deposit("a", 5000)
    assert ep.outcome == "committed" and ledger.applied == 1


# --- second look: the fixes attacked ---


async def test_a_sync_call_after_an_async_call_in_doubt_is_refused_until_it_is_settled(
    store: hx.Store,
):
    """A sync call cannot settle an async call in doubt: it is refused (nothing runs) until an
    async call or asettle() settles it, so no later change is ever undone by a stale probe."""
    ledger = Ledger("a")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)
        await asyncio.sleep(1)

    @deposit.postcondition
    def added(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"acct/{ctx.args.name}"]["balance"] == 10)

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: f"bonus:{a.name}")
    def bonus(name: str) -> None:
        ledger.add(name, 5)

    async with episode(ledger, store) as ep:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(deposit("a"), 0.05)
        with pytest.raises(hx.ConfigurationError, match="asettle"):
            bonus("a")
        await ep.asettle()
        bonus("a")
    assert ep.outcome == "committed" and ledger.balance("a") == 15
    # The refusal is in the log too: a resumed agent is held to it.
    assert [t.status for t in store.transactions(ep.id)] == ["recovered", "invalid", "committed"]


async def test_a_cancelled_glob_scoped_call_is_found_by_what_its_window_saw(store: hx.Store):
    """A keyed call with a glob scope, cancelled after its effect, is settled with what its
    change window saw: retried, it does not land twice."""
    state = hx.DictState({})
    n = {"i": 0}

    @hx.action(writes=["ledger/*"], idempotency_key=lambda a: a.req)
    async def post(req: str, amount: int) -> None:
        n["i"] += 1
        state[f"ledger/{n['i']}"] = amount
        await asyncio.sleep(1)

    async with hx.Episode(state=state, store=store, clock=FakeClock()) as ep:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(post("r1", 10), 0.05)
        with pytest.raises(hx.Escalated, match="ledger/1"):
            await post("r1", 10)  # its change is found: no compensation, so a person decides
    assert state.to_dict() == {"ledger/1": 10} and ep.outcome == "escalated"


async def test_a_task_left_behind_by_a_tool_waits_even_while_the_call_checks(store: hx.Store):
    """A task a tool started that calls an action while that call is still in its checks is
    a call of its own (recorded, keyed, scoped), not part of the finished tool."""
    ledger = Ledger("a", "audit")

    @hx.action(writes=["acct/audit"], idempotency_key=lambda a: a.ref)
    async def audit(ref: str) -> None:
        ledger.add("audit", 1)

    async def later() -> None:
        await asyncio.sleep(0.01)
        await audit("r")

    tasks: list[asyncio.Task[None]] = []

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    async def deposit(name: str) -> None:
        ledger.add(name, 10)
        tasks.append(asyncio.get_running_loop().create_task(later()))

    @deposit.postcondition
    async def landed(ctx: hx.Context) -> bool:
        await asyncio.sleep(0.05)  # the task calls audit meanwhile
        return True

    async with episode(ledger, store) as ep:
        await deposit("a")
        await tasks[0]
    assert ep.outcome == "committed" and ledger.balance("audit") == 1
    assert sorted(t.action for t in store.transactions(ep.id)) == ["audit", "deposit"]


def test_a_nested_call_is_validated_checked_and_never_skips_an_approval(store: hx.Store):
    """An action called inside a tool has its arguments validated and its preconditions
    checked; one that may need approval is refused there; an async one from a sync tool too."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/*"], approval=True)
    def transfer(amount: int) -> None:
        ledger.add("b", amount)

    @hx.action(writes=["acct/b"])
    def fee(amount: int) -> None:
        ledger.add("b", amount)

    @fee.precondition
    def small(ctx: hx.Context) -> bool:
        return bool(ctx.args.amount < 5)

    @hx.action(writes=["acct/b"])
    async def afee() -> None:
        ledger.add("b", 1)

    seen: list[str] = []

    @hx.action(writes=["acct/*"], idempotency_key=lambda a: a.what)
    def settle(what: str) -> None:
        try:
            {"approval": lambda: transfer(1000), "pre": lambda: fee(9),
             "args": lambda: fee("x"), "async": lambda: afee()}[what]()  # fmt: skip
        except hx.HarnessError as exc:
            seen.append(type(exc).__name__)

    with episode(ledger, store) as ep:
        for what in ("approval", "pre", "args", "async"):
            settle(what)
    assert seen == [
        "ConfigurationError",
        "PreconditionFailed",
        "InvalidArguments",
        "ConfigurationError",
    ]
    assert ledger.balance("b") == 0 and ep.outcome == "committed"


async def test_a_rollback_cut_short_is_finished_not_repeated(store: hx.Store):
    """A rollback whose task is cancelled mid-compensation is finished at the episode's end, and
    its reversing entry is not posted twice."""
    state = hx.DictState({"ledger/x": []})

    @hx.action(writes=["ledger/{acct}"], idempotency_key=lambda a: a.acct)
    async def charge(acct: str, amount: int) -> None:
        state[f"ledger/{acct}"] = [*state[f"ledger/{acct}"], amount]

    @charge.compensation
    async def refund(ctx: hx.Context) -> None:
        key = f"ledger/{ctx.args.acct}"
        state[key] = [*state[key], -ctx.args.amount]
        await asyncio.sleep(0.2)

    @charge.compensation_check
    def net_zero(ctx: hx.Context) -> bool:
        return sum(ctx.state.get(f"ledger/{ctx.args.acct}")) == 0

    async with hx.Episode(state=state, store=store, clock=FakeClock()) as ep:
        await charge("x", 10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ep.arollback(), 0.05)
    assert ep.outcome == "rolled_back" and state["ledger/x"] == [10, -10]


def test_a_compensation_that_writes_elsewhere_fails_instead_of_rolling_back(store: hx.Store):
    """A compensation that changes what the action had not changed is a failed compensation:
    escalated, not called rolled back."""
    ledger = Ledger("a", "fees")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)

    @deposit.compensation
    def undo(ctx: hx.Context) -> None:
        for key, value in ctx.before.items():
            ledger.state[key] = value
        ledger.add("fees", 1)

    with episode(ledger, store) as ep:
        deposit("a")
        with pytest.raises(hx.Escalated, match="acct/fees, which the action had not changed"):
            ep.rollback()
    assert ep.outcome == "escalated"


def test_rollback_from_inside_a_tool_is_refused(store: hx.Store):
    """rollback() called by a running tool is refused with the fix; nothing is undone mid-call."""
    ledger = Ledger("a", "b")

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> None:
        ledger.add(name, 10)
        if name == "b":
            hx.current_episode().rollback()  # type: ignore[union-attr]

    deposit.compensation(lambda ctx: restore_before(ledger.state, ctx))

    with episode(ledger, store) as ep:
        deposit("a")
        with pytest.raises(hx.ActionFailed, match="inside the tool"):
            deposit("b")
    assert ledger.balance("a") == 10 and ledger.balance("b") == 0 and ep.outcome == "committed"


def test_a_result_the_agent_changes_does_not_change_the_record(store: hx.Store):
    """Each answer is a fresh copy of the recorded result: the agent changing one changes
    neither a repeat's answer nor what a compensation sees."""
    ledger = Ledger("a")
    seen: list[Any] = []

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def deposit(name: str) -> dict[str, Any]:
        ledger.add(name, 10)
        return {"name": name, "receipt": "r1"}

    @deposit.compensation
    def undo(ctx: hx.Context) -> None:
        seen.append(ctx.result)
        for key, value in ctx.before.items():
            ledger.state[key] = value

    with episode(ledger, store) as ep:
        deposit("a").pop("receipt")
        assert deposit("a") == {"name": "a", "receipt": "r1"}
        ep.rollback()
    assert seen == [{"name": "a", "receipt": "r1"}] and ep.outcome == "rolled_back"


def test_a_state_value_json_cannot_hold_is_refused_before_the_tool_runs(store: hx.Store):
    """A resource that is not a JSON value cannot be recorded: the call is refused before its
    tool runs, and is in the log."""
    state = hx.DictState({"acct/a": Decimal("0")})

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.name)
    def pay(name: str) -> None:
        state[f"acct/{name}"] += 1

    with hx.Episode(state=state, store=store, clock=FakeClock()) as ep:
        with pytest.raises(hx.ConfigurationError, match="cannot be recorded as JSON"):
            pay("a")
    assert state["acct/a"] == Decimal("0")
    assert [t.status for t in store.transactions(ep.id)] == ["failed"]


async def test_a_cancelled_read_is_in_the_log(store: hx.Store):
    """A read-only call cancelled by its caller is recorded (as failed, cut short): every call
    is in the log."""
    ledger = Ledger("a")

    @hx.action
    async def balance(name: str) -> int:
        value = ledger.balance(name)
        await asyncio.sleep(1)
        return value

    async with episode(ledger, store) as ep:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(balance("a"), 0.05)
    (txn,) = store.transactions(ep.id)
    assert txn.action == "balance" and txn.status == "failed" and "cut short" in (txn.reason or "")
