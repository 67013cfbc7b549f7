"""``Episode``: one agent execution, owning its state, store, policy and log.

Inside ``with Episode(...)`` (or ``async with``) every action call is a transaction recorded in
the store. The episode deduplicates by idempotency key, rolls back saga-style (compensating what
it committed, newest first, and verifying the state is back), stores escalations for a person,
and resumes from its records without re-running what was done: calls in doubt after a crash are
settled by probing the state, and re-executed agent code is held to its record
(:mod:`harness.record`), getting every recorded outcome back and :class:`Diverged` where it
departs from it.
"""

from __future__ import annotations

import contextvars
import hashlib
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring as _quote
from types import TracebackType
from typing import Any

from ._json import canonical, dumps, loads
from .action import Action, Context
from .clock import Clock, SystemClock
from .errors import (
    CompensationFailed,
    ConfigurationError,
    EpisodeClosed,
    Escalated,
    InvalidArguments,
    Rejected,
    StoreError,
)
from .policy import Decision, FailureClass, Policy
from .record import REMEMBERED, Diverged, RecordedStep, call_step, rebuilt_error, recorded_steps
from .store import GENESIS, EscalationRow, Store
from .transaction import Steps, Transaction, adrive, compensate, drive

__all__ = ["Committed", "Episode", "current_episode"]

_current: contextvars.ContextVar[Episode | None] = contextvars.ContextVar(
    "harness_episode", default=None
)


def current_episode() -> Episode | None:
    """The episode active in this context, if any."""
    return _current.get()


@dataclass
class InDoubt:
    """An intent with no outcome, read back from the log on resume."""

    id: str
    action: str
    key: str
    args: dict[str, Any]
    before: dict[str, Any]
    ts: float

    @property
    def seq(self) -> int:
        return int(self.id.rsplit(":", 1)[1])

    @classmethod
    def from_log(cls, txn_id: str, payload: str, ts: float) -> InDoubt:
        data = loads(payload)
        return cls(
            txn_id,
            data["action"],
            data["key"],
            data.get("args") or {},
            data.get("before") or {},
            ts,
        )


@dataclass
class Committed:
    """A committed transaction as the episode remembers it (for dedup and rollback)."""

    txn_id: str
    action: str
    key: str
    result: Any
    args: dict[str, Any]
    before: dict[str, Any]
    diff: dict[str, tuple[Any, Any]]
    step: int | None
    mutating: bool
    compensated: bool = False
    impl: Action[Any, Any] | None = None


def _jsonable(value: Any) -> str:
    try:
        return dumps(value)
    except (TypeError, ValueError):
        return dumps(repr(value))


class Episode:
    """One agent execution: an ordered log of transactions, checkpoints, a policy, an outcome.

    Args:
        state: the state adapter the actions change.
        store: a :class:`Store` or a URL (default ``sqlite:///logs/harness.db``).
        policy: failure class -> decision, retry and timeout defaults.
        episode_id: the id (default: a new one); with ``resume=True``, the episode to continue.
        resume: continue a crashed or escalated episode from its records.
        clock: where time comes from (``harness.testing.FakeClock`` in tests).
        actions: actions the episode may need after a resume before the agent calls them
            again: to settle in-doubt calls (probing their postconditions) and to compensate.
        run_id, task_id, trial, meta: recorded on the episode's row.
    """

    def __init__(
        self,
        *,
        state: Any,
        store: Store | str | None = None,
        policy: Policy | None = None,
        episode_id: str | None = None,
        resume: bool = False,
        clock: Clock | None = None,
        actions: Iterable[Action[Any, Any]] = (),
        run_id: str | None = None,
        task_id: str | None = None,
        trial: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        if resume and not episode_id:
            raise ConfigurationError("Episode(resume=True) needs the episode_id to resume")
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigurationError("Episode(policy=...) takes an hx.Policy(...)")
        self.state = state
        self._owns_store = not isinstance(store, Store)
        self.store = store if isinstance(store, Store) else Store(store or "logs/harness.db")
        self.policy = policy or Policy()
        self.clock: Clock = clock or SystemClock()
        self.id = episode_id or uuid.uuid4().hex[:16]
        self.resume = resume
        self.run_id, self.task_id, self.trial = run_id, task_id, trial
        self.meta = meta or {}
        self.outcome = "running"
        self.committed: list[Committed] = []
        self.escalation_id: str | None = None
        self.pivot: str | None = None
        self.active_context: Context | None = None
        self.steps = 0
        self.digest = GENESIS
        self._actions = {a.name: a for a in actions}
        self._done: dict[str, Committed] = {}
        self._in_doubt: dict[str, InDoubt] = {}
        self._resolutions: dict[str, EscalationRow] = {}
        self._seq = 0
        # On resume: the agent's recorded steps its re-executed calls are matched against.
        self._record: list[RecordedStep] = []
        self._at = 0
        self._diverged: Diverged | None = None
        self._by_txn: dict[str, Committed] = {}
        self._compensating: set[str] = set()
        self._rolled_back = False
        self._token: contextvars.Token[Episode | None] | None = None
        self._writer: Any = None
        self.log: Any = None

    # --- lifecycle ---
    def __enter__(self) -> Episode:
        try:
            self._open()
        except BaseException as exc:
            if self._writer is not None:
                self._finish(exc)
            raise
        self._token = _current.set(self)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._finish(ev)
        finally:
            if self._token is not None:
                _current.reset(self._token)
                self._token = None

    async def __aenter__(self) -> Episode:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, ev, tb)

    def _open(self) -> None:
        if self._writer is not None:
            raise ConfigurationError(f"episode {self.id} is already open")
        writer = self.store.writer(self.id)
        self._writer = writer
        self.log = self.store.jsonl(episode_id=self.id, run_id=self.run_id)
        existing = self.store.episode(self.id)
        if self.resume:
            if existing is None:
                writer.close()
                self._writer = None
                raise StoreError(f"no episode {self.id!r} to resume in {self.store.url}")
            self._load(existing.steps, existing.digest)
            writer.load_head()
            with writer.batch():
                writer.append(
                    "resume", None, {"steps": self.steps, "in_doubt": len(self._in_doubt)}
                )
                writer.update_episode(status="running", steps=self.steps, digest=self.digest)
            self._settle_in_doubt()
            self._record = recorded_steps(self.store.transactions(self.id), self.store.log(self.id))
        else:
            if existing is not None:
                writer.close()
                self._writer = None
                raise StoreError(
                    f"episode {self.id!r} already exists in {self.store.url}; "
                    "pass resume=True to continue it, or use a new episode_id"
                )
            now = time.time()
            with writer.batch():
                writer.insert_episode(
                    {
                        "id": self.id,
                        "run_id": self.run_id,
                        "task_id": self.task_id,
                        "trial": self.trial,
                        "status": "running",
                        "created_at": now,
                        "updated_at": now,
                        "policy": dumps(self.policy.describe()),
                        "meta": _jsonable(self.meta),
                        "steps": 0,
                        "digest": GENESIS,
                        "log_count": 0,
                        "head_hash": GENESIS,
                    }
                )
                writer.append("start", None, {"policy": self.policy.describe()})
                writer.update_episode(status="running", steps=0, digest=GENESIS)
        self.log.info("episode_start", resume=self.resume)

    def _load(self, steps: int, digest: str) -> None:
        """Rebuild the episode's memory from its records."""
        self.steps, self.digest = steps, digest
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
                    loads(r.args),
                    loads(r.before or "{}"),
                    diff,
                    r.step,
                    r.mutating,
                    compensated=r.status == "compensated",
                    impl=self._actions.get(r.action),
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
                self.outcome = "running"
                self._in_doubt[key] = intent
                for row in self.store.escalations(episode_id=self.id):
                    if row.id == exc.escalation_id:
                        self._resolutions[key] = row

    def _finish(self, error: BaseException | None) -> None:
        if self._writer is None:
            return
        if self.outcome == "running":
            if error is None:
                self.outcome = "committed"
            elif isinstance(error, Escalated):
                self.outcome = "escalated"
            else:
                self.outcome = "failed"
        try:
            with self._writer.batch():
                self._writer.append(
                    "end",
                    None,
                    {
                        "outcome": self.outcome,
                        "steps": self.steps,
                        "digest": self.digest,
                        "error": None if error is None else f"{type(error).__name__}: {error}",
                    },
                )
                self._writer.update_episode(
                    status=self.outcome, steps=self.steps, digest=self.digest
                )
            self.log.info("episode_end", outcome=self.outcome, steps=self.steps)
            self.store.flush_log()
        finally:
            self._writer.close()
            self._writer = None
            if self._owns_store:
                self.store.close()

    # --- calls ---
    def call(self, action: Action[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one call of ``action`` as a transaction (a coroutine for async actions)."""
        steps = self._call_steps(action, args, kwargs)
        if action.is_async:
            return adrive(steps, self.clock)
        return drive(steps, self.clock)

    def call_mapping(self, action: Action[Any, Any], arguments: dict[str, Any]) -> Any:
        """Run ``action`` with arguments given as a mapping (a model's tool call)."""
        return self.call(action, (), dict(arguments))

    def _call_steps(
        self, action: Action[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Steps:
        if self._writer is None:
            raise ConfigurationError(
                f"episode {self.id} is not open; use it as `with Episode(...):` before calling "
                f"{action.name!r}"
            )
        if self._diverged is not None:
            raise self._diverged
        if self.outcome != "running":
            raise EpisodeClosed(self.id, self.outcome)
        self._actions.setdefault(action.name, action)
        try:
            model = action.validate(args, kwargs)
        except InvalidArguments as exc:
            raw = dumps_args(args, kwargs)
            if not self._record or not self._replay_invalid(action.name, raw):
                self._record_simple(action.name, "", raw, "invalid", str(exc))
            raise
        key = action.key_for(model)
        if self._record:
            step = self._expect_call(action, model, key)
            if step is not None and not step.live:
                return (yield from self._replayed(action, key, step))
        if action.mutating:
            done = self._done.get(key)
            if done is not None:
                return self._dedup(action, key, done)
            resolution = self._resolutions.get(key)
            if resolution is not None:
                model = yield from self._apply_resolution(action, model, resolution)
                if resolution.status == "edited":
                    key = action.key_for(model)
                    done = self._done.get(key)
                    if done is not None:
                        return self._dedup(action, key, done)
            in_doubt = self._in_doubt.pop(resolution.idem_key if resolution else key, None)
            if in_doubt is not None:
                recovered = yield from self._resolve_in_doubt(action, in_doubt, approved=resolution)
                if recovered is not None:
                    return recovered.result
        self._seq += 1
        ctx = Context(action.name, model, self.state, self.id)
        ctx.idempotency_key = key
        ctx.txn_id = f"{self.id}:{self._seq}"
        txn = Transaction(self, action, ctx)
        return (yield from txn.run())

    def _dedup(self, action: Action[Any, Any], key: str, done: Committed) -> Any:
        """A call whose key already committed: the recorded result, nothing executed."""
        if done.impl is None:
            done.impl = action
        with self._writer.batch():
            self._writer.append("dedup", done.txn_id, {"action": action.name, "key": key})
            self._update_episode()
        return done.result

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

    def _expect_call(self, action: Action[Any, Any], model: Any, key: str) -> RecordedStep | None:
        values = action.call_values(model)
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
            return entry.result if entry is not None else step.result
        row = step.row
        if row is None:  # pragma: no cover - steps without a row are live
            raise ConfigurationError(f"step {step.step} of episode {self.id} has no outcome")
        error = rebuilt_error(row)
        if row.decision == "rollback":
            # The call's failure rolled the episode back; a crash may have cut the saga short.
            if self._rolled_back:
                self.outcome = "rolled_back"
            else:
                yield from self.rollback_steps(reason=f"{action.name}: {row.reason}")
        raise error

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """A value the agent's path depends on: computed and recorded once, given back on resume.

        Agent code re-executed on resume must see what it saw the first time (a tool read, a
        model's response). The first time, ``compute()`` runs and its value is appended to the
        episode's log with ``request``; on resume the recorded value comes back instead, and a
        different ``request`` at that step raises :class:`~harness.record.Diverged`.

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
        ctx.after = self.state.snapshot(ctx.before)
        probe = Transaction(self, action, ctx)
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
        if changed and action.compensable:
            try:
                yield from compensate(action, ctx, changed)
            except CompensationFailed as exc:
                reason = f"in doubt after a crash with a partial effect; {exc.reason}"
                raise self.escalate(probe, FailureClass.COMPENSATION, reason, changed) from exc
            note = " (its partial effect compensated)"
        elif changed and approved is None:
            reason = (
                "in doubt after a crash with a partial effect: "
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
                f"in doubt after a crash: the effect is absent{note}, so {then}",
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

    # --- records (the hot path) ---
    def _update_episode(self) -> None:
        self._writer.update_episode(status=self.outcome, steps=self.steps, digest=self.digest)

    def _record_simple(self, action: str, key: str, args: str, status: str, reason: str) -> None:
        self._seq += 1
        txn_id = f"{self.id}:{self._seq}"
        now = time.time()
        with self._writer.batch():
            self._writer.insert_txn(
                {
                    "id": txn_id,
                    "episode_id": self.id,
                    "seq": self._seq,
                    "action": action,
                    "idem_key": key,
                    "args": args,
                    "status": status,
                    "mutating": False,
                    "failure_class": "precondition" if status != "invalid" else None,
                    "decision": "continue",
                    "reason": reason,
                    "errors": "[]",
                    "started_at": now,
                    "ended_at": now,
                    "duration": 0.0,
                }
            )
            self._writer.append(status, txn_id, {"action": action, "reason": reason})
            self._update_episode()
        self.log.info(status, txn_id=txn_id, action=action, reason=reason)

    def record_refusal(self, txn: Transaction, status: str, reason: str) -> None:
        """A precondition was false or raised: nothing ran."""
        ctx = txn.ctx
        self._seq_row(txn, status, reason)
        self.log.info("precondition_failed", txn_id=ctx.txn_id, action=ctx.action, check=reason)

    def _seq_row(self, txn: Transaction, status: str, reason: str) -> None:
        ctx = txn.ctx
        now = time.time()
        with self._writer.batch():
            self._writer.insert_txn(
                {
                    "id": ctx.txn_id,
                    "episode_id": self.id,
                    "seq": int(ctx.txn_id.rsplit(":", 1)[1]),
                    "action": ctx.action,
                    "idem_key": ctx.idempotency_key,
                    "args": dumps(txn.action.call_values(ctx.args)),
                    "status": status,
                    "mutating": txn.action.mutating,
                    "failure_class": "precondition",
                    "decision": "continue",
                    "reason": reason,
                    "errors": "[]",
                    "started_at": now,
                    "ended_at": now,
                    "duration": 0.0,
                }
            )
            self._writer.append(
                "precondition",
                ctx.txn_id,
                {"action": ctx.action, "check": reason, "decision": "continue"},
            )
            self._update_episode()

    def record_intent(self, txn: Transaction) -> None:
        """Write-ahead: the intent is durable before the tool runs.

        The intent is one log record (action, key, arguments, the scoped before snapshot); the
        transaction's row is written with its outcome. The episode row's chain witness moves
        with the outcome too. One B-tree write here keeps the hot path cheap.
        """
        ctx = txn.ctx
        args = txn.args_json = dumps(txn.values)
        txn.before_json = dumps(ctx.before) if ctx.before else "{}"
        text = (
            f'{{"action":{_quote(ctx.action)},"key":{_quote(ctx.idempotency_key)},'
            f'"args":{args},"before":{txn.before_json}}}'
        )
        with self._writer.batch():
            self._writer.append_text("intent", ctx.txn_id, text)

    def record_retry(self, txn: Transaction, delay: float) -> None:
        """A retry decision, logged with the error that caused it."""
        last = txn.errors[-1] if txn.errors else None
        with self._writer.batch():
            self._writer.append(
                "decision",
                txn.ctx.txn_id,
                {
                    "decision": "retry",
                    "attempt": txn.ctx.attempt,
                    "wait": delay,
                    "reason": f"{type(last).__name__}: {last}" if last else "",
                },
            )
            self._update_episode()
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
        self._commit_entry(txn, result, diff, recovered=recovered)

    def _commit_entry(
        self,
        txn: Transaction,
        result: Any,
        diff: dict[str, tuple[Any, Any]],
        *,
        recovered: bool,
    ) -> Committed:
        ctx, act = txn.ctx, txn.action
        now = time.time()
        duration = self.clock.now() - txn.t0
        result_json = txn.result_json
        diff_json = dumps({k: [b, a] for k, (b, a) in diff.items()}) if diff else "{}"
        status = "recovered" if recovered else "committed"
        errors = _jsonable([f"{type(e).__name__}: {e}" for e in txn.errors]) if txn.errors else "[]"
        step: int | None = None
        digest = self.digest
        if act.mutating:
            step = self.steps + 1
            digest = hashlib.sha256(f"{self.digest}{diff_json}".encode()).hexdigest()
        # The payload is assembled as text: it is on the hot path, and every part is JSON.
        payload = (
            f'{{"action":{_quote(ctx.action)},"step":{"null" if step is None else step},'
            f'"digest":{"null" if step is None else _quote(digest)},"attempts":{ctx.attempt},'
            f'"result_sha":"{hashlib.sha256(result_json.encode()).hexdigest()}",'
            f'"diff_sha":"{hashlib.sha256(diff_json.encode()).hexdigest()}"}}'
        )
        with self._writer.batch():
            self._writer.insert_txn(
                {
                    "id": ctx.txn_id,
                    "episode_id": self.id,
                    "seq": txn.seq,
                    "action": ctx.action,
                    "idem_key": ctx.idempotency_key,
                    "args": txn.args_json or dumps(txn.values),
                    "before": txn.before_json,
                    "mutating": act.mutating,
                    "started_at": txn.started,
                    "status": status,
                    "result": result_json,
                    "diff": diff_json,
                    "attempts": ctx.attempt,
                    "errors": errors,
                    "ended_at": now,
                    "duration": duration,
                    "step": step,
                }
            )
            if step is not None:
                self._writer.checkpoint(step, ctx.txn_id, digest)
            self._writer.append_text(status, ctx.txn_id, payload)
            self._writer.update_episode(
                status=self.outcome, steps=step or self.steps, digest=digest
            )
        if step is not None:
            self.steps, self.digest = step, digest
        entry = Committed(
            ctx.txn_id,
            ctx.action,
            ctx.idempotency_key,
            result,
            txn.values,
            ctx.before,
            diff,
            step,
            act.mutating,
            impl=act,
        )
        self.committed.append(entry)
        if act.mutating:
            self._done[ctx.idempotency_key] = entry
            if act.pivot:
                self.pivot = act.name
        self.log.info(
            status,
            txn_id=ctx.txn_id,
            action=ctx.action,
            step=step,
            attempts=ctx.attempt,
            duration=duration,
        )
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
        status: str = "failed",
    ) -> None:
        """The transaction did not commit (or its undo failed): its class, the decision, why."""
        ctx, act = txn.ctx, txn.action
        now = time.time()
        fields = {
            "status": status,
            "failure_class": str(failure_class),
            "decision": str(decision),
            "reason": reason,
            "attempts": ctx.attempt,
            "errors": _jsonable([f"{type(e).__name__}: {e}" for e in txn.errors]),
            "diff": dumps({k: [b, a] for k, (b, a) in diff.items()}) if diff else None,
            "ended_at": now,
            "duration": self.clock.now() - txn.t0,
        }
        with self._writer.batch():
            if existing:
                self._writer.update_txn(ctx.txn_id, fields)
            else:
                self._writer.insert_txn(
                    {
                        "id": ctx.txn_id,
                        "episode_id": self.id,
                        "seq": txn.seq,
                        "action": ctx.action,
                        "idem_key": ctx.idempotency_key,
                        "args": txn.args_json or dumps(txn.values),
                        "before": txn.before_json,
                        "mutating": act.mutating,
                        "started_at": txn.started,
                        **fields,
                    }
                )
            self._writer.append(
                "decision",
                ctx.txn_id,
                {
                    "action": ctx.action,
                    "failure_class": str(failure_class),
                    "decision": str(decision),
                    "reason": reason,
                    "attempts": ctx.attempt,
                },
            )
            self._update_episode()
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
        evidence = {
            "before": ctx.before,
            "after": ctx.after,
            "diff": {k: [b, a] for k, (b, a) in diff.items()},
            "errors": [f"{type(e).__name__}: {e}" for e in txn.errors],
            "attempts": ctx.attempt,
            "step": self.steps,
            "digest": self.digest,
        }
        self.outcome = "escalated"
        with self._writer.batch():
            esc_id = self._writer.insert_escalation(
                {
                    "episode_id": self.id,
                    "txn_id": ctx.txn_id,
                    "action": act.name,
                    "idem_key": ctx.idempotency_key,
                    "args": dumps(act.call_values(ctx.args)),
                    "failure_class": str(failure_class),
                    "reason": reason,
                    "evidence": _jsonable(evidence),
                    "status": "pending",
                    "created_at": time.time(),
                    "fallback": "reject",
                }
            )
            self._writer.append(
                "escalation",
                ctx.txn_id,
                {
                    "escalation_id": esc_id,
                    "action": act.name,
                    "failure_class": str(failure_class),
                    "reason": reason,
                },
            )
            self._update_episode()
        self.escalation_id = esc_id
        self.log.warning(
            "escalated",
            txn_id=ctx.txn_id,
            action=act.name,
            escalation_id=esc_id,
            failure_class=str(failure_class),
            reason=reason,
        )
        return Escalated(esc_id, act.name, str(failure_class), reason)

    # --- rollback ---
    def rollback(self) -> None:
        """Compensate every committed action, newest first, and verify the state is back."""
        drive(self.rollback_steps(reason="requested"), self.clock)

    async def arollback(self) -> None:
        """``rollback`` for episodes whose compensations are async."""
        await adrive(self.rollback_steps(reason="requested"), self.clock)

    def rollback_steps(self, *, reason: str) -> Steps:
        """The saga: compensate in reverse order; a failed undo escalates."""
        if self._writer is None:
            raise ConfigurationError(f"episode {self.id} is not open; roll back inside `with`")
        with self._writer.batch():
            self._writer.append("rollback", None, {"reason": reason})
            self._update_episode()
        for entry in reversed(self.committed):
            if not entry.mutating or entry.compensated:
                continue
            impl = entry.impl or self._actions.get(entry.action)
            txn = self._replay_txn(entry, impl)
            # A compensation a crash cut short: if the state is back, it ran; do not run it twice.
            undone = entry.txn_id in self._compensating and all(
                self.state.get(k) == before for k, (before, _) in entry.diff.items()
            )
            if not undone:
                with self._writer.batch():
                    self._writer.append("compensating", entry.txn_id, {"action": entry.action})
                    self._update_episode()
                try:
                    if impl is None:
                        raise CompensationFailed(
                            entry.action,
                            "its implementation is unknown after resume; pass it in "
                            "Episode(actions=[...])",
                            txn_id=entry.txn_id,
                        )
                    yield from compensate(impl, txn.ctx, entry.diff)
                except CompensationFailed as exc:
                    txn.errors.append(exc)
                    self.record_failure(
                        txn,
                        FailureClass.COMPENSATION,
                        Decision.ESCALATE,
                        exc.reason,
                        entry.diff,
                        existing=True,
                    )
                    raise self.escalate(
                        txn, FailureClass.COMPENSATION, exc.reason, entry.diff
                    ) from exc
            entry.compensated = True
            self._compensating.discard(entry.txn_id)
            self._done.pop(entry.key, None)
            with self._writer.batch():
                self._writer.update_txn(entry.txn_id, {"status": "compensated"})
                self._writer.append(
                    "compensated",
                    entry.txn_id,
                    {"action": entry.action, "found_undone": True}
                    if undone
                    else {"action": entry.action},
                )
                self._update_episode()
            self.log.info("compensated", txn_id=entry.txn_id, action=entry.action)
        self.pivot = None
        self.outcome = "rolled_back"
        self._rolled_back = True
        with self._writer.batch():
            self._writer.append("rolled_back", None, {"reason": reason})
            self._update_episode()

    def _replay_txn(self, entry: Committed, impl: Action[Any, Any] | None) -> Transaction:
        """A transaction object for compensating ``entry`` (its context rebuilt)."""
        action = impl if impl is not None else _missing_action(entry.action)
        model = action.validate_mapping(dict(entry.args)) if impl is not None else None
        ctx = Context(entry.action, model, self.state, self.id)
        ctx.txn_id, ctx.idempotency_key, ctx.result = entry.txn_id, entry.key, entry.result
        ctx.before = dict(entry.before)
        ctx.after = {k: a for k, (_, a) in entry.diff.items()}
        for k, (b, _) in entry.diff.items():
            ctx.before.setdefault(k, b)
        return Transaction(self, action, ctx)

    # --- introspection ---
    @property
    def in_doubt(self) -> list[str]:
        """Idempotency keys of actions with an intent and no outcome (after a resume)."""
        return sorted(self._in_doubt)

    def __repr__(self) -> str:
        return f"<Episode {self.id} {self.outcome} steps={self.steps}>"


def dumps_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Arguments as JSON for the record, whatever they are."""
    return _jsonable({"args": list(args), "kwargs": kwargs})


def _missing_action(name: str) -> Action[Any, Any]:
    def missing() -> None:
        """An action whose implementation is not known to this episode."""

    return Action(missing, name=name, writes=["*"])
