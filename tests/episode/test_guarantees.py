"""The promise, model-checked: every kind of action, every way a call goes wrong, one true outcome.

A hypothesis state machine runs episodes of random calls against a small world (a ledger of
accounts on a ``DictState``) and checks, after each episode, what DESIGN.md's "The promise, in
one table" says must hold:

- the episode ends ``committed``, ``rolled_back`` or ``escalated``, and that outcome is true:
  ``committed``: the state is the start state plus exactly the effects of the calls that returned
  a result, each once (so their postconditions hold on the observed state, and nothing a failed
  call did is left behind); ``rolled_back``: the state is the start state; ``escalated``: an
  escalation row exists, and whatever the store's records do not explain is in an escalation's
  evidence with its value as left in the world;
- no effect is ever applied twice (the tool sees its own earlier application still in the state);
- every call is in the store (a transaction row, an intent, or a dedup record), and no intent
  is left without an outcome unless an escalation holds it;
- the hash chain verifies;
- calls behave as declared: a call without a fault returns, a false precondition runs nothing, and
  everything a call raises is a ``HarnessError`` (a call its caller cancelled raises what the
  caller's cancellation raises); a sync call is refused (``ConfigurationError``, nothing runs)
  only while an async call is in doubt;
- a nested call is part of its call: the fee a deposit's tool calls is validated and its
  precondition checked (a refused one runs nothing), then runs within the deposit (its change is
  the deposit's, in the state model, undone by the deposit's compensation), and is never a
  transaction or a log record of its own.

The world: accounts ``acct/<name> -> {"balance": int, "ops": [op ids]}``. A deposit adds
``AMOUNT`` and appends its op id, so the state itself is the ledger of applied effects: an op id
present twice is a doubled effect, one that should be absent is a leftover. Op ids are unique per
call (a "repeat" step calls an earlier op again with the same arguments, to exercise dedup).
A deposit's tool may call the ``fee`` action inside itself on the same account (within its
``writes``): the fee takes ``FEE`` and appends ``fee:<op>``, so it is part of the deposit's
effect; or it calls it with a false precondition, or with an argument of the wrong type, and
carries on without it.

Actions, each sync and async: ``read`` (no ``writes``: returns a balance), ``keyed``
(``idempotency_key=``), ``comp`` (``@compensation``), ``keyed_comp`` (both), ``plain`` (mutating,
neither). Faults, one per call (on its first attempt, or on every attempt when ``persist``):

=================== ======================================================================
none                works
precondition_false  its precondition is false: nothing may run
raise_before        raises ValueError before the effect (a permanent fail-stop)
transient_before    raises TransientError before the effect (retried)
raise_after         applies the effect, then raises TransientError (a lost acknowledgement)
slow                applies the effect, then takes longer than its timeout (fake clock)
slow_real           async: applies the effect, then hangs past its timeout (asyncio.wait_for)
silent_none         returns a success claim without any effect (postcondition false)
silent_wrong        applies a wrong amount and returns (postcondition false, state changed)
out_of_scope        applies the effect and also writes ``stray/<op>``, outside its ``writes``
store_intent        the store's write of the call's intent record raises (one shot)
store_commit        the store's write of the call's outcome record raises (one shot)
crash_before        the process dies in the tool before the effect (one shot, then resume)
crash_after         the process dies in the tool after the effect (one shot, then resume)
cut_wait_for        async: applies the effect, then hangs; its caller's ``asyncio.wait_for``
                    (``CUT``, shorter than the tool's timeout) cancels it (one shot)
cut_cancel          async: applies the effect, then hangs; its caller cancels its task
cut_before          async: hangs before its effect; its caller cancels its task
=================== ======================================================================

A cancelled call is in doubt: it must be settled against the state before the episode's next
call (or at its end, or by ``asettle()``), so the model counts it like a call the store left in
doubt (its effect is expected exactly when the log commits it). After a cancelled call the agent
goes on with random steps, or with one drawn for it (:func:`cut_and_after`): the same call again,
a sync call (which may be refused while the cancelled call is in doubt), ``await
ep.asettle()`` then a sync call, another async call, or the end of the episode.

A compensation may be ``ok``, ``raises`` (RuntimeError), ``no_restore`` (returns, does
nothing) or ``crash`` (the process dies in it, once). An episode may also be killed in one of
its calls (``kill``: before or after the effect, on top of that call's own fault). A crash is a
``BaseException`` raised in a tool or compensation: the episode is either abandoned without
exiting it (``abandon``) or unwound through its ``with`` (``unwind``), then reopened with
``resume=True`` on the same store and state, and the same deterministic agent re-runs from its
first call. Async episodes may ``asyncio.gather`` two calls on different accounts and may call
``await ep.asettle()`` as a step; an episode may end with an explicit rollback; its policy is
the default one or maps ``fail_stop`` to ``rollback``.

Runs derandomized with no example database (the same examples every run); the clock is a
``FakeClock``, so retries take no time; each example gets a fresh SQLite store. Hypothesis does
not shrink (an example is tens of milliseconds of SQLite work, and shrinking took minutes):
a failure's message gives the failing episode's plan and the simplest plan found that violates
the same invariant on a fresh world (:func:`minimal`), which is the reproduction to start from.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import json
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import threading
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import harness as hx
import harness.transaction as hx_transaction
from harness.testing import FakeClock

from ..conftest import restore_before

AMOUNT = 10
ACCOUNTS = ("a", "b", "c")
TIMEOUT = 0.05  # seconds per attempt of an async tool (real for asyncio, and on the fake clock)
SLOW = 1.0  # what a "slow" tool adds to the fake clock
HANG = 30.0  # what a "slow_real" or cut tool would sleep (cancelled at TIMEOUT, or by its caller)
CUT = (
    0.02  # seconds: the caller's own ``asyncio.wait_for`` around a "cut_wait_for" call (< TIMEOUT)
)
FEE = 1  # what a nested fee takes from the account

KINDS = ("keyed", "keyed_comp", "comp", "plain", "read")
MUTATING = frozenset({"keyed", "keyed_comp", "comp", "plain"})
COMPENSABLE = frozenset({"keyed_comp", "comp"})
FAULTS = (
    "none",
    "precondition_false",
    "raise_before",
    "transient_before",
    "raise_after",
    "slow",
    "slow_real",
    "silent_none",
    "silent_wrong",
    "out_of_scope",
    "store_intent",
    "store_commit",
    "crash_before",
    "crash_after",
    "cut_wait_for",
    "cut_cancel",
    "cut_before",
)
ONE_SHOT = frozenset({"store_intent", "store_commit", "crash_before", "crash_after"})
# Only an async tool can have a timeout (a sync call cannot be interrupted).
SLOW_FAULTS = frozenset({"slow", "slow_real"})
# The caller cancels the call: only an async call can be cancelled.
CUT_FAULTS = frozenset({"cut_wait_for", "cut_cancel", "cut_before"})
ASYNC_ONLY = SLOW_FAULTS | CUT_FAULTS
# Faults two overlapping calls may have (crashes and store faults need one call at a time, and
# the agent cancels only a call it made alone).
GATHER_FAULTS = tuple(f for f in FAULTS if f not in ONE_SHOT | CUT_FAULTS)
# What a deposit's tool calls inside itself: nothing, a fee (an action of its own, on the same
# account, so within the deposit's ``writes``), a fee whose precondition is false, or a fee
# with an argument of the wrong type.
NESTED = ("none", "fee", "fee_refused", "fee_invalid")
COMP_FAULTS = ("ok", "raises", "no_restore", "crash")
RETRY = hx.Retry(attempts=3, backoff=0.5, jitter=False)
POLICIES = {
    "default": hx.Policy(retry=RETRY),
    "fail_stop_rollback": hx.Policy(retry=RETRY, decisions={"fail_stop": "rollback"}),
}


class Crash(BaseException):
    """Stands for the process dying in the middle of a call."""


# --------------------------------------------------------------------------------------------
# Plans: what hypothesis draws.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One call: which action, on which account, and how it goes wrong."""

    kind: str
    is_async: bool
    account: str
    fault: str = "none"
    persist: bool = False
    comp_fault: str = "ok"
    nested: str = "none"


@dataclass(frozen=True)
class Repeat:
    """Call an earlier op of the episode again, with the same arguments and no fault (the
    ``index``-th single call, modulo their number: ``-1`` is the latest)."""

    index: int


@dataclass(frozen=True)
class Gather:
    """Two async calls on different accounts, overlapping (``asyncio.gather``)."""

    first: Call
    second: Call


@dataclass(frozen=True)
class Settle:
    """``await episode.asettle()``: settle the calls left in doubt now (async episodes)."""


Step = Call | Repeat | Gather | Settle


@dataclass(frozen=True)
class EpisodePlan:
    """One episode: sync or async, its steps, its policy, how a crash unwinds, a final rollback,
    and ``kill``: the process dies in the call of single-call step ``kill[0]`` (modulo their
    number), ``before`` or ``after`` its effect, on top of whatever that call's fault is."""

    is_async: bool
    steps: tuple[Step, ...]
    policy: str = "default"
    crash_style: str = "abandon"
    final_rollback: bool = False
    kill: tuple[int, str] | None = None


@st.composite
def calls(draw: Any, *, is_async: bool) -> Call:
    """A call of any kind (async ones only in async episodes) with any fault its tool can have."""
    tool_async = draw(st.booleans()) if is_async else False
    allowed = tuple(f for f in FAULTS if tool_async or f not in ASYNC_ONLY)
    faults = st.sampled_from(allowed)
    if tool_async:  # the last of a long list: drawn on their own too, or hardly ever
        faults = st.one_of(faults, st.sampled_from(sorted(CUT_FAULTS)))
    kind = draw(st.sampled_from(KINDS))
    return Call(
        kind=kind,
        is_async=tool_async,
        account=draw(st.sampled_from(ACCOUNTS)),
        fault=draw(faults),
        persist=draw(st.booleans()),
        comp_fault=draw(st.sampled_from(COMP_FAULTS)),
        nested=draw(st.sampled_from(NESTED)) if kind in MUTATING else "none",
    )


def _replace(obj: Any, **changes: Any) -> Any:
    return type(obj)(**{**obj.__dict__, **changes})


def _apart(pair: tuple[Call, Call]) -> Gather:
    first, second = pair
    if second.account == first.account:
        other = ACCOUNTS[(ACCOUNTS.index(first.account) + 1) % len(ACCOUNTS)]
        second = _replace(second, account=other)
    return Gather(first, second)


def _no_fee_on_a_read(call: Call) -> Call:
    return call if call.kind in MUTATING else _replace(call, nested="none")


def _overlapping() -> st.SearchStrategy[Gather]:
    one = st.builds(
        Call,
        kind=st.sampled_from(KINDS),
        is_async=st.just(True),
        account=st.sampled_from(ACCOUNTS),
        fault=st.sampled_from(GATHER_FAULTS),
        persist=st.booleans(),
        comp_fault=st.sampled_from(tuple(c for c in COMP_FAULTS if c != "crash")),
        nested=st.sampled_from(NESTED),
    ).map(_no_fee_on_a_read)
    return st.tuples(one, one).map(_apart)


AFTER_CUT = ("repeat", "sync", "settle_then_sync", "other", "end")


@st.composite
def cut_and_after(draw: Any) -> tuple[Step, ...]:
    """An async call its caller cancels, then what the agent does next: the same call again,
    a sync call (refused while the cancelled call is in doubt), ``asettle()`` then a sync call,
    another async call, or nothing (the episode ends)."""
    cut = _replace(
        draw(calls(is_async=True)),
        is_async=True,
        fault=draw(st.sampled_from(sorted(CUT_FAULTS))),
    )
    other = ACCOUNTS[(ACCOUNTS.index(cut.account) + 1) % len(ACCOUNTS)]
    plain = Call(draw(st.sampled_from(KINDS)), False, draw(st.sampled_from(ACCOUNTS)))
    then = {
        "repeat": (Repeat(-1),),
        "sync": (plain,),
        "settle_then_sync": (Settle(), plain),
        "other": (_replace(plain, is_async=True, account=other),),
        "end": (),
    }[draw(st.sampled_from(AFTER_CUT))]
    return (cut, *then)


@st.composite
def episode_plans(draw: Any) -> EpisodePlan:
    """An episode of one to six steps (a cancelled call comes with what the agent does next).

    No compensation crashes in an episode that overlaps calls: one could run in a rollback that
    a call of the pair starts, and a ``BaseException`` ends only the task it is raised in, so the
    other call would run on in a "dead" process, as no kill allows. (Crashes and kills of the
    calls made one at a time stay: nothing else is in flight then.)
    """
    is_async = draw(st.booleans())
    step = st.one_of(
        calls(is_async=is_async),
        st.builds(Repeat, st.integers(0, 4)),
        *([_overlapping(), st.just(Settle()), cut_and_after()] if is_async else []),
    )
    drawn = draw(st.lists(step, min_size=1, max_size=5))
    steps = [s for d in drawn for s in (d if isinstance(d, tuple) else (d,))][:6]
    if any(isinstance(s, Gather) for s in steps):
        steps = [
            _replace(s, comp_fault="ok") if isinstance(s, Call) and s.comp_fault == "crash" else s
            for s in steps
        ]
    kill = draw(st.none() | st.tuples(st.integers(0, 4), st.sampled_from(("before", "after"))))
    if any(isinstance(s, Call) and s.fault == "out_of_scope" for s in steps):
        # The README's stated limit: a process that dies inside a call takes that call's change
        # window with it, so resume probes the declared scope only and cannot see a write the
        # call made outside it. Episodes with a stray writer are therefore never killed.
        kill = None
        steps = [
            _replace(s, fault="out_of_scope", comp_fault="ok")
            if isinstance(s, Call) and s.fault == "out_of_scope" and s.comp_fault == "crash"
            else s
            for s in steps
        ]
    return EpisodePlan(
        is_async=is_async,
        steps=tuple(steps),
        policy=draw(st.sampled_from(tuple(POLICIES))),
        crash_style=draw(st.sampled_from(("abandon", "unwind"))),
        final_rollback=draw(st.booleans()),
        kill=kill,
    )


# --------------------------------------------------------------------------------------------
# The world: a ledger of accounts, tools driven by each call's plan, a store that can fail.
# --------------------------------------------------------------------------------------------


@dataclass
class CallPlan:
    """The live plan of one step's call: its fault, and what happened to it so far."""

    op: str
    call: Call
    attempts: int = 0  # tool executions
    fired: bool = False  # a one-shot fault went off
    armed: bool = False  # a store fault was set to go off at the next record of its kind
    comp_crashed: bool = False
    kill: str | None = None  # the episode's kill lands in this call: "before" or "after"
    doomed: bool = False  # the episode's kill was given to this call
    dying: str | None = None  # where this execution of the tool dies, if it does
    landed: bool = False  # a cut call's tool reached the point where its caller cancels it
    event: asyncio.Event | None = None  # set when it does (the agent's ``task.cancel()`` waits)
    fee_runs: int = 0  # executions of the nested fee's own function
    nested_seen: list[str] = field(default_factory=list)  # what each nested fee call gave

    @property
    def fault(self) -> str:
        return self.call.fault

    def begin(self) -> str:
        """The fault of this execution of the tool (and whether it dies: ``dying``)."""
        self.attempts += 1
        self.dying, self.kill = self.kill, None
        fault = self.fault
        if fault in CUT_FAULTS:  # the caller cancels the call once; run again, it just works
            if self.fired:
                return "none"
            self.fired = True
            return fault
        if fault in ONE_SHOT:
            if fault in ("crash_before", "crash_after") and not self.fired:
                self.fired = True
                return fault
            return "store_commit" if fault == "store_commit" and not self.fired else "none"
        if fault == "precondition_false":
            return "none"
        if self.call.persist or self.attempts == 1:
            return fault
        return "none"


class FaultyStore(hx.Store):
    """A store whose next write of one kind of record can be made to raise (a disk I/O error)."""

    KINDS = {"intent": frozenset({"intent"}), "outcome": frozenset({"committed", "recovered"})}

    def __init__(self, url: str) -> None:
        super().__init__(url, create=True)
        self.armed: tuple[str, CallPlan] | None = None

    def arm(self, which: str, plan: CallPlan) -> None:
        self.armed = (which, plan)
        plan.armed = True

    def disarm(self) -> None:
        self.armed = None

    def writer(self, episode_id: str) -> Any:
        writer = super().writer(episode_id)
        original = writer.append_text

        def append_text(kind: str, txn_id: str | None, text: str, projected: Any = None) -> Any:
            armed = self.armed
            if armed is not None and kind in self.KINDS[armed[0]]:
                self.armed = None
                armed[1].fired = True
                raise sqlite3.OperationalError("disk I/O error (injected)")
            return original(kind, txn_id, text, projected)

        writer.append_text = append_text
        return writer


Tool = Generator[str, None, Any]


class World:
    """Accounts on a DictState, the actions that change them, and each call's live plan."""

    def __init__(self, store: FaultyStore, clock: FakeClock) -> None:
        self.state = hx.DictState({f"acct/{n}": {"balance": 0, "ops": []} for n in ACCOUNTS})
        self.store = store
        self.clock = clock
        self.active: dict[str, CallPlan] = {}  # op -> the plan of its current call
        self.doubles: list[str] = []  # ops applied while an earlier application was in the state
        self.actions: dict[tuple[str, bool], hx.Action[..., Any]] = {
            (kind, is_async): self._build(kind, is_async)
            for kind in KINDS
            for is_async in (False, True)
        }
        self.fees = {is_async: self._build_fee(is_async) for is_async in (False, True)}

    # --- the tools' logic, written once: "pause" is where an async tool yields the loop ---
    def deposit(self, op: str, account: str) -> Tool:
        plan = self.active[op]
        fault = plan.begin()
        self._before_effect(fault, plan)
        if fault == "cut_before":
            yield "landed"  # hangs before its effect until its caller cancels it
        key = f"acct/{account}"
        current = self.state[key]
        yield "pause"
        if fault == "silent_none":
            yield from self._after_effect("none", plan)
            return {"op": op, "balance": current["balance"] + AMOUNT}
        if op in current["ops"]:
            self.doubles.append(op)
        amount = AMOUNT + 1 if fault == "silent_wrong" else AMOUNT
        current = {"balance": current["balance"] + amount, "ops": [*current["ops"], op]}
        self.state[key] = current
        if plan.call.nested != "none":
            yield "fee"  # the tool calls the fee action inside itself
            current = self.state[key]
        if fault == "out_of_scope":
            self.state[f"stray/{op}"] = {"by": op}
        yield "pause"
        yield from self._after_effect(fault, plan)
        return {"op": op, "balance": current["balance"]}

    def fee(self, op: str, account: str, amount: int) -> None:
        """The nested fee's own function: takes ``amount`` and appends ``fee:<op>``."""
        plan = self.active[op]
        plan.fee_runs += 1
        key, fee_op = f"acct/{account}", f"fee:{op}"
        current = self.state[key]
        if fee_op in current["ops"]:
            self.doubles.append(fee_op)
        self.state[key] = {
            "balance": current["balance"] - amount,
            "ops": [*current["ops"], fee_op],
        }

    def _fee_call(self, op: str, account: str, is_async: bool) -> Any:
        """Call the fee action as the running tool would, with the arguments its plan says."""
        amount: Any = "x" if self.active[op].call.nested == "fee_invalid" else FEE
        return self.fees[is_async](op=op, account=account, amount=amount)

    def nested_fee(self, op: str, account: str) -> None:
        """A sync tool's nested fee call; what it gave is noted on the call's plan."""
        try:
            self._fee_call(op, account, False)
            self.active[op].nested_seen.append("returned")
        except hx.HarnessError as exc:
            self.active[op].nested_seen.append(type(exc).__name__)

    async def anested_fee(self, op: str, account: str) -> None:
        """An async tool's nested fee call; what it gave is noted on the call's plan."""
        try:
            await self._fee_call(op, account, True)
            self.active[op].nested_seen.append("returned")
        except hx.HarnessError as exc:
            self.active[op].nested_seen.append(type(exc).__name__)

    def landed(self, op: str) -> None:
        plan = self.active[op]
        plan.landed = True
        if plan.event is not None:
            plan.event.set()

    def read(self, op: str, account: str) -> Tool:
        plan = self.active[op]
        fault = plan.begin()
        self._before_effect(fault, plan)
        if fault == "cut_before":
            yield "landed"
        balance = self.state[f"acct/{account}"]["balance"]
        yield "pause"
        if fault == "out_of_scope":
            self.state[f"stray/{op}"] = {"by": op}
        yield from self._after_effect(fault, plan)
        return balance + 1 if fault in ("silent_none", "silent_wrong") else balance

    def _before_effect(self, fault: str, plan: CallPlan) -> None:
        op = plan.op
        if fault == "crash_before" or plan.dying == "before":
            raise Crash(op)
        if fault == "raise_before":
            raise ValueError(f"{op}: refused")
        if fault == "transient_before":
            raise hx.TransientError(f"{op}: busy")

    def _after_effect(self, fault: str, plan: CallPlan) -> Tool:
        if fault == "slow":
            self.clock.advance(SLOW)
        if fault == "slow_real":
            yield "hang"
        if fault in ("cut_wait_for", "cut_cancel"):
            yield "landed"  # its effect applied, it hangs until its caller cancels it
        if fault == "raise_after":
            raise hx.TransientError(f"{plan.op}: connection reset")
        if fault == "crash_after" or plan.dying == "after":
            raise Crash(plan.op)
        if fault == "store_commit":
            self.store.arm("outcome", plan)

    def restore(self, ctx: hx.Context) -> None:
        """The compensation: put back every value the call's ``before`` holds (or fail)."""
        plan = self.active[ctx.args.op]
        if plan.call.comp_fault == "crash" and not plan.comp_crashed:
            plan.comp_crashed = True
            raise Crash(f"{plan.op}: compensating")
        if plan.call.comp_fault == "raises":
            raise RuntimeError(f"{plan.op}: undo service down")
        if plan.call.comp_fault == "no_restore":
            return
        restore_before(self.state, ctx)

    # --- the actions ---
    def _build(self, kind: str, is_async: bool) -> hx.Action[..., Any]:
        name = f"{kind}_{'async' if is_async else 'sync'}"
        logic = self.read if kind == "read" else self.deposit

        if is_async:

            async def tool(op: str, account: str) -> Any:
                """Deposit into (or read) an account, as its call's plan says."""
                steps = logic(op, account)
                try:
                    while True:
                        what = next(steps)
                        if what == "fee":
                            await self.anested_fee(op, account)
                            continue
                        if what == "landed":
                            self.landed(op)
                        await asyncio.sleep(HANG if what in ("hang", "landed") else 0)
                except StopIteration as stop:
                    return stop.value

            fn: Callable[..., Any] = tool
        else:

            def sync_tool(op: str, account: str) -> Any:
                """Deposit into (or read) an account, as its call's plan says."""
                steps = logic(op, account)
                try:
                    while True:
                        if next(steps) == "fee":
                            self.nested_fee(op, account)
                except StopIteration as stop:
                    return stop.value

            fn = sync_tool

        options: dict[str, Any] = {"name": name}
        if is_async:
            options["timeout"] = TIMEOUT
        if kind != "read":
            options["writes"] = ["acct/{account}"]
        if kind in ("keyed", "keyed_comp"):
            options["idempotency_key"] = lambda a: a.op
        act = hx.action(**options)(fn)
        world = self

        @act.precondition
        def allowed(ctx: hx.Context) -> bool:
            """The account exists and the call's plan does not refuse it."""
            plan = world.active[ctx.args.op]
            exists = ctx.state.get(f"acct/{ctx.args.account}") is not None
            return exists and plan.fault != "precondition_false"

        if kind == "read":

            @act.postcondition
            def reads_true(ctx: hx.Context) -> bool:
                return bool(ctx.result == ctx.state.get(f"acct/{ctx.args.account}")["balance"])

        else:

            @act.postcondition
            def deposited(ctx: hx.Context) -> bool:
                key = f"acct/{ctx.args.account}"
                before, after = ctx.before.get(key), ctx.after.get(key)
                if before is None or after is None:
                    return False
                op = ctx.args.op
                fees = after["ops"].count(f"fee:{op}") - before["ops"].count(f"fee:{op}")
                return bool(
                    after["balance"] - before["balance"] == AMOUNT - FEE * fees
                    and after["ops"].count(op) == before["ops"].count(op) + 1
                    and fees in (0, 1)
                )

        if kind in COMPENSABLE:
            if is_async:

                @act.compensation
                async def undo(ctx: hx.Context) -> None:
                    await asyncio.sleep(0)
                    world.restore(ctx)

            else:
                act.compensation(world.restore)
        return act

    def _build_fee(self, is_async: bool) -> hx.Action[..., Any]:
        """The fee: an action of its own (keyed, with a precondition), which deposits call from
        inside their tools."""
        world = self

        if is_async:

            async def fee(op: str, account: str, amount: int) -> None:
                """Take a fee for op from an account."""
                await asyncio.sleep(0)
                world.fee(op, account, amount)

            fn: Callable[..., Any] = fee
        else:

            def sync_fee(op: str, account: str, amount: int) -> None:
                """Take a fee for op from an account."""
                world.fee(op, account, amount)

            fn = sync_fee
        act = hx.action(
            name=f"fee_{'async' if is_async else 'sync'}",
            writes=["acct/{account}"],
            idempotency_key=lambda a: f"fee:{a.op}",
        )(fn)

        @act.precondition
        def charged(ctx: hx.Context) -> bool:
            """The account exists and the call's plan does not refuse the fee."""
            plan = world.active[ctx.args.op]
            exists = ctx.state.get(f"acct/{ctx.args.account}") is not None
            return exists and plan.call.nested != "fee_refused"

        return act


# --------------------------------------------------------------------------------------------
# The agent: deterministic given what it sees, so a resumed episode re-runs it from the start.
# --------------------------------------------------------------------------------------------


@dataclass
class Seen:
    """What the agent saw of one call."""

    op: str
    call: Call
    step: int
    plan: CallPlan
    returned: bool = False
    result: Any = None
    error: BaseException | None = None
    gathered_with: Call | None = None
    running_before: bool = True
    running_after: bool = True
    cut: bool = False  # the agent cancelled this call (``wait_for`` or ``task.cancel()``)
    doubt_before: bool = False  # an async call may have been in doubt when this one was made


def _cancellation(error: BaseException | None) -> bool:
    """Whether ``error`` is what a caller that cancelled its call gets back."""
    return isinstance(error, (TimeoutError, asyncio.CancelledError))


def _refused_for_doubt(error: BaseException | None) -> bool:
    """Whether ``error`` refuses a sync call because an async call is in doubt."""
    return isinstance(error, hx.ConfigurationError) and "asettle" in str(error)


@dataclass
class Resolved:
    """A step's call with its op id and the plan it runs under."""

    op: str
    call: Call
    plan: CallPlan
    step: int


class Agent:
    """Runs an episode plan's steps; stops when the episode stops taking calls."""

    def __init__(self, world: World, plan: EpisodePlan, resolved: list[list[Resolved]]) -> None:
        self.world = world
        self.plan = plan
        self.resolved = resolved
        self.seen: list[Seen] = []
        self.escaped: BaseException | None = None  # a non-HarnessError a call raised
        # An async call may be in doubt (cancelled, or its outcome refused, after its tool
        # started): a sync call may then be refused until an async call or asettle() settles it.
        self.doubt = False

    def _prepare(self, r: Resolved) -> None:
        self.world.active[r.op] = r.plan
        if r.plan.fault == "store_intent" and not r.plan.fired:
            self.world.store.arm("intent" if r.call.kind in MUTATING else "outcome", r.plan)

    def _note(self, ep: hx.Episode, r: Resolved, seen: Seen, outcome: Any, error: Any) -> bool:
        """Record one call's outcome; True when the agent must stop."""
        seen.running_after = ep.outcome == "running"
        self._track_doubt(r, seen, error)
        if error is None:
            seen.returned, seen.result = True, outcome
            self.seen.append(seen)
            return False
        seen.error = error
        self.seen.append(seen)
        if isinstance(error, Crash):
            raise error
        if seen.cut and _cancellation(error):
            return ep.outcome != "running"  # the agent cancelled it: it goes on
        if not isinstance(error, hx.HarnessError):
            self.escaped = error
            raise error
        if isinstance(error, (hx.Escalated, hx.Diverged)):
            raise error  # the episode is paused for a person, or cannot go on
        return isinstance(error, hx.EpisodeClosed) or ep.outcome != "running"

    def _track_doubt(self, r: Resolved, seen: Seen, error: BaseException | None) -> None:
        """What this call leaves of an async call in doubt (the agent's own bookkeeping)."""
        if not r.call.is_async:
            if not _refused_for_doubt(error):
                self.doubt = False  # a sync call that was not refused settled it first
            return
        in_doubt = seen.cut and _cancellation(error)
        in_doubt |= isinstance(error, hx.StoreError) and r.plan.attempts > 0
        self.doubt = in_doubt and r.call.kind in MUTATING

    async def _settle(self, ep: hx.Episode) -> bool:
        """``await ep.asettle()``; True when the agent must stop."""
        self.doubt = False
        try:
            await ep.asettle()
        except Crash:
            raise
        except hx.HarnessError as exc:
            if isinstance(exc, (hx.Escalated, hx.Diverged)):
                raise
            return True
        except BaseException as exc:
            self.escaped = exc
            raise
        return ep.outcome != "running"

    def run(self, ep: hx.Episode) -> None:
        for group in self.resolved:
            if not group:
                continue  # asettle(): async episodes only
            (r,) = group
            seen = Seen(r.op, r.call, r.step, r.plan, running_before=ep.outcome == "running")
            self._prepare(r)
            act = self.world.actions[(r.call.kind, r.call.is_async)]
            try:
                value, error = act(op=r.op, account=r.call.account), None
            except BaseException as exc:
                value, error = None, exc
            finally:
                self.world.store.disarm()
            if self._note(ep, r, seen, value, error):
                return
        if self.plan.final_rollback and ep.outcome == "running":
            ep.rollback()

    async def arun(self, ep: hx.Episode) -> None:
        for group in self.resolved:
            if not group:
                if await self._settle(ep):
                    return
                continue
            if len(group) == 1:
                (r,) = group
                seen = Seen(r.op, r.call, r.step, r.plan, running_before=ep.outcome == "running")
                seen.doubt_before = self.doubt
                seen.cut = r.call.fault in CUT_FAULTS and not r.plan.fired
                self._prepare(r)
                try:
                    value, error = await (self._acut(r) if seen.cut else self._acall(r)), None
                except BaseException as exc:
                    value, error = None, exc
                finally:
                    self.world.store.disarm()
                if self._note(ep, r, seen, value, error):
                    return
                continue
            running = ep.outcome == "running"
            doubt_before = self.doubt
            for r in group:
                self._prepare(r)
            outcomes = await asyncio.gather(
                *(self._acall(r) for r in group), return_exceptions=True
            )
            stop = False
            held: BaseException | None = None
            for r, other, outcome in zip(group, reversed(group), outcomes, strict=True):
                seen = Seen(
                    r.op, r.call, r.step, r.plan, gathered_with=other.call, running_before=running
                )
                seen.doubt_before = doubt_before
                error = outcome if isinstance(outcome, BaseException) else None
                try:
                    stop = self._note(ep, r, seen, None if error else outcome, error) or stop
                except BaseException as exc:
                    held = held or exc
            if held is not None:
                raise held
            if stop:
                return
        if self.plan.final_rollback and ep.outcome == "running":
            await ep.arollback()

    async def _acall(self, r: Resolved) -> Any:
        act = self.world.actions[(r.call.kind, r.call.is_async)]
        result = act(op=r.op, account=r.call.account)
        return await result if r.call.is_async else result

    async def _acut(self, r: Resolved) -> Any:
        """The call, cancelled by the agent: ``asyncio.wait_for`` with a deadline shorter than
        the tool takes, or ``task.cancel()`` once the tool reached its hang (or ended)."""
        if r.call.fault == "cut_wait_for":
            return await asyncio.wait_for(self._acall(r), CUT)
        r.plan.event = asyncio.Event()
        task = asyncio.ensure_future(self._acall(r))
        waiter = asyncio.ensure_future(r.plan.event.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        task.cancel()
        return await task


# --------------------------------------------------------------------------------------------
# Running an episode, crashes and resumes included.
# --------------------------------------------------------------------------------------------


@dataclass
class EpisodeReport:
    """One episode's plan, what the agent saw, the world before and after, and the store."""

    plan: EpisodePlan
    episode_id: str
    outcome: str
    start: dict[str, Any]
    final: dict[str, Any]
    seen: list[Seen]
    plans: list[CallPlan]
    sessions: int
    escaped: BaseException | None  # what a call raised that is not a HarnessError
    ended_by: BaseException | None  # what ended the last session, if not its agent's return
    violations: dict[str, list[str]] = field(default_factory=dict)


def _resolve(plan: EpisodePlan, prefix: str) -> list[list[Resolved]]:
    """The plan's steps as groups of calls (two for a gather), with op ids and live plans."""
    groups: list[list[Resolved]] = []
    singles: list[Resolved] = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, Call):
            r = Resolved(f"{prefix}s{i}", step, CallPlan(f"{prefix}s{i}", step), i)
            singles.append(r)
            groups.append([r])
        elif isinstance(step, Repeat):
            if not singles:
                continue
            target = singles[step.index % len(singles)]
            call = Call(
                target.call.kind,
                target.call.is_async,
                target.call.account,
                nested=target.call.nested,  # the same call: its tool takes the same fee
            )
            groups.append([Resolved(target.op, call, CallPlan(target.op, call), i)])
        elif isinstance(step, Settle):
            groups.append([])
        else:
            a, b = f"{prefix}s{i}a", f"{prefix}s{i}b"
            groups.append(
                [
                    Resolved(a, step.first, CallPlan(a, step.first), i),
                    Resolved(b, step.second, CallPlan(b, step.second), i),
                ]
            )
    singles_now = [group[0] for group in groups if len(group) == 1]
    if plan.kill is not None and singles_now:
        doomed = singles_now[plan.kill[0] % len(singles_now)].plan
        doomed.kill, doomed.doomed = plan.kill[1], True
    return groups


def run_episode(world: World, plan: EpisodePlan, episode_id: str) -> EpisodeReport:
    """Run ``plan`` as episode ``episode_id`` until it ends (resuming it after each crash)."""
    start = world.state.to_dict()
    resolved = _resolve(plan, episode_id)
    policy = POLICIES[plan.policy]
    actions = [*world.actions.values(), *world.fees.values()]
    # Every crash is one-shot: an episode resumed more often than it crashes never settles.
    crashes = sum(
        (r.call.fault in ("crash_before", "crash_after")) + (r.call.comp_fault == "crash")
        for group in resolved
        for r in group
    ) + (plan.kill is not None)
    sessions = 0
    ended_by: BaseException | None = None
    # Sync calls refused for an async call then in doubt: a resumed agent is held to its record,
    # so the same call is refused again, although nothing is in doubt any more.
    refused_earlier: set[str] = set()
    agent: Agent | None = None
    while True:
        sessions += 1
        ended_by = None
        if agent is not None:
            refused_earlier |= {s.op for s in agent.seen if _refused_for_doubt(s.error)}
        agent = Agent(world, plan, resolved)
        ep = hx.Episode(
            state=world.state,
            store=world.store,
            policy=policy,
            clock=world.clock,
            episode_id=episode_id,
            resume=sessions > 1,
            actions=actions,
        )
        try:
            if plan.is_async:
                asyncio.run(_async_session(ep, agent, plan.crash_style))
            else:
                contextvars.copy_context().run(_sync_session, ep, agent, plan.crash_style)
        except Crash as exc:
            ended_by = exc
            if sessions <= crashes:
                continue
        except hx.HarnessError as exc:  # Escalated, Diverged, or the episode would not open
            ended_by = exc
        except Exception as exc:
            if exc is not agent.escaped:
                raise  # not from a call: the test's own machinery failed
            ended_by = exc
        break
    for seen in agent.seen:
        if seen.op in refused_earlier and _refused_for_doubt(seen.error):
            seen.doubt_before = True  # (as the record has it)
        p = seen.plan
        ran = p.attempts > 0 and seen.call.kind in MUTATING
        if ((p.fault == "store_intent" and ran) or (p.armed and seen.returned)) and not p.fired:
            raise RuntimeError(
                f"test machinery: the store fault of {p.op} never went off; FaultyStore no "
                "longer sees the episode's writes (EpisodeWriter.append_text)"
            )
    return EpisodeReport(
        plan,
        episode_id,
        ep.outcome,
        start,
        world.state.to_dict(),
        agent.seen,
        [r.plan for group in resolved for r in group],
        sessions,
        agent.escaped,
        ended_by,
    )


def _sync_session(ep: hx.Episode, agent: Agent, style: str) -> None:
    try:
        if style == "unwind":
            with ep:
                agent.run(ep)
            return
        ep.__enter__()
        try:
            agent.run(ep)
        except Crash:
            raise  # the process is gone: the episode is never exited
        except BaseException as exc:
            ep.__exit__(type(exc), exc, exc.__traceback__)
            raise
        ep.__exit__(None, None, None)
    except Crash as crash:
        _drop_frames(crash)
        raise


async def _async_session(ep: hx.Episode, agent: Agent, style: str) -> None:
    try:
        if style == "unwind":
            async with ep:
                await agent.arun(ep)
            return
        await ep.__aenter__()
        try:
            await agent.arun(ep)
        except Crash:
            raise
        except BaseException as exc:
            await ep.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await ep.__aexit__(None, None, None)
    except Crash as crash:
        _drop_frames(crash)
        raise


def _drop_frames(crash: Crash) -> None:
    """Let go of the dead call's frames here, in the context it ran in.

    A call cut short by the crash leaves its suspended engine generators referenced from the
    traceback; finalised later in another context, they could not reset their context variables
    and Python would print "Exception ignored" (a process really killed runs nothing at all).
    """
    traceback.clear_frames(crash.__traceback__)


# --------------------------------------------------------------------------------------------
# The reference model: what the state must be, given what the agent saw and the outcome.
# --------------------------------------------------------------------------------------------


def apply_ops(
    start: dict[str, Any], ops: Iterable[tuple[str, str]], fees: Iterable[str] = ()
) -> dict[str, Any]:
    """``start`` with each ``(op, account)`` deposit applied once, and the nested fee of each
    op in ``fees`` with it (a fee is part of its deposit's effect)."""
    out = json.loads(json.dumps(start))
    with_fee = set(fees)
    for op, account in ops:
        acct = out[f"acct/{account}"]
        acct["balance"] += AMOUNT
        acct["ops"].append(op)
        if op in with_fee:
            acct["balance"] -= FEE
            acct["ops"].append(f"fee:{op}")
    return out


def _owner(op: str) -> str:
    """The op whose effect ``op`` is part of (a fee's op id is ``fee:<op>``)."""
    return op.removeprefix("fee:")


def _norm(value: Any) -> Any:
    if isinstance(value, dict) and "ops" in value:
        return {**value, "ops": sorted(value["ops"])}
    return value


def state_differences(expected: dict[str, Any], final: dict[str, Any]) -> dict[str, str]:
    """Per key where ``final`` is not ``expected``, what is wrong, in words."""
    out: dict[str, str] = {}
    for key in sorted(set(expected) | set(final)):
        want, got = _norm(expected.get(key)), _norm(final.get(key))
        if want == got:
            continue
        if want is None:
            out[key] = f"left in the state: {got} (a write outside a call's scope)"
            continue
        if got is None:
            out[key] = f"missing (expected {want})"
            continue
        words = []
        want_ops, got_ops = Counter(want["ops"]), Counter(got["ops"])
        for op in sorted(set(want_ops) | set(got_ops)):
            if got_ops[op] > 1:
                words.append(f"{op} applied {got_ops[op]} times")
            elif want_ops[op] and not got_ops[op]:
                words.append(f"{op} returned but its effect is absent")
            elif got_ops[op] and not want_ops[op]:
                words.append(f"{op} is applied although its call did not return")
        if not words:
            words.append(f"balance {got['balance']}, expected {want['balance']}")
        out[key] = "; ".join(words)
    return out


def mutating_returned(seen: list[Seen], settled: set[str]) -> list[tuple[str, str]]:
    """``(op, account)`` of the mutating calls that returned, each op once, in order; and of
    those the harness answered with StoreError, or the agent cancelled ("in doubt, settled
    against the state"), that the store then records as committed (``settled``)."""
    out: dict[str, str] = {}
    for s in seen:
        cut = s.cut and _cancellation(s.error)
        in_doubt = (isinstance(s.error, hx.StoreError) or cut) and s.op in settled
        if (s.returned or in_doubt) and s.call.kind in MUTATING:
            out.setdefault(s.op, s.call.account)
    return list(out.items())


@dataclass
class Records:
    """What the store says of one episode, read from its log (rows can be rewritten later: a
    commit whose undo failed reads ``failed``; the log keeps every step)."""

    op_of: dict[str, str]  # txn id -> op
    committed: set[str]  # txn ids with a committed or recovered record
    compensated: set[str]  # txn ids with a compensated record
    dangling: dict[str, str]  # txn id -> op: an intent without a row
    dedups: list[str]  # txn ids answered again from the record
    escalations: list[Any]

    @classmethod
    def read(cls, store: hx.Store, episode_id: str) -> Records:
        rows = store.transactions(episode_id)
        op_of = {row.id: (row.args or {}).get("op") for row in rows}
        records = cls(op_of, set(), set(), {}, [], store.escalations(episode_id=episode_id))
        for rec in store.log(episode_id):
            if rec.kind == "intent" and rec.txn_id not in op_of:
                records.dangling[rec.txn_id] = json.loads(rec.payload)["args"]["op"]
            elif rec.kind in ("committed", "recovered"):
                records.committed.add(rec.txn_id)
            elif rec.kind == "compensated":
                records.compensated.add(rec.txn_id)
            elif rec.kind == "dedup":
                records.dedups.append(rec.txn_id)
        records.op_of.update(records.dangling)
        return records

    def standing(self) -> set[str]:
        """Ops whose commit the log holds and no compensation undid."""
        return {self.op_of[t] for t in self.committed - self.compensated}

    def calls_of(self) -> Counter[str]:
        """How many records of a call each op has (rows, dangling intents, dedups)."""
        return Counter([*self.op_of.values(), *(self.op_of.get(t) for t in self.dedups)])


def judge(report: EpisodeReport, world: World) -> dict[str, list[str]]:
    """Every violation of the promise in one episode, by invariant."""
    v: dict[str, list[str]] = {
        "outcome_is_one_of_three": [],
        "outcome_is_true": [],
        "no_effect_applied_twice": [],
        "every_call_is_logged": [],
        "chain_verifies": [],
        "calls_behave_as_declared": [],
        "nested_call_is_part_of_its_call": [],
    }
    outcome, start, final = report.outcome, report.start, report.final
    records = Records.read(world.store, report.episode_id)
    accounts = {r.op: r.call.account for r in report.plans}
    kinds = {r.op: r.call.kind for r in report.plans}
    fees = {r.op for r in report.plans if r.call.nested == "fee"}
    standing = records.standing()

    if outcome not in ("committed", "rolled_back", "escalated"):
        why = report.ended_by
        v["outcome_is_one_of_three"].append(
            f"the episode ended {outcome!r}"
            + ("" if why is None else f" ({type(why).__name__}: {why})")
        )

    if outcome == "committed":
        # The start plus the calls that returned, each once (and calls answered with
        # StoreError, "in doubt", that the episode then settled as committed), nothing else.
        expected = apply_ops(start, mutating_returned(report.seen, standing), fees)
        for key, what in state_differences(expected, final).items():
            v["outcome_is_true"].append(f"committed, but {key}: {what}")
    elif outcome == "rolled_back":
        for key, what in state_differences(start, final).items():
            v["outcome_is_true"].append(f"rolled_back, but {key}: {what}")
    elif outcome == "escalated":
        if not records.escalations:
            v["outcome_is_true"].append("escalated, but the store has no escalation row")
        # What the records explain: the start plus every commit no compensation undid; the
        # rest must be in an escalation's evidence, with the value it has in the world.
        explained = apply_ops(
            start,
            {op: accounts[op] for op in standing if kinds.get(op) in MUTATING}.items(),
            fees,
        )
        told: dict[str, Any] = {}
        for esc in records.escalations:
            evidence = esc.evidence or {}
            for key, (_, after) in (evidence.get("diff") or {}).items():
                told[key] = after
        for key, what in state_differences(explained, final).items():
            if key not in told or _norm(told[key]) != _norm(final.get(key)):
                v["outcome_is_true"].append(
                    f"escalated, but {key} is not what the records say ({what}) and no "
                    f"escalation's evidence gives its value {final.get(key)}"
                )

    for op in sorted(op for op in set(world.doubles) if _owner(op) in accounts):
        v["no_effect_applied_twice"].append(
            f"{op} ({kinds[_owner(op)]}) was applied again while its earlier application was "
            "still in the state"
        )
    for key, value in final.items():
        if key.startswith("acct/"):
            for op, n in Counter(value["ops"]).items():
                if n > 1 and _owner(op) in accounts:
                    v["no_effect_applied_twice"].append(f"{op} is in {key} {n} times")

    # Every call is in the store (a row, an intent, a dedup record), every intent ends with an
    # outcome or an escalation holding it, and every call that returned has its commit. Exempt:
    # calls refused because the episode had ended, and a call answered with StoreError whose
    # tool never ran (the store refused its intent: nothing happened, and it said so).
    held = {e.txn_id for e in records.escalations}
    for txn_id, op in records.dangling.items():
        if txn_id not in held:
            v["every_call_is_logged"].append(
                f"{txn_id} ({op}) has an intent but no outcome, and no escalation holds it"
            )
    logged = records.calls_of()
    committed_ops = {records.op_of.get(t) for t in records.committed}
    for s in report.seen:
        if isinstance(s.error, (hx.EpisodeClosed, hx.Diverged)) or logged[s.op]:
            continue
        if isinstance(s.error, hx.StoreError) and not s.plan.attempts:
            continue
        if (s.cut or _refused_for_doubt(s.error)) and not s.plan.attempts:
            continue  # cancelled before its tool started, or refused: it may not have begun
        if s.doubt_before and isinstance(s.error, hx.Escalated) and not s.plan.attempts:
            continue  # settling the call in doubt before it escalated: it was never admitted
        v["every_call_is_logged"].append(f"the call of {s.op} ({s.call.kind}) is not in the store")
    for s in report.seen:
        if s.returned and s.call.kind in MUTATING and s.op not in committed_ops:
            v["every_call_is_logged"].append(
                f"{s.op} returned a result, but the log has no commit of it"
            )

    chain = world.store.verify_chain()
    if not chain.ok:
        v["chain_verifies"].append(f"the log's hash chain does not verify: {chain}")
    audit = world.store.verify()
    if not audit.ok:
        v["chain_verifies"].append(f"the audit finds the record altered: {audit.findings[0]}")

    if report.escaped is not None:
        v["calls_behave_as_declared"].append(
            f"a call raised {type(report.escaped).__name__}: {report.escaped} (not a HarnessError)"
        )
    if isinstance(report.ended_by, Crash):
        v["calls_behave_as_declared"].append(
            f"still crashing after {report.sessions} sessions (one per one-shot crash)"
        )
    for s in report.seen:
        partner_ok = s.gathered_with is None or s.gathered_with.fault == "none"
        # A faultless async attempt the machine stalled past its (real) timeout is slow for
        # real: whatever the engine then does is judged by the other invariants, not this one.
        stalled = getattr(s.error, "failure_class", None) == "fail_slow"
        # A call made while an async call was in doubt settles it first: settled as escalated
        # (or rolled back by the policy), the episode ends there; a sync one may be refused.
        settled_first = s.doubt_before and (
            isinstance(s.error, hx.Escalated) or not s.running_after
        )
        refused = _refused_for_doubt(s.error)
        if refused and not (s.doubt_before and not s.call.is_async):
            v["calls_behave_as_declared"].append(
                f"{s.op} was refused for an async call in doubt, but none was: {s.error}"
            )
        if refused and s.plan.attempts:
            v["calls_behave_as_declared"].append(
                f"{s.op} was refused for an async call in doubt, but its tool ran"
            )
        if s.cut and s.plan.landed:
            want = TimeoutError if s.call.fault == "cut_wait_for" else asyncio.CancelledError
            if not isinstance(s.error, want):
                got = "returned" if s.returned else f"raised {type(s.error).__name__}: {s.error}"
                v["calls_behave_as_declared"].append(
                    f"{s.op} was cancelled by its caller ({s.call.fault}), but it {got}"
                )
        if (
            s.call.fault == "none"
            and not s.plan.doomed
            and s.running_before
            and partner_ok
            and not s.returned
            and not stalled
            and not settled_first
            and not refused
            and not isinstance(s.error, (hx.EpisodeClosed, hx.Diverged))
        ):
            v["calls_behave_as_declared"].append(
                f"{s.op} ({s.call.kind}, no fault) did not return: "
                f"{type(s.error).__name__}: {s.error}"
            )
        if isinstance(s.error, hx.Diverged):
            v["calls_behave_as_declared"].append(f"{s.op}: the resumed agent diverged: {s.error}")
        if s.call.fault == "precondition_false":
            if s.returned or not isinstance(s.error, (hx.PreconditionFailed, hx.EpisodeClosed)):
                v["calls_behave_as_declared"].append(
                    f"{s.op}: precondition false, but the call "
                    f"{'returned' if s.returned else f'raised {type(s.error).__name__}'}"
                )
            if s.plan.attempts:
                v["calls_behave_as_declared"].append(f"{s.op}: precondition false, but it ran")

    # A fee called inside a deposit's tool: validated and its precondition checked (a false one
    # or a wrong argument raises in the tool, and nothing of the fee runs), otherwise run as a
    # plain function within the deposit; never a transaction or a log record of its own.
    want = {
        "fee": "returned",
        "fee_refused": "PreconditionFailed",
        "fee_invalid": "InvalidArguments",
    }
    for p in report.plans:
        nested = p.call.nested
        if nested == "none":
            continue
        for got in p.nested_seen:
            if got != want[nested]:
                v["nested_call_is_part_of_its_call"].append(
                    f"{p.op}'s tool called the fee ({nested}): expected {want[nested]}, got {got}"
                )
        if nested != "fee" and p.fee_runs:
            v["nested_call_is_part_of_its_call"].append(
                f"{p.op}'s fee ({nested}) was refused, but its function ran {p.fee_runs}x"
            )
    for row in world.store.transactions(report.episode_id):
        if row.action.startswith("fee_"):
            v["nested_call_is_part_of_its_call"].append(
                f"the nested fee is a transaction of its own: {row.id} ({row.status})"
            )
    for rec in world.store.log(report.episode_id):
        if '"fee_sync"' in rec.payload or '"fee_async"' in rec.payload:
            v["nested_call_is_part_of_its_call"].append(
                f"the nested fee is a step of the record: a {rec.kind} record names it"
            )
    return {k: msgs for k, msgs in v.items() if msgs}


# --------------------------------------------------------------------------------------------
# The state machine.
# --------------------------------------------------------------------------------------------


def _simpler(plan: EpisodePlan) -> Iterable[EpisodePlan]:
    """Plans one step simpler than ``plan``: a step fewer, a gather split, a fault or an option
    back to its plainest value."""
    steps = plan.steps
    for i in range(len(steps)):
        if len(steps) > 1:
            yield _replace(plan, steps=steps[:i] + steps[i + 1 :])
        step = steps[i]
        if isinstance(step, Gather):
            for call in (step.first, step.second):
                yield _replace(plan, steps=(*steps[:i], call, *steps[i + 1 :]))
        if isinstance(step, Call):
            plain = {
                "fault": "none",
                "persist": False,
                "comp_fault": "ok",
                "kind": "keyed",
                "account": "a",
                "is_async": step.is_async and step.fault in ASYNC_ONLY,
                "nested": "none",
            }
            for name, value in plain.items():
                if getattr(step, name) != value:
                    call = _replace(step, **{name: value})
                    yield _replace(plan, steps=(*steps[:i], call, *steps[i + 1 :]))
    plain_plan = {
        "final_rollback": False,
        "kill": None,
        "policy": "default",
        "crash_style": "abandon",
        "is_async": any(
            isinstance(s, Gather) or (isinstance(s, Call) and s.is_async) for s in steps
        ),
    }
    for name, value in plain_plan.items():
        if getattr(plan, name) != value:
            yield _replace(plan, **{name: value})


def violated_alone(plan: EpisodePlan, invariant: str) -> bool:
    """Whether ``plan``, run as the first episode of a fresh world, violates ``invariant``."""
    folder = _scratch()
    store = fresh_store(folder)
    try:
        world = World(store, FakeClock())
        return invariant in judge(run_episode(world, plan, "e1"), world)
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


def minimal(plan: EpisodePlan, invariant: str, budget: int = 150) -> EpisodePlan | None:
    """The simplest plan found (greedily, within ``budget`` runs) that violates ``invariant`` on
    a fresh world; None when ``plan`` does not violate it alone (it needs the episodes before).

    Hypothesis' own shrinking is off (see the settings): an example costs tens of milliseconds of
    SQLite work, and shrinking three episodes of random calls took minutes. This takes seconds.
    """
    if not violated_alone(plan, invariant):
        return None
    runs = 1
    progress = True
    while progress and runs < budget:
        progress = False
        for candidate in _simpler(plan):
            runs += 1
            if violated_alone(candidate, invariant):
                plan, progress = candidate, True
                break
            if runs >= budget:
                break
    return plan


def _scratch() -> Path:
    """Where the stores go: memory-backed when the machine has it (a store per example)."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="hx-guarantees-", dir=shm if shm.is_dir() else None))


_TEMPLATE: list[Path] = []
atexit.register(lambda: [shutil.rmtree(t.parent, ignore_errors=True) for t in _TEMPLATE])


def fresh_store(folder: Path) -> FaultyStore:
    """A new, empty store in ``folder``: a copy of one made once (creating the schema costs
    more than the episodes of an example)."""
    if not _TEMPLATE:
        template = _scratch() / "template.db"
        hx.Store(f"sqlite:///{template}", create=True).close()
        _TEMPLATE.append(template)
    shutil.copyfile(_TEMPLATE[0], folder / "harness.db")
    return FaultyStore(f"sqlite:///{folder / 'harness.db'}")


class GuaranteeMachine(RuleBasedStateMachine):
    """Episodes of random calls with random faults on one world and one store, judged after each."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = _scratch()
        self.clock = FakeClock()
        self.store = fresh_store(self.folder)
        self.world = World(self.store, self.clock)
        self.episodes = 0
        self.last: EpisodeReport | None = None

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(plan=episode_plans())
    def episode(self, plan: EpisodePlan) -> None:
        """Run one episode to its end (resuming after crashes) and judge it."""
        self.episodes += 1
        self.world.doubles.clear()
        report = run_episode(self.world, plan, f"e{self.episodes}")
        report.violations = judge(report, self.world)
        self.last = report

    def _found(self, name: str) -> list[str]:
        return [] if self.last is None else self.last.violations.get(name, [])

    def _say(self, name: str) -> str:
        last = self.last
        assert last is not None
        smallest = minimal(last.plan, name)
        return (
            f"{name} is violated in episode {last.episode_id} (outcome {last.outcome!r}):\n  "
            + "\n  ".join(self._found(name))
            + "\nits plan: "
            + repr(last.plan)
            + (
                "\nthe simplest plan found that violates it alone, on a fresh world:\n  "
                + repr(smallest)
                if smallest is not None
                else "\n(it violates it only after the episodes before it)"
            )
        )

    # Each invariant asserts on its own line, so hypothesis tells their failures apart.
    @invariant()
    def outcome_is_one_of_three(self) -> None:
        """The episode ended committed, rolled_back or escalated."""
        assert not self._found("outcome_is_one_of_three"), self._say("outcome_is_one_of_three")

    @invariant()
    def outcome_is_true(self) -> None:
        """The outcome says what the world is."""
        assert not self._found("outcome_is_true"), self._say("outcome_is_true")

    @invariant()
    def no_effect_applied_twice(self) -> None:
        """No effect was applied while an earlier application of it was in the state."""
        assert not self._found("no_effect_applied_twice"), self._say("no_effect_applied_twice")

    @invariant()
    def every_call_is_logged(self) -> None:
        """Every call is in the store, every intent has an outcome or an escalation."""
        assert not self._found("every_call_is_logged"), self._say("every_call_is_logged")

    @invariant()
    def chain_verifies(self) -> None:
        """The hash chain verifies after every episode."""
        assert not self._found("chain_verifies"), self._say("chain_verifies")

    @invariant()
    def nested_call_is_part_of_its_call(self) -> None:
        """An action called inside a tool is checked, then part of that call, never a step."""
        assert not self._found("nested_call_is_part_of_its_call"), self._say(
            "nested_call_is_part_of_its_call"
        )

    @invariant()
    def calls_behave_as_declared(self) -> None:
        """Faultless calls return, refused ones do not run, only HarnessErrors are raised."""
        assert not self._found("calls_behave_as_declared"), self._say("calls_behave_as_declared")


GuaranteeMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=3,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrink phase: a failure's message carries the simplest plan ``minimal`` finds instead.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestGuarantees = GuaranteeMachine.TestCase
TestGuarantees.__doc__ = "The promise holds for random episodes of every kind of call and fault."


# =============================================================================================
# The shared world: another writer (a thread, or a separate process) writes the same state.
# =============================================================================================
#
# The world is a bank on a real shared store of state: rows ``acct/<name>`` of a SQLite or a
# Postgres database, or files ``acct/<name>.json`` under a folder, each ``{"bal": int, "ops":
# ["<op>:<amount>", ...]}``. A deposit's tool (through the adapter's connection, or by writing
# its file) adds its amount and appends its op, so the state is again the ledger of applied
# effects; the other writer does the same with ops of its own (``x<n>:100``), through a
# connection of its own, in a thread or in a separate process (a long-lived child that writes
# on request), at a drawn moment: inside the call before or after the tool's effect, or between
# calls. After every episode:
#
# - nothing the other writer wrote is lost: each of its ops is present once, in its row;
# - no effect is applied twice, and every row's balance is the sum of the ops it holds (no
#   restore put back a balance without its ops, or the reverse);
# - the outcome is true: ``committed``: the ops of the calls that returned are present once and
#   those of the others absent; ``rolled_back``: no call's op is present; ``escalated``: every
#   call op left in the world that no committed call explains is in an escalation's evidence;
# - the hash chain verifies.
#
# Deposits undo by restoring ``ctx.before`` (the documented undo), or by removing their own op
# and amount (an undo safe under other writers, judged by a compensation check). Files cannot
# tell who wrote them, so on files the other writer changes the call's own file only between
# calls (see the README's isolation model). ``test_shared_world_catches_conflicts_switched_off``
# shows the machine fails when conflict detection is switched off.

SHARED_ACCOUNTS = ("a", "b")
OTHER_AMOUNT = 100
PG_SERVER = os.environ.get("HX_TEST_POSTGRES_URL", "")
WHEN = ("none", "in_call_before", "in_call_after", "between")
SHARED_FAULTS = ("none", "silent_wrong", "raise_after", "out_of_scope")


def _row(bal: int = 0, ops: Iterable[str] = ()) -> dict[str, Any]:
    return {"bal": bal, "ops": list(ops)}


def _libpq(url: str) -> str:
    return "postgresql://" + url.partition("://")[2]


def _add_sql(backend: str) -> str:
    """The statement adding an amount and appending an op to a row, relative (atomic)."""
    if backend == "sqlite":
        return "UPDATE acct SET bal = bal + ?, ops = json_insert(ops, '$[#]', ?) WHERE id = ?"
    return "UPDATE acct SET bal = bal + %s, ops = ops || to_jsonb(%s::text) WHERE id = %s"


def _file_add(root: Path, name: str, op: str, amount: int) -> None:
    """Add to an account's file (read, change, replace atomically)."""
    path = root / "acct" / f"{name}.json"
    row = json.loads(path.read_text())
    row["bal"] += amount
    row["ops"].append(f"{op}:{amount}")
    tmp = path.with_name(f".{name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(row))
    os.replace(tmp, path)


def _other_write(backend: str, target: str, name: str, op: str) -> None:
    """The other writer's deposit, on a connection (or file handle) of its own."""
    if backend == "files":
        _file_add(Path(target), name, op, OTHER_AMOUNT)
    elif backend == "sqlite":
        conn = sqlite3.connect(target, isolation_level=None, timeout=30)
        conn.execute(_add_sql("sqlite"), (OTHER_AMOUNT, f"{op}:{OTHER_AMOUNT}", name))
        conn.close()
    else:
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(_add_sql("postgres"), (OTHER_AMOUNT, f"{op}:{OTHER_AMOUNT}", name))


def _writer_loop(pipe: Any) -> None:
    """The separate process: performs each write it is sent, then says it is done."""
    while True:
        job = pipe.recv()
        if job is None:
            return
        try:
            _other_write(*job)
            pipe.send("ok")
        except Exception as exc:  # reported to the test, which fails on it
            pipe.send(f"{type(exc).__name__}: {exc}")


class OtherProcess:
    """A long-lived child process that writes the state when asked (one per test process)."""

    _instance: OtherProcess | None = None

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=_writer_loop, args=(child,), daemon=True)
        self.proc.start()
        self.lock = threading.Lock()

    @classmethod
    def get(cls) -> OtherProcess:
        if cls._instance is None or not cls._instance.proc.is_alive():
            cls._instance = OtherProcess()
            atexit.register(cls._instance.stop)
        return cls._instance

    def write(self, *job: str) -> None:
        with self.lock:
            self.pipe.send(job)
            answer = self.pipe.recv()
        assert answer == "ok", answer

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.pipe.send(None)
        self.proc.join(5)


def _thread_write(*job: str) -> None:
    """The other writer as a thread of this process, with its own connection."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _other_write(*job)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class SharedCall:
    """One deposit, its fault, and what the other writer does around it."""

    account: str
    undo: str  # "restore" (ctx.before) or "safe" (remove its own op, with a compensation check)
    fault: str
    when: str  # when the other writer writes: in the call (before or after the effect), or after
    target: str  # "same" (the call's account) or "other"


@dataclass(frozen=True)
class SharedPlan:
    calls: tuple[SharedCall, ...]
    end: str  # "end" or "rollback"
    writer: str  # "thread" or "process"


@st.composite
def shared_plans(draw: Any, *, backend: str) -> SharedPlan:
    def one() -> SharedCall:
        when = draw(st.sampled_from(WHEN))
        # Files cannot tell who wrote: the other writer changes the call's file only between calls.
        targets = (
            ("other",) if backend == "files" and when.startswith("in_call") else ("same", "other")
        )
        return SharedCall(
            account=draw(st.sampled_from(SHARED_ACCOUNTS)),
            undo=draw(st.sampled_from(("restore", "safe"))),
            fault=draw(st.sampled_from(SHARED_FAULTS)),
            when=when,
            target=draw(st.sampled_from(targets)),
        )

    n = draw(st.integers(1, 3))
    writers = ("thread", "process") if backend == "sqlite" else ("process",)
    return SharedPlan(
        calls=tuple(one() for _ in range(n)),
        end=draw(st.sampled_from(("end", "rollback"))),
        writer=draw(st.sampled_from(writers)),
    )


class Bank:
    """The shared state on one backend: the adapter, the tool's writes, and reading it back."""

    def __init__(self, backend: str, folder: Path, pg_url: str = "") -> None:
        self.backend = backend
        self.folder = folder
        if backend == "files":
            root = folder / "bank"
            (root / "acct").mkdir(parents=True)
            for name in SHARED_ACCOUNTS:
                (root / "acct" / f"{name}.json").write_text(json.dumps(_row()))
            self.target = str(root)
            self.state: Any = hx.FileState(root)
            self.keys = {n: f"acct/{n}.json" for n in SHARED_ACCOUNTS}
        elif backend == "sqlite":
            path = folder / "bank.db"
            with sqlite3.connect(path) as conn:
                conn.execute("CREATE TABLE acct (id TEXT PRIMARY KEY, bal INTEGER, ops JSON)")
                conn.executemany(
                    "INSERT INTO acct VALUES (?, 0, '[]')", [(n,) for n in SHARED_ACCOUNTS]
                )
            conn.close()
            self.target = str(path)
            self.state = hx.SQLState(f"sqlite:///{path}")
            self.keys = {n: f"acct/{n}" for n in SHARED_ACCOUNTS}
        else:
            import psycopg

            self.target = _libpq(pg_url)
            with psycopg.connect(self.target, autocommit=True) as conn:
                conn.execute("UPDATE acct SET bal = 0, ops = '[]'")
            self.state = _PG_STATE[0]  # one adapter for every episode (opening one costs)
            self.keys = {n: f"acct/{n}" for n in SHARED_ACCOUNTS}

    def row(self, name: str) -> dict[str, Any]:
        value = self.state.get(self.keys[name])
        if self.backend == "files":
            return dict(json.loads(value))
        return {"bal": value["bal"], "ops": list(value["ops"])}

    def value(self, key: str) -> dict[str, Any] | None:
        """A resource's value as a row (None when absent)."""
        value = self.state.get(key)
        if value is None:
            return None
        return dict(json.loads(value)) if self.backend == "files" else dict(value)

    def add(self, name: str, op: str, amount: int) -> None:
        """The tool's own write."""
        if self.backend == "files":
            _file_add(Path(self.target), name, op, amount)
        else:
            self.state.connection.execute(_add_sql(self.backend), (amount, f"{op}:{amount}", name))

    def put(self, name: str, row: dict[str, Any]) -> None:
        """Write a whole row (the restoring undo)."""
        if self.backend == "files":
            (Path(self.target) / "acct" / f"{name}.json").write_text(json.dumps(row))
        elif self.backend == "sqlite":
            self.state.connection.execute(
                "UPDATE acct SET bal = ?, ops = ? WHERE id = ?",
                (row["bal"], json.dumps(row["ops"]), name),
            )
        else:
            from psycopg.types.json import Jsonb

            self.state.connection.execute(
                "UPDATE acct SET bal = %s, ops = %s WHERE id = %s",
                (row["bal"], Jsonb(row["ops"]), name),
            )

    def take_back(self, name: str, op: str) -> None:
        """Remove ``op`` and its amount from the row (the undo safe under other writers)."""
        row = self.row(name)
        mine = [o for o in row["ops"] if o.split(":")[0] == op]
        if not mine:
            return
        amount = int(mine[0].split(":")[1])
        if self.backend == "files":
            _file_add(Path(self.target), name, op, 0)  # (re-read under the same rename discipline)
            row = self.row(name)
            row["ops"] = [o for o in row["ops"] if o.split(":")[0] != op]
            row["ops"] = [o for o in row["ops"] if o != f"{op}:0"]
            row["bal"] -= amount
            self.put(name, row)
        elif self.backend == "sqlite":
            self.state.connection.execute(
                "UPDATE acct SET bal = bal - ?, ops = (SELECT COALESCE(json_group_array(value), "
                "'[]') FROM json_each(acct.ops) WHERE value NOT LIKE ? || ':%') WHERE id = ?",
                (amount, op, name),
            )
        else:
            self.state.connection.execute(
                "UPDATE acct SET bal = bal - %s, ops = COALESCE((SELECT jsonb_agg(v) FROM "
                "jsonb_array_elements_text(acct.ops) v WHERE v NOT LIKE %s || ':%%'), '[]') "
                "WHERE id = %s",
                (amount, op, name),
            )

    def close(self) -> None:
        if self.backend == "sqlite":
            self.state.close()


def postgres_bank() -> tuple[str, str]:
    """A new Postgres database holding the bank's table: its URL and name."""
    import psycopg

    name = f"hx_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(PG_SERVER), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = PG_SERVER.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id text PRIMARY KEY, bal integer, ops jsonb)")
        for account in SHARED_ACCOUNTS:
            conn.execute("INSERT INTO acct VALUES (%s, 0, '[]')", (account,))
    return url, name


def drop_postgres_bank(name: str) -> None:
    import psycopg

    with psycopg.connect(_libpq(PG_SERVER), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_PG_BANK: list[str] = []
_PG_STATE: list[Any] = []


def _shared_postgres() -> str:
    """The one Postgres bank of this test process and its adapter (each episode resets the
    rows)."""
    if not _PG_BANK:
        url, name = postgres_bank()
        _PG_BANK.append(url)
        _PG_STATE.append(hx.SQLState(url))
        atexit.register(drop_postgres_bank, name)
        atexit.register(_PG_STATE[0].close)  # (runs first: atexit is last in, first out)
    return _PG_BANK[0]


def shared_actions(bank: Bank, writes_other: Callable[[str, str], None]) -> dict[str, Any]:
    """The deposit actions (one per undo), their faults and the other writer's hook."""
    plan: dict[str, SharedCall] = {}  # op -> its call
    attempts: Counter[str] = Counter()
    key = bank.keys

    def other_name(call: SharedCall) -> str:
        if call.target == "same":
            return call.account
        return next(n for n in SHARED_ACCOUNTS if n != call.account)

    def tool(account: str, op: str) -> str:
        call = plan[op]
        attempts[op] += 1
        first = attempts[op] == 1
        if first and call.when == "in_call_before":
            writes_other(other_name(call), op)
        amount = 5 if first and call.fault == "silent_wrong" else AMOUNT
        bank.add(account, op, amount)
        if first and call.fault == "out_of_scope":
            stray = next(n for n in SHARED_ACCOUNTS if n != account)
            bank.add(stray, f"{op}s", AMOUNT)
        if first and call.when == "in_call_after":
            writes_other(other_name(call), op)
        if first and call.fault == "raise_after":
            raise hx.TransientError("the acknowledgement was lost")
        return op

    def posted(ctx: hx.Context) -> bool:
        k = key[ctx.args.account]
        before, after = bank_row(ctx.before.get(k)), bank_row(ctx.after.get(k))
        return after["bal"] == before["bal"] + AMOUNT and after["ops"] == before["ops"] + [
            f"{ctx.args.op}:{AMOUNT}"
        ]

    def bank_row(value: Any) -> dict[str, Any]:
        if value is None:
            return _row()
        return dict(json.loads(value)) if bank.backend == "files" else dict(value)

    def restore(ctx: hx.Context) -> None:
        for k, value in ctx.before.items():
            name = next(n for n, kk in key.items() if kk == k)
            bank.put(name, bank_row(value))

    def safe(ctx: hx.Context) -> None:
        for name in SHARED_ACCOUNTS:
            bank.take_back(name, ctx.args.op)
            bank.take_back(name, f"{ctx.args.op}s")

    def taken_back(ctx: hx.Context) -> bool:
        return all(
            not any(o.split(":")[0] in (ctx.args.op, f"{ctx.args.op}s") for o in bank.row(n)["ops"])
            for n in SHARED_ACCOUNTS
        )

    suffix = ".json" if bank.backend == "files" else ""

    def make(undo: str) -> Any:
        def deposit(account: str, op: str) -> str:
            """Deposit into an account."""
            return tool(account, op)

        deposit.__name__ = f"deposit_{undo}"
        act = hx.action(writes=[f"acct/{{account}}{suffix}"], idempotency_key=lambda a: a.op)(
            deposit
        )
        act.postcondition(posted)
        if undo == "restore":
            act.compensation(restore)
        else:
            act.compensation(safe)
            act.compensation_check(taken_back)
        return act

    return {"plan": plan, "restore": make("restore"), "safe": make("safe"), "attempts": attempts}


@dataclass
class SharedReport:
    plan: SharedPlan
    outcome: str
    returned: set[str]
    others: dict[str, str]  # other op -> account
    final: dict[str, dict[str, Any]]
    committed: set[str]
    escalated_keys: set[str]
    verified: bool
    errors: list[str]


def run_shared_episode(
    backend: str, plan: SharedPlan, folder: Path, pg_url: str = ""
) -> SharedReport:
    """Run one episode of ``plan`` on a fresh bank and store; report what it left."""
    bank = Bank(backend, folder, pg_url)
    fresh_store(folder).close()
    store_url = f"sqlite:///{folder / 'harness.db'}"
    others: dict[str, str] = {}
    errors: list[str] = []

    def writes_other(name: str, op: str) -> None:
        other = f"x{len(others)}"
        job = (backend, bank.target, name, other)
        if plan.writer == "thread":
            _thread_write(*job)
        else:
            OtherProcess.get().write(*job)
        others[f"{other}:{OTHER_AMOUNT}"] = name

    made = shared_actions(bank, writes_other)
    returned: set[str] = set()
    policy = hx.Policy(retry=hx.Retry(attempts=3, backoff=0, jitter=False))
    try:
        with hx.Episode(state=bank.state, store=store_url, policy=policy, clock=FakeClock()) as ep:
            for n, call in enumerate(plan.calls):
                op = f"c{n}"
                made["plan"][op] = call
                try:
                    made[call.undo](call.account, op)
                    returned.add(op)
                except hx.EpisodeClosed:
                    break
                except hx.Escalated:
                    break
                except hx.HarnessError:
                    pass
                if call.when == "between":
                    other = (
                        call.account
                        if call.target == "same"
                        else next(a for a in SHARED_ACCOUNTS if a != call.account)
                    )
                    writes_other(other, op)
                if ep.outcome != "running":
                    break
            if plan.end == "rollback" and ep.outcome == "running":
                with contextlib.suppress(hx.Escalated):
                    ep.rollback()
    except Exception as exc:  # anything else escaping is a finding
        errors.append("".join(traceback.format_exception(exc)))
    store = hx.Store(store_url)
    try:
        committed = {t.args["op"] for t in store.transactions(ep.id) if t.status == "committed"}
        escalated_keys: set[str] = set()
        for esc in store.escalations():
            escalated_keys.update(esc.evidence.get("diff", {}))
            escalated_keys.update(esc.evidence.get("others", {}))
        verified = store.verify().ok
    finally:
        store.close()
    final = {n: bank.row(n) for n in SHARED_ACCOUNTS}
    bank.close()
    return SharedReport(
        plan, ep.outcome, returned, others, final, committed, escalated_keys, verified, errors
    )


def judge_shared(report: SharedReport, keys: dict[str, str]) -> dict[str, list[str]]:
    """Which of the shared world's promises the episode broke, and how."""
    found: dict[str, list[str]] = {}

    def bad(name: str, text: str) -> None:
        found.setdefault(name, []).append(text)

    for text in report.errors:
        bad("calls_behave_as_declared", f"raised out of the episode: {text}")
    present: Counter[str] = Counter()
    where: dict[str, str] = {}
    for name, row in report.final.items():
        if row["bal"] != sum(int(o.split(":")[1]) for o in row["ops"]):
            bad(
                "nothing_lost",
                f"{name}: balance {row['bal']} is not the sum of its ops {row['ops']}",
            )
        for entry in row["ops"]:
            present[entry.split(":")[0]] += 1
            where[entry.split(":")[0]] = name
    for entry, name in report.others.items():
        op = entry.split(":")[0]
        if present[op] != 1 or where.get(op) != name:
            bad(
                "nothing_lost",
                f"the other writer's {entry} on {name} is in the state {present[op]} time(s)",
            )
    for op, times in present.items():
        if times > 1:
            bad("no_effect_applied_twice", f"{op} is in the state {times} times")
    calls = {f"c{n}" for n in range(len(report.plan.calls))}
    left = {op.rstrip("s") for op in present if not op.startswith("x")}
    if report.outcome == "committed":
        for op in calls:
            if (op in report.returned) != (op in left):
                bad(
                    "outcome_is_true",
                    f"committed, but {op} returned={op in report.returned} present={op in left}",
                )
    elif report.outcome == "rolled_back":
        if left:
            bad("outcome_is_true", f"rolled back, but {sorted(left)} are in the state")
    elif report.outcome == "escalated":
        for op in left - report.committed:
            n = int(op[1:])
            rows = {keys[report.plan.calls[n].account]} | set(keys.values())
            if not rows & report.escalated_keys:
                bad(
                    "outcome_is_true",
                    f"escalated, but {op}'s change is in no escalation's evidence",
                )
    else:
        bad("outcome_is_true", f"the episode ended {report.outcome!r}")
    if not report.verified:
        bad("chain_verifies", "the store does not verify")
    return found


class SharedWorldMachine(RuleBasedStateMachine):
    """Episodes on a shared bank that another writer changes while calls run, judged after each."""

    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.pg_url = _shared_postgres() if self.backend == "postgres" else ""

    @rule(data=st.data())
    def episode(self, data: Any) -> None:
        """Run one episode with another writer and judge it."""
        plan = data.draw(shared_plans(backend=self.backend))
        folder = _scratch()
        try:
            report = run_shared_episode(self.backend, plan, folder, self.pg_url)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        keys = {
            n: f"acct/{n}.json" if self.backend == "files" else f"acct/{n}" for n in SHARED_ACCOUNTS
        }
        found = judge_shared(report, keys)
        assert not found, (
            f"{self.backend}: {found}\nplan: {plan!r}\n"
            f"outcome: {report.outcome}, final: {report.final}"
        )


_SHARED_SETTINGS = dict(
    stateful_step_count=1,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class SharedSQLite(SharedWorldMachine):
    backend = "sqlite"


class SharedFiles(SharedWorldMachine):
    backend = "files"


class SharedPostgres(SharedWorldMachine):
    backend = "postgres"


SharedSQLite.TestCase.settings = settings(max_examples=60, **_SHARED_SETTINGS)  # type: ignore[arg-type]
SharedFiles.TestCase.settings = settings(max_examples=30, **_SHARED_SETTINGS)  # type: ignore[arg-type]
SharedPostgres.TestCase.settings = settings(max_examples=30, **_SHARED_SETTINGS)  # type: ignore[arg-type]
TestSharedWorldSQLite = SharedSQLite.TestCase
TestSharedWorldSQLite.__doc__ = "On SQLite, another writer's changes are never lost or blamed."
TestSharedWorldFiles = SharedFiles.TestCase
TestSharedWorldFiles.__doc__ = "On files, another writer's changes are never lost."
TestSharedWorldPostgres = pytest.mark.skipif(
    not PG_SERVER, reason="set HX_TEST_POSTGRES_URL to run on Postgres"
)(SharedPostgres.TestCase)
TestSharedWorldPostgres.__doc__ = "On Postgres, another writer's changes are never lost or blamed."


def test_shared_world_catches_conflicts_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """With conflict detection switched off (no other writers seen, no moved values), the
    shared-world judge finds the other writer's deposits erased: the model test can fail."""
    monkeypatch.setattr(hx_transaction, "other_writes", lambda state, mark: {})
    monkeypatch.setattr(hx_transaction, "_moved", lambda ctx, diff: {})
    plan = SharedPlan(
        calls=(SharedCall("a", "restore", "none", "in_call_after", "same"),),
        end="end",
        writer="process",
    )
    folder = _scratch()
    try:
        report = run_shared_episode("sqlite", plan, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    found = judge_shared(report, {n: f"acct/{n}" for n in SHARED_ACCOUNTS})
    assert "nothing_lost" in found, found
