"""The episode's saga: it compensates what the episode committed, newest first."""

from __future__ import annotations

from typing import Any

from ..action import Action, Context
from ..errors import CompensationFailed, ConfigurationError, WriteConflict
from ..policy import Decision, FailureClass
from ..store import EpisodeStatus, TxnStatus
from ..transaction import Host, Steps, Transaction, compensate, is_undone
from .memory import Memory
from .recorder import Recorder
from .settle import Settler
from .values import Committed, _missing_action

__all__ = ["Saga"]


class Saga:
    """Rolls one episode back: compensates its commits in reverse order and verifies each.

    Args:
        memory: the episode's memory.
        recorder: writes the rollback's records.
        settler: settles calls in doubt first (a call found applied is rolled back too).
        host: the episode the compensating transactions belong to.
        state: the episode's state adapter.
        actions: the actions the episode knows, by name (to compensate after a resume).
    """

    def __init__(
        self,
        memory: Memory,
        recorder: Recorder,
        settler: Settler,
        host: Host,
        state: Any,
        actions: dict[str, Action[Any, Any]],
    ) -> None:
        self.m = memory
        self.rec = recorder
        self.settler = settler
        self.host = host
        self.state = state
        self.actions = actions

    def steps(self, *, reason: str, can_await: bool) -> Steps:
        """The saga: compensate in reverse order; a failed undo escalates.

        Calls left in doubt by the store are settled first: one whose effect is found present
        commits (and is compensated with the rest), so "rolled back" covers it too.
        """
        if self.rec.writer is None:
            raise ConfigurationError(f"episode {self.m.id} is not open; roll back inside `with`")
        if self.m.unrecorded:
            self.rec.flush_unrecorded()
        if self.m.unsettled:
            yield from self.settler.settle_unsettled(can_await)
            if self.m.unsettled:
                raise ConfigurationError(
                    f"episode {self.m.id} has an async call in doubt "
                    f"({', '.join(self.m.unsettled)}) that a sync rollback cannot settle; use "
                    "`await episode.arollback()`"
                )
        self.rec.note("rollback", None, {"reason": reason})
        for entry in reversed(self.m.committed):
            if not entry.mutating or entry.compensated:
                continue
            impl = entry.impl or self.actions.get(entry.action)
            txn = self._replay_txn(entry, impl)
            # A compensation a crash cut short: if the effect is undone (the state is back, or the
            # action's compensation check holds), it ran; do not run it twice.
            undone = False
            if entry.txn_id in self.m.compensating:
                check = impl if impl is not None else txn.action
                undone = not (yield from is_undone(check, txn.ctx, entry.diff))
            semantic = impl is not None and impl.undo_check is not None
            if not undone:
                self.rec.note("compensating", entry.txn_id, {"action": entry.action})
                # Until its outcome is recorded, a cut-short rollback knows it may have run.
                self.m.compensating.add(entry.txn_id)
                try:
                    if impl is None:
                        raise CompensationFailed(
                            entry.action,
                            "its implementation is unknown after resume; pass it in "
                            "Episode(actions=[...])",
                            txn_id=entry.txn_id,
                        )
                    semantic = yield from compensate(impl, txn.ctx, entry.diff)
                except (CompensationFailed, WriteConflict) as exc:
                    # A failed undo, or one that would have written over another writer's
                    # change (then nothing was restored): a person decides what is left.
                    failure = (
                        FailureClass.CONFLICT
                        if isinstance(exc, WriteConflict)
                        else FailureClass.COMPENSATION
                    )
                    txn.errors.append(exc)
                    if isinstance(exc, WriteConflict):
                        txn.others = exc.others
                    self.rec.record_failure(
                        txn, failure, Decision.ESCALATE, exc.reason, entry.diff, existing=True
                    )
                    raise self.rec.escalate(txn, failure, exc.reason, entry.diff) from exc
            entry.compensated = True
            self.m.compensating.discard(entry.txn_id)
            self.m.done.pop(entry.key, None)
            with self.rec.writer.batch():
                self.rec.writer.update_txn(entry.txn_id, {"status": TxnStatus.COMPENSATED})
                record: dict[str, Any] = {"action": entry.action}
                if undone:
                    record["found_undone"] = True
                if semantic:
                    record["semantic"] = True  # judged by its compensation check
                self.rec.writer.append("compensated", entry.txn_id, record)
                self.rec.update_episode()
            self.rec.log.info("compensated", txn_id=entry.txn_id, action=entry.action)
        self.m.pivot = None
        self.m.outcome = EpisodeStatus.ROLLED_BACK
        self.m.rolled_back = True
        self.rec.note("rolled_back", None, {"reason": reason})

    def _replay_txn(self, entry: Committed, impl: Action[Any, Any] | None) -> Transaction:
        """A transaction object for compensating ``entry`` (its context rebuilt)."""
        action = impl if impl is not None else _missing_action(entry.action)
        model = action.validate_mapping(dict(entry.args)) if impl is not None else None
        ctx = Context(entry.action, model, self.state, self.m.id)
        ctx.txn_id, ctx.idempotency_key = entry.txn_id, entry.key
        ctx.result = entry.result_for(impl) if impl is not None else entry.result
        ctx.before = dict(entry.before)
        ctx.after = {k: a for k, (_, a) in entry.diff.items()}
        for k, (b, _) in entry.diff.items():
            ctx.before.setdefault(k, b)
        return Transaction(self.host, action, ctx)
