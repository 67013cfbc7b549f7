"""One call of an action, step by step, written once for sync and async.

The steps are a generator that yields what it needs done (call a user function, sleep) and
receives the outcome; :func:`drive` runs it synchronously and :func:`adrive` under asyncio.
That keeps one copy of the logic whose order matters: validate, deduplicate, preconditions,
write-ahead intent, execute under retry and timeout, observe, scope check, postconditions,
commit or compensate, then the policy's decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import tenacity

from . import observe
from .action import ACTIVE_CALL, Action, Context
from .errors import (
    ActionFailed,
    CheckError,
    CompensationFailed,
    ConfigurationError,
    Escalated,
    NotSerializable,
    PreconditionFailed,
    ScopeViolation,
    StoreError,
    WriteConflict,
)
from .policy import Decision, FailureClass, Policy
from .state.base import ScopeMatcher
from .store import TxnStatus
from .store.tables import txn_seq

if TYPE_CHECKING:
    from .clock import Clock

__all__ = ["ActionTimeout", "Call", "Host", "Records", "Sleep", "Transaction", "adrive", "drive"]


class ActionTimeout(TimeoutError):
    """An attempt took longer than its timeout (a ``fail_slow`` failure)."""


@dataclass(slots=True)
class Call:
    """A request to call a user function (a tool, a check, a compensation)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None


@dataclass(slots=True)
class Sleep:
    """A request to wait between attempts."""

    seconds: float


@dataclass(slots=True)
class Await:
    """A request to await what a user function returned (a check written ``async def``)."""

    awaitable: Any
    fn: Callable[..., Any]


Steps = Generator[Call | Sleep | Await, Any, Any]

# Classes a tool's exception may declare through a ``failure_class`` attribute.
_TOOL_DECLARED = frozenset({"fail_stop", "fail_slow", "correlated", "planned"})

# What checks and tools usually return: never awaitable, so no need to ask.
_PLAIN = frozenset({bool, int, float, str, dict, list, tuple, type(None)})


def drive(steps: Steps, clock: Any) -> Any:
    """Run the steps synchronously; user functions must not be coroutines."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Sleep):
                    clock.sleep(request.seconds)
                    value: Any = None
                elif isinstance(request, Await):
                    _refuse(request.fn, request.awaitable)
                else:
                    value = request.fn(*request.args, **request.kwargs)
                    if value.__class__ not in _PLAIN and inspect.isawaitable(value):
                        _refuse(request.fn, value)
            except BaseException as exc:  # (a cancellation too: the call must know)
                request = steps.throw(exc)
            else:
                request = steps.send(value)
    except StopIteration as stop:
        return stop.value


def _refuse(fn: Any, value: Any) -> None:
    """A sync action's function returned an awaitable: close it and say what to change."""
    if hasattr(value, "close"):
        value.close()
    raise ConfigurationError(
        f"{getattr(fn, '__name__', fn)!r} is async but the action is sync; make the action "
        "async def, or the function sync"
    )


# The async twin of drive: the same loop, awaiting instead of calling (one generator of steps
# serves both, so the transaction's logic is written once; only the driving is twice).
async def adrive(steps: Steps, clock: Any) -> Any:
    """Run the steps under asyncio, awaiting async user functions (with their timeout)."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Sleep):
                    await clock.asleep(request.seconds)
                    value: Any = None
                elif isinstance(request, Await):
                    value = await request.awaitable
                else:
                    value = request.fn(*request.args, **request.kwargs)
                    if inspect.isawaitable(value):
                        if request.timeout is not None:
                            try:
                                value = await asyncio.wait_for(value, request.timeout)
                            except TimeoutError:
                                raise ActionTimeout(
                                    f"attempt exceeded its timeout of {request.timeout}s"
                                ) from None
                        else:
                            value = await value
            except BaseException as exc:  # (a cancellation too: the call must know)
                request = steps.throw(exc)
            else:
                request = steps.send(value)
    except StopIteration as stop:
        return stop.value


class _Failed(Exception):
    """One attempt's failure, classified (internal)."""

    def __init__(
        self,
        failure_class: FailureClass,
        error: ActionFailed,
        *,
        retryable: bool,
        effect_remains: bool = False,
        diff: dict[str, Any] | None = None,
        unobserved: bool = False,
        kept: str = "",
    ) -> None:
        super().__init__(error.reason)
        self.failure_class = failure_class
        self.error = error
        self.retryable = retryable
        self.effect_remains = effect_remains
        self.unobserved = unobserved
        self.diff = diff or {}
        self.kept = kept  # why its change was left in the state, when not for want of an undo


class _Recovered(Exception):
    """The tool raised, but the observed state shows its effect complete (internal)."""

    def __init__(self, diff: dict[str, Any], error: BaseException) -> None:
        super().__init__(str(error))
        self.diff = diff
        self.error = error


def observed_changes(state: Any, mark: Any) -> dict[str, tuple[Any, Any]]:
    """``{key: (before, after)}`` for the resources that really differ since ``mark``."""
    out: dict[str, tuple[Any, Any]] = {}
    for key, old in state.changes(mark).items():
        new = state.get(key)
        if new != old:
            out[key] = (old, new)
    return out


def other_writes(state: Any, mark: Any) -> dict[str, Any]:
    """What other writers (other connections, other processes) changed since ``mark``, each
    with its value before their change: ``{}`` for an adapter that cannot tell them apart."""
    others = getattr(state, "others", None)
    return {} if others is None else others(mark)


def _moved(ctx: Context, diff: dict[str, tuple[Any, Any]]) -> dict[str, list[Any]]:
    """The resources of ``diff`` whose value now is neither the call's after nor its before:
    someone else changed them since the call did, ``{key: [the call's after, now]}``."""
    out: dict[str, list[Any]] = {}
    for key, (before, after) in diff.items():
        now = ctx.state.get(key)
        if now != after and now != before:
            out[key] = [after, now]
    return out


def _unwritten(state: Any, mark: Any, scope: ScopeMatcher) -> list[str]:
    """Keys in the call's scope whose read copy the tool changed in place and never wrote back
    (adapters that hand out copies say so through ``unwritten``; others have none)."""
    unwritten = getattr(state, "unwritten", None)
    if unwritten is None:
        return []
    return [k for k in unwritten(mark) if k in scope]


def run_check(action: Action[Any, Any], name: str, check: Any, ctx: Context, phase: str) -> Steps:
    """Run one check; a raise becomes :class:`CheckError`, the answer a bool.

    The check is called here, not by the driver: most checks are plain functions, and a
    round trip through the generators costs more than the check. What it returns is handed
    to the driver only when it must be awaited.
    """
    try:
        verdict = check(ctx)
        if verdict.__class__ not in _PLAIN and inspect.isawaitable(verdict):
            verdict = yield Await(verdict, check)
    except Exception as exc:
        raise CheckError(action.name, name, phase, exc, txn_id=ctx.txn_id) from exc
    return bool(verdict)


def is_undone(
    action: Action[Any, Any], ctx: Context, diff: dict[str, tuple[Any, Any]]
) -> Generator[Call | Sleep | Await, Any, list[str]]:
    """What keeps the call's effect from counting as undone ([] when it is undone): the
    action's compensation check when it has one, else every changed resource back to its
    before value."""
    if action.undo_check is not None:
        name, check = action.undo_check
        try:
            ok = yield from run_check(action, name, check, ctx, "compensation check")
        except CheckError as exc:
            return [f"its compensation check {name!r} raised {type(exc.error).__name__}"]
        return [] if ok else [f"its compensation check {name!r} is false"]
    return sorted(k for k, (before, _) in diff.items() if ctx.state.get(k) != before)


def compensate(
    action: Action[Any, Any], ctx: Context, diff: dict[str, tuple[Any, Any]]
) -> Generator[Call | Sleep | Await, Any, bool]:
    """Run the compensation and verify the effect is undone; returns whether the undo was
    semantic (judged by the action's compensation check, not by equality with before)."""
    steps = _compensation(action, ctx, diff)
    hook = observe.hook
    return steps if hook is None else hook.compensation(action, ctx, steps)


def _compensation(
    action: Action[Any, Any], ctx: Context, diff: dict[str, tuple[Any, Any]]
) -> Generator[Call | Sleep | Await, Any, bool]:
    if action.compensate is None:
        raise CompensationFailed(action.name, "it has no compensation", txn_id=ctx.txn_id)
    if action.undo_check is None:
        # Restoring before over a value someone else wrote since would erase their write.
        moved = _moved(ctx, diff)
        if moved:
            raise WriteConflict(
                action.name, sorted(moved), moved, "since the call changed them", txn_id=ctx.txn_id
            )
    mark = ctx.state.mark()
    try:
        yield Call(action.compensate, (ctx,))
        stray = sorted(k for k in observed_changes(ctx.state, mark) if k not in diff)
        theirs = {k: v for k, v in other_writes(ctx.state, mark).items() if k in diff}
    except Exception as exc:
        raise CompensationFailed(
            action.name,
            f"compensation raised {type(exc).__name__}: {exc}",
            errors=[exc],
            txn_id=ctx.txn_id,
        ) from exc
    finally:
        ctx.state.release(mark)
    if theirs and action.undo_check is None:
        others = {k: [b, ctx.state.get(k)] for k, b in theirs.items()}
        raise WriteConflict(
            action.name,
            sorted(theirs),
            others,
            "while the compensation ran",
            restored=True,
            txn_id=ctx.txn_id,
        )
    if stray and action.undo_check is None:
        # Restoring the state means touching only what the action changed.
        raise CompensationFailed(
            action.name,
            f"the compensation changed {', '.join(stray)}, which the action had not changed; "
            "it must restore ctx.before and nothing else (or declare a compensation_check)",
            txn_id=ctx.txn_id,
        )
    left = yield from is_undone(action, ctx, diff)
    if left and action.undo_check is not None:
        raise CompensationFailed(
            action.name,
            f"after compensation {left[0]}: the undo did not take effect",
            txn_id=ctx.txn_id,
        )
    if left:
        raise CompensationFailed(
            action.name,
            f"after compensation {', '.join(left)} differ from their value before the "
            "action; fix the compensation so it restores ctx.before",
            txn_id=ctx.txn_id,
        )
    return action.undo_check is not None


class Records(Protocol):
    """The records a transaction writes as it goes (:class:`harness.episode.recorder.Recorder`
    writes them; this protocol repeats its signatures so the engine need not import it)."""

    def record_intent(self, txn: Transaction) -> None: ...

    def record_commit(
        self, txn: Transaction, result: Any, diff: dict[str, tuple[Any, Any]], *, recovered: bool
    ) -> None: ...

    def record_refusal(
        self, txn: Transaction, status: str, reason: str, decision: Decision = ...
    ) -> None: ...

    def record_retry(self, txn: Transaction, delay: float) -> None: ...

    def record_failure(
        self,
        txn: Transaction,
        failure_class: FailureClass,
        decision: Decision,
        reason: str,
        diff: dict[str, tuple[Any, Any]],
        *,
        existing: bool = ...,
        status: str = ...,
    ) -> None: ...

    def escalate(
        self,
        txn: Transaction,
        failure_class: FailureClass | str,
        reason: str,
        diff: dict[str, tuple[Any, Any]],
    ) -> Escalated: ...

    def leave_in_doubt(self, txn: Transaction, error: BaseException) -> StoreError: ...

    def leave_unrecorded(self, txn: Transaction, error: BaseException) -> StoreError: ...


class Host(Protocol):
    """What a transaction needs of the episode it runs in (:class:`~harness.Episode` is one):
    the policy and clock it runs under, the pivot that bars a rollback, the recorder of its
    records, and the saga it starts when the policy decides to roll back."""

    @property
    def policy(self) -> Policy: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def pivot(self) -> str | None: ...

    @property
    def recorder(self) -> Records: ...

    def rollback_steps(self, *, reason: str, can_await: bool) -> Steps: ...


class Transaction:
    """The steps of one call of ``action`` in ``episode``."""

    __slots__ = (
        "action",
        "approved",
        "args_json",
        "before_json",
        "cleared",
        "ctx",
        "ep",
        "errors",
        "intended",
        "observed",
        "others",
        "recorded",
        "result_json",
        "retry",
        "scope",
        "seen",
        "semantic_undo",
        "seq",
        "started",
        "t0",
        "timeout",
        "unattributed",
        "values",
    )

    def __init__(
        self,
        episode: Host,
        action: Action[Any, Any],
        ctx: Context,
        *,
        approved: bool = False,
        values: dict[str, Any] | None = None,
    ) -> None:
        self.approved = approved  # a person approved this call: a refusal just continues
        self.cleared = False  # a person approved it to run (an approval request was answered)
        self.ep = episode
        self.action = action
        self.ctx = ctx
        self.retry = action.retry or episode.policy.retry
        self.timeout = action.timeout or episode.policy.timeout
        self.errors: list[BaseException] = []
        self.scope: list[str] | None = None  # the resolved writes, when the caller has them
        self.seen: dict[str, Any] = {}  # changed resources' before values, if cut short
        # What other writers did to resources this attempt changed: {key: [their before, now]}.
        self.others: dict[str, list[Any]] = {}
        self.unattributed: list[str] = []  # changed outside its scope, by whom nobody can tell
        self.semantic_undo = False  # a failed attempt was undone by its compensation check
        self.intended = False  # its intent record is written
        self.recorded = False  # its outcome record is written
        self.observed: observe.CallObservation | None = None  # what an observer keeps of it
        self.started = time.time()
        self.t0 = episode.clock.now()
        self.values = values if values is not None else action.call_values(ctx.args)
        self.seq = txn_seq(ctx.txn_id)
        self.args_json = ""
        self.before_json = "{}"
        self.result_json = "null"

    def unfinished(self, exc: BaseException) -> BaseException:
        """What to raise for ``exc``, which ended :meth:`run` early (the caller's ``except``).

        A record the store refuses never goes unnoticed: a tool that ran with no outcome
        recorded leaves its call in doubt (settled against the state before anything else);
        a call that changed nothing is recorded as failed with the episode's next write. A call
        cancelled (a task), interrupted (Ctrl-C) or abandoned between intent and outcome may
        have acted, so it is in doubt too.
        """
        in_doubt = self.action.mutating and self.intended and not self.recorded
        if isinstance(exc, StoreError) and not self.recorded:
            if in_doubt:
                return self.ep.recorder.leave_in_doubt(self, exc)
            return self.ep.recorder.leave_unrecorded(self, exc)
        if isinstance(exc, ConfigurationError) and not self.recorded and not self.intended:
            self.ep.recorder.leave_unrecorded(self, exc)  # nothing ran; the log still gets the call
        elif not isinstance(exc, Exception) and in_doubt:
            self.ep.recorder.leave_in_doubt(self, exc)
        elif (
            not isinstance(exc, Exception)
            and not self.recorded
            and not isinstance(exc, GeneratorExit)
        ):
            self.ep.recorder.leave_unrecorded(
                self, exc
            )  # cut short with no effect: logged as failed
        return exc

    def run(self) -> Steps:
        """Preconditions, intent, attempts, then commit or the policy's decision (the caller
        passes what ends it early through :meth:`unfinished`)."""
        ep, act, ctx = self.ep, self.action, self.ctx
        if observe.hook is not None:
            self.observed = observe.hook.transaction(self)
        for name, check in act.preconditions:
            try:
                ok = yield from run_check(act, name, check, ctx, "precondition")
            except CheckError as exc:
                yield from self._refuse(exc, TxnStatus.CHECK_ERROR, str(exc))
                raise  # pragma: no cover - _refuse raises
            if not ok:
                reason = (inspect.getdoc(check) or "").split("\n", 1)[0]
                yield from self._refuse(
                    PreconditionFailed(act.name, name, reason),
                    TxnStatus.PRECONDITION,
                    name if not reason else f"{name}: {reason}",
                )
        if not self.cleared and (act.approval or ep.policy.approval is not None):
            rule = yield from self._approval_rule()
            if rule:
                reason = f"held for a person's approval before it runs ({rule})"
                ep.recorder.record_refusal(self, TxnStatus.HELD, reason, Decision.ESCALATE)
                raise ep.recorder.escalate(self, "approval", reason, {})
        scope = self.scope if self.scope is not None else act.scope(ctx.args, self.values)
        matcher = ScopeMatcher(scope)
        concrete = list(matcher.literal)
        mark = ctx.state.mark()
        try:
            ctx.before = ctx.state.snapshot(concrete) if concrete else {}
            if act.mutating:
                ep.recorder.record_intent(self)
            try:
                result, diff = yield from self._attempts(mark, matcher, concrete)
            except _Failed as failed:
                return (yield from self._fail(failed))
            except _Recovered as rec:
                result = yield from self.recovered_result()
                ep.recorder.record_commit(self, result, rec.diff, recovered=True)
                return result
            ep.recorder.record_commit(self, result, diff, recovered=False)
            return result
        except BaseException:
            if act.mutating and self.intended and not self.recorded:
                # What the window saw before the call was cut short: the probe that settles
                # the call needs it (a glob scope has no snapshot of its own).
                with contextlib.suppress(Exception):
                    self.seen = {k: b for k, (b, _) in observed_changes(ctx.state, mark).items()}
            raise
        finally:
            ctx.state.release(mark)

    def _approval_rule(self) -> Generator[Call | Sleep | Await, Any, str]:
        """Which rule holds this call for a person ("" when none does). A rule that raises
        holds it too: when in doubt, ask."""
        act, ctx = self.action, self.ctx
        if act.approval is True:
            return "the action asks for approval on every call"
        rules = [("the action's", act.approval), ("the policy's", self.ep.policy.approval)]
        for whose, rule in rules:
            if rule is None or rule is False:
                continue
            name = getattr(rule, "__name__", "rule")
            try:
                ask = yield from run_check(act, name, rule, ctx, "approval")
            except CheckError as exc:
                return f"{whose} rule {name!r} raised {type(exc.error).__name__}: {exc.error}"
            if ask:
                return f"{whose} rule {name!r} says so"
        return ""

    def _refuse(self, error: PreconditionFailed | CheckError, status: str, reason: str) -> Steps:
        """Nothing ran: record the refusal with the policy's decision, carry it out, raise."""
        ep = self.ep
        decision = Decision.CONTINUE if self.approved else ep.policy.decide("precondition")
        if decision is Decision.ROLLBACK and ep.pivot is not None:
            decision = Decision.ESCALATE
        error.decision = str(decision)
        ep.recorder.record_refusal(self, status, reason, decision)
        if decision is Decision.ROLLBACK:
            yield from ep.rollback_steps(
                reason=f"{self.action.name}: {reason}", can_await=self.action.is_async
            )
        elif decision is Decision.ESCALATE:
            raise ep.recorder.escalate(self, FailureClass.PRECONDITION, str(error), {}) from error
        raise error

    def _attempts(
        self, mark: Any, matcher: ScopeMatcher, concrete: list[str]
    ) -> Generator[Call | Sleep | Await, Any, tuple[Any, dict[str, tuple[Any, Any]]]]:
        # The first attempt runs without tenacity: most calls succeed at once, and building a
        # Retrying costs more than the rest of the engine's control flow. A failure worth
        # retrying hands over to tenacity, which replays it as attempt 1 and drives the rest.
        try:
            return (yield from self._attempt(mark, matcher, concrete))
        except _Failed as failed:
            if not failed.retryable or self.retry.attempts == 1:
                raise
            first: _Failed | None = failed
        waits: list[float] = []
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retry.attempts),
            wait=self.retry.tenacity_wait(),
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, _Failed) and e.retryable),
            sleep=waits.append,
            reraise=True,
        )
        outcome: tuple[Any, dict[str, tuple[Any, Any]]] = (None, {})
        for attempt in retrying:
            with attempt:
                if first is not None:
                    replay, first = first, None
                    raise replay
                if waits:
                    delay = waits.pop()
                    self.ep.recorder.record_retry(self, delay)
                    yield Sleep(delay)
                outcome = yield from self._attempt(mark, matcher, concrete)
        return outcome

    def _attempt(
        self, mark: Any, matcher: ScopeMatcher, concrete: list[str]
    ) -> Generator[Call | Sleep | Await, Any, tuple[Any, dict[str, tuple[Any, Any]]]]:
        """One attempt in a change window of its own: a retry's ``ctx.before``/``ctx.after``
        and diff hold what it did, not what earlier attempts and their undos did. (The first
        attempt uses the call's window, opened before its intent.)"""
        ctx = self.ctx
        ctx.attempt += 1
        self.others, self.unattributed = {}, []
        if ctx.attempt == 1:
            return (yield from self._attempt_in(mark, matcher, concrete))
        own = ctx.state.mark()
        try:
            ctx.before = ctx.state.snapshot(concrete) if concrete else {}
            return (yield from self._attempt_in(own, matcher, concrete))
        finally:
            ctx.state.release(own)

    def _attempt_in(
        self, mark: Any, matcher: ScopeMatcher, concrete: list[str]
    ) -> Generator[Call | Sleep | Await, Any, tuple[Any, dict[str, tuple[Any, Any]]]]:
        act, ctx, clock = self.action, self.ctx, self.ep.clock
        ctx.result = None
        started = clock.now()
        error: BaseException | None = None
        failure = FailureClass.FAIL_STOP
        result: Any = None
        active = ACTIVE_CALL.set(ctx)
        ctx.in_tool = True
        try:
            if act.is_async:
                result = yield Call(act.fn, (), self.values, self.timeout)
            else:
                # Called here, not by the driver: the common case needs no generator round
                # trip (the driver would do exactly this).
                result = act.fn(**self.values)
                if result.__class__ not in _PLAIN and inspect.isawaitable(result):
                    _refuse(act.fn, result)
        except ActionTimeout as exc:
            error, failure = exc, FailureClass.FAIL_SLOW
        except Exception as exc:
            error = exc
            # A tool (or an injected fault) may say which class its failure belongs to, e.g.
            # a dependency announced as down for maintenance is ``planned``.
            declared = getattr(exc, "failure_class", None)
            if declared in _TOOL_DECLARED:
                failure = FailureClass(declared)
        finally:
            ctx.in_tool = False
            # (A generator abandoned mid-call is closed wherever it is collected, maybe in
            # another context, where this context's variable is not to be reset.)
            with contextlib.suppress(ValueError):
                ACTIVE_CALL.reset(active)
        elapsed = clock.now() - started
        if self.timeout is not None and elapsed > self.timeout and error is None:
            error = ActionTimeout(f"attempt took {elapsed:.3f}s, over its timeout {self.timeout}s")
            failure = FailureClass.FAIL_SLOW
        try:
            diff = observed_changes(ctx.state, mark)
            if diff:
                theirs = other_writes(ctx.state, mark)
                for key in diff.keys() & theirs.keys():
                    self.others[key] = [theirs[key], diff[key][1]]
                for key, (first, now) in diff.items():
                    # Its value when the window opened is not what the call's first write
                    # found: another writer changed it in between (on Postgres, a transaction
                    # in flight when the call started commits unseen by the window).
                    if key in ctx.before and ctx.before[key] != first and key not in self.others:
                        self.others[key] = [ctx.before[key], now]
                if not getattr(ctx.state, "attributes_writes", True):
                    # The adapter cannot tell who wrote: a change outside the call's scope may
                    # be another program's, and no undo may touch it.
                    self.unattributed = matcher.outside(diff)
        except Exception as exc:
            # The adapter cannot say what changed: nothing about the state can be promised.
            self.errors.append(exc)
            reason = f"its changes could not be observed ({type(exc).__name__}: {exc})"
            lost = ActionFailed(act.name, "fail_stop", reason, txn_id=ctx.txn_id)
            raise _Failed(FailureClass.FAIL_STOP, lost, retryable=False, unobserved=True) from exc
        self._observe(concrete, diff)
        if error is None and act.mutating:
            in_place = _unwritten(ctx.state, mark, matcher)
            if in_place:
                reason = (
                    f"changed its copy of {', '.join(in_place)} in place and never wrote it back: "
                    "reads are copies, so nothing changed; write it back with state[key] = value"
                )
                bad = ActionFailed(act.name, "fail_stop", reason, txn_id=ctx.txn_id)
                raise (yield from self._undo(FailureClass.FAIL_STOP, reason, diff, error=bad))
        if error is not None:
            self.errors.append(error)
            if diff and failure is not FailureClass.FAIL_SLOW and not matcher.outside(diff):
                # The call raised but something changed: maybe the effect is complete and only
                # the acknowledgement was lost. Believe the state, not the exception. (A timed
                # out attempt is not believed: like a Temporal activity, its late result is
                # discarded, its effect undone, and it is tried again.)
                verified = yield from self._postconditions_hold(quiet=True)
                if verified:
                    raise _Recovered(diff, error)
            reason = f"{type(error).__name__}: {error}"
            transient = (
                self.retry.is_transient(error) or self.ep.policy.decide(failure) is Decision.RETRY
            )
            raise (yield from self._undo(failure, reason, diff, retryable=transient))
        ctx.result = result
        outside = matcher.outside(diff)
        if outside:
            err = ScopeViolation(act.name, outside, txn_id=ctx.txn_id)
            retry = self.ep.policy.decide(FailureClass.SCOPE) is Decision.RETRY
            raise (
                yield from self._undo(
                    FailureClass.SCOPE, err.reason, diff, retryable=retry, error=err
                )
            )
        for name, check in act.postconditions:
            try:
                ok = yield from run_check(act, name, check, ctx, "postcondition")
            except CheckError as exc:
                self.errors.append(exc.error)
                raise (
                    yield from self._undo(FailureClass.SILENT, exc.reason, diff, error=exc)
                ) from exc
            if not ok:
                reason = f"postcondition {name!r} is false against the observed state"
                retry = self.ep.policy.decide(FailureClass.SILENT) is Decision.RETRY
                silent = ActionFailed(act.name, "silent", reason, txn_id=ctx.txn_id)
                raise (
                    yield from self._undo(
                        FailureClass.SILENT, reason, diff, retryable=retry, error=silent
                    )
                )
        try:
            self.result_json = act.encode_result(result)
        except (TypeError, ValueError) as exc:
            bad = NotSerializable(act.name, exc, txn_id=ctx.txn_id)
            raise (
                yield from self._undo(FailureClass.FAIL_STOP, bad.reason, diff, error=bad)
            ) from exc
        if not act.mutating:
            return result, {}
        return result, diff

    def _observe(self, concrete: list[str], diff: dict[str, tuple[Any, Any]]) -> None:
        ctx = self.ctx
        after = ctx.state.snapshot(concrete) if concrete else {}
        for key, (old, new) in diff.items():
            after[key] = new
            ctx.before.setdefault(key, old)
        ctx.after = after

    def recovered_result(self) -> Generator[Call | Sleep | Await, Any, Any]:
        """The result of an effect found present without its answer (None if not rebuildable)."""
        self.ctx.result = None
        hook = self.action.recovered_result
        if hook is None:
            return None
        try:
            result = yield Call(hook, (self.ctx,))
            self.result_json = self.action.encode_result(result)
        except Exception as exc:  # the effect stands; only the courtesy result is missing
            self.errors.append(exc)
            return None
        self.ctx.result = result
        return result

    def _postconditions_hold(self, *, quiet: bool) -> Generator[Call | Sleep | Await, Any, bool]:
        act = self.action
        if not act.postconditions:
            return False
        for name, check in act.postconditions:
            try:
                ok = yield from run_check(act, name, check, self.ctx, "postcondition")
            except CheckError:
                if quiet:
                    return False
                raise
            if not ok:
                return False
        return True

    def _undo(
        self,
        failure: FailureClass,
        reason: str,
        diff: dict[str, tuple[Any, Any]],
        *,
        retryable: bool = False,
        error: ActionFailed | None = None,
    ) -> Generator[Call | Sleep | Await, Any, _Failed]:
        """Revert this attempt's own effect where possible; classify what is left."""
        act = self.action
        exc = error or ActionFailed(act.name, str(failure), reason, txn_id=self.ctx.txn_id)
        if error is not None:
            self.errors.append(error)
        unsafe = act.mutating and not act.compensable and not act.safe_to_repeat
        if diff and self.unattributed:
            # Undoing a change that may be another program's (or the call's own, beside it)
            # would be a guess: a person decides.
            err = ScopeViolation(act.name, self.unattributed, txn_id=self.ctx.txn_id)
            if failure is not FailureClass.SCOPE:
                err.reason = f"{reason}; and it {err.reason}"
            self.errors.append(err)
            kept = (
                f"; {type(self.ctx.state).__name__} cannot tell which writer made a change, so "
                f"{', '.join(self.unattributed)} may be another program's: the harness undid "
                "nothing (leave other programs' files out with ignore=)"
            )
            return _Failed(
                FailureClass.SCOPE, err, retryable=False, effect_remains=True, diff=diff, kept=kept
            )
        if diff and self.others:
            # Another writer changed what this attempt changed: its own effect cannot be told
            # from theirs, and restoring before would erase theirs.
            clash = WriteConflict(
                act.name,
                sorted(self.others),
                self.others,
                "during the call",
                txn_id=self.ctx.txn_id,
            )
            clash.reason = f"{reason}; {clash.reason}"
            self.errors.append(clash)
            if not (act.compensable and act.undo_check is not None):
                return _Failed(
                    FailureClass.CONFLICT,
                    clash,
                    retryable=False,
                    effect_remains=True,
                    diff=diff,
                    kept="; nothing was undone",
                )
            failure, exc = FailureClass.CONFLICT, clash
            retryable = self.ep.policy.decide(FailureClass.CONFLICT) is Decision.RETRY
        if diff and act.compensable:
            try:
                self.semantic_undo = yield from compensate(act, self.ctx, diff)
            except WriteConflict as moved:
                self.errors.append(moved)
                self.others = moved.others
                moved.reason = f"{reason}; {moved.reason}"
                return _Failed(
                    FailureClass.CONFLICT,
                    moved,
                    retryable=False,
                    effect_remains=True,
                    diff=diff,
                    kept="; what is left is in the evidence"
                    if moved.restored
                    else "; nothing was undone",
                )
            except CompensationFailed as comp:
                self.errors.append(comp)
                comp.reason = f"{reason}; then {comp.reason}"
                return _Failed(
                    FailureClass.COMPENSATION,
                    comp,
                    retryable=False,
                    effect_remains=True,
                    diff=diff,
                )
            return _Failed(failure, exc, retryable=retryable and not unsafe)
        # A change left in the state forbids a retry, keyed or not: the next attempt would
        # apply the effect on top of it. Only a compensated, verified attempt is tried again.
        remains = bool(diff)
        return _Failed(
            failure,
            exc,
            retryable=retryable and not remains and not unsafe,
            effect_remains=remains or unsafe,
            diff=diff,
        )

    def _fail(self, failed: _Failed) -> Steps:
        """The policy's decision after the last attempt, recorded, then carried out."""
        ep, act = self.ep, self.action
        policy = ep.policy
        reason = failed.error.reason
        unsafe = act.mutating and not act.compensable and not act.safe_to_repeat
        if failed.failure_class is FailureClass.COMPENSATION:
            decision = Decision.ESCALATE
        elif failed.unobserved:
            decision = Decision.ESCALATE
            reason += "; what it left in the state is unknown"
        elif failed.diff:
            # Its change is still in the state: continuing would call that a failure with no
            # effect, and rolling back would call the episode undone. Only a person can say.
            decision = Decision.ESCALATE
            reason += failed.kept or (
                f"; its change to {', '.join(sorted(failed.diff))} is still in the state and "
                "the action has no compensation to undo it"
            )
        elif unsafe:
            decision = policy.unsafe
            reason += (
                "; the action changes state but has neither an idempotency key nor a "
                "compensation, so it can be neither retried nor undone safely"
            )
        else:
            decision = policy.decide(failed.failure_class)
            if decision is Decision.RETRY:
                decision = policy.exhausted
                reason += f"; gave up after {self.ctx.attempt} attempt(s)"
        if decision is Decision.ROLLBACK and ep.pivot is not None:
            decision = Decision.ESCALATE
            reason += f"; not rolled back: the pivot action {ep.pivot!r} has committed"
        error = failed.error
        error.decision = str(decision)
        error.reason = reason
        error.errors = list(self.errors)
        error.args = (
            f"action {act.name!r} failed ({failed.failure_class}, decision {decision}): {reason}",
        )
        ep.recorder.record_failure(self, failed.failure_class, decision, reason, failed.diff)
        if decision is Decision.ROLLBACK:
            yield from ep.rollback_steps(reason=f"{act.name}: {reason}", can_await=act.is_async)
        elif decision is Decision.ESCALATE:
            raise ep.recorder.escalate(self, failed.failure_class, reason, failed.diff)
        raise error
