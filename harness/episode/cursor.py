"""An episode's record as its agent saw it: the steps a re-execution is held to.

When an episode resumes (or is replayed), its agent's code runs again from the start. Every
call it makes is matched, in order, against the steps of the record: the actions it called
(with their arguments and outcome), the calls it repeated (deduplicated by key) and the values
it asked the episode to remember (tool reads, model responses). A step that matches gets its
recorded outcome back (a result, or the same error); the first step that does not match is a
:class:`Diverged` error naming the step, what the record has and what the agent did.

The record is rebuilt from the store (transaction rows and the hash-chained log) off the hot
path, so recording costs nothing beyond what the engine already writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._json import canonical, loads
from ..errors import (
    ActionFailed,
    CheckError,
    CompensationFailed,
    Diverged,
    HarnessError,
    PreconditionFailed,
    ScopeViolation,
)
from ..store import EscalationStatus, LogRow, TransactionRow, TxnStatus
from ..store.statuses import RETURNED

__all__ = ["IN_DOUBT_FIRST", "RecordCursor", "RecordedStep", "rebuilt_error", "recorded_steps"]

# How the refusal of a sync call while an async call is in doubt begins (see Episode): a
# refusal that depended on that moment is refused again on resume, not run.
IN_DOUBT_FIRST = "an async call of episode "

REMEMBERED = "recorded"
"""Log kind of a value an agent asked the episode to remember (``Episode.remember``)."""

# Log kinds that can open a transaction's records: its first record marks the agent's call.
_OPENING = frozenset(
    {"intent", "committed", "recovered", "precondition", "held", "invalid", "decision"}
)


@dataclass
class RecordedStep:
    """One step of an episode's record, as the agent made it.

    Attributes:
        step: its position (1-based) among the agent's steps.
        kind: ``action`` (a transaction), ``dedup`` (a repeated call answered from the record)
            or ``recorded`` (a value remembered for the agent: a tool read, a model response).
        name: the action's name, or what was remembered (``read``, ``model_call``).
        arguments: the action's arguments (``action``); None otherwise.
        key: the idempotency key (``action``, ``dedup``).
        request: what was asked (``recorded``).
        value: the remembered value (``recorded``).
        txn_id: the transaction (``action``, ``dedup``).
        status: the transaction's status, ``in_doubt`` for an intent without outcome.
        row: the transaction's row, when it has one.
        alt_arguments: the arguments the agent called with when a person's edit replaced them.
    """

    step: int
    kind: str
    name: str
    arguments: dict[str, Any] | None = None
    key: str = ""
    request: Any = None
    value: Any = None
    txn_id: str | None = None
    status: str = ""
    row: TransactionRow | None = field(default=None, repr=False)
    alt_arguments: dict[str, Any] | None = None

    @property
    def returned(self) -> bool:
        """Whether the agent received a result here (the action committed at the time)."""
        if self.kind == "dedup":
            return True
        row = self.row
        return row is not None and (row.status in RETURNED or row.step is not None)

    @property
    def result(self) -> Any:
        """The result the agent received (None when it got none)."""
        if self.kind == "recorded":
            return self.value
        row = self.row
        return loads(row.result) if row is not None and row.result else None

    @property
    def live(self) -> bool:
        """Whether the call must run again: in doubt, or held for a person's decision."""
        if self.kind != "action" or self.returned:
            return False
        return self.status == TxnStatus.IN_DOUBT or (
            self.row is not None and self.row.decision == "escalate"
        )

    def matches_action(self, name: str, values: Any, key: str) -> bool:
        """Whether a call of ``name`` with ``values`` (and ``key``) is this step."""
        if self.kind == "dedup":
            return self.name == name and self.key == key
        if self.kind != "action" or self.name != name or self.status == TxnStatus.INVALID:
            return False
        text = canonical(values)
        if canonical(self.arguments) == text:
            return True
        return self.alt_arguments is not None and canonical(self.alt_arguments) == text

    def describe(self) -> dict[str, Any]:
        """The step as JSON-ready data (for errors, audits and replay reports)."""
        out: dict[str, Any] = {"step": self.step, "kind": self.kind, "name": self.name}
        if self.kind == "recorded":
            out["request"] = self.request
        else:
            out["arguments"] = self.arguments
            out["key"] = self.key
            out["txn_id"] = self.txn_id
            out["status"] = self.status
        return out


def call_step(step: int, name: str, arguments: Any, key: str = "") -> dict[str, Any]:
    """What an agent did, in the shape :meth:`RecordedStep.describe` uses."""
    return {"step": step, "kind": "action", "name": name, "arguments": arguments, "key": key}


def recorded_steps(rows: Sequence[TransactionRow], log: Iterable[LogRow]) -> list[RecordedStep]:
    """The agent's steps in an episode's record, in the order it made them.

    A transaction is placed where its first log record is. Left out: intents abandoned after
    a crash (the call ran again as a new transaction, placed where the agent made it again),
    and escalated calls a person approved or edited (the transaction that carried out the
    decision stands in their place, matching the agent's original arguments too).
    """
    records = list(log)
    by_id = {r.id: r for r in rows}
    skip = {r.id for r in rows if r.status == TxnStatus.ABANDONED}
    # A resolution applied (approve or edit): the next transaction carries out the call.
    continues: dict[str, str] = {}
    waiting: str | None = None
    seen: set[str] = set()
    for rec in records:
        if rec.kind == "resolution_applied" and rec.txn_id:
            if loads(rec.payload).get("status") in (
                EscalationStatus.APPROVED,
                EscalationStatus.EDITED,
            ):
                waiting = rec.txn_id
        elif rec.txn_id and rec.txn_id not in seen and rec.kind in _OPENING:
            seen.add(rec.txn_id)
            if waiting is not None and rec.txn_id != waiting:
                continues[rec.txn_id] = waiting
                skip.add(waiting)
                waiting = None
    steps: list[RecordedStep] = []
    seen.clear()
    for rec in records:
        kind = rec.kind
        if kind == REMEMBERED:
            data = loads(rec.payload)
            steps.append(
                RecordedStep(
                    len(steps) + 1,
                    REMEMBERED,
                    str(data.get("what")),
                    request=data.get("request"),
                    value=data.get("value"),
                )
            )
        elif kind == "dedup":
            data = loads(rec.payload)
            if data.get("replay"):
                continue
            steps.append(
                RecordedStep(
                    len(steps) + 1,
                    "dedup",
                    str(data.get("action")),
                    key=str(data.get("key")),
                    txn_id=rec.txn_id,
                    status="dedup",
                    row=by_id.get(rec.txn_id or ""),
                )
            )
        elif rec.txn_id and rec.txn_id not in seen and kind in _OPENING:
            seen.add(rec.txn_id)
            if rec.txn_id in skip:
                continue
            row = by_id.get(rec.txn_id)
            if row is None:
                if kind != "intent":
                    continue
                data = loads(rec.payload)
                steps.append(
                    RecordedStep(
                        len(steps) + 1,
                        "action",
                        str(data.get("action")),
                        arguments=data.get("args") or {},
                        key=str(data.get("key")),
                        txn_id=rec.txn_id,
                        status=TxnStatus.IN_DOUBT,
                    )
                )
                continue
            origin = continues.get(row.id)
            steps.append(
                RecordedStep(
                    len(steps) + 1,
                    "action",
                    row.action,
                    arguments=loads(row.args) if row.args else {},
                    key=row.idem_key,
                    txn_id=row.id,
                    status=row.status,
                    row=row,
                    alt_arguments=(
                        loads(by_id[origin].args)
                        if origin in by_id
                        else _intent_args(records, origin)
                        if origin
                        else None
                    ),
                )
            )
    return steps


def _intent_args(records: Sequence[LogRow], txn_id: str) -> dict[str, Any] | None:
    for rec in records:
        if rec.kind == "intent" and rec.txn_id == txn_id:
            args = loads(rec.payload).get("args")
            return args if isinstance(args, dict) else None
    return None


def _rebuilt(cls: type[HarnessError], message: str, **attrs: Any) -> HarnessError:
    """An error of ``cls`` carrying exactly ``message`` (as the agent first saw it)."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    for name, value in attrs.items():
        setattr(error, name, value)
    return error


def rebuilt_error(row: TransactionRow) -> HarnessError:
    """The error a call's agent received, rebuilt from its row with the same message."""
    reason = row.reason or ""
    errors = [Exception(e) for e in loads(row.errors or "[]")]
    if row.status == TxnStatus.PRECONDITION:
        check, _, why = reason.partition(": ")
        return PreconditionFailed(row.action, check, why)
    if row.status == TxnStatus.CHECK_ERROR:
        return _rebuilt(
            CheckError,
            reason,
            action=row.action,
            failure_class="precondition",
            reason=reason,
            decision="continue",
            errors=errors,
            txn_id=row.id,
            check="",
            phase="precondition",
            error=errors[0] if errors else Exception(reason),
        )
    failure_class = row.failure_class or "fail_stop"
    decision = row.decision or "continue"
    classes: dict[str, type[ActionFailed]] = {
        "scope": ScopeViolation,
        "compensation": CompensationFailed,
    }
    cls = classes.get(failure_class, ActionFailed)
    return _rebuilt(
        cls,
        f"action {row.action!r} failed ({failure_class}, decision {decision}): {reason}",
        action=row.action,
        failure_class=failure_class,
        reason=reason,
        decision=decision,
        errors=errors,
        txn_id=row.id,
    )


class RecordCursor:
    """Where re-executed agent code is in its record: resume and replay hold it to each step.

    Args:
        episode_id: the episode.
        steps: its recorded steps (:func:`recorded_steps`).
        live_after: past the last step, the episode runs live (resume); otherwise anything
            more is a divergence (replay, where nothing executes).
        on_diverge: told of the divergence when it is found (resume records it).
    """

    def __init__(
        self,
        episode_id: str,
        steps: Sequence[RecordedStep],
        *,
        live_after: bool,
        on_diverge: Callable[[Diverged], None] | None = None,
    ) -> None:
        self.episode_id = episode_id
        self.steps = list(steps)
        self.at = 0
        self.live_after = live_after
        self.diverged: Diverged | None = None
        self._on_diverge = on_diverge

    def __bool__(self) -> bool:
        """Whether steps remain to be matched (False once the episode runs live)."""
        return bool(self.steps)

    def expect(
        self, actual: dict[str, Any], same: Callable[[RecordedStep], bool]
    ) -> RecordedStep | None:
        """The next step if ``same`` accepts it; None past the record when it goes live;
        otherwise :class:`Diverged` (raised, and raised again by every later call)."""
        if self.diverged is not None:
            raise self.diverged
        if self.at >= len(self.steps):
            if not self.live_after:
                raise self.diverge(None, {**actual, "step": self.at + 1})
            self.steps = []
            return None
        step = self.steps[self.at]
        if not same(step):
            raise self.diverge(step.describe(), {**actual, "step": step.step})
        self.at += 1
        return step

    def expect_call(self, name: str, values: Any, key: str) -> RecordedStep | None:
        """The next step if it is this call of action ``name`` (its arguments and key)."""
        return self.expect(
            call_step(self.at + 1, name, values, key),
            lambda s: s.matches_action(name, values, key),
        )

    def expect_invalid(self, name: str, arguments: Any) -> RecordedStep | None:
        """The next step if it is this call of ``name``, refused as invalid."""
        text = canonical(arguments)
        return self.expect(
            call_step(self.at + 1, name, arguments),
            lambda s: (
                s.kind == "action"
                and s.status == TxnStatus.INVALID
                and s.name == name
                and canonical(s.arguments) == text
            ),
        )

    def expect_remembered(self, what: str, request: Any) -> RecordedStep | None:
        """The next step if it is a value remembered for this ``request``."""
        text = canonical(request)
        return self.expect(
            {"step": self.at + 1, "kind": REMEMBERED, "name": what, "request": request},
            lambda s: s.kind == REMEMBERED and s.name == what and canonical(s.request) == text,
        )

    def refused_before(self, name: str, arguments: Any) -> str | None:
        """The reason the record gives for refusing this very call here, when the refusal
        depended on the moment (an async call then in doubt), so that it is refused again
        instead of run; None when the next step is something else."""
        if self.at >= len(self.steps):
            return None
        step = self.steps[self.at]
        row = step.row
        if (
            step.kind == "action"
            and step.status == TxnStatus.INVALID
            and step.name == name
            and row is not None
            and (row.reason or "").startswith(IN_DOUBT_FIRST)
            and canonical(step.arguments) == canonical(arguments)
        ):
            self.at += 1
            return row.reason
        return None

    def diverge(self, expected: dict[str, Any] | None, actual: dict[str, Any] | None) -> Diverged:
        """Record the divergence at ``expected``'s (or ``actual``'s) step and return it."""
        step = int((expected or actual or {}).get("step") or self.at + 1)
        self.diverged = Diverged(self.episode_id, step, expected, actual)
        if self._on_diverge is not None:
            self._on_diverge(self.diverged)
        return self.diverged

    def finish(self) -> None:
        """Raise :class:`Diverged` if the agent ended before the record does."""
        if self.diverged is None and self.at < len(self.steps):
            raise self.diverge(self.steps[self.at].describe(), None)
