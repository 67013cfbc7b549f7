"""Reading a run folder, and one episode's record as a timeline."""

from __future__ import annotations

from typing import Any

from .._json import loads_or
from ..errors import StoreError
from ..report.model import infra_cause
from ..runs.layout import OpenStore
from ..store import EpisodeRow, EscalationRow, EscalationStatus, Store, TrialRow, TxnStatus
from .diffs import field_changes

__all__ = [
    "episode_summaries",
    "escalation_view",
    "pending_escalations",
    "timeline",
]


def episode_summaries(
    opened: OpenStore,
    *,
    episode: str | None = None,
    task: str | None = None,
    failure_class: str | None = None,
) -> list[EpisodeRow]:
    """The run's (or the whole store's) episodes, oldest first, filtered by id, task and
    failure class.

    Raises:
        StoreError: ``episode`` is not an episode of the run or store.
    """
    rows = opened.store.episodes(opened.run_id)
    if episode is not None:
        rows = [r for r in rows if r.id == episode]
        if not rows:
            within = f"run {opened.run_id}" if opened.run_id else opened.where
            raise StoreError(
                f"no episode {episode!r} in {within}; `harness audit {opened.where}` lists them"
            )
    if task is not None:
        rows = [r for r in rows if r.task_id == task]
    if failure_class is not None:
        rows = [
            r
            for r in rows
            if any(t.failure_class == failure_class for t in opened.store.transaction_rows(r.id))
        ]
    return rows


def pending_escalations(opened: OpenStore, *, every: bool = False) -> list[EscalationRow]:
    """The run's (or store's) escalations waiting for a person (all of them with ``every``)."""
    rows = opened.store.escalation_rows(None if every else EscalationStatus.PENDING)
    if opened.run_id is None:
        return rows
    ids = {e.id for e in opened.store.episodes(opened.run_id)}
    return [e for e in rows if e.episode_id in ids]


def escalation_view(e: EscalationRow) -> dict[str, Any]:
    """An escalation as the person deciding it reads it, values rather than JSON text: what
    is asked (the action and its arguments), why, the evidence (the diff the call made, its
    errors, another writer's change to the same resources) and where the decision stands."""
    evidence = loads_or(e.evidence, {}, keep_text=True)
    return {
        "id": e.id,
        "episode_id": e.episode_id,
        "txn_id": e.txn_id,
        "action": e.action,
        "args": loads_or(e.args, {}, keep_text=True),
        "idem_key": e.idem_key,
        "failure_class": e.failure_class,
        "reason": e.reason,
        "diff": _diff(evidence.get("diff") if isinstance(evidence, dict) else None),
        "evidence": evidence,
        "status": e.status,
        "created_at": e.created_at,
        "deadline": e.deadline,
        "fallback": e.fallback,
        "resolved_by": e.resolved_by,
        "resolved_at": e.resolved_at,
        "resolution_reason": e.resolution_reason,
        "edit": loads_or(e.edit, None, keep_text=True),
    }


def _diff(value: Any) -> dict[str, dict[str, Any]]:
    """A stored diff (``{resource: [before, after]}``, as JSON text or a value) with each
    resource's field changes."""
    data = loads_or(value, {}, keep_text=True) if isinstance(value, str | None) else value
    if not isinstance(data, dict):
        return {}
    return {
        k: {
            "before": v[0],
            "after": v[1],
            "fields": [c.describe() for c in field_changes(v[0], v[1])],
        }
        for k, v in data.items()
        if isinstance(v, list) and len(v) == 2
    }


def timeline(store: Store, episode: EpisodeRow, trial: TrialRow | None = None) -> dict[str, Any]:
    """One episode's record as JSON-ready data: its events in the order they happened.

    Each transaction appears once, where the agent called it, with its final status; the log's
    other records (resume, dedup, recorded reads and model calls, escalations, resolutions,
    rollback, divergence) appear where they were written.
    """
    rows = {r.id: r for r in store.transaction_rows(episode.id)}
    checkpoints = {c.txn_id: c for c in store.checkpoints(episode.id)}
    escalations = {e.id: e for e in store.escalation_rows(episode_id=episode.id)}
    events: list[dict[str, Any]] = []
    placed: set[str] = set()
    counts: dict[str, int] = {}
    for rec in store.log(episode.id):
        payload = loads_or(rec.payload, {}, keep_text=True) or {}
        base = {"seq": rec.seq, "ts": rec.ts, "kind": rec.kind}
        txn = rec.txn_id
        if (
            txn
            and txn not in placed
            and rec.kind
            in (
                "intent",
                "committed",
                "recovered",
                "precondition",
                "invalid",
                "decision",
                "held",
            )
        ):
            placed.add(txn)
            row = rows.get(txn)
            if row is None:
                events.append(
                    {
                        **base,
                        "kind": "transaction",
                        "txn_id": txn,
                        "action": payload.get("action"),
                        "arguments": payload.get("args"),
                        "status": TxnStatus.IN_DOUBT,
                        "diff": {},
                    }
                )
                continue
            cp = checkpoints.get(txn)
            events.append(
                {
                    **base,
                    "kind": "transaction",
                    "txn_id": txn,
                    "action": row.action,
                    "arguments": loads_or(row.args, {}, keep_text=True),
                    "key": row.idem_key,
                    "status": row.status,
                    "mutating": row.mutating,
                    "decision": row.decision,
                    "failure_class": row.failure_class,
                    "reason": row.reason,
                    "attempts": row.attempts,
                    "errors": loads_or(row.errors, [], keep_text=True),
                    "started_at": row.started_at,
                    "duration": row.duration,
                    "result": loads_or(row.result, None, keep_text=True),
                    "diff": _diff(row.diff),
                    "checkpoint": None if cp is None else {"step": cp.step, "digest": cp.digest},
                    # A call held for a person: their decision on it (the row stays "held";
                    # an approved call runs again as a transaction of its own).
                    "decided": _decided(row, escalations.values()),
                }
            )
        elif rec.kind == "escalation":
            esc = escalations.get(str(payload.get("escalation_id")))
            events.append(
                {
                    **base,
                    "txn_id": txn,
                    "escalation_id": payload.get("escalation_id"),
                    "action": payload.get("action"),
                    "args": payload.get("args"),
                    "failure_class": payload.get("failure_class"),
                    "reason": payload.get("reason"),
                    "status": esc.status if esc else "missing",
                    "resolved_by": esc.resolved_by if esc else None,
                    "resolution_reason": esc.resolution_reason if esc else None,
                    "resolved_at": esc.resolved_at if esc else None,
                }
            )
        elif rec.kind == "recorded":
            what = str(payload.get("what"))
            counts[what] = counts.get(what, 0) + 1
            events.append({**base, "what": what, "request": payload.get("request")})
        elif rec.kind in ("intent", "decision") and txn in placed:
            if payload.get("decision") == "retry" and "failure_class" not in payload:
                events.append({**base, "kind": "retry", "txn_id": txn, **payload})
        elif rec.kind not in ("committed", "recovered", "precondition", "invalid", "held"):
            events.append({**base, "txn_id": txn, **payload})
    verdict = loads_or(trial.verdict, {}, keep_text=True) if trial is not None else None
    return {
        "episode_id": episode.id,
        "run_id": episode.run_id,
        "task_id": episode.task_id,
        "trial": episode.trial,
        "status": episode.status,
        "steps": episode.steps,
        "digest": episode.digest,
        "created_at": episode.created_at,
        "updated_at": episode.updated_at,
        "passed": None if trial is None else trial.passed,
        "infra_cause": infra_cause(trial) if trial is not None and trial.infra_error else None,
        "verdict": verdict,
        "message": None if trial is None else trial.message,
        "recorded": counts,
        "escalations": [escalation_view(e) for e in escalations.values()],
        "events": events,
    }


def _decided(row: Any, escalations: Any) -> dict[str, Any] | None:
    """A held call's escalation as it stands: pending, or approved, rejected or edited, by
    whom and why (None for a call that was not held)."""
    if row.status != TxnStatus.HELD:
        return None
    for e in escalations:
        if e.txn_id == row.id:
            return {
                "escalation_id": e.id,
                "status": e.status,
                "by": e.resolved_by,
                "reason": e.resolution_reason,
                "edit": loads_or(e.edit, None, keep_text=True),
            }
    return {"escalation_id": None, "status": "missing", "by": None, "reason": None, "edit": None}
