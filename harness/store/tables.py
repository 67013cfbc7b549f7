"""The schema: every table of the store, the hash that chains log records, and the chain
report."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, Index, Integer
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

from .statuses import EpisodeStatus, EscalationStatus, RunStatus

SCHEMA_VERSION = 2
GENESIS = "0" * 64
DEFAULT_URL = "sqlite:///logs/harness.db"


class _Base(SQLModel, registry=registry()):
    """Tables of the harness, in their own metadata so users' SQLModel tables stay separate."""


class MetaRow(_Base, table=True):
    __tablename__ = "hx_meta"
    key: str = Field(primary_key=True)
    value: str


class RunRow(_Base, table=True):
    """One run of a suite: many trials (episodes)."""

    __tablename__ = "hx_run"
    id: str = Field(primary_key=True)
    created_at: float
    suite: str = ""
    status: str = RunStatus.RUNNING
    config: str = "{}"
    evidence: str = "{}"


class EpisodeRow(_Base, table=True):
    """One agent execution: its outcome, its chain head and its last checkpoint."""

    __tablename__ = "hx_episode"
    id: str = Field(primary_key=True)
    # The episode's number in this store: its log records' keys start at ``num << 32``.
    num: int = Field(unique=True)
    run_id: str | None = Field(default=None, index=True)
    task_id: str | None = None
    trial: int | None = None
    status: str = EpisodeStatus.RUNNING
    created_at: float
    updated_at: float
    policy: str = "{}"
    meta: str = "{}"
    steps: int = 0
    digest: str = GENESIS
    log_count: int = 0
    head_hash: str = GENESIS


class TrialRow(_Base, table=True):
    """One trial of a task in a run: its verdict, outcome and the evidence behind them."""

    __tablename__ = "hx_trial"
    id: str = Field(primary_key=True)
    run_id: str = Field(index=True)
    task_id: str
    task_version: str = "1"
    trial: int
    seed: int
    episode_id: str
    passed: bool = False
    partial: float | None = None
    outcome: str = EpisodeStatus.RUNNING
    infra_error: bool = False
    failures: str = "{}"
    steps: str = "[]"
    message: str = ""
    verdict: str = "{}"
    agent_meta: str = "{}"
    duration: float = 0.0
    created_at: float


class TransactionRow(_Base, table=True):
    """One call of an action: intent, outcome, evidence."""

    __tablename__ = "hx_transaction"
    # Clustered by (episode, seq) without a rowid: one B-tree per write on the hot path.
    __table_args__ = {"sqlite_with_rowid": False}
    episode_id: str = Field(primary_key=True)
    seq: int = Field(primary_key=True)
    id: str
    action: str
    idem_key: str
    args: str
    status: str
    mutating: bool = True
    failure_class: str | None = None
    decision: str | None = None
    reason: str | None = None
    result: str | None = None
    before: str | None = None
    diff: str | None = None
    attempts: int = 0
    errors: str = "[]"
    started_at: float
    ended_at: float | None = None
    duration: float | None = None
    step: int | None = None


def txn_id(episode_id: str, seq: int) -> str:
    """A transaction's id: its episode and its sequence number in it (``<episode>:<seq>``)."""
    return f"{episode_id}:{seq}"


def txn_seq(txn: str) -> int:
    """The sequence number in a transaction id (:func:`txn_id`)."""
    return int(txn.rsplit(":", 1)[1])


def transaction_row(
    *,
    episode_id: str,
    seq: int,
    action: str,
    idem_key: str,
    args: str,
    status: str,
    started_at: float,
    mutating: bool = True,
    before: str | None = None,
    failure_class: str | None = None,
    decision: str | None = None,
    reason: str | None = None,
    result: str | None = None,
    diff: str | None = None,
    attempts: int = 0,
    errors: str = "[]",
    ended_at: float | None = None,
    duration: float | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """An ``hx_transaction`` row (:class:`TransactionRow`'s columns) as the writer inserts it.

    Every row is built here: the engine's records and the log's projection of a commit
    (:func:`harness.store.projection.committed_row`) must agree column for column.
    """
    return {
        "id": txn_id(episode_id, seq),
        "episode_id": episode_id,
        "seq": seq,
        "action": action,
        "idem_key": idem_key,
        "args": args,
        "before": before,
        "mutating": mutating,
        "status": status,
        "failure_class": failure_class,
        "decision": decision,
        "reason": reason,
        "result": result,
        "diff": diff,
        "attempts": attempts,
        "errors": errors,
        "started_at": started_at,
        "ended_at": ended_at,
        "duration": duration,
        "step": step,
    }


class SignatureRow(_Base, table=True):
    """A signed fact: an episode's head or a run's manifest, signed by a key kept outside the
    database (:mod:`harness.store.signing`)."""

    __tablename__ = "hx_signature"
    id: str = Field(primary_key=True)  # "<scope>:<subject>"
    scope: str  # "episode" or "run"
    subject: str  # the episode or run id
    message: str  # the canonical JSON that was signed
    signature: str  # base64 Ed25519 signature of the message
    key_id: str  # the first 16 hex digits of the SHA-256 of the raw public key
    created_at: float


class CheckpointRow(_Base, table=True):
    """A compact checkpoint: the step index and the state digest after it, never a copy."""

    __tablename__ = "hx_checkpoint"
    __table_args__ = {"sqlite_with_rowid": False}
    episode_id: str = Field(primary_key=True)
    step: int = Field(primary_key=True)
    txn_id: str
    digest: str
    created_at: float


class EscalationRow(_Base, table=True):
    """A decision left to a person: what, why, the evidence, and who resolved it how."""

    __tablename__ = "hx_escalation"
    id: str = Field(primary_key=True)
    episode_id: str = Field(index=True)
    txn_id: str
    action: str
    idem_key: str
    args: str
    failure_class: str
    reason: str
    evidence: str = "{}"
    status: str = EscalationStatus.PENDING
    created_at: float
    deadline: float | None = None
    fallback: str = "reject"
    resolved_by: str | None = None
    resolved_at: float | None = None
    resolution_reason: str | None = None
    edit: str | None = None


class LogRow(_Base, table=True):
    """One record of an episode's hash-chained log.

    Keyed by ``id = (episode num << 32) | seq``: an integer key is SQLite's rowid, so one
    append writes one B-tree (and at its right edge), and an episode's records are one range
    of it, read in chain order without a second index.
    """

    __tablename__ = "hx_log"
    id: int = Field(
        # SQLite makes only a column declared exactly INTEGER the rowid; elsewhere, 64 bits.
        sa_column=Column(
            BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
        )
    )
    episode_id: str
    seq: int
    txn_id: str | None = None
    kind: str
    payload: str
    ts: float
    hash: str


class FaultEventRow(_Base, table=True):
    """One injected fault (``harness.faults``) and what the harness made of it."""

    __tablename__ = "hx_fault_event"
    id: str = Field(primary_key=True)
    run_id: str | None = Field(default=None, index=True)
    episode_id: str = Field(index=True)
    task_id: str | None = None
    trial: int | None = None
    fault: str
    kind: str
    tool: str
    instance: str
    txn_id: str | None = None
    attempt: int | None = None
    call: int = 0
    at: float = 0.0
    wall: float = 0.0
    detail: str = "{}"
    detected: bool = False
    detected_as: str | None = None
    decision: str | None = None
    detect_latency: float | None = None
    recovered: bool = False
    recover_time: float | None = None
    re_executed: int = 0


# One column per count of harness.faults.TrialFaults: the row is that value, stored.
class FaultTrialRow(_Base, table=True):
    """A trial run under a fault plan: its events and its effects against the committed log."""

    __tablename__ = "hx_fault_trial"
    id: str = Field(primary_key=True)
    run_id: str | None = Field(default=None, index=True)
    task_id: str | None = None
    trial: int | None = None
    events: int = 0
    crashes: int = 0
    planned: bool = False
    executions: int = 0
    duplicated: int = 0
    lost: int = 0
    diverged: int = 0
    unaccounted: int = 0
    held: int = 0
    detail: str = "{}"


class LeaseRow(_Base, table=True):
    """Who executes an episode now: taken under the write lock, renewed, released after."""

    __tablename__ = "hx_lease"
    episode_id: str = Field(primary_key=True)
    owner: str
    pid: int
    host: str
    acquired_at: float
    expires_at: float


class LimitSlotRow(_Base, table=True):
    """A model request in flight under its run's limit (:mod:`harness.store.limiter`): whose,
    and until when unless its holder renews it."""

    __tablename__ = "hx_limit_slot"
    id: str = Field(primary_key=True)
    run_id: str = Field(index=True)
    url: str
    holder: str = Field(index=True)
    pid: int
    host: str
    expires_at: float


class LimitUseRow(_Base, table=True):
    """A request started (``kind`` ``request``) or the tokens a response used (``tokens``,
    ``amount`` of them), in its run's sliding window (:mod:`harness.store.limiter`)."""

    __tablename__ = "hx_limit_use"
    __table_args__ = (Index("ix_hx_limit_use_window", "run_id", "url", "kind", "at"),)
    id: int | None = Field(default=None, primary_key=True)
    run_id: str
    url: str
    kind: str
    at: float
    amount: int = 1


class CircuitRow(_Base, table=True):
    """A model server a process of the run found down: every process refuses its requests
    until ``until`` (:mod:`harness.store.limiter`)."""

    __tablename__ = "hx_circuit"
    run_id: str = Field(primary_key=True)
    url: str = Field(primary_key=True)
    until: float
    why: str
    failures: int = 0
    down_for: float = 0.0
    pid: int
    host: str


class KeyRow(_Base, table=True):
    """A store-wide idempotency key (``idempotency_scope="store"``) and the call holding it.

    The key counts as done while that call's transaction row says it applied (committed or
    recovered, not compensated); the result is read from that row, which the audit checks
    against the log.
    """

    __tablename__ = "hx_key"
    key: str = Field(primary_key=True)
    episode_id: str
    txn_id: str
    args: str  # the arguments as the holding call recorded them
    pid: int
    host: str
    claimed_at: float


SEQ_BITS = 32


def log_key(num: int, seq: int) -> int:
    """The key of record ``seq`` of the episode numbered ``num``."""
    return (num << SEQ_BITS) | seq


def log_range(num: int) -> dict[str, int]:
    """The keys of the episode numbered ``num``'s records, as ``lo`` and ``hi`` parameters."""
    lo = log_key(num, 0)
    return {"lo": lo, "hi": lo | ((1 << SEQ_BITS) - 1)}


def record_hash(
    prev: str, episode_id: str, seq: int, kind: str, txn_id: str | None, payload: str, ts: float
) -> str:
    """The hash of one log record, chained to the previous record's hash."""
    text = f"{prev}\x1f{episode_id}\x1f{seq}\x1f{kind}\x1f{txn_id or ''}\x1f{payload}\x1f{ts!r}"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    """What ``verify_chain`` found: ``ok``, and the first bad record if not."""

    ok: bool
    episodes: int
    records: int
    episode_id: str | None = None
    seq: int | None = None
    reason: str = ""
