"""``Episode``: construction, the ``with`` protocol, and calls.

An episode is composed of parts it owns, sharing its :class:`~.memory.Memory`: the
:class:`~.recorder.Recorder` (its records, the hot path), the :class:`~.settle.Settler` (calls in
doubt, resolutions, the memory rebuilt on resume), the :class:`~.saga.Saga` (rollback) and a
:class:`~.cursor.RecordCursor` (a resumed agent's calls held to its record). The episode is the
:class:`~harness.transaction.Host` its transactions run in.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import uuid
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from .. import observe
from .._json import canonical, dumps, loads
from ..action import ACTIVE_CALL, CURRENT_EPISODE, OPEN_EPISODES, Action, Context, ContextExecutor
from ..clock import Clock, SystemClock
from ..errors import (
    ConfigurationError,
    Diverged,
    EpisodeClosed,
    Escalated,
    HarnessError,
    IdempotencyConflict,
    InvalidArguments,
    KeyInFlight,
    PreconditionFailed,
    StoreError,
)
from ..policy import Policy
from ..store import GENESIS, EpisodeStatus, EscalationStatus, Store, TxnStatus
from ..store.keys import Holder, claim_key, key_holder, release_keys
from ..store.leases import Held
from ..store.signing import SigningKey, sign_episode
from ..store.tables import txn_id
from ..transaction import Call, Steps, Transaction, adrive, drive, run_check
from .cursor import (
    IN_DOUBT_FIRST,
    REMEMBERED,
    RecordCursor,
    RecordedStep,
    rebuilt_error,
    recorded_steps,
)
from .gate import Gate
from .memory import Memory
from .recorder import Recorder
from .saga import Saga
from .settle import Settler
from .values import Committed, _jsonable, dumps_args

# The episode active in this context (the variable lives in harness.action, below the episode
# package, so that calling an action needs no import of it).
_current: contextvars.ContextVar[Episode | None] = CURRENT_EPISODE


def current_episode() -> Episode | None:
    """The episode active in this context, if any."""
    return _current.get()


def _nested_steps(action: Action[Any, Any], ctx: Context) -> Steps:
    """A nested call's preconditions, then its function (no transaction of its own)."""
    for name, check in action.preconditions:
        if not (yield from run_check(action, name, check, ctx, "precondition")):
            raise PreconditionFailed(action.name, name)
    return (yield Call(action.fn, (), action.call_values(ctx.args)))


def _stored_result(action: Action[Any, Any], holder: Holder) -> Any:
    """The result another episode's call recorded for a store-wide key, as the tool returned
    it."""
    return None if holder.result is None else action.decode_result(loads(holder.result))


def _carry_context_to_default_executor() -> None:
    """Make the running event loop's default executor carry the caller's context, when the
    loop has none yet.

    Frameworks run sync tools with ``loop.run_in_executor(None, ...)``, whose tasks start in an
    empty context (unlike ``asyncio.to_thread``): the episode would not be current there. An
    executor set by the user (``loop.set_default_executor``) is theirs and is left alone.
    """
    loop = asyncio._get_running_loop()
    if loop is not None and getattr(loop, "_default_executor", ...) is None:
        loop.set_default_executor(ContextExecutor(thread_name_prefix="harness"))


# What the engine calls on a state adapter (hx.StateAdapter).
_ADAPTER_METHODS = ("get", "snapshot", "mark", "changes", "release")


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
        signing_key: signs the episode's head when it ends (:mod:`harness.store.signing`), so
            an auditor with the public key can tell a rewritten record from the real one.
        follow_record: on resume, hold the agent's re-executed calls to the recorded order
            (a call other than the recorded one raises :class:`~harness.errors.Diverged`).
            ``False`` for agent code that does not run again from its start: LangGraph re-runs
            only the interrupted node, its parallel calls in any order. Committed calls are
            still answered from the record by their idempotency key, and people's decisions
            still apply by key; only the order is not checked.
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
        signing_key: SigningKey | None = None,
        follow_record: bool = True,
    ) -> None:
        if resume and not episode_id:
            raise ConfigurationError("Episode(resume=True) needs the episode_id to resume")
        if policy is not None and not isinstance(policy, Policy):
            raise ConfigurationError("Episode(policy=...) takes an hx.Policy(...)")
        missing = [m for m in _ADAPTER_METHODS if not callable(getattr(state, m, None))]
        if missing:
            hint = (
                f"wrap the {type(state).__name__} as hx.DictState(...)"
                if isinstance(state, dict)
                else "implement hx.StateAdapter"
            )
            raise ConfigurationError(
                f"Episode(state=...) takes a state adapter (hx.DictState(mapping), "
                f"hx.SQLState(url), hx.FileState(folder)); a {type(state).__name__} has no "
                f"{', '.join(missing)}: {hint}"
            )
        if signing_key is not None and not isinstance(signing_key, SigningKey):
            raise ConfigurationError(
                "Episode(signing_key=...) takes an hx.SigningKey (hx.SigningKey.load(path))"
            )
        self.signing_key = signing_key
        self.state = state
        self._owns_store = not isinstance(store, Store)
        self.store = (
            store if isinstance(store, Store) else Store(store or "logs/harness.db", create=True)
        )
        self.policy = policy or Policy()
        self.clock: Clock = clock or SystemClock()
        self.id = episode_id or uuid.uuid4().hex[:16]
        self.resume = resume
        self.follow_record = follow_record
        self.run_id, self.task_id, self.trial = run_id, task_id, trial
        self.meta = meta or {}
        self._gate = Gate()
        self._actions: dict[str, Action[Any, Any]] = {}
        for known in actions:
            self._know(known)
        self._m = Memory(self.id)
        # Every record the episode and its transactions write goes through its recorder.
        self.recorder = Recorder(self._m, self.clock)
        self._settler = Settler(
            self._m, self.recorder, self, self.store, state, self._actions, self.clock
        )
        self._saga = Saga(self._m, self.recorder, self._settler, self, state, self._actions)
        # On resume: the agent's recorded steps its re-executed calls are matched against.
        self._cursor = RecordCursor(self.id, [], live_after=True, on_diverge=self._log_divergence)
        self._token: contextvars.Token[Episode | None] | None = None
        self._observed: observe.EpisodeObservation | None = None  # (when traced)
        # Whether the episode may hold store-wide keys (given back at its end if not applied).
        self._store_keys = resume
        self._claim: Held | None = None  # this process's claim on the episode while open

    # --- what the episode knows (its memory) ---
    @property
    def outcome(self) -> str:
        """``running``, then ``committed``, ``rolled_back``, ``escalated`` or ``failed``."""
        return self._m.outcome

    @outcome.setter
    def outcome(self, value: str) -> None:
        self._m.outcome = value

    @property
    def committed(self) -> list[Committed]:
        """The calls that committed, in order (compensated ones are marked)."""
        return self._m.committed

    @property
    def steps(self) -> int:
        """Committed writes so far (the checkpoint's step)."""
        return self._m.steps

    @property
    def digest(self) -> str:
        """The checkpoint digest: a hash chained over every committed write's diff."""
        return self._m.digest

    @property
    def pivot(self) -> str | None:
        """The committed pivot action past which the episode is not rolled back (if any)."""
        return self._m.pivot

    @property
    def escalation_id(self) -> str | None:
        """The last escalation raised (None: none)."""
        return self._m.escalation_id

    @property
    def diverged(self) -> Diverged | None:
        """The divergence from the record found on resume, if any (every later call raises it)."""
        return self._cursor.diverged

    @property
    def log(self) -> Any:
        """The episode's structured log (JSON lines) while it is open."""
        return self.recorder.log

    @property
    def _writer(self) -> Any:
        """The store writer while the episode is open (None otherwise)."""
        return self.recorder.writer

    @_writer.setter
    def _writer(self, writer: Any) -> None:
        self.recorder.writer = writer

    # --- what its transactions need (the Host protocol): its recorder, and the saga ---
    def rollback_steps(self, *, reason: str, can_await: bool) -> Steps:
        """The saga's steps: compensate in reverse order; a failed undo escalates."""
        return self._saga.steps(reason=reason, can_await=can_await)

    # --- lifecycle ---
    def __enter__(self) -> Episode:
        try:
            self._open()
        except BaseException as exc:
            if self._writer is not None:
                self._finish(exc)
            self._unclaim()
            raise
        self._token = _current.set(self)
        OPEN_EPISODES.add(self)
        _carry_context_to_default_executor()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._finish(ev)
        finally:
            OPEN_EPISODES.discard(self)
            if self._token is not None:
                _current.reset(self._token)
                self._token = None
            observed, self._observed = self._observed, None
            if observed is not None:
                observed.close(ev)

    async def __aenter__(self) -> Episode:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._writer is None:
            self.__exit__(et, ev, tb)
            return
        # Calls still in flight (other tasks, threads) end before the episode does.
        async with self._gate.aheld():
            if self._winding_up(ev):
                # Here, async calls in doubt can be awaited.
                try:
                    await adrive(self._wind_up(can_await=True), self.clock)
                except HarnessError as exc:
                    ev = exc if ev is None else ev
            self.__exit__(et, ev, tb)

    def _open(self) -> None:
        if self._writer is not None:
            raise ConfigurationError(f"episode {self.id} is already open")
        # One process at a time: another process's open episode is refused before anything
        # is written (two writers of one chain would leave rows a verifier reads as altered).
        self._claim = self.store.claim_episode(self.id)
        writer = self.store.writer(self.id)
        self._writer = writer
        self.recorder.log = self.store.jsonl(episode_id=self.id, run_id=self.run_id)
        existing = self.store.episode(self.id)
        if self.resume:
            if existing is None:
                writer.close()
                self._writer = None
                raise StoreError(f"no episode {self.id!r} to resume in {self.store.url}")
            self._settler.load()
            writer.load_head()  # (and takes over rows a crash left unwritten)
            with writer.batch():
                writer.append(
                    "resume", None, {"steps": self.steps, "in_doubt": len(self._m.in_doubt)}
                )
                writer.update_episode(
                    status=EpisodeStatus.RUNNING, steps=self.steps, digest=self.digest
                )
            self._settler.settle_in_doubt()
            if self.follow_record:
                self._cursor.steps = recorded_steps(
                    self.store.transaction_rows(self.id), self.store.log(self.id)
                )
        else:
            if existing is not None:
                writer.close()
                self._writer = None
                raise StoreError(
                    f"episode {self.id!r} already exists in {self.store.url}; "
                    "pass resume=True to continue it, or use a new episode_id"
                )
            now = time.time()
            meta = _jsonable(self.meta)
            with writer.batch():
                writer.insert_episode(
                    {
                        "id": self.id,
                        "run_id": self.run_id,
                        "task_id": self.task_id,
                        "trial": self.trial,
                        "status": EpisodeStatus.RUNNING,
                        "created_at": now,
                        "updated_at": now,
                        "policy": dumps(self.policy.describe()),
                        "meta": meta,
                        "steps": 0,
                        "digest": GENESIS,
                        "log_count": 0,
                        "head_hash": GENESIS,
                    }
                )
                writer.append(
                    "start",
                    None,
                    {
                        "policy": self.policy.describe(),
                        "meta": loads(meta),
                        "run_id": self.run_id,
                        "task_id": self.task_id,
                        "trial": self.trial,
                    },
                )
                writer.update_episode(status=EpisodeStatus.RUNNING, steps=0, digest=GENESIS)
        if observe.hook is not None:
            self._observed = observe.hook.episode(self)
        self.log.info("episode_start", resume=self.resume)

    def _finish(self, error: BaseException | None) -> None:
        if self._writer is None:
            return
        if self._writer.num is None:  # the episode's row was never written: nothing to end
            self._writer.close()
            self._writer = None
            self._unclaim()
            if self._owns_store:
                self.store.close()
            return
        # Calls still in flight in other threads end before the episode does (a task of a
        # loop this thread runs cannot be waited for here: `async with` waits for those).
        try:
            token = self._gate.enter()
        except ConfigurationError:
            raise ConfigurationError(
                f"episode {self.id} cannot end while a call of it runs in a task of this event "
                "loop: a sync `with` cannot wait for it. Use `async with hx.Episode(...)`, or "
                "await the task first; the episode stays open (resume ends it)"
            ) from None
        try:
            self._end(error)
        finally:
            self._gate.exit(token)

    def _end(self, error: BaseException | None) -> None:
        if self._m.unrecorded:
            try:
                self.recorder.flush_unrecorded()
            except HarnessError as exc:
                error = exc if error is None else error
        if self._winding_up(error):
            try:
                if asyncio._get_running_loop() is None:  # (a loop of its own for async calls)
                    asyncio.run(adrive(self._wind_up(can_await=True), self.clock))
                else:
                    drive(self._wind_up(can_await=False), self.clock)
                if self._m.unsettled:
                    raise StoreError(
                        f"episode {self.id} ends with async calls in doubt "
                        f"({', '.join(self._m.unsettled)}) that a sync `with` inside a running "
                        "event loop cannot settle; resume the episode to settle them"
                    )
            except HarnessError as exc:
                error = exc if error is None else error
        if self.outcome == EpisodeStatus.RUNNING:
            if error is None and any(
                r.status == EscalationStatus.PENDING for r in self._m.resolutions.values()
            ):
                # A call held for a person the agent did not come back to: still held.
                self.outcome = EpisodeStatus.ESCALATED
            elif error is None:
                self.outcome = EpisodeStatus.COMMITTED
            elif isinstance(error, Escalated):
                self.outcome = EpisodeStatus.ESCALATED
            else:
                self.outcome = EpisodeStatus.FAILED
        if self._store_keys and self.outcome != EpisodeStatus.ESCALATED and not self._m.unsettled:
            # Keys of calls that did not apply (or were rolled back) are free for others.
            with contextlib.suppress(HarnessError):
                release_keys(self._writer)
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
            if self.signing_key is not None:
                # Once per episode end, never per record.
                sign_episode(self.store, self.id, self.signing_key)
        finally:
            self._writer.close()
            self._writer = None
            self._unclaim()
            if self._owns_store:
                self.store.close()

    def _unclaim(self) -> None:
        """Give the episode's claim back (its records are all written by now)."""
        claim, self._claim = self._claim, None
        if claim is not None:
            with contextlib.suppress(HarnessError, OSError):  # (it lapses on its own)
                claim.release()

    # --- calls ---
    def call(self, action: Action[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one call of ``action`` as a transaction (a coroutine for async actions).

        Calls of one episode made at once (threads, tasks) run one at a time (:mod:`.gate`),
        so each is attributed exactly its own changes. An action called while another call's
        tool runs (from that tool, or a task or thread it started) is part of that call, as a
        plain function: its changes are the running call's, checked against that call's scope
        and undone by its compensation.
        """
        running = ACTIVE_CALL.get()
        if (
            running is not None
            and running.in_tool
            and running.episode_id == self.id
            and self._gate.inherited()
        ):
            return self._nested(action, args, kwargs)
        if action.is_async:
            return self._acall(action, args, kwargs)
        steps = self._traced_steps(action, args, kwargs)
        gate = self._gate
        token = gate.enter()
        try:
            return drive(steps, self.clock)
        finally:
            gate.exit(token)

    def _nested(
        self, action: Action[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """An action called inside a running tool: validated, its preconditions checked, then
        its function run as part of that call (a coroutine for async actions)."""
        if action.approval or self.policy.approval is not None:
            raise ConfigurationError(
                f"action {action.name!r} may need a person's approval, so it cannot run inside "
                "another call's tool; call it from the agent, where it can be held"
            )
        model = action.validate(args, kwargs)
        steps = _nested_steps(action, Context(action.name, model, self.state, self.id))
        if not action.is_async:
            return drive(steps, self.clock)
        if asyncio._get_running_loop() is None:
            steps.close()
            raise ConfigurationError(
                f"async action {action.name!r} was called from a sync tool, which cannot await "
                "it; make the calling tool async def, or the action sync"
            )
        return adrive(steps, self.clock)

    async def _acall(
        self, action: Action[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        steps = self._traced_steps(action, args, kwargs)
        async with self._gate.aheld():
            return await adrive(steps, self.clock)

    def _traced_steps(
        self, action: Action[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Steps:
        """The call's steps, inside the tracer's span for it when one is installed."""
        steps = self._call_steps(action, args, kwargs)
        if observe.hook is not None:
            steps = observe.hook.call(self, self._observed, action, steps)
        return steps

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
        if self.diverged is not None:
            raise self.diverged
        if self.outcome != EpisodeStatus.RUNNING:
            raise EpisodeClosed(self.id, self.outcome)
        m = self._m
        if m.unrecorded:
            self.recorder.flush_unrecorded()
        if m.unsettled:
            yield from self._settler.settle_unsettled(action.is_async)
        if self._cursor and not action.is_async:
            refused = self._cursor.refused_before(action.name, loads(dumps_args(args, kwargs)))
            if refused is not None:
                raise ConfigurationError(refused)
        try:
            if m.unsettled:
                raise ConfigurationError(
                    f"{IN_DOUBT_FIRST}{self.id} is in doubt "
                    f"({', '.join(m.unsettled)}) and must be settled before the next call, "
                    f"which needs an event loop: {action.name!r} is sync. Call an async action "
                    "first, or `await episode.asettle()`"
                )
            self._know(action)
            model = action.validate(args, kwargs)
            values = action.call_values(model)
            args_json = action.encode_args(model, values)
            key = action.key_for(model)
            scope = action.scope(model) if callable(action.writes) else None
        except (InvalidArguments, ConfigurationError) as exc:
            raw = dumps_args(args, kwargs)
            if not self._cursor or self._cursor.expect_invalid(action.name, loads(raw)) is None:
                self.recorder.record_simple(action.name, "", raw, TxnStatus.INVALID, str(exc))
            raise
        if self._cursor:
            step = self._cursor.expect_call(action.name, loads(args_json), key)
            if step is not None and not step.live:
                return (yield from self._replayed(action, key, step))
        done = m.done.get(key) if action.mutating else None
        if done is not None:
            return self._dedup(action, key, done, args_json)
        resolution = m.resolutions.get(key)
        if resolution is not None and canonical(loads(resolution.args)) != canonical(
            loads(args_json)
        ):
            # A person's decision is bound to the exact arguments they saw: a call with other
            # arguments is another call, and needs its own approval where one is needed.
            resolution = None
        if resolution is not None:
            model = yield from self._settler.apply_resolution(action, model, resolution)
            if resolution.status == EscalationStatus.EDITED:
                values = action.call_values(model)
                args_json = action.encode_args(model, values)
                key = action.key_for(model)
                done = m.done.get(key) if action.mutating else None
                if done is not None:
                    return self._dedup(action, key, done, args_json)
        in_doubt = m.in_doubt.pop(resolution.idem_key if resolution else key, None)
        if in_doubt is not None:
            recovered = yield from self._settler.resolve_in_doubt(
                action, in_doubt, approved=resolution
            )
            if recovered is not None:
                return recovered.result
        if self._store_scoped(action):
            self._store_keys = True
            holder = claim_key(self._writer, key, txn_id(self.id, m.seq + 1), args_json)
            if holder is not None:
                return self._answer_from_store(action, key, holder, args_json)
        m.seq += 1
        ctx = Context(action.name, model, self.state, self.id)
        ctx.idempotency_key = key
        ctx.txn_id = txn_id(self.id, m.seq)
        txn = Transaction(self, action, ctx, approved=resolution is not None, values=values)
        txn.args_json = args_json
        # Only an answer to an approval request clears the approval rules: approving a call
        # held for another reason (a refused precondition) does not skip them.
        txn.cleared = resolution is not None and resolution.failure_class == "approval"
        if scope is not None and resolution is None:
            txn.scope = scope
        try:
            result = yield from txn.run()
        except BaseException as exc:
            raised = txn.unfinished(exc)
            if self._store_scoped(action):
                self._give_back(txn, raised)
            if raised is exc:
                raise
            raise raised from exc
        if self._store_scoped(action):
            with self._writer.batch():  # its row lands now: other episodes read the key there
                pass
        return result

    def _store_scoped(self, action: Action[Any, Any]) -> bool:
        """Whether ``action``'s key holds across the store's episodes (the action's own
        ``idempotency_scope``, or the policy's for every mutating action)."""
        return action.store_scoped or (action.mutating and self.policy.idempotency_scope == "store")

    def _give_back(self, txn: Transaction, error: BaseException) -> None:
        """Release the store-wide key of a call that ended without applying, unless its effect
        may be in the world (in doubt, escalated, interrupted): then it stays held."""
        if (
            isinstance(error, Exception)
            and not isinstance(error, Escalated)
            and (txn.recorded or not txn.intended)
        ):
            with contextlib.suppress(HarnessError):  # (held, then, until the episode ends)
                release_keys(self._writer, txn.ctx.txn_id)

    def _answer_from_store(
        self, action: Action[Any, Any], key: str, holder: Holder, args_json: str
    ) -> Any:
        """A store-wide key held by another episode's call: its recorded result when it
        committed with these arguments; otherwise refused, and nothing runs."""
        if not holder.applied:
            refused = KeyInFlight(
                action.name,
                key,
                holder.episode_id,
                holder.txn_id,
                pid=holder.pid,
                host=holder.host,
                status=holder.status,
            )
            self.recorder.note(
                "key_in_flight",
                None,
                {"action": action.name, "key": key, "episode": holder.episode_id},
            )
            raise refused
        if canonical(loads(holder.args)) != canonical(loads(args_json)):
            conflict = IdempotencyConflict(action.name, key, holder.txn_id, holder.args, args_json)
            self.recorder.record_simple(
                action.name, key, args_json, TxnStatus.INVALID, str(conflict)
            )
            raise conflict
        self.recorder.note(
            "dedup",
            None,
            {"action": action.name, "key": key, "episode": holder.episode_id, "txn": holder.txn_id},
        )
        return _stored_result(action, holder)

    def _know(self, action: Action[Any, Any]) -> None:
        """Remember ``action`` by name; another action object under a known name is refused,
        whatever its code (their idempotency keys would collide, so the second would be
        answered with the first one's results, and resume could not tell them apart)."""
        known = self._actions.setdefault(action.name, action)
        if known is action:
            return
        where = (
            f"both made by {action.identity}, e.g. by one factory function"
            if known.identity == action.identity
            else f"{known.identity} and {action.identity}"
        )
        raise ConfigurationError(
            f"two different actions are named {action.name!r} in episode {self.id} ({where}); "
            "nothing ran. Give each its own name with @hx.action(name=...), or make the action "
            "once and call that same object (also in Episode(actions=[...]))"
        )

    def _dedup(self, action: Action[Any, Any], key: str, done: Committed, args_json: str) -> Any:
        """A call whose key already committed: the recorded result, nothing executed."""
        if done.impl is None:
            done.impl = action
        # Compared as recorded (JSON, canonical), before either tool could change its own.
        if canonical(loads(done.args_json)) != canonical(loads(args_json)):
            conflict = IdempotencyConflict(action.name, key, done.txn_id, done.args_json, args_json)
            self.recorder.record_simple(
                action.name, key, args_json, TxnStatus.INVALID, str(conflict)
            )
            raise conflict
        self.recorder.note("dedup", done.txn_id, {"action": action.name, "key": key})
        return done.result_for(action)

    def _winding_up(self, error: BaseException | None) -> bool:
        """Whether the episode has work to finish before it says how it ended. (Interrupted, as
        by Ctrl-C, it ends at once, like a crash: resume does that work.)"""
        interrupted = error is not None and not isinstance(error, Exception)
        return (
            bool(self._m.unsettled or self._m.compensating)
            and self.outcome == EpisodeStatus.RUNNING
            and not interrupted
        )

    def _wind_up(self, *, can_await: bool) -> Steps:
        """Settle the calls left in doubt (cancelled, or refused by the store), and finish a
        rollback cut short (its task cancelled): the state is part undone, which no outcome but
        rolled_back (or escalated) describes."""
        yield from self._settler.settle_unsettled(can_await)
        if self._m.compensating and self.outcome == EpisodeStatus.RUNNING:
            yield from self.rollback_steps(
                reason="finishing a rollback that was cut short", can_await=can_await
            )

    async def asettle(self) -> None:
        """Settle the calls left in doubt (cancelled, or refused by the store) now: probe the
        state, then commit, compensate or escalate each. Calls do this first anyway; this is
        for when the next call is sync and an async one is in doubt."""
        async with self._gate.aheld():
            await adrive(self._settler.settle_unsettled(True), self.clock)

    # --- rollback ---
    def _not_in_a_tool(self) -> None:
        running = ACTIVE_CALL.get()
        if running is not None and running.in_tool and running.episode_id == self.id:
            raise ConfigurationError(
                f"rollback() was called from inside the tool of {running.action!r}, which is "
                "still running; let the tool fail (raise) and the policy roll back, or roll "
                "back from the agent after the call"
            )

    def rollback(self) -> None:
        """Compensate every committed action, newest first, and verify the state is back."""
        self._not_in_a_tool()
        with self._gate.held():
            drive(self._saga.steps(reason="requested", can_await=False), self.clock)

    async def arollback(self) -> None:
        """``rollback`` for episodes whose compensations are async."""
        self._not_in_a_tool()
        async with self._gate.aheld():
            await adrive(self._saga.steps(reason="requested", can_await=True), self.clock)

    # --- resume: the record's answers ---
    def _replayed(self, action: Action[Any, Any], key: str, step: RecordedStep) -> Steps:
        """A call the record has: the agent gets its recorded outcome; nothing is executed."""
        if step.kind == "dedup" and step.txn_id is None and self._store_scoped(action):
            # Answered by another episode's call: its result is in that episode's row.
            holder = key_holder(self._writer, key)
            return None if holder is None or not holder.applied else _stored_result(action, holder)
        if step.returned:
            entry = self._m.by_txn.get(step.txn_id or "")
            if entry is not None and entry.impl is None:
                entry.impl = action
            if step.kind == "action" and action.mutating and step.status != TxnStatus.COMPENSATED:
                self.recorder.note(
                    "dedup", step.txn_id, {"action": action.name, "key": key, "replay": True}
                )
            return entry.result_for(action) if entry is not None else step.result
        row = step.row
        if row is None:  # pragma: no cover - steps without a row are live
            raise ConfigurationError(f"step {step.step} of episode {self.id} has no outcome")
        error = rebuilt_error(row)
        if row.decision == "rollback":
            # The call's failure rolled the episode back; a crash may have cut the saga short.
            if self._m.rolled_back:
                self.outcome = EpisodeStatus.ROLLED_BACK
            else:
                yield from self._saga.steps(
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
        if self.diverged is not None:
            raise self.diverged
        if self._cursor:
            step = self._cursor.expect_remembered(what, request)
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
        self.recorder.note_hot(REMEMBERED, payload)
        return loads(payload)["value"]

    def _log_divergence(self, error: Diverged) -> None:
        """A divergence from the record found on resume: logged (every later call raises it)."""
        detail = {"step": error.step, "expected": error.expected, "actual": error.actual}
        self.recorder.note_text("diverged", None, _jsonable(detail))
        self.log.warning("diverged", step=error.step)

    # --- introspection ---
    @property
    def active_context(self) -> Context | None:
        """The context of this episode's call whose tool is running in this thread or task."""
        ctx = ACTIVE_CALL.get()
        return ctx if ctx is not None and ctx.episode_id == self.id else None

    @property
    def in_doubt(self) -> list[str]:
        """Idempotency keys of actions with an intent and no outcome (after a resume)."""
        return sorted(self._m.in_doubt)

    def __repr__(self) -> str:
        return f"<Episode {self.id} {self.outcome} steps={self.steps}>"
