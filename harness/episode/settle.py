"""The episode's settling of calls in doubt, and its memory rebuilt from its records.

A call is in doubt when its intent is recorded and its outcome is not: the process died in it,
the store refused its outcome, or it was cancelled. :class:`Settler` settles each against the
state (probe the postconditions, then commit as recovered, compensate a partial effect, run it
again when that is safe, or escalate), and on resume rebuilds the episode's memory from its
records (:meth:`Settler.load`).
"""

from __future__ import annotations

from typing import Any

from .._json import dumps, loads
from ..action import Action, Context
from ..clock import Clock
from ..errors import (
    CompensationFailed,
    Escalated,
    InvalidArguments,
    Rejected,
    StoreError,
)
from ..policy import Decision, FailureClass
from ..store import EpisodeStatus, EscalationRow, EscalationStatus, Store, TxnStatus
from ..store.statuses import RESOLVED_AS, RETURNED
from ..transaction import Host, Steps, Transaction, compensate, drive, is_undone
from .memory import Memory
from .recorder import Recorder
from .values import Committed, InDoubt

__all__ = ["Settler"]


def as_recorded(esc: EscalationRow, record: dict[str, Any] | None) -> EscalationRow:
    """``esc`` as its resolution record says it was decided (pending when none was recorded)."""
    if record is None:
        return esc.model_copy(
            update={
                "status": EscalationStatus.PENDING,
                "resolved_by": None,
                "resolution_reason": None,
                "edit": None,
            }
        )
    edit = record.get("edit")
    return esc.model_copy(
        update={
            "status": RESOLVED_AS.get(str(record.get("decision")), EscalationStatus.PENDING),
            "resolved_by": record.get("by"),
            "resolution_reason": record.get("reason") or "",
            "edit": None if edit is None else dumps(edit),
        }
    )


class Settler:
    """Settles one episode's calls in doubt and applies people's resolutions to its calls.

    Args:
        memory: the episode's memory.
        recorder: writes what settling decided.
        host: the episode the probing transactions belong to.
        store: the episode's store (read on resume).
        state: the episode's state adapter (probed).
        actions: the actions the episode knows, by name.
        clock: the episode's clock.
    """

    def __init__(
        self,
        memory: Memory,
        recorder: Recorder,
        host: Host,
        store: Store,
        state: Any,
        actions: dict[str, Action[Any, Any]],
        clock: Clock,
    ) -> None:
        self.m = memory
        self.rec = recorder
        self.host = host
        self.store = store
        self.state = state
        self.actions = actions
        self.clock = clock

    def load(self) -> None:
        """Rebuild the episode's memory from its records."""
        checkpoints = self.store.checkpoints(self.m.id)
        if checkpoints:
            self.m.steps, self.m.digest = checkpoints[-1].step, checkpoints[-1].digest
        rows = self.store.transaction_rows(self.m.id)
        log = self.store.log(self.m.id)
        finished = {r.id for r in rows}
        intents = [
            InDoubt.from_log(rec.txn_id, rec.payload, rec.ts)
            for rec in log
            if rec.kind == "intent" and rec.txn_id and rec.txn_id not in finished
        ]
        self.m.seq = max([r.seq for r in rows] + [i.seq for i in intents], default=0)
        for r in rows:
            if r.status in RETURNED:
                diff = {k: (v[0], v[1]) for k, v in loads(r.diff or "{}").items()}
                entry = Committed(
                    r.id,
                    r.action,
                    r.idem_key,
                    loads(r.result) if r.result else None,
                    r.args,
                    loads(r.before or "{}"),
                    diff,
                    r.step,
                    r.mutating,
                    compensated=r.status == TxnStatus.COMPENSATED,
                    impl=self.actions.get(r.action),
                    result_json=r.result or None,
                )
                self.m.committed.append(entry)
                if r.mutating and not entry.compensated:
                    self.m.done[r.idem_key] = entry
        for intent in intents:
            if intent.key not in self.m.done:
                self.m.in_doubt[intent.key] = intent
        # A person's decision is what its hashed resolution record says, never what the
        # escalation's row (which anyone with the database can edit) says now.
        decided = {
            loads(rec.payload).get("escalation_id"): loads(rec.payload)
            for rec in log
            if rec.kind == "resolution"
        }
        latest: dict[str, EscalationRow] = {}
        for esc in self.store.escalation_rows(episode_id=self.m.id):
            latest[esc.idem_key] = as_recorded(esc, decided.get(esc.id))
        starts = [(r.idem_key, r.started_at) for r in rows] + [(i.key, i.ts) for i in intents]
        for key, esc in latest.items():
            later = any(k == key and t > esc.created_at for k, t in starts)
            if not later:
                self.m.resolutions[key] = esc
        for entry in self.m.committed:
            if entry.impl is not None and entry.impl.pivot and not entry.compensated:
                self.m.pivot = entry.action
        self.m.by_txn = {e.txn_id: e for e in self.m.committed}
        # A compensation that started (its write-ahead record) but whose outcome is missing.
        started = {r.txn_id for r in log if r.kind == "compensating" and r.txn_id}
        self.m.compensating = started - {r.txn_id for r in log if r.kind == "compensated"}
        self.m.rolled_back = any(r.kind == "rolled_back" for r in log)

    def settle_in_doubt(self) -> None:
        """Settle in-doubt calls of known (sync) actions now, before the agent runs again.

        Their postconditions are probed against the state as the crash left it, before anything
        else changes it. Calls of unknown or async actions, and calls held for a person, are
        settled when the agent makes them again.
        """
        for key, intent in list(self.m.in_doubt.items()):
            action = self.actions.get(intent.action)
            if action is None or action.is_async:
                continue
            esc = self.m.resolutions.get(key)
            if esc is not None and esc.status in (
                EscalationStatus.PENDING,
                EscalationStatus.REJECTED,
            ):
                continue
            del self.m.in_doubt[key]
            try:
                drive(self.resolve_in_doubt(action, intent, approved=esc), self.clock)
            except InvalidArguments:
                self.m.in_doubt[key] = intent  # the action changed since: settle it when called
            except Escalated as exc:
                # Held for a person: the agent's call raises it when the agent gets there.
                # The episode itself runs on, and its row says so again.
                self.m.outcome = EpisodeStatus.RUNNING
                with self.rec.writer.batch():
                    self.rec.update_episode()
                self.m.in_doubt[key] = intent
                for row in self.store.escalation_rows(episode_id=self.m.id):
                    if row.id == exc.escalation_id:
                        self.m.resolutions[key] = row

    def settle_unsettled(self, can_await: bool) -> Steps:
        """Settle the calls whose outcome the store could not take (probe, compensate or
        escalate), before anything else runs; async ones wait for an async call."""
        for key, action in list(self.m.unsettled.items()):
            if action.is_async and not can_await:
                continue
            del self.m.unsettled[key]
            intent = self.m.in_doubt.pop(key, None)
            if intent is None:
                continue
            try:
                yield from self.resolve_in_doubt(action, intent)
            except StoreError:
                self.m.in_doubt[key] = intent
                self.m.unsettled[key] = action
                raise

    def apply_resolution(self, action: Action[Any, Any], model: Any, esc: EscalationRow) -> Steps:
        key = esc.idem_key
        if esc.status == EscalationStatus.PENDING:
            raise Escalated(
                esc.id, action.name, esc.failure_class, esc.reason, where=self.store.database
            )
        del self.m.resolutions[key]
        self.rec.note(
            "resolution_applied",
            esc.txn_id,
            {"escalation_id": esc.id, "status": esc.status, "by": esc.resolved_by},
        )
        if esc.status == EscalationStatus.REJECTED:
            self.m.resolutions[key] = esc
            raise Rejected(action.name, esc.resolved_by or "?", esc.resolution_reason or "")
        if esc.status == EscalationStatus.EDITED:
            return action.validate_mapping(loads(esc.edit or "{}"))
        return model
        yield  # pragma: no cover - makes this a generator

    def resolve_in_doubt(
        self, action: Action[Any, Any], row: InDoubt, *, approved: EscalationRow | None = None
    ) -> Steps:
        """An intent with no outcome (the process died in its transaction): probe, then decide.

        Its postconditions hold against the state: the effect happened, so it commits as
        recovered. Its scope is as the intent found it: the effect is absent, so it runs again
        if it is keyed or idempotent (or a person approved), else it escalates. Its scope changed
        but the postconditions fail: a partial effect, compensated first (escalated when the
        action has no compensation). Never a blind re-run.

        Returns:
            The recovered entry, or None when the call should run (again).
        """
        model = action.validate_mapping(dict(row.args))
        ctx = Context(action.name, model, self.state, self.m.id)
        ctx.idempotency_key, ctx.txn_id = row.key, row.id
        ctx.before = dict(row.before)
        for key, before in row.seen.items():  # (what its window saw, when this process has it)
            ctx.before.setdefault(key, before)
        ctx.after = self.state.snapshot(ctx.before)
        probe = Transaction(self.host, action, ctx)
        probe.args_json = dumps(row.args)
        probe.before_json = dumps(row.before)
        probe.started = row.ts
        changed = {
            k: (ctx.before[k], ctx.after[k]) for k in ctx.before if ctx.before[k] != ctx.after[k]
        }
        present = yield from probe._postconditions_hold(quiet=True)
        if present:
            result = yield from probe.recovered_result()
            return self.rec.commit_entry(probe, result, changed, recovered=True)
        note = ""
        undone = False
        if changed and action.undo_check is not None:
            # Undone by a reversing entry already (its compensation ran before the call was
            # cut short): the check says so, and the refund must not be posted twice.
            undone = not (yield from is_undone(action, ctx, changed))
            note = " (its effect found undone)" if undone else ""
        if changed and action.compensable and not undone:
            try:
                yield from compensate(action, ctx, changed)
            except CompensationFailed as exc:
                reason = (
                    f"in doubt (its outcome never recorded) with a partial effect; {exc.reason}"
                )
                raise self.rec.escalate(probe, FailureClass.COMPENSATION, reason, changed) from exc
            note = " (its partial effect compensated)"
        elif changed and approved is None and not undone:
            reason = (
                "in doubt (its outcome never recorded) with a partial effect: "
                f"{', '.join(sorted(changed))} changed but the postconditions do not hold, "
                "and the action has no compensation to undo it"
            )
            raise self.rec.escalate(probe, FailureClass.FAIL_STOP, reason, changed)
        elif changed:
            note = " (its partial effect left in place)"
        if approved is not None or action.safe_to_repeat:
            then = (
                f"it runs again as {approved.status} by {approved.resolved_by}"
                if approved is not None
                else "the keyed action runs again"
            )
            self.rec.record_failure(
                probe,
                FailureClass.FAIL_STOP,
                Decision.RETRY,
                f"in doubt (its outcome never recorded): the effect is absent{note}, so {then}",
                {},
                status=TxnStatus.ABANDONED,
            )
            return None
        reason = (
            "an earlier attempt may or may not have applied its effect (intent recorded, no "
            f"outcome), its postconditions do not show it{note}, and the action is neither "
            "idempotent nor keyed: running it again could apply it twice"
        )
        raise self.rec.escalate(probe, FailureClass.FAIL_STOP, reason, {})
