"""The episode's recorder: intents, outcomes, refusals, retries, failures, escalations.

Every record goes through the episode's store writer; :class:`Recorder` keeps the episode's
:class:`~.memory.Memory` in step with what it wrote (steps, digest, what committed, what is in
doubt). ``record_intent`` and ``commit_entry`` are the hot path: every call of an action goes
through them, so they build their rows and payloads as text.
"""

from __future__ import annotations

import hashlib
import time
from json.encoder import encode_basestring as _quote
from typing import Any

from .._json import digest, dumps, loads, storable
from ..clock import Clock
from ..errors import ConfigurationError, Escalated, HarnessError, StoreError
from ..policy import Decision, FailureClass
from ..store import EpisodeStatus, EscalationStatus, TxnStatus
from ..store.tables import transaction_row
from ..transaction import Transaction
from .memory import Memory
from .values import Committed, InDoubt, _jsonable

__all__ = ["Recorder"]


class Recorder:
    """Writes one episode's records and keeps its memory in step with them.

    Args:
        memory: the episode's memory.
        clock: the episode's clock (durations).

    Attributes:
        writer: the store writer while the episode is open (None otherwise).
        log: the episode's structured log (JSON lines).
    """

    def __init__(self, memory: Memory, clock: Clock) -> None:
        self.m = memory
        self.clock = clock
        self.writer: Any = None
        self.log: Any = None

    def note(self, kind: str, txn_id: str | None, payload: dict[str, Any]) -> None:
        """One log record and the episode's row, in one batch."""
        with self.writer.batch():
            self.writer.append(kind, txn_id, payload)
            self.update_episode()

    def note_text(self, kind: str, txn_id: str | None, payload: str) -> None:
        """:meth:`note` for a payload that is JSON text already."""
        with self.writer.batch():
            self.writer.append_text(kind, txn_id, payload)
            self.update_episode()

    def note_hot(self, kind: str, payload: str) -> None:
        """One record of no transaction (a remembered value), JSON text already, committed on
        its own as an intent is: a single-row append, the episode's row (its witness) moved by
        the next batch (steps and digest are unchanged by such a record)."""
        self.writer.hot(kind, None, payload)

    # --- records (the hot path) ---
    def update_episode(self) -> None:
        self.writer.update_episode(status=self.m.outcome, steps=self.m.steps, digest=self.m.digest)

    def record_simple(self, action: str, key: str, args: str, status: str, reason: str) -> None:
        args, reason = _jsonable(loads(args)), storable(reason)
        self.m.seq += 1
        now = time.time()
        row = transaction_row(
            episode_id=self.m.id,
            seq=self.m.seq,
            action=action,
            idem_key=key,
            args=args,
            status=status,
            mutating=False,
            failure_class="precondition" if status != TxnStatus.INVALID else None,
            decision="continue",
            reason=reason,
            started_at=now,
            ended_at=now,
            duration=0.0,
        )
        txn_id = row["id"]
        with self.writer.batch():
            self.writer.insert_txn(row)
            self.writer.append(status, txn_id, {"action": action, "reason": reason})
            self.update_episode()
        self.log.info(status, txn_id=txn_id, action=action, reason=reason)

    def record_refusal(
        self, txn: Transaction, status: str, reason: str, decision: Decision = Decision.CONTINUE
    ) -> None:
        """A precondition was false or raised (or the call is held for approval): nothing ran."""
        ctx = txn.ctx
        self._seq_row(txn, status, reason, str(decision))
        self.log.info("precondition_failed", txn_id=ctx.txn_id, action=ctx.action, check=reason)

    def _txn_row(self, txn: Transaction, **fields: Any) -> dict[str, Any]:
        """A transaction row: the call's identity, then ``fields`` (outcome, timings...)."""
        ctx = txn.ctx
        identity: dict[str, Any] = {
            "action": ctx.action,
            "idem_key": ctx.idempotency_key,
            "args": txn.args_json or dumps(txn.values),
            "before": txn.before_json,
            "mutating": txn.action.mutating,
            "started_at": txn.started,
        }
        return transaction_row(episode_id=self.m.id, seq=txn.seq, **{**identity, **fields})

    def _seq_row(self, txn: Transaction, status: str, reason: str, decision: str) -> None:
        held = status == TxnStatus.HELD
        ctx = txn.ctx
        now = time.time()
        with self.writer.batch():
            self.writer.insert_txn(
                self._txn_row(
                    txn,
                    before=None,
                    status=status,
                    failure_class="approval" if held else "precondition",
                    decision=decision,
                    reason=reason,
                    errors="[]",
                    started_at=now,
                    ended_at=now,
                    duration=0.0,
                )
            )
            self.writer.append(
                "held" if held else "precondition",
                ctx.txn_id,
                {"action": ctx.action, "check": reason, "decision": decision},
            )
            self.update_episode()
        txn.recorded = True
        if txn.observed is not None:
            txn.observed.refused(status, "approval" if held else "precondition", decision, reason)

    def record_intent(self, txn: Transaction) -> None:
        """Write-ahead: the intent is durable before the tool runs.

        The intent is one log record (action, key, arguments, the scoped before snapshot, the
        start time), written as its own database transaction: one single-row append.
        """
        ctx = txn.ctx
        args = txn.args_json = txn.args_json or txn.action.encode_args(ctx.args)
        try:
            txn.before_json = dumps(ctx.before) if ctx.before else "{}"
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"the state's values of {', '.join(sorted(ctx.before))} cannot be recorded as "
                f"JSON ({exc}); nothing ran. Keep resources JSON values (str, numbers, bools, "
                "None, lists, dicts with str keys)"
            ) from None
        written = self.writer.seq
        try:
            self.writer.hot(
                "intent",
                ctx.txn_id,
                f'{{"action":{_quote(ctx.action)},"key":{_quote(ctx.idempotency_key)},'
                f'"args":{args},"before":{txn.before_json},"started":{txn.started!r}}}',
            )
        finally:
            # (Ctrl-C can arrive just after the record landed: it is written all the same.)
            txn.intended = self.writer.seq != written

    def leave_in_doubt(self, txn: Transaction, error: BaseException) -> StoreError:
        """The tool ran but its outcome could not be recorded: remember the call as in doubt,
        to be settled against the state on the episode's next call (or its end, or resume)."""
        ctx = txn.ctx
        intent = InDoubt(
            ctx.txn_id,
            ctx.action,
            ctx.idempotency_key,
            loads(txn.args_json),
            loads(txn.before_json),
            txn.started,
            dict(txn.seen),
        )
        self.m.in_doubt[ctx.idempotency_key] = intent
        self.m.unsettled[ctx.idempotency_key] = txn.action
        self.log.warning(
            "in_doubt", txn_id=ctx.txn_id, action=ctx.action, error=f"{type(error).__name__}"
        )
        return StoreError(
            f"the outcome of action {ctx.action!r} ({ctx.txn_id}) could not be recorded "
            f"({error}); the call is in doubt: the episode settles it against the state (probe, "
            "compensate or escalate) before its next call, at its end, or on resume"
        )

    def leave_unrecorded(self, txn: Transaction, error: BaseException) -> StoreError:
        """The store refused a record of a call that changed nothing (its intent, so the tool
        did not run; or a read's outcome): the call is recorded as failed by the episode's next
        write, so the log still has every call, in order."""
        ctx = txn.ctx
        what = (
            "the tool did not run"
            if ctx.attempt == 0
            else "the read-only call's result did not reach the agent"
        )
        why = (
            "the store could not record this call"
            if isinstance(error, StoreError)
            else "refused"
            if isinstance(error, HarnessError)
            else f"cut short ({type(error).__name__})"
        )
        reason = f"{why} ({error}); {what}"
        self.m.unrecorded.append((txn, reason))
        return StoreError(
            f"action {ctx.action!r} ({ctx.txn_id}): {reason}; it is recorded as failed with the "
            "episode's next write"
        )

    def flush_unrecorded(self) -> None:
        """Record the calls the store refused earlier (see :meth:`leave_unrecorded`)."""
        while self.m.unrecorded:
            txn, reason = self.m.unrecorded[0]
            self.record_failure(txn, FailureClass.FAIL_STOP, Decision.CONTINUE, reason, {})
            self.m.unrecorded.pop(0)

    def record_retry(self, txn: Transaction, delay: float) -> None:
        """A retry decision, logged with the error that caused it."""
        last = txn.errors[-1] if txn.errors else None
        if txn.observed is not None:
            txn.observed.retrying(txn.ctx.attempt, delay, last)
        self.note(
            "decision",
            txn.ctx.txn_id,
            {
                "decision": "retry",
                "attempt": txn.ctx.attempt,
                "wait": delay,
                "reason": f"{type(last).__name__}: {last}" if last else "",
            },
        )
        self.log.info(
            "retry",
            txn_id=txn.ctx.txn_id,
            action=txn.ctx.action,
            attempt=txn.ctx.attempt,
            wait=delay,
        )

    def record_commit(
        self, txn: Transaction, result: Any, diff: dict[str, tuple[Any, Any]], *, recovered: bool
    ) -> None:
        """Commit: the outcome, the diff and a compact checkpoint, in one database transaction."""
        self.commit_entry(txn, result, diff, recovered=recovered)

    def commit_entry(
        self,
        txn: Transaction,
        result: Any,
        diff: dict[str, tuple[Any, Any]],
        *,
        recovered: bool,
    ) -> Committed:
        ctx, act = txn.ctx, txn.action
        duration = float(self.clock.now() - txn.t0)  # (a user clock may return numpy floats)
        diff_json = dumps({k: [b, a] for k, (b, a) in diff.items()}) if diff else "{}"
        errors = _jsonable([f"{type(e).__name__}: {e}" for e in txn.errors]) if txn.errors else "[]"
        step: int | None = None
        digest = self.m.digest
        # The record is the outcome: the transaction row and the checkpoint are its projection
        # (harness.store.projection), written with the episode's next batch. It is assembled
        # as text: it is on the hot path, and every part is JSON already.
        if act.mutating:
            step = self.m.steps + 1
            digest = hashlib.sha256(f"{self.m.digest}{diff_json}".encode()).hexdigest()
            args, before = txn.args_json, txn.before_json
            call = f'"step":{step},"digest":"{digest}"'
        else:
            args = txn.args_json or dumps(txn.values)
            before = dumps(ctx.before) if ctx.before else "{}"
            call = (
                f'"step":null,"digest":null,"key":{_quote(ctx.idempotency_key)},'
                f'"args":{args},"before":{before},"started":{txn.started!r}'
            )
        # Its text, not the enum: the row and the records the writer holds until the rows are
        # written then hold only plain values, which the cyclic GC stops tracking (an enum
        # member in them kept three objects an action alive in its generations).
        status = (TxnStatus.RECOVERED if recovered else TxnStatus.COMMITTED).value
        # The row the record projects to (harness.store.projection.committed_row), from the
        # texts at hand; the writer adds the record's time as ended_at.
        row = transaction_row(
            episode_id=self.m.id,
            seq=txn.seq,
            action=ctx.action,
            idem_key=ctx.idempotency_key,
            args=args,
            before=before,
            mutating=act.mutating,
            status=status,
            result=txn.result_json,
            diff=diff_json,
            attempts=ctx.attempt,
            errors=errors,
            started_at=txn.started,
            duration=duration,
            step=step,
        )
        written = self.writer.seq
        txn.recorded = False
        try:
            self.writer.hot(
                status,
                ctx.txn_id,
                f'{{"action":{_quote(ctx.action)},{call},"attempts":{ctx.attempt},'
                f'"duration":{duration!r},"result":{txn.result_json},"diff":{diff_json},'
                f'"errors":{errors}}}',
                (row, None if step is None else digest),
            )
        except BaseException:
            # Interrupted (Ctrl-C) after the record was written: the episode remembers the
            # commit as the log has it, then the interruption goes on.
            if self.writer.seq != written:
                txn.recorded = True
                self._remember_commit(txn, result, diff, step, digest)
            raise
        txn.recorded = True
        entry = self._remember_commit(txn, result, diff, step, digest)
        if txn.observed is not None:
            txn.observed.committed(status, step)
        self.log.later(
            status,
            txn_id=ctx.txn_id,
            action=ctx.action,
            step=step,
            attempts=ctx.attempt,
            duration=duration,
        )
        return entry

    def _remember_commit(
        self,
        txn: Transaction,
        result: Any,
        diff: dict[str, tuple[Any, Any]],
        step: int | None,
        digest: str,
    ) -> Committed:
        """The episode's memory of a written commit: step, digest, dedup and rollback entry."""
        ctx, act = txn.ctx, txn.action
        if step is not None:
            self.m.steps, self.m.digest = step, digest
        entry = Committed(
            ctx.txn_id,
            ctx.action,
            ctx.idempotency_key,
            result,
            txn.args_json or txn.action.encode_args(ctx.args),
            ctx.before,
            diff,
            step,
            act.mutating,
            impl=act,
            result_json=txn.result_json,
        )
        self.m.committed.append(entry)
        if act.mutating:
            self.m.done[ctx.idempotency_key] = entry
            if act.pivot:
                self.m.pivot = act.name
        return entry

    def record_failure(
        self,
        txn: Transaction,
        failure_class: FailureClass,
        decision: Decision,
        reason: str,
        diff: dict[str, tuple[Any, Any]],
        *,
        existing: bool = False,
        status: str = TxnStatus.FAILED,
    ) -> None:
        """The transaction did not commit (or its undo failed): its class, the decision, why."""
        ctx = txn.ctx
        now = time.time()
        left = dumps({k: [b, a] for k, (b, a) in diff.items()}) if diff else None
        fields = {
            "status": status,
            "failure_class": str(failure_class),
            "decision": str(decision),
            "reason": reason,
            "attempts": ctx.attempt,
            "errors": _jsonable([f"{type(e).__name__}: {e}" for e in txn.errors]),
            "diff": left,
            "ended_at": now,
            "duration": self.clock.now() - txn.t0,
        }
        with self.writer.batch():
            if existing:
                # A committed call whose undo failed: the row keeps what its commit record
                # says (result, diff, errors, times) and takes the decision record's fields.
                decided = ("status", "failure_class", "decision", "reason")
                self.writer.update_txn(ctx.txn_id, {k: fields[k] for k in decided})
            else:
                self.writer.insert_txn(self._txn_row(txn, **fields))
            self.writer.append(
                "decision",
                ctx.txn_id,
                {
                    "action": ctx.action,
                    "failure_class": str(failure_class),
                    "decision": str(decision),
                    "reason": reason,
                    "attempts": ctx.attempt,
                    **({"undo": "semantic"} if txn.semantic_undo else {}),
                    # What the failed call left changed, under the chain (a committed call's
                    # row keeps its commit record's diff).
                    **({} if existing else {"diff": None if left is None else loads(left)}),
                },
            )
            self.update_episode()
        txn.recorded = True
        if txn.observed is not None:
            txn.observed.failed(status, str(failure_class), str(decision), reason)
        self.log.warning(
            "failed",
            txn_id=ctx.txn_id,
            action=ctx.action,
            failure_class=str(failure_class),
            decision=str(decision),
            reason=reason,
        )

    def escalate(
        self,
        txn: Transaction,
        failure_class: FailureClass | str,
        reason: str,
        diff: dict[str, tuple[Any, Any]],
    ) -> Escalated:
        """Store an escalation (what, why, the evidence), pause the episode, return the error."""
        ctx, act = txn.ctx, txn.action
        args = txn.args_json or act.encode_args(ctx.args)
        evidence = {
            "args_digest": digest(loads(args)),
            "before": ctx.before,
            "after": ctx.after,
            "diff": {k: [b, a] for k, (b, a) in diff.items()},
            "errors": [f"{type(e).__name__}: {e}" for e in txn.errors],
            "attempts": ctx.attempt,
            "step": self.m.steps,
            "digest": self.m.digest,
        }
        if getattr(txn, "others", None):
            # Another writer's change to what the call changed: [before theirs, now].
            evidence["others"] = txn.others
        self.m.outcome = EpisodeStatus.ESCALATED
        evidence_json = _jsonable(evidence)
        held = {
            "action": act.name,
            "idem_key": ctx.idempotency_key,
            "failure_class": str(failure_class),
            "reason": reason,
            "deadline": None,
            "fallback": "reject",
        }
        with self.writer.batch():
            esc_id = self.writer.insert_escalation(
                {
                    **held,
                    "episode_id": self.m.id,
                    "txn_id": ctx.txn_id,
                    "args": args,
                    "evidence": evidence_json,
                    "status": EscalationStatus.PENDING,
                    "created_at": time.time(),
                }
            )
            # Everything a person's decision reads is under the chain: the arguments to
            # approve, the evidence (by digest), the deadline and what happens after it.
            self.writer.append(
                "escalation",
                ctx.txn_id,
                {
                    **held,
                    "escalation_id": esc_id,
                    "args": loads(args),
                    "evidence": digest(loads(evidence_json)),
                },
            )
            self.update_episode()
        self.m.escalation_id = esc_id
        if txn.observed is not None:
            txn.observed.escalated(esc_id)
        self.log.warning(
            "escalated",
            txn_id=ctx.txn_id,
            action=act.name,
            escalation_id=esc_id,
            failure_class=str(failure_class),
            reason=reason,
        )
        return Escalated(esc_id, act.name, str(failure_class), reason, where=self.writer.database)
