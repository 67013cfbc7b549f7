"""Injected fault events, and how the harness's records judge them and the trial's effects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .._json import canonical, dumps, loads
from ..store import (
    EscalationRow,
    EscalationStatus,
    FaultEventRow,
    LogRow,
    TransactionRow,
    TxnStatus,
)
from ..store.statuses import APPLIED
from ..transaction import observed_changes

__all__ = [
    "FaultEvent",
    "TrialFaults",
    "account",
    "judge",
]


# --------------------------------------------------------------------------------------------
# Events and the trial's accounting.
# --------------------------------------------------------------------------------------------


@dataclass
class FaultEvent:
    """One injected fault, and (after :meth:`Injector.finish`) what the harness made of it.

    Times (``at``, ``end``, ``detect_latency``, ``recover_time``) are on the trial's clock;
    ``wall`` and ``wall_end`` are Unix time, to line events up with the store's records.
    """

    id: str
    fault: str
    kind: str
    tool: str
    instance: str
    episode_id: str
    task_id: str | None
    trial: int | None
    txn_id: str | None
    attempt: int | None
    call: int
    at: float
    wall: float
    end: float = 0.0
    wall_end: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    detected: bool = False
    detected_as: str | None = None
    decision: str | None = None
    detect_latency: float | None = None
    recovered: bool = False
    recover_time: float | None = None
    re_executed: int = 0

    def row(self, run_id: str | None) -> FaultEventRow:
        """The event as a store row."""
        return FaultEventRow(
            id=self.id,
            run_id=run_id,
            episode_id=self.episode_id,
            task_id=self.task_id,
            trial=self.trial,
            fault=self.fault,
            kind=self.kind,
            tool=self.tool,
            instance=self.instance,
            txn_id=self.txn_id,
            attempt=self.attempt,
            call=self.call,
            at=self.at,
            wall=self.wall,
            detail=dumps(self.detail),
            detected=self.detected,
            detected_as=self.detected_as,
            decision=self.decision,
            detect_latency=self.detect_latency,
            recovered=self.recovered,
            recover_time=self.recover_time,
            re_executed=self.re_executed,
        )


@dataclass
class _Execution:
    """One run of a real write (``do``) or of its undo, for counting re-applied effects."""

    key: str
    op: Literal["do", "undo"]
    keys: list[str]


@dataclass
class TrialFaults:
    """One trial's faults and its effects, judged against the harness's records.

    Attributes:
        events: the injected faults, judged.
        crashes: injected worker deaths (each one resumed by the runner).
        planned: whether a planned interruption hit the trial.
        executions: runs of real writes that changed state.
        duplicated: writes applied again while their earlier effect stood (same idempotency
            key, no undo in between).
        lost: resources a committed transaction changed that are back at their original value.
        diverged: resources whose final value is neither what the committed transactions left
            nor the original.
        unaccounted: resources changed that no committed transaction (nor a pending escalation)
            accounts for.
        held: resources left for a person by a pending escalation.
    """

    events: list[FaultEvent]
    crashes: int = 0
    planned: bool = False
    executions: int = 0
    duplicated: int = 0
    lost: int = 0
    diverged: int = 0
    unaccounted: int = 0
    held: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """No effect duplicated, lost, diverged or unaccounted for."""
        return not (self.duplicated or self.lost or self.diverged or self.unaccounted)


def account(
    state: Any,
    mark: Any,
    ledger: list[_Execution],
    txns: list[TransactionRow],
    escalations: list[EscalationRow],
    *,
    events: list[FaultEvent],
    crashes: int,
    planned: bool,
) -> TrialFaults:
    """Compare the trial's final state with what its committed transactions account for."""
    committed = sorted(
        (t for t in txns if t.mutating and t.status in APPLIED),
        key=lambda t: t.seq,
    )
    expected: dict[str, Any] = {}
    for t in committed:
        for key, (_, after) in loads(t.diff or "{}").items():
            expected[key] = after
    actual = observed_changes(state, mark) if mark is not None else {}
    held: set[str] = set()
    for esc in escalations:
        if esc.status == EscalationStatus.PENDING:
            held |= set(loads(esc.evidence or "{}").get("diff") or {})
    lost: list[str] = []
    diverged: list[str] = []
    unaccounted: list[str] = []
    holding: list[str] = []
    for key, want in expected.items():
        if key in actual:
            original, now = actual[key]
        else:
            original = now = state.get(key)
        if canonical(now) == canonical(want):
            continue
        if key in held:
            holding.append(key)
        elif canonical(now) == canonical(original):
            lost.append(key)
        else:
            diverged.append(key)
    for key in actual:
        if key not in expected:
            (holding if key in held else unaccounted).append(key)
    applied: Counter[str] = Counter()
    duplicated, executions = [], 0
    for x in ledger:
        if x.op == "undo":
            applied[x.key] = 0
        elif x.keys:
            executions += 1
            if applied[x.key]:
                duplicated.append(x.key)
            applied[x.key] += 1
    per_key = Counter(t.idem_key for t in committed)
    twice = sorted(k for k, n in per_key.items() if n > 1)
    return TrialFaults(
        events=events,
        crashes=crashes,
        planned=planned,
        executions=executions,
        duplicated=len(duplicated) + len([k for k in twice if k not in duplicated]),
        lost=len(lost),
        diverged=len(diverged),
        unaccounted=len(unaccounted),
        held=len(holding),
        detail={
            "lost": sorted(lost),
            "diverged": sorted(diverged),
            "unaccounted": sorted(unaccounted),
            "held": sorted(holding),
            "duplicated": sorted(set(duplicated) | set(twice)),
        },
    )


# --------------------------------------------------------------------------------------------
# Judging an event against the harness's records.
# --------------------------------------------------------------------------------------------

_DETECTIONS = frozenset({"decision", "recovered", "escalation"})
_RECOVERIES = frozenset({"committed", "recovered"})
_RAISES = frozenset({"fail_stop", "correlated", "planned", "lost_ack"})


def judge(
    event: FaultEvent,
    txns: Iterable[TransactionRow],
    logs: Iterable[LogRow],
    clock_at: Callable[[float], float],
) -> None:
    """Fill in what the harness made of ``event``, from its transaction rows and its log.

    The harness *detected* the fault when it did not commit the faulted attempt as if nothing
    happened: it retried after it (the log holds a retry decision for that attempt), recorded
    the transaction as failed on that attempt (with its class and decision), committed it as
    ``recovered`` (the raise was seen and the effect verified), or resolved it as in doubt on
    resume. A retried attempt that returned normally within its timeout was necessarily
    rejected by a postcondition (the only retryable failure that raises nothing), so it counts
    as ``silent``.
    """
    if event.txn_id is None:
        return  # a plain call: no transaction took it, nothing of the harness's to judge
    rows = list(txns)
    logs = list(logs)
    txn = next((t for t in rows if t.id == event.txn_id), None)
    if txn is None:
        return
    errors = [str(e) for e in loads(txn.errors or "[]")]
    crash = event.kind == "lost_ack" and event.detail.get("then") == "crash"
    # The log's retry decisions name the attempt that failed: better evidence than the row's
    # attempt count, which a transaction resolved in doubt after a crash restarts from 0.
    retried = any(
        rec.kind == "decision"
        and rec.txn_id == event.txn_id
        and loads(rec.payload).get("decision") == "retry"
        and loads(rec.payload).get("attempt") == event.attempt
        for rec in logs
    )
    if crash:
        if txn.status == TxnStatus.RECOVERED:
            event.detected, event.detected_as, event.decision = True, "in_doubt", "recover"
        elif txn.status == TxnStatus.ABANDONED:
            event.detected, event.detected_as, event.decision = True, "in_doubt", "retry"
            event.re_executed = 1
        elif txn.status == TxnStatus.FAILED:
            event.detected, event.detected_as, event.decision = True, "in_doubt", txn.decision
    elif retried:
        event.detected, event.decision, event.re_executed = True, "retry", 1
        if event.kind == "fail_slow" or event.detail.get("delay") is not None:
            event.detected_as = "fail_slow"
        elif event.kind in _RAISES:
            event.detected_as = "fail_stop"  # the engine's class for any raise within time
        else:
            event.detected_as = "silent"
    elif txn.status == TxnStatus.RECOVERED and (txn.attempts or 0) in (0, event.attempt):
        event.detected, event.detected_as, event.decision = True, "lost_ack", "recover"
    elif txn.status == TxnStatus.FAILED and txn.attempts == event.attempt:
        event.detected, event.detected_as, event.decision = True, txn.failure_class, txn.decision
    if event.kind == "planned" and any(
        event.id in e and "PlannedInterruption" in e for e in errors
    ):
        # The engine classifies any raise as fail_stop; the run was told of this window in
        # advance, and the recorded error is the announced refusal, so it is a planned one.
        event.detected_as = "planned"
    seen = _first(logs, event.txn_id, event.wall_end, _DETECTIONS)
    if event.detected and seen is not None:
        event.detect_latency = max(clock_at(seen.ts) - event.at, 0.0)
    fixed = txn
    if txn.status not in APPLIED:
        fixed = next(
            (
                t
                for t in rows
                if t.idem_key == txn.idem_key and t.seq > txn.seq and t.status in APPLIED
            ),
            txn,
        )
    if fixed.status in APPLIED and event.detected:
        event.recovered = True
        done = _first(logs, fixed.id, event.wall_end, _RECOVERIES)
        if done is not None:
            event.recover_time = max(clock_at(done.ts) - event.at, 0.0)


def _first(logs: list[LogRow], txn_id: str, after: float, kinds: frozenset[str]) -> LogRow | None:
    for rec in logs:
        if rec.txn_id == txn_id and rec.kind in kinds and rec.ts >= after:
            return rec
    return None
