"""Reading a run folder, and one episode's record as a timeline."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StoreError
from ..report import RunNotFound
from ..store import SCHEMA_VERSION, EpisodeRow, EscalationRow, RunRow, Store, TrialRow

__all__ = [
    "OpenRun",
    "check_database",
    "episode_summaries",
    "open_run",
    "pending_escalations",
    "timeline",
]


def _loads(text: str | None, default: Any = None) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return text


def _shorter_than_its_header(db: Path) -> str:
    """Why the file is cut short, judging by its SQLite header ("" when it is not)."""
    with db.open("rb") as f:
        header = f.read(100)
    size = db.stat().st_size
    if not header.startswith(b"SQLite format 3\x00") or len(header) < 100:
        return ""  # not SQLite at all: opening it says so
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96]  # the in-header size is current
    if valid and size < pages * page_size:
        return f"truncated: {size} bytes of the {pages * page_size} its header records"
    return ""


def check_database(db: Path) -> None:
    """Refuse, without writing to it, a database that is damaged or from a newer harness.

    Raises:
        StoreError: naming the file, what is wrong and what to do.
    """
    short = _shorter_than_its_header(db)
    if short:
        raise StoreError(
            f"{db} is damaged ({short}); nothing was written. Restore it from a copy, or save "
            f"what is readable with `sqlite3 {db} .recover`"
        )
    # Without a write-ahead log to read, open it immutable: not even a -shm file is created.
    mode = "mode=ro" if Path(f"{db}-wal").exists() else "mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?{mode}", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{db} does not open ({exc}); check its permissions") from exc
    try:
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise StoreError(
                f"{db} is damaged ({'; '.join(problems[:3])}); nothing was written. Restore it "
                f"from a copy, or save what is readable with `sqlite3 {db} .recover`"
            )
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "hx_meta" in tables:
            row = conn.execute("SELECT value FROM hx_meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{db} has schema version {version}, newer than this harness understands "
                    f"({SCHEMA_VERSION}); nothing was written. Upgrade harness to read it"
                )
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"{db} is damaged or not a database ({exc}); nothing was written. Restore it "
            f"from a copy, or save what is readable with `sqlite3 {db} .recover`"
        ) from exc
    finally:
        conn.close()


@dataclass
class OpenRun:
    """A run folder opened for reading: its store, run row, configuration and evidence."""

    folder: Path
    db: Path
    store: Store
    run: RunRow
    config: dict[str, Any]
    evidence: dict[str, Any]


@contextmanager
def open_run(path: str | Path) -> Iterator[OpenRun]:
    """Open the run in ``path`` (``logs/<run>`` or its ``harness.db``); nothing is created.

    Raises:
        RunNotFound: the folder does not exist, has no ``harness.db``, or holds no run.
        StoreError: the database is damaged or from a newer harness (nothing is written).
    """
    folder = Path(path)
    if folder.suffix == ".db" and folder.is_file():
        folder = folder.parent
    if not folder.exists():
        raise RunNotFound(
            folder,
            f"no run folder {folder}: give the folder `harness run` printed (logs/<run>)",
        )
    if not folder.is_dir():
        raise RunNotFound(folder, f"{folder} is a file, not a run folder: give logs/<run>")
    db = folder / "harness.db"
    if not db.is_file():
        raise RunNotFound(
            folder,
            f"{folder} has no harness.db, so it is not a run folder: give the folder "
            "`harness run` printed (logs/<run>)",
        )
    check_database(db)
    store = Store(db)
    try:
        runs = {r.id: r for r in store.runs()}
        if not runs:
            raise RunNotFound(folder, f"{db} holds no run record: was it written by `harness run`?")
        if folder.name in runs:
            run = runs[folder.name]
        elif len(runs) == 1:
            (run,) = runs.values()
        else:
            raise RunNotFound(
                folder,
                f"{db} holds {len(runs)} runs ({', '.join(sorted(runs))}) and none is named after "
                f"the folder {folder.name!r}",
            )
        evidence = _loads(run.evidence, {}) or {}
        if not evidence and (folder / "evidence.json").is_file():
            evidence = _loads((folder / "evidence.json").read_text(encoding="utf-8"), {})
        opened = OpenRun(folder, db, store, run, _loads(run.config, {}) or {}, evidence)
        yield opened
    finally:
        store.close()


def episode_summaries(
    run: OpenRun,
    *,
    episode: str | None = None,
    task: str | None = None,
    failure_class: str | None = None,
) -> list[EpisodeRow]:
    """The run's episodes, oldest first, filtered by id, task and failure class.

    Raises:
        RunNotFound: ``episode`` is not an episode of the run.
    """
    rows = run.store.episodes(run.run.id)
    if episode is not None:
        rows = [r for r in rows if r.id == episode]
        if not rows:
            raise RunNotFound(
                run.folder,
                f"no episode {episode!r} in run {run.run.id}; `harness audit {run.folder}` "
                "lists them",
            )
    if task is not None:
        rows = [r for r in rows if r.task_id == task]
    if failure_class is not None:
        rows = [
            r
            for r in rows
            if any(t.failure_class == failure_class for t in run.store.transactions(r.id))
        ]
    return rows


def pending_escalations(run: OpenRun, *, every: bool = False) -> list[EscalationRow]:
    """The run's escalations waiting for a person (all of them with ``every``)."""
    ids = {e.id for e in run.store.episodes(run.run.id)}
    rows = run.store.escalations(None if every else "pending")
    return [e for e in rows if e.episode_id in ids]


def _diff(text: str | None) -> dict[str, dict[str, Any]]:
    data = _loads(text, {}) or {}
    if not isinstance(data, dict):
        return {}
    return {k: {"before": v[0], "after": v[1]} for k, v in data.items() if isinstance(v, list)}


def timeline(store: Store, episode: EpisodeRow, trial: TrialRow | None = None) -> dict[str, Any]:
    """One episode's record as JSON-ready data: its events in the order they happened.

    Each transaction appears once, where the agent called it, with its final status; the log's
    other records (resume, dedup, recorded reads and model calls, escalations, resolutions,
    rollback, divergence) appear where they were written.
    """
    rows = {r.id: r for r in store.transactions(episode.id)}
    checkpoints = {c.txn_id: c for c in store.checkpoints(episode.id)}
    escalations = {e.id: e for e in store.escalations(episode_id=episode.id)}
    events: list[dict[str, Any]] = []
    placed: set[str] = set()
    counts: dict[str, int] = {}
    for rec in store.log(episode.id):
        payload = _loads(rec.payload, {}) or {}
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
                        "status": "in_doubt",
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
                    "arguments": _loads(row.args, {}),
                    "key": row.idem_key,
                    "status": row.status,
                    "mutating": row.mutating,
                    "decision": row.decision,
                    "failure_class": row.failure_class,
                    "reason": row.reason,
                    "attempts": row.attempts,
                    "errors": _loads(row.errors, []),
                    "started_at": row.started_at,
                    "duration": row.duration,
                    "result": _loads(row.result),
                    "diff": _diff(row.diff),
                    "checkpoint": None if cp is None else {"step": cp.step, "digest": cp.digest},
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
        elif rec.kind not in ("committed", "recovered", "precondition", "invalid"):
            events.append({**base, "txn_id": txn, **payload})
    verdict = _loads(trial.verdict, {}) if trial is not None else None
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
        "verdict": verdict,
        "message": None if trial is None else trial.message,
        "recorded": counts,
        "escalations": [
            {
                "id": e.id,
                "txn_id": e.txn_id,
                "action": e.action,
                "failure_class": e.failure_class,
                "reason": e.reason,
                "status": e.status,
                "resolved_by": e.resolved_by,
                "resolution_reason": e.resolution_reason,
                "resolved_at": e.resolved_at,
                "edit": _loads(e.edit),
            }
            for e in escalations.values()
        ],
        "events": events,
    }
