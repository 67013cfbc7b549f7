"""The episode's resume: its memory rebuilt from its records, calls in doubt settled, the
agent's re-executed calls held to its record (:mod:`harness.episode.cursor`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .._json import canonical, dumps, loads
from ..action import Action, Context
from ..errors import (
    CompensationFailed,
    ConfigurationError,
    Diverged,
    Escalated,
    InvalidArguments,
    Rejected,
    StoreError,
)
from ..policy import Decision, FailureClass
from ..store import EscalationRow, Store
from ..transaction import Steps, Transaction, compensate, drive, is_undone
from .cursor import REMEMBERED, RecordedStep, call_step, rebuilt_error
from .rollback import _Rollback
from .values import Committed, InDoubt, _jsonable

if TYPE_CHECKING:
    from .core import Episode


# How the refusal of a sync call while an async call is in doubt begins (see Episode).
IN_DOUBT_FIRST = "an async call of episode "


class _Resume(_Rollback):
    """Resumes the episode from its records and replays what they hold (mixed into
    :class:`Episode`)."""

    store: Store
    _in_doubt: dict[str, InDoubt]
    _resolutions: dict[str, EscalationRow]
    _by_txn: dict[str, Committed]
    _record: list[RecordedStep]
    _at: int
    _diverged: Diverged | None

    # --- resume ---
    def _load(self) -> None:
        """Rebuild the episode's memory from its records."""
        checkpoints = self.store.checkpoints(self.id)
        if checkpoints:
            self.steps, self.digest = checkpoints[-1].step, checkpoints[-1].digest
        rows = self.store.transactions(self.id)
        log = self.store.log(self.id)
        finished = {r.id for r in rows}
        intents = [
            InDoubt.from_log(rec.txn_id, rec.payload, rec.ts)
            for rec in log
            if rec.kind == "intent" and rec.txn_id and rec.txn_id not in finished
        ]
        self._seq = max([r.seq for r in rows] + [i.seq for i in intents], default=0)
        for r in rows:
            if r.status in ("committed", "recovered", "compensated"):
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
                    compensated=r.status == "compensated",
                    impl=self._actions.get(r.action),
                    result_json=r.result or None,
                )
                self.committed.append(entry)
                if r.mutating and not entry.compensated:
                    self._done[r.idem_key] = entry
        for intent in intents:
            if intent.key not in self._done:
                self._in_doubt[intent.key] = intent
        latest: dict[str, EscalationRow] = {}
        for esc in self.store.escalations(episode_id=self.id):
            latest[esc.idem_key] = esc
        starts = [(r.idem_key, r.started_at) for r in rows] + [(i.key, i.ts) for i in intents]
        for key, esc in latest.items():
            later = any(k == key and t > esc.created_at for k, t in starts)
            if not later:
                self._resolutions[key] = esc
        for entry in self.committed:
            if entry.impl is not None and entry.impl.pivot and not entry.compensated:
                self.pivot = entry.action
        self._by_txn = {e.txn_id: e for e in self.committed}
        # A compensation that started (its write-ahead record) but whose outcome is missing.
        started = {r.txn_id for r in log if r.kind == "compensating" and r.txn_id}
        self._compensating = started - {r.txn_id for r in log if r.kind == "compensated"}
        self._rolled_back = any(r.kind == "rolled_back" for r in log)

    def _settle_in_doubt(self) -> None:
        """Settle in-doubt calls of known (sync) actions now, before the agent runs again.

        Their postconditions are probed against the state as the crash left it, before anything
        else changes it. Calls of unknown or async actions, and calls held for a person, are
        settled when the agent makes them again.
        """
        for key, intent in list(self._in_doubt.items()):
            action = self._actions.get(intent.action)
            if action is None or action.is_async:
                continue
            esc = self._resolutions.get(key)
            if esc is not None and esc.status in ("pending", "rejected"):
                continue
            del self._in_doubt[key]
            try:
                drive(self._resolve_in_doubt(action, intent, approved=esc), self.clock)
            except InvalidArguments:
                self._in_doubt[key] = intent  # the action changed since: settle it when called
            except Escalated as exc:
                # Held for a person: the agent's call raises it when the agent gets there.
                # The episode itself runs on, and its row says so again.
                self.outcome = "running"
                with self._writer.batch():
                    self._update_episode()
                self._in_doubt[key] = intent
                for row in self.store.escalations(episode_id=self.id):
                    if row.id == exc.escalation_id:
                        self._resolutions[key] = row

    def _settle_unsettled(self, can_await: bool) -> Steps:
        """Settle the calls whose outcome the store could not take (probe, compensate or
        escalate), before anything else runs; async ones wait for an async call."""
        for key, action in list(self._unsettled.items()):
            if action.is_async and not can_await:
                continue
            del self._unsettled[key]
            intent = self._in_doubt.pop(key, None)
            if intent is None:
                continue
            try:
                yield from self._resolve_in_doubt(action, intent)
            except StoreError:
                self._in_doubt[key] = intent
                self._unsettled[key] = action
                raise

    # --- replay (on resume) ---
    def _expect(
        self, actual: dict[str, Any], same: Callable[[RecordedStep], bool]
    ) -> RecordedStep | None:
        """The record's next step if ``same`` accepts it; None past the record; else Diverged."""
        if self._at >= len(self._record):
            self._record = []
            return None
        step = self._record[self._at]
        if not same(step):
            raise self._diverge(step.describe(), {**actual, "step": step.step})
        self._at += 1
        return step

    def _expect_call(
        self, action: Action[Any, Any], values: dict[str, Any], key: str
    ) -> RecordedStep | None:
        return self._expect(
            call_step(self._at + 1, action.name, values, key),
            lambda s: s.matches_action(action.name, values, key),
        )

    def _replay_invalid(self, name: str, raw: str) -> bool:
        """Whether the record has this invalid call here (then nothing is written again)."""
        text = canonical(loads(raw))
        step = self._expect(
            call_step(self._at + 1, name, loads(raw)),
            lambda s: (
                s.kind == "action"
                and s.status == "invalid"
                and s.name == name
                and canonical(s.arguments) == text
            ),
        )
        return step is not None

    def _refused_before(self, name: str, raw: str) -> str | None:
        """The reason the record gives for refusing this very call here, when the refusal
        depended on the moment (an async call then in doubt), so that replay refuses it again
        instead of running it; None when the record's next step is something else."""
        if self._at >= len(self._record):
            return None
        step = self._record[self._at]
        row = step.row
        if (
            step.kind == "action"
            and step.status == "invalid"
            and step.name == name
            and row is not None
            and (row.reason or "").startswith(IN_DOUBT_FIRST)
            and canonical(step.arguments) == canonical(loads(raw))
        ):
            self._at += 1
            return row.reason
        return None

    def _diverge(self, expected: dict[str, Any] | None, actual: dict[str, Any] | None) -> Diverged:
        step = int((expected or actual or {}).get("step") or self._at + 1)
        error = Diverged(self.id, step, expected, actual)
        self._diverged = error
        with self._writer.batch():
            self._writer.append_text(
                "diverged", None, _jsonable({"step": step, "expected": expected, "actual": actual})
            )
            self._update_episode()
        self.log.warning("diverged", step=step)
        return error

    def _replayed(self, action: Action[Any, Any], key: str, step: RecordedStep) -> Steps:
        """A call the record has: the agent gets its recorded outcome; nothing is executed."""
        if step.returned:
            entry = self._by_txn.get(step.txn_id or "")
            if entry is not None and entry.impl is None:
                entry.impl = action
            if step.kind == "action" and action.mutating and step.status != "compensated":
                with self._writer.batch():
                    self._writer.append(
                        "dedup", step.txn_id, {"action": action.name, "key": key, "replay": True}
                    )
                    self._update_episode()
            return entry.result_for(action) if entry is not None else step.result
        row = step.row
        if row is None:  # pragma: no cover - steps without a row are live
            raise ConfigurationError(f"step {step.step} of episode {self.id} has no outcome")
        error = rebuilt_error(row)
        if row.decision == "rollback":
            # The call's failure rolled the episode back; a crash may have cut the saga short.
            if self._rolled_back:
                self.outcome = "rolled_back"
            else:
                yield from self.rollback_steps(
                    reason=f"{action.name}: {row.reason}", can_await=action.is_async
                )
        raise error

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """A value the agent's path depends on: computed and recorded once, given back on resume.

        Agent code re-executed on resume must see what it saw the first time (a tool read, a
        model's response). The first time, ``compute()`` runs and its value is appended to the
        episode's log with ``request``; on resume the recorded value comes back instead, and a
        different ``request`` at that step raises :class:`~harness.episode.cursor.Diverged`.

        Args:
            what: what is remembered (``read``, ``model_call``...).
            request: what identifies the question (JSON: arguments, a request digest).
            compute: produces the value (JSON-serializable) when the record does not have it.

        Returns:
            The value, as JSON gives it back (the same on first run and on resume).
        """
        if self._writer is None:
            raise ConfigurationError(
                f"episode {self.id} is not open; remember values inside `with Episode(...)`"
            )
        if self._diverged is not None:
            raise self._diverged
        if self._record:
            text = canonical(request)
            step = self._expect(
                {"step": self._at + 1, "kind": REMEMBERED, "name": what, "request": request},
                lambda s: s.kind == REMEMBERED and s.name == what and canonical(s.request) == text,
            )
            if step is not None:
                return step.value
        value = compute()
        try:
            payload = dumps({"what": what, "request": request, "value": value})
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"Episode.remember({what!r}): the value or request is not JSON ({exc}); "
                "return dicts, lists, strings, numbers, booleans or None"
            ) from exc
        with self._writer.batch():
            self._writer.append_text(REMEMBERED, None, payload)
            self._update_episode()
        return loads(payload)["value"]

    @property
    def diverged(self) -> Diverged | None:
        """The divergence from the record found on resume, if any (every later call raises it)."""
        return self._diverged

    def _apply_resolution(self, action: Action[Any, Any], model: Any, esc: EscalationRow) -> Steps:
        key = esc.idem_key
        if esc.status == "pending":
            raise Escalated(esc.id, action.name, esc.failure_class, esc.reason)
        del self._resolutions[key]
        with self._writer.batch():
            self._writer.append(
                "resolution_applied",
                esc.txn_id,
                {"escalation_id": esc.id, "status": esc.status, "by": esc.resolved_by},
            )
            self._update_episode()
        if esc.status == "rejected":
            self._resolutions[key] = esc
            raise Rejected(action.name, esc.resolved_by or "?", esc.resolution_reason or "")
        if esc.status == "edited":
            return action.validate_mapping(loads(esc.edit or "{}"))
        return model
        yield  # pragma: no cover - makes this a generator

    def _resolve_in_doubt(
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
        ctx = Context(action.name, model, self.state, self.id)
        ctx.idempotency_key, ctx.txn_id = row.key, row.id
        ctx.before = dict(row.before)
        for key, before in row.seen.items():  # (what its window saw, when this process has it)
            ctx.before.setdefault(key, before)
        ctx.after = self.state.snapshot(ctx.before)
        # The mixin is only ever an Episode; the cast tells mypy so (no effect at run time).
        probe = Transaction(cast("Episode", self), action, ctx)
        probe.args_json = dumps(row.args)
        probe.before_json = dumps(row.before)
        probe.started = row.ts
        changed = {
            k: (ctx.before[k], ctx.after[k]) for k in ctx.before if ctx.before[k] != ctx.after[k]
        }
        present = yield from probe._postconditions_hold(quiet=True)
        if present:
            result = yield from probe.recovered_result()
            return self._commit_entry(probe, result, changed, recovered=True)
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
                raise self.escalate(probe, FailureClass.COMPENSATION, reason, changed) from exc
            note = " (its partial effect compensated)"
        elif changed and approved is None and not undone:
            reason = (
                "in doubt (its outcome never recorded) with a partial effect: "
                f"{', '.join(sorted(changed))} changed but the postconditions do not hold, "
                "and the action has no compensation to undo it"
            )
            raise self.escalate(probe, FailureClass.FAIL_STOP, reason, changed)
        elif changed:
            note = " (its partial effect left in place)"
        if approved is not None or action.safe_to_repeat:
            then = (
                f"it runs again as {approved.status} by {approved.resolved_by}"
                if approved is not None
                else "the keyed action runs again"
            )
            self.record_failure(
                probe,
                FailureClass.FAIL_STOP,
                Decision.RETRY,
                f"in doubt (its outcome never recorded): the effect is absent{note}, so {then}",
                {},
                status="abandoned",
            )
            return None
        reason = (
            "an earlier attempt may or may not have applied its effect (intent recorded, no "
            f"outcome), its postconditions do not show it{note}, and the action is neither "
            "idempotent nor keyed: running it again could apply it twice"
        )
        raise self.escalate(probe, FailureClass.FAIL_STOP, reason, {})
