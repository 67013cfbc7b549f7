"""Reading a run folder, and one episode's record as a timeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._json import loads_or
from ..errors import StoreError
from ..report.model import infra_cause
from ..runs.layout import OpenStore
from ..store import EpisodeRow, EscalationRow, EscalationStatus, Store, TrialRow, TxnStatus
from ..store.verify import Finding
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


def timeline(
    store: Store,
    episode: EpisodeRow,
    trial: TrialRow | None = None,
    findings: Sequence[Finding] | None = None,
) -> dict[str, Any]:
    """One episode's record as JSON-ready data: its events in the order they happened.

    Each transaction appears once, where the agent called it, with its final status; the log's
    other records (resume, dedup, recorded reads and model calls, escalations, resolutions,
    rollback, divergence) appear where they were written.

    Given what verification found (``findings``, of any episodes: :func:`mark`), the timeline
    says whether the episode verified and marks each item a finding names.
    """
    rows = {r.id: r for r in store.transaction_rows(episode.id)}
    checkpoints = {c.txn_id: c for c in store.checkpoints(episode.id)}
    escalations = {e.id: e for e in store.escalation_rows(episode_id=episode.id)}
    events: list[dict[str, Any]] = []
    placed: set[str] = set()
    counts: dict[str, int] = {}
    log = store.log(episode.id)
    for rec in log:
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
    out = {
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
    if findings is not None:
        owners = {rec.seq: rec.txn_id for rec in log if rec.txn_id}
        mark(out, [f for f in findings if f.episode_id == episode.id], owners)
    return out


def mark(t: dict[str, Any], findings: Sequence[Finding], owners: dict[int, str]) -> None:
    """Mark on timeline ``t`` what verification found wrong in its episode (``findings``).

    The episode gets ``verified`` and its ``findings``, each saying where it is marked
    (``marked``). A finding naming a transaction, a checkpoint (its transaction), a log record
    (the event showing it: its own, or its transaction's) or an escalation marks that item
    (``verified: false`` and the ``findings`` on it); one naming the trial's row marks its
    verdict (``verdict_verified: false``); any other (the episode's row, its signature, its
    run) stays on the episode. ``owners`` gives the transaction of each log record that has one.
    """
    t["verified"] = not findings
    t["findings"] = []
    for finding in findings:
        said = finding.to_dict()
        items = _named(t, finding, owners)
        if finding.table == "hx_trial" and t.get("passed") is not None:
            t["verdict_verified"] = False
            said["marked"] = "verdict"
        elif items:
            for item in items:
                item["verified"] = False
                item.setdefault("findings", []).append(finding.to_dict())
            said["marked"] = " and ".join(_where(item) for item in items)
        else:
            said["marked"] = "episode"
        t["findings"].append(said)


def _named(t: dict[str, Any], f: Finding, owners: dict[int, str]) -> list[dict[str, Any]]:
    """The items of timeline ``t`` that finding ``f`` names: the event showing its record (its
    escalation in the list too), else the event showing the log record that proves it."""
    events = t["events"]
    txns = {e["txn_id"]: e for e in events if e["kind"] == "transaction"}
    by_seq = {e["seq"]: e for e in events}

    def shown(seq: int | None) -> dict[str, Any] | None:
        """The event showing log record ``seq``: its own, or its transaction's."""
        if seq is None:
            return None
        return by_seq.get(seq) or txns.get(owners.get(seq, ""))

    found: list[dict[str, Any]] = []
    if f.table == "hx_transaction":
        found = [txns[f.record]] if f.record in txns else []
    elif f.table == "hx_checkpoint":
        step = f.record.removeprefix("step ")
        found = [e for e in txns.values() if str((e.get("checkpoint") or {}).get("step")) == step]
    elif f.table == "hx_escalation":
        found = [
            e for e in events if e["kind"] == "escalation" and e.get("escalation_id") == f.record
        ]
        found += [e for e in t["escalations"] if e["id"] == f.record]
    elif f.table == "hx_log":
        found = [e] if (e := shown(f.log_seq)) is not None else []
    if not found and f.table in ("hx_transaction", "hx_checkpoint", "hx_escalation"):
        found = [e] if (e := shown(f.log_seq)) is not None else []
    return found


def _where(item: dict[str, Any]) -> str:
    """Where a marked item is on the timeline, as a finding's ``marked`` says it."""
    if item.get("kind") == "transaction":
        return f"transaction {item['txn_id']}"
    if "seq" in item:
        return f"log record {item['seq']}"
    return f"escalation {item['id']}"


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
