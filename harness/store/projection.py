"""Transaction rows and checkpoints as projections of the log.

On the hot path a committed call writes one log record (its outcome) after its intent record;
the ``hx_transaction`` row and the ``hx_checkpoint`` row it stands for are written later, in
bulk, by the episode's next other write or its end (:meth:`EpisodeWriter.flush`). Until then
(and after a crash) readers build them from the log with :func:`committed_row`, the same
function the writer uses, so a materialised row and a derived one cannot differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._json import dumps, loads
from ..errors import StoreError
from .tables import CheckpointRow, LogRow, TransactionRow, transaction_row, txn_seq

HOT_OUTCOMES = frozenset({"committed", "recovered"})
"""Outcome kinds written on the hot path: their rows are materialised later."""

HOT_NOTES = frozenset({"recorded"})
"""Records of no transaction written on the hot path: a remembered value (a model's answer, a
tool's read; :data:`harness.episode.cursor.REMEMBERED`). The episode's row follows with the
next write."""


def committed_row(
    episode_id: str,
    txn_id: str,
    kind: str,
    payload: Mapping[str, Any],
    ts: float,
    intent: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ``hx_transaction`` row of a commit record (and, for a write, its intent record).

    A write's call (action, key, arguments, before-values, start) is in its intent; a read has
    no intent, and its commit record carries them.
    """
    call = intent if intent is not None else payload
    return transaction_row(
        episode_id=episode_id,
        seq=txn_seq(txn_id),
        action=payload["action"],
        idem_key=call["key"],
        args=dumps(call["args"]),
        before=dumps(call["before"]),
        mutating=payload["step"] is not None,
        status=kind,
        result=dumps(payload["result"]),
        diff=dumps(payload["diff"]),
        attempts=payload["attempts"],
        errors=dumps(payload["errors"]),
        started_at=call["started"],
        ended_at=ts,
        duration=payload["duration"],
        step=payload["step"],
    )


def checkpoint_row(
    episode_id: str, txn_id: str, payload: Mapping[str, Any], ts: float
) -> dict[str, Any] | None:
    """The ``hx_checkpoint`` row of a commit record (None for a read: it makes no step)."""
    if payload["step"] is None:
        return None
    return {
        "episode_id": episode_id,
        "step": payload["step"],
        "txn_id": txn_id,
        "digest": payload["digest"],
        "created_at": ts,
    }


def derive(
    log: Iterable[LogRow], materialised: set[str]
) -> tuple[list[TransactionRow], list[CheckpointRow]]:
    """Rows for the hot-path commits in ``log`` whose transaction has no row yet."""
    intents: dict[str, str] = {}
    rows: list[TransactionRow] = []
    checkpoints: list[CheckpointRow] = []
    for rec in log:
        txn = rec.txn_id
        if txn is None or txn in materialised:
            continue
        if rec.kind == "intent":
            intents[txn] = rec.payload
        elif rec.kind in HOT_OUTCOMES:
            intent = intents.get(txn)
            try:
                payload = loads(rec.payload)
                row = committed_row(
                    rec.episode_id,
                    txn,
                    rec.kind,
                    payload,
                    rec.ts,
                    None if intent is None else loads(intent),
                )
                cp = checkpoint_row(rec.episode_id, txn, payload, rec.ts)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise StoreError(
                    f"episode {rec.episode_id}: log record {rec.seq} ({rec.kind} {txn}) does "
                    f"not read as a commit ({type(exc).__name__}: {exc}), or its intent "
                    "record does not: the log was altered. `harness audit --verify` names the "
                    "first altered record"
                ) from exc
            rows.append(TransactionRow(**row))
            if cp is not None:
                checkpoints.append(CheckpointRow(**cp))
    return rows, checkpoints
