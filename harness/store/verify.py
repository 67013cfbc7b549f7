"""``harness audit --verify``: prove a run's record was not edited, or name the first edit.

The log is a hash chain per episode (``Store.verify_chain``). Every other table is checked
against it: a commit record carries its transaction's step, checkpoint digest and the sha256
of its stored result and diff; failure, refusal, compensation, escalation and resolution
records carry what their rows say. The checkpoint digests are recomputed
(``digest_n = sha256(digest_{n-1} + diff_n)``) and must match the checkpoints, the commit
records and the episode row. Whatever disagrees is named, with the record that proves it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlmodel import col, select

from .._json import canonical, digest, loads_or
from ..errors import StoreError
from .chain import chain_problem, run_binding
from .projection import committed_row, derive
from .signing import PublicKey, verify_signatures
from .statuses import RESOLVED_AS, EscalationStatus, TxnStatus
from .tables import (
    GENESIS,
    SEQ_BITS,
    CheckpointRow,
    EpisodeRow,
    EscalationRow,
    LogRow,
    TransactionRow,
    TrialRow,
)

if TYPE_CHECKING:
    from .store import Store

__all__ = ["Finding", "VerifyReport", "verify_episode", "verify_run", "verify_store"]

_OPENING = ("intent", "committed", "recovered", "precondition", "held", "invalid", "decision")


@dataclass(frozen=True)
class Finding:
    """One thing the record and a table disagree on.

    Attributes:
        episode_id: the episode.
        table: where the bad record is (``hx_log``, ``hx_transaction``, ``hx_checkpoint``,
            ``hx_escalation``, ``hx_episode``).
        record: which record (a log seq, a transaction id, a checkpoint step, an escalation id).
        reason: what is wrong, and what that means (altered, removed, reordered, added).
        log_seq: the log record that proves it, when there is one.
    """

    episode_id: str
    table: str
    record: str
    reason: str
    log_seq: int | None = None

    def __str__(self) -> str:
        if self.table == "hx_signature":  # (a signed fact: an episode's head, or a run)
            return f"{self.record} {self.episode_id}: {self.reason}"
        where = f" (log record {self.log_seq})" if self.log_seq is not None else ""
        return f"episode {self.episode_id}: {self.table} {self.record}{where}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "episode_id": self.episode_id,
            "table": self.table,
            "record": self.record,
            "reason": self.reason,
            "log_seq": self.log_seq,
        }


@dataclass
class VerifyReport:
    """What ``verify_run`` checked and the first problem of each episode that has one."""

    episodes: int = 0
    records: int = 0
    transactions: int = 0
    checkpoints: int = 0
    escalations: int = 0
    findings: list[Finding] = field(default_factory=list)
    signed_by: str | None = None  # the id of the public key the signatures were checked with
    # The ids of the keys that signed what was checked (its episodes, its run), checked or not.
    signers: list[str] = field(default_factory=list)

    @property
    def unchecked_signatures(self) -> bool:
        """Whether what was checked is signed and no public key checked the signatures (its
        hash chains prove no edit a rewrite with recomputed hashes could not hide)."""
        return bool(self.signers) and self.signed_by is None

    @property
    def ok(self) -> bool:
        """Nothing was found."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "ok": self.ok,
            "signed_by": self.signed_by,
            "signers": self.signers,
            "signatures": (
                "checked"
                if self.signed_by is not None
                else "not checked: give the public key (--public-key)"
                if self.signers
                else "none"
            ),
            "episodes": self.episodes,
            "records": self.records,
            "transactions": self.transactions,
            "checkpoints": self.checkpoints,
            "escalations": self.escalations,
            "findings": [f.to_dict() for f in self.findings],
        }


def _commit_problem(
    episode_id: str, row: TransactionRow, rec: LogRow, intent: LogRow | None
) -> str | None:
    """How a committed transaction's row differs from the row its log records project."""
    try:
        want = committed_row(
            episode_id,
            rec.txn_id or "",
            rec.kind,
            _payload(rec),
            rec.ts,
            None if intent is None else _payload(intent),
        )
    except (KeyError, TypeError, ValueError):
        return "its commit record does not hold the transaction (its intent record is missing)"
    if row.action != want["action"]:
        return f"its action {row.action!r} is not the committed {want['action']!r}"
    for name in ("result", "diff", "args", "before", "errors"):
        if loads_or(getattr(row, name), keep_text=True) != loads_or(want[name], keep_text=True):
            return f"its {name} does not match its commit record"
    for name in ("step", "attempts", "idem_key", "mutating"):
        if getattr(row, name) != want[name]:
            return f"its {name} {getattr(row, name)!r} is not the committed {want[name]!r}"
    for name in ("started_at", "ended_at", "duration"):
        if getattr(row, name) != want[name]:
            return f"its {name} is not the time its records hold"
    return None


def _payload(rec: LogRow) -> dict[str, Any]:
    try:
        data = json.loads(rec.payload)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class _Problem(Exception):
    def __init__(self, table: str, record: str, reason: str, log_seq: int | None = None) -> None:
        super().__init__(reason)
        self.finding = (table, record, reason, log_seq)


@dataclass
class _Records:
    """One episode's records as the store's readers return them."""

    log: list[LogRow]
    transactions: list[TransactionRow]
    checkpoints: list[CheckpointRow]
    escalations: list[EscalationRow]


def _read(store: Store, episode: EpisodeRow) -> _Records:
    """One episode's records, read through the store's queries."""
    return _Records(
        store.log(episode.id),
        store.transaction_rows(episode.id),
        store.checkpoints(episode.id),
        store.escalation_rows(episode_id=episode.id),
    )


def _read_all(store: Store, episodes: list[EpisodeRow]) -> dict[str, _Records]:
    """Every episode's records in one query per table, as :func:`_read` gives them one by one
    (a log record belongs to the episode whose key range holds it; commits past an episode's
    witness not yet written as rows are built from its log)."""
    by_num = {e.num: e.id for e in episodes}
    out = {e.id: _Records([], [], [], []) for e in episodes}
    with store.session() as s:
        for rec in s.exec(select(LogRow).order_by(col(LogRow.id))):
            owner = by_num.get(rec.id >> SEQ_BITS)
            if owner is not None:
                out[owner].log.append(rec)
        for txn in s.exec(select(TransactionRow).order_by(col(TransactionRow.seq))):
            if txn.episode_id in out:
                out[txn.episode_id].transactions.append(txn)
        for cp in s.exec(select(CheckpointRow).order_by(col(CheckpointRow.step))):
            if cp.episode_id in out:
                out[cp.episode_id].checkpoints.append(cp)
        for esc in s.exec(select(EscalationRow)):
            if esc.episode_id in out:
                out[esc.episode_id].escalations.append(esc)
    for episode in episodes:
        records = out[episode.id]
        if records.log and records.log[-1].seq > episode.log_count:
            txns, cps = derive(records.log, {t.id for t in records.transactions})
            records.transactions = sorted(records.transactions + txns, key=lambda r: r.seq)
            done = {c.txn_id for c in records.checkpoints}
            extra = [c for c in cps if c.txn_id not in done]
            records.checkpoints = sorted(records.checkpoints + extra, key=lambda c: c.step)
    return out


def verify_episode(
    store: Store,
    episode: EpisodeRow,
    trials: Mapping[str, TrialRow] | None = None,
    records: _Records | None = None,
    bindings: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[Finding | None, dict[str, int]]:
    """The first problem in one episode's record (None if it is intact), and what was checked.

    Args:
        trials: the store's trial rows by episode id, when the caller has read them already
            (verifying a whole run reads them once, not once per episode).
        records: the episode's records, when the caller has read them already.
        bindings: what each run's trials must record of it (:func:`run_bindings`), when the
            caller has read the runs already.
    """
    if records is None:
        records = _read(store, episode)
    counts = {
        "records": len(records.log),
        "transactions": len(records.transactions),
        "checkpoints": len(records.checkpoints),
        "escalations": len(records.escalations),
    }
    chain = chain_problem(episode, records.log)
    if chain is not None:
        seq, reason = chain
        return Finding(episode.id, "hx_log", f"record {seq}", reason, seq), counts
    try:
        _cross_check(episode, records, trials, store)
        if bindings is None:
            bindings = run_bindings(store)
        _check_binding(episode, records.log, bindings)
    except _Problem as problem:
        return Finding(episode.id, *problem.finding), counts
    return None, counts


def _cross_check(
    episode: EpisodeRow,
    records: _Records,
    trials: Mapping[str, TrialRow] | None,
    store: Store,
) -> None:
    log = records.log
    rows = records.transactions
    by_id: dict[str, TransactionRow] = {}
    for row in rows:
        if row.id != f"{episode.id}:{row.seq}":
            raise _Problem(
                "hx_transaction",
                row.id,
                f"the row sits at seq {row.seq}, which is not its own: rows were reordered",
            )
        by_id[row.id] = row
    first: dict[str, int] = {}
    commits: dict[str, LogRow] = {}
    failures: dict[str, LogRow] = {}
    compensated: set[str] = set()
    refusals: dict[str, LogRow] = {}
    escalated: dict[str, LogRow] = {}
    resolved: dict[str, LogRow] = {}
    for rec in log:
        data = _payload(rec)
        txn = rec.txn_id
        if txn and rec.kind in _OPENING and txn not in first:
            first[txn] = rec.seq
        if rec.kind in ("committed", "recovered") and txn:
            commits[txn] = rec
        elif rec.kind == "decision" and txn and "failure_class" in data:
            failures[txn] = rec
        elif rec.kind == "compensated" and txn:
            compensated.add(txn)
        elif rec.kind in ("precondition", "held", "invalid") and txn:
            refusals[txn] = rec
        elif rec.kind == "escalation":
            escalated[str(data.get("escalation_id"))] = rec
        elif rec.kind == "resolution":
            resolved[str(data.get("escalation_id"))] = rec
    # Every row has records; rows appear in the order their records do.
    last = 0
    for row in rows:
        seq = first.get(row.id)
        if seq is None:
            raise _Problem(
                "hx_transaction",
                row.id,
                "no log record mentions this transaction: the row was added outside the harness",
            )
        if seq < last:
            raise _Problem(
                "hx_transaction",
                row.id,
                "the rows' order differs from the order of their log records: rows were reordered",
                seq,
            )
        last = seq
    for txn, seq in first.items():
        if txn not in by_id and (txn in commits or txn in failures or txn in refusals):
            raise _Problem(
                "hx_transaction",
                txn,
                "the log records this transaction's outcome but its row is missing: removed",
                seq,
            )
    intents = {rec.txn_id: rec for rec in log if rec.kind == "intent" and rec.txn_id}
    for txn, rec in commits.items():
        row = by_id[txn]
        problem = _commit_problem(episode.id, row, rec, intents.get(txn))
        if problem:
            raise _Problem("hx_transaction", txn, f"{problem}: the row was altered", rec.seq)
        expected = {TxnStatus.COMPENSATED} if txn in compensated else {rec.kind}
        if txn in failures and failures[txn].seq > rec.seq:
            expected = {TxnStatus.FAILED}
        if row.status not in expected:
            raise _Problem(
                "hx_transaction",
                txn,
                f"its status {row.status!r} is not what the log records "
                f"({' or '.join(sorted(expected))}): the row was altered",
                rec.seq,
            )
    for txn, rec in failures.items():
        row = by_id[txn]
        data = _payload(rec)
        for name in ("failure_class", "decision", "reason"):
            if getattr(row, name) != data.get(name):
                raise _Problem(
                    "hx_transaction",
                    txn,
                    f"its {name} does not match its decision record: the row was altered",
                    rec.seq,
                )
        if "diff" in data and canonical(loads_or(row.diff, keep_text=True)) != canonical(
            data["diff"]
        ):
            raise _Problem(
                "hx_transaction",
                txn,
                "what it left changed (its diff) is not what its decision record says: the row "
                "was altered",
                rec.seq,
            )
        intent = intents.get(txn)
        if txn not in commits and intent is not None:
            call = _payload(intent)
            if (row.idem_key, canonical(loads_or(row.args, keep_text=True))) != (
                call.get("key"),
                canonical(call.get("args")),
            ):
                raise _Problem(
                    "hx_transaction",
                    txn,
                    "its arguments or key are not what its intent record says: the row was altered",
                    intent.seq,
                )
        if txn not in commits and row.status not in (TxnStatus.FAILED, TxnStatus.ABANDONED):
            raise _Problem(
                "hx_transaction",
                txn,
                f"its status {row.status!r} is not a failure, as the log records: altered",
                rec.seq,
            )
    for txn, rec in refusals.items():
        row = by_id[txn]
        data = _payload(rec)
        said = data.get("reason") if rec.kind == "invalid" else data.get("check")
        statuses = {
            "precondition": (TxnStatus.PRECONDITION, TxnStatus.CHECK_ERROR),
            "held": (TxnStatus.HELD,),
            "invalid": (TxnStatus.INVALID,),
        }[rec.kind]
        if row.status not in statuses or row.reason != said or row.action != data.get("action"):
            raise _Problem(
                "hx_transaction",
                txn,
                "it does not say what its refusal record says: the row was altered",
                rec.seq,
            )
    _check_digests(episode, rows, records.checkpoints, commits)
    _check_escalations(records.escalations, escalated, resolved)
    _check_episode_row(episode, log)
    if trials is None:
        trials = (
            {t.episode_id: t for t in store.trial_rows(episode.run_id)} if episode.run_id else {}
        )
    _check_trial(episode, log, trials.get(episode.id))


def _check_digests(
    episode: EpisodeRow,
    rows: list[TransactionRow],
    checkpoints: list[CheckpointRow],
    commits: dict[str, LogRow],
) -> None:
    stepped = sorted((r for r in rows if r.step is not None), key=lambda r: r.step or 0)
    by_step = {c.step: c for c in checkpoints}
    digest = GENESIS
    # The episode row records the step and digest as of its witness (the last write that was
    # not a hot-path commit): a crashed episode's later commits are past it.
    witnessed = (0, GENESIS)
    for n, row in enumerate(stepped, start=1):
        if row.step != n:
            raise _Problem(
                "hx_transaction",
                row.id,
                f"steps jump from {n - 1} to {row.step}: a committed row was removed or renumbered",
            )
        digest = hashlib.sha256(f"{digest}{row.diff or '{}'}".encode()).hexdigest()
        cp = by_step.get(n)
        rec = commits.get(row.id)
        if rec is None or rec.seq <= episode.log_count:
            witnessed = (n, digest)
        if rec is not None and _payload(rec).get("digest") != digest:
            raise _Problem(
                "hx_transaction",
                row.id,
                f"the recomputed digest of step {n} is not the one its commit record holds",
                rec.seq,
            )
        if cp is None:
            raise _Problem(
                "hx_checkpoint",
                f"step {n}",
                "the checkpoint is missing: removed",
                rec.seq if rec else None,
            )
        if cp.txn_id != row.id:
            raise _Problem(
                "hx_checkpoint",
                f"step {n}",
                f"it names transaction {cp.txn_id}, but step {n} is {row.id}: reordered",
                rec.seq if rec else None,
            )
        if cp.digest != digest:
            raise _Problem(
                "hx_checkpoint",
                f"step {n}",
                "its digest is not the recomputed digest chain: the checkpoint was altered",
                rec.seq if rec else None,
            )
    extra = sorted(set(by_step) - set(range(1, len(stepped) + 1)))
    if extra:
        raise _Problem(
            "hx_checkpoint",
            f"step {extra[0]}",
            "no committed transaction has this step: the checkpoint was added",
        )
    if (episode.steps, episode.digest) != witnessed:
        raise _Problem(
            "hx_episode",
            episode.id,
            f"it records step {episode.steps} with digest {episode.digest[:12]}, the log and "
            f"transactions give step {witnessed[0]} with {witnessed[1][:12]}: the row was "
            "altered",
        )


_ALWAYS_HELD = frozenset({"action", "failure_class", "reason"})


def _check_escalations(
    escalations: list[EscalationRow],
    escalated: dict[str, LogRow],
    resolved: dict[str, LogRow],
) -> None:
    rows = {e.id: e for e in escalations}
    for esc_id, rec in escalated.items():
        row = rows.get(esc_id)
        if row is None:
            raise _Problem(
                "hx_escalation",
                esc_id,
                "the log records it, but its row is missing: removed",
                rec.seq,
            )
        data = _payload(rec)
        held = {
            "action": row.action,
            "failure_class": row.failure_class,
            "reason": row.reason,
            # Recorded since 0.9: what the approver is shown and what happens unanswered.
            "idem_key": row.idem_key,
            "args": loads_or(row.args, keep_text=True),
            "evidence": digest(loads_or(row.evidence, keep_text=True)),
            "deadline": row.deadline,
            "fallback": row.fallback,
        }
        for name, value in held.items():
            if (name in data or name in _ALWAYS_HELD) and canonical(value) != canonical(
                data.get(name)
            ):
                raise _Problem(
                    "hx_escalation",
                    esc_id,
                    f"its {name} is not what its escalation record says: the row was altered",
                    rec.seq,
                )
        res = resolved.get(esc_id)
        if res is None:
            if row.status != EscalationStatus.PENDING:
                raise _Problem(
                    "hx_escalation",
                    esc_id,
                    f"it is {row.status} but no resolution was recorded: the row was altered",
                    rec.seq,
                )
            continue
        data = _payload(res)
        status = RESOLVED_AS.get(str(data.get("decision")))
        edit = loads_or(row.edit, keep_text=True)
        if (row.status, row.resolved_by, row.resolution_reason or "", canonical(edit)) != (
            status,
            data.get("by"),
            data.get("reason") or "",
            canonical(data.get("edit")),
        ):
            raise _Problem(
                "hx_escalation",
                esc_id,
                "who resolved it, how, why or with which arguments is not what its resolution "
                "record says: altered",
                res.seq,
            )
    for esc_id in sorted(set(rows) - set(escalated)):
        raise _Problem(
            "hx_escalation", esc_id, "no log record mentions it: added outside the harness"
        )


def _check_episode_row(episode: EpisodeRow, log: list[LogRow]) -> None:
    """The episode's row says what its start and end records say: its run, task and trial,
    and (once it ended, with no resume after) its outcome, steps and digest."""
    start = next((r for r in log if r.kind == "start"), None)
    if start is not None:
        data = _payload(start)
        for name in ("run_id", "task_id", "trial"):
            if name in data and data[name] != getattr(episode, name):
                raise _Problem(
                    "hx_episode",
                    episode.id,
                    f"its {name} is not what its start record says: the row was altered",
                    start.seq,
                )
        for name in ("policy", "meta"):  # (records before 0.9 hold no meta)
            said = loads_or(getattr(episode, name), keep_text=True)
            if name in data and canonical(said) != canonical(data[name]):
                raise _Problem(
                    "hx_episode",
                    episode.id,
                    f"its {name} is not what its start record says: the row was altered",
                    start.seq,
                )
    last = next((r for r in reversed(log) if r.kind in ("end", "resume")), None)
    if last is None or last.kind != "end":
        return
    data = _payload(last)
    said = (str(data.get("outcome")), data.get("steps"), data.get("digest"))
    if (str(episode.status), episode.steps, episode.digest) != said:
        raise _Problem(
            "hx_episode",
            episode.id,
            f"it says {episode.status} after {episode.steps} step(s), its end record says "
            f"{said[0]} after {said[1]}: the row was altered",
            last.seq,
        )


def run_bindings(store: Store) -> dict[str, dict[str, str]]:
    """What each run's trials record of it (:func:`~harness.store.chain.run_binding`), from
    its row as the store holds it now (a run whose row does not read gives an empty one)."""
    out: dict[str, dict[str, str]] = {}
    for run in store.runs():
        config = loads_or(run.config, {})
        evidence = loads_or(run.evidence, {})
        ok = isinstance(config, dict) and isinstance(evidence, dict)
        out[run.id] = run_binding(config, evidence) if ok else {}
    return out


def _check_binding(
    episode: EpisodeRow, log: list[LogRow], bindings: Mapping[str, Mapping[str, str]]
) -> None:
    """A trial's start record holds the digests of its run's configuration and evidence (since
    0.9): the run's row must still give them."""
    start = next((r for r in log if r.kind == "start"), None)
    if start is None or episode.run_id is None or episode.run_id not in bindings:
        return  # (a run whose row is gone: named by the orphans' check)
    meta = _payload(start).get("meta")
    said = meta.get("run") if isinstance(meta, dict) else None
    if not isinstance(said, dict):
        return
    now = bindings[episode.run_id]
    changed = [
        {"config": "configuration", "evidence": "evidence"}.get(k, k)
        for k in sorted(said)
        if now.get(k) != said[k]
    ]
    if changed:
        raise _Problem(
            "hx_run",
            episode.run_id,
            f"its {' and '.join(changed)} is not what trial {episode.id}'s start record holds "
            "of it: the run's row was altered",
            start.seq,
        )


def _check_trial(episode: EpisodeRow, log: list[LogRow], trial: TrialRow | None) -> None:
    """A trial's row says what the verdict record in its episode's log says."""
    record = next((r for r in reversed(log) if r.kind == "verdict"), None)
    if record is None:
        if trial is not None:
            raise _Problem(
                "hx_trial",
                episode.id,
                "the trial has no verdict record in its episode's log: the row was added",
            )
        return
    if trial is None:
        raise _Problem(
            "hx_trial", episode.id, "its verdict record has no trial row: removed", record.seq
        )
    data = _payload(record)
    row = {
        "passed": trial.passed,
        "partial": trial.partial,
        "outcome": str(trial.outcome),
        "infra_error": trial.infra_error,
        "verdict": loads_or(trial.verdict, keep_text=True),
    }
    changed = [k for k in row if canonical(row[k]) != canonical(data.get(k))]
    if changed:
        raise _Problem(
            "hx_trial",
            episode.id,
            f"its {', '.join(changed)} is not what its verdict record says: the row was altered",
            record.seq,
        )


_ONE_BY_ONE = 16  # verifying more episodes than this reads each table once for all of them


def verify_run(
    store: Store,
    episodes: list[EpisodeRow],
    *,
    public_key: PublicKey | None = None,
    run_id: str | None = None,
    whole_store: bool = False,
) -> VerifyReport:
    """Verify each episode; the report holds the first problem of each episode that has one.

    Args:
        public_key: also check the signatures made with its private key
            (:mod:`harness.store.signing`): every episode's signed head, and the run's signed
            manifest when ``run_id`` is given. A full rewrite with recomputed hashes, a deleted
            or added episode and a flipped verdict are found only this way.
        run_id: ``episodes`` are all of this run's episodes (a signed episode not among them
            was deleted; the run's manifest is checked).
        whole_store: ``episodes`` are all of the store's episodes (every run's manifest is
            checked, and a signed run or episode that is gone is named).
    """
    report = VerifyReport(episodes=len(episodes))
    trials = {t.episode_id: t for t in store.trial_rows()}
    read = _read_all(store, episodes) if len(episodes) > _ONE_BY_ONE else {}
    bindings = run_bindings(store)
    for episode in episodes:
        finding, counts = verify_episode(store, episode, trials, read.get(episode.id), bindings)
        report.records += counts["records"]
        report.transactions += counts["transactions"]
        report.checkpoints += counts["checkpoints"]
        report.escalations += counts["escalations"]
        if finding is not None:
            report.findings.append(finding)
    if whole_store:
        report.findings.extend(_orphans(store, episodes))
    elif run_id is not None:
        # Records of one of the run's episodes whose row is gone: the store's orphans that
        # are the run's (all of them, in a store of this run alone), as the whole store's
        # check names them (a trial row alone is left to that check).
        alone = [r.id for r in store.runs()] == [run_id]
        report.findings.extend(
            f
            for f in _orphans(store, store.episodes(), _OWNED[:-1])
            if alone or f.record.startswith(f"{run_id}-") or f.record == run_id
        )
    subjects = {e.id for e in episodes} | ({run_id} if run_id is not None else set())
    report.signers = sorted(
        {s.key_id for s in store.signatures() if whole_store or s.subject in subjects}
    )
    if public_key is not None:
        report.signed_by = public_key.key_id
        runs = [
            (run, store.episodes(run.id), store.trial_rows(run.id))
            for run in store.runs()
            if whole_store or run.id == run_id
        ]
        problems = verify_signatures(
            public_key,
            store.signatures(),
            episodes,
            runs,
            run_id=run_id,
            every_run=whole_store,
        )
        for problem in problems:
            report.findings.append(
                Finding(problem.subject, "hx_signature", problem.scope, problem.reason)
            )
    return report


_OWNED = (
    (LogRow, "hx_log", "its records are in the log"),
    (TransactionRow, "hx_transaction", "its transactions are stored"),
    (CheckpointRow, "hx_checkpoint", "its checkpoints are stored"),
    (EscalationRow, "hx_escalation", "its escalations are stored"),
    (TrialRow, "hx_trial", "its trial is stored"),
)


def _orphans(
    store: Store, episodes: list[EpisodeRow], owned: tuple[Any, ...] = _OWNED
) -> list[Finding]:
    """Rows of a whole store that belong to nothing: records of an episode whose row is gone,
    an episode of a run whose row is gone."""
    present = {e.id for e in episodes}
    found: dict[str, Finding] = {}
    with store.session() as s:
        for table, name, what in owned:
            for episode_id in s.exec(select(col(table.episode_id)).distinct()):
                if episode_id not in present and episode_id not in found:
                    found[episode_id] = Finding(
                        episode_id,
                        "hx_episode",
                        episode_id,
                        f"{what} ({name}) but its row is missing: the episode was removed",
                    )
    runs = {r.id for r in store.runs()}
    for episode in episodes:
        if episode.run_id and episode.run_id not in runs and episode.run_id not in found:
            found[episode.run_id] = Finding(
                episode.id,
                "hx_run",
                episode.run_id,
                f"episode {episode.id} belongs to run {episode.run_id}, whose row is missing: "
                "the run was removed",
            )
    return list(found.values())


def verify_store(
    store: Store,
    *,
    run_id: str | None = None,
    episode_id: str | None = None,
    public_key: PublicKey | None = None,
) -> VerifyReport:
    """The full check of a store, of one of its runs, or of one episode (``Store.verify``),
    on one snapshot of it (:meth:`Store.snapshot`)."""
    with store.snapshot():
        return _verify_store(store, run_id, episode_id, public_key)


def _verify_store(
    store: Store, run_id: str | None, episode_id: str | None, public_key: PublicKey | None
) -> VerifyReport:
    if episode_id is not None:
        episode = store.episode(episode_id)
        if episode is None:
            raise StoreError(
                f"the store holds no episode {episode_id!r}: `harness audit STORE` lists them"
            )
        return verify_run(store, [episode], public_key=public_key)
    if run_id is not None:
        if not any(run.id == run_id for run in store.runs()):
            raise StoreError(
                f"the store holds no run {run_id!r}: `harness report STORE` lists them"
            )
        return verify_run(store, store.episodes(run_id), public_key=public_key, run_id=run_id)
    return verify_run(store, store.episodes(), public_key=public_key, whole_store=True)
