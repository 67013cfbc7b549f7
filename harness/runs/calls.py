"""Every tool call of an episode, read back from its record: what the agent (and a user with
tools) called, in order, with what each gave back.

Reads and bare calls are remembered in the episode's log; writes are transactions, each placed
where its first log record is. Exports rebuild conversations from these, and an environment
that scores tau2's ``ACTION`` reward matches a task's reference actions against them: the
record, never the agent's account of what it called.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .._json import loads_or
from ..agents.base import ToolResult
from ..episode.cursor import REMEMBERED
from ..store import LogRow, Store, TransactionRow
from ..store.statuses import APPLIED
from .toolbox import BARE

__all__ = ["episode_calls", "record_calls"]


def _result_text(txn: TransactionRow) -> str:
    """A write's result as the model read it by default (a string as it is, another value as
    JSON), or the harness's reason it failed."""
    if txn.status in APPLIED:
        return _content_text(True, loads_or(txn.result, None), None)
    return f"Error: {txn.reason or txn.failure_class or txn.status}"


def _content_text(ok: bool, content: Any, error: str | None, text: Any = None) -> str:
    """A recorded read's or bare call's result as the model read it (``ToolResult.as_text``:
    the environment's words when it chose them)."""
    return ToolResult(ok, content, error, text=text if isinstance(text, str) else None).as_text()


def _txn_step(txn: TransactionRow) -> dict[str, Any]:
    applied = txn.status in APPLIED
    return {
        "id": f"call_{txn.id}",
        "name": txn.action,
        "arguments": loads_or(txn.args, {}),
        "content": _result_text(txn),
        "error": not applied,
        **({"value": loads_or(txn.result, None)} if applied else {}),
        "start": txn.started_at,
        "end": txn.ended_at or txn.started_at,
    }


def episode_calls(store: Store, episode_id: str) -> list[dict[str, Any]]:
    """Every tool call of an episode, in the order they were made (:func:`record_calls` of its
    log and transactions)."""
    return record_calls(episode_id, store.log(episode_id), store.transaction_rows(episode_id))


def record_calls(
    episode_id: str, log: Iterable[LogRow], transactions: Sequence[TransactionRow]
) -> list[dict[str, Any]]:
    """Every tool call an episode's record holds, in the order they were made: reads and bare
    calls (remembered in the log) and writes (transactions, placed at their first log record).
    Each is ``{id, name, arguments, content, error, start, end}``, with ``value`` (what a
    write that took effect returned) and ``requestor`` (a read's: ``assistant`` or ``user``)
    where the record holds them; ``content`` is the text the model read (a write's by
    default: its environment may word it otherwise, see ``tool_message``)."""
    rows = {t.id: t for t in transactions}
    steps: list[tuple[float, dict[str, Any]]] = []
    placed: set[str] = set()
    for entry in sorted(log, key=lambda r: r.seq):
        if entry.txn_id is not None and entry.txn_id in rows and entry.txn_id not in placed:
            placed.add(entry.txn_id)
            txn = rows[entry.txn_id]
            steps.append((entry.seq, _txn_step(txn)))
            continue
        if entry.kind != REMEMBERED:
            continue
        payload = loads_or(entry.payload, {})
        if not isinstance(payload, dict):
            continue
        request, value = payload.get("request") or {}, payload.get("value")
        if payload.get("what") == "tool_message" and isinstance(value, str):
            # The words the model read for a refused write: they replace the harness's reason.
            for _, step in reversed(steps):
                if step["name"] == request.get("tool") and step["error"]:
                    step["content"] = value
                    break
            continue
        if payload.get("what") not in ("read", BARE) or not isinstance(value, dict):
            continue
        ok = bool(value.get("ok"))
        steps.append(
            (
                entry.seq,
                {
                    "id": f"call_{episode_id}_{entry.seq}",
                    "name": str(request.get("tool", "")),
                    "arguments": dict(request.get("arguments") or {}),
                    "content": _content_text(
                        ok, value.get("content"), value.get("error"), value.get("text")
                    ),
                    "error": not ok,
                    "start": entry.ts,
                    "end": entry.ts,
                    "requestor": str(request.get("requestor") or "assistant"),
                },
            )
        )
    late = sorted((t for t in rows.values() if t.id not in placed), key=lambda t: t.seq)
    last = max((seq for seq, _ in steps), default=0)
    steps += [(last + 1 + i, _txn_step(t)) for i, t in enumerate(late)]
    return [step for _, step in sorted(steps, key=lambda p: p[0])]
