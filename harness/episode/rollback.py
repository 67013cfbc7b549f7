"""The episode's rollback: the saga that compensates what it committed, newest first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..action import _ACTIVE, Action, Context
from ..errors import CompensationFailed, ConfigurationError
from ..policy import Decision, FailureClass
from ..transaction import Steps, Transaction, adrive, compensate, drive, is_undone
from .gate import Gate
from .records import _Records
from .values import Committed, _missing_action

if TYPE_CHECKING:
    from .core import Episode


class _Rollback(_Records):
    """Rolls the episode back (mixed into :class:`Episode`)."""

    state: Any
    _actions: dict[str, Action[Any, Any]]
    _compensating: set[str]
    _rolled_back: bool
    _gate: Gate
    _settle_unsettled: Callable[[bool], Steps]  # (the resume layer's)

    # --- rollback ---
    def _not_in_a_tool(self) -> None:
        running = _ACTIVE.get()
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
            drive(self.rollback_steps(reason="requested", can_await=False), self.clock)

    async def arollback(self) -> None:
        """``rollback`` for episodes whose compensations are async."""
        self._not_in_a_tool()
        async with self._gate.aheld():
            await adrive(self.rollback_steps(reason="requested", can_await=True), self.clock)

    def rollback_steps(self, *, reason: str, can_await: bool) -> Steps:
        """The saga: compensate in reverse order; a failed undo escalates.

        Calls left in doubt by the store are settled first: one whose effect is found present
        commits (and is compensated with the rest), so "rolled back" covers it too.
        """
        if self._writer is None:
            raise ConfigurationError(f"episode {self.id} is not open; roll back inside `with`")
        if self._unrecorded:
            self._flush_unrecorded()
        if self._unsettled:
            yield from self._settle_unsettled(can_await)
            if self._unsettled:
                raise ConfigurationError(
                    f"episode {self.id} has an async call in doubt ({', '.join(self._unsettled)}) "
                    "that a sync rollback cannot settle; use `await episode.arollback()`"
                )
        with self._writer.batch():
            self._writer.append("rollback", None, {"reason": reason})
            self._update_episode()
        for entry in reversed(self.committed):
            if not entry.mutating or entry.compensated:
                continue
            impl = entry.impl or self._actions.get(entry.action)
            txn = self._replay_txn(entry, impl)
            # A compensation a crash cut short: if the effect is undone (the state is back, or the
            # action's compensation check holds), it ran; do not run it twice.
            undone = False
            if entry.txn_id in self._compensating:
                check = impl if impl is not None else txn.action
                undone = not (yield from is_undone(check, txn.ctx, entry.diff))
            semantic = impl is not None and impl.undo_check is not None
            if not undone:
                with self._writer.batch():
                    self._writer.append("compensating", entry.txn_id, {"action": entry.action})
                    self._update_episode()
                # Until its outcome is recorded, a cut-short rollback knows it may have run.
                self._compensating.add(entry.txn_id)
                try:
                    if impl is None:
                        raise CompensationFailed(
                            entry.action,
                            "its implementation is unknown after resume; pass it in "
                            "Episode(actions=[...])",
                            txn_id=entry.txn_id,
                        )
                    semantic = yield from compensate(impl, txn.ctx, entry.diff)
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
                record: dict[str, Any] = {"action": entry.action}
                if undone:
                    record["found_undone"] = True
                if semantic:
                    record["semantic"] = True  # judged by its compensation check
                self._writer.append("compensated", entry.txn_id, record)
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
        ctx.txn_id, ctx.idempotency_key = entry.txn_id, entry.key
        ctx.result = entry.result_for(impl) if impl is not None else entry.result
        ctx.before = dict(entry.before)
        ctx.after = {k: a for k, (_, a) in entry.diff.items()}
        for k, (b, _) in entry.diff.items():
            ctx.before.setdefault(k, b)
        # The mixin is only ever an Episode; the cast tells mypy so (no effect at run time).
        return Transaction(cast("Episode", self), action, ctx)
